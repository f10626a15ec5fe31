"""Statistics core of the comparison step (see design/STATISTICS.md).

Everything here works on per-query differences ``d = variant - baseline`` of one
split, one variant pair and one or more metrics (columns). Near-duplicate
queries form groups, and the group is the unit of every resampling:

* **effect** -- the pooled mean of ``d`` over queries (= variant mean minus
  baseline mean). The sign is never flipped here: for a lower-is-better metric
  a negative effect is an improvement; :func:`improved` says which.
* **group (cluster) bootstrap** -- ``B`` resamples of ``G`` groups with
  replacement, as count vectors ``c``; ``theta* = (c . S) / (c . m)`` with
  ``S_g`` the group sums of ``d`` and ``m_g`` the group sizes. SE is the
  standard deviation of ``theta*`` (``ddof=1``, as ``scipy.stats.bootstrap``);
  the CI is the percentile interval (linear interpolation, as scipy).
* **group sign-flip test** -- ``T = sum_g eps_g S_g``; the two-sided p is the
  share of sign vectors with ``|T*| >= |T_obs| - 1e-9 * sum_g |S_g|``; exact
  enumeration of all ``2**G`` vectors when ``2**G <= B``, else ``B`` Monte Carlo
  vectors and ``p = (1 + count) / (B + 1)``. This is the p-value to report.
* **Holm** (confirmatory family) and **Benjamini-Hochberg** (exploratory).

Speed: count matrices are drawn in chunks of ~250 resamples (one
``rng.integers`` call and one ``np.bincount`` per chunk) and multiplied by the
``(G, metrics)`` matrix of group sums; sign vectors are packed random bits,
also in chunks. Nothing loops in Python per resample.

Reproducibility: ``paired_test(seed=s)`` draws its count matrices from
``np.random.default_rng(s)`` with exactly the draws
``rng.integers(0, G, (B, G))`` would give, so with singleton groups it
reproduces ``scipy.stats.bootstrap(..., paired=True, rng=default_rng(s))``
bit for bit. Monte Carlo sign vectors come from an independent stream,
``default_rng(derive_seed(s, "signflip"))``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from rag_ablate.errors import ComparisonError

__all__ = [
    "MIN_RELIABLE_GROUPS",
    "TIE_RTOL",
    "Direction",
    "PairedResult",
    "benjamini_hochberg",
    "bootstrap_counts",
    "derive_seed",
    "group_sums",
    "holm",
    "improved",
    "linearized_se",
    "paired_test",
    "signflip_pvalue",
]

Direction = Literal["higher", "lower"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: Below this many groups the bootstrap CI and ``p_bootstrap`` are flagged as
#: unreliable (a bootstrap over 10 groups gave 15% false positives at 5%).
MIN_RELIABLE_GROUPS = 30

#: Relative tolerance for ties: floating-point sums that are equal in exact
#: arithmetic must count as ties (spec: tol = 1e-9 * sum |S_g|).
TIE_RTOL = 1e-9

_DEFAULT_CHUNK = 250
_EXACT_CHUNK_ELEMS = 1 << 20  # sign-matrix entries per chunk in exact enumeration


# --------------------------------------------------------------------------- seeds


def derive_seed(run_seed: int, *parts: str) -> int:
    """A 63-bit seed derived from ``run_seed`` and a path of names.

    Stable across processes, platforms and Python versions (SHA-256 of a
    length-prefixed encoding, never ``hash()``), e.g.
    ``derive_seed(0, "holdout")`` for the holdout split's count matrix.
    """
    if isinstance(run_seed, bool) or not isinstance(run_seed, (int, np.integer)):
        raise ComparisonError(f"run_seed must be an int, got {type(run_seed).__name__}")
    h = hashlib.sha256(b"rag_ablate.derive_seed/v1")
    for token in (str(int(run_seed)), *parts):
        if not isinstance(token, str):
            raise ComparisonError(f"seed parts must be str, got {type(token).__name__}")
        raw = token.encode("utf-8")
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return int.from_bytes(h.digest()[:8], "big") >> 1


def improved(effect: npt.ArrayLike, direction: Direction) -> BoolArray:
    """Whether an effect (variant - baseline) is an improvement for ``direction``."""
    e = np.asarray(effect, dtype=np.float64)
    if direction == "higher":
        return np.asarray(e > 0)
    if direction == "lower":
        return np.asarray(e < 0)
    raise ComparisonError(f"direction must be 'higher' or 'lower', got {direction!r}")


# --------------------------------------------------------------------------- inputs


def _as_matrix(x: npt.ArrayLike, name: str) -> FloatArray:
    """``x`` as a finite float64 (n, m) matrix with n >= 1 and m >= 1."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ComparisonError(f"{name}: not numeric ({exc})") from None
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ComparisonError(f"{name}: expected shape (n,) or (n, m), got {a.shape}")
    if a.shape[0] == 0:
        raise ComparisonError(f"{name}: no queries (empty input)")
    if a.shape[1] == 0:
        raise ComparisonError(f"{name}: no metric columns")
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ComparisonError(f"{name}: non-finite value (NaN or inf) at query {bad[0]}, column {bad[1]}")
    return a


def _factorise(groups: npt.ArrayLike, n: int) -> tuple[IntArray, int]:
    """Codes 0..G-1 (in sorted label order) for ``n`` group labels."""
    g = np.asarray(groups)
    if g.ndim != 1:
        raise ComparisonError(f"groups: expected shape (n,), got {g.shape}")
    if g.shape[0] != n:
        raise ComparisonError(f"groups: length {g.shape[0]} does not match {n} queries")
    if n == 0:
        raise ComparisonError("groups: no queries (empty input)")
    if g.dtype.kind == "f" and not np.all(np.isfinite(g)):
        raise ComparisonError("groups: NaN or inf group label")
    if g.dtype.kind == "O" and any(x is None for x in g):
        raise ComparisonError("groups: None group label")
    try:
        _, codes = np.unique(g, return_inverse=True)
    except TypeError as exc:
        raise ComparisonError(f"groups: labels cannot be compared ({exc})") from None
    codes = np.asarray(codes, dtype=np.int64).reshape(-1)
    return codes, int(codes.max()) + 1


def group_sums(d: npt.ArrayLike, groups: npt.ArrayLike) -> tuple[FloatArray, IntArray]:
    """Per-group sums of ``d`` and group sizes.

    ``d`` is (n,) or (n, m); ``groups`` is (n,) labels of any sortable kind
    (int codes, strings, ...), factorised in sorted label order, so int codes
    0..G-1 keep their numbering. Returns ``S`` of shape (G, m) -- always 2-D,
    m = 1 for a 1-D ``d`` -- and ``sizes`` of shape (G,), every size >= 1.
    """
    dm = _as_matrix(d, "d")
    n, m = dm.shape
    codes, n_groups = _factorise(groups, n)
    flat = (codes[:, None] * m + np.arange(m, dtype=np.int64)).ravel()
    sums = np.asarray(np.bincount(flat, weights=dm.ravel(), minlength=n_groups * m), dtype=np.float64)
    sizes = np.bincount(codes, minlength=n_groups).astype(np.int64)
    return sums.reshape(n_groups, m), sizes


def linearized_se(d: npt.ArrayLike, groups: npt.ArrayLike | None = None) -> FloatArray:
    """Analytic SE of the pooled mean under group resampling, per column.

    ``sqrt(sum_g (S_g - m_g * mean)^2) / n`` -- the delta-method (linearised)
    SE of the ratio ``sum(c S) / sum(c m)``, i.e. the cluster-robust CR0 SE.
    With ``groups=None`` (every query its own group) it is *exactly* the SE of
    the ideal (B -> infinity) bootstrap distribution of the mean,
    ``sqrt(sum_i (d_i - mean)^2) / n``. With real groups the bootstrap SE is
    close to it but not identical (the ratio's denominator varies).
    """
    dm = _as_matrix(d, "d")
    n = dm.shape[0]
    if groups is None:
        resid = dm - dm.mean(axis=0)
        return np.asarray(np.sqrt(np.sum(resid * resid, axis=0)) / n)
    sums, sizes = group_sums(dm, groups)
    mean = sums.sum(axis=0) / n
    resid = sums - sizes[:, None] * mean
    return np.asarray(np.sqrt(np.sum(resid * resid, axis=0)) / n)


# --------------------------------------------------------------------------- bootstrap


def _count_dtype(n_groups: int) -> npt.DTypeLike:
    """Smallest dtype that holds any count 0..n_groups (keeps shared lists small)."""
    if n_groups <= np.iinfo(np.uint8).max:
        return np.uint8
    if n_groups <= np.iinfo(np.uint16).max:
        return np.uint16
    if n_groups <= np.iinfo(np.uint32).max:
        return np.uint32
    return np.int64


def bootstrap_counts(
    n_groups: int, B: int, rng: np.random.Generator, chunk: int = _DEFAULT_CHUNK
) -> Iterator[npt.NDArray[np.integer[npt.NBitBase]]]:
    """Yield (c, G) count matrices, c <= ``chunk``, B rows in total.

    Row b holds how often each of the G groups is drawn in bootstrap resample
    b (each row sums to G). Per chunk: one ``rng.integers(0, G, (c, G))`` and
    one ``np.bincount`` over row-offset indices. The concatenated draws equal
    ``rng.integers(0, G, (B, G))`` (the order scipy's bootstrap uses). Counts
    use the smallest unsigned dtype that can hold G, so a split's whole draw
    can be kept (``list(...)``) and shared by every variant and metric.
    """
    if isinstance(n_groups, bool) or int(n_groups) != n_groups or n_groups < 1:
        raise ComparisonError(f"n_groups must be a positive int, got {n_groups!r}")
    if isinstance(B, bool) or int(B) != B or B < 1:
        raise ComparisonError(f"B must be a positive int, got {B!r}")
    if isinstance(chunk, bool) or int(chunk) != chunk or chunk < 1:
        raise ComparisonError(f"chunk must be a positive int, got {chunk!r}")
    n_groups, B, chunk = int(n_groups), int(B), int(chunk)
    dtype = _count_dtype(n_groups)
    done = 0
    while done < B:
        c = min(chunk, B - done)
        idx = rng.integers(0, n_groups, size=(c, n_groups))
        idx += (np.arange(c, dtype=np.int64) * n_groups)[:, None]
        counts = np.bincount(idx.ravel(), minlength=c * n_groups)
        yield counts.reshape(c, n_groups).astype(dtype, copy=False)
        done += c


def _check_counts(counts: Sequence[npt.NDArray[np.integer[npt.NBitBase]]], n_groups: int) -> None:
    if len(counts) == 0:
        raise ComparisonError("counts: empty list of count matrices")
    for k, ch in enumerate(counts):
        a = np.asarray(ch)
        if a.ndim != 2 or a.shape[1] != n_groups or a.shape[0] == 0:
            raise ComparisonError(
                f"counts[{k}]: expected shape (c, {n_groups}) with c >= 1, got {a.shape}; "
                "was it drawn for another split or grouping?"
            )
        if a.dtype.kind not in "iu":
            raise ComparisonError(f"counts[{k}]: expected integer counts, got {a.dtype}")
        if a.dtype.kind == "i" and np.any(a < 0):
            raise ComparisonError(f"counts[{k}]: negative count")
        if np.any(a.sum(axis=1, dtype=np.int64) != n_groups):
            raise ComparisonError(f"counts[{k}]: a row does not sum to G = {n_groups}")


# --------------------------------------------------------------------------- sign flip


def signflip_pvalue(
    sums: npt.ArrayLike, *, B: int, rng: np.random.Generator, chunk: int = _DEFAULT_CHUNK
) -> tuple[FloatArray, bool]:
    """Two-sided sign-flip p-value over groups, per column of ``sums`` (G, m).

    ``T = sum_g eps_g S_g``. Exact (all ``2**G`` sign vectors, identity
    included, ``p = count / 2**G``) when ``2**G <= B``; otherwise ``B`` random
    sign vectors from ``rng`` and ``p = (1 + count) / (B + 1)``. A vector counts
    when ``|T*| >= |T_obs| - 1e-9 * sum_g |S_g|``. Returns (p, exact).
    """
    s = _as_matrix(sums, "sums")
    n_groups, _ = s.shape
    if isinstance(B, bool) or int(B) != B or B < 1:
        raise ComparisonError(f"B must be a positive int, got {B!r}")
    B = int(B)
    total = s.sum(axis=0)
    threshold = np.abs(total) - TIE_RTOL * np.abs(s).sum(axis=0)
    count = np.zeros(s.shape[1], dtype=np.int64)
    # eps = 2 * bit - 1, hence T* = 2 * (bits @ S) - sum(S).
    if n_groups < 63 and (1 << n_groups) <= B:
        n_vec = 1 << n_groups
        step = max(1, _EXACT_CHUNK_ELEMS // n_groups)
        shifts = np.arange(n_groups, dtype=np.int64)
        for start in range(0, n_vec, step):
            idx = np.arange(start, min(start + step, n_vec), dtype=np.int64)
            bits = ((idx[:, None] >> shifts) & 1).astype(np.float64)
            t = 2.0 * (bits @ s) - total
            count += np.count_nonzero(np.abs(t) >= threshold, axis=0)
        return np.asarray(count / float(n_vec), dtype=np.float64), True
    n_bytes = (n_groups + 7) // 8
    done = 0
    while done < B:
        c = min(chunk, B - done)
        packed = rng.integers(0, 256, size=(c, n_bytes), dtype=np.uint8)
        bits = np.unpackbits(packed, axis=1, count=n_groups).astype(np.float64)
        t = 2.0 * (bits @ s) - total
        count += np.count_nonzero(np.abs(t) >= threshold, axis=0)
        done += c
    return np.asarray((1.0 + count) / (B + 1.0), dtype=np.float64), False


# --------------------------------------------------------------------------- paired test


@dataclass(frozen=True, eq=False)
class PairedResult:
    """Comparison of one variant against the baseline; every array has shape (m,).

    ``effect``: variant mean - baseline mean over queries (never sign-flipped).
    ``se``: SD of the group-bootstrap distribution (ddof=1).
    ``ci_low``/``ci_high``: percentile interval at level ``1 - alpha``.
    ``p_value``: two-sided group sign-flip p -- the one to report and adjust.
    ``p_exact``: whether ``p_value`` came from full enumeration.
    ``p_bootstrap``: ``min(1, 2 * min(share(theta* <= 0), share(theta* >= 0)))``
    (``theta*`` within ``1e-9 * sum_g |S_g| / n`` of 0 counts on both sides),
    i.e. roughly the level at which the percentile CI starts to exclude 0.
    For reference only: it is too small with few queries or groups.
    ``bootstrap_unreliable``: ``n_groups < MIN_RELIABLE_GROUPS`` (30).
    A metric whose differences are all 0 gets effect 0, SE 0, CI [0, 0],
    ``p_value = p_bootstrap = 1`` and ``p_exact = True``.
    ``n_resamples``: bootstrap replicates used; ``alpha``: the CI's alpha.
    Arrays are read-only.
    """

    effect: FloatArray
    se: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray
    p_value: FloatArray
    p_exact: BoolArray
    p_bootstrap: FloatArray
    bootstrap_unreliable: bool
    n_queries: int
    n_groups: int
    n_resamples: int = 0  # bootstrap replicates actually used (0 = not recorded)
    alpha: float = 0.05


def _freeze(a: npt.NDArray[np.generic]) -> None:
    a.setflags(write=False)


def paired_test(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike | None,
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Sequence[npt.NDArray[np.integer[npt.NBitBase]]] | None = None,
) -> PairedResult:
    """Group bootstrap + group sign-flip comparison of ``variant`` vs ``baseline``.

    ``baseline``/``variant``: (n,) or (n, m) per-query values aligned by query
    (m metrics as columns). ``groups``: (n,) near-duplicate group labels, or
    None for every query its own group. ``B``: bootstrap resamples (when
    ``counts`` is None) and the sign-flip budget (exact iff ``2**G <= B``).
    ``counts``: pre-drawn count chunks from :func:`bootstrap_counts` for this
    split's G groups, shared by all variants and metrics; the number of
    bootstrap resamples is then their total row count. Otherwise the counts
    are drawn from ``np.random.default_rng(seed)``.
    """
    base = _as_matrix(baseline, "baseline")
    var = _as_matrix(variant, "variant")
    if base.shape != var.shape:
        raise ComparisonError(f"baseline and variant are not aligned: shapes {base.shape} and {var.shape}")
    if isinstance(B, bool) or int(B) != B or B < 1:
        raise ComparisonError(f"B must be a positive int, got {B!r}")
    if not (isinstance(alpha, (float, int)) and 0.0 < float(alpha) < 1.0):
        raise ComparisonError(f"alpha must be in (0, 1), got {alpha!r}")
    alpha = float(alpha)
    n, m = base.shape
    d = var - base
    if groups is None:
        sums, sizes = d, np.ones(n, dtype=np.int64)
    else:
        sums, sizes = group_sums(d, groups)
    n_groups = sums.shape[0]

    effect = d.mean(axis=0)
    # one product per chunk gives numerators (m columns) and denominator (last column)
    sums_sizes = np.column_stack([sums, sizes.astype(np.float64)])
    chunks: Iterator[npt.NDArray[np.integer[npt.NBitBase]]] | Sequence[npt.NDArray[np.integer[npt.NBitBase]]]
    if counts is None:
        chunks = bootstrap_counts(n_groups, int(B), np.random.default_rng(seed))
    else:
        _check_counts(counts, n_groups)
        chunks = counts
    parts = []
    for ch in chunks:
        prod = np.asarray(ch).astype(np.float64) @ sums_sizes
        parts.append(prod[:, :m] / prod[:, m:])
    theta = np.concatenate(parts, axis=0)
    n_boot = theta.shape[0]

    se = theta.std(axis=0, ddof=1) if n_boot > 1 else np.zeros(m)
    lo, hi = np.percentile(theta, [100.0 * alpha / 2, 100.0 * (1 - alpha / 2)], axis=0)
    tol = TIE_RTOL * np.abs(sums).sum(axis=0) / n
    below = np.count_nonzero(theta <= tol, axis=0)
    above = np.count_nonzero(theta >= -tol, axis=0)
    p_boot = np.minimum(1.0, 2.0 * np.minimum(below, above) / n_boot)

    p, exact = signflip_pvalue(sums, B=int(B), rng=np.random.default_rng(derive_seed(seed, "signflip")))
    p_exact = np.full(m, exact)

    zero = np.all(d == 0, axis=0)
    if np.any(zero):
        effect[zero] = 0.0
        se[zero] = 0.0
        lo[zero] = 0.0
        hi[zero] = 0.0
        p[zero] = 1.0
        p_boot[zero] = 1.0
        p_exact[zero] = True

    arrays = (effect, se, lo, hi, p, p_exact, p_boot)
    for a in arrays:
        _freeze(a)
    return PairedResult(
        effect=effect,
        se=se,
        ci_low=lo,
        ci_high=hi,
        p_value=p,
        p_exact=p_exact,
        p_bootstrap=p_boot,
        bootstrap_unreliable=n_groups < MIN_RELIABLE_GROUPS,
        n_queries=n,
        n_groups=n_groups,
        n_resamples=n_boot,
        alpha=alpha,
    )


# --------------------------------------------------------------------------- adjustment


def _as_pvalues(p: Sequence[float] | npt.NDArray[np.floating[npt.NBitBase]]) -> FloatArray:
    try:
        a = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ComparisonError(f"p-values: not numeric ({exc})") from None
    if a.ndim != 1:
        raise ComparisonError(f"p-values: expected a flat sequence, got shape {a.shape}")
    if np.any(np.isnan(a)):
        raise ComparisonError("p-values: NaN")
    if np.any((a < 0) | (a > 1)):
        raise ComparisonError("p-values: every p must lie in [0, 1]")
    return a


def holm(p: Sequence[float] | npt.NDArray[np.floating[npt.NBitBase]]) -> FloatArray:
    """Holm step-down adjusted p-values (family-wise error), in input order.

    ``adj_(i) = max_{j <= i} min(1, (k - j + 1) p_(j))`` over the ascending
    order; ties get equal adjusted values. An empty family gives an empty array.
    """
    a = _as_pvalues(p)
    k = a.size
    if k == 0:
        return np.zeros(0)
    order = np.argsort(a, kind="stable")
    scaled = a[order] * np.arange(k, 0, -1, dtype=np.float64)
    adj_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    out = np.empty(k)
    out[order] = adj_sorted
    return out


def benjamini_hochberg(
    p: Sequence[float] | npt.NDArray[np.floating[npt.NBitBase]],
) -> FloatArray:
    """Benjamini-Hochberg step-up adjusted p-values (false discovery rate).

    ``adj_(i) = min_{j >= i} min(1, k p_(j) / j)`` over the ascending order, in
    input order; ties get equal values. An empty family gives an empty array.
    """
    a = _as_pvalues(p)
    k = a.size
    if k == 0:
        return np.zeros(0)
    order = np.argsort(a, kind="stable")
    scaled = a[order] * k / np.arange(1, k + 1, dtype=np.float64)
    adj_sorted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    out = np.empty(k)
    out[order] = adj_sorted
    return out
