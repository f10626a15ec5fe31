"""The built-in pipeline as a system (``system=local``): chunk, index, route, retrieve, fuse, rerank.

Everything expensive (chunks, BM25 index, passage and query embeddings) comes
from the content-addressed cache, so a ``rerank.top_k`` sweep encodes the corpus
once and a ``chunk`` sweep once per chunking.

The stages come from the registries in :mod:`rag_ablate.pipeline.stages`
(``retrieval.method`` from RETRIEVERS, ``rerank.method`` from RERANKERS,
``router.method`` from ROUTERS); this module offers them the cached chunks,
BM25 index and embeddings (:class:`~rag_ablate.pipeline.stages.Resources`) and
never branches on a stage's name.

Stage timings per query (milliseconds): ``route``, ``encode`` (the query's share
of encoding its embedding, measured when it was computed, so cold and warm runs
report the same cost; an encoder used by two stages counts once), ``bm25``,
``dense``, ``fuse``, ``acl_filter`` (with ``retrieval.acl_filter``), ``rerank``,
``generate`` (when ``generator`` is not ``none``: the configured generator answers from
the retrieved chunks, filling the trace's answer, citations and usage) and ``total``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import GenerationError, RunStopError
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context, Generator
from rag_ablate.metrics.acl import may_see
from rag_ablate.pipeline.bm25 import BM25Retriever, ScoreMatrix, bm25_key_parts
from rag_ablate.pipeline.chunking import (
    Chunks,
    ChunkSpans,
    ChunkTokenCounts,
    IndexTexts,
    chunk_key_parts,
    chunk_spans,
    detect_unit,
    tiebreak_ranks,
)
from rag_ablate.pipeline.stages import (
    RERANKERS,
    RETRIEVERS,
    ROUTERS,
    Embedded,
    Embeddings,
    Hits,
    QueryState,
    RerankStage,
    Retriever,
    Router,
)
from rag_ablate.pipeline.tokens import TokenMatrix, tokens_key_parts
from rag_ablate.records.trace import ContextChunk, RetrievedChunk, TokenUsage, Trace
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import OnDone
from rag_ablate.text.analyzers import get_analyzer
from rag_ablate.text.count import is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.pipeline.dense import DenseIndex


@SYSTEMS.register("local")
class LocalSystem:
    """rag_ablate's own pipeline: a :class:`~rag_ablate.systems.base.System` and the stages' Resources."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        self.s = settings
        self.cache = cache or Cache(Path("outputs") / "cache", enabled=False)
        self.chunks = Chunks([], ChunkSpans.empty())  # a lazy Sequence[Chunk] over compact arrays
        # (doc_id, start, end) -> count_tokens of the chunk's text (no title); empty until prepare()
        self.chunk_token_counts: Mapping[tuple[str, int, int], int] = {}
        self.tiebreak = np.zeros(0, dtype=np.int64)
        self.language = "en"
        self._dataset: Dataset | None = None
        self._chunk_parts: dict[str, Any] = {}
        self._embeddings: dict[str, Embeddings] = {}  # per resolved encoder name
        self._passage_parts: dict[str, dict[str, Any]] = {}  # per encoder: its passage embeddings' key
        self._dense: dict[str, tuple[DenseIndex, str]] = {}  # per encoder: the dense index and its kind
        self._hidden: dict[frozenset[str], frozenset[int]] = {}  # acl_filter: user groups -> hidden chunks
        self.bm25: BM25Retriever | None = None
        self.retriever: Retriever = RETRIEVERS.get(settings.retrieval.method)(settings)
        self.reranker: RerankStage | None = RERANKERS.get(settings.rerank.method)(settings)
        self.router: Router | None = None
        self.generator: Generator | None = GENERATORS.get(settings.generator.name)(settings, self.cache)
        self.versions: dict[str, str] = {}  # every trace's version tags, set by prepare()
        if self.generator is not None and settings.generator.concurrency > 1:
            self.run_many = self._run_concurrently  # the runner hands over every query at once

    @property
    def routes_intents(self) -> bool:
        return self.router is not None

    @property
    def generates_answers(self) -> bool:
        """A generator answers each query (a failed query then misses the answer metrics)."""
        return self.generator is not None

    # ------------------------------------------------------------------ build

    def _chunk(self, dataset: Dataset) -> tuple[str, dict[str, Any]]:
        c = self.s.chunk
        docs = list(dataset.documents.values())
        unit = c.unit if c.unit != "auto" else detect_unit(d.text for d in docs)
        parts = chunk_key_parts(c, dataset.corpus_fingerprint, unit)

        def build(folder: Path) -> None:
            chunk_spans(docs, c.size, c.overlap, unit, c.snap).save(folder)

        try:
            spans = ChunkSpans.load(self.cache.folder("chunks", parts, build), len(docs))
        except ValueError:  # an entry of an older layout (a JSON list) or a damaged one: build it again
            self.cache.discard("chunks", parts)
            spans = ChunkSpans.load(self.cache.folder("chunks", parts, build), len(docs))
        self.chunks = Chunks(docs, spans)
        self.chunk_token_counts = ChunkTokenCounts(self.chunks)
        self.tiebreak = tiebreak_ranks(docs, spans)
        return unit, parts

    def _texts(self) -> IndexTexts:
        """Each chunk's indexed text, sliced from its document when read (no copy of the corpus)."""
        return IndexTexts(self.chunks, self.s.chunk.include_title)

    def _bm25(self, chunk_parts: dict[str, Any], language: str) -> tuple[str, int]:
        """The BM25 index (``bm25`` cache stage), built from the chunks' analysed tokens
        (``tokens`` stage: analysed once per chunking and analyzer, shared by every k1, b and
        method). The tokens entry is asked for first, so a warm run finds both and reads
        only the index."""
        b = self.s.retrieval.bm25
        analyzer_name = b.analyzer if b.analyzer != "auto" else language
        analyzer = get_analyzer(analyzer_name)
        include_title = self.s.chunk.include_title

        def analyse(folder: Path) -> None:  # reads the texts once, in batches
            TokenMatrix.build(self.texts(), analyzer, progress=self.s.progress).save(folder)

        token_parts = tokens_key_parts(analyzer_name, chunk_parts, include_title)
        tokens = self.cache.folder("tokens", token_parts, analyse)

        def build(folder: Path) -> None:
            matrix = ScoreMatrix.from_tokens(TokenMatrix.load(tokens), k1=b.k1, b=b.b, method=b.method)
            matrix.save(folder)

        parts = bm25_key_parts(b, analyzer_name, chunk_parts, include_title)
        folder = self.cache.folder("bm25", parts, build)
        self.bm25 = BM25Retriever.load(folder, self.tiebreak, analyzer)
        return analyzer_name, self.bm25.nbytes

    def _embed(
        self, dataset: Dataset, chunk_parts: dict[str, Any], encoder_name: str
    ) -> tuple[np.ndarray, Embedded, str]:
        """Passage and query embeddings of one encoder, from the cache when present."""
        from rag_ablate.pipeline.encoders import (
            load_encoder,
            passage_embedding_key_parts,
            query_embedding_key_parts,
        )

        enc = load_encoder(encoder_name)
        bs = self.s.retrieval.dense.batch_size
        texts = self._texts()

        def fill_passages(out: np.ndarray) -> None:  # batch by batch into the (memory-mapped) matrix
            got = enc.encode_passages(texts, batch_size=bs, progress=self.s.progress, out=out)
            if got is not out:  # an encoder that returns its own array
                out[...] = got

        pparts = passage_embedding_key_parts(enc.settings, chunk_parts, self.s.chunk.include_title, bs)
        self._passage_parts[encoder_name] = pparts
        passages = self.cache.matrix(
            "embeddings",
            pparts,
            (len(texts), enc.dim),
            fill_passages,
        )
        queries = [q.query for q in dataset.queries]
        qparts = query_embedding_key_parts(enc.settings, queries, bs)
        before = self.cache.stats.get("query_embeddings")
        stored_before = before.stored_build_seconds if before else 0.0

        def fill_queries(out: np.ndarray) -> None:
            got = enc.encode_queries(queries, batch_size=bs, progress=self.s.progress, out=out)
            if got is not out:
                out[...] = got

        qmat = self.cache.matrix("query_embeddings", qparts, (len(queries), enc.dim), fill_queries)
        stored = self.cache.stats["query_embeddings"].stored_build_seconds - stored_before
        vectors = {q.query_id: qmat[i] for i, q in enumerate(dataset.queries)}
        counts = enc.count_tokens(queries, query=True)  # each query's embedding tokens (usage)
        tokens = {q.query_id: counts[i] for i, q in enumerate(dataset.queries)}
        return passages, Embedded(vectors, 1000.0 * stored / max(1, len(queries)), tokens), enc.model_id

    # ------------------------------------------------------------------ resources for the stages

    def texts(self) -> IndexTexts:
        return self._texts()

    def bm25_index(self) -> tuple[BM25Retriever, str]:
        analyzer, _ = self._bm25(self._chunk_parts, self.language)
        if self.bm25 is None:
            raise RuntimeError("the BM25 index was not built")
        return self.bm25, analyzer

    def embeddings(self, encoder: str) -> Embeddings:
        if encoder not in self._embeddings:
            if self._dataset is None:
                raise RuntimeError("embeddings are asked for before prepare()")
            passages, queries, model_id = self._embed(self._dataset, self._chunk_parts, encoder)
            self._embeddings[encoder] = Embeddings(passages, queries, model_id)
        return self._embeddings[encoder]

    def dense_index(self, encoder: str) -> tuple[DenseIndex, str]:
        """The dense index over ``encoder``'s passage embeddings and its kind: ``retrieval.dense.index``,
        with ``auto`` resolved by the number of chunks (:func:`~rag_ablate.pipeline.dense.choose_index`).
        A usearch graph is a cache entry (``dense_graph``): built once per embeddings and settings."""
        if encoder not in self._dense:
            from rag_ablate.pipeline.dense import DenseIndex, choose_index, graph_key_parts

            d = self.s.retrieval.dense
            passages = self.embeddings(encoder).passages
            kind = choose_index(d.index, passages.shape[0], d.approximate_above)
            if kind != "usearch":
                index = DenseIndex(passages, self.tiebreak, kind=kind)
            else:
                parts = graph_key_parts(self._passage_parts[encoder], d.build_threads)

                def build(folder: Path) -> None:
                    index = DenseIndex(passages, self.tiebreak, kind=kind, threads=d.build_threads)
                    index.save_graph(folder / "graph.usearch")

                folder = self.cache.folder("dense_graph", parts, build)
                index = DenseIndex(passages, self.tiebreak, kind=kind, graph=folder / "graph.usearch")
            self._dense[encoder] = (index, kind)
        return self._dense[encoder]

    # ------------------------------------------------------------------ system contract

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        t0 = time.perf_counter()
        self._dataset = dataset
        self._hidden = {}
        unit, self._chunk_parts = self._chunk(dataset)
        self.language = (
            "zh"
            if unit == "char" or is_cjk_text(next(iter(dataset.documents.values())).text[:2000])
            else "en"
        )
        info: dict[str, Any] = {
            "chunk.unit_resolved": unit,
            "dataset.language": self.language,
            "index.chunks": len(self.chunks),
        }
        info.update(self.retriever.prepare(self))
        if self.reranker is not None:
            info.update(self.reranker.prepare(self))
        if dataset.intents:
            self.router = ROUTERS.get(self.s.router.method)(self.s, list(dataset.intents.values()))
        self.versions = self._versions(dataset)
        info["index.build_seconds"] = round(time.perf_counter() - t0, 4)
        info["index.bytes"] = self.retriever.nbytes
        if dataset.queries:
            t_warm = time.perf_counter()
            self._warm(dataset.queries[0])
            info["index.warmup_seconds"] = round(time.perf_counter() - t_warm, 4)
        return info

    def _versions(self, dataset: Dataset) -> dict[str, str]:
        """The version tags every trace reports (see the module docstring)."""
        index = {
            "corpus": dataset.corpus_fingerprint,
            "chunks": self._chunk_parts,
            "retrieval": dataclasses.asdict(self.s.retrieval),
            "rerank": dataclasses.asdict(self.s.rerank),
        }
        payload = json.dumps(index, sort_keys=True, default=str).encode("utf-8")
        out = {"corpus": dataset.corpus_fingerprint[:16], "index": hashlib.sha256(payload).hexdigest()[:16]}
        if self.generator is not None:
            prompt = getattr(self.generator, "prompt_hash", None)
            if isinstance(prompt, str):
                out["prompt"] = prompt
            out["model"] = self.s.generator.model or self.s.generator.name
        return out

    def _warm(self, query: Query) -> None:
        """Run ``query`` through every retrieval stage once, untimed, and forget the result.

        What loads on first use (jieba's dictionary for the BM25 query analyzer, a model's
        first batch, an HTTP reranker's connection) then loads here, not inside the first
        timed query. A failure here is ignored: the same query, timed, records it. The
        generator is left out: it is the one stage that may call a paid model, and a replayed
        answer would mark the real query as cached.
        """
        state = QueryState(query)
        try:
            if self.router is not None:
                self.router.route(query.query)
            hits = self._retrieve(state, self._depth())
            if self.reranker is not None:
                self.reranker.rerank(state, hits, self.s.rerank.top_k)
        except Exception:  # a stage that fails here fails again, recorded, in its query
            pass

    def close(self) -> None:
        """Release connections (an HTTP reranker's client)."""
        if self.reranker is not None:
            self.reranker.close()
        close_generator = getattr(self.generator, "close", None)  # a model endpoint's client
        if close_generator is not None:
            close_generator()

    def _depth(self) -> int:
        """Candidates asked of the retriever: the reranker's when there is one."""
        return self.s.rerank.candidates if self.reranker is not None else self.s.retrieval.top_k

    def _hidden_chunks(self, user_groups: tuple[str, ...] | None) -> frozenset[int]:
        """The chunks a user in ``user_groups`` may not see (computed once per set of groups)."""
        key = frozenset(user_groups or ())
        hidden = self._hidden.get(key)
        if hidden is None:
            docs = self.chunks.docs
            hidden_docs = [d for d, doc in enumerate(docs) if not may_see(doc.allowed_groups, key)]
            rows = np.flatnonzero(np.isin(self.chunks.spans.doc, hidden_docs))
            hidden = frozenset(int(i) for i in rows)
            self._hidden[key] = hidden
        return hidden

    def _retrieve(self, state: QueryState, depth: int) -> Hits:
        """The first ``depth`` candidates, after fusion and before rerank; with
        ``retrieval.acl_filter`` only chunks the query's user may see (docs/metrics.md
        "Access control"). The retriever is then asked for ``depth`` plus the number of
        chunks the user may not see (hybrid adds it to both of its depths), so the filtered
        list still holds ``depth`` chunks whenever the corpus has that many visible ones."""
        if not self.s.retrieval.acl_filter:
            return self.retriever.search(state, depth)
        hidden = self._hidden_chunks(state.query.user_groups)
        if not hidden:
            return self.retriever.search(state, depth)
        state.extra_depth = len(hidden)
        hits = self.retriever.search(state, depth + len(hidden))
        t = time.perf_counter()
        kept = [h for h in hits if h[0] not in hidden][:depth]
        state.timed("acl_filter", t)
        return kept

    def _chunks_of(self, hits: Hits) -> list[RetrievedChunk]:
        """Ranked hits as the trace reports them."""
        located = zip(self.chunks.locate([i for i, _ in hits]), hits, strict=True)
        return [
            RetrievedChunk(rank, chunk_id, doc_id, start, end, float(score))
            for rank, ((chunk_id, doc_id, start, end), (_, score)) in enumerate(located, 1)
        ]

    def run(self, query: Query) -> Trace:
        return self._answer(query, self._retrieve_query(query))

    def _retrieve_query(self, query: Query) -> _Retrieved:
        """Every stage before the generator: the trace with its retrieved chunks."""
        trace = Trace(query.query_id)
        state = QueryState(query)
        t_start = time.perf_counter()
        if self.router is not None:
            intent, trace.intent_score = self.router.route(query.query)
            trace.intents = [intent] if intent is not None else []
            trace.intent_pred = intent
        state.timed("route", t_start)
        trace.rewritten_query = query.query
        trace.filters = {"user_groups": list(query.user_groups or ())} if self.s.retrieval.acl_filter else {}
        trace.versions = dict(self.versions)
        hits = self._retrieve(state, self._depth())
        candidates = trace.candidates = self._chunks_of(hits)
        if self.reranker is not None:
            t = time.perf_counter()
            hits = self.reranker.rerank(state, hits, self.s.rerank.top_k)
            state.timed("rerank", t)
        trace.retrieved = self._chunks_of(hits) if self.reranker is not None else list(candidates)
        return _Retrieved(trace, state, hits, (time.perf_counter() - t_start) * 1000)

    def _answer(self, query: Query, done: _Retrieved) -> Trace:
        """The generator's answer from the retrieved chunks (when there is a generator); the timings."""
        trace, state, hits = done.trace, done.state, done.hits
        t_start = time.perf_counter()  # the query's total: the retrieval's time plus the time from here
        timings = state.timings
        encode_ms = sum(state.encoded.values())
        if encode_ms:
            timings["encode"] = encode_ms
        spent_ms = done.retrieval_ms + encode_ms
        retrieved = trace.retrieved or []
        replayed_ms = 0.0  # a cached model call: its original time minus the replay's
        if self.generator is not None:
            t = time.perf_counter()
            contexts = [
                Context(r.rank, r.chunk_id, self.chunks[i].doc_id, r.start, r.end, self.chunks[i].text)
                for r, (i, _) in zip(retrieved, hits, strict=True)
            ]
            given = [ContextChunk.of(r, c.text) for r, c in zip(retrieved, contexts, strict=True)]
            trace.context = given
            try:
                gen = self.generator.generate(query.query, contexts, repeat=query.repeat or 0)
            except GenerationError as exc:  # the model endpoint failed: keep the retrieval, say what
                trace.status, trace.error, trace.http_status = exc.status, f"generate: {exc}", exc.http_status
                timings["generate"] = (time.perf_counter() - t) * 1000
                timings["total"] = (time.perf_counter() - t_start) * 1000 + spent_ms
                trace.timings_ms = timings
                return trace
            timings["generate"] = (time.perf_counter() - t) * 1000
            if gen.n_read is not None:  # the chunks the generator read: the context after its cut
                trace.context = given[: gen.n_read]
            if gen.cached and gen.latency_ms is not None:  # a replayed model call reports the original time
                replayed_ms = gen.latency_ms - timings["generate"]
                timings["generate"] = gen.latency_ms
            trace.cached = gen.cached
            trace.answer, trace.citations, trace.usage = gen.answer, gen.citations, gen.usage
            trace.usage_count, trace.ttft_ms = gen.usage_count, gen.ttft_ms
        if state.embedding_tokens:  # the query's embedding tokens (dense retrieval, bi-encoder rerank)
            usage = trace.usage or TokenUsage()
            trace.usage = dataclasses.replace(usage, embedding_tokens=sum(state.embedding_tokens.values()))
        timings["total"] = (time.perf_counter() - t_start) * 1000 + spent_ms + replayed_ms
        trace.timings_ms = timings
        return trace

    def _run_concurrently(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """``generator.concurrency`` > 1 (the runner calls this instead of :meth:`run`): each query's
        retrieval runs here, in query order, and its answer in one of ``generator.concurrency``
        threads, so that many model calls are in flight; ``on_done`` runs here as answers complete
        (the run's records are rewritten in query order at its end). A query that raises is failed,
        a :class:`~rag_ablate.core.errors.RunStopError` (an endpoint that is down, the spend
        limit) stops the run."""
        n = self.s.generator.concurrency
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="generate")
        pending: dict[Future[Trace], Query] = {}

        def settle(timeout: float | None) -> None:
            finished, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
            for future in finished:
                query = pending.pop(future)
                on_done(query, _outcome(query, future.result))

        try:
            for query in queries:
                while len(pending) >= 2 * n:  # retrieval stays a little ahead of the model calls
                    settle(None)
                t0 = time.perf_counter()
                try:
                    done = self._retrieve_query(query)
                except RunStopError:
                    raise
                except Exception as exc:
                    on_done(query, _failed(query, exc, (time.perf_counter() - t0) * 1000))
                    continue
                pending[pool.submit(self._answer, query, done)] = query
                settle(0)
            while pending:
                settle(None)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


@dataclasses.dataclass
class _Retrieved:
    """A query after every stage before the generator."""

    trace: Trace
    state: QueryState
    hits: Hits
    retrieval_ms: float


def _failed(query: Query, exc: Exception, elapsed_ms: float) -> Trace:
    """The trace of a query whose system raised (as the runner records one)."""
    error = f"{type(exc).__name__}: {exc}"
    return Trace(query.query_id, status="failed", error=error, timings_ms={"total": elapsed_ms})


def _outcome(query: Query, result: Callable[[], Trace]) -> Trace:
    """A query's trace from its answer's future; raised errors become a failed trace, except an
    endpoint that is down, which stops the run."""
    try:
        return result()
    except RunStopError:
        raise
    except Exception as exc:
        return _failed(query, exc, 0.0)
