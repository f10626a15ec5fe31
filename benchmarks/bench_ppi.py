"""Coverage of a biased judge's plain interval and of the prediction-powered one (issue 27 item 2).

Each simulated experiment scores N queries in near-duplicate groups of 1-3 (a shared group effect)
on a 0-5 scale twice, baseline and variant; people would give ``H`` (the variant is 0.3 better
before rounding), a lenient judge gives ``J`` = H + 0.7 (baseline) or H + 1.1 (variant, whose
answers it likes more) plus noise, rounded and clipped to 0-5. 5% of the queries fail on each side
(both scales score a failure 0, the metrics' miss). People score both answers of ``n`` queries
drawn at random. The truth is the population mean of H (and of the paired difference), taken from
two million independent queries. Per experiment, with the comparison's own functions
(:mod:`rag_ablate.compare.ppi`): the judge's plain mean and the prediction-powered estimate, each
with its 95% percentile group-bootstrap interval; the table gives how often each interval holds
the truth, its mean width and the mean estimate.

    python benchmarks/bench_ppi.py [--reps 4000] [--queries 600] [--labels 30 60 150 300] [--B 1000]

``tests/test_ppi.py::test_coverage_of_a_biased_judge`` runs :func:`simulate` with its defaults
(150 labels). Prints a markdown section (machine, command, table).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

try:
    from rag_ablate.compare import ppi, stats
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rag_ablate.compare import ppi, stats

FloatArray = npt.NDArray[np.float64]

#: the simulated judge's bias (judge minus people, before rounding) and the true variant gain
BIAS_BASELINE, BIAS_VARIANT, GAIN = 0.7, 1.1, 0.3
FAIL_RATE = 0.05
#: the estimates the table reports, as indices into ppi.ESTIMATES, with their truth's name
REPORTED = {
    "baseline_plain": "level",
    "baseline_ppi": "level",
    "effect_plain": "effect",
    "effect_ppi": "effect",
}


def _scores(
    rng: np.random.Generator, codes: npt.NDArray[np.int64], n_groups: int, reps: int
) -> list[FloatArray]:
    """(N, reps) arrays: baseline and variant scores by people and by the judge, answered flags."""
    n = codes.shape[0]
    quality = 2.6 + rng.normal(0.0, 0.8, (n_groups, reps))[codes] + rng.normal(0.0, 1.0, (n, reps))
    hb = np.clip(np.rint(quality), 0, 5)
    hv = np.clip(np.rint(quality + GAIN + rng.normal(0.0, 0.5, (n, reps))), 0, 5)
    jb = np.clip(np.rint(hb + BIAS_BASELINE + rng.normal(0.0, 0.9, (n, reps))), 0, 5)
    jv = np.clip(np.rint(hv + BIAS_VARIANT + rng.normal(0.0, 0.9, (n, reps))), 0, 5)
    okb = rng.random((n, reps)) >= FAIL_RATE
    okv = rng.random((n, reps)) >= FAIL_RATE
    return [hb * okb, hv * okv, jb * okb, jv * okv, okb.astype(np.float64), okv.astype(np.float64)]


def truth(seed: int, n: int = 2_000_000) -> dict[str, float]:
    """The population means people would give: the baseline's level and the paired effect."""
    rng = np.random.default_rng(seed)
    hb, hv, *_ = _scores(rng, np.arange(n), n, 1)
    return {"level": float(hb.mean()), "effect": float((hv - hb).mean())}


@dataclass
class Result:
    reps: int
    n_queries: int
    n_groups: int
    n_labels: int
    B: int
    covered: dict[str, float] = field(
        default_factory=dict
    )  # estimate -> share of intervals holding the truth
    width: dict[str, float] = field(default_factory=dict)
    mean: dict[str, float] = field(default_factory=dict)
    truth: dict[str, float] = field(default_factory=dict)


def simulate(
    reps: int = 4000,
    n_queries: int = 600,
    n_labels: int = 150,
    B: int = 1000,
    batches: int = 8,
    seed: int = 20261204,
    alpha: float = 0.05,
) -> Result:
    """Coverage, width and mean of the plain and prediction-powered estimates (module docstring).
    Vectorised: each batch of experiments shares one bootstrap draw of its own."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, size=n_queries)
    sizes = sizes[np.cumsum(sizes) <= n_queries]
    n_groups, n = len(sizes), int(sizes.sum())
    codes = np.repeat(np.arange(n_groups), sizes)
    res = Result(reps, n, n_groups, n_labels, B, truth=truth(seed + 1))
    idx = {name: ppi.ESTIMATES.index(name) for name in REPORTED}
    sums = {name: np.zeros(3) for name in REPORTED}  # covered, width, estimate
    per = reps // batches
    for _ in range(batches):
        hb, hv, jb, jv, okb, okv = _scores(rng, codes, n_groups, per)
        chosen = np.argsort(rng.random((n, per)), axis=0) < n_labels  # n_labels random queries
        cols = ppi.query_columns(
            ppi.side_columns(jb, okb, np.where(chosen & (okb > 0), hb, np.nan)),
            ppi.side_columns(jv, okv, np.where(chosen & (okv > 0), hv, np.nan)),
        )  # (N, per, 9)
        totals = ppi.group_totals(cols, codes, n_groups)
        counts = np.concatenate(list(stats.bootstrap_counts(n_groups, B, rng))).astype(np.float64)
        draws = (counts @ totals.reshape(n_groups, -1)).reshape(B, per, len(ppi.COLUMNS))
        point = ppi.estimates(totals.sum(axis=0))  # (per, 6)
        lo, hi = ppi.intervals(ppi.estimates(draws), alpha)
        for name, i in idx.items():
            t = res.truth[REPORTED[name]]
            sums[name] += [
                np.sum((lo[:, i] <= t) & (t <= hi[:, i])),
                np.sum(hi[:, i] - lo[:, i]),
                np.sum(point[:, i]),
            ]
    done = per * batches
    res.reps = done
    for name, (cov, width, mean) in sums.items():
        res.covered[name], res.width[name], res.mean[name] = cov / done, width / done, mean / done
    return res


def markdown(results: list[Result], command: str, seconds: float) -> str:
    r0 = results[0]
    lines = [
        "## Judge bias corrected by human labels: prediction-powered inference (issue 27 item 2)",
        "",
        f"`{command}` ({seconds:.0f} s). {r0.reps} simulated experiments per row, {r0.n_queries} queries "
        f"in {r0.n_groups} near-duplicate groups, B = {r0.B}; people's truth: baseline "
        f"{r0.truth['level']:.3f}, effect {r0.truth['effect']:+.3f}; the judge scores "
        f"{BIAS_BASELINE} (baseline) and {BIAS_VARIANT} (variant) higher before rounding. Coverage of "
        "the 95% percentile group-bootstrap intervals (SE about 0.004):",
        "",
        "| human labels | baseline, judge only | baseline, prediction-powered | effect, judge only "
        "| effect, prediction-powered | width: judge only / PPI (effect) | mean effect: judge only / PPI |",
        "|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        c = r.covered
        lines.append(
            f"| {r.n_labels} | {c['baseline_plain']:.3f} | {c['baseline_ppi']:.3f} | {c['effect_plain']:.3f} | "
            f"{c['effect_ppi']:.3f} | {r.width['effect_plain']:.3f} / {r.width['effect_ppi']:.3f} | "
            f"{r.mean['effect_plain']:+.3f} / {r.mean['effect_ppi']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--queries", type=int, default=600)
    ap.add_argument("--labels", type=int, nargs="+", default=[30, 60, 150, 300])
    ap.add_argument("--B", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261204)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    results = [
        simulate(args.reps, args.queries, n_labels, args.B, seed=args.seed) for n_labels in args.labels
    ]
    command = "python benchmarks/bench_ppi.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(markdown(results, command.strip(), time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
