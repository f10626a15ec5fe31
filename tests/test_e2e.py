"""End to end: the README's sweep, read back through MLflow's API."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from omegaconf import OmegaConf

from rag_ablate.config.overrides import CONF_DIR
from rag_ablate.dataset.load import load_dataset
from rag_ablate.records.jsonl import read_records
from rag_ablate.records.scoring import aggregate, rescore
from tests.conftest import copy_shared, free_port, rag_ablate_cli, run_module, write_dataset


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_module("rag_ablate", args, cwd)


@pytest.fixture
def sweep(default_sweep: dict[str, Any]) -> dict[str, Any]:
    """README's sweep, shared by the session (tests/conftest.py): read only."""
    return default_sweep


@pytest.fixture(scope="module")
def own_sweep(default_sweep: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """README's sweep copied to a folder of this module's own, for a test that rewrites its comparison
    (and, by the parent run's id, logs it to the copy's MLflow store)."""
    return copy_shared(default_sweep, tmp_path_factory.mktemp("sweep") / "copy")


@pytest.mark.slow
def test_sweep_creates_parent_and_two_children(sweep: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    db = sweep["out"] / "mlflow.db"
    assert db.is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("rag_ablate.kind") == "sweep"]
    children = [r for r in runs if r.data.tags.get("rag_ablate.kind") == "variant"]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    by_name = {c.info.run_name: c for c in children}
    # chunk=512 is the default: the baseline, named with what it is
    assert set(by_name) == {"baseline (chunk=512)", "chunk=256"}

    small, big = by_name["chunk=256"], by_name["baseline (chunk=512)"]
    assert small.data.params["chunk.size"] == "256" and big.data.params["chunk.size"] == "512"
    assert small.data.tags["choice.chunk"] == "256"
    for c in children:
        assert len(c.data.tags["dataset.corpus_fingerprint"]) == 64
        assert c.data.tags["rag_ablate.version"]
        for key in (
            "dev/recall_at_5",
            "holdout/recall_at_5",
            "holdout/ndcg_at_10",
            "holdout/intent_top1",
            "dev/evidence_recall_at_5",
            "dev/evidence_coverage_at_5",  # issue 26: beside evidence recall, and label coverage
            "holdout/judged_at_10",
            "holdout/bpref",
            "dev/context_tokens_at_5",
            "cost/latency_p95_ms",
            "dev/n_unanswerable",
        ):
            assert key in c.data.metrics, key
        arts = {a.path for a in client.list_artifacts(c.info.run_id)}
        assert {"records.jsonl", "metrics.json", "config.yaml", "intents.md"} <= arts
    # the two chunkings really differ
    assert small.data.metrics["dev/context_tokens_at_5"] < big.data.metrics["dev/context_tokens_at_5"]
    assert small.data.metrics["run/index_chunks"] > big.data.metrics["run/index_chunks"]
    assert any(
        small.data.metrics[k] != big.data.metrics[k]
        for k in ("dev/recall_at_5", "holdout/recall_at_5", "dev/evidence_recall_at_5")
    )

    # the terminal shows the table and where to look next
    out = sweep["proc"].stdout
    assert "chunk=256" in out and "recall@5" in out and "dev / holdout" in out and "rag-ablate ui" in out


@pytest.mark.slow
def test_records_recompute_every_logged_number(sweep: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{sweep['out'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    dataset = load_dataset(None)
    for run in client.search_runs([exp.experiment_id], "tags.`rag_ablate.kind` = 'variant'"):
        local = Path(client.download_artifacts(run.info.run_id, "records.jsonl"))
        records = read_records(local)
        assert len(records) == len(dataset.queries)  # nothing dropped
        recomputed = aggregate(rescore(records, dataset, [1, 3, 5, 10], routed=True))
        # the full grid is in metrics.json; MLflow has the keys the tables and the comparison use
        full = json.loads(Path(client.download_artifacts(run.info.run_id, "metrics.json")).read_text())
        for key, value in recomputed.items():
            assert full[key] == pytest.approx(value, abs=1e-12), key
            if key in run.data.metrics:
                assert run.data.metrics[key] == pytest.approx(value, abs=1e-12), key
        rec = records[0]
        for field in ("query_id", "split", "group", "status", "retrieved", "intent_pred", "timings_ms"):
            assert field in rec
        assert {"chunk_id", "doc_id", "start", "end", "score", "rank"} <= set(rec["retrieved"][0])


@pytest.mark.slow
def test_single_run_on_own_dataset_without_mlflow(tiny_dataset: Path, tmp_path: Path) -> None:
    load = ConfigLoaderImpl.load_configuration
    with mock.patch.object(ConfigLoaderImpl, "load_configuration", autospec=True, side_effect=load) as spy:
        args = [f"dataset.path={tiny_dataset}", "tracking=none", "progress=false", "retrieval.top_k=10"]
        proc = run_cli(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list((tmp_path / "outputs" / "runs").iterdir())
    assert len(runs) == 1
    # Hydra composed the config once (not again after reading hydra.mode), as Hydra composes it
    assert spy.call_count == 1
    overrides = OmegaConf.to_container(OmegaConf.load(runs[0] / ".hydra" / "overrides.yaml"))
    assert isinstance(overrides, list)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        want = compose("config", overrides=[str(o) for o in overrides])
    hydra_yaml = OmegaConf.load(runs[0] / ".hydra" / "hydra.yaml").hydra
    assert OmegaConf.load(runs[0] / ".hydra" / "config.yaml") == want
    assert hydra_yaml.mode == "RUN" and list(hydra_yaml.overrides.hydra) == ["hydra.mode=RUN"]
    summary = json.loads((runs[0] / "summary.json").read_text())
    m = summary["metrics"]
    assert m["all/n_queries"] == 8 and m["all/n_unanswerable"] == 1 and m["all/n_no_rag"] == 1
    assert "records:" in proc.stdout
    assert not (tmp_path / "outputs" / "mlflow.db").exists()


@pytest.mark.slow
def test_bad_dataset_path_is_a_clear_error(tmp_path: Path) -> None:
    proc = run_cli([f"dataset.path={tmp_path / 'missing'}", "tracking=none", "progress=false"], tmp_path)
    assert proc.returncode == 2
    assert "dataset folder not found" in proc.stderr and "Traceback" not in proc.stderr


def _rag_ablate(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return rag_ablate_cli(args, cwd)  # in this process: the test reads what the command writes


@pytest.mark.slow
def test_sweep_end_runs_the_comparison(sweep: dict[str, Any]) -> None:
    from mlflow.tracking import MlflowClient

    sweep_dir = next((sweep["out"] / "multirun").iterdir())
    data = json.loads((sweep_dir / "comparison.json").read_text())
    assert data["baseline"] == "baseline" and data["variants"] == ["chunk=256"]
    assert {r["split"] for r in data["rows"]} == {"dev", "holdout"}
    assert "comparison against baseline" in sweep["proc"].stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{sweep['out'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = next(r for r in runs.values() if r.data.tags.get("rag_ablate.kind") == "sweep")
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"comparison.json", "comparison.md", "summary.md"} <= arts
    child = runs["chunk=256"]
    row = next(r for r in data["rows"] if r["split"] == "holdout" and r["metric"] == "recall_at_5")
    assert child.data.metrics["delta/holdout/recall_at_5"] == pytest.approx(row["effect"], abs=1e-12)


@pytest.mark.slow
def test_compare_cli_on_sweep_folder_and_parent_run(own_sweep: dict[str, Any], tmp_path: Path) -> None:
    sweep_dir = next((own_sweep["out"] / "multirun").iterdir())
    before = json.loads((sweep_dir / "comparison.json").read_text())
    proc = _rag_ablate(["compare", str(sweep_dir), "--B", "10000"], own_sweep["cwd"])
    assert proc.returncode == 0, proc.stderr
    again = json.loads((sweep_dir / "comparison.json").read_text())
    assert again["rows"] == before["rows"]  # identical numbers on rerun

    # the other way round: effects negate
    proc = _rag_ablate(
        [
            "compare",
            str(sweep_dir),
            "--baseline",
            "chunk=256",
            "--metrics",
            "recall_at_5",
            "--splits",
            "holdout",
        ],
        own_sweep["cwd"],
    )
    assert proc.returncode == 0, proc.stderr
    swapped = json.loads((sweep_dir / "comparison.json").read_text())
    r0 = next(r for r in before["rows"] if r["split"] == "holdout" and r["metric"] == "recall_at_5")
    assert swapped["rows"][0]["effect"] == pytest.approx(-r0["effect"], abs=1e-12)

    # the gate: a bound nothing crosses passes; evidence recall lost with small chunks is gated (a
    # margin rule reads the point estimate: fewer resamples serve)
    ok = _rag_ablate(
        ["compare", str(sweep_dir), "--B", "500", "--fail-on", "holdout/recall_at_5:-0.5"],
        own_sweep["cwd"],
    )
    assert ok.returncode == 0 and "regression gate passed" in ok.stdout
    bad = _rag_ablate(
        [
            "compare",
            str(sweep_dir),
            "--B",
            "500",
            "--fail-on",
            "holdout/evidence_recall_at_5:-0.05",
        ],
        own_sweep["cwd"],
    )
    assert bad.returncode == 3 and "regression gate BLOCKED" in bad.stderr and "chunk=256" in bad.stderr

    # by MLflow parent run id
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{own_sweep['out'] / 'mlflow.db'}"
    exp = MlflowClient(tracking_uri=uri).get_experiment_by_name("rag_ablate")
    assert exp is not None
    parent = MlflowClient(tracking_uri=uri).search_runs(
        [exp.experiment_id], "tags.`rag_ablate.kind` = 'sweep'"
    )[0]
    proc = _rag_ablate(
        [
            "compare",
            parent.info.run_id,
            "--tracking-uri",
            uri,
            "--out",
            str(tmp_path / "cmp"),
        ],
        own_sweep["cwd"],
    )
    assert proc.returncode == 0, proc.stderr
    by_id = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert by_id["rows"] == before["rows"]
    # what the comparison logged went to the copy's store, not to the session's shared sweep
    assert parent.info.artifact_uri.startswith((own_sweep["out"] / "mlartifacts").resolve().as_uri())


# --- sweeps that fail: every failure is reported, what succeeded is kept -------------


def _client_for(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _client(out: Path) -> Any:
    return _client_for(f"sqlite:///{out / 'mlflow.db'}")


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """chunk sizes without a preset file, plus one level whose job fails at run time
    (its cache folder is a file): baseline, chunk=300, chunk=600, cache.dir=<file>."""
    cwd = tmp_path_factory.mktemp("failing")
    data = write_dataset(cwd / "tiny")
    not_a_folder = cwd / "not_a_folder"
    not_a_folder.write_text("", encoding="utf-8")
    proc = run_cli(
        [
            "-m",
            f"dataset.path={data}",
            "chunk=300,600",
            f"cache.dir=null,{not_a_folder}",  # null is the baseline's value: one job, which fails
            "progress=false",
            "compare.B=500",
        ],
        cwd,
    )
    sweep_dirs = list((cwd / "outputs" / "multirun").iterdir())
    assert len(sweep_dirs) == 1, proc.stderr[-3000:]
    return {"cwd": cwd, "out": cwd / "outputs", "proc": proc, "dir": sweep_dirs[0], "bad": not_a_folder}


@pytest.mark.slow
def test_any_chunk_size_sweeps_like_a_preset(failing_sweep: dict[str, Any]) -> None:
    client = _client(failing_sweep["out"])
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = {
        r.info.run_name: r
        for r in client.search_runs([exp.experiment_id], "tags.`rag_ablate.kind` = 'variant'")
    }
    # the failed job's run, created when it started, ended FAILED with nothing logged;
    # the baseline's name leaves the runtime factor cache.dir out
    failed = {name for name, r in runs.items() if r.info.status == "FAILED"}
    assert failed == {f"cache.dir={failing_sweep['bad']}"}
    assert not runs[f"cache.dir={failing_sweep['bad']}"].data.metrics
    assert set(runs) - failed == {"baseline (chunk=512)", "chunk=300", "chunk=600"}
    for size, overlap in ((300, 37), (600, 75)):
        run = runs[f"chunk={size}"]
        assert run.info.status == "FINISHED"
        assert run.data.params["chunk.size"] == str(size) and run.data.params["chunk.overlap"] == str(overlap)
        assert run.data.tags["choice.chunk"] == str(size)
        assert (run.data.tags["ablation.factor"], run.data.tags["ablation.level"]) == ("chunk", str(size))
    assert runs["baseline (chunk=512)"].data.params["chunk.size"] == "512"


@pytest.mark.slow
def test_failed_job_fails_the_sweep_and_the_rest_is_kept(failing_sweep: dict[str, Any]) -> None:
    proc, sweep_dir = failing_sweep["proc"], failing_sweep["dir"]
    assert proc.returncode == 1
    label = f"cache.dir={failing_sweep['bad']}"
    lines = proc.stderr.splitlines()
    i = lines.index(
        f"sweep FAILED: 1 problem(s); details in {sweep_dir.relative_to(failing_sweep['cwd'])}/failures.json"
    )
    # the job's one line names the path it could not write and the error (core/fsio.WriteError)
    assert lines[i + 1].startswith(f"  job #3 {label}: cannot write {failing_sweep['bad']}/")
    assert lines[i + 1].endswith(": Not a directory (ENOTDIR)")
    failures = json.loads((sweep_dir / "failures.json").read_text())
    assert failures["failed"] is True and len(failures["failures"]) == 1
    entry = failures["failures"][0]
    assert (entry["step"], entry["job"], entry["what"]) == ("job", 3, label)
    assert "Traceback" in entry["detail"]

    # the jobs that finished are compared and logged
    data = json.loads((sweep_dir / "comparison.json").read_text())
    assert data["baseline"] == "baseline" and data["variants"] == ["chunk=300", "chunk=600"]
    assert "comparison against baseline" in proc.stdout
    for job in ("0", "1", "2"):
        assert (sweep_dir / job / "records.jsonl").is_file()
    client = _client(failing_sweep["out"])
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    parent = client.search_runs([exp.experiment_id], "tags.`rag_ablate.kind` = 'sweep'")[0]
    assert parent.info.status == "FAILED"
    assert (
        parent.data.metrics["sweep/n_failed_jobs"] == 1.0 and parent.data.metrics["sweep/n_variants"] == 3.0
    )
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"failures.json", "comparison.json", "summary.md"} <= arts


@pytest.mark.slow
def test_unusable_tracking_store_stops_the_sweep_before_any_job(tiny_dataset: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "x.db"
    proc = run_cli(
        ["-m", "chunk=256,512", f"tracking.uri=sqlite:///{missing}", f"dataset.path={tiny_dataset}"], tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"rag_ablate: error: MLflow store sqlite:///{missing}: folder {missing.parent} does not exist "
        "(create it, or leave tracking.uri unset to use <paths.output_root>/mlflow.db)"
    )
    assert not (tmp_path / "outputs").exists() and not missing.parent.exists()

    url = f"http://127.0.0.1:{free_port()}"
    proc = run_cli(["-m", "chunk=256,512", f"tracking.uri={url}", f"dataset.path={tiny_dataset}"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"rag_ablate: error: MLflow server {url} is not reachable: ")
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_unusable_tracking_store_fails_a_single_run(tiny_dataset: Path, tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "x.db"
    proc = run_cli([f"tracking.uri=sqlite:///{missing}", f"dataset.path={tiny_dataset}"], tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    assert not list((tmp_path / "outputs").rglob("records.jsonl"))


@pytest.mark.slow
def test_failed_comparison_fails_the_sweep(tiny_dataset: Path, tmp_path: Path) -> None:
    proc = run_cli(
        [
            "-m",
            f"dataset.path={tiny_dataset}",
            "chunk=256,512",
            "compare.baseline=nope",
            "tracking=none",
            "progress=false",
        ],
        tmp_path,
    )
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert any(ln.startswith("sweep FAILED: 1 problem(s)") for ln in lines)
    assert any(ln.startswith("  comparison: ") and "nope" in ln for ln in lines), proc.stderr[-2000:]
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
    assert (sweep_dir / "summary.md").is_file() and (sweep_dir / "1" / "records.jsonl").is_file()
    assert json.loads((sweep_dir / "failures.json").read_text())["failures"][0]["step"] == "comparison"


def test_sqlite_store_is_checked_before_mlflow_touches_it(tmp_path: Path) -> None:
    from rag_ablate.core.errors import TrackingError
    from rag_ablate.tracking import store as tracking

    a_file = tmp_path / "a_file"
    a_file.write_text("", encoding="utf-8")
    with pytest.raises(
        TrackingError, match=f"^MLflow store sqlite:///{a_file}/x.db: {a_file} is not a folder$"
    ):
        tracking.open_store(f"sqlite:///{a_file}/x.db", "rag_ablate", tmp_path / "art")
    with pytest.raises(TrackingError, match="does not exist"):
        tracking.open_store(f"sqlite:///{tmp_path}/new/x.db", "rag_ablate", tmp_path / "art")
    assert not (tmp_path / "new").exists()
    # the default store (under paths.output_root) gets its folder created
    exp_id = tracking.open_store(
        f"sqlite:///{tmp_path}/new/x.db", "rag_ablate", tmp_path / "art", create_folder=True
    )
    assert (tmp_path / "new" / "x.db").is_file()
    assert _client_for(f"sqlite:///{tmp_path}/new/x.db").get_experiment(exp_id).name == "rag_ablate"


def test_relative_sqlite_store_gets_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracking.uri=sqlite:///outputs/mlflow.db`` on a fresh checkout works like the default."""
    from rag_ablate.tracking import store as tracking

    monkeypatch.chdir(tmp_path)
    tracking.open_store("sqlite:///outputs/mlflow.db", "rag_ablate", tmp_path / "art")
    assert (tmp_path / "outputs" / "mlflow.db").is_file()


@pytest.mark.slow
def test_label_and_evidence_coverage_reach_the_views_and_equal_pytrec_eval(sweep: dict[str, Any]) -> None:
    """evidence_coverage@5, judged@10 and bpref on the embedded sample: in the end table and in the
    comparison (MLflow: test_sweep_creates_parent_and_two_children); each record's judged_at_k and
    bpref equal pytrec_eval's on its own ranking."""
    import pytrec_eval

    from rag_ablate.metrics.retrieval import unique_docs

    header = next(line for line in sweep["proc"].stdout.splitlines() if line.startswith("variant "))
    assert {"evidence_recall@5", "evidence_coverage@5", "judged@10"} <= set(header.split())
    comparison = json.loads((sweep["dir"] / "comparison.json").read_text(encoding="utf-8"))
    assert {"evidence_coverage_at_5", "bpref"} <= {r["metric"] for r in comparison["rows"]}

    dataset = load_dataset(None)
    gold = {q.query_id: dict(q.relevant) for q in dataset.queries if q.kind == "answerable" and q.relevant}
    records = read_records(sweep["dir"] / "0" / "records.jsonl")
    ranked = {
        r["query_id"]: unique_docs([e["doc_id"] for e in r["retrieved"]])
        for r in records
        if r["query_id"] in gold
    }
    runs = {q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in ranked.items()}
    labelled = {q: dict.fromkeys(gold[q], 1) for q in runs}
    precision = pytrec_eval.RelevanceEvaluator(labelled, {"P.1,3,5,10"}).evaluate(runs)
    pref = pytrec_eval.RelevanceEvaluator({q: gold[q] for q in runs}, {"bpref"}).evaluate(runs)
    for r in records:
        q = r["query_id"]
        if q in runs:
            m = r["metrics"]
            assert m["bpref"] == pytest.approx(pref[q]["bpref"], abs=1e-12), q
            for k in (1, 3, 5, 10):
                assert m[f"judged_at_{k}"] == pytest.approx(precision[q][f"P_{k}"], abs=1e-12), (q, k)
            if "evidence_recall_at_5" in m:  # a query with evidence spans: coverage never above recall
                assert m["evidence_coverage_at_5"] <= m["evidence_recall_at_5"]
    assert len(runs) > 200
