"""``report.html``: one self-contained page that answers "which variant is better, and what does it cost".

Written into the sweep folder at the end of every sweep and by ``rag-ablate
compare`` / ``rag-ablate report``, and logged to the sweep's parent run. It
needs nothing but a browser: CSS inline, images inlined as base64 PNGs, no
script, no network. Sections:

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
descriptions render, plus the variants' records (intents, recall curves, query texts). It writes
files and logs nothing (the sweep's driver logs them). ``rag-ablate report SWEEP_DIR`` rebuilds it
from ``comparison.json`` read back into the same type.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rag_ablate.compare import tradeoff
from rag_ablate.compare.model import Comparison, Row, SliceRow, Tradeoff, VariantData
from rag_ablate.compare.render import STAGES_HOW, no_op_text, ok_only_line, ok_only_rows, share_text
from rag_ablate.core.fsio import make_dirs, write_text_atomic
from rag_ablate.core.layout import FAILURES_FILE, PLAN_FILE
from rag_ablate.metrics.intent import intent_report
from rag_ablate.metrics.registry import display_name
from rag_ablate.report import plots as report_plots

REPORT_HTML = "report.html"
RECALL_PLOT = "recall_at_k.png"
TOP_FLIPS = 10  # flipped queries shown per variant, split and direction

#: CJK-capable font stack: Chinese queries and intent names render on Linux, macOS and Windows
FONT_STACK = (
    'system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "Noto Sans CJK SC", '
    '"Source Han Sans SC", "WenQuanYi Zen Hei", "PingFang SC", "Hiragino Sans GB", '
    '"Microsoft YaHei", "Helvetica Neue", Arial, sans-serif'
)

_CSS = """
body { font-family: %(fonts)s; margin: 0; color: #1d2733; background: #f6f7f9; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 1.6em; margin: 0 0 4px; } h2 { border-bottom: 2px solid #e3e7ec; padding-bottom: 4px;
  margin-top: 36px; } h3 { margin: 22px 0 8px; font-size: 1.08em; }
nav a { margin-right: 14px; font-size: 0.92em; } .muted { color: #66717e; font-size: 0.9em; }
table { border-collapse: collapse; margin: 8px 0 14px; font-size: 0.88em; }
th, td { border: 1px solid #dde2e8; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f5; position: sticky; top: 0; } td.num { text-align: right; white-space: nowrap;
  font-variant-numeric: tabular-nums; }
tr.better td.eff { background: #dcf3e3; } tr.worse td.eff { background: #fbe0de; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 0.8em; margin-left: 4px; }
.b-better { background: #2a9d8f; color: #fff; } .b-worse { background: #d62828; color: #fff; }
.b-warn { background: #f4a261; color: #1d2733; } .b-base { background: #264653; color: #fff; }
.warn { background: #fff4e5; border-left: 4px solid #f4a261; padding: 8px 12px; margin: 10px 0; }
.ok { background: #eaf6ef; border-left: 4px solid #2a9d8f; padding: 8px 12px; margin: 10px 0; }
img { max-width: 100%%; height: auto; border: 1px solid #e3e7ec; }
.flips td.q { max-width: 560px; } code { background: #eef1f5; padding: 0 3px; border-radius: 3px; }
"""


@dataclass
class Report:
    """What :func:`write_report` produced."""

    html: Path
    paths: list[Path]  # every file written (report.html and the PNGs)


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _num(v: Any, unit: str = "") -> str:
    return tradeoff.fmt(None if v is None else float(v), unit)


def _signed(v: Any) -> str:
    if v is None or not math.isfinite(float(v)):
        return "-"
    x = float(v)
    return f"{x:+.1f}" if abs(x) >= 100 else f"{x:+.3f}"


def _p(v: Any) -> str:
    if v is None or math.isnan(float(v)):
        return "-"
    return "<0.001" if float(v) < 0.001 else f"{float(v):.3f}"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", raw: bool = False) -> str:
    """An HTML table; cells are escaped unless ``raw`` (then the caller escaped them)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if raw else _e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# --------------------------------------------------------------------------- labels


def variant_titles(plan: Mapping[str, Any] | None, baseline: str) -> dict[str, str]:
    """Display names saying what each variant is: the baseline gets its levels, ``baseline (chunk=512)``."""
    if not plan or baseline != "baseline":
        return {}
    levels = [f"{f['key']}={f['default']}" for f in plan.get("factors", []) if f.get("default") is not None]
    return {baseline: f"baseline ({', '.join(levels)})"} if levels else {}


# --------------------------------------------------------------------------- sections


def _plan_section(plan: Mapping[str, Any] | None) -> str:
    if not plan:
        return '<p class="muted">No plan.json here (a comparison of an MLflow run): the variants below.</p>'
    out = [f"<p>Mode <b>{_e(plan.get('mode', '?'))}</b>"]
    common = plan.get("common") or []
    if common:
        out.append(f"; every job also runs with <code>{_e(' '.join(common))}</code>")
    out.append(".</p>")
    factors = plan.get("factors") or []
    if factors:
        rows = [
            [_e(f["key"]), _e(f.get("default", "")), ", ".join(_e(x) for x in f.get("levels", []))]
            for f in factors
        ]
        out.append(_table(["factor", "baseline level", "levels"], rows, raw=True))
    jobs = plan.get("jobs") or []
    if jobs:
        rows = []
        for j in jobs:
            change = f"{j['factor']}={j['level']}" if j.get("factor") else "-"
            rows.append([str(j.get("index", "")), str(j.get("label", "")), str(j.get("role", "")), change])
        out.append(_table(["job", "variant", "role", "what it changes"], rows))
    return "".join(out)


def _systems(variants: Sequence[VariantData]) -> set[str]:
    """The systems under test (``system.name`` of each job's config; ``local`` when unset)."""
    return {str(((v.config or {}).get("system") or {}).get("name", "local")) for v in variants}


def _flagged(c: Comparison) -> dict[str, str]:
    """variant -> ``confounded`` / ``unchecked``, from the confounding guard's findings."""
    out = {v: "unchecked" for v in c.unchecked}
    out.update({v: "confounded" for v in c.confounded})
    return out


def _no_op_section(c: Comparison) -> str:
    if not c.no_op:
        return ""
    items = "".join(f"<li><b>no-op</b>: {_e(no_op_text(v))}</li>" for v in c.no_op)
    return f'<div class="warn">Variants that changed nothing:<ul>{items}</ul></div>'


def _guard_section(c: Comparison) -> str:
    confounded, unchecked = c.confounded, c.unchecked
    if not confounded and not unchecked:
        return _no_op_section(c) + (
            '<div class="ok">Confounding check: every variant differs from the baseline only in what '
            "its label says.</div>"
        )
    items = [
        f"<li><b>{_e(v)}</b> is <b>confounded</b>: it also changes {_e(', '.join(diff))}</li>"
        for v, diff in confounded.items()
    ]
    items += [f"<li><b>{_e(v)}</b> is <b>unchecked</b>: {_e(why)}</li>" for v, why in unchecked.items()]
    return _no_op_section(c) + (
        '<div class="warn">Confounding check: its effects cannot be attributed to its label alone.'
        f"<ul>{''.join(items)}</ul></div>"
    )


def _comparison_section(c: Comparison, titles: Mapping[str, str]) -> str:
    out = []
    for split in c.splits:
        rows: list[Row] = [r for r in c.rows if r.split == split]
        sizes = {(r.n_queries, r.n_groups) for r in rows if r.tested}
        size = ", ".join(f"{n} queries in {g} groups" for n, g in sorted(sizes)[-1:])
        adj = "Holm" if split == "holdout" else "Benjamini-Hochberg"
        left = sum(p.n_left_out for p in c.pairs if p.split == split)
        out.append(f'<h3 id="cmp-{_e(split)}">{_e(split)}</h3>')
        out.append(
            f'<p class="muted">{_e(size)}; p adjusted by {adj}; significant at alpha '
            f"{_e(c.alpha)}; queries left out of pairs (failed or missing): {left}</p>"
        )
        body = []
        for r in rows:
            v = r.variant
            badges = ""
            if v in c.confounded:
                badges += '<span class="badge b-warn">confounded</span>'
            if v in c.unchecked:
                badges += '<span class="badge b-warn">unchecked</span>'
            if v in c.no_op:
                badges += '<span class="badge b-warn">no-op</span>'
            verdict = r.verdict
            sig = f'<span class="badge b-{verdict}">{verdict}</span>' if verdict else _e(r.label)
            if not r.tested:
                effect = f"<i>{_e(r.note)}</i>"
                means = "-"
            else:
                effect = f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]"
                means = f"{_num(r.baseline_mean)} &rarr; {_num(r.variant_mean)}"
            body.append(
                f'<tr class="{_e(verdict)}"><td>{_e(titles.get(v, v))}{badges}</td>'
                f"<td>{_e(display_name(r.metric))}</td><td class=num>{means}</td>"
                f'<td class="num eff">{effect}</td><td class=num>{_p(r.p_value)}</td>'
                f"<td class=num>{_p(r.p_adjusted)}</td><td>{sig}</td>"
                f"<td>{_e(r.flag)}</td></tr>"
            )
        head = "".join(
            f"<th>{h}</th>"
            for h in (
                "variant",
                "metric",
                f"{_e(c.baseline)} &rarr; variant",
                "effect [95% CI]",
                "p",
                "p adjusted",
                "verdict",
                "flag",
            )
        )
        out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    ok_only = ok_only_rows(c)
    if ok_only:  # the quality rows are failure-aware; the ok-only figures beside them
        out.append(
            '<p class="muted">Quality metrics are failure-aware (a query that failed on one side scores a '
            "miss there); where a query failed, the ok-only figures over the queries ok on both sides:</p>"
            "<ul>" + "".join(f"<li>{_e(ok_only_line(r))}</li>" for r in ok_only) + "</ul>"
        )
    if c.notes:
        out.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in c.notes) + "</ul>")
    if c.latency_note:
        out.append(f"<h3>How latency was measured</h3><p>{_e(c.latency_note)}</p>")
    return "".join(out)


def _stages_section(c: Comparison, titles: Mapping[str, str]) -> str:
    """Which stage lost the queries per variant and split, then the stage shares' rows, laid out as
    the comparison's own rows."""
    if c.stages is None:
        return '<p class="muted">No failure stages: no record was diagnosed.</p>'
    sec = c.stages
    items = "".join(
        f"<li>{_e(x.split)}, {_e(titles.get(x.variant, x.variant))}: {_e(share_text(x))}</li>"
        for x in sec.shares
    )
    out = f'<p class="muted">docs/metrics.md, "Stage diagnosis".</p><ul>{items}</ul>'
    if sec.rows:
        shares = replace(c, rows=sec.rows, metrics=sec.metrics, notes=sec.notes, latency_method="")
        out += f'<p class="muted">How each stage\'s share moved: {_e(STAGES_HOW)}.</p>'
        out += _comparison_section(shares, titles).replace('id="cmp-', 'id="stages-')  # ids stay unique
    return out


def _gate_section(c: Comparison) -> str:
    """Each gate rule's verdict per variant: the evidence it read and what the rule means."""
    blocked = sum(1 for g in c.gate if not g.passed)
    rows = [
        [
            f'<span class="badge b-{"worse" if not g.passed else "better"}">{g.verdict}</span>',
            _e(g.variant),
            f"<code>{_e(g.rule)}</code>",
            f"{_signed(g.effect)} [{_signed(g.ci_low)}, {_signed(g.ci_high)}]",
            f"{_p(g.p_adjusted)} ({_e(g.adjustment or '-')})",
            _e(g.reason),
            _e(g.meaning),
        ]
        for g in c.gate
    ]
    outcome = "BLOCKED" if blocked else "passed"
    head = f'<p class="muted">{outcome}: {blocked} of {len(c.gate)} verdicts block</p>'
    headers = ["verdict", "variant", "rule", "effect [CI]", "p adjusted", "why", "the rule means"]
    return head + _table(headers, rows, raw=True)


def _slice_rows(rows: Sequence[SliceRow], titles: Mapping[str, str]) -> str:
    body = []
    for r in rows:
        verdict = r.verdict
        cls = {"hurts": "worse", "helps": "better"}.get(verdict, "")
        badge = f'<span class="badge b-{cls}">{_e(verdict)}</span>' if cls else _e(r.label or verdict)
        if not math.isfinite(r.ci_low):
            effect = _signed(r.effect)
        else:
            effect = f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]"
        body.append(
            f'<tr class="{cls}"><td>{_e(titles.get(r.variant, r.variant))}</td>'
            f"<td>{_e(r.split)}</td>"
            f"<td>{_e(r.name)}</td><td>{_e(display_name(r.metric))}</td>"
            f"<td class=num>{r.n_queries} ({r.n_groups})</td>"
            f"<td class=num>{r.n_failed_baseline} / {r.n_failed_variant}</td>"
            f"<td class=num>{_num(r.baseline_mean)} &rarr; {_num(r.variant_mean)}</td>"
            f'<td class="num eff">{effect}</td><td class=num>{_p(r.p_adjusted)}</td>'
            f"<td>{badge}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "variant",
            "split",
            "slice",
            "metric",
            "queries (groups)",
            "failed base / var",
            "baseline &rarr; variant",
            "effect [95% CI]",
            "p adjusted (BH)",
            "verdict",
        )
    )
    return f'<table class="slices"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _slices_section(c: Comparison, titles: Mapping[str, str]) -> str:
    """Where each variant hurts (and helps): the comparison's per-slice section."""
    sec = c.slices
    if sec is None:
        return '<p class="muted">No per-slice comparison in comparison.json (rerun the comparison).</p>'
    rows = sec.rows
    metrics = ", ".join(display_name(m) for m in sec.metrics)
    out = [
        f"<p>Each slice (the queries sharing a tag, a parent intent or a leaf intent; slices overlap) is "
        f"compared on its own on <b>{_e(metrics)}</b>, with the same paired, group-aware test as the whole "
        f"comparison; p is adjusted by Benjamini-Hochberg across the slices of each split and variant. "
        f"<b>Exploratory</b>: a slice verdict is a lead to look at, not a decision. Slices with fewer than "
        f"{_e(sec.min_groups)} paired groups are too small to test. Every slice: comparison.md.</p>"
    ]
    out += [f'<p class="muted">{_e(n)}</p>' for n in sec.notes]
    hurts = [r for r in rows if r.verdict == "hurts"]
    if hurts:
        out.append(_slice_rows(hurts, titles))
    elif rows:
        out.append('<div class="ok">No slice where a variant is significantly worse than the baseline.</div>')
    else:
        out.append('<p class="muted">No slices: the records carry no tags and no gold intents.</p>')
    helps = [r for r in rows if r.verdict == "helps"]
    if helps:
        out.append("<h3>Where it helps</h3>")
        out.append(_slice_rows(helps, titles))
    counts = []
    for v in c.variants:
        for split in c.splits:
            mine = [r for r in rows if r.variant == v and r.split == split]
            if mine:
                kinds = ("hurts", "helps", "no evidence", "too small")
                by = {k: sum(1 for r in mine if r.verdict == k) for k in kinds}
                text = ", ".join(f"{n} {k}" for k, n in by.items() if n)
                counts.append(f"<li>{_e(titles.get(v, v))}, {_e(split)}: {_e(text)}</li>")
    if counts:
        out.append(f'<ul class="muted">{"".join(counts)}</ul>')
    return "".join(out)


def _tradeoff_section(
    t: Tradeoff,
    plot: Path | None,
    titles: Mapping[str, str],
    flagged: Mapping[str, str],
    systems: set[str],
) -> str:
    q, c = display_name(t.quality_metric), tradeoff.cost_display(t.cost_metric)
    level = round(100 * (1 - t.alpha))
    out = [
        f"<p>Quality <b>{_e(q)}</b> (mean per query) against cost <b>{_e(c)}</b> "
        f"(<code>{_e(t.cost_metric)}</code>), each with a {level}% group-bootstrap interval "
        f"(B={t.B}). The <b>Pareto frontier</b> holds the variants no other variant beats on both "
        "(at least as good on both, strictly better on one). Choose the axes with "
        "<code>compare.quality_metric</code> and <code>compare.cost_metric</code>, the bar with "
        "<code>compare.quality_bar</code>.</p>"
    ]
    if t.cost_metric.endswith("_ms") and "local" in systems:
        out.append(
            '<p class="muted">Latency of the local system is measured in-process, per query, with warm '
            "caches (indexes built and loaded before the first query; no network, no model server).</p>"
        )
    if plot is not None and plot.is_file():
        out.append(_img(plot, f"{t.plot_split}: {q} against {c}"))
    for st in t.splits:
        headers, rows = tradeoff.table_rows(t, st)
        cells = []
        for p, r in zip(st.points, rows, strict=True):
            name = _e(titles.get(p.variant, p.variant))
            if p.baseline and not name.startswith("baseline"):
                name += '<span class="badge b-base">baseline</span>'
            if p.variant in flagged:
                name += f'<span class="badge b-warn">{_e(flagged[p.variant])}</span>'
            cells.append([name, *(_e(x) for x in r[1:])])
        out.append(f"<h3>{_e(st.split)} ({st.n_groups} groups)</h3>")
        out.append(_table(headers, cells, raw=True))
        if t.quality_bar is not None:
            cls = "ok" if st.choice else "warn"
            out.append(f'<div class="{cls}">{_e(tradeoff.choice_sentence(t, st))}</div>')
    for n in t.notes:
        out.append(f'<p class="muted">{_e(n)}</p>')
    return "".join(out)


def intent_accuracy(
    variants: Sequence[VariantData],
) -> tuple[list[str], dict[str, dict[str, tuple[int, float]]]]:
    """Per leaf intent, per variant: (queries, accuracy) over routed queries that did not fail.

    The same cases the job's ``intents.json`` counts. Intents come worst first
    (lowest mean accuracy over the variants, then by name).
    """
    table: dict[str, dict[str, tuple[int, float]]] = {}
    for v in variants:
        cases = [
            (r.get("intent_gold_l1"), str(r["intent_gold"]), r.get("intent_pred"))
            for r in v.records
            if r.get("intent_gold") is not None and r.get("status", "ok") == "ok"
        ]
        if not cases or all(r.get("intent_pred") is None for r in v.records):
            continue
        rep = intent_report(cases, top_confusions=0)
        for row in rep.per_l2:
            table.setdefault(row.name, {})[v.label] = (row.n, row.accuracy)
    order = sorted(table, key=lambda k: (sum(a for _, a in table[k].values()) / len(table[k]), k))
    return order, table


def _heat(acc: float) -> str:
    hue = round(120 * max(0.0, min(1.0, acc)))
    return f"background: hsl({hue}, 70%, 85%)"


def _intent_section(variants: Sequence[VariantData], titles: Mapping[str, str]) -> str:
    order, table = intent_accuracy(variants)
    if not order:
        return '<p class="muted">No routed queries: the systems predict no intents.</p>'
    labels = [v.label for v in variants if any(v.label in table[k] for k in order)]
    head = "<th>intent</th><th>queries</th>" + "".join(f"<th>{_e(titles.get(v, v))}</th>" for v in labels)
    body = []
    for k in order:
        n = max(n for n, _ in table[k].values())
        cells = "".join(
            f'<td class=num style="{_heat(table[k][v][1])}">{table[k][v][1]:.3f}</td>'
            if v in table[k]
            else "<td>-</td>"
            for v in labels
        )
        body.append(f"<tr><td>{_e(k)}</td><td class=num>{n}</td>{cells}</tr>")
    return (
        '<p class="muted">Top-1 accuracy of the predicted leaf intent, all splits, queries that did not '
        "fail; worst intents first.</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


_RECALL_RE = re.compile(r"^recall_at_(\d+)$")


def recall_curves(
    variants: Sequence[VariantData], splits: Sequence[str]
) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """split -> variant -> [(k, mean recall@k)] over the queries with a value, k ascending."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for split in splits:
        for v in variants:
            sums: dict[int, list[float]] = {}
            for r in v.records:
                if r.get("split") != split or r.get("status", "ok") != "ok":
                    continue
                for name, x in (r.get("metrics") or {}).items():
                    m = _RECALL_RE.match(name)
                    if m and x is not None:
                        sums.setdefault(int(m.group(1)), []).append(float(x))
            if sums:
                out.setdefault(split, {})[v.label] = [
                    (k, sum(xs) / len(xs)) for k, xs in sorted(sums.items())
                ]
    return out


def plot_recall(
    curves: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
    path: Path,
    titles: Mapping[str, str],
    baseline: str,
) -> Path | None:
    """``recall_at_k.png``: one panel per split, k on x, recall on y, one line per variant."""
    if not curves:
        return None
    plt = report_plots.pyplot()
    splits = list(curves)
    fig, axes = plt.subplots(1, len(splits), figsize=(5.2 * len(splits), 3.8), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits, strict=True):
        for label, pts in curves[split].items():
            ks = [k for k, _ in pts]
            ys = [y for _, y in pts]
            base = label == baseline
            ax.plot(
                ks,
                ys,
                marker="*" if base else "o",
                lw=2.4 if base else 1.4,
                ms=9 if base else 5,
                color="#d62828" if base else None,
                label=titles.get(label, label),
            )
        ks_all = sorted({k for pts in curves[split].values() for k, _ in pts})
        ax.set_xticks(ks_all)
        ax.set_xlabel("k (retrieved documents)")
        ax.set_title(f"{split}: recall@k")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("recall@k (mean per query)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    make_dirs(path.parent)
    report_plots.save_figure(fig, path)
    return path


def _flips_section(c: Comparison, metric: str, titles: Mapping[str, str]) -> str:
    flips = c.flips
    if not any(metric in by_m for by_m in flips.values()):
        metric = next((m for m in c.metrics if any(m in b for b in flips.values())), metric)
    out = [
        f"<p>Queries whose <b>{_e(display_name(metric))}</b> changed between the baseline and a variant, "
        f"largest changes first, at most {TOP_FLIPS} per direction (all of them: comparison.json).</p>"
    ]
    found = False
    for variant, by_metric in flips.items():
        by_split = by_metric.get(metric) or {}
        for split in c.splits:
            d = by_split.get(split)
            if not d:
                continue
            for direction in ("regressed", "improved"):
                fl = sorted(d.get(direction, []), key=lambda f: (-abs(f.variant - f.baseline), f.query_id))
                if not fl:
                    continue
                found = True
                # records stored without text (privacy.store_text=false): the query ids only
                texts = any(f.query for f in fl)
                rows = [
                    [
                        _e(f.query_id),
                        *([_e(f.query or "")] if texts else []),
                        _num(f.baseline),
                        _num(f.variant),
                    ]
                    for f in fl[:TOP_FLIPS]
                ]
                more = f" (top {TOP_FLIPS} of {len(fl)})" if len(fl) > TOP_FLIPS else ""
                out.append(
                    f"<h3>{_e(titles.get(variant, variant))}: {_e(split)}, {len(fl)} {direction}{more}</h3>"
                )
                head = ["query id", *(["query"] if texts else []), "baseline", "variant"]
                out.append(_table(head, rows, cls="flips", raw=True))
    if not found:
        out.append('<p class="muted">No query flipped.</p>')
    return "".join(out)


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
    names = ", ".join(titles.get(v.label, v.label) for v in variants)
    trade = (
        _tradeoff_section(c.tradeoff, tradeoff_png, titles, _flagged(c), _systems(variants))
        if c.tradeoff is not None
        else '<p class="muted">No trade-off in this comparison (rerun <code>rag-ablate report</code>).</p>'
    )
    quality = c.tradeoff.quality_metric if c.tradeoff is not None else (c.metrics[0] if c.metrics else "")
    sections = [
        ("plan", "Plan", _plan_section(plan)),
        ("tradeoff", "Quality against cost", trade),
        ("comparison", "Comparison with the baseline", _guard_section(c) + _comparison_section(c, titles)),
        *([("gate", "Regression gate", _gate_section(c))] if c.gate else []),
        ("hurts", "Where it hurts", _slices_section(c, titles)),
        ("stages", "Failure stages", _stages_section(c, titles)),
        ("intents", "Per-intent accuracy", _intent_section(variants, titles)),
        (
            "recall",
            "Recall@k",
            _img(recall_png, "recall@k per variant")
            if recall_png is not None
            else '<p class="muted">No recall@k values.</p>',
        ),
        ("flips", "Flipped queries", _flips_section(c, quality, titles)),
    ]
    nav = "".join(f'<a href="#{sid}">{_e(h)}</a>' for sid, h, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{_e(h)}</h2>{content}</section>' for sid, h, content in sections)
    splits = ", ".join(c.splits)
    return (
        '<!DOCTYPE html>\n<html lang="zh-CN"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS % {'fonts': FONT_STACK}}</style></head><body><main>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="muted">Variants: {_e(names)}. Baseline: {_e(titles.get(c.baseline, c.baseline))}. '
        f"Splits: {_e(splits)}. Bootstrap B={_e(c.B)}, seed {_e(c.seed)}.</p>"
        f"{_failures_box(failures)}<nav>{nav}</nav>{body}</main></body></html>\n"
    )


def _failures_box(failures: Sequence[str]) -> str:
    """What failed in the sweep, one line each (nothing when nothing failed)."""
    if not failures:
        return ""
    items = "".join(f"<li>{_e(line)}</li>" for line in failures)
    return (
        f'<div class="warn" id="failures"><b>This sweep FAILED: {len(failures)} problem(s).</b> '
        f"Its numbers below cover what finished; a job over its error budget is compared as it "
        f"is.<ul>{items}</ul></div>"
    )


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
    rec = plot_recall(recall_curves(variants, c.splits), out_dir / RECALL_PLOT, titles, c.baseline)
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
