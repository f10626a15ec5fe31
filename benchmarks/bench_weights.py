"""Coverage of the production-weighted interval, and speed of the weighted bootstrap.

Coverage: simulated query sets of G groups (1-3 queries each, a shared N(0, 0.1) shift
per group, N(0, 0.2) noise per query) where the true effect differs by tag: untagged
+0.02 (share 0.6), ``numeric`` +0.10 (share 0.3, weight 0.5), ``edge`` -0.30 (share
0.1, weight 0). The production effect is E[w d] / E[w]; the share of runs whose 95%
weighted interval covers it, next to the share for the plain (unweighted) interval,
which estimates the query set's mean instead. Same generator as the slow test
``tests/test_weights.py::test_weighted_bootstrap_interval_covers_the_production_effect``.

Speed: 10 metric columns x 2 weightings on one shared count matrix, against
``stats.paired_test`` on the same columns (what the plain rows cost).

    python benchmarks/bench_weights.py [--runs 1000] [--groups 60] [--B 1000] [--seed 2026]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    from rag_ablate.compare import stats
    from rag_ablate.compare.mix import weighted_paired_bootstrap, weighted_paired_bootstraps
    from rag_ablate.dataset.weights import TagWeights
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rag_ablate.compare import stats
    from rag_ablate.compare.mix import weighted_paired_bootstrap, weighted_paired_bootstraps
    from rag_ablate.dataset.weights import TagWeights

EFFECTS = {"": 0.02, "numeric": 0.10, "edge": -0.30}
SHARES = {"": 0.6, "numeric": 0.3, "edge": 0.1}


def coverage(runs: int, n_groups: int, B: int, seed: int) -> tuple[float, float, float]:
    """(true production effect, weighted coverage, plain coverage)."""
    rng = np.random.default_rng(seed)
    tw = TagWeights({"numeric": 0.5})
    w_tag = {t: tw.weight([t] if t else []) for t in SHARES}
    truth = sum(SHARES[t] * w_tag[t] * EFFECTS[t] for t in SHARES) / sum(SHARES[t] * w_tag[t] for t in SHARES)
    hits = plain = 0
    for _ in range(runs):
        groups, tags, d = [], [], []
        for g in range(n_groups):
            shift = rng.normal(0, 0.1)
            for _ in range(int(rng.integers(1, 4))):
                t = str(rng.choice(list(SHARES), p=list(SHARES.values())))
                groups.append(f"g{g}")
                tags.append([t] if t else [])
                d.append(EFFECTS[t] + shift + rng.normal(0, 0.2))
        w = np.array([tw.weight(t) for t in tags])
        zeros, dd = np.zeros(len(d)), np.array(d)
        res = weighted_paired_bootstrap(zeros, dd, groups, w, B=B, seed=int(rng.integers(1 << 31)))
        hits += res.ci_low <= truth <= res.ci_high
        ones = weighted_paired_bootstrap(zeros, dd, groups, np.ones(len(d)), B=B, seed=1)
        plain += ones.ci_low <= truth <= ones.ci_high
    return truth, hits / runs, plain / runs


def speed(n: int = 10_000, n_groups: int = 3_000, m: int = 10, B: int = 10_000) -> tuple[float, float]:
    """Seconds for the weighted rows (m metrics x 2 weightings) and for paired_test on m metrics."""
    rng = np.random.default_rng(0)
    groups = np.array([f"g{x:05d}" for x in rng.integers(0, n_groups, n)])
    counts = list(stats.bootstrap_counts(len(set(groups)), B, np.random.default_rng(1)))
    b, v = rng.random((n, m)), rng.random((n, m))
    w = np.column_stack([rng.choice([0.0, 0.5, 1.0], n), (rng.random(n) < 0.1).astype(float)])
    t0 = time.perf_counter()
    weighted_paired_bootstraps(b, v, groups, w, counts=counts)
    t1 = time.perf_counter()
    stats.paired_test(b, v, groups, counts=counts)
    return t1 - t0, time.perf_counter() - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=60)
    ap.add_argument("--B", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    truth, weighted, plain = coverage(args.runs, args.groups, args.B, args.seed)
    print(
        f"true production effect {truth:.4f}: the weighted 95% interval covers it in {weighted:.3f} "
        f"of {args.runs} runs ({args.groups} groups, B={args.B}); the plain interval in {plain:.3f}"
    )
    t_w, t_p = speed()
    print(
        f"10,000 queries in ~3,000 groups, B=10,000: weighted rows (10 metrics x 2 weightings) {t_w:.2f} s, "
        f"paired_test on the same 10 metrics {t_p:.2f} s"
    )


if __name__ == "__main__":
    main()
