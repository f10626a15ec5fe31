"""Systems under test, behind one contract (:mod:`rag_ablate.systems.base`).

``SYSTEMS.get(name)(settings, cache)`` builds the system named by the ``system``
config group. Adding a system means a module that registers its factory with
``@SYSTEMS.register("<name>")`` and is listed in ``providers`` below, plus
``conf/system/<name>.yaml``.
"""

from __future__ import annotations

from rag_ablate.core.registry import Registry
from rag_ablate.systems.base import SystemFactory

SYSTEMS: Registry[SystemFactory] = Registry(
    "system", providers=("rag_ablate.systems.local", "rag_ablate.systems.http", "rag_ablate.systems.replay")
)
