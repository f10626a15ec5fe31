"""BM25 retrieval over chunks with bm25s, with deterministic tie-breaking."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from rag_ablate.pipeline.analyzers import Analyzer

Hit = tuple[int, float]  # (chunk index, score)


def top_k_indices(scores: np.ndarray, tiebreak: np.ndarray, k: int, *, positive_only: bool = True) -> list[int]:
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
        order = sorted(range(self.n), key=lambda i: sort_keys[i])
        self.tiebreak = np.empty(self.n, dtype=np.int64)
        self.tiebreak[order] = np.arange(self.n)

    def scores(self, query: str) -> np.ndarray:
        tokens = [t for t in self.analyzer(query) if t in self.index.vocab_dict]
        if not tokens:
            return np.zeros(self.n, dtype=np.float32)
        return np.asarray(self.index.get_scores(tokens))

    def search(self, query: str, k: int) -> list[Hit]:
        s = self.scores(query)
        return [(i, float(s[i])) for i in top_k_indices(s, self.tiebreak, k)]
