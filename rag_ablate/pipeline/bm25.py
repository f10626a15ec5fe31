"""BM25 retrieval over chunks: bm25s's scores from the cached token ids, deterministic tie-breaking.

The index is built from the ``tokens`` stage (:mod:`rag_ablate.pipeline.tokens`) with bm25s's
scoring formulas applied to whole arrays, so its scores equal those of a bm25s index
over the same tokens bit for bit; queries sum the matrix columns of their tokens in float32,
in order, as bm25s does. docs/architecture.md ("Tokens") describes the stages.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.core.cache import code_parts, library_versions
from rag_ablate.pipeline.tokens import TOKENS_CODE, TokenMatrix, tokens_key_parts
from rag_ablate.text.analyzers import Analyzer

if TYPE_CHECKING:
    from rag_ablate.config.schema import BM25Config

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


_EMPTY = ""  # the token of a chunk without any (bm25s's convention: every chunk has a length >= 1)
_BLOCK = 1 << 22  # (token, chunk) pairs scored per numpy step: bounds the float64 temporaries


# The BM25 variants' idf and term-frequency components (Kamphuis et al., ECIR 2020), written as
# bm25s 0.3.16 evaluates them (the same operations in the same order, so the same floats); kept
# here so that building an index does not import bm25s, which imports numba and scipy (about
# 0.3 s of CPU). tests/test_bm25_tokens.py checks the scores against bm25s's own index.
def _idf_robertson(df: int, n: int) -> float:
    inner = (n - df + 0.5) / (df + 0.5)
    return math.log(max(inner, 1))  # bm25s's default: no negative idf


_IDF: dict[str, Callable[[int, int], float]] = {
    "robertson": _idf_robertson,
    "lucene": lambda df, n: math.log(1 + (n - df + 0.5) / (df + 0.5)),
    "atire": lambda df, n: math.log(n / df),
    "bm25l": lambda df, n: math.log((n + 1) / (df + 0.5)),
    "bm25+": lambda df, n: math.log((n + 1) / df),
}


def _tfc(method: str, tf: Any, l_d: Any, l_avg: Any, k1: float, b: float, delta: float) -> Any:
    """The term-frequency component of ``method`` for arrays (or scalars) of term frequencies
    ``tf`` and chunk lengths ``l_d``."""
    if method in ("robertson", "lucene"):
        return tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf)
    if method == "atire":
        return (tf * (k1 + 1)) / (tf + k1 * (1 - b + b * l_d / l_avg))
    if method == "bm25l":
        c = tf / (1 - b + b * l_d / l_avg)
        return ((k1 + 1) * (c + delta)) / (k1 + c + delta)
    if method == "bm25+":
        return (((k1 + 1) * tf) / (k1 * (1 - b + b * l_d / l_avg) + tf)) + delta
    raise ValueError(f"unknown BM25 method {method!r}")


@dataclass
class ScoreMatrix:
    """bm25s's eager index: each (token, chunk) pair's BM25 contribution, token-major.

    Token ``t`` adds ``data[indptr[t]:indptr[t + 1]]`` to chunks ``indices[...]``; for
    ``bm25l`` and ``bm25+`` ``nonoccurrence[t]`` is added to every chunk, as bm25s does.
    """

    vocab: list[str]
    data: np.ndarray  # float32 (pairs,)
    indices: np.ndarray  # int32 (pairs,)
    indptr: np.ndarray  # int64 (tokens + 1,)
    nonoccurrence: np.ndarray | None  # float32 (tokens,)
    n_docs: int

    @classmethod
    def from_tokens(cls, tokens: TokenMatrix, *, k1: float, b: float, method: str) -> ScoreMatrix:
        """The scores bm25s 0.3.16 computes from the same tokens, bit for bit.

        bm25s's idf and term-frequency formulas (:data:`_IDF`, :func:`_tfc`) are applied to whole
        arrays with the dtypes it uses per document (float32 counts, float64 arithmetic, float32 result);
        tests/test_bm25_tokens.py compares against an index bm25s builds from token lists.
        """
        delta = 0.5  # bm25s's default, used by bm25l and bm25+
        vocab, indptr, docs, tf, lengths = _with_empty_token(tokens)
        n_docs = tokens.n_chunks
        avg = lengths.astype(np.int64).mean() if n_docs else np.float64(0.0)
        df = np.diff(indptr)
        idf_of = _IDF[method]
        dfs, inverse = np.unique(df, return_inverse=True)
        idf64 = np.array([idf_of(int(d), n_docs) for d in dfs], dtype=np.float64)[inverse]
        idf = idf64.astype(np.float32)
        nonocc = None
        if method in ("bm25l", "bm25+"):
            zero_tf = _tfc(method, 0, avg, avg, k1, b, delta)
            nonocc = (idf64 * zero_tf).astype(np.float32)
        data = np.empty(docs.shape[0], dtype=np.float32)
        term_starts = np.searchsorted(indptr, np.arange(0, docs.shape[0], _BLOCK), side="right") - 1
        for t0, t1 in zip(term_starts, [*term_starts[1:], df.shape[0]], strict=True):
            t1 = max(t1, t0 + 1)  # a token with more pairs than a block still moves forward
            s, e = int(indptr[t0]), int(indptr[t1])
            if s == e:
                continue
            terms = np.repeat(np.arange(t0, t1), df[t0:t1])
            l_d = lengths[docs[s:e]].astype(np.int64)
            tfc = _tfc(method, tf[s:e].astype(np.float32), l_d, avg, k1, b, delta)
            scores = idf[terms] * tfc
            if nonocc is not None:
                scores -= nonocc[terms]
            data[s:e] = scores
        return cls(vocab, data, np.asarray(docs, dtype=np.int32), indptr, nonocc, n_docs)

    def save(self, folder: Path) -> None:
        for name in ("data", "indices", "indptr"):
            with (folder / f"{name}.npy").open("wb") as f:
                np.save(f, getattr(self, name), allow_pickle=False)
        if self.nonoccurrence is not None:
            with (folder / "nonoccurrence.npy").open("wb") as f:
                np.save(f, self.nonoccurrence, allow_pickle=False)
        meta = {"n_docs": self.n_docs, "vocab": self.vocab}
        (folder / "index.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> ScoreMatrix:
        """A saved matrix, its arrays memory-mapped."""
        arrays = {n: np.load(folder / f"{n}.npy", mmap_mode="r") for n in ("data", "indices", "indptr")}
        nonocc_file = folder / "nonoccurrence.npy"
        nonocc = np.load(nonocc_file) if nonocc_file.is_file() else None
        meta = json.loads((folder / "index.json").read_text(encoding="utf-8"))
        return cls(meta["vocab"], arrays["data"], arrays["indices"], arrays["indptr"], nonocc, meta["n_docs"])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.indices.nbytes + self.indptr.nbytes)


def _with_empty_token(
    tokens: TokenMatrix,
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The matrix with each chunk without tokens given one token ``""`` (length 1), as the
    earlier index did (``analyzer(text) or [""]``), so lengths, the average and idf agree."""
    lengths = np.asarray(tokens.doc_len)
    empty = np.flatnonzero(lengths == 0).astype(np.int32)
    indptr, docs, tf = np.asarray(tokens.indptr), np.asarray(tokens.docs), np.asarray(tokens.tf)
    vocab = tokens.vocab
    if empty.size == 0:
        return vocab, indptr, docs, tf, lengths
    lengths = np.where(lengths == 0, 1, lengths).astype(np.int32)
    ones = np.ones(empty.size, dtype=np.int32)
    if _EMPTY in vocab:  # an analyzer that emits "": merge the empty chunks into its column
        t = vocab.index(_EMPTY)
        s, e = int(indptr[t]), int(indptr[t + 1])
        col_docs = np.concatenate([docs[s:e], empty])
        order = np.argsort(col_docs, kind="stable")
        col_docs, col_tf = col_docs[order], np.concatenate([tf[s:e], ones])[order]
        docs = np.concatenate([docs[:s], col_docs, docs[e:]])
        tf = np.concatenate([tf[:s], col_tf, tf[e:]])
        indptr = indptr.copy()
        indptr[t + 1 :] += empty.size
        return vocab, indptr, docs, tf, lengths
    docs = np.concatenate([docs, empty])
    tf = np.concatenate([tf, ones])
    indptr = np.append(indptr, indptr[-1] + empty.size)
    return [*vocab, _EMPTY], indptr, docs, tf, lengths


class BM25Retriever:
    """BM25 over analysed chunk texts: bm25s's scores, computed from the cached token ids."""

    def __init__(
        self,
        texts: Iterable[str],
        sort_keys: Sequence[tuple[str, int]] | np.ndarray,
        analyzer: Analyzer,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        show_progress: bool = False,
    ) -> None:
        """Analyse ``texts`` and index them (the cached path is :meth:`from_tokens`)."""
        tokens = TokenMatrix.build(texts, analyzer, progress=show_progress)
        matrix = ScoreMatrix.from_tokens(tokens, k1=k1, b=b, method=method)
        self._setup(matrix, sort_keys, analyzer)

    def _setup(
        self, matrix: ScoreMatrix, sort_keys: Sequence[tuple[str, int]] | np.ndarray, analyzer: Analyzer
    ) -> None:
        self.analyzer = analyzer
        self.matrix = matrix
        self.n = matrix.n_docs
        self.vocab = {t: i for i, t in enumerate(matrix.vocab)}
        self.tiebreak = sort_keys if isinstance(sort_keys, np.ndarray) else _tiebreak(sort_keys)
        if self.tiebreak.shape[0] != self.n:
            raise ValueError(f"{self.tiebreak.shape[0]} tie-break ranks for an index of {self.n} chunks")

    @classmethod
    def from_tokens(
        cls,
        tokens: TokenMatrix,
        tiebreak: Sequence[tuple[str, int]] | np.ndarray,
        analyzer: Analyzer,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
    ) -> BM25Retriever:
        """An index over already analysed chunks (the ``tokens`` cache stage)."""
        self = cls.__new__(cls)
        self._setup(ScoreMatrix.from_tokens(tokens, k1=k1, b=b, method=method), tiebreak, analyzer)
        return self

    @classmethod
    def load(
        cls, folder: Path, sort_keys: Sequence[tuple[str, int]] | np.ndarray, analyzer: Analyzer
    ) -> BM25Retriever:
        """An index saved with :meth:`save` (the analyzer must be the one it was built with).

        ``sort_keys``: each chunk's (doc id, position), or the tie-break ranks themselves.
        """
        self = cls.__new__(cls)
        self._setup(ScoreMatrix.load(folder), sort_keys, analyzer)
        return self

    def save(self, folder: Path) -> None:
        self.matrix.save(folder)

    @property
    def nbytes(self) -> int:
        """Memory of the score matrix."""
        return self.matrix.nbytes

    def token_ids(self, query: str) -> list[int]:
        """The query's analysed tokens as ids, in order, repeats kept, unknown tokens dropped."""
        vocab = self.vocab
        return [vocab[t] for t in self.analyzer(query) if t in vocab]

    def scores(self, query: str) -> np.ndarray:
        """Every chunk's score (float32), summed token by token in query order as bm25s does."""
        ids = self.token_ids(query)
        scores = np.zeros(self.n, dtype=np.float32)
        if not ids:
            return scores
        m = self.matrix
        indptr, indices, data = m.indptr, m.indices, m.data
        for t in ids:
            s, e = indptr[t], indptr[t + 1]
            scores[indices[s:e]] += data[s:e]  # a token's chunks are distinct: no lost updates
        if m.nonoccurrence is not None:
            scores += m.nonoccurrence[np.asarray(ids, dtype=np.int32)].sum()
        return scores

    def search(self, query: str, k: int) -> list[Hit]:
        s = self.scores(query)
        return [(i, float(s[i])) for i in top_k_indices(s, self.tiebreak, k)]


# libraries whose versions can change an index: bm25s's scoring functions, applied with numpy
BM25_LIBRARIES = ("bm25s", "numpy")
BM25_CODE = (*TOKENS_CODE, "rag_ablate.pipeline.bm25")


def bm25_key_parts(
    settings: BM25Config, analyzer: str, chunks: Mapping[str, Any], include_title: bool
) -> dict[str, Any]:
    """The cache key parts of the ``bm25`` stage: everything an index depends on.

    What the ``tokens`` entry it is built from depends on (:func:`tokens_key_parts`: the
    chunks' key parts, whether titles are indexed, the analyzer resolved, ``auto`` sharing
    the entry of what it resolves to, and expanded to its stop words, dictionary and library
    versions), every BM25 setting, the code (package and Python versions, a hash of
    analyzers.py, tokens.py and bm25.py) and the versions of bm25s and numpy.
    """
    tokens = tokens_key_parts(analyzer, chunks, include_title)
    return {
        "chunks": tokens["chunks"],
        "include_title": include_title,
        **asdict(settings),
        "analyzer": tokens["analyzer"],
        "code": code_parts(*BM25_CODE),
        "libraries": library_versions(*BM25_LIBRARIES),
    }
