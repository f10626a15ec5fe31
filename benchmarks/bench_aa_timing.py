"""A/A timing benchmark: do latency verdicts favour no side? (issue 22)

One configuration is compared with itself many times; the true effect is 0, so every
significant row is a false positive. Two setups, both on the embedded Chinese sample
(364 queries in 309 groups, BM25 over jieba tokens):

* ``local``: two built-in pipelines with the same settings, built side by side in one
  process (indexes from one cache). Its answers are deterministic, so the two sides'
  quality records are identical and no quality row can be significant;
* ``http``: ``system=http`` against a stub service on 127.0.0.1
  (``tests/stub_rag_service.py``) that puts the relevant documents at a random rank in
  ``--rank-noise`` of its answers, so two runs of one query differ in quality the way a
  nondeterministic service's do, and the quality rate is a real A/A rate too.

What varies between two sweeps of one configuration is the timing noise (and, for a
nondeterministic service, its answers); the systems and their indexes are the same (a
sweep loads them from the cache). So per repetition the systems built once are timed
again by one interleaved pass (``rag_ablate.run.timing.interleave``, seed = repetition),
the stub's answers come from that pass too, and the sweep's own comparison runs on the
result (``compare.analysis.compare`` over the default metrics; latency from the pass via
``compare.timing.apply_timing``). For the local system, ``--old`` also measures the design
the pass replaces: the two jobs one after another, each timing its own queries.

    python benchmarks/bench_aa_timing.py [--reps 200] [--http-reps 200] [--B 999] [--rank-noise 0.3] [--old]

Rates: the share of repetitions with a significant row (p adjusted as the comparison does,
Holm on holdout and BH on dev, below alpha), per split, for the latency family
(``latency_ms``, ``latency_p50_ms``, ``latency_p95_ms``) and for the quality (main) family,
and the raw ``latency_ms`` p < alpha. Prints a markdown section for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_ablate.compare.analysis import compare  # noqa: E402
from rag_ablate.compare.model import Comparison, VariantData  # noqa: E402
from rag_ablate.compare.timing import apply_timing  # noqa: E402
from rag_ablate.config.schema import RunConfig  # noqa: E402
from rag_ablate.core.cache import Cache  # noqa: E402
from rag_ablate.dataset.load import load_dataset  # noqa: E402
from rag_ablate.dataset.model import Dataset, Query  # noqa: E402
from rag_ablate.records.scoring import TokenCounts, make_record, scored  # noqa: E402
from rag_ablate.records.trace import Record, Trace  # noqa: E402
from rag_ablate.run.runner import evaluate  # noqa: E402
from rag_ablate.run.timing import interleave  # noqa: E402
from rag_ablate.systems.base import System  # noqa: E402
from rag_ablate.systems.http import HttpSystem  # noqa: E402
from rag_ablate.systems.local import LocalSystem  # noqa: E402

KS = [1, 3, 5, 10]
SPLITS = ("dev", "holdout")


@dataclass
class Tally:
    """Significant rows per split over the repetitions."""

    reps: int = 0
    latency: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))  # any timing row
    latency_raw: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))  # latency_ms p<alpha
    quality: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))  # any main row
    recall_raw: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))  # recall_at_5 p<alpha
    effects: list[float] = field(default_factory=list)  # holdout latency_ms effect, ms
    seconds: float = 0.0

    def add(self, c: Comparison) -> None:
        self.reps += 1
        for s in SPLITS:
            rows = [r for r in c.rows if r.split == s and r.tested]
            self.latency[s] += any(r.significant for r in rows if r.family == "timing")
            self.quality[s] += any(r.significant for r in rows if r.family == "main")
            self.latency_raw[s] += any(r.p_value < c.alpha for r in rows if r.metric == "latency_ms")
            self.recall_raw[s] += any(r.p_value < c.alpha for r in rows if r.metric == "recall_at_5")
        row = c.row("holdout", "B", "latency_ms")
        if row is not None:
            self.effects.append(row.effect)


def share(k: int, n: int) -> str:
    p = k / n
    return f"{p:.3f} ± {np.sqrt(p * (1 - p) / n):.3f}"


def settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    return s


def records_of(ds: Dataset, traces: dict[str, Trace], routed: bool) -> list[Record]:
    tokens = TokenCounts(None)
    return [
        scored(make_record(q, traces[q.query_id]), q, ds.documents, KS, routed=routed, tokens=tokens)
        for q in ds.queries
    ]


def fresh(variants: Sequence[VariantData]) -> list[VariantData]:
    """Copies whose records' metrics apply_timing may rewrite."""
    return [VariantData(v.label, [copy.copy(r) for r in v.records]) for v in variants]


def run_reps(
    name: str,
    reps: int,
    one: Callable[[int], list[VariantData]],
    B: int,
    alpha: float,
) -> Tally:
    t = Tally()
    t0 = time.perf_counter()
    for rep in range(reps):
        variants = one(rep)
        t.add(compare(variants, baseline="A", B=B, seed=rep, alpha=alpha))
        if (rep + 1) % 50 == 0:
            print(f"  {name}: {rep + 1}/{reps} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    t.seconds = time.perf_counter() - t0
    return t


@contextmanager
def stub_process(rank_noise: float) -> Iterator[str]:
    """tests/stub_rag_service.py serving the sample in a process of its own; its URL."""
    script = REPO / "tests" / "stub_rag_service.py"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, str(script), "--rank-noise", str(rank_noise), "--seed", "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


def local_setup(ds: Dataset, cache_dir: Path) -> dict[str, System]:
    systems: dict[str, System] = {}
    for label in ("A", "B"):
        systems[label] = LocalSystem(settings(), Cache(cache_dir))
        systems[label].prepare(ds)
    return systems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=200, help="local repetitions")
    ap.add_argument("--http-reps", type=int, default=200, help="system=http repetitions")
    ap.add_argument("--B", type=int, default=999)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--rank-noise", type=float, default=0.3)
    ap.add_argument("--old", action="store_true", help="also the jobs one after another (local)")
    args = ap.parse_args()
    ds = load_dataset(None)
    results: list[tuple[str, Tally]] = []
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        # local: quality records once (deterministic), a new interleaved pass per repetition
        systems = local_setup(ds, Path(tmp) / "cache") if args.reps else {}
        quality = [VariantData(label, evaluate(system, ds, KS)) for label, system in systems.items()]

        def local_rep(rep: int) -> list[VariantData]:
            variants = fresh(quality)
            apply_timing(variants, interleave(systems, ds.queries, repeats=1, seed=rep))
            return variants

        if args.reps:
            local = run_reps("local", args.reps, local_rep, args.B, args.alpha)
            results.append(("local, interleaved pass", local))
        if args.old:

            def old_rep(rep: int) -> list[VariantData]:  # job A, then job B, each timing itself
                return [VariantData(label, evaluate(system, ds, KS)) for label, system in systems.items()]

            old = run_reps("old", args.reps, old_rep, args.B, args.alpha)
            results.append(("local, jobs one after another (old)", old))
        for system in systems.values():
            system.close()

        # http: the stub service in a process of its own; its answers vary per call, so quality
        # and latency both come from the pass
        with stub_process(args.rank_noise) if args.http_reps else nullcontext("") as url:
            s = settings()
            s.system.name, s.system.base_url, s.system.chat_path = "http", url, None

            def http_rep(rep: int) -> list[VariantData]:
                # as in a sweep's pass: each deployment gets its own client and warm connection
                https: dict[str, System] = {label: HttpSystem(s) for label in ("A", "B")}
                traces: dict[str, dict[str, Trace]] = {"A": {}, "B": {}}

                def keep(label: str, q: Query, trace: Trace) -> None:
                    traces[label][q.query_id] = trace

                try:
                    for system in https.values():
                        system.prepare(ds)
                    calls = interleave(https, ds.queries, repeats=1, seed=rep, on_trace=keep)
                finally:
                    for system in https.values():
                        system.close()
                variants = [VariantData(label, records_of(ds, traces[label], False)) for label in ("A", "B")]
                apply_timing(variants, calls)
                return variants

            if args.http_reps:
                http = run_reps("http", args.http_reps, http_rep, args.B, args.alpha)
                results.append(("http (stub service), interleaved pass", http))
    elapsed = time.perf_counter() - t_all

    cmd = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    n_groups = {s: len({q.group for q in ds.queries if q.split == s}) for s in SPLITS}
    n_q = {s: sum(1 for q in ds.queries if q.split == s) for s in SPLITS}
    reps = f"{args.reps} local and {args.http_reps} http repetitions"
    print(f"## bench_aa_timing: A/A latency and quality false-positive rates, {reps}\n")
    print(f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, load average {load_before[0]:.2f} at the start and {os.getloadavg()[0]:.2f} at the end")
    print(f"- command: `{cmd}` ({elapsed:.0f} s)")
    print(
        f"- data: the embedded sample, dev {n_q['dev']} queries in {n_groups['dev']} groups, holdout "
        f"{n_q['holdout']} in {n_groups['holdout']}; default metrics, B = {args.B}, alpha {args.alpha}; "
        f"stub rank noise {args.rank_noise}; ± is one binomial standard error\n"
    )
    print(
        "| setup | split | a latency row significant (adjusted) | `latency_ms` p < alpha "
        "| a quality row significant (adjusted) | `recall_at_5` p < alpha |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name, t in results:
        for s in SPLITS:
            print(
                f"| {name} | {s} | {share(t.latency[s], t.reps)} | {share(t.latency_raw[s], t.reps)} | "
                f"{share(t.quality[s], t.reps)} | {share(t.recall_raw[s], t.reps)} |"
            )
    print()
    print("| setup | holdout `latency_ms` effect: mean ± SD over repetitions (ms) | seconds |")
    print("|---|---:|---:|")
    for name, t in results:
        print(f"| {name} | {np.mean(t.effects):+.4f} ± {np.std(t.effects, ddof=1):.4f} | {t.seconds:.0f} |")


if __name__ == "__main__":
    main()
