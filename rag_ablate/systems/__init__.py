"""Systems under test, behind one contract (:mod:`rag_ablate.systems.base`).

``SYSTEMS.get(name)(settings, cache)`` builds the system named by the ``system``
config group. Adding a system means a module that registers its factory with
``@SYSTEMS.register("<name>")`` and is listed in ``providers`` below, plus
``conf/system/<name>.yaml``.
"""

from __future__ import annotations

from rag_ablate.registry import Registry
from rag_ablate.systems.base import (
    Citation,
    RetrievedChunk,
    Status,
    System,
    SystemFactory,
    TokenUsage,
    Trace,
)

SYSTEMS: Registry[SystemFactory] = Registry("system", providers=("rag_ablate.systems.local",))

__all__ = [
    "SYSTEMS",
    "Citation",
    "RetrievedChunk",
    "Status",
    "System",
    "SystemFactory",
    "TokenUsage",
    "Trace",
]
