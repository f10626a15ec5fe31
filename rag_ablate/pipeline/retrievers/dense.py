"""``retrieval=dense``: nearest chunks by the cosine of encoder embeddings.

The encoder (``retrieval.dense.encoder``) is loaded only when the index is
built; this module imports no model library itself.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rag_ablate.pipeline.encoders import resolve_encoder
from rag_ablate.pipeline.stages import RETRIEVERS, Embedded, Hits, QueryState, Resources

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.pipeline.dense import DenseIndex


@RETRIEVERS.register("dense")
class DenseStage:
    """A dense index over the chunks' embeddings; records the ``dense`` timing and charges encoding."""

    def __init__(self, settings: RunConfig) -> None:
        self.settings = settings
        self.index: DenseIndex | None = None
        self.queries: Embedded | None = None

    def prepare(self, res: Resources) -> dict[str, Any]:
        d = self.settings.retrieval.dense
        name = resolve_encoder(d.encoder, res.language)
        emb = res.embeddings(name)
        self.queries = emb.queries
        self.index, kind = res.dense_index(name)
        return {
            "retrieval.dense.encoder_resolved": name,
            "retrieval.dense.model_id": emb.model_id,
            "retrieval.dense.index_resolved": kind,  # auto: exact or usearch, by the number of chunks
        }

    @property
    def nbytes(self) -> int:
        return int(self.index.nbytes) if self.index is not None else 0

    def search(self, state: QueryState, k: int) -> Hits:
        if self.index is None or self.queries is None:
            raise RuntimeError("the dense retriever is used before prepare()")
        qvec = self.queries.get(state.query.query_id)
        state.charge_encoding(self.queries)
        t = time.perf_counter()
        hits = self.index.search(qvec, k)
        state.timed("dense", t)
        return hits
