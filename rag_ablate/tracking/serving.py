"""The MLflow writer's side: the process that does a command's MLflow calls in order.

A command hands its calls over (:mod:`rag_ablate.tracking.background`); they are done here, in a
child forked by the command itself or by the resident writer (:mod:`rag_ablate.tracking.resident`),
which imported MLflow before the command started. Each call is ``(number, what, stage, pickled
(function, args, kwargs))``; each answer ``(number, ok, value or error, stage, wall s, CPU s)``.
The first answer, number -1, says the writer is ready and what getting ready cost (importing
MLflow: stage ``store``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import time
from dataclasses import dataclass
from typing import Any

from rag_ablate.core import profiling
from rag_ablate.core.errors import TrackingError, one_line

# imported by the writer before its first call: MLflow's client, its sqlite store, the trace client,
# and what the calls' arguments are made of (a forked writer starts before the command imports them)
WARM = (
    "rag_ablate.tracking.store",
    "rag_ablate.tracking.traces",
    "rag_ablate.dataset.model",
    "mlflow.tracking",
    "mlflow.tracing.client",
    "mlflow.store.tracking.sqlalchemy_store",
    "mlflow.entities",
)


@dataclass(frozen=True)
class Ref:
    """A call's value, named by its number, as it crosses to the writer."""

    task: int


def from_refs(x: Any, results: dict[int, Any], failed: dict[int, str], depth: int = 2) -> Any:
    """A call's arguments with each :class:`Ref` replaced by that call's value (looked for as an
    argument and as an item of a list, tuple or dict argument, not deeper)."""
    if isinstance(x, Ref):
        if x.task in failed:
            raise TrackingError(f"not done: it needs {failed[x.task]}, which failed")
        return results[x.task]
    if depth and isinstance(x, dict):
        return {k: from_refs(v, results, failed, depth - 1) for k, v in x.items()}
    if depth and isinstance(x, list | tuple):
        return type(x)(from_refs(v, results, failed, depth - 1) for v in x)
    return x


def warm_up() -> tuple[float, float]:
    """Import :data:`WARM`; (wall s, CPU s) it took."""
    t0, c0 = time.perf_counter(), time.process_time()
    # importing allocates much and frees little: collections during it are wasted work (1.55 -> 1.29 s
    # of CPU for these imports); then MLflow's modules, here to stay, are frozen out of the collector's
    # sight, as the main process's start-up is (the few thousand objects left unreachable stay)
    profiling.startup_gc_off()
    for name in WARM:
        try:
            importlib.import_module(name)
        except Exception:  # the call that needs it reports the error
            continue
    profiling.startup_gc_on(freeze=True)
    return time.perf_counter() - t0, time.process_time() - c0


def serve(conn: Any, owner_pid: int, ready: tuple[float, float] | None = None) -> None:
    """Do each call in order and answer, until the command sends None or goes away. ``ready``:
    MLflow is already imported (the resident writer's child), at this cost to the command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    from rag_ablate.tracking import store

    store.set_owner_pid(owner_pid)  # runs carry the command as their owner, not this process
    wall, cpu = warm_up() if ready is None else ready
    conn.send((-1, True, None, "store", wall, cpu))
    results: dict[int, Any] = {}
    failed: dict[int, str] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        task, what, stage, payload = msg
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            fn, args, kwargs = pickle.loads(payload)
            out = fn(*from_refs(args, results, failed), **from_refs(kwargs, results, failed))
            results[task] = out
            answer = (task, True, out, stage)
        except BaseException as exc:  # every failure goes back to the command
            failed[task] = what
            answer = (task, False, one_line(exc), stage)
        try:
            conn.send((*answer, time.perf_counter() - t0, time.process_time() - c0))
        except Exception as exc:  # a value that cannot be sent back
            conn.send((task, False, f"its value could not be sent back: {one_line(exc)}", stage, 0.0, 0.0))
    conn.close()


def serve_connection(fd: int, warmed: tuple[float, float]) -> None:
    """The resident writer's child for one command connected on socket ``fd``: it takes the
    command's hello (its process id, working directory, environment, file mode mask, the time it
    connected) and its standard output and error, then serves it. ``warmed``: what importing
    MLflow cost, for the command that started the resident writer (0 for the others)."""
    import socket
    from multiprocessing.connection import Connection
    from multiprocessing.reduction import recvfds

    conn = Connection(fd)
    owner_pid, cwd, env, mask, connected = conn.recv()
    with socket.socket(fileno=os.dup(fd)) as sock:
        out, err = recvfds(sock, 2)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    os.environ.clear()
    os.environ.update(env)
    from rag_ablate.tracking import store

    store.mlflow_env_defaults()  # as the command's own process has them once it imports store
    time.tzset()  # its TZ, if it has one
    os.umask(mask)  # the files it writes (artifacts, a new store) get the command's permissions
    with contextlib.suppress(OSError):
        os.chdir(cwd)
    # the command waited from its connection until now (a resident writer still importing MLflow)
    serve(conn, owner_pid, ready=(max(0.0, time.monotonic() - connected), warmed[1]))
