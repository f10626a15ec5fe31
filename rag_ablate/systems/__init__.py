"""Systems under test, behind one contract (:mod:`rag_ablate.systems.base`).

``SYSTEMS.get(name)(settings, cache)`` builds the system named by the ``system``
config group. Adding a system means a module that registers its factory with
``@SYSTEMS.register("<name>")`` and is listed in ``providers`` below, plus
``conf/system/<name>.yaml``.
"""

from __future__ import annotations

from rag_ablate.registry import Registry
from rag_ablate.systems.base import (
    STATUSES,
    BatchSystem,
    Citation,
    OnDone,
    RetrievedChunk,
    Status,
    System,
    SystemFactory,
    TokenUsage,
    Trace,
    batch_runner,
)

SYSTEMS: Registry[SystemFactory] = Registry(
    "system", providers=("rag_ablate.systems.local", "rag_ablate.systems.http")
)

__all__ = [
    "STATUSES",
    "SYSTEMS",
    "BatchSystem",
    "Citation",
    "OnDone",
    "RetrievedChunk",
    "Status",
    "System",
    "SystemFactory",
    "TokenUsage",
    "Trace",
    "batch_runner",
]
