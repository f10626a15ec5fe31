"""Bootstrap draws streamed once to every test that shares them (bounded memory).

A comparison tests many metrics, variants, percentiles, weightings and slices of a split on
one bootstrap draw of the split's groups. A draw is B count vectors over G groups: at
100,000 queries (G ~ 60,000 groups in a split) and B = 10,000 that is 600 million counts,
1.2 GB even as uint16. Keeping draws in memory does not scale; drawing them again for every
test that uses them costs time.

So the comparison first *plans* its tests, registering for each the draw it needs (a key,
its seed and G) and what it computes from a chunk of count vectors; then
:meth:`SharedDraws.run` draws each distinct draw once, chunk by chunk
(:func:`rag_ablate.compare.stats.bootstrap_counts`: 250 count vectors per chunk, refilled in one
buffer), hands every chunk to each of its consumers and moves on. Memory is one chunk of counts
(0.5 KB per group) and :data:`BLOCK_ROWS` of its rows as float64 (0.5 KB per group) for each draw
being streamed, plus each consumer's (B, columns) result.

Most statistics are linear in the counts before a final step (a ratio of two sums): a
*linear* consumer registers its (G, k) matrix of per-group columns (:meth:`SharedDraws.add_linear`)
and the draw multiplies each chunk by all of them at once, one BLAS product (both cores) for
every consumer over the whole split, and one product per group subset for consumers over a
few of the groups (a slice: its count columns gathered first). A test over a subset of the
split's queries (the queries ok on both sides, a slice) is a *domain* of the split's draw: its
groups' rows hold its sums and sizes, every other group 0, so a resample's mean is the
resampled sum over the subset's queries divided by their resampled count. A resample that draws
none of the subset's groups has no mean (0 / 0): NaN, left out by the test
(:func:`rag_ablate.compare.stats.paired_test`).

A stream of random sign vectors is a draw too (:meth:`SharedDraws.add_signs`): every sign-flip
test of a split registers its group sums and sizes (its groups' rows, the others 0) and each block
of sign vectors, unpacked once, is multiplied by all of them at once.

Each draw is streamed on a thread of its own (as many at a time as the process has CPUs), every
product on one BLAS thread: the draws of the splits and their sign streams run side by side on both
cores, and BLAS never spins waiting for a core another thread holds (two BLAS threads on the small
products of a sign block took 30 times the CPU on a busy machine). Each draw has its own generator
and its consumers touch only their own results, so the numbers do not depend on the threads.
See docs/statistics.md, "Memory and time at scale".
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from rag_ablate.compare import stats

FloatArray = npt.NDArray[np.float64]

#: count vectors per chunk: the products are taken over exactly these row blocks (see above)
CHUNK = 250


#: what a linear consumer's columns become once its draw has copied them (:meth:`_Draw.products`)
_RELEASED: FloatArray = np.empty((0, 0))

#: rows of a chunk converted to float64 and multiplied at once: the float64 copy is BLOCK_ROWS x G x
#: 8 bytes (28 MB at 56,000 groups, against 112 MB for a whole chunk)
BLOCK_ROWS = 64


@dataclass
class Chunk:
    """Count vectors of one chunk of a draw: ``counts`` (c, G) and, converted once when a consumer
    asks (into ``buffer``, a reused float64 array of at least c rows, or a new one), as float64."""

    counts: npt.NDArray[np.integer[Any]]
    buffer: FloatArray | None = None
    _f64: FloatArray | None = None

    @property
    def f64(self) -> FloatArray:
        if self._f64 is None:
            c = self.counts.shape[0]
            out = self.buffer[:c] if self.buffer is not None else np.empty((c, self.counts.shape[1]))
            out[...] = self.counts  # the values of counts.astype(np.float64)
            self._f64 = out
        return self._f64


def _product(counts: npt.NDArray[np.integer[Any]], cols: FloatArray, block: FloatArray) -> FloatArray:
    """``counts @ cols`` in float64, :data:`BLOCK_ROWS` rows at a time through ``block``."""
    c = counts.shape[0]
    out = np.empty((c, cols.shape[1]))
    for r0 in range(0, c, block.shape[0]):
        part = block[: min(block.shape[0], c - r0)]
        part[...] = counts[r0 : r0 + part.shape[0]]
        np.matmul(part, cols, out=out[r0 : r0 + part.shape[0]])
    return out


@dataclass
class Collector:
    """The rows a consumer computes per chunk, concatenated after the draw has run."""

    compute: Callable[[Chunk], FloatArray]
    parts: list[FloatArray] = field(default_factory=list)
    _whole: FloatArray | None = None

    def __call__(self, chunk: Chunk) -> None:
        self.parts.append(self.compute(chunk))

    def result(self) -> FloatArray:
        """The rows of every chunk, concatenated once (the chunks' parts are then let go)."""
        if self._whole is None:
            if not self.parts:
                raise RuntimeError("SharedDraws.run() has not run")
            self._whole = np.concatenate(self.parts, axis=0)
            self.parts = []
        return self._whole


@dataclass
class _Linear:
    """A linear consumer: ``finish(counts[:, rows] @ cols, chunk)`` per chunk (``rows`` None: every
    group)."""

    cols: FloatArray
    finish: Callable[[FloatArray, Chunk], FloatArray]
    collector: Collector
    rows: npt.NDArray[np.intp] | None
    width: int = 0  # the columns' count, kept when the columns are let go (:meth:`_Draw.products`)

    def __post_init__(self) -> None:
        self.width = self.cols.shape[1]


@dataclass
class _Draw:
    seed: int
    n_groups: int
    signs: bool = False  # a stream of sign vectors (0/1 bits: +1/-1) instead of bootstrap counts
    consumers: list[Collector] = field(default_factory=list)
    linear: list[_Linear] = field(default_factory=list)

    def products(self) -> list[tuple[npt.NDArray[np.intp] | None, FloatArray, list[tuple[int, _Linear]]]]:
        """The linear consumers by group subset: (rows, their columns side by side, each with its
        first column). Each consumer's own columns are let go once copied side by side: a draw holds
        its columns once (the planned columns of a split are 64 MB at 100,000 queries)."""
        by_rows: dict[bytes | None, list[_Linear]] = {}
        for lin in self.linear:
            by_rows.setdefault(None if lin.rows is None else lin.rows.tobytes(), []).append(lin)
        out = []
        for members in by_rows.values():
            starts = np.cumsum([0] + [lin.width for lin in members[:-1]]).tolist()
            cols = np.hstack([lin.cols for lin in members])
            for lin in members:
                lin.cols = _RELEASED
            out.append((members[0].rows, cols, list(zip(starts, members, strict=True))))
        return out


class SharedDraws:
    """Register consumers of keyed draws, then :meth:`run` each draw once (module docstring)."""

    def __init__(self, B: int) -> None:
        self.B = B
        self._draws: dict[Any, _Draw] = {}

    def add(self, key: Any, seed: int, n_groups: int, compute: Callable[[Chunk], FloatArray]) -> Collector:
        """A consumer of the draw ``key`` (``B`` count vectors over ``n_groups`` groups from
        ``default_rng(seed)``); its :meth:`Collector.result` is valid after :meth:`run`."""
        collector = Collector(compute)
        self._draw(key, seed, n_groups).consumers.append(collector)
        return collector

    def add_linear(
        self,
        key: Any,
        seed: int,
        n_groups: int,
        cols: FloatArray,
        finish: Callable[[FloatArray], FloatArray],
        rows: npt.NDArray[np.intp] | None = None,
    ) -> Collector:
        """A consumer computing ``finish(counts @ cols)`` per chunk of the draw ``key``: ``cols`` is
        (G, k), or (len(rows), k) for the groups ``rows`` only (the others' rows 0). Every linear
        consumer of a draw over the same ``rows`` shares one product per chunk (module docstring)."""
        return self.add_linear_chunk(key, seed, n_groups, cols, lambda prod, _: finish(prod), rows)

    def add_linear_chunk(
        self,
        key: Any,
        seed: int,
        n_groups: int,
        cols: FloatArray,
        finish: Callable[[FloatArray, Chunk], FloatArray],
        rows: npt.NDArray[np.intp] | None = None,
    ) -> Collector:
        """:meth:`add_linear` whose ``finish`` also takes the chunk (a statistic that needs sums over
        groups and the counts themselves: the latency percentiles)."""
        return self._add(key, seed, n_groups, np.asarray(cols, dtype=np.float64), finish, rows, signs=False)

    def add_signs(
        self,
        key: Any,
        seed: int,
        n_groups: int,
        cols: FloatArray,
        rows: npt.NDArray[np.intp] | None = None,
    ) -> Collector:
        """A consumer of the sign stream ``key`` (``B`` random sign vectors over ``n_groups`` groups
        from ``default_rng(seed)``: the vectors :func:`rag_ablate.compare.stats.paired_test` draws
        from a ``signflip_seed``), computing ``sum_g eps_g cols[g]`` per vector, (B, k). ``cols`` and
        ``rows`` as in :meth:`add_linear`: every consumer of the stream shares one product per block."""
        cols = np.asarray(cols, dtype=np.float64)
        total = cols.sum(axis=0)  # eps = 2 bit - 1, hence sum(eps c) = 2 (bits @ c) - sum(c)
        return self._add(key, seed, n_groups, cols, lambda prod, _: 2.0 * prod - total, rows, signs=True)

    def _add(
        self,
        key: Any,
        seed: int,
        n_groups: int,
        cols: FloatArray,
        finish: Callable[[FloatArray, Chunk], FloatArray],
        rows: npt.NDArray[np.intp] | None,
        *,
        signs: bool,
    ) -> Collector:
        if cols.ndim != 2 or cols.shape[0] != (n_groups if rows is None else len(rows)):
            raise ValueError(f"draw {key!r}: columns of shape {cols.shape} for {n_groups} groups")
        collector = Collector(lambda ch: finish(ch.f64 @ lin.cols, ch))
        lin = _Linear(cols, finish, collector, None if rows is None else np.asarray(rows, dtype=np.intp))
        self._draw(key, seed, n_groups, signs).linear.append(lin)
        return collector

    def _draw(self, key: Any, seed: int, n_groups: int, signs: bool = False) -> _Draw:
        draw = self._draws.setdefault(key, _Draw(seed, n_groups, signs))
        if (draw.seed, draw.n_groups, draw.signs) != (seed, n_groups, signs):
            raise ValueError(f"draw {key!r} registered with another seed, group count or kind")
        return draw

    def run(self) -> None:
        """Stream every registered draw to its consumers: the draws in parallel, one thread each on
        up to :func:`workers` at a time, BLAS in one thread per product (see the module docstring)."""
        todo = [draw for draw in self._draws.values() if draw.consumers or draw.linear]
        self._draws.clear()
        # every draw's columns side by side first, here: the consumers' own columns freed, their
        # pages are handed back before the draws allocate their buffers
        jobs = [(draw, draw.products()) for draw in todo]
        del todo
        release_freed()
        n = min(workers(), len(jobs))
        with threadpool_limits(limits=1, user_api="blas"):
            if n <= 1:
                for job in jobs:
                    self._stream(*job)
            else:
                with ThreadPoolExecutor(n) as pool:
                    list(pool.map(lambda job: self._stream(*job), jobs))  # re-raises the first error
        del jobs
        release_freed()  # the draws' buffers and columns

    def _stream(
        self,
        draw: _Draw,
        products: list[tuple[npt.NDArray[np.intp] | None, FloatArray, list[tuple[int, _Linear]]]],
    ) -> None:
        rng = np.random.default_rng(draw.seed)
        chunks: Iterator[npt.NDArray[np.integer[Any]]] = (
            _sign_bits(draw.n_groups, self.B, rng)
            if draw.signs
            else stats.bootstrap_counts(draw.n_groups, self.B, rng, CHUNK, reuse=True)
        )
        block = np.empty((min(BLOCK_ROWS, self.B), draw.n_groups))
        buffer = np.empty((min(CHUNK, self.B), draw.n_groups)) if draw.consumers else None
        for counts in chunks:
            ch = Chunk(counts, buffer)
            for rows, cols, members in products:
                if rows is None:
                    prod = _product(counts, cols, block)
                else:
                    prod = counts[:, rows].astype(np.float64) @ cols
                for start, lin in members:
                    lin.collector.parts.append(lin.finish(prod[:, start : start + lin.width], ch))
            for consumer in draw.consumers:
                consumer(ch)
        products.clear()  # this draw's columns go now, not when every draw is done


def release_freed() -> None:
    """Hand the memory pages freed so far back to the system (glibc's ``malloc_trim``: freed blocks
    below its mmap threshold otherwise stay in the process, counted in its RSS); nothing where the
    C library has no such call."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # no glibc, no ctypes handle
        ctypes.CDLL(None).malloc_trim(0)


def workers() -> int:
    """Threads :meth:`SharedDraws.run` streams draws on: the CPUs this process may use
    (``RAG_ABLATE_DRAW_THREADS`` overrides; 1 streams them in turn)."""
    env = os.environ.get("RAG_ABLATE_DRAW_THREADS")
    if env:
        return max(1, int(env))
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _sign_bits(n_groups: int, B: int, rng: np.random.Generator) -> Iterator[npt.NDArray[np.uint8]]:
    """B random sign vectors as 0/1 bits (1: +1), chunks of at most :data:`CHUNK` rows of
    (c, n_groups): ``rng.integers(0, 256, (c, ceil(G / 8)), dtype=uint8)`` per chunk, bit i of byte
    k (``np.unpackbits`` order) group ``8 k + i``'s sign, as
    :func:`rag_ablate.compare.stats.paired_test` draws them from one ``signflip_seed``."""
    n_bytes = (n_groups + 7) // 8
    for done in range(0, B, CHUNK):
        packed = rng.integers(0, 256, size=(min(CHUNK, B - done), n_bytes), dtype=np.uint8)
        yield np.unpackbits(packed, axis=1, count=n_groups)


def domain_ratios(prod: FloatArray) -> FloatArray:
    """``finish`` of a linear consumer of (G, m + 1) columns (sums of m metric columns, then sizes):
    each resample's means, NaN where it drew none of the groups (module docstring)."""
    m = prod.shape[1] - 1
    den = prod[:, m:]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = prod[:, :m] / den
    out[(den == 0)[:, 0]] = np.nan
    return np.asarray(out, dtype=np.float64)


def ratios(sums_sizes: FloatArray) -> Callable[[Chunk], FloatArray]:
    """A consumer computing :func:`rag_ablate.compare.stats.bootstrap_ratios` (the means' ``theta*``)."""
    return lambda ch: stats.bootstrap_ratios(ch.f64, sums_sizes)


def products(sums: FloatArray) -> Callable[[Chunk], FloatArray]:
    """A consumer computing ``counts @ sums`` (the production mix's weighted sums)."""
    return lambda ch: np.asarray(ch.f64 @ sums, dtype=np.float64)


def quantiles(setup: stats.QuantileSetup) -> Callable[[FloatArray, Chunk], FloatArray]:
    """``finish`` of a linear consumer of ``setup.sizes_before`` (:meth:`SharedDraws.add_linear_chunk`)
    computing :func:`rag_ablate.compare.stats.quantile_effects` (latency percentiles)."""
    return lambda prod, ch: stats.quantile_effects(ch.counts, setup, sums=prod)
