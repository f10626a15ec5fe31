"""What the MLflow UI shows without setup: headline metrics, run descriptions, a deep link.

* **Headline metrics** (``headline/...``): a handful of numbers per variant run, so
  the runs table and charts start with what matters: the headline quality metric
  on dev and holdout (the first of ``metrics.summary``, recall@5 by default), its
  effect against the baseline, p95 latency, context tokens, money when known.
* **Fewer keys**: a run logs per split (dev, holdout) only the metrics the end
  table and the comparison use, plus counts; the full cutoff grid and the
  ``all/`` split stay in the run's ``metrics.json`` artifact (and ``summary.json``).
* **Descriptions** (the ``mlflow.note.content`` tag, shown as the run's
  description): the sweep run opens on the verdict in the lines MLflow shows before
  "Show more", then the verdict table; each variant run has one line against the baseline.
* **The ranked view**: per variant and split, the quality axis's level, effect, interval
  and verdict beside the cost axis's level (tags, :func:`ranked_tags`), and the other
  significant effects by name; ``verdict.json`` holds the same per variant and split.
* **Deep link**: an experiment tag ``mlflow.sharedViewState.<key>`` holds a view
  of the runs table (this sweep's variants, best holdout quality first, with the
  ranked view's columns); ``#/experiments/<id>/runs?viewStateShareKey=<key>``
  opens it. Without ``/runs`` MLflow 3 opens its GenAI overview instead. The
  view also filters the charts tab to the headline charts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rag_ablate.compare.headline import cost_axis, quality_axis
from rag_ablate.metrics.registry import display_name, quality_axes, spec_of
from rag_ablate.tracking.ui import HEADLINE, HEADLINE_DIGITS, LATENCY_NOTE, P95, SPLITS, rank_columns

if TYPE_CHECKING:
    from rag_ablate.compare.model import Comparison, Point, Row


def axes(c: Comparison | None, quality: str) -> tuple[str, str]:
    """The sweep's quality and cost axis, chosen once (``compare.quality_metric`` / ``cost_metric``,
    kept on the ``Comparison``: :func:`rag_ablate.compare.headline.quality_axis`) and shown by every
    view; without them, ``quality`` (the end table's first metric) and p95 latency."""
    if c is not None and (c.quality_metric or c.tradeoff is not None):
        return quality_axis(c), cost_axis(c) or P95
    return quality, P95


def _point(c: Comparison, split: str, variant: str) -> Point | None:
    st = c.tradeoff.split(split) if c.tradeoff is not None else None
    return st.point(variant) if st is not None else None


def _name(metric: str) -> str:
    """A metric's display name, or a cost name as written (``usd_per_1k`` is not a registered metric)."""
    try:
        return display_name(metric)
    except Exception:
        return metric


# --------------------------------------------------------------------------- the ranked view


def quality_cell(c: Comparison, split: str, variant: str, quality: str) -> str:
    """``Δ -0.032 [-0.070, +0.010] no evidence, MDE ±0.05``: a variant's effect against the baseline
    with the verdict; the baseline's quality level (report.html's number): ``0.871 (baseline)``; a
    variant's level when the metric was not tested. (A variant's level is left out for width: with
    it the view no longer fits 1600 px, :func:`rag_ablate.tracking.ui.column_widths`.)"""
    p = _point(c, split, variant)
    level = _num(p.quality) if p is not None else "-"
    if variant == c.baseline:
        return f"{level} (baseline)"
    r = c.row(split, variant, quality)
    if r is None or not r.tested:
        return level
    return f"Δ {_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}] {_verdict(r)}"


def cost_cell(c: Comparison, split: str, variant: str) -> str:
    """``8.73 [8.10, 9.40]``: the split's cost with its bootstrap interval, the same number as
    report.html's quality-vs-cost table (a significant change of it is among the other effects)."""
    p = _point(c, split, variant)
    unit = c.tradeoff.cost_unit if c.tradeoff is not None else ""
    if p is None:
        return "-"
    return f"{_cost(p.cost, unit)} [{_cost(p.cost_low, unit)}, {_cost(p.cost_high, unit)}]"


def _cost(x: float, unit: str) -> str:
    """A cost level for a narrow cell: 3 significant digits (``22.9``, ``0.412``), whole above 1000."""
    if not math.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _verdict(r: Row) -> str:
    """A row's verdict in a table cell: ``better*``, ``no evidence, MDE ±0.05`` (the minimum
    detectable effect, as the row's label says it), or the label (``worse unadjusted, n.s. after Holm``)."""
    if r.significant:
        return f"{r.verdict}*"
    if r.label.startswith("no evidence; could detect "):
        return "no evidence, MDE " + r.label.removeprefix("no evidence; could detect ")
    return r.label or "n.s."


def other_effects(c: Comparison, variant: str, quality: str) -> str:
    """The metrics other than ``quality`` whose effect is significant after adjustment, by name:
    ``evidence_recall@5 worse (holdout, dev); acl_leak_rate@10 worse (holdout)``; ``none``. Worse
    before better, then those on more splits first, so that a cell too narrow for all of them cuts
    the improvements on one split."""
    found: dict[tuple[str, str], list[str]] = {}
    for r in c.rows:
        if r.variant == variant and r.significant and r.metric != quality:
            found.setdefault((_name(r.metric), r.verdict), []).append(r.split)
    if not found:
        return "none"
    ranked = sorted(found.items(), key=lambda kv: (kv[0][1] != "worse", -len(kv[1])))
    return "; ".join(f"{m} {v} ({', '.join(sorted(sp, reverse=True))})" for (m, v), sp in ranked)


def ranked_tags(c: Comparison, variant: str, quality: str, cost: str) -> dict[str, str]:
    """A run's cells of the ranked view (tags named by :func:`rag_ablate.tracking.ui.rank_columns`)."""
    cols = rank_columns(quality, cost)
    out = {}
    for split in SPLITS:
        out[cols[f"{split} quality"]] = quality_cell(c, split, variant, quality)
        out[cols[f"{split} cost"]] = cost_cell(c, split, variant)
    out[cols["other"]] = "(baseline)" if variant == c.baseline else other_effects(c, variant, quality)
    return out


def headline_deltas(c: Comparison, variant: str, quality: str) -> dict[str, float]:
    """``headline/delta_<split>_<quality>`` and ``headline/delta_holdout_cost_p95_ms`` of a variant."""
    out = {}
    for split in SPLITS:
        r = c.row(split, variant, quality)
        if r is not None and r.tested:
            out[f"{HEADLINE}delta_{split}_{quality}"] = round(r.effect, HEADLINE_DIGITS)
    r = c.row("holdout", variant, P95)
    if r is not None and r.tested:
        out[f"{HEADLINE}delta_holdout_cost_p95_ms"] = round(r.effect, HEADLINE_DIGITS)
    return out


def rank_metric(c: Comparison, summary: Mapping[str, Any], quality: str) -> dict[str, float]:
    """``headline/holdout_<quality>``, the ranked view's sort key, for the sweep's quality axis (the
    job logged it only for the end table's first column): the run's holdout level, else the
    trade-off's."""
    level = (summary.get("metrics") or {}).get(f"holdout/{quality}")
    p = _point(c, "holdout", str(summary["label"]))
    level = p.quality if level is None and p is not None else level
    if not isinstance(level, int | float) or not math.isfinite(level):
        return {}
    return {f"{HEADLINE}holdout_{quality}": round(float(level), HEADLINE_DIGITS)}


# --------------------------------------------------------------------------- descriptions

# Markdown's punctuation that can start a link, an image, emphasis, a code span, a heading or end a
# table cell; an underscore only at a word's edge (``multi_doc`` stays as written)
_MARKDOWN = re.compile(r"([\\`*\[\]|~#!])|(?<![^\W_])_|_(?![^\W_])")


def md(value: object) -> str:
    """``value`` as literal text in the Markdown of a run description: on one line, ``& < >`` as HTML
    entities (a dataset tag ``<img src=x onerror=...>`` or an intent ``<b>`` shows as written) and
    Markdown's punctuation backslash-escaped (no link, autolink, image, emphasis, code span or table cell
    break).
    Every value that comes from a dataset, a config or a label goes through it (or :func:`code`)."""
    text = " ".join(str(value).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("://", "&#58;//")  # a URL stays text, not an autolink
    return _MARKDOWN.sub(lambda m: "\\" + m[0], text)


def code(value: object) -> str:
    """``value`` as a Markdown code span on one line (inside one, Markdown and HTML are literal text)."""
    return "`" + " ".join(str(value).replace("`", "'").split()) + "`"


def _num(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"


def effect_text(r: Row | None) -> str:
    """``+0.031 [+0.010, +0.052] better*`` (``*``: significant after adjustment), else the row's label
    (``no evidence; could detect ±0.031``, ``worse unadjusted, n.s. after Holm``), or ``-``."""
    if r is None:
        return "-"
    if not r.tested:
        return f"untested ({md(r.note)})"
    ci = f"[{_signed(r.ci_low)}, {_signed(r.ci_high)}]"
    verdict = f"{r.verdict}*" if r.significant else md(r.label or "n.s.")
    return f"{_signed(r.effect)} {ci} {verdict}"


def sweep_description(
    c: Comparison | None,
    summaries: Sequence[Mapping[str, Any]],
    quality: str,
    baseline_name: str,
    *,
    failed: Sequence[str] = (),
) -> str:
    """The sweep run's description: first the verdict in a few lines (what MLflow shows before "Show
    more": :func:`verdict_lines`), then the verdict table in markdown."""
    q = display_name(quality)
    lines = [
        *(verdict_lines(c, quality, baseline_name) if c is not None else []),
        f"**Verdict against {md(baseline_name)}** — quality: {q} (higher is better); "
        f"cost: p95 latency in ms (lower is better; {LATENCY_NOTE}).",
        "",
        f"| variant | {q} dev | {q} holdout | Δ {q} dev [95% CI] | Δ {q} holdout [95% CI] "
        "| p95 ms dev | p95 ms holdout | Δ p95 ms holdout [95% CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        label = str(s["label"])
        m = s.get("metrics") or {}
        name = baseline_name if c is not None and label == c.baseline else label
        cells = [
            md(name),
            _num(m.get(f"dev/{quality}")),
            _num(m.get(f"holdout/{quality}")),
        ]
        if c is None or label == c.baseline:
            cells += ["(baseline)", "(baseline)"]
        else:
            cells += [
                effect_text(c.row("dev", label, quality)),
                effect_text(c.row("holdout", label, quality)),
            ]
        cells += [_num(m.get(f"dev/cost/{P95}")), _num(m.get(f"holdout/cost/{P95}"))]
        cells.append(
            "(baseline)" if c is None or label == c.baseline else effect_text(c.row("holdout", label, P95))
        )
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Effects: variant minus baseline over paired queries, 95% interval from the group sign-flip "
        "test (means) or the group bootstrap (p95); `*` = significant after Holm (holdout) or "
        "Benjamini-Hochberg (dev); otherwise what the numbers show: an interval excluding 0 that "
        "adjustment does not confirm, or no evidence and the effect the data could detect (80% power). "
        "Details: comparison.md among this run's artifacts.",
    ]
    if c is not None and c.slices is not None:
        hurting = [(v, hurts_text(c, v)) for v in c.variants]
        named = [f"{md(v)}: {h}" for v, h in hurting if h and h != "none"]
        lines.append(
            f"Slices where a variant hurts ({SLICES_NOTE}): " + ("; ".join(named) if named else "none")
        )
    if c is not None and c.stages is not None:
        moved = [
            f"{md(r.variant)} {r.split} {md(r.metric)} {_signed(r.effect)} {r.verdict}*"
            for r in c.stages.rows
            if r.significant
        ]
        lines.append(
            "Failure stages whose share moved (significant after adjustment among the stage rows; "
            f"comparison.md, Failure stages): {'; '.join(moved) if moved else 'none'}"
        )
    if c is not None and c.gate:
        blocked = [g for g in c.gate if not g.passed]
        verdicts = "; ".join(f"{g.verdict} {md(g.variant)} {code(g.rule)} ({md(g.reason)})" for g in c.gate)
        lines.append(f"Regression gate {'BLOCKED' if blocked else 'passed'}: {verdicts}")
    if c is not None and c.confounded:
        lines.append(
            "Confounded (change more than their label says): "
            + ", ".join(md(v) for v in sorted(c.confounded))
        )
    if c is not None and c.no_op:
        lines.append(
            "No-op (the same records as the baseline, timings aside): " + ", ".join(md(v) for v in c.no_op)
        )
    if failed:
        lines.append("Failed: " + "; ".join(md(f) for f in failed))
    return "\n".join(lines)


SLICES_SHOWN = 5  # slices named per variant in a run description (every slice: comparison.md)


def hurts_text(c: Comparison, variant: str, top: int = SLICES_SHOWN) -> str:
    """The slices where ``variant`` hurts, worst first: ``tag=multi_doc (holdout recall@5 -0.120)``;
    ``''`` when the comparison has no slices, ``none`` when no slice says it hurts."""
    if c.slices is None or not any(r.variant == variant for r in c.slices.rows):
        return ""
    hurts = c.slices.hurts(variant)
    if not hurts:
        return "none"
    shown = hurts[:top]
    text = ", ".join(
        f"{md(r.name)} ({r.split} {md(display_name(r.metric))} {_signed(r.effect)})" for r in shown
    )
    return text + (f", and {len(hurts) - top} more" if len(hurts) > top else "")


SLICES_NOTE = "exploratory: tested within each slice, Benjamini-Hochberg across slices; see comparison.md"


# --------------------------------------------------------------------------- the verdict in a few lines

#: what MLflow 3's run page shows of a description before "Show more" (measured in Chromium at
#: 1600x1100 with the assistant panel open: about 4 lines of 130 characters); the verdict fits in it
VISIBLE_CHARS = 480


def _level(c: Comparison, split: str, variant: str) -> str:
    """``latency p95 ms 8.73 vs 4.87``: the cost axis of a variant and of the baseline on a split."""
    p, b = _point(c, split, variant), _point(c, split, c.baseline)
    if c.tradeoff is None or p is None or b is None:
        return ""
    from rag_ablate.compare.tradeoff import cost_display

    unit = c.tradeoff.cost_unit
    return f"{cost_display(c.tradeoff.cost_metric)} {_cost(p.cost, unit)} vs {_cost(b.cost, unit)}"


def _short(r: Row) -> str:
    """``-0.026 [-0.070, +0.018]`` with ``*`` when significant after adjustment."""
    return f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]" + ("*" if r.significant else "")


def verdict_lines(c: Comparison, quality: str, baseline_name: str) -> list[str]:
    """The sweep's verdict in the lines MLflow shows before "Show more" (:data:`VISIBLE_CHARS`):
    which variants are better, worse or without evidence on the quality axis, with their intervals
    (how sure: both splits for a significant one, holdout and the minimum detectable effect
    otherwise) and the cost axis against the baseline's on holdout (at what cost); then a blank
    line. When that is too long, variants without evidence are named only, from the last."""
    head = (
        f"**Verdict** on {display_name(quality)} vs {md(baseline_name)}, 95% intervals (`*` significant "
        "after Holm on holdout, BH on dev), cost on holdout: "
    )
    groups: dict[str, list[tuple[str, str]]] = {"better": [], "worse": [], "no evidence": []}
    for v in c.variants:
        rows = {sp: c.row(sp, v, quality) for sp in SPLITS[::-1]}
        tested = {sp: r for sp, r in rows.items() if r is not None and r.tested}
        if not tested:
            continue
        verdicts = {r.verdict for r in tested.values() if r.verdict}
        group = "worse" if "worse" in verdicts else "better" if verdicts else "no evidence"
        shown = tested if verdicts else {sp: r for sp, r in tested.items() if sp == "holdout"} or tested
        parts = [f"{sp} {_short(r)}" for sp, r in shown.items()]
        held = tested.get("holdout")
        if not verdicts and held is not None and math.isfinite(held.mde):
            parts.append(f"could detect ±{held.mde:.2g}")
        parts += [cost] if (cost := _level(c, "holdout", v)) else []
        groups[group].append((md(v), f"{md(v)} ({', '.join(parts)})"))

    def said() -> str:
        return " · ".join(
            f"**{g}**: {'; '.join(text for _, text in items) if items else 'none'}"
            for g, items in groups.items()
        )

    quiet = groups["no evidence"]
    for i in range(len(quiet) - 1, -1, -1):
        if len(head) + len(said()) <= VISIBLE_CHARS:
            break
        quiet[i] = (quiet[i][0], quiet[i][0])  # the name only: its numbers are in the table below
    return [head + said(), ""]


def child_description(c: Comparison, variant: str, quality: str) -> str:
    """One line: a variant's verdict against the baseline on holdout: the quality axis, then cost
    (p95 latency, tokens, money when priced), leaks and answers when the comparison has them; then
    the slices where it hurts."""
    q = display_name(quality)
    items = [f"{q} {effect_text(c.row('holdout', variant, quality))}"]
    for name, metrics in _aspects(c, quality):
        rows = [r for m in metrics if (r := c.row("holdout", variant, m)) is not None and r.tested]
        items += [f"{name}{_name(r.metric)} {effect_text(r)}" for r in rows]
    money = _level(c, "holdout", variant) if c.tradeoff and c.tradeoff.cost_metric.startswith("usd") else ""
    items += [money] if money else []
    line = (
        f"vs {md(c.baseline)} on holdout: {'; '.join(items)} "
        f"(`*` significant after Holm; latency {LATENCY_NOTE})."
    )
    hurts = hurts_text(c, variant)
    return f"{line} Hurts on slices: {hurts} ({SLICES_NOTE})." if hurts else line


def _aspects(c: Comparison, quality: str) -> list[tuple[str, list[str]]]:
    """What a variant's line covers besides the quality axis, from the comparison's metrics: p95
    latency, tokens (cost family), leaks (security family), answers (the other quality axes)."""
    fam = {m: spec_of(m).family for m in c.metrics}
    answers = [m for m in quality_axes() if m in c.metrics and m != quality]
    return [
        ("", [m for m in c.metrics if m == P95]),
        ("", [m for m in c.metrics if fam[m] == "cost"]),
        ("leaks: ", [m for m in c.metrics if fam[m] == "security"]),
        ("also: ", answers),
    ]


# --------------------------------------------------------------------------- deep link


def summary_table(
    c: Comparison | None, summaries: Sequence[Mapping[str, Any]], quality: str, cost: str = P95
) -> dict[str, list[Any]]:
    """The ranked view as columns for ``mlflow.log_table``: one row per variant and split, the
    quality axis's level, effect, interval, verdict and minimum detectable effect beside the cost
    axis's level and interval (report.html's numbers), then the other significant effects
    (missing = None)."""

    def fin(x: Any) -> float | None:
        return float(x) if isinstance(x, int | float) and math.isfinite(x) else None

    names = ["variant", "role", "split", quality, f"delta_{quality}", "ci_low", "ci_high", "verdict"]
    names += ["mde", "p_adjusted", cost, f"{cost}_low", f"{cost}_high", "other_significant_effects"]
    cols: dict[str, list[Any]] = {k: [] for k in names}
    for s in summaries:
        label = str(s["label"])
        m = s.get("metrics") or {}
        is_base = c is not None and label == c.baseline
        for split in SPLITS:
            r = None if c is None or is_base else c.row(split, label, quality)
            r = r if r is not None and r.tested else None
            p = None if c is None else _point(c, split, label)
            level = p.quality if p is not None else m.get(f"{split}/{quality}")
            values = [label, "baseline" if is_base else "variant", split, fin(level)]
            values += [fin(r.effect), fin(r.ci_low), fin(r.ci_high), r.label] if r else [None] * 4
            values += [fin(r.mde), fin(r.p_adjusted)] if r else [None, None]
            values += [fin(p.cost), fin(p.cost_low), fin(p.cost_high)] if p else [None] * 3
            values.append(None if c is None or is_base else other_effects(c, label, quality))
            for k, v in zip(names, values, strict=True):
                cols[k].append(v)
    return cols
