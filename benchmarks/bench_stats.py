"""Speed of the comparison statistics against scipy.stats.bootstrap.

Workload (docs/statistics.md): one variant pair, 10,000 queries x 10 metrics,
10,000 resamples, ~3,000 near-duplicate groups of 1-8 queries.

    python benchmarks/bench_stats.py [--repeats 3] [--skip-scipy] [--ref GIT_REV]

Prints a markdown table (machine, command, times, ratio). Timings of
rag_ablate are the median of ``--repeats`` runs after one warm-up; scipy runs
once per configuration (it is the slow reference). ``--ref`` also times
``rag_ablate/compare/stats.py`` as of a git revision (e.g. the commit before a change),
loaded from ``git show`` and run in the same process, interleaved with the
current code so both see the same machine load.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import scipy
from scipy import stats as sps

REPO = Path(__file__).resolve().parents[1]
try:
    from rag_ablate.compare import stats as current
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(REPO))
    from rag_ablate.compare import stats as current

bootstrap_counts, derive_seed = current.bootstrap_counts, current.derive_seed
group_sums, paired_test = current.group_sums, current.paired_test

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


def once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns: list[Callable[[], object]], repeats: int) -> list[tuple[float, float]]:
    """Median wall and CPU time of each function, run in turns (same load for all).

    CPU time (all threads of this process) is less sensitive than wall time to
    other processes competing for the cores.
    """
    for fn in fns:
        fn()  # warm-up
    runs: list[list[tuple[float, float]]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            runs[k].append((time.perf_counter() - t0, time.process_time() - c0))
    return [(statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for r in runs]


def module_at(rev: str, rel: str) -> ModuleType:
    """The module file ``rel`` (e.g. ``rag_ablate/compare/stats.py``) as of git revision ``rev``, as a
    stand-alone module: the reference side of a before/after benchmark run in one process."""
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:{rel}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    name = f"{Path(rel).stem}_at_{rev}".replace("-", "_").replace(".", "_")
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def load_ref(rev: str) -> ModuleType:
    """``rag_ablate/compare/stats.py`` as of git revision ``rev``, as a stand-alone module."""
    return module_at(rev, "rag_ablate/compare/stats.py")


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
    ap.add_argument("--ref", metavar="GIT_REV", help="also time rag_ablate/compare/stats.py of this git revision")
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

    # the sign-flip parts alone (private helpers: this is a benchmark of their cost)
    d = var - base
    sums, sizes = group_sums(d, labels)
    sizes_f = sizes.astype(np.float64)
    m = d.shape[1]
    flip_seeds = [derive_seed(seed, "signflip", str(j)) for j in range(m)]

    def ours_signs() -> current._SignFlips:
        rngs = [np.random.default_rng(s) for s in flip_seeds]
        return current._draw_signflips(sums, sizes_f, B, rngs)

    flips = ours_signs()
    p0 = current._pvalue_at(flips, sums, sizes_f, np.zeros(m))
    ref_res = paired_test(base, var, labels, B=B, seed=seed)

    def ours_invert() -> object:
        return current._invert_signflip(
            flips, sums, sizes_f, d.mean(axis=0), p0, (ref_res.boot_ci_low, ref_res.boot_ci_high), 0.05
        )

    fns: list[Callable[[], object]] = [ours_full, ours_draw, ours_shared, ours_signs, ours_invert]
    labels_rows = [
        "rag_ablate `paired_test`: group bootstrap + sign-flip p + inverted interval, 10 metrics",
        "  of which: drawing the count matrix (shared per split)",
        "  `paired_test` with the split's pre-drawn counts",
        "  of which: sign vectors, one stream per metric (10 x 10,000)",
        "  of which: interval by inverting the sign-flip test (bisection, 10 metrics)",
    ]
    if args.ref:
        old = load_ref(args.ref)

        def ref_full() -> object:
            return old.paired_test(base, var, labels, B=B, seed=seed)

        fns.append(ref_full)
        labels_rows.append(f"`paired_test` of git revision `{args.ref}` (same data, interleaved)")
    times = interleaved(fns, args.repeats)
    rows: list[tuple[str, float, float | None]] = [
        (label, wall, cpu) for label, (wall, cpu) in zip(labels_rows, times, strict=True)
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
            ("scipy.stats.bootstrap, paired query-level, per metric (bootstrap only)", t_q, None),
            ("scipy.stats.bootstrap on group sums (same estimator, bootstrap only)", t_g, None),
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
    print("| what | wall time (s) | CPU time (s) | wall vs rag_ablate `paired_test` |")
    print("|---|---:|---:|---:|")
    for label, t, cpu in rows:
        cpu_text = "" if cpu is None else f"{cpu:.3f}"
        print(f"| {label} | {t:.3f} | {cpu_text} | {t / t_ours:.2f}x |")


if __name__ == "__main__":
    main()
