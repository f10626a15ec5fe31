"""The similarity join: components of normalised texts whose n-gram sets are similar.

:func:`components` takes normalised texts (see
:mod:`rag_ablate.dataset.grouping.normalize`) and returns, per text, the label of its
connected component in the graph "character n-gram Jaccard >= threshold".

1. Items whose normalised texts are identical are joined at once; only the
   distinct normalised texts go on.
2. Character n-gram sets (:func:`shingle`, equal to
   :func:`~rag_ablate.dataset.grouping.normalize.char_ngrams`; n = 4 by default:
   Chinese has no spaces, so words are no unit). A text shorter than n
   characters is one "gram": itself, so short questions group only with
   identical ones.
3. Candidate pairs:
   * ``exact`` (at most ``exact_limit`` distinct normalised texts): prefix
     filtering, an exact all-pairs similarity join. Grams are ordered by
     rarity; a pair with Jaccard >= t must share a gram among the first
     ``|A| - ceil(t|A|) + 1`` grams of each set, so no qualifying pair is
     missed. The result equals a brute-force pairwise comparison (tested).
   * ``minhash`` (more texts): ``num_perm`` MinHash values per text
     (multiply-add-shift hashing in numpy), LSH with ``bands x rows`` chosen
     so that a pair exactly at the threshold becomes a candidate with
     probability >= 0.995 (t = 0.7, 128 permutations: 32 bands of 4 rows,
     0.99985). Candidates then pass two cheap filters: the b-bit MinHash
     estimate of J (drops pairs more than 5 standard deviations below the
     threshold; a pair at the threshold is dropped with probability < 1e-6)
     and the prefix-filter condition above (exact, loses nothing).
4. Every remaining pair is verified with the exact Jaccard of the n-gram sets
   (``|A & B| >= threshold * |A | B|``, with a 1e-9 relative tolerance), so
   the MinHash path never joins a pair the exact path would not; it can only
   miss one. A miss needs *every* path between two texts to be missed, which
   for a pair at exactly J = t with no other link has probability about
   1.5e-4 (LSH) + 1e-6 (estimate filter). Tests: same partition as the exact
   path on 3,000-item synthetic sets; of 1,000 isolated pairs with J in
   [0.69, 0.76] at most 1% may be missing (none are, with the seeds tried).
   The benchmark's 100,000 queries give the same partition with both methods.
5. Union-find over the accepted pairs. Pairs are taken by their distance in
   a bucket (1, then 2-3, 4-7, ...): the first round chains a bucket of
   near-identical texts together, after which its remaining pairs are
   skipped (their ends are connected already), which saves work without
   changing the partition. A pair found in several buckets is checked once.

The partition depends only on the multiset of inputs, not on their order.

Why MinHash and LSH are written here and not taken from ``datasketch``
----------------------------------------------------------------------
Measured by ``benchmarks/bench_grouping_datasketch.py`` (100,000 synthetic
queries, 2-core machine, datasketch 2.0.0; see benchmarks/RESULTS.md): with
datasketch's ``MinHash`` and ``MinHashLSH`` for the candidates (the same 32
bands x 4 rows, the same prefilters and exact verification) the partition is
as correct as ours (both equal the exact all-pairs partition), but grouping
takes 4.3x as long as ours at best (15.7 s against 3.7 s: integer gram ids
with ``hashfunc=int``, buckets read from the LSH hash tables; 6.6x for the
join alone, after normalisation) and 5.2x with datasketch's defaults (SHA-1
of each gram, one ``query`` per text). The
cost is per-text Python work: one ``MinHash`` object per text and, in the
LSH, 32 band keys built and inserted into dicts per text, where this module
hashes all texts with a few numpy operations and finds the buckets by
sorting. The rule for replacing hand-written code by a library is "equally
correct and at most 1.5x slower", so this implementation stays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.core.errors import ConfigError

__all__ = ["Shingles", "check_params", "components", "shingle"]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
Bool = npt.NDArray[np.bool_]

# --------------------------------------------------------------------------
# Shingling (vectorised; equal to char_ngrams on the normalised texts)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Shingles:
    indptr: I64  # CSR row pointers: grams of text i are indices[indptr[i]:indptr[i+1]]
    indices: I64  # gram ids, sorted within each text
    n_grams: int  # number of distinct grams (V)

    @property
    def lengths(self) -> I64:
        return np.diff(self.indptr)


def _ranges(counts: I64) -> I64:
    """concatenate(arange(c) for c in counts), vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def _starts(sorted_values: npt.NDArray[Any]) -> Bool:
    """True where a sorted array holds a value different from the one before."""
    flags: Bool = np.ones(sorted_values.size, dtype=np.bool_)
    if sorted_values.size > 1:
        flags[1:] = sorted_values[1:] != sorted_values[:-1]
    return flags


def _unique(a: I64) -> I64:
    """Sorted distinct values (np.unique's hash path is far slower on big arrays)."""
    s = np.sort(a)
    result: I64 = s[_starts(s)]
    return result


def shingle(texts: Sequence[str], n: int) -> Shingles:
    """Distinct character n-grams per (normalised) text as integer ids.

    Code points are replaced by their rank in the alphabet of all texts (1..A,
    0 pads texts shorter than n); when ``n * bits(A) <= 64`` a gram packs
    into one uint64, otherwise rows are compared as raw bytes. Either way the
    encoding is injective: two texts share a gram id iff they share the gram.
    Gram ids follow the sorted order of the packed grams, so they do not
    depend on the order of the texts.
    """
    m = len(texts)
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=m)
    joined = "".join(texts)
    cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    present = np.zeros(0x110000, dtype=np.bool_)
    present[cps] = True
    alphabet = np.flatnonzero(present)  # the code points present, ascending
    rank = np.zeros(0x110000, dtype=np.uint64)  # code point -> 1..A (a cumsum of `present` took 3x longer)
    rank[alphabet] = np.arange(1, alphabet.size + 1, dtype=np.uint64)
    codes = rank[cps]
    n_symbols = int(alphabet.size)
    offsets = np.cumsum(lengths) - lengths
    per_text = np.maximum(lengths - n + 1, 1)
    doc = np.repeat(np.arange(m, dtype=np.int64), per_text)
    start = offsets[doc] + _ranges(per_text)
    limit = offsets[doc] + lengths[doc]
    cols = np.zeros((n, doc.size), dtype=np.uint64)
    for k in range(n):
        pos = start + k
        valid = pos < limit
        if codes.size:
            cols[k, valid] = codes[pos[valid]]
    bits = max(1, n_symbols.bit_length())
    if n * bits <= 64:
        key = np.zeros(doc.size, dtype=np.uint64)
        for k in range(n):
            key = (key << np.uint64(bits)) | cols[k]
        order = np.argsort(key)
        new = _starts(key[order])
    else:
        rows = np.ascontiguousarray(cols.T).view(np.dtype((np.void, 8 * n))).ravel()
        order = np.argsort(rows)
        new = _starts(rows[order])
    gram = np.empty(doc.size, dtype=np.int64)
    gram[order] = np.cumsum(new) - 1
    n_grams = int(new.sum())
    width = max(n_grams, 1)
    pair = _unique(doc * width + gram)
    doc_u = pair // width
    indices = pair - doc_u * width
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(doc_u, minlength=m), out=indptr[1:])
    return Shingles(indptr=indptr, indices=indices, n_grams=n_grams)


# --------------------------------------------------------------------------
# Exact Jaccard verification of pairs
# --------------------------------------------------------------------------

_TOL = 1e-9


def _accept(inter: I64, len_u: I64, len_v: I64, threshold: float) -> Bool:
    union = len_u + len_v - inter
    result: Bool = inter >= threshold * union * (1.0 - _TOL)
    return result


def _gather(sh: Shingles, rows: I64) -> I64:
    """Concatenated gram ids of the given rows."""
    lens = sh.lengths[rows]
    off = np.cumsum(lens) - lens
    idx = np.repeat(sh.indptr[rows] - off, lens) + np.arange(int(lens.sum()), dtype=np.int64)
    result: I64 = sh.indices[idx]
    return result


def _intersections(sh: Shingles, u: I64, v: I64) -> I64:
    """|A_u & A_v| for each pair: the ids of both sets, keyed by pair, sorted; duplicates are shared."""
    out = np.zeros(u.size, dtype=np.int64)
    lengths = sh.lengths
    width = max(sh.n_grams, 1)
    ends = np.cumsum(lengths[u] + lengths[v])
    lo = 0
    while lo < u.size:
        # pairs lo..hi-1 hold about 4M ids
        base = int(ends[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(ends, base + 4_000_000, side="right")), lo + 1)
        uu, vv = u[lo:hi], v[lo:hi]
        pid = np.arange(hi - lo, dtype=np.int64) * width
        keys = np.concatenate(
            (np.repeat(pid, lengths[uu]) + _gather(sh, uu), np.repeat(pid, lengths[vv]) + _gather(sh, vv))
        )
        # each half is sorted already (pairs in order, each set's ids ascending): the stable sort,
        # a timsort, merges the two runs (3-4x faster than quicksort on 1,380 real queries)
        keys.sort(kind="stable")
        dup = keys[1:][keys[1:] == keys[:-1]]
        out[lo:hi] = np.bincount(dup // width, minlength=hi - lo)
        lo = hi
    return out


# --------------------------------------------------------------------------
# Union-find (vectorised; the root of a component is its smallest index)
# --------------------------------------------------------------------------


def _compress(parent: I64) -> None:
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return
        parent[:] = grand


def _union(parent: I64, u: I64, v: I64) -> None:
    """Join the components of u[i] and v[i]; ``parent`` stays fully compressed."""
    while u.size:
        ru, rv = parent[u], parent[v]
        differ = ru != rv
        if not differ.any():
            return
        u, v, ru, rv = u[differ], v[differ], ru[differ], rv[differ]
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
        _compress(parent)


# --------------------------------------------------------------------------
# Candidate buckets -> verified components
# --------------------------------------------------------------------------


class _PairSet:
    """A growing set of int64 pair codes: sorted levels merged like a binary counter."""

    def __init__(self) -> None:
        self.levels: list[I64] = []

    def contains(self, codes: I64) -> Bool:
        found: Bool = np.zeros(codes.size, dtype=np.bool_)
        for level in self.levels:
            pos = np.minimum(np.searchsorted(level, codes), level.size - 1)
            found |= level[pos] == codes
        return found

    def add(self, codes: I64) -> None:
        """Add sorted codes that are not in the set yet."""
        if codes.size == 0:
            return
        self.levels.append(codes)
        while len(self.levels) > 1 and self.levels[-2].size <= 2 * self.levels[-1].size:
            top = self.levels.pop()
            # two sorted runs: the stable sort (a timsort) merges them
            self.levels[-1] = np.sort(np.concatenate((self.levels[-1], top)), kind="stable")


@dataclass
class _Stats:
    prefiltered: int = 0
    verified: int = 0
    accepted: int = 0
    union_seconds: float = 0.0


def _runs(keys: npt.NDArray[Any]) -> tuple[I64, I64, I64]:
    """Group positions by equal key: (members, bucket starts, bucket sizes) for buckets of >= 2."""
    order = np.argsort(keys)
    sk = keys[order]
    if sk.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    starts = np.flatnonzero(_starts(sk))
    sizes = np.diff(np.append(starts, sk.size))
    big = sizes >= 2
    starts, sizes = starts[big], sizes[big]
    members = order[np.repeat(starts, sizes) + _ranges(sizes)].astype(np.int64)
    new_starts = np.cumsum(sizes) - sizes
    return members, new_starts.astype(np.int64), sizes.astype(np.int64)


_CHUNK_PAIRS = 1_000_000


def _connect_buckets(
    buckets: list[tuple[I64, I64, I64]],
    sh: Shingles,
    parent: I64,
    threshold: float,
    stats: _Stats,
    prefilter: Callable[[I64, I64], Bool] | None = None,
) -> None:
    """Union every pair inside a bucket whose exact Jaccard reaches the threshold.

    Pairs are taken by their distance d inside a bucket, in rounds d = 1,
    then 2-3, 4-7, 8-15 ... (d = 1 already chains a bucket of near-duplicates
    together). Between batches, buckets whose members are all connected
    leave, and pairs whose ends are connected already, or that were checked
    before in another bucket, are skipped. ``prefilter`` may drop pairs that
    cannot pass before the exact check. The components equal those of the
    graph of all in-bucket pairs that pass.
    """
    buckets = [bk for bk in buckets if bk[0].size]
    if not buckets:
        return
    members = np.concatenate([bk[0] for bk in buckets])
    sizes = np.concatenate([bk[2] for bk in buckets])
    n = parent.size
    lengths = sh.lengths
    checked = _PairSet()

    def process(a: I64, b: I64) -> None:
        a, b = np.minimum(a, b), np.maximum(a, b)
        la, lb = lengths[a], lengths[b]
        # not connected yet; length filter: J >= t needs |small| >= t * |large|
        keep = (parent[a] != parent[b]) & (la >= threshold * lb * (1.0 - _TOL))
        keep &= lb >= threshold * la * (1.0 - _TOL)
        code = _unique(a[keep] * n + b[keep])
        code = code[~checked.contains(code)]
        if code.size == 0:
            return
        checked.add(code)
        a, b = code // n, code % n
        if prefilter is not None:
            passed = prefilter(a, b)
            stats.prefiltered += int(code.size - passed.sum())
            a, b = a[passed], b[passed]
        if a.size == 0:
            return
        ok = _accept(_intersections(sh, a, b), lengths[a], lengths[b], threshold)
        stats.verified += int(a.size)
        stats.accepted += int(ok.sum())
        t0 = time.perf_counter()
        _union(parent, a[ok], b[ok])
        stats.union_seconds += time.perf_counter() - t0

    d = 1
    while sizes.size:
        # keep the buckets that still have pairs at distance >= d and are not connected yet
        starts = np.cumsum(sizes) - sizes
        roots = parent[members]
        spread = np.maximum.reduceat(roots, starts) != np.minimum.reduceat(roots, starts)
        keep_bucket = (sizes > d) & spread
        if not keep_bucket.all():
            members = members[np.repeat(keep_bucket, sizes)]
            sizes = sizes[keep_bucket]
            starts = np.cumsum(sizes) - sizes
            if sizes.size == 0:
                break
        batch_a: list[I64] = []
        batch_b: list[I64] = []
        pending = 0
        for dist in range(d, 2 * d):
            has = sizes > dist
            if not has.any():
                break
            cnt = sizes[has] - dist
            idx = np.repeat(starts[has], cnt) + _ranges(cnt)
            batch_a.append(members[idx])
            batch_b.append(members[idx + dist])
            pending += idx.size
            if pending >= _CHUNK_PAIRS:
                process(np.concatenate(batch_a), np.concatenate(batch_b))
                batch_a, batch_b, pending = [], [], 0
        if pending:
            process(np.concatenate(batch_a), np.concatenate(batch_b))
        d *= 2


def _prefixes(sh: Shingles, threshold: float) -> Shingles:
    """Each text's prefix for prefix filtering, as gram ranks (rarest gram first).

    With all grams ordered by document frequency (ties by id), two sets with
    Jaccard >= t share at least ``ceil(t * max(|A|, |B|))`` grams, so their
    first ``|A| - ceil(t|A|) + 1`` and ``|B| - ceil(t|B|) + 1`` grams
    overlap. Sharing a prefix gram is therefore necessary for a pair to pass.
    """
    m = sh.indptr.size - 1
    lengths = sh.lengths
    width = max(sh.n_grams, 1)
    df = np.bincount(sh.indices, minlength=sh.n_grams)
    order = np.lexsort((np.arange(sh.n_grams), df))
    rank = np.empty(sh.n_grams, dtype=np.int64)
    rank[order] = np.arange(sh.n_grams, dtype=np.int64)
    t = threshold * (1.0 - _TOL)
    need = np.ceil(t * lengths - 1e-6).astype(np.int64)
    prefix = np.clip(lengths - need + 1, 1, lengths)
    doc = np.repeat(np.arange(m, dtype=np.int64), lengths)
    sorted_key = np.sort(doc * width + rank[sh.indices])
    in_prefix = _ranges(lengths) < prefix[doc]
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(prefix, out=indptr[1:])
    return Shingles(indptr=indptr, indices=(sorted_key - doc * width)[in_prefix], n_grams=sh.n_grams)


def _prefix_buckets(pre: Shingles) -> list[tuple[I64, I64, I64]]:
    """Buckets of texts sharing a prefix gram (the exact method's candidates)."""
    doc = np.repeat(np.arange(pre.indptr.size - 1, dtype=np.int64), pre.lengths)
    members, starts, sizes = _runs(pre.indices)
    return [(doc[members], starts, sizes)]


def _lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows): the most rows per band that still catch a pair at the threshold w.p. >= 0.995."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if bands < 1:
            break
        p = 1.0 - (1.0 - threshold**rows) ** bands
        if p >= 0.995:
            best = (bands, rows)
    return best


def _splitmix64(x: U64) -> U64:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: U64 = z ^ (z >> np.uint64(31))
    return result


def _minhash(sh: Shingles, num_perm: int, seed: int) -> U32:
    """MinHash signatures, shape (num_perm, texts), uint32.

    Each gram id gets a pseudo-random 32-bit value x (splitmix64 of the id
    and the seed); permutation k is ``((a_k * x + b_k) mod 2**64) >> 32``
    with random odd a_k (Dietzfelbinger's multiply-add-shift family).
    """
    m = sh.indptr.size - 1
    rng = np.random.default_rng([seed, 0x6D696E68])
    a = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False)
    salt = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    xs = _splitmix64(np.arange(sh.n_grams, dtype=np.uint64) ^ salt) >> np.uint64(32)
    sig = np.empty((num_perm, m), dtype=np.uint32)
    budget = max(1, 2_000_000 // num_perm)  # gram rows per chunk
    cum = sh.indptr
    d0 = 0
    while d0 < m:
        d1 = int(np.searchsorted(cum, cum[d0] + budget, side="right")) - 1
        d1 = min(max(d1, d0 + 1), m)
        g = xs[sh.indices[cum[d0] : cum[d1]]]
        h = np.multiply.outer(a, g)
        h += b[:, None]
        h >>= np.uint64(32)
        sig[:, d0:d1] = np.minimum.reduceat(h.astype(np.uint32), cum[d0:d1] - cum[d0], axis=1)
        d0 = d1
    return sig


def _band_buckets(sig: U32, bands: int, rows: int) -> list[tuple[I64, I64, I64]]:
    out: list[tuple[I64, I64, I64]] = []
    for j in range(bands):
        key = np.full(sig.shape[1], np.uint64(j), dtype=np.uint64)
        for c in range(j * rows, (j + 1) * rows):
            key = _splitmix64(key ^ sig[c].astype(np.uint64))
        members, starts, sizes = _runs(key)
        if members.size:
            out.append((members, starts, sizes))
    return out


def _lsh_prefilter(sig: U32, pre: Shingles, threshold: float) -> Callable[[I64, I64], Bool]:
    """Cheap checks of LSH candidate pairs before the exact Jaccard.

    1. MinHash estimate (on the low byte of each value, "b-bit MinHash", to
       move less memory): a pair at J = threshold has p = t + (1 - t)/256 of
       its values equal, with standard deviation sqrt(p(1-p)/num_perm);
       pairs more than 5 such deviations below are dropped. A pair at
       J = threshold survives with probability > 1 - 1e-6, and the bulk of
       LSH candidates (J around 0.3-0.5) goes here.
    2. Prefix filter (exact, see :func:`_prefixes`): the pair must share a
       prefix gram; this costs about a third of the full check.
    """
    # b-bit MinHash: the low byte of each value; equal with probability J + (1 - J) / 256
    rows = np.ascontiguousarray((sig.T & 0xFF).astype(np.uint8))
    num_perm = sig.shape[0]
    p_t = threshold + (1.0 - threshold) / 256.0
    bound = (p_t - 5.0 * math.sqrt(p_t * (1.0 - p_t) / num_perm)) * num_perm
    step = max(1, 8_000_000 // num_perm)

    def passes(a: I64, b: I64) -> Bool:
        out = np.empty(a.size, dtype=np.bool_)
        for lo in range(0, a.size, step):
            equal = np.count_nonzero(rows[a[lo : lo + step]] == rows[b[lo : lo + step]], axis=1)
            out[lo : lo + step] = equal >= bound - 1e-9
        out[out] = _intersections(pre, a[out], b[out]) > 0
        return out

    return passes


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def check_params(threshold: float, n: int, exact_limit: int, num_perm: int) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ConfigError(f"grouping threshold must be in (0, 1], got {threshold}")
    if n < 1:
        raise ConfigError(f"n-gram size must be >= 1, got {n}")
    if exact_limit < 0:
        raise ConfigError(f"exact_limit must be >= 0, got {exact_limit}")
    if num_perm < 1:
        raise ConfigError(f"num_perm must be >= 1, got {num_perm}")


def components(
    norm: list[str],
    *,
    threshold: float,
    n: int,
    exact_limit: int,
    num_perm: int,
    seed: int,
    timings: dict[str, float],
) -> tuple[list[int], str]:
    """Component label (smallest distinct-text index) per text, and the method used."""
    first: dict[str, int] = {}
    text_of = [first.setdefault(t, len(first)) for t in norm]
    distinct = list(first)
    m = len(distinct)
    method = "exact" if m <= exact_limit else "minhash"
    t0 = time.perf_counter()
    sh = shingle(distinct, n)
    timings["shingle"] = time.perf_counter() - t0
    parent = np.arange(m, dtype=np.int64)
    stats = _Stats()
    t0 = time.perf_counter()
    prefilter: Callable[[I64, I64], Bool] | None = None
    if method == "exact":
        buckets = _prefix_buckets(_prefixes(sh, threshold))
        timings["minhash"] = 0.0
    else:
        bands, rows = _lsh_params(threshold, num_perm)
        sig = _minhash(sh, num_perm, seed)
        t1 = time.perf_counter()
        timings["minhash"] = t1 - t0
        t0 = t1
        buckets = _band_buckets(sig, bands, rows)
        prefilter = _lsh_prefilter(sig, _prefixes(sh, threshold), threshold)
    _connect_buckets(buckets, sh, parent, threshold, stats, prefilter)
    timings["candidates_verify"] = time.perf_counter() - t0 - stats.union_seconds
    timings["union_find"] = stats.union_seconds
    timings["pairs_prefiltered"] = float(stats.prefiltered)
    timings["pairs_verified"] = float(stats.verified)
    timings["pairs_accepted"] = float(stats.accepted)
    labels = parent.tolist()
    return [labels[i] for i in text_of], method
