"""MLflow imported and written by a second process while the run goes on (rag_ablate.tracking.background)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.errors import TrackingError, WriterError
from rag_ablate.core.layout import PROFILE_FILE, RUN_FILE, SUMMARY_FILE, SWEEP_FILE
from rag_ablate.tracking import background, serving
from tests.conftest import child_pids, run_module, write_dataset


def test_without_a_writer_a_call_runs_here_and_raises_as_it_is() -> None:
    assert not background.active()
    assert background.call("adding", "log", sum, [1, 2]).result() == 3
    with pytest.raises(ZeroDivisionError):
        background.call("dividing", "log", divmod, 1, 0)


def test_a_call_gets_the_values_of_pendings_in_its_arguments_and_the_records_as_they_are() -> None:
    """A Pending is replaced by its value as an argument or as an item of a dict or list argument;
    what lies deeper (the records a call logs) is handed over as it is, neither walked nor copied."""
    records = [{"query_id": "q1", "metrics": {"recall_at_5": 1.0}, "retrieved": [["d1", 0.5]]}]
    run_id = background.Pending.known("abc")
    out = background.call("passing", "log", lambda *a, **k: (a, k), records, run_id, ids={"run": run_id})
    args, kwargs = out.result()
    assert args[0][0] is records[0] and args[1] == "abc" and kwargs == {"ids": {"run": "abc"}}


def test_a_writer_does_the_calls_in_order_passes_values_on_and_names_what_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(serving, "WARM", ())  # no MLflow to import for these calls
    monkeypatch.setattr(background, "_writer", background.Writer())
    try:
        assert background.active()
        pair = background.call("dividing", "log", divmod, 7, 2)
        total = background.call("adding", "log", sum, pair)  # the first call's value, in the writer
        broken = background.call("dividing by zero", "log", divmod, 1, 0)
        after = background.call("adding after it", "log", sum, broken)
        seen: list[int] = []
        total.then(seen.append)
        later = background.call_later("held back", "log", time.monotonic_ns)
        sooner = background.call("handed over after it", "log", time.monotonic_ns)
        assert sooner.result() < later.result()  # the held call went after the next one
        assert total.result() == 4 and pair.result() == (3, 1)
        assert after.value_or_none() is None and not broken.ok()
        failed = background.finish()
        assert seen == [4]
        assert failed == [
            "dividing by zero: ZeroDivisionError: integer division or modulo by zero",
            "adding after it: not done: it needs dividing by zero, which failed",
        ]
        with pytest.raises(WriterError, match="MLflow writer: dividing by zero failed"):
            broken.result()
        assert set(background.times()) == {"store", "log"}
    finally:
        background.finish()
        background.forget()
    assert not background.active() and background.failures() == []


@pytest.mark.slow
def test_the_default_sweep_logs_everything_through_the_writer(default_sweep: dict[str, Any]) -> None:
    """README's sweep, a real process: MLflow was written by the writer, and what it holds is whole."""
    from mlflow.tracking import MlflowClient

    sweep, proc = default_sweep["dir"], default_sweep["proc"]
    prof = json.loads((sweep / PROFILE_FILE).read_text(encoding="utf-8"))
    assert set(prof["background"]) == {"store", "log"}, prof.get("background")
    assert prof["writer"] in ("resident", "forked")  # which writer it was; the suite's: resident
    assert "; MLflow alongside " in proc.stdout
    info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
    client = MlflowClient(tracking_uri=info["tracking_uri"])
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["sweep/n_variants"] == 2.0
    assert str(parent.info.experiment_id) == info["experiment_id"]
    for job in ("0", "1"):
        summary = json.loads((sweep / job / SUMMARY_FILE).read_text(encoding="utf-8"))
        run_file = json.loads((sweep / job / RUN_FILE).read_text(encoding="utf-8"))
        assert summary["run_id"] == run_file["run_id"]
        assert summary["traces"] == 40  # 20 per split, counted once the writer logged them
        run = client.get_run(summary["run_id"])
        assert run.info.status == "FINISHED"
        assert run.data.tags["mlflow.parentRunId"] == info["parent_run_id"]
        assert "time/log_s" in run.data.metrics and "retrieval.top_k" in run.data.params
        # the owner is the command's own process, not the writer's
        assert run.data.tags["rag_ablate.process"].split(":")[1] == str(prof["pid"])
    assert "MLflow UI: rag-ablate ui" in proc.stdout


def test_an_artifact_folder_that_cannot_be_made_stops_the_run_before_the_writer_is_waited_for(
    tmp_path: Path,
) -> None:
    """The run does not wait for the writer before its first query: what can be checked without
    MLflow (here the experiment's artifact folder) is checked in the main process, so such a store
    still stops the command before anything is spent."""
    from rag_ablate.tracking import store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(TrackingError, match="cannot create the artifact folder /proc/rag_ablate_nope"):
        store.check_store(uri, "rag_ablate", artifact_root=Path("/proc/rag_ablate_nope"))
    store.check_store(uri, "rag_ablate", artifact_root=tmp_path / "art")
    assert (tmp_path / "art").is_dir()


@pytest.mark.parametrize("writer", ["resident", "forked"])
@pytest.mark.parametrize("bad", ["retrieval=nope", "top k=3"])
def test_a_command_stopped_by_a_bad_override_leaves_no_writer_behind(
    tmp_path: Path, bad: str, writer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m rag_ablate`` reaches its writer before the overrides are checked (MLflow is
    imported while the command imports Hydra); a command that stops at a bad one (exit 2, one line)
    lets the unused writer go: no process with the command's own command line is left (a forked
    writer has it), and the resident writer has no child left for it."""
    from rag_ablate.tracking import resident

    if writer == "forked":
        monkeypatch.setenv(resident.IDLE_ENV, "0")
    else:  # a resident writer of this test's own (a short path: a socket's has a limit)
        monkeypatch.setenv(resident.DIR_ENV, tempfile.mkdtemp(prefix="rar-"))
    marker = f"hydra.run.dir={tmp_path / 'never'}"
    t0 = time.monotonic()
    proc = run_module("rag_ablate", [bad, marker], tmp_path, timeout=120, process=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("rag_ablate: error: ") and "Traceback" not in proc.stderr
    if writer == "resident":
        try:
            ((zygote, _),) = resident.running()
            while child_pids(zygote) and time.monotonic() - t0 < 30:
                time.sleep(0.05)
            assert child_pids(zygote) == []
        finally:
            resident.stop_all()
            shutil.rmtree(os.environ[resident.DIR_ENV], ignore_errors=True)
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:  # a process that ended meanwhile
            continue
    assert left == []


@pytest.mark.slow
def test_a_failure_in_the_writer_fails_the_command_naming_it(tmp_path: Path) -> None:
    """The writer cannot create the job's run (its experiment was deleted in MLflow): the job does
    not wait for it before its first query, and the command exits non-zero naming the call that
    failed and why (at the first query when it has failed by then, else at the job's end)."""
    from mlflow.tracking import MlflowClient

    from rag_ablate.tracking import store

    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    (tmp_path / "outputs").mkdir()
    # the store as a run makes it (from the machine's template, not through MLflow's migrations)
    experiment = store.open_store(uri, "rag_ablate", tmp_path / "outputs" / "mlartifacts")
    client = MlflowClient(tracking_uri=uri)
    client.delete_experiment(experiment)
    write_dataset(tmp_path / "tiny")  # the writer's failure is what is tested, not the sample
    proc = run_module(
        "rag_ablate", ["dataset=custom", "dataset.path=tiny", "progress=false"], tmp_path, process=True
    )
    # 2 (TrackingError) when it had failed before the first query: nothing done; else 1 (WriterError):
    # the job's work is done and kept, its MLflow run is not
    assert proc.returncode in (1, 2), proc.stderr[-2000:]
    err = proc.stderr
    assert "rag_ablate: error: " in err and "Traceback" not in err, err[-2000:]
    why = "MlflowException: The experiment 1 must be in the 'active' state"
    assert f"creating the run of dataset=custom,dataset.path=tiny: {why}" in err  # the variant's label
    assert not client.search_runs(["1"])
