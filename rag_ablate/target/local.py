"""The built-in pipeline as a target: chunk, index, route, retrieve, fuse, rerank.

Everything expensive (chunks, BM25 index, passage and query embeddings) comes
from the content-addressed cache, so a ``rerank.top_k`` sweep encodes the corpus
once and a ``chunk`` sweep once per chunking.

Stage timings per query (milliseconds): ``route``, ``encode`` (the query's share
of encoding its embedding, measured when it was computed, so cold and warm runs
report the same cost), ``bm25``, ``dense``, ``fuse``, ``rerank`` and ``total``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.cache import Cache
from rag_ablate.config import RunConfig
from rag_ablate.dataset import Dataset, Query
from rag_ablate.errors import ConfigError, UnknownNameError
from rag_ablate.metrics.text import is_cjk_text
from rag_ablate.pipeline.analyzers import get_analyzer
from rag_ablate.pipeline.bm25 import BM25Retriever
from rag_ablate.pipeline.chunking import Chunk, chunk_corpus, detect_unit
from rag_ablate.pipeline.fusion import FUSIONS, fuse
from rag_ablate.pipeline.router import IntentRouter
from rag_ablate.target import RetrievedChunk, Trace

RETRIEVAL_METHODS = ("bm25", "dense", "hybrid")
ROUTER_METHODS = ("centroid", "nearest", "none")
CHUNKER_VERSION = 1  # bump when chunking changes, so cached chunks are rebuilt
Hits = list[tuple[int, float]]


class Embedded:
    """One encoder's query vectors, and each query's share of the encoding time."""

    def __init__(self, vectors: dict[str, np.ndarray], encode_ms: float) -> None:
        self.vectors = vectors
        self.encode_ms = encode_ms

    def get(self, query_id: str) -> np.ndarray:
        try:
            return self.vectors[query_id]
        except KeyError:
            raise RuntimeError(f"no query embedding for {query_id}") from None


class LocalTarget:
    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        from rag_ablate.pipeline.rerank import RERANKERS

        self.s = settings
        r = settings.retrieval
        if r.method not in RETRIEVAL_METHODS:
            raise UnknownNameError("retrieval method", r.method, RETRIEVAL_METHODS)
        if settings.router.method not in ROUTER_METHODS:
            raise UnknownNameError("router", settings.router.method, ROUTER_METHODS)
        if r.hybrid.fusion not in FUSIONS:
            raise UnknownNameError("fusion", r.hybrid.fusion, FUSIONS)
        if settings.rerank.method not in RERANKERS:
            raise UnknownNameError("reranker", settings.rerank.method, RERANKERS)
        self.cache = cache or Cache(Path("outputs") / "cache", enabled=False)
        self.chunks: list[Chunk] = []
        self.tiebreak = np.zeros(0, dtype=np.int64)
        self.bm25: BM25Retriever | None = None
        self.dense: Any = None  # DenseIndex
        self.dense_q: Embedded | None = None  # query embeddings of the dense retriever
        self.rerank_emb: tuple[np.ndarray, Embedded] | None = None  # biencoder: passages and queries
        self.reranker: Any = None
        self.router: IntentRouter | None = None

    @property
    def routes_intents(self) -> bool:
        return self.router is not None

    # ------------------------------------------------------------------ build

    def _chunk(self, dataset: Dataset) -> tuple[str, dict[str, Any]]:
        c = self.s.chunk
        docs = list(dataset.documents.values())
        unit = c.unit if c.unit != "auto" else detect_unit(d.text for d in docs)
        parts = {
            "corpus": dataset.corpus_fingerprint,
            "size": c.size,
            "overlap": c.overlap,
            "unit": unit,
            "snap": c.snap,
            "version": CHUNKER_VERSION,
        }

        def build() -> list[list[Any]]:
            chunks, _ = chunk_corpus(docs, c.size, c.overlap, unit, c.snap)
            return [[ch.doc_id, ch.start, ch.end] for ch in chunks]

        rows = self.cache.json("chunks", parts, build)
        counters: dict[str, int] = {}
        self.chunks = []
        for doc_id, start, end in rows:
            i = counters.get(doc_id, 0)
            counters[doc_id] = i + 1
            d = dataset.documents[doc_id]
            self.chunks.append(Chunk(f"{doc_id}#{i}", doc_id, start, end, d.text[start:end], d.title))
        order = sorted(range(len(self.chunks)), key=lambda j: (self.chunks[j].doc_id, j))
        self.tiebreak = np.empty(len(self.chunks), dtype=np.int64)
        self.tiebreak[order] = np.arange(len(self.chunks))
        return unit, parts

    def _texts(self) -> list[str]:
        return [ch.index_text(self.s.chunk.include_title) for ch in self.chunks]

    def _bm25(self, chunk_parts: dict[str, Any], language: str) -> tuple[str, int]:
        import bm25s

        b = self.s.retrieval.bm25
        analyzer_name = b.analyzer if b.analyzer != "auto" else language
        analyzer = get_analyzer(analyzer_name)
        parts = {
            "chunks": chunk_parts,
            "include_title": self.s.chunk.include_title,
            "analyzer": analyzer_name,
            "k1": b.k1,
            "b": b.b,
            "method": b.method,
            "bm25s": bm25s.__version__,
        }
        texts = self._texts()
        keys = [(ch.doc_id, int(ch.chunk_id.rsplit("#", 1)[1])) for ch in self.chunks]

        def build(folder: Path) -> None:
            BM25Retriever(
                texts, keys, analyzer, k1=b.k1, b=b.b, method=b.method, show_progress=self.s.progress
            ).save(folder)

        folder = self.cache.folder("bm25", parts, build)
        self.bm25 = BM25Retriever.load(folder, keys, analyzer)
        return analyzer_name, self.bm25.nbytes

    def _encoder_name(self, configured: str, language: str) -> str:
        from rag_ablate.pipeline.encoders import default_encoder

        return default_encoder(language) if configured == "auto" else configured

    def _embed(
        self, dataset: Dataset, chunk_parts: dict[str, Any], encoder_name: str
    ) -> tuple[np.ndarray, Embedded, str]:
        """Passage and query embeddings of one encoder, from the cache when present."""
        from rag_ablate.pipeline.encoders import load_encoder

        enc = load_encoder(encoder_name)
        bs = self.s.retrieval.dense.batch_size
        texts = self._texts()
        passages = self.cache.array(
            "embeddings",
            {"chunks": chunk_parts, "include_title": self.s.chunk.include_title, "model": enc.model_id},
            lambda: enc.encode_passages(texts, batch_size=bs, progress=self.s.progress),
        )
        queries = [q.query for q in dataset.queries]
        qparts = {"queries": dataset.queries_fingerprint, "n": len(queries), "model": enc.model_id}
        before = self.cache.stats.get("query_embeddings")
        stored_before = before.stored_build_seconds if before else 0.0
        qmat = self.cache.array(
            "query_embeddings",
            qparts,
            lambda: enc.encode_queries(queries, batch_size=bs, progress=self.s.progress),
        )
        stored = self.cache.stats["query_embeddings"].stored_build_seconds - stored_before
        vectors = {q.query_id: qmat[i] for i, q in enumerate(dataset.queries)}
        return passages, Embedded(vectors, 1000.0 * stored / max(1, len(queries))), enc.model_id

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        s = self.s
        method = s.retrieval.method
        t0 = time.perf_counter()
        unit, chunk_parts = self._chunk(dataset)
        language = (
            "zh"
            if unit == "char" or is_cjk_text(next(iter(dataset.documents.values())).text[:2000])
            else "en"
        )
        info: dict[str, Any] = {
            "chunk.unit_resolved": unit,
            "dataset.language": language,
            "index.chunks": len(self.chunks),
        }
        nbytes = 0
        if method in ("bm25", "hybrid"):
            info["retrieval.bm25.analyzer_resolved"], size = self._bm25(chunk_parts, language)
            nbytes += size
        dense_encoder = None
        if method in ("dense", "hybrid"):
            from rag_ablate.pipeline.dense import DenseIndex

            dense_encoder = self._encoder_name(s.retrieval.dense.encoder, language)
            passages, self.dense_q, model_id = self._embed(dataset, chunk_parts, dense_encoder)
            info["retrieval.dense.encoder_resolved"] = dense_encoder
            info["retrieval.dense.model_id"] = model_id
            self.dense = DenseIndex(passages, self.tiebreak, kind=s.retrieval.dense.index)
            nbytes += int(self.dense.nbytes)
        rr = s.rerank
        if rr.method == "biencoder":
            name = self._encoder_name(rr.encoder, language)
            passages, queries, model_id = self._embed(dataset, chunk_parts, name)
            self.rerank_emb = (passages, queries)
            info["rerank.encoder_resolved"] = name
            info["rerank.model_id"] = model_id
        elif rr.method != "none":
            from rag_ablate.pipeline.rerank import make_reranker

            kwargs: dict[str, Any]
            if rr.method == "http":
                if not rr.url:
                    raise ConfigError("rerank=http needs rerank.url")
                kwargs = {
                    "url": rr.url,
                    "model": rr.model,
                    "timeout": rr.timeout,
                    "api_key_env": rr.api_key_env,
                }
            else:
                if not rr.model_path:
                    raise ConfigError(
                        "rerank=cross_encoder needs rerank.model_path (a local CrossEncoder folder)"
                    )
                kwargs = {"model_path": rr.model_path}
            self.reranker = make_reranker(rr.method, **kwargs)
        if s.router.method != "none" and dataset.intents:
            self.router = IntentRouter(list(dataset.intents.values()), s.router.ngram, s.router.method)
        info["index.build_seconds"] = round(time.perf_counter() - t0, 4)
        info["index.bytes"] = nbytes
        return info

    def close(self) -> None:
        """Release connections (an HTTP reranker's client)."""
        close = getattr(self.reranker, "close", None)
        if callable(close):
            close()

    # ------------------------------------------------------------------ query

    def _depth(self) -> int:
        return self.s.rerank.candidates if self.s.rerank.method != "none" else self.s.retrieval.top_k

    def run(self, query: Query) -> Trace:
        s = self.s
        trace = Trace(query.query_id)
        timings: dict[str, float] = {}
        t_start = time.perf_counter()
        if self.router is not None:
            trace.intent_pred, trace.intent_score = self.router.route(query.query)
        timings["route"] = (time.perf_counter() - t_start) * 1000
        depth = self._depth()
        method = s.retrieval.method
        runs: list[Hits] = []
        if self.bm25 is not None:
            t = time.perf_counter()
            k = s.retrieval.hybrid.depth_bm25 if method == "hybrid" else depth
            runs.append(self.bm25.search(query.query, k))
            timings["bm25"] = (time.perf_counter() - t) * 1000
        encode_ms = 0.0
        if self.dense is not None and self.dense_q is not None:
            qvec = self.dense_q.get(query.query_id)
            encode_ms += self.dense_q.encode_ms
            t = time.perf_counter()
            k = s.retrieval.hybrid.depth_dense if method == "hybrid" else depth
            runs.append(self.dense.search(qvec, k))
            timings["dense"] = (time.perf_counter() - t) * 1000
        if method == "hybrid":
            t = time.perf_counter()
            h = s.retrieval.hybrid
            hits = fuse(h.fusion, runs, self.tiebreak, depth, rrf_k=h.rrf_k, weights=[1 - h.weight, h.weight])
            timings["fuse"] = (time.perf_counter() - t) * 1000
        else:
            hits = runs[0]
        if s.rerank.method != "none":
            t = time.perf_counter()
            hits = self._rerank(query, hits)
            timings["rerank"] = (time.perf_counter() - t) * 1000
            if self.rerank_emb is not None and self.rerank_emb[1] is not self.dense_q:
                encode_ms += self.rerank_emb[1].encode_ms
        if encode_ms:
            timings["encode"] = encode_ms
        for rank, (i, score) in enumerate(hits, start=1):
            c = self.chunks[i]
            trace.retrieved.append(RetrievedChunk(rank, c.chunk_id, c.doc_id, c.start, c.end, float(score)))
        timings["total"] = (time.perf_counter() - t_start) * 1000 + timings.get("encode", 0.0)
        trace.timings_ms = timings
        return trace

    def _rerank(self, query: Query, hits: Hits) -> Hits:
        top_k = self.s.rerank.top_k
        if not hits:
            return []
        idx = [i for i, _ in hits]
        if self.rerank_emb is not None:
            passages, queries = self.rerank_emb
            scores = passages[idx] @ queries.get(query.query_id)
            order = sorted(range(len(idx)), key=lambda j: (-float(scores[j]), int(self.tiebreak[idx[j]])))
            return [(idx[j], float(scores[j])) for j in order[:top_k]]
        texts = [self.chunks[i].index_text(self.s.chunk.include_title) for i in idx]
        ranked = self.reranker.rerank(query.query, texts, top_k)
        return [(idx[j], float(score)) for j, score in ranked]
