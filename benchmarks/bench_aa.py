"""A/A simulation: false-positive rates and interval coverage of the comparison statistics.

Each simulated experiment compares a system with itself plus noise that is shared
within near-duplicate groups, so the true effect is 0 and every rejection is a false
positive. Per experiment: G = 40 groups of 1-12 queries, per-query differences
d_i = u_g + e_i with u_g ~ N(0, 1) per group and e_i ~ N(0, 0.5), B = 999.

    python benchmarks/bench_aa.py [--n-sim 2000] [--groups 40] [--B 999] [--alpha 0.05] [--seed 20240501]

The generator, seed and settings are those of ``tests/test_stats.py::
test_aa_simulation_false_positive_rate``, so the default run reproduces the figures the
slow test checks. Prints a markdown section (machine, command, table).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    from rag_ablate.compare import stats
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rag_ablate.compare import stats

from bench_stats import cpu_model  # benchmarks/ is on sys.path when a script here runs


@dataclass
class Tally:
    """Counts over the simulated A/A experiments."""

    n_sim: int = 0
    rej_group: int = 0  # group sign-flip p < alpha (the reported test)
    rej_query: int = 0  # the same test ignoring the groups (every query its own group)
    rej_boot_p: int = 0  # group bootstrap p (p_bootstrap) < alpha
    boot_ci_excl: int = 0  # group percentile bootstrap interval excludes 0
    covered: int = 0  # inverted sign-flip interval contains 0 (the true effect)
    query_covered: int = 0  # same interval when the groups are ignored
    disagree: int = 0  # interval excludes 0 while p >= alpha, or the reverse
    unbounded: int = 0  # intervals that are the whole line
    width_sum: float = 0.0
    boot_width_sum: float = 0.0
    effects: list[float] | None = None
    se_group: list[float] | None = None
    se_query: list[float] | None = None


def simulate(n_sim: int, n_groups: int, B: int, alpha: float, seed: int) -> Tally:
    rng = np.random.default_rng(seed)
    t = Tally(effects=[], se_group=[], se_query=[])
    assert t.effects is not None and t.se_group is not None and t.se_query is not None
    for sim in range(n_sim):
        sizes = rng.integers(1, 13, n_groups)
        labels = np.repeat(np.arange(n_groups), sizes)
        n = labels.size
        base = rng.random(n)
        var = base + rng.normal(0.0, 1.0, n_groups)[labels] + rng.normal(0.0, 0.5, n)
        r = stats.paired_test(base, var, labels, B=B, seed=sim, alpha=alpha)
        q = stats.paired_test(base, var, None, B=B, seed=sim, alpha=alpha)
        rejected = bool(r.p_value[0] < alpha)
        inside = bool(r.ci_low[0] <= 0.0 <= r.ci_high[0])
        t.n_sim += 1
        t.rej_group += rejected
        t.rej_query += bool(q.p_value[0] < alpha)
        t.rej_boot_p += bool(r.p_bootstrap[0] < alpha)
        t.boot_ci_excl += not bool(r.boot_ci_low[0] <= 0.0 <= r.boot_ci_high[0])
        t.covered += inside
        t.query_covered += bool(q.ci_low[0] <= 0.0 <= q.ci_high[0])
        t.disagree += inside == rejected
        t.unbounded += bool(np.isinf(r.ci_low[0]) or np.isinf(r.ci_high[0]))
        t.width_sum += float(r.ci_high[0] - r.ci_low[0])
        t.boot_width_sum += float(r.boot_ci_high[0] - r.boot_ci_low[0])
        t.effects.append(float(r.effect[0]))
        t.se_group.append(float(r.se[0]))
        t.se_query.append(float(stats.linearized_se(var - base)[0]))
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-sim", type=int, default=2_000)
    ap.add_argument("--groups", type=int, default=40)
    ap.add_argument("--B", type=int, default=999)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=20240501)
    args = ap.parse_args()

    t0 = time.perf_counter()
    t = simulate(args.n_sim, args.groups, args.B, args.alpha, args.seed)
    elapsed = time.perf_counter() - t0
    assert t.effects is not None and t.se_group is not None and t.se_query is not None
    n = t.n_sim

    def share(k: int) -> str:
        p = k / n
        return f"{p:.3f} ± {np.sqrt(p * (1 - p) / n):.3f}"

    sd_effect = float(np.std(t.effects, ddof=1))
    cmd = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    print(f"## bench_aa: {n:,} A/A experiments, {args.groups} correlated groups, alpha {args.alpha}\n")
    print(f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs")
    print(f"- Python {platform.python_version()}, numpy {np.__version__}")
    print(f"- command: `{cmd}` ({elapsed:.0f} s)")
    print(f"- data: G = {args.groups} groups of 1-12 queries, d = u_g + e_i, u_g ~ N(0, 1), e_i ~ N(0, 0.5);")
    print(f"  B = {args.B}; seed {args.seed}; ± is one binomial standard error\n")
    print("| what (true effect 0) | share of experiments |")
    print("|---|---:|")
    print(f"| group sign-flip test rejects (p < alpha): false-positive rate | {share(t.rej_group)} |")
    print(f"| query-level sign-flip test (groups ignored) rejects | {share(t.rej_query)} |")
    print(f"| group bootstrap p (`p_bootstrap`) < alpha | {share(t.rej_boot_p)} |")
    print(f"| percentile group-bootstrap interval excludes 0 | {share(t.boot_ci_excl)} |")
    print(f"| inverted sign-flip interval contains 0: coverage | {share(t.covered)} |")
    print(f"| the same interval with the groups ignored contains 0 | {share(t.query_covered)} |")
    print(f"| interval and p disagree (excludes 0 vs p < alpha) | {t.disagree} of {n} |")
    print(f"| unbounded intervals | {t.unbounded} of {n} |")
    print()
    print("| spread of the effect | value |")
    print("|---|---:|")
    print(f"| SD of the effect across experiments (truth) | {sd_effect:.4f} |")
    print(f"| mean group-bootstrap SE | {np.mean(t.se_group):.4f} |")
    print(f"| mean query-level SE (groups ignored) | {np.mean(t.se_query):.4f} |")
    print(
        f"| mean width: inverted interval / percentile interval | {t.width_sum / n:.4f} / {t.boot_width_sum / n:.4f} |"
    )


if __name__ == "__main__":
    main()
