"""Coverage and A/A rate of the comparison's interval with repeated runs (``system.repeats=k``).

Simulated studies, each 50 groups of 2 near-duplicate queries answered k times by a baseline and
a variant. A query's quality is shared by both sides; the variant adds the true effect plus a
part that varies by group and query (SD ``spread``; the effect is not the same on every query);
every run adds noise of its own (SD ``noise``; a system at temperature > 0). Per scenario:

* **nested** (rag_ablate): each query's value is the mean of its runs
  (:func:`rag_ablate.compare.repeats.repeat_means`), then the group sign-flip test and its
  inverted 95% interval (:func:`rag_ablate.compare.stats.paired_test`), as the comparison step;
  also its group-bootstrap percentile interval;
* **naive**: every run counted as a query of its own (k x the queries, no groups);
* **every level**: a percentile bootstrap that resamples groups, then queries within each drawn
  group, then runs within each drawn query, all with replacement.

Prints, per scenario, the coverage of the true effect (or, for A/A scenarios, the share of
studies that reject at 0.05) and the mean interval width. A binary A/A scenario runs pass/fail
verdicts whose per-query pass rate is drawn from Beta(1, 1) (flaky queries), the same on both sides.

    python benchmarks/bench_repeats.py [--studies 2000] [--B 1000] [--seed 27]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_ablate.compare import stats  # noqa: E402

Array = npt.NDArray[np.float64]
GROUPS, SIZE = 50, 2


@dataclass
class Scenario:
    name: str
    effect: float
    spread: float
    noise: float
    k: int
    binary: bool = False


SCENARIOS = [
    Scenario("effect varies by query, little run noise", 0.2, 0.8, 0.5, 3),
    Scenario("effect varies by query, run noise", 0.2, 0.6, 1.0, 3),
    Scenario("mostly run noise", 0.2, 0.3, 1.5, 3),
    Scenario("one run (k=1)", 0.2, 0.6, 1.0, 1),
    Scenario("five runs (k=5)", 0.2, 0.6, 1.0, 5),
    Scenario("A/A, run noise only", 0.0, 0.0, 1.0, 3),
    Scenario("A/A, binary verdicts, flaky queries", 0.0, 0.0, 0.0, 3, binary=True),
]


def simulate(
    rng: np.random.Generator, sc: Scenario, studies: int
) -> tuple[Array, Array, npt.NDArray[np.int64]]:
    """(baseline, variant) per query, study and run: shape (queries, studies, k); and the groups."""
    n = GROUPS * SIZE
    groups = np.repeat(np.arange(GROUPS), SIZE)
    if sc.binary:
        rate = rng.beta(1.0, 1.0, (n, studies))[..., None]
        base = (rng.random((n, studies, sc.k)) < rate).astype(np.float64)
        var = (rng.random((n, studies, sc.k)) < rate).astype(np.float64)
        return base, var, groups
    quality = rng.normal(0, 1, (n, studies))
    shift = (
        sc.effect
        + rng.normal(0, sc.spread, (GROUPS, studies))[groups]
        + rng.normal(0, sc.spread / 2, (n, studies))
    )
    base = quality[..., None] + rng.normal(0, sc.noise, (n, studies, sc.k))
    var = (quality + shift)[..., None] + rng.normal(0, sc.noise, (n, studies, sc.k))
    return base, var, groups


def every_level(rng: np.random.Generator, base: Array, var: Array, B: int) -> tuple[Array, Array]:
    """Percentile 95% intervals of the bootstrap that resamples groups, queries and runs, per study."""
    n, studies, k = base.shape
    lo, hi = np.empty(studies), np.empty(studies)
    for s in range(studies):
        g = rng.integers(0, GROUPS, (B, GROUPS))
        q = (g[..., None] * SIZE + rng.integers(0, SIZE, (B, GROUPS, SIZE))).reshape(B, -1)
        rb = rng.integers(0, k, (B, n, k))
        rv = rng.integers(0, k, (B, n, k))
        b = base[:, s, :][q[..., None], rb].mean(axis=(1, 2))
        v = var[:, s, :][q[..., None], rv].mean(axis=(1, 2))
        lo[s], hi[s] = np.percentile(v - b, [2.5, 97.5])
    return lo, hi


def runs(x: Array) -> Array:
    """Every run as a query of its own: (queries x k, studies)."""
    return x.transpose(0, 2, 1).reshape(-1, x.shape[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=2000)
    ap.add_argument("--B", type=int, default=1000, help="sign vectors and bootstrap resamples")
    ap.add_argument("--every-level-studies", type=int, default=500, help="the slow bootstrap's studies")
    ap.add_argument("--seed", type=int, default=27)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(
        f"command: python benchmarks/bench_repeats.py --studies {args.studies} --B {args.B} "
        f"--every-level-studies {args.every_level_studies} --seed {args.seed}"
    )
    print()
    print(
        "| scenario | k | nested: test-inverted CI | nested: bootstrap CI | naive (runs as queries) "
        "| every level resampled | width nested / naive / every level |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    t0 = time.process_time()
    for sc in SCENARIOS:
        base, var, groups = simulate(rng, sc, args.studies)
        ours = stats.paired_test(base.mean(2), var.mean(2), groups, B=args.B, seed=args.seed)
        naive = stats.paired_test(runs(base), runs(var), None, B=args.B, seed=args.seed)
        m = args.every_level_studies
        lo3, hi3 = every_level(rng, base[:, :m], var[:, :m], args.B)
        aa = sc.effect == 0.0 and sc.spread == 0.0

        def rate(lo: Array, hi: Array, effect: float = sc.effect, aa: bool = aa) -> str:
            inside = np.mean((lo <= effect) & (hi >= effect))
            return f"{1 - inside:.4f} reject" if aa else f"{inside:.4f} cover"

        widths = [
            np.mean(ours.ci_high - ours.ci_low),
            np.mean(naive.ci_high - naive.ci_low),
            np.mean(hi3 - lo3),
        ]
        print(
            f"| {sc.name} | {sc.k} | {rate(ours.ci_low, ours.ci_high)} | "
            f"{rate(ours.boot_ci_low, ours.boot_ci_high)} | {rate(naive.ci_low, naive.ci_high)} | "
            f"{rate(lo3, hi3)} ({m} studies) | {' / '.join(f'{w:.3f}' for w in widths)} |"
        )
    print(f"\nCPU {time.process_time() - t0:.1f} s; load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
