"""The comparison step as one sequence, shared by the sweep's end and ``rag-ablate compare``.

load the variants -> compare -> per-slice effects -> failure stages -> pairwise judge (judge.mode=pairwise) ->
confounding guard -> quality against cost -> write comparison.json/.md (and tradeoff.json/.md) ->
regression gate -> print the table.

It returns what it computed and wrote; it logs nothing. The caller logs to MLflow in one place
(:func:`rag_ablate.sweep.publish.publish_comparison`).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rag_ablate.compare import tradeoff
from rag_ablate.compare.analysis import plan_compare
from rag_ablate.compare.columns import Columns
from rag_ablate.compare.draws import SharedDraws
from rag_ablate.compare.gate import evaluate, result_line
from rag_ablate.compare.guard import check, no_ops
from rag_ablate.compare.load import (
    check_same_data,
    load_mlflow_parent,
    load_pinned,
    load_sweep_dir,
    pick_baseline,
)
from rag_ablate.compare.model import FLIPS_KEPT, Comparison, VariantData
from rag_ablate.compare.pairwise import pairwise_section
from rag_ablate.compare.ppi import ppi_section
from rag_ablate.compare.render import format_terminal, write_outputs
from rag_ablate.compare.repeats import repeat_means
from rag_ablate.compare.slices import plan_slices, resolve_metrics
from rag_ablate.compare.stages import stage_section
from rag_ablate.compare.timing import apply_timing
from rag_ablate.config.schema import CompareConfig
from rag_ablate.core.errors import EXIT_BLOCKED, ComparisonError
from rag_ablate.core.layout import COMPARISON_JSON, SWEEP_FILE, TIMING_FILE
from rag_ablate.records.jsonl import gc_paused
from rag_ablate.run.timing import TimedCall, read_timing


@dataclass
class Source:
    """Where the variants came from and where the comparison goes."""

    variants: list[VariantData]
    out_dir: Path
    tracking_uri: str | None = None
    parent_run_id: str | None = None
    baseline_run: str | None = None  # the earlier run the sweep was compared with (compare.baseline_run)
    timing: list[TimedCall] = field(default_factory=list)  # the sweep's interleaved timing pass, if any


@dataclass
class ComparisonRun:
    comparison: Comparison
    source: Source
    paths: list[Path]  # comparison.json, comparison.md, tradeoff.json, tradeoff.md
    failures: list[str]  # one line per blocked gate rule and variant; empty: passed


def load_source(source: str | Path, tracking_uri: str | None = None, out_dir: Path | None = None) -> Source:
    """A sweep folder (its ``sweep.json`` names the MLflow parent run), or an MLflow parent run id."""
    path = Path(source)
    if path.is_dir():
        info_path = path / SWEEP_FILE
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        timing = path / TIMING_FILE
        return Source(
            load_sweep_dir(path),
            out_dir or path,
            tracking_uri or info.get("tracking_uri"),
            info.get("parent_run_id"),
            baseline_run=info.get("baseline_run"),
            timing=read_timing(timing) if timing.is_file() else [],
        )
    from rag_ablate.tracking import store as tracking

    uri = tracking_uri or tracking.default_uri(Path.cwd() / "outputs")
    run_id = str(source)
    variants = load_mlflow_parent(uri, run_id)
    found = tracking.download(uri, run_id, [TIMING_FILE], Path(tempfile.mkdtemp(prefix="rag_ablate_cmp_")))
    return Source(
        variants,
        out_dir or Path.cwd() / "outputs" / "comparisons" / run_id,
        uri,
        run_id,
        timing=read_timing(found[TIMING_FILE]) if TIMING_FILE in found else [],
    )


def pin_baseline(src: Source, ref: str) -> Source:
    """``src`` with an earlier run as its baseline (:func:`~rag_ablate.compare.load.load_pinned`: a run
    or job folder, a sweep folder's baseline, an MLflow run id), first: every variant of ``src``, its
    own baseline included, is then compared with it. Refused (ComparisonError, one line) when a
    variant ran on another corpus or query set (:func:`~rag_ablate.compare.load.check_same_data`)."""
    from rag_ablate.tracking import store as tracking

    uri = src.tracking_uri or tracking.default_uri(Path.cwd() / "outputs")
    pinned = load_pinned(ref, uri)
    check_same_data(pinned, src.variants)
    return replace(src, variants=[pinned, *src.variants], baseline_run=ref)


def load_comparison(out_dir: Path) -> Comparison:
    """The comparison a sweep folder (or a comparison's out folder) holds, read back from
    ``comparison.json`` into the type the comparison step computed."""
    path = out_dir / COMPARISON_JSON
    if not path.is_file():
        raise ComparisonError(f"no {COMPARISON_JSON} in {out_dir}: run `rag-ablate compare {out_dir}` first")
    try:
        return Comparison.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise ComparisonError(f"{path}: not a comparison this version can read ({exc})") from exc


def _default_seed(variants: Sequence[VariantData]) -> int:
    for v in variants:
        if v.config is not None and isinstance(v.config.get("seed"), int):
            return int(v.config["seed"])
    return 0


def statistics(variants: Sequence[VariantData], settings: CompareConfig, *, seed: int) -> Comparison:
    """The comparison of ``variants`` with its slices (``Comparison.slices``) and its trade-off
    (``Comparison.tradeoff``, the quality and cost axes set), every test a domain of its split's one
    bootstrap draw: each draw is streamed once, chunk by chunk, to the tests of all three, and one
    product per chunk serves them (:mod:`rag_ablate.compare.draws`). Each list of flips keeps its
    largest changes (:meth:`Comparison.cap_flips`'s cut, made before the flips are built); every
    query's values stay in the records. The three planners read the records as columns, each read
    once (:mod:`rag_ablate.compare.columns`), let go before the draws run."""
    draws = SharedDraws(settings.B)
    columns = Columns()
    # planning makes millions of small containers at 1,000,000 queries: with the collector on, its
    # collections took 13 of the 37 s of plan_compare there (10,000 of them); reference counting
    # frees what planning drops
    with gc_paused():
        finish = plan_compare(
            variants,
            baseline=settings.baseline,
            metrics=settings.metrics,
            splits=settings.splits,
            seed=seed,
            alpha=settings.alpha,
            flip_threshold=settings.flip_threshold,
            keep_flips=FLIPS_KEPT,
            draws=draws,
            columns=columns,
        )
        base, _ = pick_baseline(variants, settings.baseline)
        splits = list(settings.splits)
        finish_slices = plan_slices(
            variants,
            baseline=base.label,
            compared=[v.label for v in variants if v is not base],
            splits=splits,
            metrics=resolve_metrics(variants, settings, columns),
            min_groups=settings.min_slice_groups,
            seed=seed,
            alpha=settings.alpha,
            draws=draws,
            columns=columns,
        )
        axes = tradeoff.settle_axes(variants, settings, splits, columns)
        finish_tradeoff = tradeoff.plan(
            variants, axes, seed=seed, baseline=base.label, draws=draws, columns=columns
        )
        columns.release()
    draws.run()
    c = finish()
    c.slices = finish_slices()
    c.quality_metric, c.cost_metric = axes.quality_metric, axes.cost_metric
    c.tradeoff = finish_tradeoff()
    return c


def run_comparison(
    source: str | Path | Source,
    settings: CompareConfig,
    *,
    seed: int | None = None,
    guard: bool = True,
    echo: Callable[[str], None] = print,
) -> ComparisonRun:
    """Run the whole comparison step; see the module docstring.

    ``source``: a sweep folder, an MLflow parent run id, or a loaded :class:`Source`.
    ``seed``: default the sweep's own ``seed``. ``guard``: run the confounding
    guard. The gate's messages are returned, not printed (see :func:`gate_report`).
    """
    src = source if isinstance(source, Source) else load_source(source)
    # a pinned baseline: compare.baseline_run (--baseline-run), else the one the sweep was compared with
    pinned = settings.baseline_run or (None if settings.baseline else src.baseline_run)
    if pinned:
        src = pin_baseline(src, pinned)
        settings = replace(settings, baseline=src.variants[0].label)
    if len(src.variants) < 2:
        only = src.variants[0].label if src.variants else "none"
        raise ComparisonError(
            f"{source}: only one finished variant ({only}); a comparison needs the baseline and at least "
            "one variant (a sweep: python -m rag_ablate -m <factor>=<levels>)"
        )
    findings = {}
    if guard:  # queries are paired by id: runs over another query set cannot be compared at all
        findings = check(src.variants, pick_baseline(src.variants, settings.baseline)[0].label)
        bad = {label: d for label, f in findings.items() for d in f.dataset if d.startswith("query set")}
        if bad:
            listed = "; ".join(f"{label}: {d}" for label, d in bad.items())
            raise ComparisonError(
                f"{source}: variants ran over another query set than the baseline ({listed}); their "
                "queries cannot be paired. Rerun them on the baseline's dataset (--no-guard compares anyway)"
            )
    # system.repeats > 1: one record per query, the mean over its repeats (the nested resampling)
    means, repeated = repeat_means(src.variants)
    src = replace(src, variants=means)
    run_seed = _default_seed(src.variants) if seed is None else seed
    latency_method = apply_timing(src.variants, src.timing)  # the interleaved times, when measured
    # the comparison, where it helps and hurts (the same test within each slice: exploratory, BH across
    # slices) and each variant's quality against its cost (the sweep's quality and cost axes too)
    c = statistics(src.variants, settings, seed=run_seed)
    c.latency_method = latency_method
    c.repeats = repeated
    # which stage lost the queries, and how each stage's share moved (the same paired group test)
    c.stages = stage_section(src.variants, c)
    # judge.mode=pairwise (in the baseline's config): the judge compares each variant's answers with
    # the baseline's, both orders; a pairwise step that cannot run leaves a note, not a failed comparison
    c.pairwise = pairwise_section(src.variants, c)
    # judged metrics corrected by the dataset's human_judgements of these answers (prediction-powered)
    c.ppi = ppi_section(src.variants, c)
    c.no_op = [label for label in no_ops(src.variants, c.baseline) if label in c.variants]
    if guard:
        c.confounded = {label: f.differences for label, f in findings.items() if f.confounded}
        c.unchecked = {label: f.unchecked for label, f in findings.items() if f.unchecked}
    c.gate = evaluate(c, settings.fail_on)  # each rule's verdict per variant, in every view
    paths = write_outputs(c, src.out_dir)
    failures = [result_line(g) for g in c.gate if not g.passed]
    echo(format_terminal(c))
    return ComparisonRun(c, src, paths, failures)


def print_gate_outcome(failures: Sequence[str], n_rules: int) -> None:
    """The gate's outcome after everything else: what blocked (stderr), or that it passed."""
    if failures:
        print("\nregression gate BLOCKED:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
    elif n_rules:
        print(f"regression gate passed ({n_rules} rule(s))")


def gate_report(run: ComparisonRun, n_rules: int) -> int:
    """Print the gate's outcome; :data:`~rag_ablate.compare.gate.EXIT_BLOCKED` when it blocked, else 0."""
    print_gate_outcome(run.failures, n_rules)
    return EXIT_BLOCKED if run.failures else 0
