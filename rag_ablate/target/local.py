"""The built-in pipeline as a target: chunk, BM25-index, route and retrieve."""

from __future__ import annotations

import time
from typing import Any

from rag_ablate.config import RunConfig
from rag_ablate.dataset import Dataset, Query
from rag_ablate.errors import UnknownNameError
from rag_ablate.metrics.text import is_cjk_text
from rag_ablate.pipeline.analyzers import get_analyzer
from rag_ablate.pipeline.bm25 import BM25Retriever
from rag_ablate.pipeline.chunking import Chunk, chunk_corpus
from rag_ablate.pipeline.router import IntentRouter
from rag_ablate.target import RetrievedChunk, Trace

RETRIEVAL_METHODS = ("bm25",)
ROUTER_METHODS = ("centroid", "nearest", "none")


class LocalTarget:
    def __init__(self, settings: RunConfig) -> None:
        self.s = settings
        if settings.retrieval.method not in RETRIEVAL_METHODS:
            raise UnknownNameError("retrieval method", settings.retrieval.method, RETRIEVAL_METHODS)
        if settings.router.method not in ROUTER_METHODS:
            raise UnknownNameError("router", settings.router.method, ROUTER_METHODS)
        self.chunks: list[Chunk] = []
        self.retriever: BM25Retriever | None = None
        self.router: IntentRouter | None = None

    @property
    def routes_intents(self) -> bool:
        return self.router is not None

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        s = self.s
        t0 = time.perf_counter()
        docs = list(dataset.documents.values())
        self.chunks, unit = chunk_corpus(docs, s.chunk.size, s.chunk.overlap, s.chunk.unit, s.chunk.snap)
        t_chunk = time.perf_counter() - t0

        analyzer_name = s.retrieval.bm25.analyzer
        if analyzer_name == "auto":
            analyzer_name = "zh" if unit == "char" or is_cjk_text(docs[0].text[:2000]) else "en"
        analyzer = get_analyzer(analyzer_name)
        texts = [c.index_text(s.chunk.include_title) for c in self.chunks]
        t1 = time.perf_counter()
        self.retriever = BM25Retriever(
            texts,
            [(c.doc_id, int(c.chunk_id.rsplit("#", 1)[1])) for c in self.chunks],
            analyzer,
            k1=s.retrieval.bm25.k1,
            b=s.retrieval.bm25.b,
            method=s.retrieval.bm25.method,
            show_progress=s.progress,
        )
        t_index = time.perf_counter() - t1
        if s.router.method != "none" and dataset.intents:
            self.router = IntentRouter(list(dataset.intents.values()), s.router.ngram, s.router.method)
        return {
            "chunk.unit_resolved": unit,
            "retrieval.bm25.analyzer_resolved": analyzer_name,
            "index.chunks": len(self.chunks),
            "index.chunk_seconds": round(t_chunk, 4),
            "index.build_seconds": round(t_index, 4),
        }

    def run(self, query: Query) -> Trace:
        if self.retriever is None:
            raise RuntimeError("prepare() must run before run()")
        trace = Trace(query.query_id)
        t0 = time.perf_counter()
        if self.router is not None:
            trace.intent_pred, trace.intent_score = self.router.route(query.query)
        t1 = time.perf_counter()
        hits = self.retriever.search(query.query, self.s.retrieval.top_k)
        t2 = time.perf_counter()
        for rank, (i, score) in enumerate(hits, start=1):
            c = self.chunks[i]
            trace.retrieved.append(RetrievedChunk(rank, c.chunk_id, c.doc_id, c.start, c.end, score))
        trace.timings_ms = {
            "route": (t1 - t0) * 1000,
            "retrieve": (t2 - t1) * 1000,
            "total": (t2 - t0) * 1000,
        }
        return trace
