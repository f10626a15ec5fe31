"""Records written as queries complete, and ``resume=`` after a kill.

The reader is tested on torn and garbled files (by hand and, for every cut
point of a written file, by a property test); the kill-and-resume tests start a
real run as a subprocess against a slow local rerank server, SIGKILL it midway,
resume it and compare with an uninterrupted run of the same config: same
metrics, one final record per query, the same MLflow run id, FINISHED.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, run_module, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from rerank_server import RerankServer

from rag_ablate.core.errors import ConfigError
from rag_ablate.core.layout import METRICS_FILE, PLAN_FILE, RECORDS_FILE, RUN_FILE, SWEEP_FILE
from rag_ablate.records.jsonl import (
    RecordsError,
    RecordWriter,
    dumps_line,
    final_records,
    loads_line,
    read_records,
    scan_records,
    write_records,
)
from rag_ablate.run.resume import rewrite_argv

# ---------------------------------------------------------------- the reader and the writer


def _rec(i: int, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"query_id": f"q{i}", "status": status, "text": "é" * i, **extra}


def test_reader_ignores_a_half_written_last_line(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    write_records(path, [_rec(1), _rec(2)])
    with path.open("a", encoding="utf-8") as f:
        f.write('{"query_id": "q3", "sta')  # the process was killed mid-write
    scan = scan_records(path)
    assert [r["query_id"] for r in scan.records] == ["q1", "q2"]
    assert scan.torn_tail
    assert scan.good_bytes == len(path.read_bytes()) - len('{"query_id": "q3", "sta')


def test_reader_keeps_a_complete_last_record_without_newline(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    path.write_text(json.dumps(_rec(1)) + "\n" + json.dumps(_rec(2)), encoding="utf-8")
    scan = scan_records(path)
    assert [r["query_id"] for r in scan.records] == ["q1", "q2"]
    assert not scan.torn_tail


def test_reader_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    path.write_text(json.dumps(_rec(1)) + "\n\n  \n" + json.dumps(_rec(2)) + "\n", encoding="utf-8")
    assert [r["query_id"] for r in read_records(path)] == ["q1", "q2"]


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ('{"query_id": "q2", "sta', "not a JSON record"),
        ("[1, 2]", "not a record"),
        ('{"no_id": 1}', "not a record"),
        ("\xff\xfe garbage", "not a JSON record"),
    ],
)
def test_reader_names_file_and_line_of_a_bad_line_before_the_last(tmp_path: Path, bad: str, why: str) -> None:
    path = tmp_path / RECORDS_FILE
    lines = [json.dumps(_rec(1)), bad, json.dumps(_rec(3))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"{RECORDS_FILE}:2: {why}"):
        read_records(path)


def test_reader_on_a_garbled_last_line_with_newline_is_an_error(tmp_path: Path) -> None:
    # a complete line (it has its newline) that is not a record was not cut by a kill
    path = tmp_path / RECORDS_FILE
    path.write_text(json.dumps(_rec(1)) + "\n" + "not json\n", encoding="utf-8")
    with pytest.raises(RecordsError, match=rf"{RECORDS_FILE}:2:"):
        read_records(path)


def test_writer_cuts_a_torn_tail_before_appending(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    write_records(path, [_rec(1)])
    with path.open("a", encoding="utf-8") as f:
        f.write('{"query_id": "q2", "st')
    with RecordWriter(path) as w:
        w.write(_rec(2))
        w.write(_rec(3, "timeout"))
    assert read_records(path) == [_rec(1), _rec(2), _rec(3, "timeout")]
    assert path.read_text(encoding="utf-8").count("\n") == 3


def test_writer_ends_a_complete_last_line_before_appending(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    path.write_text(json.dumps(_rec(1)), encoding="utf-8")
    with RecordWriter(path) as w:
        w.write(_rec(2))
    assert read_records(path) == [_rec(1), _rec(2)]


def test_writer_flushes_each_record_at_once(tmp_path: Path) -> None:
    path = tmp_path / RECORDS_FILE
    with RecordWriter(path, fsync_every=3600) as w:
        w.write(_rec(1))
        # another reader (or a resume after SIGKILL) sees it before the writer closes
        assert read_records(path) == [_rec(1)]
        w.write(_rec(2))
        assert read_records(path) == [_rec(1), _rec(2)]
        assert w.fsyncs == 0  # the interval has not passed
    assert w.fsyncs == 1  # closing syncs


def test_final_records_keeps_the_last_attempt_of_each_query() -> None:
    recs = [_rec(1, "timeout"), _rec(2), _rec(1, "ok", attempt=2), _rec(3, "http_error")]
    final = final_records(recs)
    assert final == {"q2": _rec(2), "q1": _rec(1, "ok", attempt=2), "q3": _rec(3, "http_error")}


_JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
_RECORD_VALUES = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4)
    | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(rec=st.dictionaries(st.text(max_size=6), _RECORD_VALUES, max_size=6))
def test_a_written_line_reads_back_as_the_json_module_would_write_it(rec: dict[str, Any]) -> None:
    """The writer's line (orjson's, or the json module's for NaN, an infinity or a 64-bit overflow) reads
    back as the json module's line does: NaN stays NaN, never null; every other value is kept."""
    line = dumps_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    expected = loads_line((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
    # NaN != NaN: compare the json module's text of both (it writes NaN as NaN)
    assert json.dumps(loads_line(line)) == json.dumps(expected)


@pytest.mark.parametrize(
    "rec",
    [
        {"query_id": "q", "error": None, "metrics": {"latency_ms": math.nan, "recall_at_5": 1.0}},
        {"query_id": "q", "error": None, "retrieved": [{"doc_id": None, "score": math.inf}]},
        {"query_id": "q", "error": None, "metrics": {"recall_at_5": None, "x": -math.inf}, "answer": None},
        {"query_id": "null", "error": None, "ttft_ms": math.nan},  # a null inside a string, one at the top
        {"query_id": "q", "error": math.nan},
    ],
)
def test_a_non_finite_float_beside_top_level_nulls_is_written_as_nan_not_null(rec: dict[str, Any]) -> None:
    """The writer counts orjson's nulls against the record's top-level None values: a NaN or an infinity
    anywhere (orjson would write null) sends the record to the json module, which writes NaN/Infinity."""
    line = dumps_line(rec)
    assert line == (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    assert b"NaN" in line or b"Infinity" in line


@pytest.mark.parametrize("n", [2**63 - 1, 2**63, -(2**63) - 1, 2**64, 10**30])
def test_an_integer_beyond_64_bits_reads_back_exact(tmp_path: Path, n: int) -> None:
    """orjson reads an integer that does not fit 64 bits as a float, without an error: a record
    holding one must still read back exact (hypothesis once drew -2**63 - 1 and got a float)."""
    path = tmp_path / RECORDS_FILE
    with RecordWriter(path) as w:
        w.write({"query_id": "q1", "n": n, "query": "1234567890123456789 digits in a string"})
    (back,) = read_records(path)
    assert back["n"] == n and type(back["n"]) is int


@settings(max_examples=60, deadline=None)
@given(
    recs=st.lists(
        st.fixed_dictionaries(
            {"query_id": st.text(min_size=1, max_size=5), "v": st.text(max_size=12), "n": st.integers()}
        ),
        min_size=1,
        max_size=6,
    ),
    cut=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_file_cut_anywhere_reads_as_the_records_written_before_the_cut(
    tmp_path_factory: pytest.TempPathFactory, recs: list[dict[str, Any]], cut: float
) -> None:
    path = tmp_path_factory.mktemp("cut") / RECORDS_FILE
    with RecordWriter(path) as w:
        for r in recs:
            w.write(r)
    data = path.read_bytes()
    at = int(cut * len(data))
    path.write_bytes(data[:at])
    # a record is read iff its line (without or with the newline) lies before the cut
    ends = []
    pos = 0
    for r in recs:
        pos += len(dumps_line(r))  # the line the writer appends
        ends.append(pos - 1)  # its closing brace ends one byte before the newline
    expected = [r for r, end in zip(recs, ends, strict=True) if end <= at]
    assert read_records(path) == expected
    # and a writer reopening the cut file appends whole lines after them
    with RecordWriter(path) as w:
        w.write({"query_id": "next"})
    assert read_records(path) == [*expected, {"query_id": "next"}]


# ---------------------------------------------------------------- the command line of resume=


def _fake_run(folder: Path, overrides: list[str]) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides), encoding="utf-8")
    return folder


def test_resume_of_a_run_folder_replays_its_overrides_into_the_same_folder(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run", ["chunk='256'", "retrieval=hybrid", "resume=/old"])
    argv = rewrite_argv([f"resume={run}", "progress=false", "chunk=256"])
    assert argv == [
        "chunk='256'",
        "retrieval=hybrid",
        f"hydra.run.dir='{run}'",
        f"resume='{run}'",
        "progress=false",
    ]


def test_resume_of_a_sweep_folder_is_a_multirun_in_that_folder(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / PLAN_FILE).write_text(json.dumps({"jobs": []}), encoding="utf-8")
    (sweep / SWEEP_FILE).write_text(json.dumps({"overrides": ["chunk='256','512'"]}), encoding="utf-8")
    argv = rewrite_argv(["-m", f"resume={sweep}"])
    assert argv == ["-m", "chunk='256','512'", f"hydra.sweep.dir='{sweep}'", f"resume='{sweep}'"]


def test_resume_refuses_an_override_that_changes_the_config(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run", ["chunk='256'"])
    with pytest.raises(
        ConfigError, match=r"chunk=512 changes the config of the run being resumed \(chunk='256'\)"
    ):
        rewrite_argv([f"resume={run}", "chunk=512"])
    with pytest.raises(ConfigError, match=r"retrieval=dense changes the config .*\(not set\)"):
        rewrite_argv([f"resume={run}", "retrieval=dense"])
    with pytest.raises(ConfigError, match="resumed in its own folder"):
        rewrite_argv([f"resume={run}", "hydra.run.dir=elsewhere"])


def test_resume_asks_again_for_the_secrets_that_were_not_stored(tmp_path: Path) -> None:
    # what .hydra/overrides.yaml holds of +system.headers.Authorization='Bearer KEY' and a URL password
    stored = ["system=http", "system.base_url=http://***@127.0.0.1:8000", "+system.headers.Authorization=***"]
    run = _fake_run(tmp_path / "run", stored)
    with pytest.raises(ConfigError, match=r"system.base_url=http://\*\*\*@127.0.0.1:8000 .* was not stored"):
        rewrite_argv([f"resume={run}"])  # never resumed with *** sent as the key
    given = ["system.base_url=http://u:KEY@127.0.0.1:8000", "+system.headers.Authorization='Bearer KEY'"]
    argv = rewrite_argv([f"resume={run}", *given])
    assert argv == ["system=http", *given, f"hydra.run.dir='{run}'", f"resume='{run}'"]
    with pytest.raises(ConfigError, match="changes the config"):  # another URL is another run
        rewrite_argv([f"resume={run}", "system.base_url=http://u:KEY@127.0.0.1:9000", given[1]])


def test_resume_takes_hydra_config_groups_as_runtime_settings(tmp_path: Path) -> None:
    # hydra/launcher says how to run, as hydra.job.chdir does (it was refused: the runtime check
    # matched hydra.* keys but not the group path hydra/...)
    run = _fake_run(tmp_path / "run", ["chunk='256'"])
    argv = rewrite_argv([f"resume={run}", "hydra/launcher=basic", "hydra.job.chdir=false"])
    assert argv == [
        "chunk='256'",
        f"hydra.run.dir='{run}'",
        f"resume='{run}'",
        "hydra/launcher=basic",
        "hydra.job.chdir=false",
    ]
    with pytest.raises(ConfigError, match=r"\+progress_bar=1 changes the config"):  # not progress
        rewrite_argv([f"resume={run}", "+progress_bar=1"])


def test_resume_of_a_folder_that_is_no_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        rewrite_argv([f"resume={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match="neither a run folder"):
        rewrite_argv([f"resume={tmp_path}"])


def test_resume_of_a_damaged_folder_names_the_file_in_one_line(tmp_path: Path) -> None:
    """A file of the folder cut short or edited (issue 23's fault injection: a traceback before)."""
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.run.resume import load_job, reopen_sweep

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / PLAN_FILE).write_text('{"jobs": [{"label": "base', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"plan\.json cannot be read \(Unterminated string"):
        reopen_sweep(sweep, None)
    (sweep / SWEEP_FILE).write_text("[1, 2", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"sweep\.json cannot be read"):
        rewrite_argv(["-m", f"resume={sweep}"])
    (sweep / PLAN_FILE).write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigError, match="the plan differs"):
        reopen_sweep(sweep, None)
    job = tmp_path / "job"
    job.mkdir()
    (job / RUN_FILE).write_text("{", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"run\.json cannot be read"):
        load_job(job, RunConfig())
    run = _fake_run(tmp_path / "run", ["chunk=256"])
    (run / ".hydra" / "overrides.yaml").write_text("- [unclosed", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"overrides\.yaml cannot be read"):
        rewrite_argv([f"resume={run}"])


def test_no_resume_leaves_the_command_line_alone() -> None:
    assert rewrite_argv(["-m", "chunk=256,512"]) == ["-m", "chunk=256,512"]
    assert rewrite_argv(["resume=null", "chunk=256"]) == ["chunk=256"]


# ---------------------------------------------------------------- kill and resume, end to end

DELAY = 0.35  # seconds the rerank server waits per query: slow enough to kill a run midway
N_QUERIES = 8


@pytest.fixture(scope="module")
def server() -> Iterator[RerankServer]:
    with RerankServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("resume")
    write_dataset(folder / "tiny")
    return folder


def _args(server: RerankServer) -> list[str]:
    return [
        "dataset=custom",
        "dataset.path=tiny",
        "rerank=http",
        f"rerank.url={server.url}",
        "progress=false",
        "compare.B=200",
    ]


@pytest.fixture(scope="module")
def reference(server: RerankServer, work: Path) -> dict[str, float]:
    """The metrics of an uninterrupted run of the config the kill tests use."""
    server.state.delay = 0.0
    # read from metrics.json only: no MLflow
    out = run_module("rag_ablate", [*_args(server), "paths.output_root=ref", "tracking=none"], work)
    assert out.returncode == 0, out.stderr
    (job,) = (work / "ref" / "runs").iterdir()
    metrics: dict[str, float] = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
    return metrics


def _quality(metrics: dict[str, float]) -> dict[str, float]:
    """Everything but timings (latency, time to first token, stage milliseconds) and run facts (wall time,
    cache hits), which differ from one run to the next whether or not it was interrupted."""
    return {
        k: v for k, v in metrics.items() if "latency" not in k and "_ms" not in k and not k.startswith("run/")
    }


def _same_where_logged(logged: dict[str, float], reference: dict[str, float]) -> bool:
    """MLflow gets the metrics the tables and the comparison use (and the comparison's deltas):
    each of them that the job computed equals the uninterrupted run's."""
    ref = _quality(reference)
    shared = {k for k in _quality(logged) if k in ref}
    assert "holdout/recall_at_5" in shared
    return {k: logged[k] for k in shared} == {k: ref[k] for k in shared}


def _start(args: list[str], cwd: Path, **env_extra: str) -> subprocess.Popen[str]:
    # PYTHONFAULTHANDLER: a process that does not end when told can be made to print every thread's
    # stack (SIGABRT, see _stopped), so a hang is diagnosed, not just timed out
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "PYTHONFAULTHANDLER": "1"}
    env.update(env_extra)
    return subprocess.Popen(
        [sys.executable, "-m", "rag_ablate", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stopped(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """``proc``'s stderr once it has ended; if it has not ended within ``timeout`` seconds, fail with
    the stacks of its threads (faulthandler prints them on SIGABRT) and what it wrote."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        _, err = proc.communicate(timeout=30)
        pytest.fail(
            f"the run did not end within {timeout} s of the signal; its stacks and stderr:\n{err[-8000:]}"
        )


def _wait_for_records(proc: subprocess.Popen[str], records: Any, at_least: int, timeout: float = 120) -> Path:
    """The records file ``records()`` finds, once it has ``at_least`` lines while ``proc`` still runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = records()
        if path is not None and path.is_file() and path.read_bytes().count(b"\n") >= at_least:
            return Path(path)
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before it could be stopped: {proc.stderr}")
        time.sleep(0.02)
    pytest.fail("the run wrote no records in time")


def _kill_when(proc: subprocess.Popen[str], records: Any, at_least: int, timeout: float = 120) -> Path:
    """SIGKILL ``proc`` once the records file ``records()`` finds has ``at_least`` lines."""
    try:
        path = _wait_for_records(proc, records, at_least, timeout)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        return path
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _only(folder: Path) -> Path | None:
    found = list(folder.glob("*")) if folder.is_dir() else []
    return found[0] if len(found) == 1 else None


@pytest.mark.slow
def test_kill_mid_run_then_resume_equals_the_uninterrupted_run(
    server: RerankServer, work: Path, reference: dict[str, float]
) -> None:
    server.state.delay = DELAY
    root = work / "single"
    proc = _start([*_args(server), "paths.output_root=single"], work)
    records = _kill_when(proc, lambda: (j / RECORDS_FILE) if (j := _only(root / "runs")) else None, 3)
    job = records.parent
    done_before = records.read_bytes().count(b"\n")
    assert 3 <= done_before < N_QUERIES  # killed midway
    run_id = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    uri = f"sqlite:///{(root / 'mlflow.db').resolve()}"
    # created at the start by the background writer (unless it was killed before it had), never finished
    assert _run_row(root / "mlflow.db", run_id) in (None, "RUNNING")
    client = MlflowClient(tracking_uri=uri)
    with records.open("a", encoding="utf-8") as f:
        f.write('{"query_id": "q8", "query": "where is ord')  # as if killed mid-write

    had = {r["query_id"]: r for r in read_records(records)}  # the torn line is not read as data
    assert len(had) == done_before
    server.state.delay = 0.0  # slow only until the kill: the resume need not wait
    requests_before = server.state.requests
    out = run_module("rag_ablate", [f"resume={job}"], work)
    assert out.returncode == 0, out.stderr
    assert "resuming run" in out.stderr

    # only the queries without a record ran again: the kept records are the very same traces, scored
    # now (the appended ones were not yet: a run scores every record once its queries are done)
    final = read_records(records)
    assert sorted(r["query_id"] for r in final) == [f"q{i}" for i in range(1, N_QUERIES + 1)]
    assert all(r["status"] == "ok" for r in final)
    assert all(r["metrics"] == {} and r["failure_stage"] is None for r in had.values())
    unscored = [{**r, "metrics": {}, "failure_stage": None} for r in final if r["query_id"] in had]
    assert unscored == list(had.values())
    assert all("latency_ms" in r["metrics"] for r in final)
    assert any("recall_at_5" in r["metrics"] for r in final if r["query_id"] in had)
    # the missing queries, and the warm-up's one untimed call before them (systems/local.py)
    assert 0 < server.state.requests - requests_before <= N_QUERIES - done_before + 1

    metrics = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
    assert _quality(metrics) == _quality(reference)
    assert json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert _same_where_logged(run.data.metrics, reference)
    assert len(client.search_runs([run.info.experiment_id])) == 1  # no second run

    # resuming a finished run with every query ok does nothing
    again = run_module("rag_ablate", [f"resume={job}"], work)
    assert again.returncode == 0, again.stderr
    assert "nothing to resume" in again.stdout
    # and a factor that differs is refused, naming it
    bad = run_module("rag_ablate", [f"resume={job}", "chunk=256"], work)
    assert bad.returncode == 2
    assert "chunk=256 changes the config of the run being resumed" in bad.stderr


def _run_row(db: Path, run_id: str) -> str | None:
    """The status of ``run_id`` in the sqlite store ``db`` (None: no such run, or no store), read
    without MLflow (which would create the store)."""
    import sqlite3

    if not db.is_file():
        return None
    with contextlib.closing(sqlite3.connect(db)) as con:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone():
            return None
        row = con.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


@pytest.mark.slow
def test_kill_before_the_run_exists_then_resume_creates_it_under_its_id(work: Path) -> None:
    """The job does not wait for the background writer to create its MLflow run: SIGKILL of the
    process group (the writer with it) as soon as run.json names the run, while the writer is still
    importing MLflow, leaves no run in MLflow; resume= creates it under the id run.json names and
    completes it: one complete run. The writer is the command's own child (RAG_ABLATE_WRITER_IDLE=0),
    which the kill ends with it: a resident writer, MLflow already imported, would have made the run
    by then, and a killed command's resident child still does what it was handed."""
    root = work / "killed_early"
    args = ["dataset=custom", "dataset.path=tiny", "progress=false", "paths.output_root=killed_early"]
    proc = _start(args, work, RAG_ABLATE_WRITER_IDLE="0")
    run_file = _kill_when(proc, lambda: (j / RUN_FILE) if (j := _only(root / "runs")) else None, 0)
    run_id = json.loads(run_file.read_text(encoding="utf-8"))["run_id"]
    assert run_id and _run_row(root / "mlflow.db", run_id) is None  # killed before the writer made it

    out = run_module("rag_ablate", [f"resume={run_file.parent}"], work)
    assert out.returncode == 0, out.stderr
    assert json.loads(run_file.read_text(encoding="utf-8"))["run_id"] == run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{(root / 'mlflow.db').resolve()}")
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert "holdout/recall_at_5" in run.data.metrics and "retrieval.top_k" in run.data.params
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]


@pytest.mark.slow
def test_resume_reruns_failed_queries_and_keeps_one_record_each(
    server: RerankServer, work: Path, reference: dict[str, float]
) -> None:
    server.state.delay = 0.0
    server.state.reject_status = 400  # every rerank call fails: those queries are failed records
    try:
        out = run_module("rag_ablate", [*_args(server), "paths.output_root=failing"], work)
    finally:
        server.state.reject_status = None
    # over the default error budget: written and logged, marked FAILED, exit 1
    assert out.returncode == 1 and "> system.max_error_rate=0.05" in out.stderr, out.stderr
    (job,) = (work / "failing" / "runs").iterdir()
    first = read_records(job / RECORDS_FILE)
    failed = {r["query_id"] for r in first if r["status"] != "ok"}
    assert failed and len(failed) < N_QUERIES  # q6 (chit-chat) needs no rerank and is ok

    before = server.state.requests
    out = run_module("rag_ablate", [f"resume={job}"], work)
    assert out.returncode == 0, out.stderr
    # only the failed queries ran again, after the warm-up's one untimed call (systems/local.py)
    assert server.state.requests - before == len(failed) + 1
    final = read_records(job / RECORDS_FILE)
    assert [r["query_id"] for r in final] == [r["query_id"] for r in first]  # one each, dataset order
    assert all(r["status"] == "ok" for r in final)
    assert _quality(json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))) == _quality(reference)


@pytest.mark.slow
def test_kill_a_sweep_then_resume_finishes_it_in_the_same_folder_and_runs(
    server: RerankServer, work: Path, reference: dict[str, float]
) -> None:
    server.state.delay = DELAY
    root = work / "sweep"
    args = [
        "-m",
        *[a for a in _args(server) if a != "rerank=http"],
        "rerank=none,http",
        "paths.output_root=sweep",
    ]
    proc = _start(args, work)

    def variant_records() -> Path | None:
        s = _only(root / "multirun")
        return None if s is None else s / "1" / RECORDS_FILE

    records = _kill_when(proc, variant_records, 2)
    sweep = records.parent.parent
    info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
    child = json.loads((records.parent / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    client = MlflowClient(tracking_uri=info["tracking_uri"])
    assert client.get_run(info["parent_run_id"]).info.status == "RUNNING"
    assert client.get_run(child).info.status == "RUNNING"

    # the next time rag_ablate opens that store, the runs whose process is gone are marked
    from rag_ablate.tracking import store as tracking

    experiment = client.get_run(child).info.experiment_id
    orphans = tracking.mark_orphans(info["tracking_uri"], experiment)
    assert sorted(orphans) == sorted([info["parent_run_id"], child])
    for run_id in orphans:
        run = client.get_run(run_id)
        assert run.info.status == "KILLED"
        assert "ended without finishing it" in run.data.tags[tracking.ORPHAN_TAG]

    server.state.delay = 0.0  # slow only until the kill: the resume (and its timing pass) need not wait
    out = run_module("rag_ablate", [f"resume={sweep}"], work)
    assert out.returncode == 0, out.stderr
    assert "baseline: finished earlier with every query ok" in out.stdout
    assert (sweep / "comparison.json").is_file()
    assert json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8")) == info  # same sweep, same parent
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FINISHED"
    children = f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    runs = client.search_runs([parent.info.experiment_id], children)
    assert sorted(r.data.tags["variant"] for r in runs) == ["baseline", "rerank=http"]
    assert all(r.info.status == "FINISHED" for r in runs)
    resumed = next(r for r in runs if r.data.tags["variant"] == "rerank=http")
    assert resumed.info.run_id == child
    assert _same_where_logged(resumed.data.metrics, reference)
    job_metrics = json.loads((records.parent / METRICS_FILE).read_text(encoding="utf-8"))
    assert _quality(job_metrics) == _quality(reference)
    final = read_records(records)
    assert len(final) == len({r["query_id"] for r in final}) == N_QUERIES


@pytest.mark.slow
def test_ctrl_c_ends_a_single_run_with_one_line_and_a_killed_run(server: RerankServer, work: Path) -> None:
    server.state.delay = DELAY
    root = work / "interrupted_run"
    proc = _start([*_args(server), "paths.output_root=interrupted_run"], work)

    def run_records() -> Path | None:
        job = _only(root / "runs")
        return None if job is None else job / RECORDS_FILE

    job = _wait_for_records(proc, run_records, 2).parent
    os.killpg(proc.pid, signal.SIGINT)
    err = _stopped(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    prefix = "rag_ablate: interrupted (Ctrl-C); the MLflow run is marked KILLED; resume with: "
    assert last.startswith(prefix + "python -m rag_ablate resume=")
    assert Path(last.split("resume=")[-1]).resolve() == job.resolve()
    run = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))
    assert MlflowClient(tracking_uri=run["tracking_uri"]).get_run(run["run_id"]).info.status == "KILLED"


@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_with_one_line_and_killed_runs_then_resume_finishes_it(
    server: RerankServer, work: Path
) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) mid-sweep: no traceback, one line naming the
    resume command, exit 130, no run left RUNNING; resume= completes the sweep."""
    server.state.delay = DELAY
    root = work / "interrupted"
    args = ["-m", *[a for a in _args(server) if a != "rerank=http"], "rerank=none,http"]
    proc = _start([*args, "paths.output_root=interrupted"], work)

    def variant_records() -> Path | None:
        s = _only(root / "multirun")
        return None if s is None else s / "1" / RECORDS_FILE

    path = _wait_for_records(proc, variant_records, 2)
    os.killpg(proc.pid, signal.SIGINT)
    err = _stopped(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    sweep = path.parent.parent
    # the parent and the running variant's run (ended by the job itself before the count): 2, not 1
    assert last.startswith("rag_ablate: interrupted: 1 of 2 job(s) finished; 2 MLflow run(s) marked KILLED;")
    assert last.endswith(f"resume with: python -m rag_ablate resume={sweep.relative_to(work)}")
    info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
    client = MlflowClient(tracking_uri=info["tracking_uri"])
    parent = client.get_run(info["parent_run_id"])
    runs = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    child = json.loads((path.parent / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    statuses = {r.info.run_id: r.info.status for r in runs}
    assert parent.info.status == "KILLED"
    assert statuses.pop(child) == "KILLED"  # the variant that was running
    assert list(statuses.values()) == ["FINISHED"]  # the baseline had finished
    failures = json.loads((sweep / "failures.json").read_text(encoding="utf-8"))
    assert failures["failed"] and failures["failures"][0]["step"] == "interrupted"

    server.state.delay = 0.0  # slow only until the signal: the resume (and its timing pass) need not wait
    out = run_module("rag_ablate", [f"resume={sweep}"], work)
    assert out.returncode == 0, out.stderr
    assert client.get_run(info["parent_run_id"]).info.status == "FINISHED"
    runs = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert len(read_records(path)) == N_QUERIES


@pytest.fixture(scope="module")
def slow_service(work: Path) -> Iterator[str]:
    """The reference service (``rag-ablate serve``'s app) streaming each answer slowly."""
    from rag_ablate.cli.serve import ReferenceService, create_app
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.systems.local import LocalSystem
    from tests.test_http_system import uvicorn_app

    settings = RunConfig(progress=False)
    ds = load_dataset(work / "tiny")
    system = LocalSystem(settings)
    system.prepare(ds)
    service = ReferenceService(system, ds, settings, "baseline")
    # ~40 pieces of 3 characters, 25 ms apart: about a second per answer
    with uvicorn_app(create_app(service, piece_chars=3, piece_delay_s=0.025)) as url:
        yield url


@pytest.mark.slow
def test_kill_an_http_run_with_queries_in_flight_then_resume(slow_service: str, work: Path) -> None:
    """system=http runs queries concurrently and hands each record on as it completes: a kill
    leaves whole records in completion order; resume finishes them in dataset order."""
    args = [
        "dataset=custom",
        "dataset.path=tiny",
        "system=http",
        f"system.base_url={slow_service}",
        "system.concurrency=2",
        "progress=false",
    ]
    ref = run_module("rag_ablate", [*args, "paths.output_root=http_ref", "tracking=none"], work)
    assert ref.returncode == 0, ref.stderr
    (ref_job,) = (work / "http_ref" / "runs").iterdir()
    reference = json.loads((ref_job / METRICS_FILE).read_text(encoding="utf-8"))

    root = work / "http_killed"
    proc = _start([*args, "paths.output_root=http_killed"], work)
    records = _kill_when(proc, lambda: (j / RECORDS_FILE) if (j := _only(root / "runs")) else None, 3)
    assert 3 <= len(read_records(records)) < N_QUERIES
    job = records.parent
    run_id = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"]

    out = run_module("rag_ablate", [f"resume={job}"], work)
    assert out.returncode == 0, out.stderr
    final = read_records(records)
    assert [r["query_id"] for r in final] == [f"q{i}" for i in range(1, N_QUERIES + 1)]  # dataset order
    assert all(r["status"] == "ok" and r["answer"] for r in final)
    assert _quality(json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))) == _quality(reference)
    run = MlflowClient(tracking_uri=f"sqlite:///{(root / 'mlflow.db').resolve()}").get_run(run_id)
    assert run.info.status == "FINISHED"
    assert _same_where_logged(run.data.metrics, reference)


@pytest.mark.slow
def test_owner_of_a_run_is_gone_only_when_its_process_on_this_host_ended() -> None:
    import socket

    from rag_ablate.tracking import store as tracking

    me = tracking.owner_tag()
    assert not tracking.owner_gone(me)  # this process is alive
    host, pid, start = me.split(":")
    assert host == socket.gethostname() and int(pid) == os.getpid() and start
    assert tracking.owner_gone(f"{host}:{pid}:{int(start) + 1}")  # the pid was reused by a later process
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert tracking.owner_gone(f"{host}:{dead.pid}:")  # no start time recorded: pid liveness alone
    assert not tracking.owner_gone(f"another-host:{dead.pid}:1")  # cannot be checked from here: left alone
    assert not tracking.owner_gone("garbage")
