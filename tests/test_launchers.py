"""Sweeps through Hydra's launchers: joblib (local processes), submitit_local and a local Ray.

The ablation sweeper hands its jobs to whichever launcher is chosen; the driver still opens the
MLflow store and creates the parent run before any job, and compares once after all of them.
A parallel sweep must give exactly the serial sweep's results: the same metrics per variant
(timings aside) and the same comparison numbers. The Ray test needs .[ray], which the suite's venv
does not have: .ci/run runs it in a step of its own, in .venv-ray (README "Development").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_in_process, write_dataset
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from rag_ablate.core.layout import COMPARISON_JSON, METRICS_FILE, SWEEP_FILE, VARIANT_FILE
from rag_ablate.tracking.store import OWNER_TAG
from rag_ablate.tracking.tags import PARENT_TAG

# chunk=8 splits the tiny corpus's documents and changes what is retrieved: the comparison has
# non-zero effects, so "equal to the serial sweep" is not satisfied by two rows of zeros
FACTOR = "chunk=8,512"
# latency rows differ between any two runs; they are adjusted apart, so every number of the other
# rows, adjusted p included, is reproducible
COMMON = [
    "dataset=custom",
    "dataset.path=tiny",
    "progress=false",
    "compare.B=200",
    "compare.metrics=[recall_at_5,ndcg_at_10,mrr_at_10,context_tokens_at_5,latency_ms,latency_p95_ms]",
]
TABLES_CREATED = "Creating initial MLflow database tables"


def _sweep(
    cwd: Path, *extra: str, in_process: bool = False, new_template: bool = True
) -> subprocess.CompletedProcess[str]:
    """The sweep in ``cwd``: a process of its own, as a launcher's sweep must be, or (the serial
    reference, whose output is the same either way) in this process. ``new_template``: no store
    template yet (tracking.template_path), so MLflow builds the tables once and says so
    (:data:`TABLES_CREATED`); otherwise the machine's template is copied, as in a user's sweeps."""
    write_dataset(cwd / "tiny")
    env = {"RAY_AUTH_MODE": "disabled"}  # a local Ray: no token written under ~/.ray
    if new_template:
        env["XDG_CACHE_HOME"] = str(cwd / "xdg-cache")
    args = ["-m", FACTOR, *COMMON, *extra]
    if in_process:
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            proc = run_in_process(args, cwd)
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "rag_ablate", *args],
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", **env},
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _sweep_dir(cwd: Path) -> Path:
    (sweep,) = (cwd / "outputs" / "multirun").iterdir()
    return sweep


def _family(cwd: Path) -> tuple[Run, list[Run]]:
    """The sweep's parent run and its children; the parent is the experiment's only sweep run."""
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}")
    info = json.loads((_sweep_dir(cwd) / SWEEP_FILE).read_text(encoding="utf-8"))
    parent = client.get_run(info["parent_run_id"])
    exp = parent.info.experiment_id
    sweeps = client.search_runs([exp], "tags.`rag_ablate.kind` = 'sweep'")
    assert [r.info.run_id for r in sweeps] == [parent.info.run_id]
    children = client.search_runs([exp], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    # every run of the experiment is the parent or one of its children (or a child's per-split traces)
    others = client.search_runs([exp], "tags.`rag_ablate.kind` != 'traces'")
    assert len(others) == 1 + len(children)
    return parent, children


def _assert_one_family(cwd: Path) -> list[Run]:
    parent, children = _family(cwd)
    assert parent.info.status == "FINISHED"
    assert sorted(r.data.tags["variant"] for r in children) == ["baseline", "chunk=8"]
    assert all(r.info.status == "FINISHED" for r in children)
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}")
    assert COMPARISON_JSON in {a.path for a in client.list_artifacts(parent.info.run_id)}
    return children


def _timing(key: str) -> bool:
    return key.startswith("run/") or "latency" in key or key.endswith(("_ms", "seconds"))


def _results(cwd: Path) -> dict[str, Any]:
    """Per variant label, its metrics without timings and bookkeeping; the comparison's rows."""
    sweep = _sweep_dir(cwd)
    per_variant = {}
    for job in sweep.iterdir():
        if (job / METRICS_FILE).is_file():
            label = json.loads((job / VARIANT_FILE).read_text(encoding="utf-8"))["label"]
            metrics = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
            per_variant[label] = {k: v for k, v in metrics.items() if not _timing(k)}
    comparison = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))
    timing = [r for r in comparison["rows"] if r["family"] == "timing"]
    assert {r["metric"] for r in timing} == {"latency_ms", "latency_p95_ms"}
    flips = {
        v: {m: f for m, f in by_metric.items() if not _timing(m)}
        for v, by_metric in comparison["flips"].items()
    }
    return {
        "variants": per_variant,
        "rows": [r for r in comparison["rows"] if r not in timing],
        "flips": flips,
    }


def _owner_pid(run: Run) -> int:
    return int(run.data.tags[OWNER_TAG].split(":")[1])


@pytest.mark.slow
def test_joblib_sweep_runs_jobs_in_parallel_and_equals_the_serial_sweep(tmp_path: Path) -> None:
    serial = _sweep(tmp_path / "serial", in_process=True)
    parallel = _sweep(tmp_path / "joblib", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")

    assert "Joblib.Parallel(n_jobs=2" in parallel.stdout + parallel.stderr
    for proc in (serial, parallel):
        # the driver created the store once before the jobs; the comparison ran once, at the end
        assert (proc.stdout + proc.stderr).count(TABLES_CREATED) == 1
        assert proc.stdout.count("comparison against baseline") == 1

    children = _assert_one_family(tmp_path / "joblib")
    parent, _ = _family(tmp_path / "joblib")
    # each job ran in its own worker process (two workers), not in the driver
    pids = {_owner_pid(r) for r in children}
    assert len(pids) == 2 and _owner_pid(parent) not in pids
    _assert_one_family(tmp_path / "serial")

    want, got = _results(tmp_path / "serial"), _results(tmp_path / "joblib")
    assert sorted(got["variants"]) == ["baseline", "chunk=8"]
    assert got == want
    # the factor matters on this corpus: the equality above compares real differences
    changed = [r for r in got["rows"] if r["effect"] != 0.0]
    assert {r["metric"] for r in changed} >= {"context_tokens_at_5"}


@pytest.mark.slow
def test_submitit_local_sweep_logs_its_children_under_one_parent(tmp_path: Path) -> None:
    # the machine's store template (that the driver creates the store once: the joblib test)
    proc = _sweep(tmp_path, "hydra/launcher=submitit_local", new_template=False)

    assert proc.stdout.count("comparison against baseline") == 1
    children = _assert_one_family(tmp_path)
    driver_pid = _owner_pid(_family(tmp_path)[0])
    assert all(_owner_pid(r) != driver_pid for r in children)  # the jobs ran in the launcher's workers
    assert sorted(_results(tmp_path)["variants"]) == ["baseline", "chunk=8"]
    # submitit keeps each job's log and pickled result
    assert list((_sweep_dir(tmp_path) / ".submitit").rglob("*_result.pkl"))


def _ray_or_skip() -> None:
    """.[ray] is optional (~300 MB) and pins cloudpickle < 3, which the dev set's joblib 1.6 cannot
    use, so the suite's venv has no Ray and this test skips there. .ci/run runs it in a venv with
    .[ray] and sets RAG_ABLATE_REQUIRE_RAY=1, which makes a missing Ray fail the step, not skip."""
    if importlib.util.find_spec("ray") is not None:
        return
    if os.environ.get("RAG_ABLATE_REQUIRE_RAY") == "1":
        pytest.fail("RAG_ABLATE_REQUIRE_RAY=1 but ray is not installed in this venv")
    pytest.skip("ray is not installed (pip install -e '.[ray]'; .ci/run runs this test in .venv-ray)")


@pytest.mark.slow
def test_ray_sweep_runs_its_variants_on_ray_workers_and_reads_back_through_mlflow(tmp_path: Path) -> None:
    _ray_or_skip()
    # a Ray of its own: a short folder (Ray's socket paths must stay under 108 bytes), removed after
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    try:
        proc = _sweep(
            tmp_path,
            "hydra/launcher=ray",  # a local Ray of two CPUs without its dashboard, as README shows
            "+hydra.launcher.ray.init.num_cpus=2",
            "+hydra.launcher.ray.init.include_dashboard=false",
            f"+hydra.launcher.ray.init._temp_dir={ray_tmp}",
        )
        # Ray names each worker's log after the worker's pid, and the driver's after the driver's
        logs = ray_tmp / "session_latest" / "logs"
        worker_pids = {int(p.stem.rsplit("-", 1)[1]) for p in logs.glob("worker-*.out")}
        ray_driver_pids = {int(p.stem.rsplit("_", 1)[1]) for p in logs.glob("python-core-driver-*.log")}
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
    assert proc.stdout.count("comparison against baseline") == 1
    children = _assert_one_family(tmp_path)
    parent, _ = _family(tmp_path)
    # the sweep's driver started the local Ray; each variant's run was logged by a Ray worker
    assert ray_driver_pids == {_owner_pid(parent)}
    assert {_owner_pid(r) for r in children} <= worker_pids
    assert _owner_pid(parent) not in worker_pids

    # what a user reads through MLflow is what the jobs and the comparison computed
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    sweep = _sweep_dir(tmp_path)
    by_label = {r.data.tags["variant"]: r for r in children}
    for job in sweep.iterdir():
        if (job / METRICS_FILE).is_file():
            label = json.loads((job / VARIANT_FILE).read_text(encoding="utf-8"))["label"]
            on_disk = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
            logged = by_label.pop(label).data.metrics
            assert {"dev/recall_at_5", "holdout/context_tokens_at_5"} <= logged.keys()
            assert {k: v for k, v in logged.items() if k in on_disk} == {
                k: on_disk[k] for k in logged.keys() & on_disk.keys()
            }
    assert by_label == {}  # a run per variant, and a job folder per run
    downloaded = Path(client.download_artifacts(parent.info.run_id, COMPARISON_JSON, str(tmp_path / "dl")))
    assert downloaded.read_bytes() == (sweep / COMPARISON_JSON).read_bytes()
    comparison = json.loads(downloaded.read_text(encoding="utf-8"))
    (row,) = [
        r
        for r in comparison["rows"]
        if (r["variant"], r["split"], r["metric"]) == ("chunk=8", "dev", "context_tokens_at_5")
    ]
    assert row["effect"] < 0  # smaller chunks: fewer context tokens, a real difference to read back
    (chunk8,) = [r for r in children if r.data.tags["variant"] == "chunk=8"]
    assert client.get_run(chunk8.info.run_id).data.metrics["delta/dev/context_tokens_at_5"] == row["effect"]
