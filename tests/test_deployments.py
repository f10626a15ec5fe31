"""Deployments of a service as an ablation factor, and generator.concurrency.

* ``-m system=http system.base_url=URL_A,URL_B`` (URLs unquoted): the baseline config has no URL,
  so the first listed one is the baseline's; a configured URL is the baseline instead, and the
  listed level equal to it is not run twice. Any swept key left unset works so.
* ``--config-dir DIR -m system=http system/deployment=before,after``: named deployments, each a
  file of DIR; the sweep keeps a copy of DIR, so ``resume=`` needs nothing more (not even DIR),
  and a copy never holds a literal header value.
* Against two stub services on 127.0.0.1 (one deliberately worse), a two-deployment sweep runs,
  is killed (SIGKILL) and resumed, and its metrics and comparison equal an uninterrupted sweep's.
* ``generator.concurrency``: that many model calls in flight (counted by a stub OpenAI server),
  the records in query order, the cache replaying every answer on a second run.
* README "Compare two deployments of your service": its commands run as written.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rag_ablate.compare.guard import changed_factors
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.layout import COMPARISON_JSON, METRICS_FILE, RECORDS_FILE, SWEEP_FILE
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.jsonl import read_records
from rag_ablate.records.trace import Trace
from rag_ablate.run.resume import rewrite_argv, save_config_dir
from tests.conftest import REPO, free_port, run_in_process, write_dataset
from tests.fake_llm import FakeLLM, serve
from tests.stub_rag_service import StubServer, in_thread
from tests.test_resume import _kill_when, _only, _start

README = REPO / "README.md"
URL_A, URL_B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def _plan(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr
    return out.stdout


# ---------------------------------------------------------------- the plan: which deployment is the baseline


def test_unquoted_url_list_without_a_configured_url_takes_the_first_as_baseline(tmp_path: Path) -> None:
    # before: refused ("system=http needs system.base_url"), the baseline having no URL
    out = run_in_process(
        ["-m", "system=http", f"system.base_url={URL_A},{URL_B}", "ablation.dry_run=true"], tmp_path
    )
    plan = _plan(out)
    assert f"factor system.base_url: baseline {URL_A} (the first level: the config sets none)" in plan
    assert re.search(r"#0 +baseline +baseline", plan)
    assert re.search(rf"#1 +system.base_url={URL_B} +variant", plan)
    assert "job(s)" in plan and "2 job(s)" in plan


def test_a_configured_url_is_the_baseline_and_its_level_is_not_run_again(tmp_path: Path) -> None:
    conf = tmp_path / "my_conf" / "system" / "deployment"
    conf.mkdir(parents=True)
    (conf / "prod.yaml").write_text(f"# @package system\nbase_url: {URL_B}\n", encoding="utf-8")
    args = ["--config-dir", "my_conf", "-m", "system=http", "system/deployment=prod"]
    plan = _plan(
        run_in_process([*args, f"system.base_url={URL_A},{URL_B}", "ablation.dry_run=true"], tmp_path)
    )
    assert f"factor system.base_url: baseline {URL_B}; levels {URL_A}, {URL_B} (one level equals" in plan
    assert "2 job(s)" in plan and f"system.base_url={URL_A}" in plan


def test_named_deployments_the_first_listed_is_the_baseline(tmp_path: Path) -> None:
    # before: Hydra refused system/deployment (no such group in the defaults of system=http)
    _deployments(tmp_path / "my_conf", {"before": URL_A, "after": URL_B})
    args = ["--config-dir", "my_conf", "-m", "system=http", "system/deployment=before,after"]
    plan = _plan(run_in_process([*args, "ablation.dry_run=true"], tmp_path))
    assert "factor system/deployment: baseline before (the first level: the config sets none)" in plan
    assert re.search(r"#1 +system/deployment=after +variant", plan)


def test_a_deployment_file_without_its_package_line_is_refused_saying_so(tmp_path: Path) -> None:
    conf = _deployments(tmp_path / "my_conf", {"before": URL_A})
    (conf / "system/deployment/after.yaml").write_text(f"base_url: {URL_B}\n", encoding="utf-8")
    args = ["--config-dir", "my_conf", "-m", "system=http", "system/deployment=before,after"]
    out = run_in_process([*args, "ablation.dry_run=true"], tmp_path)
    assert out.returncode == 2
    assert "invalid level system/deployment=after" in out.stderr
    assert "starts with the line '# @package system'" in out.stderr


def test_a_deployment_changes_one_factor_for_the_confounding_guard() -> None:
    # before: system/deployment=after was CONFOUNDED by the system.* values its file sets
    base = {"system": {"name": "http", "base_url": URL_A, "eval_path": "/rag/eval"}}
    other = {"system": {"name": "http", "base_url": URL_B, "eval_path": "/v2/eval"}}
    choices = (
        {"system": "http", "system/deployment": "before"},
        {"system": "http", "system/deployment": "after"},
    )
    assert changed_factors(base, other, *choices) == ["system/deployment"]
    # a setting given on the command line beside the deployment is still a factor of its own
    found = changed_factors(base, other, *choices, overrides=["system.eval_path=/v2/eval"])
    assert found == ["system.eval_path", "system/deployment"]


# ---------------------------------------------------------------- resume= finds the deployments in its folder


def _deployments(conf: Path, urls: dict[str, str], extra: str = "chat_path: null\n") -> Path:
    folder = conf / "system" / "deployment"
    folder.mkdir(parents=True, exist_ok=True)
    for name, url in urls.items():
        (folder / f"{name}.yaml").write_text(f"# @package system\nbase_url: {url}\n{extra}", encoding="utf-8")
    return conf


def _sources(folder: Path) -> list[Any]:
    """Hydra's config sources as a sweep's config holds them, with ``--config-dir folder``."""
    return [
        SimpleNamespace(path="pkg://rag_ablate.conf", schema="pkg", provider="main"),
        SimpleNamespace(path=str(folder), schema="file", provider="command-line"),
    ]


def _copied(tmp_path: Path, headers: str) -> tuple[Path, Path, str]:
    """A deployment file with ``headers``, copied by a sweep started with ``--config-dir`` of its
    folder: the folder, the sweep folder and the copy's text."""
    conf = _deployments(tmp_path / "my_conf", {"before": URL_A}, f"headers: {headers}\n")
    sweep = tmp_path / "outputs" / "multirun" / "s"
    sweep.mkdir(parents=True)
    (sweep / "plan.json").write_text("{}", encoding="utf-8")
    (sweep / SWEEP_FILE).write_text(json.dumps({"overrides": ["system=http"]}), encoding="utf-8")
    save_config_dir(_sources(conf), sweep)
    return conf, sweep, (sweep / "config/system/deployment/before.yaml").read_text(encoding="utf-8")


def test_the_copy_keeps_environment_values_and_resume_uses_it(tmp_path: Path) -> None:
    conf, sweep, text = _copied(tmp_path, "{Authorization: 'Bearer ${oc.env:TOKEN}'}")
    assert text == (conf / "system/deployment/before.yaml").read_text(encoding="utf-8")
    argv = rewrite_argv([f"resume={sweep}"])
    assert argv[0] == f"--config-dir={sweep / 'config'}"
    # a --config-dir given again wins over the copy
    again = rewrite_argv(["--config-dir", str(conf), f"resume={sweep}"])
    assert f"--config-dir={sweep / 'config'}" not in again


def test_a_literal_header_value_is_not_copied_and_resume_asks_for_the_folder(tmp_path: Path) -> None:
    conf, sweep, text = _copied(tmp_path, "{Authorization: Bearer sk-canary-123}")
    assert text.startswith("# @package system\n") and "sk-canary" not in text and "***" in text
    with pytest.raises(ConfigError, match=r"system/deployment/before.yaml .* give --config-dir again"):
        rewrite_argv([f"resume={sweep}"])
    assert rewrite_argv(["--config-dir", str(conf), f"resume={sweep}"])[:2] == ["--config-dir", str(conf)]


# ---------------------------------------------------------------- two stub deployments, killed and resumed


class _Deployment(StubServer):
    """The stub RAG service; ``worse``: the relevant documents of every other query are left out;
    ``delay_s``: each answer waits that long (so a sweep can be killed midway)."""

    def __init__(self, dataset: Dataset, *, worse: bool = False, delay_s: float = 0.0) -> None:
        super().__init__(dataset, 0.0, 0.0, 0)
        self.worse, self.delay_s = worse, delay_s
        self.order = {q.query_id: i for i, q in enumerate(dataset.queries)}

    def answer(self, query_id: str) -> dict[str, Any]:
        time.sleep(self.delay_s)
        found = super().answer(query_id)
        query = self.queries.get(query_id)
        if self.worse and query is not None and self.order[query_id] % 2 == 0:
            found["retrieved"] = [r for r in found["retrieved"] if r["doc_id"] not in query.relevant]
        return found


@pytest.fixture
def two_deployments(tmp_path: Path) -> Iterator[tuple[Path, _Deployment, _Deployment]]:
    write_dataset(tmp_path / "tiny")
    ds = load_dataset(str(tmp_path / "tiny"))
    good, bad = _Deployment(ds), _Deployment(ds, worse=True)
    with in_thread(good), in_thread(bad):
        yield tmp_path, good, bad


SWEEP_ARGS = [
    "dataset=custom",
    "dataset.path=tiny",
    "progress=false",
    "compare.B=200",
    "timing.interleave=false",
]


def _recall(sweep: Path, job: int) -> float:
    return float(json.loads((sweep / str(job) / METRICS_FILE).read_text(encoding="utf-8"))["dev/recall_at_5"])


@pytest.mark.slow
def test_kill_a_two_deployment_sweep_then_resume_without_the_config_dir(
    two_deployments: tuple[Path, _Deployment, _Deployment],
) -> None:
    work, good, bad = two_deployments
    _deployments(work / "my_conf", {"before": good.url, "after": bad.url})
    args = ["--config-dir", "my_conf", "-m", "system=http", "system/deployment=before,after", *SWEEP_ARGS]

    ref = run_in_process([*args, "paths.output_root=ref", "tracking=none"], work)  # uninterrupted
    assert ref.returncode == 0, ref.stderr
    ref_sweep = _only(work / "ref" / "multirun")
    assert ref_sweep is not None

    good.delay_s = bad.delay_s = 0.3
    proc = _start([*args, "system.concurrency=1"], work)

    def variant_records() -> Path | None:
        s = _only(work / "outputs" / "multirun")
        return None if s is None else s / "1" / RECORDS_FILE

    records = _kill_when(proc, variant_records, 2)
    sweep = records.parent.parent
    good.delay_s = bad.delay_s = 0.0
    shutil.rmtree(work / "my_conf")  # resume= must find the deployments in the sweep folder
    out = run_in_process([f"resume={sweep}"], work)
    assert out.returncode == 0, out.stderr

    assert len(read_records(records)) == len({r["query_id"] for r in read_records(records)}) == 8
    for job in (0, 1):
        assert _recall(sweep, job) == _recall(ref_sweep, job)
    assert _recall(sweep, 1) < _recall(sweep, 0)  # the worse deployment is worse
    resumed, whole = (
        json.loads((s / COMPARISON_JSON).read_text(encoding="utf-8")) for s in (sweep, ref_sweep)
    )
    assert _deltas(resumed) == _deltas(whole)
    assert any(v < 0 for k, v in _deltas(resumed).items() if k[2] == "recall_at_5")
    assert "CONFOUNDED" not in out.stdout


@pytest.mark.slow
def test_a_single_run_keeps_its_config_folder_for_resume(
    two_deployments: tuple[Path, _Deployment, _Deployment],
) -> None:
    work, good, _ = two_deployments
    _deployments(work / "my_conf", {"before": good.url})
    args = ["--config-dir", "my_conf", "system=http", "system/deployment=before", *SWEEP_ARGS[:3]]
    out = run_in_process([*args, "tracking=none"], work)
    assert out.returncode == 0, out.stderr
    run = _only(work / "outputs" / "runs")
    assert run is not None and (run / "config/system/deployment/before.yaml").is_file()
    (run / "summary.json").unlink()  # as if killed before the end
    shutil.rmtree(work / "my_conf")
    again = run_in_process([f"resume={run}"], work)
    assert again.returncode == 0, again.stderr
    assert len(read_records(run / RECORDS_FILE)) == 8


def _deltas(comparison: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    """Each (variant, split, quality metric)'s difference from the baseline, as comparison.json
    stores it (latencies differ from one run to the next, interrupted or not)."""
    return {
        (row["variant"], row["split"], row["metric"]): row["effect"]
        for row in comparison["rows"]
        if "latency" not in row["metric"] and "_ms" not in row["metric"]
    }


# ---------------------------------------------------------------- generator.concurrency


class _Counting:
    """A responder of the fake OpenAI server that counts the requests in flight at once and
    answers with the question's first word, so each answer shows which query it belongs to."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.active = 0
        self.most = 0

    def __call__(self, body: dict[str, Any], call: int) -> str:
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(self.hold_s)
        with self.lock:
            self.active -= 1
        prompt = body["messages"][0]["content"]
        question = prompt.rsplit("Question:", 1)[-1].split()
        return f"About {question[0] if question else '?'} [1]."


def _answered_by(trace: Trace, query: Query) -> bool:
    return trace.answer == f"About {query.query.split()[0]} [1]."


def test_generator_concurrency_sends_that_many_calls_at_once_and_the_cache_replays_them(
    tmp_path: Path,
) -> None:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.systems.local import LocalSystem

    write_dataset(tmp_path / "tiny")
    ds = load_dataset(str(tmp_path / "tiny"))
    counting = _Counting(hold_s=0.15)
    with serve(FakeLLM(respond=counting)) as llm:
        s = RunConfig()
        s.generator.name, s.generator.base_url, s.generator.model = "openai", llm.url, "m"
        s.generator.prompt_en = s.generator.prompt_zh = "{contexts}\nQuestion: {question}"
        s.generator.concurrency = 3

        def run_all() -> dict[str, Trace]:
            system = LocalSystem(s, Cache(tmp_path / "cache"))
            system.prepare(ds)
            got: dict[str, Trace] = {}
            try:
                system.run_many(ds.queries, lambda q, t: got.setdefault(q.query_id, t))
            finally:
                system.close()
            return got

        t0 = time.perf_counter()
        first = run_all()
        wall = time.perf_counter() - t0
        assert counting.most == 3  # before: one call at a time (no generator.concurrency)
        assert len(llm.requests) == len(ds.queries) == len(first)
        assert all(_answered_by(first[q.query_id], q) for q in ds.queries)
        assert all(t.status == "ok" and not t.cached for t in first.values())
        # each query's total is its own time, not the time it waited for a free thread
        assert max(t.timings_ms["total"] for t in first.values()) < wall * 1000 * 0.75

        again = run_all()
        assert len(llm.requests) == len(ds.queries)  # nothing sent again
        assert all(
            t.cached and _answered_by(again[q.query_id], q) for q in ds.queries for t in [again[q.query_id]]
        )


@pytest.mark.slow
def test_generator_concurrency_in_a_run_keeps_the_records_in_query_order(tmp_path: Path) -> None:
    write_dataset(tmp_path / "tiny")
    counting = _Counting(hold_s=0.1)
    with serve(FakeLLM(respond=counting)) as llm:
        args = [
            "generator=openai",
            f"generator.base_url={llm.url}",
            "generator.model=m",
            "generator.concurrency=4",
            "dataset=custom",
            "dataset.path=tiny",
            "tracking=none",
            "progress=false",
        ]
        out = run_in_process(args, tmp_path)
    assert out.returncode == 0, out.stderr
    assert counting.most == 4
    (job,) = (tmp_path / "outputs" / "runs").iterdir()
    records = read_records(job / RECORDS_FILE)
    queries = load_dataset(str(tmp_path / "tiny")).queries
    assert [r["query_id"] for r in records] == [q.query_id for q in queries]
    assert all(r["status"] == "ok" and r["answer"] for r in records)


# ---------------------------------------------------------------- README's commands


def _readme_commands() -> list[str]:
    """The commands of README "Compare two deployments of your service", one per line."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Compare two deployments of your service", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [ln.split("  #", 1)[0].strip() for b in blocks for ln in b.splitlines()]
    return [ln for ln in lines if ln]


@pytest.mark.slow
def test_readme_commands_compare_two_deployments(tmp_path: Path) -> None:
    """Every README command, as written, but on the tiny dataset and on free ports: two
    ``rag-ablate serve`` deployments, the URL-list sweep, the deployment files, the named sweep."""
    from tests.conftest import serving

    commands = _readme_commands()
    serves = [c for c in commands if c.startswith("rag-ablate serve")]
    files = [c for c in commands if c.startswith(("mkdir", "printf", "cat"))]
    sweeps = [c for c in commands if c.startswith("python -m rag_ablate")]
    assert len(serves) == 2 and len(sweeps) == 2 and files
    write_dataset(tmp_path / "tiny")
    ports = {"8001": str(free_port()), "8002": str(free_port())}

    def local(command: str) -> str:
        for old, new in ports.items():
            command = command.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}").replace(
                f"--port {old}", f"--port {new}"
            )
        return command

    data = ["dataset=custom", f"dataset.path={tmp_path / 'tiny'}"]
    with contextlib.ExitStack() as stack:
        for command in serves:
            words = local(command).split()
            port = int(words[words.index("--port") + 1])
            args = [sys.executable, "-m", "rag_ablate.cli.main", *words[1:], *data]
            stack.enter_context(
                serving("rag-ablate serve", args, port, tmp_path / f"serve{port}.log", cwd=REPO)
            )
        for command in files:
            done = subprocess.run(local(command), shell=True, cwd=tmp_path, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        for i, command in enumerate(sweeps):
            words = local(command).split()[3:]  # after "python -m rag_ablate"
            extra = [
                *data[:1],
                "dataset.path=tiny",
                "progress=false",
                "compare.B=200",
                f"paths.output_root=o{i}",
            ]
            out = run_in_process([*words, *extra], tmp_path)
            assert out.returncode == 0, out.stderr
            assert "2 job(s)" in out.stdout and "CONFOUNDED" not in out.stdout
            sweep = _only(tmp_path / f"o{i}" / "multirun")
            assert sweep is not None and (sweep / COMPARISON_JSON).is_file()
