"""The pluggable stages of the local pipeline, and one registry per kind.

    RETRIEVERS   ``retrieval.method``       factory(settings) -> Retriever
    FUSIONS      ``retrieval.hybrid.fusion`` fusion(runs, tiebreak, k, rrf_k=, weights=) -> hits
    RERANKERS    ``rerank.method``          factory(settings) -> RerankStage, or None for "none"
    ENCODERS     ``*.encoder``              loader(configured name) -> Encoder
    ROUTERS      ``router.method``          factory(settings, intents) -> Router, or None for "none"

Each implementation registers itself with a decorator in its own module
(``@RETRIEVERS.register("bm25")``). The registries' providers are every module
of :mod:`rag_ablate.pipeline` and its subpackages (retrievers live in
:mod:`rag_ablate.pipeline.retrievers`), found on disk and imported on the first
lookup, so a new stage is a new module plus its ``conf/<group>/<name>.yaml``;
nothing else names it. Pipeline modules import heavy libraries (torch,
sentence-transformers) only inside functions, so a lookup stays cheap.

Stages get what the local system has built (chunks, the BM25 index,
embeddings, all from the cache) through :class:`Resources`; per query they
write their timings into :class:`QueryState`. See docs/architecture.md.
"""

from __future__ import annotations

import os
import pkgutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from rag_ablate import pipeline as _package
from rag_ablate.core.registry import Registry

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.model import Intent, Query
    from rag_ablate.pipeline.bm25 import BM25Retriever
    from rag_ablate.pipeline.chunking import Chunk
    from rag_ablate.pipeline.dense import DenseIndex

Hits = list[tuple[int, float]]  # (chunk index, score), best first
Run = Sequence[tuple[int, float]]

AUTO = "auto"  # an encoder setting resolved from the corpus language


def _modules(name: str, path: Sequence[str]) -> Iterator[str]:
    """Modules of a package and of its subpackages, found on disk without importing them."""
    for m in pkgutil.iter_modules(path):
        if m.name.startswith("_") or m.name == "stages":
            continue
        yield f"{name}.{m.name}"
        if m.ispkg:
            yield from _modules(f"{name}.{m.name}", [os.path.join(p, m.name) for p in path])


PIPELINE_MODULES: tuple[str, ...] = tuple(_modules(_package.__name__, list(_package.__path__)))


class Embedded:
    """One encoder's query vectors, each query's share of the encoding time, and the tokens the
    encoder read for each query (its tokenizer's count, prefix and special tokens included)."""

    def __init__(
        self, vectors: dict[str, np.ndarray], encode_ms: float, tokens: dict[str, int] | None = None
    ) -> None:
        self.vectors = vectors
        self.encode_ms = encode_ms
        self.tokens = tokens or {}

    def get(self, query_id: str) -> np.ndarray:
        try:
            return self.vectors[query_id]
        except KeyError:
            raise RuntimeError(f"no query embedding for {query_id}") from None


@dataclass(frozen=True)
class Embeddings:
    """Passage rows (one per chunk) and query vectors of one encoder."""

    passages: np.ndarray
    queries: Embedded
    model_id: str


class Resources(Protocol):
    """What the local system offers its stages once the corpus is chunked."""

    @property
    def chunks(self) -> Sequence[Chunk]:
        """The chunks, in index order (a lazy sequence: index it, don't copy it)."""
        ...

    tiebreak: np.ndarray  # per chunk: its position in (doc_id, chunk number) order, breaks score ties
    language: str  # "zh" or "en", detected from the corpus

    def texts(self) -> Sequence[str]:
        """Each chunk's indexed text (title prefixed when chunk.include_title); a lazy sequence:
        iterate it or index it in batches, never ``list()`` it for a large corpus."""
        ...

    def bm25_index(self) -> tuple[BM25Retriever, str]:
        """The BM25 index over the chunks and the analyzer it uses."""
        ...

    def embeddings(self, encoder: str) -> Embeddings:
        """Passage and query embeddings of a resolved encoder name (built once per name)."""
        ...

    def dense_index(self, encoder: str) -> tuple[DenseIndex, str]:
        """The dense index over a resolved encoder's passages and its kind (exact or usearch)."""
        ...


@dataclass
class QueryState:
    """One query on its way through the stages."""

    query: Query
    timings: dict[str, float] = field(default_factory=dict)  # stage -> milliseconds
    encoded: dict[int, float] = field(default_factory=dict)  # per query-vector set: encode ms, counted once
    embedding_tokens: dict[int, int] = field(default_factory=dict)  # per query-vector set: tokens read
    extra_depth: int = 0  # retrieval.acl_filter: chunks the user may not see, added to every candidate depth

    def charge_encoding(self, vectors: Embedded) -> None:
        """Count this query's share of encoding ``vectors`` and the tokens its encoder read (once,
        however many stages use them)."""
        self.encoded[id(vectors)] = vectors.encode_ms
        tokens = vectors.tokens.get(self.query.query_id)
        if tokens is not None:
            self.embedding_tokens[id(vectors)] = tokens

    def timed(self, stage: str, start: float) -> None:
        """Record ``stage`` as having run from ``start`` (a perf_counter value) until now."""
        self.timings[stage] = (time.perf_counter() - start) * 1000


class Retriever(Protocol):
    """A first-stage retriever (``retrieval.method``)."""

    def prepare(self, res: Resources) -> dict[str, Any]:
        """Build or load the index; return facts worth logging (resolved settings)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes of the index in memory (0 before prepare)."""
        ...

    def search(self, state: QueryState, k: int) -> Hits:
        """The ``k`` best chunks for ``state.query``, recording this stage's timing."""
        ...


class RerankStage(Protocol):
    """A second stage that re-scores the first stage's candidates (``rerank.method``)."""

    def prepare(self, res: Resources) -> dict[str, Any]: ...

    def rerank(self, state: QueryState, hits: Hits, top_k: int) -> Hits: ...

    def close(self) -> None: ...


class Fusion(Protocol):
    """Fuses ranked runs into one list of ``k`` (``retrieval.hybrid.fusion``)."""

    def __call__(
        self, runs: Sequence[Run], tiebreak: np.ndarray, k: int, *, rrf_k: float, weights: Sequence[float]
    ) -> Hits: ...


class Router(Protocol):
    """Predicts a query's leaf intent (``router.method``)."""

    def route(self, query: str) -> tuple[str | None, float]: ...


RetrieverFactory = Callable[["RunConfig"], Retriever]
RerankerFactory = Callable[["RunConfig"], RerankStage | None]
RouterFactory = Callable[["RunConfig", Sequence["Intent"]], Router | None]
EncoderLoader = Callable[[str], "Encoder"]

RETRIEVERS: Registry[RetrieverFactory] = Registry("retriever", providers=PIPELINE_MODULES)
FUSIONS: Registry[Fusion] = Registry("fusion", providers=PIPELINE_MODULES)
RERANKERS: Registry[RerankerFactory] = Registry("reranker", providers=PIPELINE_MODULES)
ENCODERS: Registry[EncoderLoader] = Registry("encoder", providers=PIPELINE_MODULES)
ROUTERS: Registry[RouterFactory] = Registry("router", providers=PIPELINE_MODULES)

ST_PREFIX = "st:"
ST_ENCODER = "st:<folder>"  # registry name of the family "st:/path/to/model"


def encoder_key(name: str) -> str:
    """The registry name of a configured encoder: ``st:/a/b`` -> ``st:<folder>``."""
    return ST_ENCODER if name.startswith(ST_PREFIX) else name


def check_encoder(setting: str, name: str) -> None:
    """Raise UnknownNameError unless ``name`` is ``auto`` or a registered encoder."""
    if name != AUTO and encoder_key(name) not in ENCODERS:
        from rag_ablate.core.errors import UnknownNameError

        raise UnknownNameError(f"encoder ({setting})", name, [AUTO, *ENCODERS.names()])


@dataclass(frozen=True)
class EncoderSettings:
    """What an encoder wrapper does around its model; all but ``name`` enter the embedding cache keys."""

    name: str  # the registry name as configured (a label: not part of the keys)
    model_id: str  # the weights: model name and package version, or a model folder's content hash
    query_prefix: str  # text put before every query ("" when none)
    passage_prefix: str  # text put before every passage ("" when none)
    normalize: bool  # rows scaled to unit L2 norm
    max_tokens: int | None  # the longest input the model reads, in tokens
    long_inputs: str  # beyond max_tokens: "truncate" or "mean-of-windows"
    dim: int  # vector size (after any truncation of the model's output)
    libraries: tuple[str, ...]  # distributions whose versions enter the keys


class Encoder(Protocol):
    """A text encoder: queries and passages to L2-normalised float32 rows."""

    name: str  # the registry name as configured: "minilm", "e5-small" or "st:<folder>"
    model_id: str  # weights + version, for cache keys
    dim: int
    settings: EncoderSettings  # the wrapper's settings, for cache keys

    def encode_queries(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Rows for ``texts``; written into ``out`` (an (n, dim) float32 array, e.g. a memory map)
        when given, so a large corpus is encoded batch by batch without a second matrix."""
        ...

    def encode_passages(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 32,
        progress: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray: ...

    def count_tokens(self, texts: Sequence[str], *, query: bool) -> list[int]:
        """Tokens the model reads for each text (prefix and special tokens included, after truncation):
        the embedding tokens an embedding API would bill."""
        ...
