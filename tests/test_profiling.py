"""Per-stage wall time and peak memory (rag_ablate.core.profiling), and the profile.json files runs write."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from rag_ablate.core import profiling
from rag_ablate.core.layout import PROFILE_FILE, SUMMARY_FILE, SWEEP_FILE

# in the order a job first enters them: the per-query traces are handed to MLflow (log) as soon as
# the records are final, before the records are written and the run scored
JOB_STAGES = ["imports", "config", "store", "load", "index", "query", "score", "log", "write", "judge"]


def test_stage_times_its_block_and_repeats_add_up() -> None:
    prof = profiling.Profile("job", sample=False)
    with prof.stage("index"):
        time.sleep(0.05)
    with prof.stage("query"):
        time.sleep(0.02)
    with prof.stage("index"):
        time.sleep(0.03)
    prof.close()
    assert list(prof.stages) == ["index", "query"]  # in the order they first ran
    assert 0.08 <= prof.seconds("index") < 0.5
    assert 0.02 <= prof.seconds("query") < 0.4
    data = prof.to_dict()
    assert data["total_s"] == pytest.approx(prof.seconds("index") + prof.seconds("query"), abs=1e-3)


def test_cpu_seconds_tell_waiting_from_computing() -> None:
    prof = profiling.Profile("job", sample=False)
    with prof.stage("wait"):
        time.sleep(0.1)
    with prof.stage("work"):
        t0 = time.process_time()
        while time.process_time() - t0 < 0.1:
            pass
    assert prof.stages["wait"]["cpu_s"] < 0.05 <= 0.1 <= prof.stages["wait"]["seconds"]
    assert prof.stages["work"]["cpu_s"] >= 0.09
    assert prof.to_dict()["cpu_s"] == pytest.approx(
        prof.stages["wait"]["cpu_s"] + prof.stages["work"]["cpu_s"]
    )


def test_nested_stage_time_is_not_counted_twice() -> None:
    prof = profiling.Profile("job", sample=False)
    prof.start("score")
    time.sleep(0.03)
    with prof.stage("judge"):
        time.sleep(0.05)
    time.sleep(0.02)
    outer = prof.stop()
    assert 0.05 <= prof.seconds("judge") < 0.4
    # the outer stage keeps only its own time: the stages add up to the wall time
    assert outer == pytest.approx(prof.seconds("score"), abs=1e-3)
    assert 0.05 <= outer < 0.4 and outer < 0.05 + prof.seconds("judge")


def test_move_hands_seconds_from_one_stage_to_another() -> None:
    prof = profiling.Profile("job", sample=False)
    prof.add("query", 2.0, 100.0)
    prof.move("query", "score", 0.5)
    prof.move("query", "score", 5.0)  # never more than the stage had
    assert prof.seconds("query") == 0.0 and prof.seconds("score") == 2.0
    assert prof.stages["score"]["peak_mb"] == 100.0
    assert prof.stages["score"]["cpu_s"] == 2.0 and prof.stages["query"]["cpu_s"] == 0.0


def test_move_hands_the_cpu_time_measured_not_the_wall_time() -> None:
    """On a busy machine scoring waits for a core: 0.5 s of wall time may be 0.1 s of CPU, and the
    query stage keeps the rest of its CPU time (moving wall time emptied it: "query 0.00 s CPU")."""
    prof = profiling.Profile("job", sample=False)
    prof.add("query", 2.0, 100.0, 0.8)
    prof.move("query", "score", 0.5, 0.1)
    assert prof.seconds("query") == 1.5 and prof.seconds("score") == 0.5
    assert prof.stages["score"]["cpu_s"] == 0.1 and prof.stages["query"]["cpu_s"] == 0.7


def test_peak_memory_of_the_stage_that_allocated() -> None:
    prof = profiling.Profile("job")
    with prof.stage("small"):
        time.sleep(0.12)
    with prof.stage("big"):
        block = bytearray(300 * 1024 * 1024)  # 300 MB, touched so it is resident
        for i in range(0, len(block), 4096):
            block[i] = 1
        # held a while: in a process whose earlier peak was higher (a long test session), only
        # the sampler (every SAMPLE_S) can see it
        time.sleep(4 * profiling.SAMPLE_S + 0.2)
        del block
    with prof.stage("after"):
        time.sleep(0.12)
    prof.close()
    big, small, after = (prof.stages[k]["peak_mb"] for k in ("big", "small", "after"))
    # the allocation shows in its own stage (the process's new peak), not in the stages around it
    assert big >= small + 250
    assert after < big - 250
    assert prof.peak_mb == big
    assert prof.metrics()["memory/peak_mb"] == big


def test_metrics_and_summary_line() -> None:
    prof = profiling.Profile("job", sample=False)
    prof.add("index", 2.0, 300.0)
    prof.add("query", 1.0, 310.0)
    prof.add("log", 0.5, 305.0)
    assert prof.metrics() == {
        "time/index_s": 2.0,
        "time/query_s": 1.0,
        "time/log_s": 0.5,
        "time/total_s": 3.5,
        "memory/peak_mb": 310.0,
    }
    assert prof.line() == "time 3.5s: index 2.0s, query 1.0s, log 0.5s; peak 310 MB"
    assert profiling.Profile.metrics_of(prof.to_dict()) == prof.metrics()


def test_breakdown_adds_the_jobs_stages_in_place_of_jobs() -> None:
    sweep = {
        "stages": {
            "imports": {"seconds": 1.0},
            "plan": {"seconds": 0.5},
            "store": {"seconds": 2.0},
            "jobs": {"seconds": 5.0},
            "compare": {"seconds": 1.5},
            "log": {"seconds": 0.25},
        }
    }
    jobs = {
        "baseline": {
            "stages": {"index": {"seconds": 2.0}, "query": {"seconds": 0.5}, "log": {"seconds": 1.0}}
        },
        "chunk=256": {
            "stages": {"index": {"seconds": 0.5}, "query": {"seconds": 0.25}, "log": {"seconds": 0.5}}
        },
    }
    out = profiling.breakdown(sweep, jobs)
    assert out == {
        "imports": 1.0,
        "store": 2.0,
        "index": 2.5,
        "query": 0.75,
        "log": 1.75,
        "compare": 1.5,
        "plan": 0.5,
        "launch": 0.25,  # the launcher's own share of the jobs' 5 s
    }
    assert sum(out.values()) == pytest.approx(1.0 + 0.5 + 2.0 + 5.0 + 1.5 + 0.25)


def test_process_age_is_the_time_since_the_interpreter_started() -> None:
    age = profiling.process_age_s()
    assert age is not None and 0.0 < age < 24 * 3600
    assert profiling.hwm_mb() >= profiling.rss_mb() > 1.0


@pytest.mark.slow
def test_sweep_and_jobs_write_profiles_and_log_them(default_sweep: dict[str, Any]) -> None:
    """README's sweep (tests/conftest.py, a real process: the interpreter's start-up and imports
    are a stage of their own), read only."""
    proc, sweep = default_sweep["proc"], default_sweep["dir"]
    data = json.loads((sweep / PROFILE_FILE).read_text(encoding="utf-8"))
    stages = ["imports", "plan", "store", "jobs", "summary", "timing", "compare", "report", "log"]
    assert list(data["stages"]) == stages
    assert set(data["jobs"]) == {"baseline", "chunk=256"}
    for label, job in data["jobs"].items():
        assert list(job["stages"]) == JOB_STAGES, label
        for name, entry in job["stages"].items():
            assert 0.0 <= entry["seconds"] < 120, (label, name)
            assert 0.0 <= entry["cpu_s"] < 120, (label, name)
            assert 10 < entry["peak_mb"] < 8000, (label, name)
        assert job["total_s"] == pytest.approx(sum(e["seconds"] for e in job["stages"].values()), abs=0.01)
    # the breakdown covers the stages and adds up to the sweep's own total
    bd = {k: v["seconds"] for k, v in data["breakdown"].items()}
    assert list(bd)[:7] == ["imports", "store", "index", "query", "score", "log", "compare"]
    assert sum(bd.values()) == pytest.approx(data["total_s"], rel=0.01, abs=0.05)
    assert data["stages"]["imports"]["seconds"] > 0.1  # python and its imports take time
    # one line says where the time went
    lines = [ln for ln in proc.stdout.splitlines() if ln.endswith(f"{sweep.name}/{PROFILE_FILE})")]
    assert len(lines) == 1 and re.fullmatch(r"time [\d.]+s: .+; peak \d+ MB \(.+\)", lines[0]), lines

    client = MlflowClient(tracking_uri=f"sqlite:///{default_sweep['out'] / 'mlflow.db'}")
    parent = client.get_run(json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))["parent_run_id"])
    assert parent.data.metrics["time/compare_s"] == pytest.approx(data["stages"]["compare"]["seconds"])
    assert parent.data.metrics["memory/peak_mb"] > 10
    job_dir = sweep / "0"
    summary = json.loads((job_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    run = client.get_run(summary["run_id"])
    job_prof = json.loads((job_dir / PROFILE_FILE).read_text(encoding="utf-8"))
    for name in JOB_STAGES:
        assert run.data.metrics[f"time/{name}_s"] == pytest.approx(job_prof["stages"][name]["seconds"])
    assert run.data.metrics["memory/peak_mb"] == pytest.approx(job_prof["peak_mb"])
    assert run.info.status == "FINISHED"
    assert PROFILE_FILE in {a.path for a in client.list_artifacts(run.info.run_id)}
