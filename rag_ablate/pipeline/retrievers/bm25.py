"""``retrieval=bm25``: lexical retrieval over the chunks with bm25s."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rag_ablate.pipeline.stages import RETRIEVERS, Hits, QueryState, Resources

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.pipeline.bm25 import BM25Retriever


@RETRIEVERS.register("bm25")
class BM25Stage:
    """The chunks' BM25 index (from the cache); records the ``bm25`` timing."""

    def __init__(self, settings: RunConfig) -> None:
        self.settings = settings
        self.index: BM25Retriever | None = None

    def prepare(self, res: Resources) -> dict[str, Any]:
        self.index, analyzer = res.bm25_index()
        return {"retrieval.bm25.analyzer_resolved": analyzer}

    @property
    def nbytes(self) -> int:
        return self.index.nbytes if self.index is not None else 0

    def search(self, state: QueryState, k: int) -> Hits:
        if self.index is None:
            raise RuntimeError("the bm25 retriever is used before prepare()")
        t = time.perf_counter()
        hits = self.index.search(state.query.query, k)
        state.timed("bm25", t)
        return hits
