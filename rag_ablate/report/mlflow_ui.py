"""What the MLflow UI shows without setup: headline metrics, run descriptions, a deep link.

* **Headline metrics** (``headline/...``): a handful of numbers per variant run, so
  the runs table and charts start with what matters: the headline quality metric
  on dev and holdout (the first of ``metrics.summary``, recall@5 by default), its
  effect against the baseline, p95 latency, context tokens, money when known.
* **Fewer keys**: a run logs per split (dev, holdout) only the metrics the end
  table and the comparison use, plus counts; the full cutoff grid and the
  ``all/`` split stay in the run's ``metrics.json`` artifact (and ``summary.json``).
* **Descriptions** (the ``mlflow.note.content`` tag, shown as the run's
  description): the sweep run holds the verdict table, each variant run one line
  against the baseline.
* **Deep link**: an experiment tag ``mlflow.sharedViewState.<key>`` holds a view
  of the runs table (this sweep's variants, ranked by the headline metric, with
  the headline columns shown); ``#/experiments/<id>/runs?viewStateShareKey=<key>``
  opens it. Without ``/runs`` MLflow 3 opens its GenAI overview instead. The
  view also filters the charts tab to the headline charts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rag_ablate.metrics.registry import display_name
from rag_ablate.tracking.ui import HEADLINE, HEADLINE_DIGITS, LATENCY_NOTE, P95, SPLITS

if TYPE_CHECKING:
    from rag_ablate.compare.model import Comparison, Row


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
    """The sweep run's description: the verdict table in markdown."""
    q = display_name(quality)
    lines = [
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


def child_description(c: Comparison, variant: str, quality: str) -> str:
    """One line: a variant's verdict against the baseline on holdout (quality and p95 latency), then
    the slices where it hurts."""
    q = display_name(quality)
    rq = c.row("holdout", variant, quality)
    rp = c.row("holdout", variant, P95)
    line = (
        f"vs {md(c.baseline)} on holdout: {q} {effect_text(rq)}; p95 latency ms {effect_text(rp)} "
        f"(`*` significant after Holm; latency {LATENCY_NOTE})."
    )
    hurts = hurts_text(c, variant)
    return f"{line} Hurts on slices: {hurts} ({SLICES_NOTE})." if hurts else line


# --------------------------------------------------------------------------- deep link


def summary_table(
    c: Comparison | None, summaries: Sequence[Mapping[str, Any]], quality: str
) -> dict[str, list[Any]]:
    """The verdict as columns for ``mlflow.log_table`` (one row per variant; missing = None)."""

    def fin(x: Any) -> float | None:
        return float(x) if isinstance(x, int | float) and math.isfinite(x) else None

    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "variant",
            "role",
            f"dev_{quality}",
            f"holdout_{quality}",
            f"delta_holdout_{quality}",
            "ci_low",
            "ci_high",
            "significant",
            "dev_p95_ms",
            "holdout_p95_ms",
            "delta_holdout_p95_ms",
            "context_tokens",
            "usd_per_1k",
        )
    }
    for s in summaries:
        label = str(s["label"])
        m = s.get("metrics") or {}
        is_base = c is not None and label == c.baseline
        r = None if c is None or is_base else c.row("holdout", label, quality)
        rp = None if c is None or is_base else c.row("holdout", label, P95)
        cols["variant"].append(label)
        cols["role"].append("baseline" if is_base else "variant")
        cols[f"dev_{quality}"].append(fin(m.get(f"dev/{quality}")))
        cols[f"holdout_{quality}"].append(fin(m.get(f"holdout/{quality}")))
        cols[f"delta_holdout_{quality}"].append(fin(r.effect) if r else None)
        cols["ci_low"].append(fin(r.ci_low) if r else None)
        cols["ci_high"].append(fin(r.ci_high) if r else None)
        cols["significant"].append(bool(r.significant) if r else None)
        cols["dev_p95_ms"].append(fin(m.get(f"dev/cost/{P95}")))
        cols["holdout_p95_ms"].append(fin(m.get(f"holdout/cost/{P95}")))
        cols["delta_holdout_p95_ms"].append(fin(rp.effect) if rp else None)
        cols["context_tokens"].append(fin(m.get("cost/context_tokens")))
        cols["usd_per_1k"].append(fin(m.get("cost/usd_per_1k")))
    return cols
