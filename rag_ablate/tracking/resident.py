"""The resident MLflow writer: a process that keeps MLflow imported between commands.

Importing MLflow costs about 1.3 s of CPU, the longest part of a short run's background writer
(:mod:`rag_ablate.tracking.background`). The first ``python -m rag_ablate`` that wants a writer
starts this process (``python -m rag_ablate.tracking.resident``, in its own session, in ``/``, its
input ``/dev/null`` and its output its log) on a Unix socket it has bound itself; the process
imports MLflow once and then, for each command that connects, forks a child that serves that
command alone: it takes the command's working directory, environment, umask, standard output and
error, does the command's MLflow calls in order, answers, and ends with the command. A command
that finds the process there (the next run of the day) starts writing at once.

- **Where:** ``$RAG_ABLATE_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/rag_ablate``, else
  ``/tmp/rag_ablate-<uid>``: a folder of this user's alone (mode 0700; another owner, a link or
  wider permissions and no resident writer is used). The process also checks that each peer
  runs as its own user (``SO_PEERCRED``).
- **Which:** the socket's name is a digest of what the writer's code depends on: the Python
  executable, rag_ablate's folder and its sources (names, sizes, modification times), MLflow's
  installation, the ``MLFLOW_*`` and ``PYTHON*`` environment variables, and the user's groups
  (the group of the files it makes). Edited code, another virtual environment or another MLflow
  gets a process of its own.
- **Its own errors** (a start that failed) go to ``writer-<digest>.log`` beside its socket; a
  command it could not serve names that file.
- **How long:** ``RAG_ABLATE_WRITER_IDLE`` seconds (600 unless set) without a command, then it
  removes its socket, serves the commands that connected meanwhile, and ends. ``0``: no resident
  writer, a command forks its own (as before). ``rag-ablate writer stop`` ends them now.

Nothing is lost when it is not there: a socket that no process answers is replaced, and a
command that cannot use one (no such folder, a path too long for a socket, not Linux) forks a
writer of its own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import signal
import socket
import struct
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

IDLE_ENV = "RAG_ABLATE_WRITER_IDLE"
DIR_ENV = "RAG_ABLATE_RUNTIME_DIR"
IDLE_S = 600.0
_TICK_S = 5.0  # how often an idle process looks at its socket and the clock
_KEPT_ENV = ("MLFLOW_", "PYTHON")  # variables that may change what importing MLflow does


def idle_seconds() -> float:
    """How long a resident writer waits for the next command (0: none is used)."""
    raw = os.environ.get(IDLE_ENV, "").strip()
    try:
        return max(0.0, float(raw)) if raw else IDLE_S
    except ValueError:
        return IDLE_S


def runtime_dir(*, create: bool = True) -> Path | None:
    """The folder of this user's resident writers, made private if new; None when it is not safe
    to use (another owner, a link, readable or writable by others) or cannot be made."""
    given = os.environ.get(DIR_ENV)
    if given:
        d = Path(given).absolute()  # the writer runs in /: its socket's name must not depend on a folder
    elif os.environ.get("XDG_RUNTIME_DIR"):
        d = Path(os.environ["XDG_RUNTIME_DIR"]) / "rag_ablate"
    else:
        d = Path("/tmp") / f"rag_ablate-{os.getuid()}"
    if create:
        with contextlib.suppress(FileExistsError, OSError):
            d.mkdir(mode=0o700, parents=bool(given))
    try:
        st = os.lstat(d)
    except OSError:
        return None
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def code_key() -> str:
    """The digest that names the socket of writers running this code (see the module's text)."""
    import importlib.util

    import rag_ablate

    h = hashlib.sha256()
    pkg = Path(rag_ablate.__file__).resolve().parent
    # the user's groups too: files the writer makes get its group (``sg``, ``newgrp``)
    h.update(f"{sys.executable}\0{sys.version}\0{pkg}\0{os.getgid()}:{sorted(os.getgroups())}\0".encode())
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(root, name))
                h.update(f"{root}/{name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    spec = importlib.util.find_spec("mlflow")
    if spec is not None and spec.origin:
        st = os.stat(spec.origin)
        h.update(f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    for k in sorted(os.environ):
        if k.startswith(_KEPT_ENV):
            h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()[:20]


def socket_path(d: Path, key: str) -> Path:
    return d / f"writer-{key}.sock"


def log_path(sock: socket.socket) -> Path:
    """Where the resident writer on ``sock`` (either end) writes its own errors (a failed start)."""
    name = sock.getsockname() or sock.getpeername()
    return Path(name).with_suffix(".log")


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    """This user's resident writers' folder, locked against another command starting or ending one."""
    import fcntl

    fd = os.open(d / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
    except BaseException:
        s.close()
        raise
    return s


_GONE = (FileNotFoundError, ConnectionRefusedError)
_started: list[float] = []  # this process started a resident writer, of this idle time


def started_here() -> float | None:
    """The idle time of the resident writer this process started, or None if it started none."""
    return _started[0] if _started else None


def connect(idle: float) -> tuple[socket.socket, bool]:
    """A connection to this code's resident writer, started now if none answers (``started``:
    True then); OSError when none can be used."""
    if not hasattr(socket, "SO_PEERCRED") or not hasattr(os, "fork"):
        raise OSError(errno.ENOTSUP, "resident writers need Linux")
    d = runtime_dir()
    if d is None:
        raise OSError(errno.EACCES, "no private folder for resident writers")
    path = socket_path(d, code_key())
    with contextlib.suppress(*_GONE):
        return _connect(path), False
    with _locked(d):
        with contextlib.suppress(*_GONE):  # another command started it meanwhile
            return _connect(path), False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a socket no process answers: its writer was killed
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            listener.listen(64)
            _spawn(listener, idle)
            _started[:] = [idle]
        finally:
            listener.close()
    return _connect(path), True


def _spawn(listener: socket.socket, idle: float) -> None:
    """Start the resident writer on ``listener``, detached (its own session, no parent to wait for it)."""
    import rag_ablate

    env = dict(os.environ)
    # rag_ablate from where this command found it, whatever folder the process runs in
    root = str(Path(rag_ablate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    fd = listener.fileno()
    argv = [sys.executable, "-m", "rag_ablate.tracking.resident", str(fd), repr(idle)]
    pid = os.fork()
    if pid == 0:  # the first child: a new session, then the writer as its child, and out
        try:
            os.setsid()
            if os.fork() == 0:
                os.chdir("/")
                null = os.open(os.devnull, os.O_RDWR)
                log = os.open(log_path(listener), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(null, 0)
                os.dup2(log, 1)
                os.dup2(log, 2)
                os.set_inheritable(fd, True)
                os.execve(sys.executable, argv, env)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


# --------------------------------------------------------------------------- the resident process


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _still_ours(path: str, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def serve(listener: socket.socket, idle: float) -> None:
    """Import MLflow, then fork a child per command that connects, until ``idle`` seconds pass
    without one or the socket's name is taken by another process."""
    from rag_ablate.tracking import serving

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    path = listener.getsockname()
    ino = os.stat(path).st_ino
    (Path(path).with_suffix(".pid")).write_text(f"{os.getpid()}\n", encoding="utf-8")
    warmed = serving.warm_up()
    first = True
    last = time.monotonic()
    listener.settimeout(min(_TICK_S, idle))
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            _reap()
            if not _still_ours(path, ino):
                break  # replaced: the next commands go to the new process
            if time.monotonic() - last >= idle:
                with _locked(Path(path).parent):
                    if _still_ours(path, ino):
                        os.unlink(path)
                        Path(path).with_suffix(".pid").unlink(missing_ok=True)
                        Path(path).with_suffix(".log").unlink(missing_ok=True)
                # a command may have connected before the name was removed: it is served
                listener.setblocking(False)
                while True:
                    try:
                        conn, _ = listener.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(True)
                    _fork_for(conn, listener, (0.0, 0.0))
                break
            continue
        last = time.monotonic()
        _fork_for(conn, listener, warmed if first else (0.0, 0.0))
        first = False
        _reap()
    listener.close()
    _reap()


def _fork_for(conn: socket.socket, listener: socket.socket, warmed: tuple[float, float]) -> None:
    from rag_ablate.tracking import serving

    try:
        if _peer_uid(conn) != os.getuid():
            return
        with warnings.catch_warnings():
            # Python 3.12 warns of a fork with threads running (here a thread of pyarrow's allocator
            # that MLflow's imports start, which the child never uses); under -W error that would stop
            # the writer: the child does only the command's MLflow calls
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                signal.signal(signal.SIGHUP, signal.SIG_DFL)
                serving.serve_connection(conn.detach(), warmed)
                code = 0
            finally:
                os._exit(code)
    except OSError:  # no fork: the command sees its writer end and says so
        pass
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    listener = socket.socket(fileno=int(argv[0]))
    serve(listener, float(argv[1]))


def _writer_pid(pid_file: Path) -> int | None:
    """The process id ``pid_file`` names if that process is a resident writer (a process id left
    by one that was killed may have been given to another process since)."""
    try:
        pid = int(pid_file.read_text(encoding="utf-8"))
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (ValueError, OSError):
        return None
    return pid if b"rag_ablate.tracking.resident" in cmdline else None


def running() -> list[tuple[int, Path]]:
    """This user's resident writers that are alive: (process id, socket)."""
    d = runtime_dir(create=False)
    if d is None:
        return []
    found = []
    for pid_file in sorted(d.glob("writer-*.pid")):
        pid = _writer_pid(pid_file)
        if pid is not None:
            found.append((pid, pid_file.with_suffix(".sock")))
    return found


def stop_all() -> list[int]:
    """End this user's resident writers (``rag-ablate writer stop``): their process ids."""
    d = runtime_dir(create=False)
    if d is None:
        return []
    stopped = []
    with _locked(d):
        for pid_file in sorted(d.glob("writer-*.pid")):
            sock = pid_file.with_suffix(".sock")
            with contextlib.suppress(FileNotFoundError):
                sock.unlink()
            pid = _writer_pid(pid_file)
            pid_file.unlink(missing_ok=True)
            pid_file.with_suffix(".log").unlink(missing_ok=True)
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
                    stopped.append(pid)
    return stopped


if __name__ == "__main__":
    main(sys.argv[1:])
