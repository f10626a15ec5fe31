"""``retrieval=hybrid``: BM25 and dense candidates fused into one list.

Takes ``retrieval.hybrid.depth_bm25`` and ``depth_dense`` candidates from the
two retrievers and fuses them with ``retrieval.hybrid.fusion`` (a name in
:data:`~rag_ablate.pipeline.stages.FUSIONS`); records the ``fuse`` timing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.pipeline.stages import FUSIONS, RETRIEVERS, Hits, QueryState, Resources

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig


@RETRIEVERS.register("hybrid")
class HybridStage:
    def __init__(self, settings: RunConfig) -> None:
        self.settings = settings
        self.bm25 = RETRIEVERS.get("bm25")(settings)
        self.dense = RETRIEVERS.get("dense")(settings)
        self.fusion = FUSIONS.get(settings.retrieval.hybrid.fusion)
        self.tiebreak = np.zeros(0, dtype=np.int64)

    def prepare(self, res: Resources) -> dict[str, Any]:
        self.tiebreak = res.tiebreak
        return {**self.bm25.prepare(res), **self.dense.prepare(res)}

    @property
    def nbytes(self) -> int:
        return self.bm25.nbytes + self.dense.nbytes

    def search(self, state: QueryState, k: int) -> Hits:
        h = self.settings.retrieval.hybrid
        extra = state.extra_depth  # retrieval.acl_filter: room for the chunks it will drop
        runs = [
            self.bm25.search(state, h.depth_bm25 + extra),
            self.dense.search(state, h.depth_dense + extra),
        ]
        t = time.perf_counter()
        hits = self.fusion(runs, self.tiebreak, k, rrf_k=h.rrf_k, weights=[1 - h.weight, h.weight])
        state.timed("fuse", t)
        return hits
