"""Speed of the comparison statistics against scipy.stats.bootstrap.

Workload (STATISTICS.md): one variant pair, 10,000 queries x 10 metrics,
10,000 resamples, ~3,000 near-duplicate groups of 1-8 queries.

    python benchmarks/bench_stats.py [--repeats 3] [--skip-scipy]

Prints a markdown table (machine, command, times, ratio). Timings of
rag_ablate are the median of ``--repeats`` runs after one warm-up; scipy runs
once per configuration (it is the slow reference).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy
from scipy import stats as sps

try:
    from rag_ablate.stats import bootstrap_counts, derive_seed, group_sums, paired_test
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rag_ablate.stats import bootstrap_counts, derive_seed, group_sums, paired_test

N_QUERIES = 10_000
N_METRICS = 10
B = 10_000
MAX_GROUP = 8


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Baseline/variant (n, m) and group labels: sizes 1-8, P(size k) ~ 1/k."""
    rng = np.random.default_rng(seed)
    k = np.arange(1, MAX_GROUP + 1)
    prob = (1.0 / k) / np.sum(1.0 / k)
    sizes = rng.choice(k, size=N_QUERIES, p=prob)
    sizes = sizes[np.cumsum(sizes) <= N_QUERIES]
    sizes = np.append(sizes, N_QUERIES - sizes.sum()) if sizes.sum() < N_QUERIES else sizes
    labels = rng.permutation(np.repeat(np.arange(sizes.size), sizes))
    n_groups = sizes.size
    base = rng.random((N_QUERIES, N_METRICS))
    shift = rng.normal(0.0, 0.05, (n_groups, N_METRICS))[labels]
    var = np.clip(base + 0.01 + shift + rng.normal(0.0, 0.1, (N_QUERIES, N_METRICS)), 0.0, 1.0)
    return base, var, labels


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-scipy", action="store_true")
    args = ap.parse_args()

    base, var, labels = make_data()
    n_groups = int(np.unique(labels).size)
    seed = derive_seed(0, "holdout")

    def ours_full() -> object:
        return paired_test(base, var, labels, B=B, seed=seed)

    def ours_draw() -> object:
        return list(bootstrap_counts(n_groups, B, np.random.default_rng(seed)))

    shared = list(bootstrap_counts(n_groups, B, np.random.default_rng(seed)))

    def ours_shared() -> object:
        return paired_test(base, var, labels, B=B, seed=seed, counts=shared)

    rows: list[tuple[str, float]] = [
        (
            "rag_ablate `paired_test`: group bootstrap + group sign-flip, 10 metrics",
            timed(ours_full, args.repeats),
        ),
        ("  of which: drawing the count matrix (shared per split)", timed(ours_draw, args.repeats)),
        ("  `paired_test` with the split's pre-drawn counts", timed(ours_shared, args.repeats)),
    ]
    t_ours = rows[0][1]

    if not args.skip_scipy:

        def mean_diff(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
            return np.asarray(np.mean(y - x, axis=axis))

        def scipy_query_level() -> None:
            for j in range(N_METRICS):
                sps.bootstrap(
                    (base[:, j], var[:, j]),
                    mean_diff,
                    paired=True,
                    vectorized=True,
                    method="percentile",
                    n_resamples=B,
                    batch=250,  # batch=None materialises B x n arrays and is slower
                    rng=np.random.default_rng(seed),
                )

        sums, sizes = group_sums(var - base, labels)
        sizes_f = sizes.astype(np.float64)

        def ratio(s: np.ndarray, m: np.ndarray, axis: int) -> np.ndarray:
            return np.asarray(np.sum(s, axis=axis) / np.sum(m, axis=axis))

        def scipy_group_level() -> None:
            for j in range(N_METRICS):
                sps.bootstrap(
                    (sums[:, j], sizes_f),
                    ratio,
                    paired=True,
                    vectorized=True,
                    method="percentile",
                    n_resamples=B,
                    batch=250,
                    rng=np.random.default_rng(seed),
                )

        t_q = once(scipy_query_level)
        t_g = once(scipy_group_level)
        rows += [
            ("scipy.stats.bootstrap, paired query-level, per metric (bootstrap only)", t_q),
            ("scipy.stats.bootstrap on group sums (same estimator, bootstrap only)", t_g),
        ]

    cmd = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    print(f"## bench_stats: {N_QUERIES:,} queries x {N_METRICS} metrics x {B:,} resamples\n")
    print(f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs ({affinity} usable)")
    print(f"- Python {platform.python_version()}, numpy {np.__version__}, scipy {scipy.__version__}")
    print(f"- data: {N_QUERIES:,} queries in {n_groups:,} groups (sizes 1-{MAX_GROUP}), {N_METRICS} metrics")
    print(f"- command: `{cmd}`; rag_ablate times are the median of {args.repeats} runs\n")
    print("| what | time (s) | vs rag_ablate `paired_test` |")
    print("|---|---:|---:|")
    for label, t in rows:
        print(f"| {label} | {t:.3f} | {t / t_ours:.1f}x |")


if __name__ == "__main__":
    main()
