"""Terminal output: the per-variant table at the end of a run or sweep."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rag_ablate.core.fmt import format_table
from rag_ablate.dataset.model import SPLITS
from rag_ablate.metrics.registry import display_name, measured_summary_metrics
from rag_ablate.metrics.stages import STAGES, stage_metric
from rag_ablate.tracking import resident
from rag_ablate.tracking import ui as tracking_ui


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _leak_column(summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """``acl_leak_rate_at_<largest k>`` when a variant measured access-control leaks and the
    columns do not show a leak rate already: a leak is never hidden by good recall."""
    if any(c.startswith("acl_leak_rate_at_") for c in columns):
        return []
    ks = [
        int(k)
        for s in summaries
        for key in s["metrics"]
        if key.startswith("all/acl_leak_rate_at_") and (k := key.rpartition("_")[2]).isdigit()
    ]
    return [f"acl_leak_rate_at_{max(ks)}"] if ks else []


def _measured_columns(summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """The registry's ``summary_if_measured`` metrics that some variant measured and the columns
    do not show already (the answer metrics, when a variant answers)."""
    return [
        c
        for c in measured_summary_metrics()
        if c not in columns and any(f"{split}/{c}" in s["metrics"] for s in summaries for split in SPLITS)
    ]


def summary_rows(
    summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """One row per variant; each metric cell reads ``dev / holdout``.

    The registry's ``summary_if_measured`` metrics a variant measured follow the columns (the
    answer metrics). When the runs measured access-control leaks, the share of queries with a
    leak in the whole list (``acl_leak_rate@<largest k>``) follows. Then the end-to-end time per query
    (p50 / p95 ms, all splits), the time to first token (a column only when a variant
    streams answers) and the failed queries with their count per status (``2 (timeout 1, http_error 1)``).
    """
    streams = any("all/ttft_ms_p50" in s["metrics"] for s in summaries)
    columns = [*columns, *_measured_columns(summaries, columns)]
    leak = _leak_column(summaries, columns)
    headers = ["variant", *(display_name(c) for c in columns), *(display_name(c) for c in leak)]
    headers += ["ms p50 / p95"]
    headers += ["ttft ms p50 / p95"] if streams else []
    headers += ["failed"]
    rows = []
    for s in summaries:
        m = s["metrics"]
        row = [str(s["label"])]
        row += [f"{_fmt(m.get(f'dev/{c}'))} / {_fmt(m.get(f'holdout/{c}'))}" for c in (*columns, *leak)]
        p95 = m.get("cost/latency_p95_ms", m.get("all/latency_ms_p95"))
        row += [f"{_fmt(m.get('all/latency_ms_p50'))} / {_fmt(p95)}"]
        if streams:
            row += [f"{_fmt(m.get('all/ttft_ms_p50'))} / {_fmt(m.get('all/ttft_ms_p95'))}"]
        by_status = [
            f"{k.removeprefix('all/n_status_')} {int(v)}"
            for k, v in sorted(m.items())
            if k.startswith("all/n_status_") and v
        ]
        failed = str(int(m.get("all/n_failed", 0)))
        row += [f"{failed} ({', '.join(by_status)})" if by_status else failed]
        rows.append(row)
    return headers, rows


def print_table(summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    headers, rows = summary_rows(summaries, columns)
    print()
    print(format_table(headers, rows))
    print("(metric cells: dev / holdout)")
    for line in stage_lines(summaries):
        print(line)
    for line in repeat_lines(summaries, columns[:1]):
        print(line)
    if any(s["metrics"].get("all/n_failed") for s in summaries):
        print(
            "(metric cells are failure-aware: a failed query counts as a miss; metrics.json has "
            "<split>/ok/<metric>, the mean over the queries that succeeded)"
        )


def stage_lines(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each variant's failure stages (docs/metrics.md "Stage diagnosis"): the queries per stage,
    ``dev / holdout``, the stages with any query; empty when no variant diagnosed a query."""
    lines = []
    for s in summaries:
        m = s["metrics"]
        counts = {st: [m.get(f"{split}/n_{stage_metric(st)}", 0.0) for split in SPLITS] for st in STAGES}
        shown = [f"{stage} {' / '.join(str(int(n)) for n in ns)}" for stage, ns in counts.items() if any(ns)]
        if shown:
            lines.append(f"  {s['label']}: {', '.join(shown)}")
    if not lines:
        return []
    return ["failure stages, queries per stage (dev / holdout; failed queries are not diagnosed):", *lines]


def repeat_lines(summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[str]:
    """Each repeated variant's runs per query, flaky queries and, for each of ``columns``, the
    within-query share of variance (``dev / holdout``; rag_ablate.records.repeats); empty when no
    variant repeated its queries (``system.repeats`` = 1)."""
    lines = []
    for s in summaries:
        m = s["metrics"]
        if "run/repeats" not in m:
            continue
        parts = [f"{int(m['run/repeats'])} runs per query"]
        parts.append(
            "flaky queries " + " / ".join(str(int(m.get(f"{sp}/repeats/flaky_queries", 0))) for sp in SPLITS)
        )
        parts += [
            f"within-query share of {display_name(c)}'s variance "
            + " / ".join(_fmt(m.get(f"{sp}/repeats/{c}/within_share")) for sp in SPLITS)
            for c in columns
        ]
        lines.append(f"  {s['label']}: {', '.join(parts)}")
    if not lines:
        return []
    return [
        "repeated runs (system.repeats; dev / holdout; each job's repeats.json has every query's spread):",
        *lines,
    ]


def markdown_table(summaries: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    headers, rows = summary_rows(summaries, columns)
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def ui_hint(uri: str, link: str | None = None, port: int = 5000) -> str:
    """Where to look next: the command that opens the MLflow UI on this store on ``port``
    (``tracking.ui_port``; ``--port`` when it is not 5000), for a sweep the link to its variants
    ranked, with their verdicts, and, when this command started the resident MLflow writer, that
    it did (a process that stays after the command)."""
    if not uri.startswith("sqlite:"):
        hint = f"MLflow: {uri}"
    else:
        default = f"sqlite:///{(Path.cwd() / 'outputs' / 'mlflow.db').resolve()}"
        cmd = "rag-ablate ui" if uri == default else f"rag-ablate ui --uri {shlex.quote(uri)}"
        cmd += f" --port {port}" if port != 5000 else ""
        hint = f"MLflow UI: {cmd}   (serves {tracking_ui.ui_base('', port)})"
    if link:
        hint += f"\nthis sweep's variants, ranked, with their verdicts and cost per split: {link}"
    idle = resident.started_here()
    if idle is not None:  # the process left running is said once, by the command that started it
        hint += (
            "\na resident MLflow writer now keeps MLflow imported for the next runs; it ends after "
            f"{idle:g} s without one (rag-ablate writer status, rag-ablate writer stop)"
        )
    return hint
