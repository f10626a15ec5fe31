"""Dense retrieval over L2-normalised embeddings, with deterministic tie-breaking.

Two kinds of index:

    "exact"    a numpy matrix product against every chunk (the reference)
    "usearch"  an approximate HNSW graph (the optional ``usearch`` package); its
               candidates are re-scored exactly against the matrix and sorted with
               the same tie rule, so the only approximation is which chunks are found

``retrieval.dense.index=auto`` (:func:`choose_index`) takes ``exact`` up to
``retrieval.dense.approximate_above`` chunks and ``usearch`` above. The graph is built
with one thread by default (``retrieval.dense.build_threads``): a multi-threaded build
is about twice as fast on two cores but inserts in a racy order, so its graph, and the
approximate results, differ from run to run. A built graph can be saved
(:meth:`DenseIndex.save_graph`) and opened memory-mapped (``graph=``), so a cache entry
serves every later run. docs/architecture.md "Large corpora" has the measured trade-off.

Scores are dot products of unit vectors, i.e. cosine similarities. Equal scores
are ordered by ``tiebreak`` ascending, as in BM25.

How the ranking stays deterministic: BLAS picks different kernels (gemv, a
small-matrix path, gemm) by shape, and they round float32 dot products
differently in the last bit, so a query's float32 scores depend on its batch.
The float32 product only *selects* candidates (every chunk within a rounding
margin of the k-th score); the candidates are then re-scored in float64 from
exact float32 x float32 products summed in a fixed order, which depends on
nothing but the two vectors. ``search(q)`` therefore equals the same row of
``search_many``, identical vectors tie exactly, and usearch's re-scored
candidates get the very scores of the exact index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.pipeline.bm25 import top_k_indices

Hit = tuple[int, float]  # (chunk index, cosine score)

INDEX_KINDS: tuple[str, ...] = ("exact", "usearch")
INDEX_SETTINGS: tuple[str, ...] = ("auto", *INDEX_KINDS)  # what retrieval.dense.index accepts
_NORM_TOLERANCE = 1e-3
# HNSW settings of the usearch index (graph degree, beam widths when adding and searching)
_CONNECTIVITY, _EXPANSION_ADD, _EXPANSION_SEARCH = 32, 200, 128
_MAX_SCORE_CELLS = 1 << 24  # bound the (queries x chunks) float32 score block to 64 MB


def choose_index(setting: str, n_chunks: int, approximate_above: int) -> str:
    """The index kind for ``retrieval.dense.index``: ``auto`` is ``exact`` up to ``approximate_above``
    chunks and ``usearch`` above; ``exact`` and ``usearch`` are taken as they are."""
    if setting == "auto":
        return "usearch" if n_chunks > approximate_above else "exact"
    if setting not in INDEX_KINDS:
        raise UnknownNameError("dense index", setting, INDEX_SETTINGS)
    return setting


_CHECK_ROWS = 1 << 16  # rows checked at a time: no temporary the size of a million-row matrix


def _check_unit_rows(x: np.ndarray, what: str) -> None:
    for s in range(0, x.shape[0] if x.size else 0, _CHECK_ROWS):
        block = x[s : s + _CHECK_ROWS]
        if not np.all(np.isfinite(block)):
            raise ValueError(f"{what} contains NaN or infinite values")
        norms = np.linalg.norm(block, axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > _NORM_TOLERANCE)
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"{what} must have L2-normalised rows; row {s + row} has norm {norms[row]:.6g}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")


class DenseIndex:
    """Nearest chunks by cosine similarity over a fixed matrix of chunk embeddings."""

    def __init__(
        self,
        matrix: np.ndarray,
        tiebreak: np.ndarray,
        *,
        kind: str = "exact",
        connectivity: int = _CONNECTIVITY,
        expansion_add: int = _EXPANSION_ADD,
        expansion_search: int = _EXPANSION_SEARCH,
        threads: int = 1,
        graph: Path | None = None,
    ) -> None:
        """``matrix`` (n, d) float32 with unit rows; ``tiebreak`` (n,) integer ranks (lower wins ties).

        ``connectivity`` and the ``expansion_*`` sizes are the HNSW settings of ``kind="usearch"``,
        ``threads`` its build threads (1: the same graph on every build). ``graph``: a file written
        by :meth:`save_graph` for this matrix, opened memory-mapped instead of building.
        """
        if kind not in INDEX_KINDS:
            raise UnknownNameError("dense index", kind, INDEX_KINDS)
        m = np.ascontiguousarray(matrix, dtype=np.float32)
        if m.ndim != 2:
            raise ValueError(f"matrix must be 2-D (chunks x dim), got shape {m.shape}")
        t = np.asarray(tiebreak)
        if t.shape != (m.shape[0],):
            raise ValueError(f"tiebreak must have shape ({m.shape[0]},), got {t.shape}")
        if t.size and not np.issubdtype(t.dtype, np.integer):
            raise ValueError(f"tiebreak must hold integers, got dtype {t.dtype}")
        _check_unit_rows(m, "matrix")
        self.kind = kind
        self.matrix = m
        self.tiebreak = t.astype(np.int64, copy=False)
        self.n, self.dim = m.shape
        self._ann: Any = None
        self._expansion_search = expansion_search
        if kind == "usearch":
            if graph is not None:
                self._ann = self._open_usearch(graph, expansion_search)
            else:
                self._ann = self._build_usearch(connectivity, expansion_add, expansion_search, threads)

    def _build_usearch(
        self, connectivity: int, expansion_add: int, expansion_search: int, threads: int
    ) -> Any:
        Index = _usearch_index()
        if self.n == 0:
            return None
        index = Index(
            ndim=self.dim,
            metric="ip",
            dtype="f32",
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        # One build thread: a multi-threaded HNSW build inserts in a racy order and gives a different
        # graph (so different approximate results) on every run. copy=False: the graph points into
        # self.matrix, which this object keeps alive and never changes.
        index.add(np.arange(self.n, dtype=np.uint64), self.matrix, copy=False, threads=threads)
        return index

    def _open_usearch(self, path: Path, expansion_search: int) -> Any:
        if self.n == 0:
            return None
        index = _usearch_index().restore(str(path), view=True)
        if index is None or len(index) != self.n or index.ndim != self.dim:
            raise ValueError(f"{path} is not a usearch graph of this matrix ({self.n} x {self.dim})")
        index.expansion_search = expansion_search
        return index

    def save_graph(self, path: Path) -> None:
        """Write the usearch graph (with its vectors) to ``path``; ``graph=path`` opens it again."""
        if self.kind != "usearch":
            raise ValueError(f"a {self.kind!r} index has no graph to save")
        if self._ann is None:
            path.write_bytes(b"")  # no chunks: nothing to search
        else:
            self._ann.save(str(path))

    @property
    def nbytes(self) -> int:
        """Memory of the index: the matrix and tie ranks, plus the HNSW graph for usearch."""
        size = int(self.matrix.nbytes + self.tiebreak.nbytes)
        if self._ann is not None:
            size += int(self._ann.memory_usage)
        return size

    def search(self, query: np.ndarray, k: int) -> list[Hit]:
        """The k nearest chunks to one (d,) query vector, best first, as (index, cosine)."""
        q = np.asarray(query, dtype=np.float32)
        if q.ndim != 1:
            raise ValueError(
                f"query must be a (dim,) vector, got shape {q.shape} (search_many takes a batch)"
            )
        return self.search_many(q[None, :], k)[0]

    def search_many(self, queries: np.ndarray, k: int) -> list[list[Hit]]:
        """``search`` for each row of a (m, d) query matrix."""
        _check_k(k)
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must have shape (m, {self.dim}), got {q.shape}")
        _check_unit_rows(q, "queries")
        if q.shape[0] == 0:
            return []
        if k == 0 or self.n == 0:
            return [[] for _ in range(q.shape[0])]
        if self._ann is None or k >= self.n:  # asking for every chunk: nothing to approximate
            return self._exact(q, k)
        return self._approximate(q, k)

    def _exact(self, q: np.ndarray, k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        # float32 rounding bound for a dot product of (near) unit vectors is ~dim * 2**-24 per score;
        # twice that on either side, doubled again for slack.
        margin = self.dim * 2.0**-22
        step = max(1, _MAX_SCORE_CELLS // self.n)
        for s in range(0, q.shape[0], step):
            block = q[s : s + step]
            scores = block @ self.matrix.T  # one product for the whole batch (or block of it)
            if k < self.n:
                kth = np.partition(scores, self.n - k, axis=1)[:, self.n - k]  # per-row k-th best
                cands = [np.flatnonzero(row >= t - margin) for row, t in zip(scores, kth, strict=True)]
            else:
                cands = [np.arange(self.n)] * block.shape[0]
            out.extend(self._rank(qv, cand, k) for qv, cand in zip(block, cands, strict=True))
        return out

    def _approximate(self, q: np.ndarray, k: int) -> list[list[Hit]]:
        # HNSW keeps a beam of max(expansion_search, count) nodes anyway, so taking the whole beam as
        # candidates costs only their exact re-scoring, and finds more of the true top k and its ties.
        count = min(self.n, max(k, self._expansion_search))
        found = self._ann.search(q, count, threads=0)
        keys = np.atleast_2d(np.asarray(found.keys))
        counts = np.atleast_1d(np.asarray(getattr(found, "counts", [len(found.keys)])))
        return [self._rank(q[r], keys[r, : int(counts[r])].astype(np.int64), k) for r in range(q.shape[0])]

    def _rank(self, query: np.ndarray, cand: np.ndarray, k: int) -> list[Hit]:
        """The k best of ``cand``, re-scored exactly, equal scores by tiebreak."""
        if cand.size == 0:
            return []
        exact = _exact_scores(self.matrix[cand], query)
        top = top_k_indices(exact, self.tiebreak[cand], k, positive_only=False)
        return [(int(cand[j]), float(exact[j])) for j in top]


def graph_key_parts(passage_parts: dict[str, Any], build_threads: int) -> dict[str, Any]:
    """The cache key parts of the ``dense_graph`` stage (a usearch graph): the passage embeddings'
    key parts, the HNSW build settings and threads, this module's code and usearch's version."""
    from rag_ablate.core.cache import code_parts, library_versions

    return {
        "embeddings": dict(passage_parts),
        "connectivity": _CONNECTIVITY,
        "expansion_add": _EXPANSION_ADD,
        "build_threads": build_threads,
        "code": code_parts("rag_ablate.pipeline.dense"),
        "libraries": library_versions("usearch"),
    }


def _usearch_index() -> Any:
    try:
        from usearch.index import Index
    except ImportError as e:
        raise ConfigError(
            "dense index 'usearch' needs the usearch package: pip install usearch (or use index 'exact')"
        ) from e
    return Index


def _exact_scores(rows: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Dot products of float32 ``rows`` with ``query``, in float64, independent of the batch.

    A float32 x float32 product is exact in float64, and numpy sums each row in the same
    fixed (pairwise) order whatever the number of rows, so the result depends only on the
    two vectors.
    """
    scores: np.ndarray = (rows.astype(np.float64) * query.astype(np.float64)).sum(axis=1)
    return scores
