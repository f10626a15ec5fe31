"""Answer generators behind one contract (:mod:`rag_ablate.generators.base`).

``GENERATORS.get(settings.generator.name)(settings, cache)`` builds the generator the
``generator`` config group names (``None`` for ``none``: retrieval only). Adding one means a
module that registers its factory with ``@GENERATORS.register("<name>")``, listed in
``providers`` below, plus ``conf/generator/<name>.yaml``.
"""

from __future__ import annotations

from rag_ablate.core.registry import Registry
from rag_ablate.generators.base import GeneratorFactory

GENERATORS: Registry[GeneratorFactory] = Registry(
    "generator",
    providers=(
        "rag_ablate.generators.none",
        "rag_ablate.generators.extractive",
        "rag_ablate.generators.openai",
    ),
)
