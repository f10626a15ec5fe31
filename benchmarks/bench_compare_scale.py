"""The comparison step at scale (issue 15): a baseline and 2 variants over 10k and 100k queries.

    python benchmarks/bench_compare_scale.py [--sizes 10000,100000] [--B 10000] [--out DIR] [--cli]
    python benchmarks/bench_compare_scale.py --sizes 10000,100000 --reuse --code OLD_CHECKOUT --code .

Per size it generates a sweep folder in the layout the jobs write (``<out>/n<size>/``
with ``sweep.json``, ``plan.json`` and job folders ``0``, ``1``, ``2``, each holding
``records.jsonl``, ``variant.json``, ``config.yaml``, ``summary.json`` and ``run.json``;
names from :mod:`rag_ablate.core.layout`), then runs the comparison step on it and prints a
markdown table of wall seconds and peak RSS per phase.

The data: query texts from ``bench_grouping.make_queries`` (Chinese and English, ~20%
templated near-duplicates with other order numbers, dates and ids), grouped by the real
near-duplicate grouping and split dev/holdout by the real ``assign_splits`` (the
"grouping" phase, what dataset loading does for queries without a group). Each query gets
an intent (8 leaves under 3 parents) and 0-2 of 6 tags (``edge`` among them, so the
production mix runs); per-query metrics (recall/hit/precision/mrr/ndcg at 1, 3, 5, 10,
evidence recall, intent_top1, context tokens, latency) with a group effect, a retrieved
list of 10 entries like a real record, and ~0.3% failed queries (status ``error``). The
variants differ from the baseline by a small overall gain (job 1) and a gain that turns
into a loss on one slice (job 2).

Phases (run in-process through the same functions as ``rag-ablate compare``):
``read records`` (load_source), ``guard``, ``statistics`` (rag_ablate.compare.run.statistics:
the comparison, its slices and its trade-off on one draw per split, split into the draws of
the bootstrap counts, the paired tests, the latency percentiles, the production mix and the
flips by timing those functions), ``pairwise``, ``render`` (comparison.json/.md and the
terminal table) and ``report.html``. Peak RSS per phase: the kernel's high-water mark, reset
before each phase (``/proc/self/clear_refs``), read from ``/proc/self/status``; CPU per phase
counts the worker processes that read records files side by side (the workers' own peak RSS
is printed under the table).
``--cli`` also times ``rag-ablate compare <sweep dir>`` as a subprocess (wall and max RSS).
``--code DIR`` (repeated) runs every size under each checkout's package in turn, one subprocess
each, and prints one table side by side (a checkout without ``run.statistics``, before lane cmp29,
runs the comparison, its slices and its trade-off one after the other as that code did).
``--read-only`` times the read phase alone, one row a size (with ``--reuse``, without generating
or grouping anything). ``--generate-only`` writes the sweep folders and stops (1,000,000
queries: 7.4 GB of records, written a line at a time, never held).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import rag_ablate  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(REPO))

from bench_grouping import make_queries  # noqa: E402  (benchmarks/ is on sys.path)
from bench_stats import cpu_model  # noqa: E402

from rag_ablate.core.layout import (  # noqa: E402
    CONFIG_FILE,
    PLAN_FILE,
    RECORDS_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    VARIANT_FILE,
)

INTENTS = {
    "KNOWLEDGE": ["K_returns", "K_shipping", "K_invoice", "K_product"],
    "ACTION": ["A_cancel", "A_address"],
    "CHITCHAT": ["C_greet", "C_thanks"],
}
TAGS = ["paraphrase", "numeric", "multi_doc", "long_context", "ambiguous", "edge"]
KS = (1, 3, 5, 10)
VARIANTS = [("baseline", "512", None), ("chunk=256", "256", "256"), ("chunk=1024", "1024", "1024")]


# --------------------------------------------------------------------------- memory


def _status(field: str) -> float:
    """A /proc/self/status field in MB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return math.nan


def _cpu() -> float:
    """CPU seconds (user + sys) of this process and of its finished child processes (the record
    reader's worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _workers_peak() -> float:
    """The largest peak RSS (MB) of a finished child process (0: none ran)."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def _reset_peak() -> None:
    with contextlib.suppress(OSError):  # not Linux
        Path("/proc/self/clear_refs").write_text("5")


class Phases:
    """Wall seconds and peak RSS per top-level phase, plus seconds inside timed functions."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float, float]] = []  # name, wall s, peak MB, CPU s
        self.inner: dict[str, list[float]] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        _reset_peak()
        t, cpu = time.perf_counter(), _cpu()
        yield
        self.rows.append((name, time.perf_counter() - t, _status("VmHWM"), _cpu() - cpu))

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        fn: Callable[..., Any] = getattr(owner, attr)
        acc = self.inner.setdefault(name, [0.0, 0.0, 0.0])  # wall s, calls, CPU s (the process's)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += time.perf_counter() - t
                acc[1] += 1
                acc[2] += time.process_time() - cpu

        setattr(owner, attr, timed)


# --------------------------------------------------------------------------- data


def _clip(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x


def _metrics(rng: np.random.Generator, quality: float, tokens: float, latency: float) -> dict[str, float]:
    """A record's metrics: ranked-list metrics consistent with one another from a latent quality."""
    first = int(rng.geometric(max(0.05, min(0.95, quality))))  # rank of the first relevant doc
    n_rel = int(rng.integers(1, 4))
    out: dict[str, float] = {"latency_ms": latency, "intent_top1": float(rng.random() < 0.8)}
    for k in KS:
        hit = 1.0 if first <= k else 0.0
        found = min(n_rel, hit * (1 + int(rng.integers(0, n_rel))))
        out[f"context_tokens_at_{k}"] = float(round(tokens * k / 5))
        out[f"hit_at_{k}"] = hit
        out[f"recall_at_{k}"] = found / n_rel
        out[f"precision_at_{k}"] = found / k
        out[f"mrr_at_{k}"] = hit / first
        out[f"ndcg_at_{k}"] = _clip(hit / math.log2(first + 1) * (0.6 + 0.4 * found / n_rel))
        out[f"full_recall_at_{k}"] = float(found == n_rel)
        out[f"evidence_recall_at_{k}"] = _clip(found / n_rel - 0.1 * rng.random())
    return out


def _retrieved(rng: np.random.Generator, n_docs: int) -> list[dict[str, Any]]:
    docs = rng.integers(0, n_docs, 10)
    starts = rng.integers(0, 4000, 10)
    return [
        {
            "rank": r + 1,
            "chunk_id": f"DOC_{d:06d}#{s // 450}",
            "doc_id": f"DOC_{d:06d}",
            "start": int(s),
            "end": int(s) + 480,
            "score": round(float(12.0 - r - rng.random()), 6),
        }
        for r, (d, s) in enumerate(zip(docs, starts, strict=True))
    ]


def build_dataset(n: int, seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Queries with their group, split, intent and tags; the grouping phase's timings."""
    from rag_ablate.dataset.grouping.groups import group_near_duplicates
    from rag_ablate.dataset.grouping.splits import assign_splits

    texts = make_queries(n, seed=seed)
    ids = [f"q{i:07d}" for i in range(n)]
    t, cpu = time.perf_counter(), time.process_time()
    grouping = group_near_duplicates(texts, ids=ids)
    splits = assign_splits(grouping.group_of, holdout_share=0.3, seed=seed)
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    rnd = random.Random(seed)
    parents = list(INTENTS)
    queries = []
    for i in range(n):
        l1 = rnd.choices(parents, weights=[0.7, 0.2, 0.1])[0]
        k = rnd.choices([0, 1, 2], weights=[0.5, 0.35, 0.15])[0]
        queries.append(
            {
                "query_id": ids[i],
                "query": texts[i],
                "split": splits[i],
                "group": grouping.group_of[i],
                "intent_gold_l1": l1,
                "intent_gold": rnd.choice(INTENTS[l1]),
                "tags": sorted(set(rnd.sample(TAGS, k))),
            }
        )
    return queries, {"seconds": seconds, "cpu": cpu, "groups": float(grouping.n_groups)}


def _config_yaml(chunk: str) -> str:
    from omegaconf import OmegaConf

    from rag_ablate.config.schema import RunConfig

    cfg = OmegaConf.structured(RunConfig())
    cfg.chunk.size = int(chunk)
    cfg.dataset.name = "bench_compare_scale"
    return str(OmegaConf.to_yaml(cfg))


def write_sweep(sweep: Path, queries: list[dict[str, Any]], seed: int = 0) -> None:
    """A sweep folder of 3 finished jobs over ``queries`` (see the module docstring)."""
    if sweep.exists():
        shutil.rmtree(sweep)
    sweep.mkdir(parents=True)
    n = len(queries)
    rng = np.random.default_rng(seed)
    # latent per-group quality: near-duplicates succeed or fail together
    groups = sorted({q["group"] for q in queries})
    g_index = {g: i for i, g in enumerate(groups)}
    g_quality = rng.beta(4, 2, len(groups))
    g_delta = rng.normal(0.0, 0.08, (len(VARIANTS), len(groups)))
    fingerprint = {"corpus_fingerprint": "c" * 64, "queries_fingerprint": f"{n:064d}"}
    plan = {"jobs": []}
    for job, (label, chunk, level) in enumerate(VARIANTS):
        folder = sweep / str(job)
        folder.mkdir()
        overrides = [] if level is None else [f"chunk={level}"]
        info = {
            "label": label,
            "overrides": overrides,
            "choices": {
                "chunk": chunk,
                "retrieval": "bm25",
                "dataset": "bench_compare_scale",
                "system": "local",
            },
            "job_num": job,
            "role": "baseline" if level is None else "variant",
            "factor": None if level is None else "chunk",
            "level": level,
            "mode": "ofat",
            "dataset": "bench_compare_scale",
            **fingerprint,
        }
        plan["jobs"].append({"index": job, "label": label, "overrides": overrides})
        (folder / VARIANT_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
        (folder / CONFIG_FILE).write_text(_config_yaml(chunk), encoding="utf-8")
        (folder / SUMMARY_FILE).write_text(json.dumps({"label": label, "run_id": None}), encoding="utf-8")
        (folder / RUN_FILE).write_text(json.dumps({"run_id": None, "tracking_uri": None}), encoding="utf-8")
        vrng = np.random.default_rng([seed, job])
        with (folder / RECORDS_FILE).open("w", encoding="utf-8") as f:
            for q in queries:
                gi = g_index[q["group"]]
                quality = g_quality[gi]
                if job == 1:
                    quality += 0.03 + g_delta[job, gi]
                elif job == 2:  # helps overall, hurts numeric queries
                    quality += (-0.12 if "numeric" in q["tags"] else 0.05) + g_delta[job, gi]
                quality = _clip(quality + vrng.normal(0, 0.05))
                tokens = float(vrng.normal(1800, 300)) * int(chunk) / 512
                latency = float(vrng.lognormal(math.log(40 + 20 * job), 0.35))
                failed = vrng.random() < 0.003
                rec: dict[str, Any] = {
                    **{k: q[k] for k in ("query_id", "query", "split", "group")},
                    "kind": "answerable",
                    "tags": q["tags"],
                    "intent_gold": q["intent_gold"],
                    "intent_gold_l1": q["intent_gold_l1"],
                    "status": "error" if failed else "ok",
                    "error": "timeout after 30.0 s" if failed else None,
                    "retrieved": [] if failed else _retrieved(vrng, 20_000),
                    "intent_pred": q["intent_gold"],
                    "intent_score": round(float(vrng.random()), 6),
                    "timings_ms": {"bm25": latency * 0.95, "total": latency},
                    "intents": [q["intent_gold"]],
                    "answer": None,
                    "citations": [],
                    "usage": None,
                    "usage_count": None,
                    "cached": False,
                    "ttft_ms": None,
                    "http_status": None,
                    "retries": 0,
                    "metrics": {"latency_ms": latency}
                    if failed
                    else _metrics(vrng, quality, tokens, latency),
                }
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    (sweep / PLAN_FILE).write_text(json.dumps(plan, indent=1), encoding="utf-8")
    (sweep / SWEEP_FILE).write_text(
        json.dumps({"overrides": ["chunk=256,512,1024"], "jobs": 3}), encoding="utf-8"
    )


# --------------------------------------------------------------------------- the comparison step

#: the inner timers of ``run.statistics``'s three planners (the columns are read by the first)
PLANNERS = (
    "planning the comparison (pairing, columns, group sums)",
    "planning the slices",
    "planning the trade-off",
)


def run_phases(sweep: Path, B: int, seed: int) -> tuple[Phases, Any]:
    """The comparison step of ``rag-ablate compare <sweep>``, phase by phase (module docstring)."""
    from rag_ablate.compare import analysis, draws, pairwise, render, run, stats, tradeoff
    from rag_ablate.compare.guard import check
    from rag_ablate.compare.load import pick_baseline
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.report.html import write_report

    ph = Phases()
    if hasattr(run, "statistics"):
        planners = ((run, "plan_compare"), (run, "plan_slices"), (tradeoff, "plan"))
        for (owner, attr), name in zip(planners, PLANNERS, strict=True):
            ph.wrap(owner, attr, name)
    ph.wrap(draws.SharedDraws, "run", "bootstrap draws and sign streams, each streamed once to all its tests")
    ph.wrap(stats, "paired_test", "paired tests (sign flip + interval, bootstrap summaries)")
    ph.wrap(stats, "paired_quantile_tests", "latency percentiles (summaries)")
    ph.wrap(analysis, "mix_rows", "production mix (summaries)")
    ph.wrap(analysis, "_add_flips", "flips")
    settings = CompareConfig(B=B, min_slice_groups=6)
    with ph.phase("read records"):
        src = run.load_source(sweep)
    with ph.phase("guard"):
        check(src.variants, pick_baseline(src.variants, settings.baseline)[0].label)
    with ph.phase("statistics: compare, slices, trade-off (one draw per split)"):
        if hasattr(run, "statistics"):
            c = run.statistics(src.variants, settings, seed=seed)  # caps the flips, as the step does
        else:  # a checkout before lane cmp29 (--code): the three steps one after the other
            c = _statistics_before(src.variants, settings, seed)
    inner_compare = {k: list(v) for k, v in ph.inner.items()}
    with ph.phase("pairwise"):
        c.pairwise = pairwise.pairwise_section(src.variants, c)
    with ph.phase("render (comparison.json/.md, terminal)"):
        render.write_outputs(c, src.out_dir)
        render.format_terminal(c)
    with ph.phase("report.html (plots, page)"):
        write_report(src.out_dir, c, src.variants)
    ph.inner = inner_compare
    return ph, c


def _statistics_before(variants: Any, settings: Any, seed: int) -> Any:
    """The comparison, its slices and its trade-off as a checkout before lane cmp29 computes them."""
    from rag_ablate.compare import analysis, slices, tradeoff

    c = analysis.compare(
        variants,
        baseline=settings.baseline,
        metrics=settings.metrics,
        splits=settings.splits,
        B=settings.B,
        seed=seed,
        alpha=settings.alpha,
        flip_threshold=settings.flip_threshold,
    )
    c.cap_flips()
    c.slices = slices.compare_slices(
        variants, c, metrics=slices.resolve_metrics(variants, settings), min_groups=settings.min_slice_groups
    )
    tradeoff.attach(c, variants, settings, seed=seed)
    return c


def side_by_side(args: argparse.Namespace, sizes: list[int]) -> None:
    """Each size under each ``--code`` checkout in turn (this script, that checkout's package, one
    subprocess each), then one table: wall / CPU seconds per phase, peak RSS, the process's CPU."""
    got: dict[tuple[int, str], dict[str, Any]] = {}
    for n in sizes:
        for code in args.code:
            out = Path(args.out) / f"side_{n}_{Path(code).name}.json"
            cmd = [sys.executable, __file__, "--sizes", str(n), "--B", str(args.B), "--seed", str(args.seed)]
            cmd += ["--out", args.out, "--json", str(out)] + (["--reuse"] if args.reuse else [])
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            load = os.getloadavg()[0]
            subprocess.run(cmd, env={**os.environ, "PYTHONPATH": code}, check=True, stdout=subprocess.DEVNULL)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            res = json.loads(out.read_text())
            res["process CPU"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            res["load"] = (load, os.getloadavg()[0])
            got[(n, code)] = res
            print(f"- {n:,} queries, {code}: load average {load:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    cols = [(n, code) for n in sizes for code in args.code]
    names = list(dict.fromkeys(p for key in cols for p in got[key]["phases"]))
    print(
        "\n| phase: wall s / CPU s (peak MB) | " + " | ".join(f"{n:,} {Path(c).name}" for n, c in cols) + " |"
    )
    print("|---|" + "---:|" * len(cols))
    for name in names:
        cells = []
        for key in cols:
            p = got[key]["phases"].get(name)
            cells.append("-" if p is None else f"{p[0]:.2f} / {p[2]:.2f} ({p[1]:,.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")
        if name.startswith("statistics"):  # planning: one core, before the draws (wall / CPU s)
            planners = [k for k in PLANNERS if any(k in got[key].get("inner", {}) for key in cols)]
            for inner, summed in [*((k, [k]) for k in planners), ("planning, the three", planners)]:
                cells = []
                for key in cols:
                    parts = [got[key]["inner"][k] for k in summed if k in got[key].get("inner", {})]
                    wall, cpu = sum(p[0] for p in parts), sum(p[2] for p in parts)
                    cells.append(f"{wall:.2f} / {cpu:.2f}" if parts else "-")
                print(f"| &nbsp;&nbsp;of which {inner} | " + " | ".join(cells) + " |")
    print(
        "| **comparison step, total** | "
        + " | ".join(
            f"**{sum(p[0] for p in got[k]['phases'].values()):.2f} / {sum(p[2] for p in got[k]['phases'].values()):.2f}"
            f" ({max(p[1] for p in got[k]['phases'].values()):,.0f})**"
            for k in cols
        )
        + " |"
    )
    print(
        "| the process, CPU s (user + sys, generation of the queries included) | "
        + " | ".join(f"{got[k]['process CPU']:.1f}" for k in cols)
        + " |"
    )
    print(
        "| load average (start -> end) | "
        + " | ".join(f"{got[k]['load'][0]:.1f} -> {got[k]['load'][1]:.1f}" for k in cols)
        + " |"
    )


def _cli(sweep: Path, B: int) -> tuple[float, float]:
    """Wall seconds and max RSS (MB) of ``rag-ablate compare <sweep>`` in a subprocess."""
    exe = shutil.which("rag-ablate") or str(Path(sys.executable).parent / "rag-ablate")
    code = (
        "import resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
        "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, r.returncode)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, exe, "compare", str(sweep), "--B", str(B)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return float(out[0]), float(out[1])


def read_only(sweep: Path, n: int) -> None:
    """The read phase alone (``--read-only``): one row of wall, CPU and peak RSS."""
    from rag_ablate.compare.run import load_source

    ph = Phases()
    with ph.phase("read records"):
        src = load_source(sweep)
    records = sum(len(v.records) for v in src.variants)
    del src
    _, sec, peak, cpu = ph.rows[0]
    size_mb = sum(p.stat().st_size for p in sweep.glob(f"*/{RECORDS_FILE}")) / 2**20
    print(
        f"| {n:,} queries: {records:,} records, {size_mb:,.0f} MB | {sec:.2f} | {cpu:.2f} | {peak:,.0f} "
        f"| {_workers_peak():,.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated query counts")
    ap.add_argument("--B", type=int, default=10_000, help="bootstrap resamples and sign-flip budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/rag_ablate_bench_compare", help="where the sweeps are written")
    ap.add_argument("--reuse", action="store_true", help="reuse a sweep folder already generated")
    ap.add_argument("--cli", action="store_true", help="also time `rag-ablate compare` in a subprocess")
    ap.add_argument(
        "--generate-only", action="store_true", help="write the sweep folders and stop (no comparison)"
    )
    ap.add_argument(
        "--read-only", action="store_true", help="time the read phase alone (with --reuse: no grouping)"
    )
    ap.add_argument(
        "--code",
        action="append",
        help="a checkout whose rag_ablate runs the phases (repeat it: each in turn, one table side by side)",
    )
    ap.add_argument("--json", help=argparse.SUPPRESS)  # one run's phases, for --code
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.code:
        print(f"- command: python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}")
        print(f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs")
        side_by_side(args, sizes)
        return
    print(
        f"- machine: {platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    )
    print(f"- command: python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:])}")
    print(f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[int, dict[str, Any]] = {}
    if args.read_only:
        print(
            "\n| read records (3 jobs) | wall (s) | CPU (s), workers' included | peak RSS (MB) "
            "| workers' peak RSS (MB) |\n|---|---:|---:|---:|---:|"
        )
    for n in sizes:
        sweep = Path(args.out) / f"n{n}"
        if args.read_only and args.reuse and (sweep / "2" / RECORDS_FILE).is_file():
            read_only(sweep, n)
            continue
        t = time.perf_counter()
        queries, grouping = build_dataset(n, args.seed)
        if not (args.reuse and (sweep / "2" / RECORDS_FILE).is_file()):
            write_sweep(sweep, queries, args.seed)
        gen = time.perf_counter() - t - grouping["seconds"]
        size_mb = sum(p.stat().st_size for p in sweep.glob(f"*/{RECORDS_FILE}")) / 2**20
        del queries
        if args.read_only:
            read_only(sweep, n)
            continue
        if args.generate_only:
            print(f"- {sweep}: records {size_mb:,.0f} MB over 3 jobs, generated in {gen:.0f} s")
            continue
        ph, c = run_phases(sweep, args.B, args.seed)
        n_dev = next(p.n_queries for p in c.pairs if p.split == "dev")
        print(
            f"\n### {n:,} queries: {int(grouping['groups']):,} groups, dev {n_dev:,}; records {size_mb:,.0f} MB "
            f"over 3 jobs (generated in {gen:.0f} s); {len(c.rows)} rows, {len(c.mix)} mix rows, "
            f"{len(c.slices.rows) if c.slices else 0} slice rows\n"
        )
        print("| phase | wall (s) | CPU (s) | peak RSS (MB) |\n|---|---:|---:|---:|")
        print(
            f"| grouping + splits of the query texts (dataset loading) | {grouping['seconds']:.2f} "
            f"| {grouping['cpu']:.2f} | - |"
        )
        for name, sec, peak, cpu in ph.rows:
            print(f"| {name} | {sec:.2f} | {cpu:.2f} | {peak:,.0f} |")
            if name.startswith("statistics"):
                for inner, (s, calls, _) in ph.inner.items():
                    print(f"| &nbsp;&nbsp;of which {inner} ({int(calls)} calls) | {s:.2f} | | |")
        total, cpu_total = sum(r[1] for r in ph.rows), sum(r[3] for r in ph.rows)
        peak = max(r[2] for r in ph.rows)
        print(f"| **comparison step, total** | **{total:.2f}** | **{cpu_total:.2f}** | **{peak:,.0f}** |")
        if workers := _workers_peak():
            print(
                f"\nCPU includes the record reader's worker processes (a core but one, each reading a run of "
                f"the records files); their largest peak RSS: {workers:,.0f} MB, on top of this process's"
            )
        files = ("comparison.json", "comparison.md", "report.html")
        print("\nfiles: " + ", ".join(f"{f} {(sweep / f).stat().st_size / 2**20:,.2f} MB" for f in files))
        res: dict[str, Any] = {
            "grouping (wall, CPU)": (grouping["seconds"], grouping["cpu"]),
            **{f"{r[0]} (wall, peak)": (r[1], r[2]) for r in ph.rows},
            "total (wall, CPU)": (total, cpu_total),
        }
        if args.json:
            phases = {r[0]: [r[1], r[2], r[3]] for r in ph.rows}
            Path(args.json).write_text(json.dumps({"phases": phases, "inner": ph.inner}))
        if args.cli:
            wall, rss = _cli(sweep, args.B)
            print(
                f"| `rag-ablate compare {sweep}` (subprocess, imports included) | {wall:.2f} | | {rss:,.0f} |"
            )
            res["rag-ablate compare (wall, peak)"] = (wall, rss)
        results[n] = res
    done = [n for n in sizes if n in results]
    for a, b in itertools.pairwise(done):
        print(
            f"\n### growth {a:,} -> {b:,} queries ({b / a:g}x)\n\n| phase | ratio | ratio |\n|---|---:|---:|"
        )
        for key, va in results[a].items():
            vb = results[b][key]
            print(f"| {key} | {vb[0] / max(va[0], 1e-9):.1f}x | {vb[1] / max(va[1], 1e-9):.1f}x |")


if __name__ == "__main__":
    main()
