"""The resident MLflow writer (rag_ablate.tracking.resident): real processes on a real Unix socket."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.layout import PROFILE_FILE, RUN_FILE
from rag_ablate.tracking import background, resident, store
from tests.conftest import child_pids, run_module, write_dataset

# `store` is imported before any test connects: importing it sets MLFLOW_DISABLE_TELEMETRY, one of
# the variables that name a resident writer (a command imports it after it has connected)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private folder of resident writers of this test alone (short: a socket's path has a limit),
    whose writers are stopped afterwards."""
    d = Path(tempfile.mkdtemp(prefix="rar-"))
    monkeypatch.setenv(resident.DIR_ENV, str(d))
    try:
        yield d
    finally:
        resident.stop_all()
        shutil.rmtree(d, ignore_errors=True)


def _wait(cond: Callable[[], Any], timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if out := cond():
            return out
        time.sleep(0.05)
    raise AssertionError(f"not so within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _call(w: background.Writer, fn: Callable[..., Any], *args: Any) -> Any:
    return w.submit(getattr(fn, "__name__", "call"), "log", fn, args, {}).result()


def test_commands_are_served_by_one_resident_writer_each_by_its_own_child_as_itself(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first command starts the resident writer, the second finds it; each is served by a
    child of it that works in the command's folder, with its environment, for the command's
    process as the runs' owner, and that ends when the command lets it go."""
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    monkeypatch.chdir(first_dir)
    monkeypatch.setenv("RAG_ABLATE_TEST_MARK", "first")
    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY")  # a command connects before it imports the store
    sock, started = resident.connect(60)
    assert started
    w1 = background.Writer(sock)
    assert _call(w1, os.getcwd) == str(first_dir)
    assert _call(w1, os.getenv, "RAG_ABLATE_TEST_MARK") == "first"
    # the command's environment, with rag_ablate's MLflow defaults (telemetry off) put back, as the
    # command's own process has them once it imports the store (after it has connected)
    assert "MLFLOW_DISABLE_TELEMETRY" not in os.environ
    assert _call(w1, os.getenv, "MLFLOW_DISABLE_TELEMETRY") == "true"
    ((zygote, path),) = resident.running()
    assert path.parent == runtime and path.exists()
    child1 = _call(w1, os.getpid)
    assert _call(w1, os.getppid) == zygote and child1 != zygote
    assert _call(w1, store.owner_tag).split(":")[1] == str(os.getpid())  # the command owns its runs

    monkeypatch.chdir(second_dir)
    monkeypatch.setenv("RAG_ABLATE_TEST_MARK", "second")
    mask = os.umask(0o027)  # a command of a stricter mask: the files its writer makes have it
    try:
        sock2, started2 = resident.connect(60)
        w2 = background.Writer(sock2)
    finally:
        os.umask(mask)
    _call(w2, os.mkdir, str(second_dir / "made"))
    assert (second_dir / "made").stat().st_mode & 0o777 == 0o750
    assert not started2
    assert _call(w2, os.getcwd) == str(second_dir)
    assert _call(w2, os.getenv, "RAG_ABLATE_TEST_MARK") == "second"
    child2 = _call(w2, os.getpid)
    assert child2 not in (child1, zygote) and _call(w2, os.getppid) == zygote
    assert resident.running() == [(zygote, path)]

    broken = w2.submit("dividing by zero", "log", divmod, (1, 0), {})
    assert broken.value_or_none() is None and "ZeroDivisionError" in str(broken._error)
    for w, child in ((w1, child1), (w2, child2)):
        w.close(wait=True)
        _wait(lambda c=child: not _alive(c))  # type: ignore[misc]
    assert _alive(zygote) and child_pids(zygote) == []
    assert set(w1.times) == {"store", "log"}  # the wait for it to be ready is counted as store


def test_a_command_that_lets_an_unused_writer_go_does_not_wait_for_it(runtime: Path) -> None:
    """A command that stops before using its writer (a bad override) does not wait for a resident
    writer still importing MLflow: it closes its connection and is done; the writer's child for it
    ends without doing anything."""
    sock, started = resident.connect(60)
    assert started
    w = background.Writer(sock)
    t0 = time.monotonic()
    w.close(wait=False)
    assert time.monotonic() - t0 < 1.0  # the writer needs about 1.3 s to import MLflow
    ((zygote, _),) = _wait(resident.running)
    _wait(lambda: child_pids(zygote) == [] and w.times.get("store") is None)


def test_an_idle_resident_writer_ends_and_removes_its_socket(runtime: Path) -> None:
    sock, _ = resident.connect(1.0)
    w = background.Writer(sock)
    assert _call(w, sum, [1, 2]) == 3
    w.close(wait=True)
    ((zygote, path),) = resident.running()
    _wait(lambda: not _alive(zygote))
    assert not path.exists() and not path.with_suffix(".pid").exists()
    assert resident.running() == []
    sock, started = resident.connect(60)  # the next command starts a new one
    assert started
    background.Writer(sock).close(wait=True)


def test_a_socket_no_process_answers_is_replaced(runtime: Path) -> None:
    """The resident writer was killed (SIGKILL, a reboot of a folder that survives): its socket
    file is there and refuses connections; the next command replaces it with a new writer."""
    path = resident.socket_path(runtime, resident.code_key())
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nothing listens
    assert path.exists()
    sock, started = resident.connect(60)
    assert started
    w = background.Writer(sock)
    assert _call(w, os.getppid) == resident.running()[0][0]
    w.close(wait=True)


def test_a_resident_writer_that_ends_before_serving_the_command_fails_its_calls_naming_why(
    runtime: Path,
) -> None:
    """A resident writer that could not start (it died before accepting the command): the calls
    handed over fail, and the failure says so, where the writer's own errors are, and how to do
    without it; nothing is silently dropped."""
    path = resident.socket_path(runtime, "broken")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))
    w = background.Writer(client, log=str(resident.log_path(client)))
    p = w.submit("creating the run", "store", sum, ([1, 2],), {})
    listener.close()  # the writer's process is gone: the connection waiting for it is refused
    assert p.value_or_none() is None
    assert str(p._error).startswith("the resident MLflow writer ended before it served this command")
    assert str(runtime / "writer-broken.log") in str(p._error)
    assert "RAG_ABLATE_WRITER_IDLE=0" in str(p._error)
    w.close(wait=True)


def test_stop_ends_the_writers_and_never_a_process_that_is_not_one(runtime: Path) -> None:
    sock, _ = resident.connect(60)
    background.Writer(sock).close(wait=True)
    ((zygote, path),) = resident.running()
    # a pid file of a writer killed long ago whose number now belongs to another process (this one)
    stale = runtime / "writer-0000.pid"
    stale.write_text(f"{os.getpid()}\n", encoding="utf-8")
    assert resident.stop_all() == [zygote]
    _wait(lambda: not _alive(zygote))
    assert not path.exists() and not stale.exists()


@pytest.mark.parametrize("unsafe", ["others can write", "a link", "another owner"])
def test_no_resident_writer_in_a_folder_that_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unsafe: str
) -> None:
    """Anyone who can reach the socket could hand the writer a call to run: a folder that others
    can enter, a link (to someone else's folder) or a folder of another user is not used, and the
    command forks a writer of its own instead."""
    d = Path(tempfile.mkdtemp(prefix="rar-", dir=tmp_path))
    if unsafe == "others can write":
        d.chmod(0o777)
    elif unsafe == "a link":
        link = tmp_path / "l"
        link.symlink_to(d)
        d = link
    else:
        if os.getuid() != 0:
            pytest.skip("changing a folder's owner needs root")
        os.chown(d, 65534, 65534)
    monkeypatch.setenv(resident.DIR_ENV, str(d))
    assert resident.runtime_dir() is None
    with pytest.raises(OSError, match="no private folder"):
        resident.connect(60)
    assert background._resident_writer() is None
    assert not list(Path(d).glob("writer-*"))


def test_a_folder_too_deep_for_a_socket_means_a_writer_of_the_commands_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / ("deep" * 30)
    d.mkdir(mode=0o700)
    monkeypatch.setenv(resident.DIR_ENV, str(d))
    assert resident.runtime_dir() == d
    with pytest.raises(OSError):
        resident.connect(60)
    assert background._resident_writer() is None


def test_the_socket_name_follows_the_code_and_the_mlflow_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Edited code, another MLflow setting or another PYTHONPATH: another resident writer (one that
    imported other code, or MLflow under other settings, would do the calls differently)."""
    import rag_ablate

    pkg = tmp_path / "rag_ablate"
    (pkg / "tracking").mkdir(parents=True)
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "tracking" / "store.py").write_text("X = 1\n", encoding="utf-8")
    monkeypatch.setattr(rag_ablate, "__file__", str(pkg / "__init__.py"))
    keys = [resident.code_key()]
    assert resident.code_key() == keys[0]
    (pkg / "tracking" / "store.py").write_text("X = 22\n", encoding="utf-8")
    keys.append(resident.code_key())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    keys.append(resident.code_key())
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    keys.append(resident.code_key())
    monkeypatch.setenv("RAG_ABLATE_TEST_MARK", "a variable the writer's child takes from the command")
    keys.append(resident.code_key())
    assert len(set(keys)) == 4 and keys[-1] == keys[-2]


def test_writer_status_and_stop_on_the_command_line(
    runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rag_ablate.cli.main import main

    sock, _ = resident.connect(60)
    background.Writer(sock).close(wait=True)
    ((zygote, path),) = resident.running()
    assert main(["writer", "status"]) == 0
    out = capsys.readouterr().out
    assert f"1 resident MLflow writer(s) in {runtime}:" in out and f"pid {zygote}  {path}" in out
    assert main(["writer", "stop"]) == 0
    assert capsys.readouterr().out == f"stopped 1 resident MLflow writer(s), pid {zygote}\n"
    _wait(lambda: not _alive(zygote))
    assert main(["writer", "status"]) == 0
    assert capsys.readouterr().out.startswith(f"0 resident MLflow writer(s) in {runtime}\n")
    open_to_all = tmp_path / "shared"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)
    monkeypatch.setenv(resident.DIR_ENV, str(open_to_all))
    assert main(["writer", "status"]) == 0
    assert "no private folder" in capsys.readouterr().out


def test_the_idle_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(resident.IDLE_ENV, raising=False)
    assert resident.idle_seconds() == resident.IDLE_S
    for raw, want in (("0", 0.0), ("2.5", 2.5), ("-3", 0.0), ("soon", resident.IDLE_S)):
        monkeypatch.setenv(resident.IDLE_ENV, raw)
        assert resident.idle_seconds() == want


@pytest.mark.slow
def test_two_runs_share_the_resident_writer_and_both_are_whole_in_mlflow(
    runtime: Path, tmp_path: Path
) -> None:
    """``python -m rag_ablate`` twice: the first starts the resident writer, the second uses it
    (MLflow already imported: its writer was ready at once); both runs are finished in MLflow with
    the command as their owner, and no child of the writer outlives its command."""
    from mlflow.tracking import MlflowClient

    write_dataset(tmp_path / "tiny")
    args = ["dataset=custom", "dataset.path=tiny", "progress=false"]
    profiles: list[dict[str, Any]] = []
    zygotes, outs = [], []
    for _ in range(2):
        proc = run_module("rag_ablate", args, tmp_path, timeout=300, process=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "; MLflow alongside " in proc.stdout
        outs.append(proc.stdout)
        ((zygote, _),) = resident.running()
        zygotes.append(zygote)
        _wait(lambda z=zygote: child_pids(z) == [])  # type: ignore[misc]
        seen = {p["dir"] for p in profiles}
        (run_dir,) = {p.parent for p in (tmp_path / "outputs" / "runs").glob(f"*/{PROFILE_FILE}")} - seen
        profiles.append({"dir": run_dir, **json.loads((run_dir / PROFILE_FILE).read_text(encoding="utf-8"))})
    assert zygotes[0] == zygotes[1]
    # the command that started the writer says so (a process that stays), the next one does not
    said = "a resident MLflow writer now keeps MLflow imported for the next runs; it ends after 600 s"
    assert [said in out for out in outs] == [True, False]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    for prof in profiles:
        run_id = json.loads((prof["dir"] / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        assert run.data.tags["rag_ablate.process"].split(":")[1] == str(prof["pid"])
        assert "holdout/recall_at_5" in run.data.metrics
    # the first command waited for MLflow's import in the writer; the second found it imported
    first, second = (p["background"]["store"]["cpu_s"] for p in profiles)
    assert first > 0.3 and second < first
