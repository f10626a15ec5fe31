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

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rag_ablate.metrics import display_name

if TYPE_CHECKING:
    from rag_ablate.compare.model import Comparison, Row

HEADLINE = "headline/"
NOTE_TAG = "mlflow.note.content"  # the run description the MLflow UI shows and edits
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # experiment tags the UI reads for ?viewStateShareKey=
VIEW_KEY_TAG = "rag_ablate.ui_view"  # on a sweep run: the share key of its view
PARENT_TAG = "mlflow.parentRunId"
P95 = "latency_p95_ms"
SPLITS = ("dev", "holdout")
COUNTS = ("n_queries", "n_failed", "error_rate", "n_answerable", "n_unanswerable", "n_no_rag")
COLUMN_WIDTH = 180  # pixels per headline column in the saved runs view
HEADLINE_DIGITS = 4  # headline values are rounded for reading; exact ones are under dev/, holdout/, cost/
LATENCY_NOTE = "measured per query end to end; for the local system in-process with warm caches"


def quality_metric(summary_columns: Sequence[str]) -> str:
    """The headline quality metric: the first column of the end table (``metrics.summary``)."""
    return summary_columns[0] if summary_columns else "recall_at_5"


def headline_metrics(metrics: Mapping[str, float], quality: str) -> dict[str, float]:
    """A variant's headline numbers from its full metrics (absent ones stay absent)."""
    pick = {
        f"dev_{quality}": f"dev/{quality}",
        f"holdout_{quality}": f"holdout/{quality}",
        "cost_p95_ms": f"cost/{P95}",
        "context_tokens": "cost/context_tokens",
        "usd_per_1k": "cost/usd_per_1k",
        "error_rate": "all/error_rate",
    }
    return {
        HEADLINE + name: round(float(metrics[src]), HEADLINE_DIGITS)
        for name, src in pick.items()
        if src in metrics
    }


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


def mlflow_metrics(metrics: Mapping[str, float], keep: Iterable[str]) -> dict[str, float]:
    """The metrics a variant run logs: per split only ``keep`` (and counts), no ``all/`` split
    (its error rate is ``headline/error_rate``), everything under ``cost/``, ``run/``, ``headline/``,
    ``privacy/`` (what redaction replaced) and ``judge/`` (the LLM judge's run metrics,
    rag_ablate.judging); ``<split>/prod/`` and
    ``<split>/edge/`` (rag_ablate.weights) of the ``keep`` metrics."""
    names = {*keep, *COUNTS}
    out = {}
    for key, v in metrics.items():
        prefix, _, rest = key.partition("/")
        if prefix in ("cost", "run", "headline", "judge", "privacy") or (
            # error rates per failure status and of the judge, first-token percentiles are kept too
            prefix in SPLITS
            and (
                rest in names
                or rest.startswith(("cost/", "error_rate_", "n_status_", "ttft_ms_", "judge_error_"))
                # the production mix: weighted means and edge cases' means of the same metrics
                or (rest.startswith(("prod/", "edge/")) and rest.partition("/")[2] in names)
            )
        ):
            out[key] = v
    return out


def baseline_run_name(factors: Sequence[Mapping[str, Any]]) -> str:
    """``baseline (chunk=512)``: the baseline's value of every factor the sweep varies
    (runtime settings such as ``cache.dir`` are not what the system is: left out)."""
    from rag_ablate.config import RUNTIME_KEYS

    def runtime(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in RUNTIME_KEYS)

    parts = [f"{f['key']}={f['default']}" for f in factors if f.get("key") and not runtime(str(f["key"]))]
    return f"baseline ({', '.join(parts)})" if parts else "baseline"


# --------------------------------------------------------------------------- descriptions


def _num(x: float | None, digits: int = 3) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"


def effect_text(r: Row | None) -> str:
    """``+0.031 [+0.010, +0.052] better*`` (``*``: significant after adjustment), ``n.s.``, or ``-``."""
    if r is None:
        return "-"
    if not r.tested:
        return f"untested ({r.note})"
    ci = f"[{_signed(r.ci_low)}, {_signed(r.ci_high)}]"
    verdict = f"{r.verdict}*" if r.significant else "n.s."
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
        f"**Verdict against {baseline_name}** — quality: {q} (higher is better); "
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
            name,
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
        "Benjamini-Hochberg (dev); n.s. = not significant. Details: comparison.md among this run's "
        "artifacts.",
    ]
    if c is not None and c.slices is not None:
        hurting = [(v, hurts_text(c, v)) for v in c.variants]
        named = [f"{v}: {h}" for v, h in hurting if h and h != "none"]
        lines.append(
            f"Slices where a variant hurts ({SLICES_NOTE}): " + ("; ".join(named) if named else "none")
        )
    if c is not None and c.confounded:
        lines.append("Confounded (change more than their label says): " + ", ".join(sorted(c.confounded)))
    if failed:
        lines.append("Failed: " + "; ".join(failed))
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
    text = ", ".join(f"{r.name} ({r.split} {display_name(r.metric)} {_signed(r.effect)})" for r in shown)
    return text + (f", and {len(hurts) - top} more" if len(hurts) > top else "")


SLICES_NOTE = "exploratory: tested within each slice, Benjamini-Hochberg across slices; see comparison.md"


def child_description(c: Comparison, variant: str, quality: str) -> str:
    """One line: a variant's verdict against the baseline on holdout (quality and p95 latency), then
    the slices where it hurts."""
    q = display_name(quality)
    rq = c.row("holdout", variant, quality)
    rp = c.row("holdout", variant, P95)
    line = (
        f"vs {c.baseline} on holdout: {q} {effect_text(rq)}; p95 latency ms {effect_text(rp)} "
        f"(`*` significant after Holm; latency {LATENCY_NOTE})."
    )
    hurts = hurts_text(c, variant)
    return f"{line} Hurts on slices: {hurts} ({SLICES_NOTE})." if hurts else line


BASELINE_DESCRIPTION = "The baseline: every other variant of this sweep is compared with this run."


# --------------------------------------------------------------------------- deep link


def view_state(parent_run_id: str, quality: str) -> dict[str, Any]:
    """The runs-table view of one sweep: its variant runs, best headline quality first."""
    order = f"metrics.`{HEADLINE}holdout_{quality}`"
    columns = [
        f"metrics.`{HEADLINE}{name}`"
        for name in (
            f"holdout_{quality}",
            f"delta_holdout_{quality}",
            f"dev_{quality}",
            "cost_p95_ms",
            "context_tokens",
            "usd_per_1k",
        )
    ]
    return {
        "searchFilter": f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        "orderByKey": order,
        "orderByAsc": False,
        "selectedColumns": columns,
        # in this order, right after the run name, wide enough to read the metric names
        "columnOrder": ["attributes.`Run Name`", *columns],
        "columnWidths": dict.fromkeys(columns, COLUMN_WIDTH),
        # the charts view (its tab, or &compareRunsMode=CHART) shows the headline charts; clear to see all
        "chartsSearchFilter": HEADLINE,
    }


def view_key(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode("utf-8")).hexdigest()


def ui_base(uri: str, port: int = 5000) -> str:
    """Where the UI of a store is served: the server itself, or ``rag-ablate ui`` on 127.0.0.1."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return f"http://127.0.0.1:{port}"


def runs_link(base: str, experiment_id: str, key: str | None) -> str:
    """The runs view of an experiment, with a saved view when ``key`` is given."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{url}?viewStateShareKey={key}" if key else url


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
