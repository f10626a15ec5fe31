"""The contract every system under test follows.

A system turns one query into one :class:`Trace`. The built-in ``local`` system
runs rag_ablate's own pipeline; any other system (a user's RAG service behind
HTTP, say) produces the same traces, so everything downstream (records,
metrics, MLflow, comparison) is shared. See docs/architecture.md.

Fields a system cannot fill stay ``None`` (or empty): a retrieval-only system
has no ``answer``; a system without a router has no ``intents``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.trace import Trace

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache


class System(Protocol):
    """A system under test."""

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        """Build what the system needs (indexes, connections); return facts worth logging.

        Every value is logged as a run parameter; numeric values are also logged
        as ``run/<key>`` metrics (dots become underscores).
        """
        ...

    def run(self, query: Query) -> Trace:
        """Answer one query. May raise; the runner records a raise as a failed query."""
        ...

    def close(self) -> None:
        """Release what :meth:`prepare` acquired (clients, connections)."""
        ...

    @property
    def routes_intents(self) -> bool:
        """True when the system predicts intents (intent metrics are then computed)."""
        ...

    # Optional: ``generates_answers`` (a bool property), True when the system answers each query;
    # a failed query of such a system then misses the answer metrics too (their failure-aware
    # form). The runner reads it with getattr, so a system without it generates none.
    # Optional: ``write_files(folder: Path) -> None``, called once after :meth:`prepare` with the
    # job folder, for files of the system's own (system=replay: the log lines that matched no
    # query); and ``timed`` (a class attribute), False when the system has no latency of its own
    # to measure (system=replay), so the sweep's interleaved timing pass skips the sweep.


# Called once per query as soon as its trace is final (from the thread that called run_many).
OnDone = Callable[[Query, Trace], None]


class BatchSystem(System, Protocol):
    """A system that runs many queries itself (concurrently, say): the optional part of the contract.

    When a system has ``run_many``, the runner calls it once with every query
    instead of :meth:`System.run` per query, and records each query when
    ``on_done`` reports it, in completion order.
    """

    def run_many(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """Run every query; call ``on_done(query, trace)`` exactly once per query as it completes.

        A query that fails gets a trace with a failure status, never an exception;
        each trace carries its own ``timings_ms["total"]``. Returns when all are done.
        """
        ...


def batch_runner(system: System) -> Callable[[Sequence[Query], OnDone], None] | None:
    """The system's ``run_many`` when it has one, else None (the runner then calls ``run``)."""
    run_many = getattr(system, "run_many", None)
    return run_many if callable(run_many) else None


# How a registered system is built: ``SYSTEMS.get(name)(settings, cache)``.
SystemFactory = Callable[["RunConfig", "Cache"], System]
