"""``judge=none``: no judge (the default). Answers get the deterministic metrics only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_ablate.judges import JUDGES

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache
    from rag_ablate.judges import Judge


@JUDGES.register("none")
def no_judge(settings: RunConfig, cache: Cache | None = None) -> Judge | None:
    """judge=none builds nothing."""
    return None
