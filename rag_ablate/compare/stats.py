"""Statistics core of the comparison step (explained in docs/statistics.md).

Everything here works on per-query differences ``d = variant - baseline`` of one
split, one variant pair and one or more metrics (columns). Near-duplicate
queries form groups, and the group is the unit of every resampling:

* **effect** -- the pooled mean of ``d`` over queries (= variant mean minus
  baseline mean). The sign is never flipped here: for a lower-is-better metric
  a negative effect is an improvement; :func:`improved` says which.
* **group sign-flip test** -- ``T = sum_g eps_g S_g`` with ``S_g`` the group
  sums of ``d``; the two-sided p is the share of sign vectors with
  ``|T*| >= |T_obs| - 1e-9 * sum_g |S_g|``; exact enumeration of all ``2**G``
  vectors when ``2**G <= B``, else ``B`` Monte Carlo vectors and
  ``p = (1 + count) / (B + 1)``. This is the p-value to report.
* **interval by test inversion** -- the headline interval is the set of shifts
  delta that the same test, run on ``d - delta`` (group sums
  ``S_g - delta m_g``) with the same sign vectors, does not reject at alpha.
  Both ends are found by bisection (to ``INVERSION_RTOL`` times the largest
  absolute group mean) and then snapped to the exact breakpoint they
  approximate. It excludes 0 exactly when ``p < alpha``.
* **group (cluster) bootstrap** -- ``B`` resamples of ``G`` groups with
  replacement, as count vectors ``c``; ``theta* = (c . S) / (c . m)`` with
  ``m_g`` the group sizes. SE is the standard deviation of ``theta*``
  (``ddof=1``, as ``scipy.stats.bootstrap``); the percentile interval (linear
  interpolation, as scipy) is kept as a secondary field.
* **Holm** (confirmatory family) and **Benjamini-Hochberg** (exploratory).

Speed: count matrices are drawn in chunks of ~250 resamples (one
``rng.integers`` call and one ``np.bincount`` per chunk) and multiplied by the
``(G, metrics)`` matrix of group sums. Sign vectors are random bytes (8 groups
each), also in chunks, turned into ``sum eps S`` and ``sum eps m`` by looking
up per-byte partial sums (``ceil(G / 8)`` lookups per vector instead of G
products). The inversion re-counts the stored draws at a shifted delta, for
all columns at once. Nothing loops in Python per resample.

Reproducibility: ``paired_test(seed=s)`` draws its count matrices from
``np.random.default_rng(s)`` with exactly the draws
``rng.integers(0, G, (B, G))`` would give, so with singleton groups it
reproduces ``scipy.stats.bootstrap(..., paired=True, rng=default_rng(s))``
bit for bit. The Monte Carlo sign vectors come from one stream shared by every
metric column, ``default_rng(signflip_seed)``, by default
``derive_seed(s, "signflip")`` (each column's test has the distribution it has
alone; ``signflip_seeds`` gives each column a stream of its own instead).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np
import numpy.typing as npt

from rag_ablate.core.errors import ComparisonError

__all__ = [
    "INVERSION_RTOL",
    "MIN_RELIABLE_GROUPS",
    "TIE_RTOL",
    "Direction",
    "PairedResult",
    "PercentileSetup",
    "QuantileResult",
    "QuantileSetup",
    "benjamini_hochberg",
    "bootstrap_counts",
    "bootstrap_ratios",
    "derive_seed",
    "group_sums",
    "group_sums_sizes",
    "holm",
    "improved",
    "linearized_se",
    "min_detectable_effect",
    "paired_quantile_test",
    "paired_quantile_tests",
    "paired_test",
    "percentile_setup",
    "quantile_effects",
    "quantile_setup",
    "resample_percentiles",
    "signflip_pvalue",
    "weighted_percentiles",
    "weighted_percentiles_many",
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
#: indices drawn at once by :func:`bootstrap_counts` (a block of rows of a chunk): small enough that
#: the draw, its offsets and its counts stay in cache; it never changes the draws
COUNT_BLOCK_ELEMS = 1 << 17
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
    if g.dtype.kind in "iu" and g.min() >= 0 and g.max() < 4 * n + 1024:
        # codes already (a split's group codes): their ranks from a mask, as np.unique would number
        # them without sorting
        seen = np.zeros(int(g.max()) + 1, dtype=bool)
        seen[g] = True
        rank = np.cumsum(seen) - 1
        return rank[g].astype(np.int64), int(rank[-1]) + 1
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
    n_groups: int,
    B: int,
    rng: np.random.Generator,
    chunk: int = _DEFAULT_CHUNK,
    *,
    reuse: bool = False,
) -> Iterator[npt.NDArray[np.integer[npt.NBitBase]]]:
    """Yield (c, G) count matrices, c <= ``chunk``, B rows in total.

    Row b holds how often each of the G groups is drawn in bootstrap resample
    b (each row sums to G). The concatenated draws equal
    ``rng.integers(0, G, (B, G))`` (the order scipy's bootstrap uses), whatever
    ``chunk``. Each chunk is drawn in blocks of at most :data:`COUNT_BLOCK_ELEMS`
    indices (one ``rng.integers`` and one ``np.bincount`` over row-offset indices
    per block, small enough to stay in cache). Counts use the smallest unsigned
    dtype that can hold G, so a split's whole draw can be kept (``list(...)``)
    and shared by every variant and metric. ``reuse``: yield one buffer, refilled
    for every chunk (the caller must not keep a chunk past the next one).
    """
    if isinstance(n_groups, bool) or int(n_groups) != n_groups or n_groups < 1:
        raise ComparisonError(f"n_groups must be a positive int, got {n_groups!r}")
    if isinstance(B, bool) or int(B) != B or B < 1:
        raise ComparisonError(f"B must be a positive int, got {B!r}")
    if isinstance(chunk, bool) or int(chunk) != chunk or chunk < 1:
        raise ComparisonError(f"chunk must be a positive int, got {chunk!r}")
    n_groups, B, chunk = int(n_groups), int(B), int(chunk)
    dtype = _count_dtype(n_groups)
    block = max(1, min(chunk, COUNT_BLOCK_ELEMS // n_groups))
    # drawn as np.intp, the type np.bincount counts in: given uint32 indices (the same values: numpy
    # uses one 32-bit bounded generator for both when G < 2**32) it converts them first, which took
    # 7 ns an index against 1.4 ns for the count itself
    idx_dtype = np.intp
    buffer = np.empty((min(chunk, B), n_groups), dtype=dtype) if reuse else None
    done = 0
    while done < B:
        c = min(chunk, B - done)
        out = buffer[:c] if buffer is not None else np.empty((c, n_groups), dtype=dtype)
        for r0 in range(0, c, block):
            k = min(block, c - r0)
            idx = rng.integers(0, n_groups, size=(k, n_groups), dtype=idx_dtype)
            idx += (np.arange(k, dtype=idx_dtype) * idx_dtype(n_groups))[:, None]
            out[r0 : r0 + k] = np.bincount(idx.ravel(), minlength=k * n_groups).reshape(k, n_groups)
        yield out
        done += c


def bootstrap_ratios(counts: npt.NDArray[np.generic], sums_sizes: FloatArray) -> FloatArray:
    """``theta*`` of one count chunk (c, G): ``(c . S_j) / (c . m)`` per metric column j.

    ``sums_sizes`` is (G, m + 1): the group sums of the m metric columns, then the group
    sizes. The one product :func:`paired_test` computes per chunk; callers that stream a
    shared draw compute it here and hand the concatenation to ``paired_test(theta=...)``.
    """
    prod = np.asarray(counts).astype(np.float64, copy=False) @ sums_sizes
    m = sums_sizes.shape[1] - 1
    return np.asarray(prod[:, :m] / prod[:, m:], dtype=np.float64)


def group_sums_sizes(d: npt.ArrayLike, groups: npt.ArrayLike | None) -> FloatArray:
    """The (G, m + 1) matrix :func:`bootstrap_ratios` takes: group sums of ``d``, then sizes."""
    dm = _as_matrix(d, "d")
    if groups is None:
        sums, sizes = dm, np.ones(dm.shape[0], dtype=np.int64)
    else:
        sums, sizes = group_sums(dm, groups)
    return np.column_stack([sums, sizes.astype(np.float64)])


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

#: Bit i (0..7) of every byte value 0..255 in ``np.unpackbits`` order (most significant first).
_BYTE_BITS = ((np.arange(256, dtype=np.int64)[:, None] >> np.arange(7, -1, -1)) & 1).astype(np.float64)

#: Each end of the test-inversion interval is located to within this share of
#: the column's largest absolute group mean (bisection tolerance).
INVERSION_RTOL = 1e-10

_MAX_WIDENINGS = 64

#: from this many columns (metric columns plus the group sizes) the sign vectors are unpacked and
#: multiplied (one BLAS product for every column) instead of looked up in byte tables per column
_SIGN_PRODUCT_COLUMNS = 4


def _byte_table(values: FloatArray) -> FloatArray:
    """(K * 256, q) table whose row ``256 k + v`` sums ``values[8 k + i]`` over the set bits i of byte v.

    Summing the rows picked by a sign vector's packed bytes gives ``bits @ values``
    without unpacking the bits: K = ceil(G / 8) lookups instead of G products.
    """
    n_rows, q = values.shape
    k = (n_rows + 7) // 8
    padded = np.zeros((k * 8, q))
    padded[:n_rows] = values
    table = np.matmul(_BYTE_BITS, padded.reshape(k, 8, q))  # (k, 256, q)
    return np.ascontiguousarray(table.reshape(k * 256, q))


@dataclass(frozen=True)
class _SignFlips:
    """Null draws of one sign-flip test, kept so the test can be re-run at any shift.

    ``t`` (R, m): ``sum_g eps_g S_g`` per sign vector and column; ``w`` (R, m) or
    (R, 1): ``sum_g eps_g n_g``. The shifted statistic is ``t - delta * w``.
    """

    t: FloatArray
    w: FloatArray
    exact: bool
    budget: int  # B (Monte Carlo) -- p = (1 + count) / (B + 1); exact: p = count / R


def _enumerate_signs(sums: FloatArray, sizes: FloatArray) -> _SignFlips:
    """All ``2**G`` sign vectors (identity included), in chunks of ~1M matrix entries."""
    n_groups = sums.shape[0]
    n_vec = 1 << n_groups
    total, n_total = sums.sum(axis=0), sizes.sum()
    step = max(1, _EXACT_CHUNK_ELEMS // n_groups)
    shifts = np.arange(n_groups, dtype=np.int64)
    t_parts, w_parts = [], []
    for start in range(0, n_vec, step):
        idx = np.arange(start, min(start + step, n_vec), dtype=np.int64)
        bits = ((idx[:, None] >> shifts) & 1).astype(np.float64)
        # eps = 2 * bit - 1, hence sum(eps S) = 2 * (bits @ S) - sum(S)
        t_parts.append(2.0 * (bits @ sums) - total)
        w_parts.append(2.0 * (bits @ sizes) - n_total)
    return _SignFlips(np.concatenate(t_parts), np.concatenate(w_parts)[:, None], True, n_vec)


def _random_signs(values: FloatArray, B: int, rng: np.random.Generator, chunk: int) -> FloatArray:
    """``sum_g eps_g values[g]`` for B random sign vectors, shape (B, q).

    Per chunk: ``rng.integers(0, 256, (c, ceil(G / 8)), dtype=uint8)``; bit i of
    byte k (``np.unpackbits`` order) is group ``8 k + i``'s sign (1 = +1), padding
    bits beyond G are ignored. With fewer than :data:`_SIGN_PRODUCT_COLUMNS` columns
    the sums come from byte-table lookups, else from unpacking the bits and one
    matrix product per chunk (multithreaded BLAS); both give the same sums up to
    rounding.
    """
    n_groups, q = values.shape
    n_bytes = (n_groups + 7) // 8
    total = values.sum(axis=0)
    if q >= _SIGN_PRODUCT_COLUMNS:  # many columns: unpack the bits once, one BLAS product for all
        padded = np.zeros((n_bytes * 8, q))
        padded[:n_groups] = values
        out = np.empty((B, q))
        for done in range(0, B, chunk):
            c = min(chunk, B - done)
            bits = np.unpackbits(rng.integers(0, 256, size=(c, n_bytes), dtype=np.uint8), axis=1)
            out[done : done + c] = bits.astype(np.float64) @ padded
        return np.asarray(2.0 * out - total, dtype=np.float64)
    table = _byte_table(values)
    if q % 2:
        table = np.column_stack([table, np.zeros(table.shape[0])])
    # columns in pairs as complex numbers: one 1-D take serves two columns (fastest gather)
    pairs = [np.ascontiguousarray(table[:, k] + 1j * table[:, k + 1]) for k in range(0, q, 2)]
    offsets = (np.arange(n_bytes, dtype=np.intp) * 256)[None, :]
    out = np.empty((B, len(pairs) * 2))
    done = 0
    while done < B:
        c = min(chunk, B - done)
        packed = rng.integers(0, 256, size=(c, n_bytes), dtype=np.uint8)
        idx = packed.astype(np.intp) + offsets
        for k, pair in enumerate(pairs):
            plus = pair.take(idx).sum(axis=1)
            out[done : done + c, 2 * k] = plus.real
            out[done : done + c, 2 * k + 1] = plus.imag
        done += c
    return np.asarray(2.0 * out[:, :q] - total, dtype=np.float64)


def _draw_signflips(
    sums: FloatArray,
    sizes: FloatArray,
    B: int,
    rngs: np.random.Generator | Sequence[np.random.Generator | None],
    chunk: int = _DEFAULT_CHUNK,
) -> _SignFlips:
    """Sign-flip null draws for every column of ``sums`` (G, m).

    Exact enumeration when ``2**G <= B`` (no randomness used). Otherwise B Monte
    Carlo sign vectors: one generator shared by all columns, or one per column
    (``None`` for a column skips it: its draws are left at 0).
    """
    n_groups, m = sums.shape
    if n_groups < 63 and (1 << n_groups) <= B:
        return _enumerate_signs(sums, sizes)
    if isinstance(rngs, np.random.Generator):
        both = _random_signs(np.column_stack([sums, sizes]), B, rngs, chunk)
        return _SignFlips(np.ascontiguousarray(both[:, :m]), both[:, m:], False, B)
    t = np.zeros((B, m))
    w = np.zeros((B, m))
    for j, rng in enumerate(rngs):
        if rng is None:
            continue
        both = _random_signs(np.column_stack([sums[:, j], sizes]), B, rng, chunk)
        t[:, j] = both[:, 0]
        w[:, j] = both[:, 1]
    return _SignFlips(t, w, False, B)


def _given_signs(signs: npt.ArrayLike, sums: FloatArray, sizes: FloatArray, B: int) -> _SignFlips:
    """``paired_test(signs=...)``'s null draws: the sums given, or every sign vector when the test
    enumerates them (``2**G <= B``)."""
    n_groups, m = sums.shape
    if n_groups < 63 and (1 << n_groups) <= B:
        return _enumerate_signs(sums, sizes)
    both = np.asarray(signs, dtype=np.float64)
    if both.ndim != 2 or both.shape[1] != m + 1 or both.shape[0] == 0:
        raise ComparisonError(f"signs: expected shape (R, {m + 1}) with R >= 1, got {both.shape}")
    return _SignFlips(np.ascontiguousarray(both[:, :m]), both[:, m:], False, both.shape[0])


def _pvalue_at(flips: _SignFlips, sums: FloatArray, sizes: FloatArray, delta: FloatArray) -> FloatArray:
    """Two-sided p of the sign-flip test on ``d - delta`` (one shift per column).

    Group sums become ``S_g - delta n_g``; a sign vector counts when
    ``|T*| >= |T_obs| - 1e-9 * sum_g |S_g - delta n_g|``. ``delta = 0`` is the
    reported p-value.
    """
    shifted = sums - delta[None, :] * sizes[:, None]
    threshold = np.abs(sums.sum(axis=0) - delta * sizes.sum()) - TIE_RTOL * np.abs(shifted).sum(axis=0)
    t = flips.t if not np.any(delta) else flips.t - delta[None, :] * flips.w
    count = np.count_nonzero(np.abs(t) >= threshold, axis=0)
    if flips.exact:
        return np.asarray(count / float(flips.t.shape[0]), dtype=np.float64)
    return np.asarray((1.0 + count) / (flips.budget + 1.0), dtype=np.float64)


def signflip_pvalue(
    sums: npt.ArrayLike, *, B: int, rng: np.random.Generator, chunk: int = _DEFAULT_CHUNK
) -> tuple[FloatArray, bool]:
    """Two-sided sign-flip p-value over groups, per column of ``sums`` (G, m).

    ``T = sum_g eps_g S_g``. Exact (all ``2**G`` sign vectors, identity
    included, ``p = count / 2**G``) when ``2**G <= B``; otherwise ``B`` random
    sign vectors from ``rng``, shared by all columns, and
    ``p = (1 + count) / (B + 1)``. A vector counts when
    ``|T*| >= |T_obs| - 1e-9 * sum_g |S_g|``. Returns (p, exact).
    :func:`paired_test` gives each column its own stream instead.
    """
    s = _as_matrix(sums, "sums")
    if isinstance(B, bool) or int(B) != B or B < 1:
        raise ComparisonError(f"B must be a positive int, got {B!r}")
    sizes = np.ones(s.shape[0])
    flips = _draw_signflips(s, sizes, int(B), rng, chunk)
    return _pvalue_at(flips, s, sizes, np.zeros(s.shape[1])), flips.exact


def _snap_to_breakpoint(
    flips: _SignFlips,
    sums: FloatArray,
    sizes: FloatArray,
    end: FloatArray,
    effect: FloatArray,
    p0: FloatArray,
    alpha: float,
    xtol: FloatArray,
) -> FloatArray:
    """Move each bisection end onto the exact breakpoint it approximates, when that is safe.

    The acceptance set of a sign vector ends where ``|t - delta w| = |T_obs(delta)|``,
    i.e. at ``(t - sum S) / (w - n)`` or ``(t + sum S) / (w + n)`` (means of
    subsets of groups). The tie tolerance moves a breakpoint by up to
    ``1e-9 * sum_g |S_g - delta n_g| / |w -+ n|``, so bisection can stop a hair
    beyond a tie (e.g. -1.6e-10 instead of 0). The nearest breakpoint within
    twice its blur (plus the bisection tolerance) replaces the end when the
    test does not reject there and it keeps 0 on the side ``p0`` says.
    """
    n_total = sizes.sum()
    total = sums.sum(axis=0)
    slopes = np.concatenate(np.broadcast_arrays(np.abs(flips.w - n_total), np.abs(flips.w + n_total)))
    with np.errstate(divide="ignore", invalid="ignore"):
        roots = np.concatenate(
            [(flips.t - total) / (flips.w - n_total), (flips.t + total) / (flips.w + n_total)]
        )
        # the tie tolerance moves the crossing of a root by tol / |slope|
        tol = TIE_RTOL * np.abs(sums - end[None, :] * sizes[:, None]).sum(axis=0)
        blur = 2.0 * tol[None, :] / slopes + 4.0 * xtol[None, :]
    dist = np.abs(roots - end[None, :])
    dist[~np.isfinite(dist) | ~(dist <= blur)] = np.inf
    k = np.argmin(dist, axis=0)
    cols = np.arange(end.size)
    best, gap = roots[k, cols], dist[k, cols]
    ok = np.isfinite(gap)
    best = np.where(ok, best, end)
    # a breakpoint that is 0 in exact arithmetic (0.1 - 0.1 + ...) can come out as -1e-16
    best = np.where(ok & (p0 >= alpha) & (np.abs(best) <= blur[k, cols]), 0.0, best)
    ok &= _pvalue_at(flips, sums, sizes, best) >= alpha
    crosses_zero = (np.minimum(best, effect) <= 0.0) & (np.maximum(best, effect) >= 0.0)
    ok &= (p0 >= alpha) | ~crosses_zero
    return np.asarray(np.where(ok, best, end), dtype=np.float64)


def _invert_signflip(
    flips: _SignFlips,
    sums: FloatArray,
    sizes: FloatArray,
    effect: FloatArray,
    p0: FloatArray,
    boot: tuple[FloatArray, FloatArray],
    alpha: float,
) -> tuple[FloatArray, FloatArray]:
    """The shifts delta the sign-flip test does not reject (p >= alpha), per column.

    Every sign vector's acceptance set ``{delta: |T*(delta)| >= |T_obs(delta)|}``
    is an interval around the effect whose ends are means of some groups, so
    the test's acceptance set is an interval inside [min, max] of the group
    means, or the whole line when even ``|delta| -> inf`` is not rejected (the
    only vectors that still count are all +1 and all -1: p_inf = 2 / 2**G
    exact, (1 + #such draws) / (B + 1) Monte Carlo). Each end is found by
    bisection between an accepted point (the effect, or 0 when p(0) >= alpha)
    and a rejected one (the percentile bootstrap end, else just beyond the
    group means, widened until rejected; 0 when p(0) < alpha), to within
    ``INVERSION_RTOL`` times the largest absolute group mean. The reported ends
    are accepted points, and 0 is inside exactly when ``p0 >= alpha``.
    """
    m = sums.shape[1]
    means = sums / sizes[:, None]
    gmin, gmax = means.min(axis=0), means.max(axis=0)
    scale = np.maximum(np.abs(gmin), np.abs(gmax))
    xtol = INVERSION_RTOL * scale
    n_total = sizes.sum()
    c_inf = np.count_nonzero(np.abs(flips.w) >= n_total * (1.0 - 1e-12), axis=0) * np.ones(m)
    p_inf = c_inf / flips.t.shape[0] if flips.exact else (1.0 + c_inf) / (flips.budget + 1.0)
    unbounded = p_inf >= alpha
    degenerate = ~unbounded & (_pvalue_at(flips, sums, sizes, effect) < alpha)
    lows, highs = np.full(m, -np.inf), np.full(m, np.inf)
    for side in (-1.0, 1.0):
        # distances from the effect in this side's direction; delta = effect + side * x
        def at(x: FloatArray, side: float = side) -> FloatArray:
            return np.asarray(effect + side * x)

        def accepted(x: FloatArray, side: float = side) -> BoolArray:
            return np.asarray(_pvalue_at(flips, sums, sizes, at(x)) >= alpha)

        x_in = np.zeros(m)
        x_zero = side * (0.0 - effect)
        zero_here = x_zero > 0
        zero_in = zero_here & (p0 >= alpha)
        x_in[zero_in] = x_zero[zero_in]
        # a rejected point beyond the group means (widened until the test rejects)
        g_end = gmin if side < 0 else gmax
        step = np.maximum(side * (g_end - effect), 0.0) + 1e-6 * scale + np.finfo(np.float64).tiny
        x_out = np.maximum(x_in, 0.0) + step
        todo = ~unbounded & ~degenerate
        for _ in range(_MAX_WIDENINGS):
            still = todo & accepted(x_out)
            if not np.any(still):
                break
            step = np.where(still, 2.0 * step, step)
            x_out = np.where(still, x_in + step, x_out)
        else:  # pragma: no cover - p_inf < alpha guarantees a rejection beyond the group means
            unbounded |= todo & accepted(x_out)
            todo &= ~unbounded
        # tighter rejected points: the percentile bootstrap end, and 0 when it is rejected
        x_boot = side * ((boot[0] if side < 0 else boot[1]) - effect)
        use_boot = todo & (x_boot > x_in) & (x_boot < x_out) & ~accepted(np.where(x_boot > 0, x_boot, 0.0))
        x_out = np.where(use_boot, x_boot, x_out)
        zero_out = todo & zero_here & (p0 < alpha) & (x_zero < x_out)
        x_out = np.where(zero_out, x_zero, x_out)
        while True:
            active = todo & (x_out - x_in > xtol)
            mid = 0.5 * (x_in + x_out)
            active &= (mid > x_in) & (mid < x_out)  # stop at float resolution
            if not np.any(active):
                break
            ok = accepted(np.where(active, mid, x_in))
            x_in = np.where(active & ok, mid, x_in)
            x_out = np.where(active & ~ok, mid, x_out)
        end = np.where(degenerate, effect, at(x_in))
        end = np.where(todo, _snap_to_breakpoint(flips, sums, sizes, end, effect, p0, alpha, xtol), end)
        end = np.where(unbounded, side * np.inf, end)
        if side < 0:
            lows = end
        else:
            highs = end
    # 0 is accepted exactly when p0 >= alpha (only needed for a degenerate column)
    keep0 = p0 >= alpha
    lows = np.where(keep0, np.minimum(lows, 0.0), lows)
    highs = np.where(keep0, np.maximum(highs, 0.0), highs)
    return np.asarray(lows, dtype=np.float64), np.asarray(highs, dtype=np.float64)


# --------------------------------------------------------------------------- paired test


@dataclass(frozen=True, eq=False)
class PairedResult:
    """Comparison of one variant against the baseline; every array has shape (m,).

    ``effect``: variant mean - baseline mean over queries (never sign-flipped).
    ``se``: SD of the group-bootstrap distribution (ddof=1).
    ``ci_low``/``ci_high``: the interval at level ``1 - alpha`` obtained by
    inverting the group sign-flip test (``ci_method``): every shift delta for
    which the test on ``d - delta``, with the same sign vectors as ``p_value``,
    gives ``p >= alpha``. It excludes 0 exactly when ``p_value < alpha``. It is
    ``(-inf, inf)`` when the test can never reject (e.g. 5 groups or fewer at
    alpha 0.05: the smallest exact p is 2 / 2**G).
    ``boot_ci_low``/``boot_ci_high``: percentile group-bootstrap interval
    (secondary; it can disagree with ``p_value`` near the boundary).
    ``p_value``: two-sided group sign-flip p -- the one to report and adjust.
    ``p_exact``: whether ``p_value`` came from full enumeration.
    ``p_bootstrap``: ``min(1, 2 * min(share(theta* <= 0), share(theta* >= 0)))``
    (``theta*`` within ``1e-9 * sum_g |S_g| / n`` of 0 counts on both sides),
    i.e. roughly the level at which the percentile CI starts to exclude 0.
    For reference only: it is too small with few queries or groups.
    ``bootstrap_unreliable``: ``n_groups < MIN_RELIABLE_GROUPS`` (30).
    A metric whose differences are all 0 gets effect 0, SE 0, both intervals
    [0, 0], ``p_value = p_bootstrap = 1`` and ``p_exact = True``.
    ``n_resamples``: bootstrap replicates used; ``alpha``: the intervals' alpha.
    Arrays are read-only.
    """

    effect: FloatArray
    se: FloatArray
    ci_low: FloatArray
    ci_high: FloatArray
    boot_ci_low: FloatArray
    boot_ci_high: FloatArray
    p_value: FloatArray
    p_exact: BoolArray
    p_bootstrap: FloatArray
    bootstrap_unreliable: bool
    n_queries: int
    n_groups: int
    n_resamples: int = 0  # bootstrap replicates actually used (0 = not recorded)
    alpha: float = 0.05
    ci_method: str = "signflip_inversion"


def _freeze(a: npt.NDArray[np.generic]) -> None:
    a.setflags(write=False)


def _signflip_rngs(
    seed: int, signflip_seeds: Sequence[int] | None, signflip_seed: int | None, m: int, zero: BoolArray
) -> np.random.Generator | list[np.random.Generator | None]:
    """One generator shared by every column (``signflip_seed``, by default
    ``derive_seed(seed, "signflip")``), or one per column (``signflip_seeds``; None for a column
    whose differences are all 0)."""
    if signflip_seeds is None:
        if signflip_seed is None:
            signflip_seed = derive_seed(seed, "signflip")
        if (
            isinstance(signflip_seed, bool)
            or not isinstance(signflip_seed, (int, np.integer))
            or signflip_seed < 0
        ):
            raise ComparisonError(f"signflip_seed: expected a non-negative int, got {signflip_seed!r}")
        return np.random.default_rng(int(signflip_seed))
    if signflip_seed is not None:
        raise ComparisonError("pass signflip_seed (one stream for all columns) or signflip_seeds, not both")
    seeds = list(signflip_seeds)
    if len(seeds) != m:
        raise ComparisonError(f"signflip_seeds: expected one seed per metric column ({m}), got {len(seeds)}")
    for j, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ComparisonError(f"signflip_seeds[{j}]: expected a non-negative int, got {s!r}")
    return [None if zero[j] else np.random.default_rng(int(s)) for j, s in enumerate(seeds)]


def paired_test(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike | None,
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Sequence[npt.NDArray[np.integer[npt.NBitBase]]] | None = None,
    signflip_seeds: Sequence[int] | None = None,
    theta: npt.ArrayLike | None = None,
    signflip_seed: int | None = None,
    signs: npt.ArrayLike | None = None,
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
    ``signflip_seed``: the seed of the one stream of Monte Carlo sign vectors
    every column shares (``np.random.default_rng(signflip_seed)``; None means
    ``derive_seed(seed, "signflip")``): one (c, G) chunk of signs times the
    (G, m + 1) matrix of group sums and sizes. Each column's test has exactly
    the distribution it has on a stream of its own; only the columns' draws
    are no longer independent of each other (docs/statistics.md).
    ``signflip_seeds``: instead, one seed per column for its own stream
    (``np.random.default_rng(signflip_seeds[j])``): a column's p-value and
    interval then depend only on its own data and seed. The interval of column
    j re-uses exactly the sign vectors of its p-value (see docs/statistics.md).
    ``theta``: the bootstrap ratios already computed from a shared draw, (B, m),
    the concatenation of :func:`bootstrap_ratios` over its chunks (a caller that
    streams one draw to many tests, e.g. the comparison step, keeps no count
    matrix); ``counts`` is then ignored. The result equals ``counts=`` with
    that draw's chunks. A row of NaN is a resample that drew none of these
    queries' groups (a domain of a larger draw, e.g. a slice: see
    :mod:`rag_ablate.compare.draws`); it is left out, like scipy's bootstrap
    leaves out a resample whose statistic is undefined, and ``n_resamples``
    counts the rest.
    ``signs``: the Monte Carlo sign-flip sums already computed from a shared
    stream of sign vectors, (R, m + 1): per vector ``sum_g eps_g S_g`` of each
    column, then ``sum_g eps_g n_g`` (:meth:`rag_ablate.compare.draws.SharedDraws.add_signs`;
    a comparison's tests of a split take their groups' signs from one stream);
    the seeds are then not used. Ignored when the test enumerates (``2**G <= B``).
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
    zero = np.all(d == 0, axis=0)
    rngs = _signflip_rngs(seed, signflip_seeds, signflip_seed, m, zero)
    if groups is None:
        sums, sizes = d, np.ones(n, dtype=np.int64)
    else:
        sums, sizes = group_sums(d, groups)
    n_groups = sums.shape[0]

    effect = d.mean(axis=0)
    # one product per chunk gives numerators (m columns) and denominator (last column)
    sizes_f = sizes.astype(np.float64)
    sums_sizes = np.column_stack([sums, sizes_f])
    chunks: Iterator[npt.NDArray[np.integer[npt.NBitBase]]] | Sequence[npt.NDArray[np.integer[npt.NBitBase]]]
    boot: FloatArray
    if theta is not None:
        boot = np.asarray(theta, dtype=np.float64)
        if boot.ndim != 2 or boot.shape[1] != m or boot.shape[0] == 0:
            raise ComparisonError(f"theta: expected shape (B, {m}) with B >= 1, got {boot.shape}")
        drew = ~np.isnan(boot).any(axis=1)  # NaN: a resample of a larger draw without these groups
        if not np.all(drew):
            boot = boot[drew]
        if boot.shape[0] == 0:
            raise ComparisonError("theta: no resample drew any of these groups")
    else:
        if counts is None:
            chunks = bootstrap_counts(n_groups, int(B), np.random.default_rng(seed))
        else:
            _check_counts(counts, n_groups)
            chunks = counts
        boot = np.concatenate([bootstrap_ratios(ch, sums_sizes) for ch in chunks], axis=0)
    n_boot = boot.shape[0]

    se = boot.std(axis=0, ddof=1) if n_boot > 1 else np.zeros(m)
    boot_lo, boot_hi = np.percentile(boot, [100.0 * alpha / 2, 100.0 * (1 - alpha / 2)], axis=0)
    tol = TIE_RTOL * np.abs(sums).sum(axis=0) / n
    below = np.count_nonzero(boot <= tol, axis=0)
    above = np.count_nonzero(boot >= -tol, axis=0)
    p_boot = np.minimum(1.0, 2.0 * np.minimum(below, above) / n_boot)

    flips = (
        _draw_signflips(sums, sizes_f, int(B), rngs)
        if signs is None
        else _given_signs(signs, sums, sizes_f, B)
    )
    p = _pvalue_at(flips, sums, sizes_f, np.zeros(m))
    p_exact = np.full(m, flips.exact)
    lo, hi = np.zeros(m), np.zeros(m)
    live = ~zero
    if np.any(live):
        sub = _SignFlips(
            flips.t[:, live],
            flips.w if flips.w.shape[1] == 1 else flips.w[:, live],
            flips.exact,
            flips.budget,
        )
        lo[live], hi[live] = _invert_signflip(
            sub, sums[:, live], sizes_f, effect[live], p[live], (boot_lo[live], boot_hi[live]), alpha
        )

    if np.any(zero):
        effect[zero] = 0.0
        se[zero] = 0.0
        boot_lo[zero] = 0.0
        boot_hi[zero] = 0.0
        p[zero] = 1.0
        p_boot[zero] = 1.0
        p_exact[zero] = True

    arrays = (effect, se, lo, hi, boot_lo, boot_hi, p, p_exact, p_boot)
    for a in arrays:
        _freeze(a)
    return PairedResult(
        effect=effect,
        se=se,
        ci_low=lo,
        ci_high=hi,
        boot_ci_low=boot_lo,
        boot_ci_high=boot_hi,
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


# --------------------------------------------------------------------------- power


def min_detectable_effect(se: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true effect a two-sided test at ``alpha`` detects with probability ``power``:
    ``(z_{1-alpha/2} + z_power) * se``, with ``se`` the group-bootstrap SE of the effect (so it
    shrinks as ``1 / sqrt(G)`` with the number of groups G). 2.80 SE at alpha 0.05 and 80% power."""
    if not (0.0 < alpha < 1.0 and 0.0 < power < 1.0):
        raise ComparisonError(f"alpha and power must be in (0, 1), got {alpha!r} and {power!r}")
    z = NormalDist()
    return float((z.inv_cdf(1.0 - alpha / 2.0) + z.inv_cdf(power)) * se)


# --------------------------------------------------------------------------- quantiles


@dataclass(frozen=True)
class QuantileResult:
    """A paired comparison of one percentile (e.g. p95 latency) of one split.

    ``effect`` = the variant's q-th percentile minus the baseline's, both over the
    same paired queries (numpy's linear interpolation). ``ci_low``/``ci_high``: the
    group-bootstrap percentile interval of that difference; ``p_value``: two-sided
    bootstrap p, ``(1 + #{effect* on the far side of 0}) * 2 / (B + 1)`` capped at 1.
    """

    q: float
    baseline: float
    variant: float
    effect: float
    ci_low: float
    ci_high: float
    se: float
    p_value: float
    n_queries: int
    n_groups: int
    bootstrap_unreliable: bool


def weighted_percentiles(
    sorted_x: FloatArray, weights: npt.NDArray[np.integer[npt.NBitBase]], q: float
) -> FloatArray:
    """Per row of ``weights`` (r, n): ``np.percentile(np.repeat(sorted_x, w), q)`` without repeating.

    ``sorted_x`` is ascending; a row's expanded sample has ``N = sum(w)`` values, its
    percentile sits at position ``h = (N - 1) q / 100`` and interpolates linearly
    between the order statistics at ``floor(h)`` and ``floor(h) + 1``.
    """
    return weighted_percentiles_many(sorted_x, weights, (q,))[:, 0]


def weighted_percentiles_many(
    sorted_x: FloatArray, weights: npt.NDArray[np.integer[npt.NBitBase]], qs: Sequence[float]
) -> FloatArray:
    """:func:`weighted_percentiles` for several q at once, shape (r, len(qs)): one running sum
    per row serves every q, and each order statistic is found by binary search in it."""
    w = np.asarray(weights)
    r, n = w.shape
    cum = np.cumsum(w.astype(np.int64), axis=1)
    total = cum[:, -1].copy()
    if np.any(total < 1):
        raise ComparisonError("weighted_percentiles: a row has no weight")
    # rows laid end to end, row k shifted by k (N_max + 1): one sorted array, one search for all rows
    step = int(total.max()) + 1
    offsets = np.arange(r, dtype=np.int64) * step
    cum += offsets[:, None]
    flat = cum.ravel()
    base = np.arange(r, dtype=np.int64) * n
    out = np.empty((r, len(qs)))
    for k, q in enumerate(qs):
        h = (total - 1) * (q / 100.0)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, total - 1)
        # the order statistic k (0-based) of a row is x[j] for the first j with cum[j] > k
        j_lo = np.searchsorted(flat, lo + offsets, side="right") - base
        j_hi = np.searchsorted(flat, hi + offsets, side="right") - base
        x_lo, x_hi = sorted_x[j_lo], sorted_x[j_hi]
        out[:, k] = x_lo + (h - lo) * (x_hi - x_lo)
    return out


#: half-width of the window of sorted positions searched first for a bootstrap percentile:
#: ``max(QUANTILE_WINDOW_MIN, QUANTILE_WINDOW_SD * sd)``, with ``sd`` the standard deviation over
#: resamples of the queries drawn before the percentile's position minus its share of every query
#: drawn (rows whose percentile falls outside the window are computed over all n positions; the
#: result is the same either way, only the time differs)
QUANTILE_WINDOW_MIN = 64
QUANTILE_WINDOW_SD = 8.0


@dataclass(frozen=True)
class _QuantileSide:
    """One side of a percentile comparison: sorted values, each one's group, and per q a window
    ``[start, end)`` of sorted positions with the group counts of the positions before it."""

    x: FloatArray
    codes: IntArray
    windows: tuple[tuple[int, int, FloatArray], ...]


def _quantile_side(x: FloatArray, codes: IntArray, n_groups: int, qs: Sequence[float]) -> _QuantileSide:
    n = x.shape[0]
    sizes = np.bincount(codes, minlength=n_groups).astype(np.float64)
    windows = []
    for q in qs:
        pos = int((n - 1) * q / 100.0)
        # a resample's count before ``pos`` less q% of its queries is a sum over its drawn groups of
        # ``x_g = (group g's queries before pos) - q% of m_g``; its SD over resamples is about
        # sqrt(sum_g (x_g - mean x)^2) (G draws of one group each)
        dev = np.bincount(codes[:pos], minlength=n_groups) - (q / 100.0) * sizes
        sd = float(np.sqrt(np.sum((dev - dev.mean()) ** 2)))
        half = max(QUANTILE_WINDOW_MIN, math.ceil(QUANTILE_WINDOW_SD * sd) + 2)
        start, end = max(0, pos - half), min(n, pos + half + 1)
        before = np.bincount(codes[:start], minlength=n_groups).astype(np.float64)
        windows.append((start, end, before))
    return _QuantileSide(x, codes, tuple(windows))


@dataclass(frozen=True)
class QuantileSetup:
    """The two sides of :func:`paired_quantile_tests`, sorted, with each value's group code, and the
    (G, 1 + 2 len(qs)) matrix whose product with a chunk's counts gives each resample's number of
    queries and its running sum before each window (integers, exact in float64)."""

    base: _QuantileSide
    var: _QuantileSide
    qs: tuple[float, ...]
    n_groups: int
    sizes_before: FloatArray


def quantile_setup(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike,
    qs: Sequence[float],
    *,
    n_groups: int | None = None,
) -> QuantileSetup:
    """Both sides sorted (stable), for the bootstrap of the percentiles ``qs`` (:func:`quantile_effects`).

    ``n_groups``: ``groups`` are already codes 0..n_groups-1 of a larger draw's groups (some may
    hold none of these queries), instead of labels to factorise."""
    b = np.asarray(baseline, dtype=np.float64).reshape(-1)
    v = np.asarray(variant, dtype=np.float64).reshape(-1)
    n = b.shape[0]
    if v.shape[0] != n:
        raise ComparisonError(f"baseline has {n} values, variant {v.shape[0]}")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(v))):
        raise ComparisonError("paired_quantile_test: NaN or inf value")
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ComparisonError(f"q must be in [0, 100], got {q}")
    if n_groups is None:
        codes, n_groups = _factorise(groups, n)
    else:
        codes = np.asarray(groups, dtype=np.int64).reshape(-1)
        if codes.shape[0] != n or (n and (codes.min() < 0 or codes.max() >= n_groups)):
            raise ComparisonError(f"groups: expected {n} codes in 0..{n_groups - 1}")
    ob, ov = np.argsort(b, kind="stable"), np.argsort(v, kind="stable")
    base = _quantile_side(b[ob], codes[ob], n_groups, qs)
    var = _quantile_side(v[ov], codes[ov], n_groups, qs)
    sizes = np.bincount(codes, minlength=n_groups).astype(np.float64)
    cols = [sizes] + [w[2] for w in base.windows] + [w[2] for w in var.windows]
    return QuantileSetup(base, var, tuple(float(q) for q in qs), n_groups, np.column_stack(cols))


def _side_percentiles(
    side: _QuantileSide,
    c: npt.NDArray[np.generic],
    total: IntArray,
    pres: IntArray,
    qs: Sequence[float],
) -> FloatArray:
    """:func:`weighted_percentiles_many` of one side for the count rows ``c`` (r, G), exactly, mostly
    from a window of sorted positions.

    ``total`` (r,) is each row's number of queries and ``pres`` (r, len(qs)) its running sum just
    before each q's window. When the order statistics at ``floor(h)`` and ``floor(h) + 1`` fall
    inside the window (the running sum before it is at most ``floor(h)`` and at its end above
    ``floor(h) + 1``), they are found by binary search in the window's running sum; other rows
    take every position.
    """
    r = c.shape[0]
    out = np.empty((r, len(qs)))
    step = int(total.max()) + 1
    offsets = np.arange(r, dtype=np.int64) * step
    for k, q in enumerate(qs):
        start, end, _ = side.windows[k]
        width = end - start
        h = (total - 1) * (q / 100.0)
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, total - 1)
        pre = pres[:, k]
        cum = np.cumsum(c[:, side.codes[start:end]].astype(np.int64), axis=1)  # (faster than dtype=)
        cum += (pre + offsets)[:, None]
        inside = (pre <= lo) & (cum[:, -1] - offsets > hi)
        flat = cum.ravel()
        base = np.arange(r, dtype=np.int64) * width - start
        last = side.x.shape[0] - 1
        j_lo = np.clip(np.searchsorted(flat, lo + offsets, side="right") - base, 0, last)
        j_hi = np.clip(np.searchsorted(flat, hi + offsets, side="right") - base, 0, last)
        x_lo, x_hi = side.x[j_lo], side.x[j_hi]
        out[:, k] = x_lo + (h - lo) * (x_hi - x_lo)
        if not np.all(inside):
            rest = ~inside
            out[rest, k] = weighted_percentiles_many(side.x, c[rest][:, side.codes], (q,))[:, 0]
    return out


def quantile_effects(
    counts: npt.NDArray[np.generic],
    setup: QuantileSetup,
    counts_f64: FloatArray | None = None,
    sums: FloatArray | None = None,
) -> FloatArray:
    """Bootstrap effects (variant - baseline percentile) of one count chunk (c, G), shape (c, len(qs)).

    ``counts_f64``: the chunk already converted to float64 (shared with other consumers of a draw);
    ``sums``: the chunk's product with ``setup.sizes_before``, already taken (a shared draw takes it
    with every other test's columns). Equal to :func:`weighted_percentiles_many` over every position
    of both sides. A row that draws none of the queries (possible when the setup's groups are a
    domain of a larger draw) is NaN."""
    c = np.asarray(counts)
    k = len(setup.qs)
    if sums is None:
        cf = c.astype(np.float64) if counts_f64 is None else counts_f64
        sums = cf @ setup.sizes_before  # one pass over the chunk for every sum
    whole = np.rint(sums).astype(np.int64)
    total = whole[:, 0]
    ok = total > 0
    if not np.all(ok):
        out = np.full((c.shape[0], k), np.nan)
        if np.any(ok):
            out[ok] = quantile_effects(c[ok], setup, sums=sums[ok])
        return out
    return np.asarray(
        _side_percentiles(setup.var, c, total, whole[:, 1 + k :], setup.qs)
        - _side_percentiles(setup.base, c, total, whole[:, 1 : 1 + k], setup.qs),
        dtype=np.float64,
    )


@dataclass(frozen=True)
class PercentileSetup:
    """One set of values (sorted, each with its group code) for :func:`resample_percentiles`, and the
    (G, 2) matrix whose product with a chunk's counts gives each resample's number of values and
    its running sum before the percentile's window."""

    side: _QuantileSide
    q: float
    cols: FloatArray


def percentile_setup(values: npt.ArrayLike, codes: npt.ArrayLike, n_groups: int, q: float) -> PercentileSetup:
    """``values`` (n,) with group codes 0..``n_groups``-1 (groups without a value allowed), for the
    q-th percentile of every resample (:func:`resample_percentiles`)."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    c = np.asarray(codes, dtype=np.int64).reshape(-1)
    order = np.argsort(x, kind="stable")
    side = _quantile_side(x[order], c[order], n_groups, (q,))
    sizes = np.bincount(c, minlength=n_groups).astype(np.float64)
    return PercentileSetup(side, float(q), np.column_stack([sizes, side.windows[0][2]]))


def resample_percentiles(
    counts: npt.NDArray[np.generic],
    setup: PercentileSetup,
    counts_f64: FloatArray | None = None,
    sums: FloatArray | None = None,
) -> FloatArray:
    """The q-th percentile (numpy's linear) of the values repeated by their group's count, per row
    of ``counts`` (c, G); NaN for a row that draws no value. Equal to
    :func:`weighted_percentiles` over every position, found mostly in a window of positions.
    ``sums``: the chunk's product with ``setup.cols``, already taken (a shared draw takes it with
    every other test's columns)."""
    c = np.asarray(counts)
    if sums is None:
        cf = c.astype(np.float64) if counts_f64 is None else counts_f64
        sums = cf @ setup.cols
    whole = np.rint(sums).astype(np.int64)
    total = whole[:, 0]
    out = np.full(c.shape[0], np.nan)
    ok = total > 0
    if np.all(ok):
        out[:] = _side_percentiles(setup.side, c, total, whole[:, 1:], (setup.q,))[:, 0]
    elif np.any(ok):
        out[ok] = _side_percentiles(setup.side, c[ok], total[ok], whole[ok, 1:], (setup.q,))[:, 0]
    return out


def paired_quantile_test(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike,
    q: float,
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Sequence[npt.NDArray[np.integer[npt.NBitBase]]] | None = None,
) -> QuantileResult:
    """Difference of the q-th percentile (variant - baseline) with a group-bootstrap interval.

    Each bootstrap resample draws groups with replacement (the count vectors of
    :func:`bootstrap_counts`; pass ``counts`` to share the draw the comparison
    uses for the means) and recomputes both percentiles over the resampled
    queries, paired: a query enters both sides with its group's count. A
    percentile is not a sum over groups, so there is no sign-flip test here; the
    interval and p come from the bootstrap alone and are flagged unreliable below
    :data:`MIN_RELIABLE_GROUPS` groups. :func:`paired_quantile_tests` does several q at once.
    """
    return paired_quantile_tests(baseline, variant, groups, (q,), B=B, seed=seed, alpha=alpha, counts=counts)[
        0
    ]


def paired_quantile_tests(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike,
    qs: Sequence[float],
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Sequence[npt.NDArray[np.integer[npt.NBitBase]]] | None = None,
    effects: npt.ArrayLike | None = None,
) -> list[QuantileResult]:
    """:func:`paired_quantile_test` for each q of ``qs`` on one draw (one running sum per resample).

    ``effects``: the bootstrap effects already computed from a shared draw, (B, len(qs)), the
    concatenation of :func:`quantile_effects` over its chunks; ``counts`` is then ignored.
    """
    setup = quantile_setup(baseline, variant, groups, qs)
    n, n_groups = setup.base.x.shape[0], setup.n_groups
    if effects is not None:
        eff_all = np.asarray(effects, dtype=np.float64)
        if eff_all.ndim != 2 or eff_all.shape[1] != len(qs) or eff_all.shape[0] == 0:
            raise ComparisonError(f"effects: expected shape (B, {len(qs)}), got {eff_all.shape}")
        eff_all = eff_all[~np.isnan(eff_all).any(axis=1)]  # resamples without these queries' groups
        if eff_all.shape[0] == 0:
            raise ComparisonError("effects: no resample drew any of these groups")
    else:
        if counts is None:
            counts = list(bootstrap_counts(n_groups, B, np.random.default_rng(seed)))
        _check_counts(counts, n_groups)
        eff_all = np.concatenate([quantile_effects(chunk, setup) for chunk in counts])
    out = []
    for k, q in enumerate(qs):
        eff = eff_all[:, k]
        n_boot = eff.shape[0]
        qb, qv = float(np.percentile(setup.base.x, q)), float(np.percentile(setup.var.x, q))
        low, high = np.percentile(eff, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        below, above = int(np.sum(eff <= 0)), int(np.sum(eff >= 0))
        p = (
            1.0
            if below == n_boot and above == n_boot
            else min(1.0, 2 * (1 + min(below, above)) / (n_boot + 1))
        )
        out.append(
            QuantileResult(
                q=float(q),
                baseline=qb,
                variant=qv,
                effect=qv - qb,
                ci_low=float(low),
                ci_high=float(high),
                se=float(np.std(eff, ddof=1)) if n_boot > 1 else float("nan"),
                p_value=p,
                n_queries=n,
                n_groups=n_groups,
                bootstrap_unreliable=n_groups < MIN_RELIABLE_GROUPS,
            )
        )
    return out
