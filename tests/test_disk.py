"""A full disk and a read-only folder: every file whole or absent, one line, the runs marked.

* the atomic writer (:mod:`rag_ablate.core.fsio`): a write that fails leaves the old file as it
  was and no temporary file, and raises WriteError naming the path and the error;
* a real tmpfs (as root; skipped otherwise) filled when a sweep's comparison starts: one line, no
  traceback, ``failures.json`` complete or absent, ``comparison.md`` never cut, exit 1, the parent
  run FAILED, and ``resume=`` finishes the sweep once there is room; the same for a single run
  whose disk fills after its queries ran (its MLflow run FAILED, then FINISHED by ``resume=``);
* a read-only outputs folder (a tmpfs remounted read-only: root ignores permission bits) for a
  single run, a sweep, ``rag-ablate compare``, ``rag-ablate report`` and ``resume=``: one line
  naming the path, exit 1 (2 when nothing ran), no traceback, nothing created.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core import fsio
from rag_ablate.core.errors import EXIT_FAILED, EXIT_INVALID, WriteError, exit_code_of
from rag_ablate.core.layout import COMPARISON_JSON, COMPARISON_MD, FAILURES_FILE, SWEEP_FILE
from tests.conftest import rag_ablate_cli, run_in_process

# --------------------------------------------------------------------------- the atomic writer


def _no_space(*_args: Any, **_kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("where", ["os.replace", "os.fsync"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    target = tmp_path / "comparison.md"
    target.write_text("the old comparison\n", encoding="utf-8")
    monkeypatch.setattr(fsio.os, where.split(".")[1], _no_space)
    with pytest.raises(WriteError) as caught:
        fsio.write_text_atomic(target, "the new comparison, much longer than the old one\n" * 1000)
    assert target.read_text(encoding="utf-8") == "the old comparison\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comparison.md"]
    err = caught.value
    assert str(err) == f"cannot write {target}: No space left on device (ENOSPC)"
    assert err.path == str(target) and err.errno == errno.ENOSPC
    assert exit_code_of(err) == EXIT_FAILED


def test_a_write_replaces_the_whole_file_and_a_folder_that_cannot_be_made_names_it(tmp_path: Path) -> None:
    target = tmp_path / "new" / "plan.json"
    fsio.write_json_atomic(target, {"jobs": ["中文"]})
    assert json.loads(target.read_text(encoding="utf-8")) == {"jobs": ["中文"]}
    assert sorted(p.name for p in target.parent.iterdir()) == ["plan.json"]
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(WriteError, match=r"cannot write .*file/sub: Not a directory \(ENOTDIR\)"):
        fsio.write_text_atomic(blocker / "sub" / "x.json", "{}")
    with pytest.raises(WriteError) as caught:
        fsio.check_writable(blocker / "sub")
    assert exit_code_of(caught.value) == EXIT_INVALID  # nothing ran


def test_a_record_that_cannot_be_appended_is_a_write_error_and_the_file_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_ablate.records import jsonl

    path = tmp_path / "records.jsonl"
    writer = jsonl.RecordWriter(path, fsync_every=0.0)
    writer.write({"query_id": "q1", "status": "ok"})
    monkeypatch.setattr(jsonl.os, "fsync", _no_space)
    with pytest.raises(WriteError, match=r"records.jsonl: No space left on device \(ENOSPC\)"):
        writer.write({"query_id": "q2", "status": "ok"})
    with pytest.raises(WriteError):
        writer.close()
    assert writer._f.closed and writer.written == 1
    assert next(r["query_id"] for r in jsonl.read_records(path)) == "q1"


def test_a_short_write_is_followed_by_the_rest_of_the_line(tmp_path: Path) -> None:
    """The writer is unbuffered: a write call that takes only part of a line (a nearly full disk) is
    followed by another for the rest, so the line arrives whole."""
    from rag_ablate.records import jsonl

    path = tmp_path / "records.jsonl"
    writer = jsonl.RecordWriter(path)
    raw = writer._f
    calls: list[int] = []

    class Short:  # takes at most 100 bytes a call
        def write(self, data: bytes) -> int:
            calls.append(len(data))
            return raw.write(bytes(data[:100]))

        def __getattr__(self, name: str) -> object:
            return getattr(raw, name)

    writer._f = Short()  # type: ignore[assignment]
    rec = {"query_id": "q1", "status": "ok", "text": "中文" * 200}
    writer.write(rec)
    writer._f = raw
    writer.close()
    assert len(calls) > 5 and jsonl.read_records(path) == [rec]


# --------------------------------------------------------------------------- real file systems


def _mount_tmpfs(folder: Path, size: str, request: pytest.FixtureRequest) -> Path:
    """A tmpfs of ``size`` at ``folder``, unmounted when the test ends; skips without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (a full disk and a read-only mount are simulated so)")
    folder.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(folder)], check=False))
    return folder


def _remount(folder: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(folder)], check=True)


def _fill(folder: Path) -> Path:
    """Write into ``folder`` until its file system is full; the filler file."""
    filler = folder / "filler.bin"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def _one_error_line(stderr: str, *phrases: str) -> str:
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith(("rag_ablate: error:", "rag-ablate: error:"))]
    assert len(lines) == 1, stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def _no_temporary_files(folder: Path) -> None:
    assert [p for p in folder.rglob("*.tmp")] == []


def _sweep_args(dataset: Path, root: Path, db: Path) -> list[str]:
    return [
        "-m",
        "chunk=256,512",
        f"dataset.path={dataset}",
        f"paths.output_root={root}",
        f"tracking.uri=sqlite:///{db}",
        f"cache.dir={db.parent / 'cache'}",
        "progress=false",
        "compare.B=200",
        "timing.interleave=false",
    ]


def _only_sweep(root: Path) -> Path:
    sweeps = list((root / "multirun").iterdir())
    assert len(sweeps) == 1
    return sweeps[0]


def _parent_status(sweep: Path) -> str:
    from rag_ablate.tracking.store import run_status

    info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
    return run_status(info["tracking_uri"], info["parent_run_id"])


def _no_runs(db: Path) -> bool:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    return not any(client.search_runs([e.experiment_id]) for e in client.search_experiments())


@pytest.mark.slow
def test_a_disk_that_fills_at_the_end_of_a_sweep_stops_it_in_one_line_and_resume_finishes_it(
    tiny_dataset: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _mount_tmpfs(tmp_path / "disk", "8m", request)
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    from rag_ablate.sweep import driver

    real: Callable[..., Any] = driver.run_comparison
    filled: list[Path] = []

    def fill_then_compare(*args: Any, **kwargs: Any) -> Any:  # the jobs are done: the disk fills now
        filled.append(_fill(disk))
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "run_comparison", fill_then_compare)
    out = run_in_process(_sweep_args(tiny_dataset, disk / "outputs", db), tmp_path)
    assert filled, out.stderr
    assert out.returncode == EXIT_FAILED, out.stderr
    sweep = _only_sweep(disk / "outputs")
    line = _one_error_line(out.stderr, "cannot write", str(sweep), "No space left on device (ENOSPC)")
    assert f"resume={sweep}" in line
    _no_temporary_files(disk)
    failures = sweep / FAILURES_FILE
    if failures.exists():  # complete or absent
        assert json.loads(failures.read_text(encoding="utf-8"))["failed"] is True
    for name in (COMPARISON_JSON, COMPARISON_MD):  # whole or absent, never cut
        assert not (sweep / name).exists() or (sweep / name).stat().st_size > 0
    assert _parent_status(sweep) == "FAILED"

    monkeypatch.setattr(driver, "run_comparison", real)
    filled[0].unlink()  # room again: resume= finishes the sweep
    again = run_in_process([f"resume={sweep}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((sweep / FAILURES_FILE).read_text(encoding="utf-8"))["failed"] is False
    comparison = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))
    assert comparison["baseline"] and (sweep / COMPARISON_MD).read_text(encoding="utf-8").endswith("\n")
    assert _parent_status(sweep) == "FINISHED"


@pytest.mark.slow
def test_a_disk_that_fills_during_a_single_run_fails_it_in_one_line_and_resume_finishes_it(
    tiny_dataset: Path, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _mount_tmpfs(tmp_path / "disk", "8m", request)
    db = tmp_path / "mlflow.db"
    from rag_ablate.run import runner

    real: Callable[..., Any] = runner._score_run
    filled: list[Path] = []

    def fill_then_score(*args: Any, **kwargs: Any) -> Any:  # every query ran: the disk fills now
        filled.append(_fill(disk))
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "_score_run", fill_then_score)
    args = [f"dataset.path={tiny_dataset}", f"paths.output_root={disk / 'outputs'}", "progress=false"]
    args += [f"tracking.uri=sqlite:///{db}", f"cache.dir={tmp_path / 'cache'}"]
    out = run_in_process(args, tmp_path)
    assert filled and out.returncode == EXIT_FAILED, out.stderr
    run_dir = next((disk / "outputs" / "runs").iterdir())
    _one_error_line(out.stderr, f"cannot write {run_dir}", "No space left on device (ENOSPC)")
    _no_temporary_files(disk)
    from rag_ablate.tracking.store import run_status

    run_info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert run_status(run_info["tracking_uri"], run_info["run_id"]) == "FAILED"

    monkeypatch.setattr(runner, "_score_run", real)
    filled[0].unlink()
    again = run_in_process([f"resume={run_dir}"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert run_status(run_info["tracking_uri"], run_info["run_id"]) == "FINISHED"
    assert json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))


@pytest.fixture
def read_only_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs, writable until the test calls ``_remount(disk, "ro")``."""
    yield _mount_tmpfs(tmp_path / "disk", "64m", request)


def test_a_single_run_into_a_read_only_outputs_folder_stops_before_anything_runs(
    tiny_dataset: Path, tmp_path: Path, read_only_disk: Path
) -> None:
    _remount(read_only_disk, "ro")
    db = tmp_path / "mlflow.db"
    args = [f"dataset.path={tiny_dataset}", f"paths.output_root={read_only_disk / 'outputs'}"]
    out = run_in_process([*args, f"tracking.uri=sqlite:///{db}", "progress=false"], tmp_path)
    assert out.returncode == EXIT_INVALID, out.stderr
    _one_error_line(out.stderr, f"cannot write {read_only_disk / 'outputs' / 'runs'}", "(EROFS)")
    assert not db.exists()  # no MLflow run either


def test_a_sweep_into_a_read_only_outputs_folder_stops_before_anything_runs(
    tiny_dataset: Path, tmp_path: Path, read_only_disk: Path
) -> None:
    _remount(read_only_disk, "ro")
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    out = run_in_process(_sweep_args(tiny_dataset, read_only_disk / "outputs", db), tmp_path)
    assert out.returncode == EXIT_INVALID, out.stderr
    # the MLflow store's artifact folder, under outputs/, is the first thing the sweep would create
    _one_error_line(out.stderr, str(read_only_disk / "outputs"), "Read-only file system")
    assert not db.exists() or _no_runs(db)


@pytest.mark.slow
def test_compare_report_and_resume_in_a_read_only_folder_say_which_path_in_one_line(
    tiny_dataset: Path, tmp_path: Path, read_only_disk: Path
) -> None:
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    root = read_only_disk / "outputs"
    swept = run_in_process(_sweep_args(tiny_dataset, root, db), tmp_path)
    assert swept.returncode == 0, swept.stderr
    sweep = _only_sweep(root)
    run = [f"dataset.path={tiny_dataset}", f"paths.output_root={root}", "tracking=none", "progress=false"]
    single = run_in_process(run, tmp_path)
    assert single.returncode == 0, single.stderr
    run_dir = next((root / "runs").iterdir())
    before = (sweep / COMPARISON_MD).read_text(encoding="utf-8")
    _remount(read_only_disk, "ro")

    compared = rag_ablate_cli(["compare", str(sweep), "--B", "200"], tmp_path)
    assert compared.returncode == EXIT_FAILED, compared.stderr
    _one_error_line(compared.stderr, f"cannot write {sweep}", "(EROFS)")
    reported = rag_ablate_cli(["report", str(sweep)], tmp_path)
    assert reported.returncode == EXIT_FAILED, reported.stderr
    _one_error_line(reported.stderr, f"cannot write {sweep}", "(EROFS)")

    resumed = run_in_process([f"resume={sweep}"], tmp_path)
    assert resumed.returncode == EXIT_FAILED, resumed.stderr
    _one_error_line(resumed.stderr, f"cannot write {sweep}", "(EROFS)", f"resume={sweep}")
    assert _parent_status(sweep) == "FAILED"
    resumed_run = run_in_process([f"resume={run_dir}"], tmp_path)
    assert resumed_run.returncode == EXIT_INVALID, resumed_run.stderr
    _one_error_line(resumed_run.stderr, f"cannot write {run_dir}", "(EROFS)")
    assert (sweep / COMPARISON_MD).read_text(encoding="utf-8") == before
