"""``generator=none``: retrieval only, no answer (the default, so runs stay fast and offline)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_ablate.generators import GENERATORS

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache
    from rag_ablate.generators.base import Generator


@GENERATORS.register("none")
def no_generator(settings: RunConfig, cache: Cache | None = None) -> Generator | None:
    """No generator: the system reports retrieved evidence only."""
    return None
