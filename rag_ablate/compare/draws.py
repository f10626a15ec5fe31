"""Bootstrap draws streamed once to every test that shares them (bounded memory).

A comparison tests many metrics, variants, percentiles and weightings on one bootstrap
draw per split and group set (and each slice on its own draw). A draw is B count vectors
over G groups: at 100,000 queries (G ~ 60,000 groups in a split) and B = 10,000 that is
600 million counts, 1.2 GB even as uint16, and a split can need several draws (the
queries ``ok`` on both sides differ by variant). Keeping draws in memory does not scale;
drawing them again for every test that uses them costs time.

So the comparison first *plans* its tests, registering for each the draw it needs (a key,
its seed and G) and what it computes from a chunk of count vectors (a consumer); then
:meth:`SharedDraws.run` draws each distinct draw once, chunk by chunk
(:func:`rag_ablate.compare.stats.bootstrap_counts`: 250 count vectors per chunk, refilled in one
buffer), hands every chunk to each of its consumers and moves on. Memory is one chunk (as
counts and as float64: 2.5 KB per group) plus each consumer's (B, columns) result. The
numbers are exactly those of the same tests run on the whole draw: every product is taken
over the same 250-row chunks as before (a BLAS product's rounding can depend on how many
rows it multiplies at once, so the chunk size stays fixed). See docs/statistics.md, "Memory
and time at scale".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats

FloatArray = npt.NDArray[np.float64]

#: count vectors per chunk: the products are taken over exactly these row blocks (see above)
CHUNK = 250


@dataclass
class Chunk:
    """Count vectors of one chunk of a draw: ``counts`` (c, G) and, converted once into
    ``buffer`` (a reused float64 array of at least c rows), as float64."""

    counts: npt.NDArray[np.integer[Any]]
    buffer: FloatArray
    _f64: FloatArray | None = None

    @property
    def f64(self) -> FloatArray:
        if self._f64 is None:
            out = self.buffer[: self.counts.shape[0]]
            out[...] = self.counts  # the values of counts.astype(np.float64)
            self._f64 = out
        return self._f64


@dataclass
class Collector:
    """The rows a consumer computes per chunk, concatenated after the draw has run."""

    compute: Callable[[Chunk], FloatArray]
    parts: list[FloatArray] = field(default_factory=list)

    def __call__(self, chunk: Chunk) -> None:
        self.parts.append(self.compute(chunk))

    def result(self) -> FloatArray:
        if not self.parts:
            raise RuntimeError("SharedDraws.run() has not run")
        return np.concatenate(self.parts, axis=0)


@dataclass
class _Draw:
    seed: int
    n_groups: int
    consumers: list[Collector] = field(default_factory=list)


class SharedDraws:
    """Register consumers of keyed draws, then :meth:`run` each draw once (module docstring)."""

    def __init__(self, B: int) -> None:
        self.B = B
        self._draws: dict[Any, _Draw] = {}

    def add(self, key: Any, seed: int, n_groups: int, compute: Callable[[Chunk], FloatArray]) -> Collector:
        """A consumer of the draw ``key`` (``B`` count vectors over ``n_groups`` groups from
        ``default_rng(seed)``); its :meth:`Collector.result` is valid after :meth:`run`."""
        draw = self._draws.setdefault(key, _Draw(seed, n_groups))
        if (draw.seed, draw.n_groups) != (seed, n_groups):
            raise ValueError(f"draw {key!r} registered with another seed or group count")
        collector = Collector(compute)
        draw.consumers.append(collector)
        return collector

    def run(self) -> None:
        for draw in self._draws.values():
            if not draw.consumers:
                continue
            rng = np.random.default_rng(draw.seed)
            buffer = np.empty((min(CHUNK, self.B), draw.n_groups))
            for counts in stats.bootstrap_counts(draw.n_groups, self.B, rng, CHUNK, reuse=True):
                ch = Chunk(counts, buffer)
                for consumer in draw.consumers:
                    consumer(ch)
        self._draws.clear()


def ratios(sums_sizes: FloatArray) -> Callable[[Chunk], FloatArray]:
    """A consumer computing :func:`rag_ablate.compare.stats.bootstrap_ratios` (the means' ``theta*``)."""
    return lambda ch: stats.bootstrap_ratios(ch.f64, sums_sizes)


def products(sums: FloatArray) -> Callable[[Chunk], FloatArray]:
    """A consumer computing ``counts @ sums`` (the production mix's weighted sums)."""
    return lambda ch: np.asarray(ch.f64 @ sums, dtype=np.float64)


def quantiles(setup: stats.QuantileSetup) -> Callable[[Chunk], FloatArray]:
    """A consumer computing :func:`rag_ablate.compare.stats.quantile_effects` (latency percentiles)."""
    return lambda ch: stats.quantile_effects(ch.counts, setup, ch.f64)
