"""MLflow written from a second process while the run goes on (the background writer).

Importing MLflow and opening its store cost about 2 s of CPU, logging a job about 0.5 s: on a
machine with two cores or more they need not hold the run up. ``python -m rag_ablate`` hands its
MLflow calls (:func:`call`) to a writer process (:mod:`rag_ablate.tracking.serving`) that does
them in order while the main process plans, indexes, queries, scores, compares and renders. The
writer is a child of the resident writer (:mod:`rag_ablate.tracking.resident`), which the first
command starts and which keeps MLflow imported for the next ones; with ``RAG_ABLATE_WRITER_IDLE=0``
(or where none can be used) it is a child the command forks (:func:`start`, before Hydra and
MLflow are imported), which imports MLflow at once. What is logged is still
decided in one place each: a job's end (``run/runner.py::_log_job``) and a sweep's end
(``sweep/publish.py``); they call :func:`call`, which runs the call here and now when there is no
writer, so there is one code path for what MLflow gets.

A call returns a :class:`Pending`: its value once the child has it (a run id, a trace count).
A :class:`Pending` passed as an argument of a later call (or as an item of a list, tuple or dict
argument) is replaced, in the child, by that value;
the main process waits for a value only where it needs one (:meth:`Pending.result`), or has it
handed to a function as soon as it is known (:meth:`Pending.then`: ``run.json``, ``sweep.json``).
Runs carry the main process as their owner (``rag_ablate.process``), so the orphan check is the
same as when the main process logs.

The main process waits for the child at its end (:func:`finish`): every call that failed there
is returned, one line each naming what it was doing, and the command exits non-zero. A call
that depends on a failed one fails too, naming it.

No writer is used (everything is logged in the main process, as before) for a run started from
Python (``rag_ablate.__main__.main``: the test suite's in-process runs) or when MLflow is already
imported, with fewer than two cores, ``tracking=none``, ``resume=``, a launcher other than the
basic one (its jobs run in other processes), a tracking server (it names runs itself, and
``run.json`` needs a run's id before its first query), or ``RAG_ABLATE_MLFLOW_WRITER=0``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pickle
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rag_ablate.core.errors import WriterError, one_line
from rag_ablate.tracking import serving

ENV = "RAG_ABLATE_MLFLOW_WRITER"  # "0": never start the writer


@dataclass
class Pending:
    """A call's value: known at once (no writer), or once the writer has done the call."""

    what: str
    task: int = -1
    _value: Any = None
    _error: str | None = None
    _done: threading.Event = field(default_factory=threading.Event)
    _then: list[Callable[[Any], None]] = field(default_factory=list)
    _settled: bool = False  # the value is in (its hooks may still be running)

    @staticmethod
    def known(value: Any, what: str = "") -> Pending:
        p = Pending(what, _value=value, _settled=True)
        p._done.set()
        return p

    def done(self) -> bool:
        return self._done.is_set()

    def ok(self) -> bool:
        """Done, without an error."""
        return self._done.is_set() and self._error is None

    def result(self) -> Any:
        """The value, waiting for the writer if need be; TrackingError naming the call if it failed."""
        self._done.wait()
        if self._error is not None:
            raise WriterError(f"MLflow writer: {self.what} failed: {self._error}")
        return self._value

    def value_or_none(self) -> Any:
        """The value, waiting for the writer if need be; None if the call failed (the failure is
        among :func:`failures`)."""
        self._done.wait()
        return self._value if self._error is None else None

    def then(self, fn: Callable[[Any], None]) -> None:
        """``fn(value)`` once the value is known: now when it is (in this thread), else in the
        thread that receives the writer's answers. Never called when the call failed."""
        with _lock:
            if not self._settled:
                self._then.append(fn)
                return
        if self._error is None:
            fn(self._value)

    def _settle(self, value: Any, error: str | None) -> None:
        with _lock:
            self._value, self._error = value, error
            self._settled = True
            hooks, self._then = self._then, []
        if error is None:
            for fn in hooks:
                try:
                    fn(value)
                except Exception as exc:  # a file it could not write: reported at the end
                    self._error = f"afterwards: {one_line(exc)}"
                    _failed.append(f"{self.what}: {self._error}")
        self._done.set()


_lock = threading.Lock()
_failed: list[str] = []  # what failed, one line each (the main process's view)


def value(x: Any) -> Any:
    """``x`` itself, or a :class:`Pending`'s value (waiting for it)."""
    return x.result() if isinstance(x, Pending) else x


def _to_refs(x: Any, depth: int = 2) -> Any:
    """A call's arguments (``args`` or ``kwargs``) as they cross: a known Pending as its value, a
    pending one as a reference. A Pending is looked for as an argument and as an item of a list,
    tuple or dict argument, not deeper: the records a call is handed are not walked."""
    if isinstance(x, Pending):
        if x.ok():
            return x._value
        return serving.Ref(x.task)
    if depth and isinstance(x, dict):
        return {k: _to_refs(v, depth - 1) for k, v in x.items()}
    if depth and isinstance(x, list | tuple):
        return type(x)(_to_refs(v, depth - 1) for v in x)
    return x


# --------------------------------------------------------------------------- the main process


class Writer:
    """The writer's process (see :mod:`rag_ablate.tracking.serving`) and the thread that receives
    its answers: a child forked now, or, given ``sock``, a connection to the resident writer
    (:mod:`rag_ablate.tracking.resident`), whose child for this command takes its working
    directory, environment and standard streams."""

    def __init__(self, sock: Any = None, log: str = "") -> None:
        self.proc: Any = None
        self.log = log  # where the resident writer's own errors go
        if sock is None:
            import multiprocessing

            ctx = multiprocessing.get_context("fork")
            self.conn, child_conn = ctx.Pipe()
            self.proc = ctx.Process(
                target=serving.serve, args=(child_conn, os.getpid()), name="rag_ablate-mlflow"
            )
            self.proc.start()
            child_conn.close()
        else:
            import socket
            import time
            from multiprocessing.connection import Connection
            from multiprocessing.reduction import sendfds

            self.conn = Connection(sock.detach())
            # the hello (serving.serve_connection): who, where, with what environment and file mode
            # mask (read by setting it: no thread runs yet), since when
            mask = os.umask(0o077)
            os.umask(mask)
            self.conn.send((os.getpid(), os.getcwd(), dict(os.environ), mask, time.monotonic()))
            with socket.socket(fileno=os.dup(self.conn.fileno())) as raw:
                sendfds(raw, [1, 2])  # its output and errors go where this command's go
        self.pending: dict[int, Pending] = {}
        self.held: list[tuple[int, str, str, bytes]] = []  # calls handed over with hold=True, not sent yet
        self.next = 0
        self.times: dict[str, list[float]] = {}  # stage -> [wall s, CPU s] spent in the child
        self.used = False
        self.closed = False
        self._send = threading.Lock()
        self.reader = threading.Thread(target=self._receive, name="rag_ablate-mlflow-answers", daemon=True)
        self.reader.start()

    def submit(
        self, what: str, stage: str, fn: Callable[..., Any], args: Any, kwargs: Any, *, hold: bool = False
    ) -> Pending:
        """Hand the call over; with ``hold`` it is kept here until the next call not held (which goes
        first) or :meth:`flush`."""
        with self._send:
            task, self.next = self.next, self.next + 1
            p = Pending(what, task)
            self.pending[task] = p
            self.used = True
            try:
                payload = pickle.dumps((fn, _to_refs(args), _to_refs(kwargs)))
                if hold:
                    self.held.append((task, what, stage, payload))
                    return p
                self.conn.send((task, what, stage, payload))
            except Exception as exc:
                self.pending.pop(task, None)
                _failed.append(f"{what}: {one_line(exc)}")
                p._settle(None, one_line(exc))
        self.flush()
        return p

    def flush(self) -> None:
        """Send the calls held back, in the order they were handed over."""
        with self._send:
            held, self.held = self.held, []
            for msg in held:
                try:
                    self.conn.send(msg)
                except Exception as exc:
                    p = self.pending.pop(msg[0], None)
                    _failed.append(f"{msg[1]}: {one_line(exc)}")
                    if p is not None:
                        p._settle(None, one_line(exc))

    def _receive(self) -> None:
        ready = False  # the writer's first answer (number -1) came: it was serving this command
        while True:
            try:
                task, ok, out, stage, wall, cpu = self.conn.recv()
            except (EOFError, OSError):
                break
            ready = True
            spent = self.times.setdefault(stage, [0.0, 0.0])
            spent[0] += wall
            spent[1] += cpu
            p = self.pending.pop(task, None)
            if p is None:
                continue
            if not ok:
                _failed.append(f"{p.what}: {out}")
            p._settle(out if ok else None, None if ok else str(out))
        code = self.proc.exitcode if self.proc is not None else None
        why = f"the writer process ended (exit code {code})" if code else "the writer process ended"
        if self.proc is None and not ready:
            why = (
                "the resident MLflow writer ended before it served this command (its errors: "
                f"{self.log or 'none kept'}; RAG_ABLATE_WRITER_IDLE=0 has each command fork its own writer)"
            )
        for task in sorted(self.pending):  # never answered: the child ended
            p = self.pending.pop(task)
            _failed.append(f"{p.what}: {why}")
            p._settle(None, why)

    def drain(self) -> None:
        """Wait until every call handed over so far is done."""
        self.flush()
        for p in list(self.pending.values()):
            p._done.wait()

    def close(self, *, wait: bool = True) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        with contextlib.suppress(OSError):
            self.conn.send(None)
        if self.proc is None:  # the resident writer's child ends when this connection does
            if not wait:
                import socket

                with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self.conn.fileno())) as raw:
                    raw.shutdown(socket.SHUT_RDWR)
            self.reader.join()
        elif wait:
            self.proc.join()
            self.reader.join()
        else:
            self.proc.terminate()
            self.proc.join()
        self.conn.close()


_writer: Writer | None = None


def start(argv: Sequence[str]) -> None:
    """Start the writer for the command ``argv``, unless it cannot help (see the module's text)."""
    global _writer
    if _writer is not None or os.environ.get(ENV, "1") == "0" or "mlflow" in sys.modules:
        return
    if any(a.replace(" ", "") in ("tracking=none", "tracking.enabled=false") for a in argv):
        return
    if any(a.startswith(("resume=", "hydra/launcher=", "hydra.launcher")) for a in argv):
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if cores < 2:
        return
    _writer = _resident_writer() or Writer()
    atexit.register(_at_exit)


def _resident_writer() -> Writer | None:
    """A writer served by the resident writer (started now if none runs), or None when the
    command is to fork its own (``RAG_ABLATE_WRITER_IDLE=0``, or none can be used here)."""
    from rag_ablate.tracking import resident

    idle = resident.idle_seconds()
    if idle <= 0:
        return None
    try:
        sock, _ = resident.connect(idle)
        return Writer(sock, log=str(resident.log_path(sock)))
    except OSError:
        return None


def _at_exit() -> None:
    if _writer is not None:
        _writer.close(wait=_writer.used)


def active() -> bool:
    """True while a writer is there to take calls."""
    return _writer is not None and not _writer.closed


def release() -> None:
    """Stop a writer that will not be used (a launcher of other processes, resume=): everything
    is logged in this process, as before. A writer already in use is kept."""
    global _writer
    if _writer is not None and not _writer.used:
        _writer.close(wait=False)
        _writer = None


def call(what: str, stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Pending:
    """``fn(*args, **kwargs)`` (a module-level function of MLflow calls) done by the writer, in the
    order handed over; without a writer here and now (its errors raised as they are). ``what``
    names it in a failure, ``stage`` (store or log) is where its time is counted."""
    return _call(what, stage, fn, args, kwargs, hold=False)


def call_later(what: str, stage: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Pending:
    """:func:`call`, but the writer gets it only after the next :func:`call` (or at :func:`drain` or
    :func:`finish`): a job that another job follows hands its logging so, and the next job's run is
    created first instead of waiting behind it."""
    return _call(what, stage, fn, args, kwargs, hold=True)


def _call(what: str, stage: str, fn: Callable[..., Any], args: Any, kwargs: Any, *, hold: bool) -> Pending:
    if not active():
        return Pending.known(fn(*_values(args), **_values(kwargs)), what)
    assert _writer is not None
    return _writer.submit(what, stage, fn, args, kwargs, hold=hold)


def _values(x: Any, depth: int = 2) -> Any:
    """``x`` with its Pendings as their values (waiting for them), looked for as :func:`_to_refs` does."""
    if isinstance(x, Pending):
        return x.result()
    if depth and isinstance(x, dict):
        return {k: _values(v, depth - 1) for k, v in x.items()}
    if depth and isinstance(x, list | tuple):
        return type(x)(_values(v, depth - 1) for v in x)
    return x


def preload(*modules: str) -> None:
    """Have the writer import ``modules`` now, while it has nothing else to do, rather than when a
    later call needs them (the sweep's end: ``rag_ablate.sweep.publish``). No writer: nothing."""
    if active():
        assert _writer is not None
        _writer.submit(f"importing {', '.join(modules)}", "store", _import_all, (modules,), {})


def _import_all(modules: Sequence[str]) -> None:
    for name in modules:
        importlib.import_module(name)


def drain() -> None:
    """Wait for every call handed over so far (no-op without a writer)."""
    if _writer is not None:
        _writer.drain()


def failures() -> list[str]:
    """The calls that failed in the writer so far, one line each naming what it was doing."""
    return list(_failed)


def times() -> dict[str, dict[str, float]]:
    """Seconds (wall and CPU) the writer spent per stage: ``store`` (importing MLflow, opening the
    store, creating runs) and ``log``; empty without a writer."""
    if _writer is None:
        return {}
    return {k: {"seconds": round(v[0], 4), "cpu_s": round(v[1], 4)} for k, v in _writer.times.items()}


def kind() -> str:
    """``resident`` (a child of the resident writer), ``forked`` (this command's child), or ""
    without a writer."""
    if _writer is None:
        return ""
    return "forked" if _writer.proc is not None else "resident"


def finish() -> list[str]:
    """Wait for the writer to do everything handed over and end; the calls that failed (one line
    each). Later calls run in this process. No writer: nothing to wait for, no failures."""
    global _writer
    if _writer is None:
        return []
    _writer.close(wait=True)
    return failures()


def forget() -> None:
    """After :func:`finish`: the writer's times and failures are let go (the next command of the
    process starts anew)."""
    global _writer
    _writer = None
    _failed.clear()
    _sweeps.clear()


def open_store(uri: str, experiment: str, artifact_root: Any, *, create_folder: bool = False) -> Pending:
    """:func:`rag_ablate.tracking.store.open_store` (the experiment id), by the writer when there is
    one; the checks that need no MLflow (a folder that is missing, a server that does not answer)
    are made here first, so such a store still stops the command before anything runs."""
    from rag_ablate.tracking import store

    if store.sqlite_path(uri) is None:  # a server names runs itself: run.json needs the id at once
        release()
    if active():  # the run goes on without waiting for the writer: what can fail early fails here
        store.check_store(uri, experiment, create_folder=create_folder, artifact_root=artifact_root)
    return call(
        f"opening the MLflow store {uri}",
        "store",
        store.open_store,
        uri,
        experiment,
        artifact_root,
        create_folder=create_folder,
    )


# sweep folder -> (tracking URI, experiment id, parent run id) of a sweep whose store the writer opens:
# its jobs (in this process) log there before sweep.json has the ids
_sweeps: dict[str, tuple[str, Pending, Pending]] = {}


def set_sweep_store(sweep_dir: Any, uri: str, experiment_id: Pending, parent_run_id: Pending) -> None:
    _sweeps[str(os.path.abspath(sweep_dir))] = (uri, experiment_id, parent_run_id)


def sweep_store(sweep_dir: Any) -> tuple[str, Pending, Pending] | None:
    """What :func:`set_sweep_store` noted for ``sweep_dir`` in this process, or None."""
    return _sweeps.get(str(os.path.abspath(sweep_dir)))
