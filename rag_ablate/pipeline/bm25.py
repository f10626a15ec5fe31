"""BM25 retrieval over chunks with bm25s, with deterministic tie-breaking."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.cache import code_parts, library_versions
from rag_ablate.pipeline.analyzers import Analyzer, analyzer_key_parts

if TYPE_CHECKING:
    from rag_ablate.config import BM25Config

Hit = tuple[int, float]  # (chunk index, score)


def top_k_indices(
    scores: np.ndarray, tiebreak: np.ndarray, k: int, *, positive_only: bool = True
) -> list[int]:
    """Indices of the k best scores, equal scores ordered by ``tiebreak`` ascending.

    ``positive_only`` drops scores <= 0 (a lexical retriever returns only chunks
    that share a term with the query); dense scores keep every candidate.
    """
    cand = np.flatnonzero(scores > 0) if positive_only else np.arange(scores.shape[0])
    if cand.size == 0:
        return []
    if cand.size > k:
        kth = np.partition(scores[cand], cand.size - k)[cand.size - k]
        cand = cand[scores[cand] >= kth]  # keep every tie at the boundary
    order = np.lexsort((tiebreak[cand], -scores[cand]))
    return [int(i) for i in cand[order[:k]]]


def _tiebreak(sort_keys: Sequence[tuple[str, int]]) -> np.ndarray:
    """Rank of each chunk in (doc id, position) order: equal scores go to the lower rank."""
    n = len(sort_keys)
    order = sorted(range(n), key=lambda i: sort_keys[i])
    tiebreak = np.empty(n, dtype=np.int64)
    tiebreak[order] = np.arange(n)
    return tiebreak


class BM25Retriever:
    """A bm25s index over analysed chunk texts."""

    def __init__(
        self,
        texts: Sequence[str],
        sort_keys: Sequence[tuple[str, int]],
        analyzer: Analyzer,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        show_progress: bool = False,
    ) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG

        self.analyzer = analyzer
        self.n = len(texts)
        from tqdm import tqdm

        bar = tqdm(texts, desc="indexing", unit="chunk", disable=not show_progress, leave=False)
        corpus_tokens = [analyzer(t) or [""] for t in bar]
        self.index = bm25s.BM25(k1=k1, b=b, method=method)
        self.index.index(corpus_tokens, show_progress=False)
        self.tiebreak = _tiebreak(sort_keys)

    @classmethod
    def load(cls, folder: Path, sort_keys: Sequence[tuple[str, int]], analyzer: Analyzer) -> BM25Retriever:
        """An index saved with :meth:`save` (the analyzer must be the one it was built with)."""
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)
        self = cls.__new__(cls)
        self.analyzer = analyzer
        self.index = bm25s.BM25.load(str(folder), load_corpus=False, mmap=False)
        self.n = len(sort_keys)
        self.tiebreak = _tiebreak(sort_keys)
        return self

    def save(self, folder: Path) -> None:
        self.index.save(str(folder))

    @property
    def nbytes(self) -> int:
        """Memory of the score matrix."""
        return int(sum(getattr(v, "nbytes", 0) for v in self.index.scores.values()))

    def scores(self, query: str) -> np.ndarray:
        tokens = [t for t in self.analyzer(query) if t in self.index.vocab_dict]
        if not tokens:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self.index.get_scores(tokens))

    def search(self, query: str, k: int) -> list[Hit]:
        s = self.scores(query)
        return [(i, float(s[i])) for i in top_k_indices(s, self.tiebreak, k)]


# libraries whose versions can change an index: bm25s builds it with numpy and scipy.sparse
BM25_LIBRARIES = ("bm25s", "numpy", "scipy")


def bm25_key_parts(
    settings: BM25Config, analyzer: str, chunks: Mapping[str, Any], include_title: bool
) -> dict[str, Any]:
    """The cache key parts of the ``bm25`` stage: everything an index depends on.

    The chunks' key parts (corpus, chunking, its code), whether titles are indexed, every
    BM25 setting with ``analyzer`` resolved (``auto`` shares the entry of what it resolves
    to) and expanded to its stop words, dictionary and library version, the code (package
    and Python versions, a hash of analyzers.py and bm25.py) and the versions of bm25s,
    numpy and scipy.
    """
    if analyzer == "auto":
        raise ValueError("resolve analyzer 'auto' to a language before keying")
    return {
        "chunks": dict(chunks),
        "include_title": include_title,
        **asdict(settings),
        "analyzer": analyzer_key_parts(analyzer),
        "code": code_parts("rag_ablate.pipeline.analyzers", "rag_ablate.pipeline.bm25"),
        "libraries": library_versions(*BM25_LIBRARIES),
    }
