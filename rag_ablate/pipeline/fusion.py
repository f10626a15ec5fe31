"""Fusing ranked lists from several retrievers (hybrid retrieval).

Each input run is a ranked list of ``(chunk index, score)``, best first. Ties in
the fused score are broken by ``tiebreak`` (lower first), so fusion is
deterministic.

* **RRF** (reciprocal rank fusion): ``score(d) = sum_r 1 / (k + rank_r(d))`` with
  1-based ranks; a document absent from a run gets nothing from it.
* **weighted**: each run's scores are min-max normalised to [0, 1] (a run whose
  scores are all equal maps them to 1), then ``score(d) = sum_r w_r * norm_r(d)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag_ablate.core.errors import ConfigError
from rag_ablate.pipeline.stages import FUSIONS, Hits, Run

__all__ = ["FUSIONS", "fuse", "rrf", "weighted"]


def _sorted(scores: dict[int, float], tiebreak: np.ndarray, k: int) -> list[tuple[int, float]]:
    return sorted(scores.items(), key=lambda t: (-t[1], int(tiebreak[t[0]])))[:k]


def rrf(runs: Sequence[Run], tiebreak: np.ndarray, k: int, rrf_k: float = 60.0) -> list[tuple[int, float]]:
    if rrf_k < 0:
        raise ConfigError(f"the RRF constant must be >= 0, got {rrf_k}")
    scores: dict[int, float] = {}
    for run in runs:
        for rank, (idx, _) in enumerate(run, start=1):
            scores[idx] = scores.get(idx, 0.0) + 1.0 / (rrf_k + rank)
    return _sorted(scores, tiebreak, k)


def weighted(
    runs: Sequence[Run], weights: Sequence[float], tiebreak: np.ndarray, k: int
) -> list[tuple[int, float]]:
    if len(runs) != len(weights):
        raise ConfigError(f"{len(runs)} runs but {len(weights)} weights")
    scores: dict[int, float] = {}
    for run, w in zip(runs, weights, strict=True):
        if not run:
            continue
        vals = np.array([s for _, s in run], dtype=np.float64)
        lo, hi = float(vals.min()), float(vals.max())
        norm = np.ones_like(vals) if hi == lo else (vals - lo) / (hi - lo)
        for (idx, _), v in zip(run, norm, strict=True):
            scores[idx] = scores.get(idx, 0.0) + w * float(v)
    return _sorted(scores, tiebreak, k)


@FUSIONS.register("rrf")
def _rrf(
    runs: Sequence[Run], tiebreak: np.ndarray, k: int, *, rrf_k: float, weights: Sequence[float]
) -> Hits:
    return rrf(runs, tiebreak, k, rrf_k)


@FUSIONS.register("weighted")
def _weighted(
    runs: Sequence[Run], tiebreak: np.ndarray, k: int, *, rrf_k: float, weights: Sequence[float]
) -> Hits:
    return weighted(runs, weights, tiebreak, k)


def fuse(
    method: str,
    runs: Sequence[Run],
    tiebreak: np.ndarray,
    k: int,
    *,
    rrf_k: float = 60.0,
    weights: Sequence[float] | None = None,
) -> list[tuple[int, float]]:
    """Fuse ``runs`` with the fusion registered as ``method`` (equal weights by default)."""
    return FUSIONS.get(method)(runs, tiebreak, k, rrf_k=rrf_k, weights=weights or [1.0] * len(runs))
