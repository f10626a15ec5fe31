"""``report.html``: one self-contained page that answers "which variant is better, and what does it cost".

Written into the sweep folder at the end of every sweep and by ``rag-ablate
compare`` / ``rag-ablate report``, and logged to the sweep's parent run. It
needs nothing but a browser: CSS inline, images inlined as base64 PNGs, no
script, no network. It opens on the verdict: per split, each variant against
the baseline on the sweep's quality axis (better / worse / no evidence, the
effect with its interval and adjusted p, the minimum detectable effect when
there is no evidence), its cost on the sweep's cost axis and the other metrics
whose change is significant (:mod:`rag_ablate.compare.headline`). Then the details:

1. the plan: factors and levels, and each job's change (``plan.json``);
2. quality against cost: the plot (``quality_vs_cost.png``), the trade-off
   table per split with the Pareto frontier and the iso-quality choice
   (``tradeoff.json``, see :mod:`rag_ablate.compare.tradeoff`);
3. the comparison against the baseline for dev and holdout, with intervals,
   adjusted p and significance; confounded and unchecked
   variants flagged (here and in the trade-off table);
4. where each variant hurts (and helps): slices by tag and intent with their own
   effects, exploratory (:mod:`rag_ablate.compare.slices`);
5. per-intent accuracy per variant, worst intents first;
6. recall@k curves per variant (``recall_at_k.png``);
7. the queries that flipped most, with their text.

The page renders the typed :class:`~rag_ablate.compare.model.Comparison` that the comparison step
computed (trade-off included), the same object the terminal, ``comparison.md`` and the MLflow
descriptions render, plus the variants' records (intents, recall curves, query texts). The markup is
Jinja2 templates (``rag_ablate/report/templates/``, autoescaped: every value is escaped where it is
printed); this module gathers what they print. It writes files and logs nothing (the sweep's driver
logs them). ``rag-ablate report SWEEP_DIR`` rebuilds it from ``comparison.json`` read back into the
same type.
"""

from __future__ import annotations

import base64
import functools
import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jinja2

from rag_ablate.compare import headline, ppi, tradeoff
from rag_ablate.compare.model import FLIPS_KEPT, Comparison, FlakyQuery, Flip, VariantData, flip_order
from rag_ablate.compare.render import (
    REPEATS_HOW,
    STAGES_HOW,
    no_op_text,
    ok_only_line,
    ok_only_rows,
    share_text,
    verdicts_text,
)
from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.core.layout import FAILURES_FILE, PLAN_FILE
from rag_ablate.metrics.intent import intent_top1
from rag_ablate.metrics.registry import display_name
from rag_ablate.report import plots as report_plots

REPORT_HTML = "report.html"
RECALL_PLOT = "recall_at_k.png"
TOP_FLIPS = 10  # flipped queries shown per variant, split and direction
PAGE_TEMPLATE = "report.html.j2"

#: the page's sections after the verdict, in order: (id, heading, template in templates/sections/,
#: the Comparison's field that must be set for the section to show; "": always shown)
SECTIONS = (
    ("plan", "Plan", "plan.html.j2", ""),
    ("tradeoff", "Quality against cost", "tradeoff.html.j2", ""),
    ("comparison", "Comparison with the baseline", "comparison.html.j2", ""),
    ("gate", "Regression gate", "gate.html.j2", "gate"),
    ("hurts", "Where it hurts", "hurts.html.j2", ""),
    ("stages", "Failure stages", "stages.html.j2", ""),
    ("ppi", "Judge corrected by human labels", "ppi.html.j2", "ppi"),
    ("repeats", "Flaky queries", "repeats.html.j2", "repeats"),
    ("intents", "Per-intent accuracy", "intents.html.j2", ""),
    ("recall", "Recall@k", "recall.html.j2", ""),
    ("flips", "Flipped queries", "flips.html.j2", ""),
)


@dataclass
class Report:
    """What :func:`write_report` produced."""

    html: Path
    paths: list[Path]  # every file written (report.html and the PNGs)


# --------------------------------------------------------------------------- numbers as printed


def number(v: Any, unit: str = "") -> str:
    return tradeoff.fmt(None if v is None else float(v), unit)


def signed(v: Any) -> str:
    if v is None or not math.isfinite(float(v)):
        return "-"
    x = float(v)
    return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"


def p_value(v: Any) -> str:
    if v is None or math.isnan(float(v)):
        return "-"
    return "<0.001" if float(v) < 0.001 else f"{float(v):.3f}"


def interval(effect: Any, low: Any, high: Any) -> str:
    """``-0.028 [-0.059, +0.005]``; the effect alone when the interval is not finite."""
    if low is None or not math.isfinite(float(low)):
        return signed(effect)
    return f"{signed(effect)} [{signed(low)}, {signed(high)}]"


def effect_size(v: float) -> str:
    """An effect's size as the comparison's labels print it: ``0.045``, ``1.3``, ``250.0``."""
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.2g}"


def finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def png_data(path: Path | None) -> str:
    """A PNG's bytes as base64 for a ``data:`` URL; empty when there is no file."""
    if path is None or not path.is_file():
        return ""
    return base64.b64encode(path.read_bytes()).decode("ascii")


@functools.cache
def environment() -> jinja2.Environment:
    """The templates of ``rag_ablate/report/templates``, autoescaped, with the number filters."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("rag_ablate.report", "templates"),
        autoescape=True,  # every value printed is escaped, .j2 templates included
        undefined=jinja2.StrictUndefined,  # a name the context lacks fails, not prints nothing
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        num=number,
        signed=signed,
        p=p_value,
        size=effect_size,
        metric=display_name,
        cost=tradeoff.cost_display,
    )
    env.tests.update(finite_number=finite_number)
    env.globals.update(interval=interval, split_heads=_split_heads)
    return env


# --------------------------------------------------------------------------- labels


def variant_titles(plan: Mapping[str, Any] | None, baseline: str) -> dict[str, str]:
    """Display names saying what each variant is: the baseline gets its levels, ``baseline (chunk=512)``."""
    if not plan or baseline != "baseline":
        return {}
    levels = [f"{f['key']}={f['default']}" for f in plan.get("factors", []) if f.get("default") is not None]
    return {baseline: f"baseline ({', '.join(levels)})"} if levels else {}


# --------------------------------------------------------------------------- records


def intent_accuracy(
    variants: Sequence[VariantData],
) -> tuple[list[str], dict[str, dict[str, tuple[int, float]]]]:
    """Per leaf intent, per variant: (queries, accuracy) over routed queries that did not fail.

    The same cases the job's ``intents.json`` counts (a query is right when its predicted leaf is
    the gold one, :func:`~rag_ablate.metrics.intent.intent_top1`), counted once per distinct (gold,
    predicted) pair. Intents come worst first (lowest mean accuracy over the variants, then by name).
    """
    table: dict[str, dict[str, tuple[int, float]]] = {}
    for v in variants:
        pairs = Counter(
            (str(r["intent_gold"]), r.get("intent_pred"))
            for r in v.records
            if r.get("intent_gold") is not None and r.get("status", "ok") == "ok"
        )
        if not pairs or all(r.get("intent_pred") is None for r in v.records):
            continue
        n: Counter[str] = Counter()
        right: Counter[str] = Counter()
        for (gold, predicted), count in pairs.items():
            n[gold] += count
            right[gold] += count * int(intent_top1(gold, predicted))
        for gold, count in n.items():
            table.setdefault(gold, {})[v.label] = (count, right[gold] / count)
    order = sorted(table, key=lambda k: (sum(a for _, a in table[k].values()) / len(table[k]), k))
    return order, table


_RECALL_RE = re.compile(r"^recall_at_(\d+)$")


def recall_curves(
    variants: Sequence[VariantData], splits: Sequence[str]
) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """split -> variant -> [(k, mean recall@k)] over the queries with a value, k ascending.

    One pass over the records; a record's metric names are matched against recall@k only when it
    has one not seen before (records repeat the same names)."""
    seen: dict[str, None] = {}  # every metric name matched so far
    recall: list[tuple[str, int]] = []  # of those, the recall@k names and their k
    by_variant: dict[str, dict[str, dict[int, list[float]]]] = {}  # variant -> split -> k -> values
    for v in variants:
        per_split: dict[str, dict[int, list[float]]] = {s: {} for s in splits}
        for r in v.records:
            sums = per_split.get(r.get("split", ""))
            if sums is None or r.get("status", "ok") != "ok":
                continue
            metrics = r.get("metrics") or {}
            if not metrics.keys() <= seen.keys():
                for name in metrics:
                    if name not in seen:
                        seen[name] = None
                        m = _RECALL_RE.match(name)
                        if m:
                            recall.append((name, int(m.group(1))))
            for name, k in recall:
                x = metrics.get(name)
                if x is not None:
                    sums.setdefault(k, []).append(float(x))
        by_variant[v.label] = per_split
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for split in splits:
        for v in variants:
            sums = by_variant[v.label][split]
            if sums:
                means = [(k, sum(xs) / len(xs)) for k, xs in sorted(sums.items())]
                out.setdefault(split, {})[v.label] = means
    return out


# --------------------------------------------------------------------------- what the sections print


def _systems(variants: Sequence[VariantData]) -> set[str]:
    """The systems under test (``system.name`` of each job's config; ``local`` when unset)."""
    return {str(((v.config or {}).get("system") or {}).get("name", "local")) for v in variants}


def _flagged(c: Comparison) -> dict[str, str]:
    """variant -> ``confounded`` / ``unchecked``, from the confounding guard's findings."""
    out = {v: "unchecked" for v in c.unchecked}
    out.update({v: "confounded" for v in c.confounded})
    return out


def _split_heads(c: Comparison) -> dict[str, dict[str, Any]]:
    """Per split, the line above its comparison table: its size, the adjustment, queries left out."""
    out = {}
    for split in c.splits:
        rows = [r for r in c.rows if r.split == split]
        sizes = sorted({(r.n_queries, r.n_groups) for r in rows if r.tested})
        out[split] = {
            "size": ", ".join(f"{n} queries in {g} groups" for n, g in sizes[-1:]),
            "adjustment": "Holm" if split == "holdout" else "Benjamini-Hochberg",
            "left": sum(p.n_left_out for p in c.pairs if p.split == split),
        }
    return out


def _tradeoff_tables(c: Comparison) -> list[dict[str, Any]]:
    """Per split of the trade-off: its heading, the table (:func:`tradeoff.table_rows`) beside its
    points, and the iso-quality sentence."""
    t = c.tradeoff
    if t is None:
        return []
    out = []
    for st in t.splits:
        headers, rows = tradeoff.table_rows(t, st)
        out.append(
            {
                "split": st,
                "headers": headers,
                "rows": list(zip(st.points, [r[1:] for r in rows], strict=True)),
                "choice": tradeoff.choice_sentence(t, st) if t.quality_bar is not None else "",
            }
        )
    return out


def _slice_counts(c: Comparison, titles: Mapping[str, str]) -> list[str]:
    """``chunk=256, dev: 17 no evidence, 1 too small`` per variant and split with slices."""
    if c.slices is None:
        return []
    out = []
    for v in c.variants:
        for split in c.splits:
            mine = [r for r in c.slices.rows if r.variant == v and r.split == split]
            if mine:
                kinds = ("hurts", "helps", "no evidence", "too small")
                by = {k: sum(1 for r in mine if r.verdict == k) for k in kinds}
                text = ", ".join(f"{n} {k}" for k, n in by.items() if n)
                out.append(f"{titles.get(v, v)}, {split}: {text}")
    return out


def _stage_rows(c: Comparison) -> Comparison | None:
    """The stage shares' rows as a comparison of their own, drawn as the comparison's tables."""
    if c.stages is None or not c.stages.rows:
        return None
    sec = c.stages
    return replace(c, rows=sec.rows, metrics=sec.metrics, notes=sec.notes, latency_method="")


def _heat(acc: float) -> str:
    hue = round(120 * max(0.0, min(1.0, acc)))
    return f"background: hsl({hue}, 70%, 85%)"


def _intents(variants: Sequence[VariantData]) -> dict[str, Any]:
    order, table = intent_accuracy(variants)
    labels = [v.label for v in variants if any(v.label in table[k] for k in order)]
    rows = [
        {
            "intent": k,
            "n": max(n for n, _ in table[k].values()),
            "cells": [None if v not in table[k] else (table[k][v][1], _heat(table[k][v][1])) for v in labels],
        }
        for k in order
    ]
    return {"labels": labels, "rows": rows}


def _flips(c: Comparison, metric: str, titles: Mapping[str, str]) -> dict[str, Any]:
    """The flipped queries of ``metric`` (else the first compared metric with flips), per variant,
    split and direction, largest changes first, at most :data:`TOP_FLIPS` each."""
    flips = c.flips
    if not any(metric in by_m for by_m in flips.values()):
        metric = next((m for m in c.metrics if any(m in b for b in flips.values())), metric)
    groups = []
    for variant, by_metric in flips.items():
        by_split = by_metric.get(metric) or {}
        for split in c.splits:
            d = by_split.get(split) or {}
            for direction in ("regressed", "improved"):
                every: list[Flip] = d.get(direction, [])
                fl = heapq.nsmallest(TOP_FLIPS, every, key=flip_order)
                n = c.n_flips(variant, metric, split, direction)
                if fl:
                    more = f" (top {TOP_FLIPS} of {n})" if n > TOP_FLIPS else ""
                    groups.append(
                        {
                            "title": f"{titles.get(variant, variant)}: {split}, {n} {direction}{more}",
                            # records stored without text (privacy.store_text=false): the query ids only
                            "texts": any(f.query for f in every),
                            "flips": fl,
                        }
                    )
    return {"metric": metric, "groups": groups}


def _verdicts(c: Comparison) -> list[tuple[str, list[headline.Verdict]]]:
    found = headline.verdicts(c)
    return [(split, [v for v in found if v.split == split]) for split in c.splits]


# --------------------------------------------------------------------------- page


def render(
    *,
    title: str,
    variants: Sequence[VariantData],
    comparison: Comparison,
    plan: Mapping[str, Any] | None,
    tradeoff_png: Path | None,
    recall_png: Path | None,
    failures: Sequence[str] = (),
) -> str:
    """The whole page as one string (no scripts, no external resources). ``failures``: one line per
    thing of the sweep that failed (a job over its error budget, an endpoint that was down), shown
    first, above everything else."""
    c = comparison
    titles = variant_titles(plan, c.baseline)
    quality = headline.quality_axis(c)
    sections = [(sid, heading, t) for sid, heading, t, needs in SECTIONS if not needs or getattr(c, needs)]
    return (
        environment()
        .get_template(PAGE_TEMPLATE)
        .render(
            title=title,
            c=c,
            titles=titles,
            names=[titles.get(v.label, v.label) for v in variants],
            plan=plan,
            failures=list(failures),
            sections=sections,
            quality=quality,
            cost_metric=headline.cost_axis(c),
            verdicts=_verdicts(c),
            flagged=_flagged(c),
            level=round(100 * (1 - c.alpha)),
            local_latency="local" in _systems(variants),
            tradeoff_png=png_data(tradeoff_png),
            tradeoff_tables=_tradeoff_tables(c),
            ok_only=[ok_only_line(r) for r in ok_only_rows(c)],
            no_op_texts=[no_op_text(v) for v in c.no_op],
            slice_counts=_slice_counts(c, titles),
            stage_shares=[] if c.stages is None else [(x, share_text(x)) for x in c.stages.shares],
            stage_rows=_stage_rows(c),
            stages_how=STAGES_HOW,
            ppi_rows=[] if c.ppi is None else [(r, ppi.cells(r)) for r in c.ppi.rows],
            ppi_headers=ppi.HEADERS,
            ppi_explain=ppi.EXPLAIN,
            repeats_how=REPEATS_HOW,
            flaky=[(r, [(f, _verdict_cells(f)) for f in r.flaky]) for r in c.repeats],
            intents=_intents(variants),
            recall_png=png_data(recall_png),
            flips=_flips(c, quality, titles),
            top_flips=TOP_FLIPS,
            flips_kept=FLIPS_KEPT,
        )
    )


def _verdict_cells(f: FlakyQuery) -> str:
    """A flaky query's metrics and verdicts per repeat, as one cell."""
    return "; ".join(f"{display_name(m)}: {verdicts_text(v)}" for m, v in f.verdicts.items())


def _failure_lines(out_dir: Path) -> list[str]:
    """The lines of a sweep folder's ``failures.json`` (``where: error``), empty without one."""
    data = _read_json(out_dir / FAILURES_FILE) or {}
    lines = []
    for f in data.get("failures") or []:
        where = f"job #{f['job']} {f['what']}" if f.get("job") is not None else str(f.get("what", ""))
        lines.append(f"{where}: {f.get('error', '')}")
    return lines


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def write_report(
    out_dir: Path,
    comparison: Comparison,
    variants: Sequence[VariantData],
    failures: Sequence[str] | None = None,
) -> Report:
    """Write the quality-vs-cost plot, the recall curves and ``report.html`` into ``out_dir``.

    ``comparison`` is the comparison step's result (its trade-off included); ``variants`` the
    records it compared (intents, recall curves, query texts); ``failures`` what failed in the sweep,
    one line each (None: the lines of ``out_dir``'s ``failures.json``, if any). Logs nothing.
    """
    c = comparison
    plan = _read_json(out_dir / PLAN_FILE)
    titles = variant_titles(plan, c.baseline)
    paths: list[Path] = []
    png: Path | None = None
    if c.tradeoff is not None and c.tradeoff.splits:
        png = report_plots.plot(c.tradeoff, out_dir / tradeoff.PLOT_FILE, labels=titles)
        paths.append(png)
    curves = recall_curves(variants, c.splits)
    rec = report_plots.plot_recall(curves, out_dir / RECALL_PLOT, titles, c.baseline)
    if rec is not None:
        paths.append(rec)
    page = render(
        title=f"rag_ablate sweep report: {out_dir.name}",
        variants=variants,
        comparison=c,
        plan=plan,
        tradeoff_png=png,
        recall_png=rec,
        failures=_failure_lines(out_dir) if failures is None else failures,
    )
    out = out_dir / REPORT_HTML
    write_text_atomic(out, page)
    paths.append(out)
    return Report(out, paths)
