"""The comparison as a terminal table, ``comparison.md`` and ``comparison.json`` (plus
``tradeoff.md`` / ``.json``): views of the one typed :class:`~rag_ablate.compare.model.Comparison`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from rag_ablate.compare import tradeoff
from rag_ablate.compare.gate import result_line
from rag_ablate.compare.mix import mix_markdown, mix_terminal
from rag_ablate.compare.model import (
    SLICE_VERDICTS,
    Comparison,
    FlakyQuery,
    Pair,
    Row,
    SliceRow,
    StageShare,
)
from rag_ablate.compare.ppi import markdown_lines as ppi_markdown_lines
from rag_ablate.compare.ppi import terminal_lines as ppi_terminal_lines
from rag_ablate.core.fsio import write_json_atomic, write_text_atomic
from rag_ablate.core.layout import COMPARISON_JSON, COMPARISON_MD
from rag_ablate.metrics.registry import display_name

WHICH_QUERIES = (
    "quality metrics are failure-aware: a query that failed on one side scores a miss there (recall 0), "
    "so a variant that fails more cannot lead; their ok-only figures, and latency, compare the queries ok "
    "on both sides (a failure's time is shown apart); error_rate every query with a record on both sides"
)


def _ms(t: float | None) -> str:
    return "-" if t is None else _num(t)


def _failed_ms(p: Pair) -> str:
    """``; failed queries' median time: baseline -, variant 45.0 ms`` ('' when none failed)."""
    if p.failed_latency_ms_baseline is None and p.failed_latency_ms_variant is None:
        return ""
    b, v = (
        "-" if t is None else f"{_num(t)} ms"
        for t in (p.failed_latency_ms_baseline, p.failed_latency_ms_variant)
    )
    return f"; failed queries' median time: baseline {b}, variant {v}"


def ok_only_rows(c: Comparison) -> list[Row]:
    """The failure-aware rows whose ok-only figures differ (some query failed on a side)."""
    return [
        r
        for r in c.rows
        if r.tested
        and math.isfinite(r.ok_effect)
        and (r.n_ok_queries != r.n_queries or r.ok_effect != r.effect)
    ]


def ok_only_line(r: Row) -> str:
    """``holdout, v, recall@5: failure-aware -0.150 over 60 queries; ok-only +0.040 (...) over 41``."""
    return (
        f"{r.split}, {r.variant}, {display_name(r.metric)}: failure-aware {_signed(r.effect)} over "
        f"{r.n_queries} queries; ok-only {_signed(r.ok_effect)} ({_num(r.ok_baseline_mean)} -> "
        f"{_num(r.ok_variant_mean)}) over the {r.n_ok_queries} ok on both sides"
    )


def _num(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _signed(v: float) -> str:
    if math.isnan(v):
        return "-"
    return f"{v:+.1f}" if abs(v) >= 100 else f"{v:+.3f}"


def _p(v: float) -> str:
    return "-" if not math.isfinite(v) else ("<0.001" if v < 0.001 else f"{v:.3f}")


def _cell(r: Row | None, groups: bool) -> list[str]:
    width = 6 if groups else 5
    if r is None:
        return ["-"] * width
    if not r.tested:
        return [r.note, *(["-"] * (width - 1))]
    mark = {"better": " +", "worse": " -"}.get(r.verdict, "")
    cells = [
        f"{_num(r.baseline_mean)} -> {_num(r.variant_mean)}",
        f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]",
        _p(r.p_value) + ("" if r.p_exact else "~"),
        _p(r.p_adjusted) + mark,
        r.label,
    ]
    return [*cells, str(r.n_groups)] if groups else cells


VERDICT_WORDS = (
    "the interval is the raw p's and the verdict the adjusted p's, so an interval excluding 0 that "
    "adjustment does not confirm reads 'worse unadjusted, n.s. after Holm'; beside 'no evidence', the "
    "effect the data could detect (80% power, from the group-bootstrap SE)"
)


def gate_lines(c: Comparison) -> list[str]:
    """The regression gate's verdicts, one line per rule and variant (nothing without rules)."""
    if not c.gate:
        return []
    blocked = sum(1 for g in c.gate if not g.passed)
    head = (
        f"regression gate: {'BLOCKED' if blocked else 'passed'} ({blocked} of {len(c.gate)} verdicts block)"
    )
    return [head, *(f"  {result_line(g)}" for g in c.gate)]


def gate_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s gate section: each rule's verdict per variant, its evidence and meaning."""
    if not c.gate:
        return []
    out = [
        "## Regression gate",
        "",
        "| verdict | variant | rule | effect [CI] | p_adj | why | the rule means |",
        "|---|---|---|---|---:|---|---|",
    ]
    for g in c.gate:
        interval = f"{_signed(g.effect)} [{_signed(g.ci_low)}, {_signed(g.ci_high)}]"
        out.append(
            f"| {g.verdict} | {_md_cell(g.variant)} | `{g.rule}` | {interval} | {_p(g.p_adjusted)} "
            f"({g.adjustment or '-'}) | {_md_cell(g.reason)} | {_md_cell(g.meaning)} |"
        )
    return [*out, ""]


def no_op_text(variant: str) -> str:
    """What a variant flagged ``no_op`` is, in words (the terminal, comparison.md, report.html)."""
    return (
        f"{variant} returned the same retrieved chunks, answers and intents as the baseline for every "
        "query (timings aside): its change did nothing here"
    )


def guard_flag(c: Comparison, variant: str) -> str:
    """The guard's verdict on a variant as a table flag ('' when it found one factor)."""
    parts = ["NO-OP: same records as the baseline"] if variant in c.no_op else []
    if variant in c.confounded:
        parts.append("CONFOUNDED: " + ", ".join(c.confounded[variant]))
    if variant in c.unchecked:
        parts.append("UNCHECKED: " + c.unchecked[variant])
    return "; ".join(parts)


def table_rows(c: Comparison, groups: bool = True) -> tuple[list[str], list[list[str]]]:
    """Rows of variant x metric with dev and holdout side by side (``groups``: a column of group counts)."""
    headers = ["variant", "metric"]
    for s in c.splits:
        headers += [f"{s} base -> var", f"{s} effect [95% CI]", f"{s} p", f"{s} p_adj", f"{s} verdict"]
        headers += [f"{s} groups"] if groups else []
    headers.append("flag")
    rows = []
    for v in c.variants:
        for m in c.metrics:
            cells = [v, display_name(m)]
            flag = ""
            for s in c.splits:
                r = c.row(s, v, m)
                cells += _cell(r, groups)
                flag = flag or (r.flag if r else "")
            guard = guard_flag(c, v)
            if guard:
                flag = f"{flag}; {guard}" if flag else guard
            if any(x != "-" for x in cells[2:]):
                rows.append([*cells, flag])
    return headers, rows


def pair_line(p: Pair) -> str:
    """``dev, chunk=256: failed 0/40 in baseline, 3/40 in variant; ...``."""
    return (
        f"{p.split}, {p.variant}: failed {p.n_failed_baseline}/{p.n_baseline} in baseline, "
        f"{p.n_failed_variant}/{p.n_variant} in variant; ok-only figures and latency compare "
        f"{p.n_ok_both} of {p.n_queries} queries, left out {p.left_out_text()}{_failed_ms(p)}"
    )


def format_terminal(c: Comparison) -> str:
    from rag_ablate.core.fmt import format_table

    headers, rows = table_rows(c, groups=False)
    tested = [r for r in c.rows if r.tested]
    sizes = ", ".join(
        f"{s} {max(r.n_queries for r in tested if r.split == s)} queries in "
        f"{max(r.n_groups for r in tested if r.split == s)} groups"
        for s in c.splits
        if any(r.split == s for r in tested)
    )
    sizes = f"{sizes}; " if sizes else ""
    lines = [
        f"comparison against baseline '{c.baseline}' ({sizes}effect = variant - baseline; 95% CI by "
        f"inverting the group sign-flip test that gives p (~ Monte Carlo); p_adj: Holm on holdout, BH on "
        f"dev, latency a family apart; + better / - worse at alpha {c.alpha}; {VERDICT_WORDS}; bootstrap "
        f"B={c.B} SE and interval in comparison.json)",
        format_table(headers, rows),
        *gate_lines(c),
        # the terminal shows the first (primary) metric's production mix; comparison.md every metric
        *mix_terminal(c.mix, c.variants, c.metrics[:1], c.splits, c.mix_weights, c.B),
    ]
    if c.metrics:
        first = c.metrics[0]
        for v in c.variants:
            by_split = c.flips.get(v, {}).get(first, {})
            parts = [
                f"{s}: {c.n_flips(v, first, s, 'improved')} improved, "
                f"{c.n_flips(v, first, s, 'regressed')} regressed"
                for s in by_split
            ]
            if parts:
                lines.append(
                    f"per-query flips of {v} on {display_name(first)}: {'; '.join(parts)} (comparison.md)"
                )
    lines += repeat_terminal_lines(c)
    lines += slice_terminal_lines(c)
    lines += stage_terminal_lines(c)
    lines += tradeoff_terminal_lines(c)
    if c.pairwise is not None:
        from rag_ablate.compare.pairwise import format_terminal as pairwise_terminal

        lines.append(pairwise_terminal(c.pairwise))
    lines += ppi_terminal_lines(c.ppi)
    with_failures = [p for p in c.pairs if p.n_left_out or p.n_failed_baseline or p.n_failed_variant]
    if with_failures:
        lines.append(f"failed and left-out queries ({WHICH_QUERIES}):")
        lines += [f"  {pair_line(p)}" for p in with_failures]
        lines += [f"  {ok_only_line(r)}" for r in ok_only_rows(c)]
    elif c.pairs:
        lines.append("failed queries: none; no query left out of any pair")
    for v, factors in c.confounded.items():
        lines.append(f"CONFOUNDED: {v} differs from the baseline in: {', '.join(factors)}")
    for v, why in c.unchecked.items():
        lines.append(f"UNCHECKED: {v} was not checked for confounding: {why}")
    lines += [f"NO-OP: {no_op_text(v)}" for v in c.no_op]
    for n in c.notes:
        lines.append(f"note: {n}")
    if c.latency_note:
        lines.append(f"how latency was measured: {c.latency_note}")
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def pairwise_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s pairwise-judge section (judge.mode=pairwise; nothing otherwise)."""
    if c.pairwise is None:
        return []
    from rag_ablate.compare.pairwise import format_markdown as pairwise_markdown

    return [*pairwise_markdown(c.pairwise).splitlines(), ""]


def judge_spread_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s section on the LLM judge's own spread next to the CI of its metrics
    (nothing when no row has one: no judge, or one judgement per query)."""
    rows = [r for r in c.rows if r.tested and math.isfinite(r.judge_noise_se)]
    if not rows:
        return []
    out = [
        "## Judge repeat spread",
        "",
        "The judge scored every answer several times (`judge.repeats`). `repeat SD` is the mean "
        "within-query SD of its scores (baseline / variant); `judge-noise SE` is the part of the "
        "effect's uncertainty that this noise alone explains. The CI above already contains it: when the "
        "SE is small next to the CI's half-width, the uncertainty comes from which queries were sampled "
        "and more repeats would not narrow it.",
        "",
        "| split | variant | metric | effect [95% CI] | CI half-width | repeat SD base / var "
        "| judge-noise SE |",
        "|---|---|---|---|---:|---|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.split} | {_md_cell(r.variant)} | {display_name(r.metric)} | "
            f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}] | "
            f"{_num((r.ci_high - r.ci_low) / 2)} | "
            f"{_num(r.judge_repeat_sd_baseline)} / {_num(r.judge_repeat_sd_variant)} | "
            f"{_num(r.judge_noise_se)} |"
        )
    return [*out, ""]


REPEATS_HOW = (
    "Each query ran several times (system.repeats): its value is the mean over its repeats, and the "
    "interval resamples groups of queries, each with its repeats' mean, so the repeats' noise is counted "
    'once (docs/statistics.md "Repeated runs")'
)


def verdicts_text(verdicts: Sequence[float | None]) -> str:
    """A flaky query's verdicts per repeat: ``1 0 1`` (``failed`` for a repeat that failed)."""
    return " ".join("failed" if v is None else f"{v:g}" for v in verdicts)


def flaky_line(f: FlakyQuery) -> str:
    """``dev `q7` reference_in_answer 1 0 1: <query text>``."""
    parts = "; ".join(f"{display_name(m)} {verdicts_text(v)}" for m, v in f.verdicts.items())
    return f"{f.split} `{f.query_id}` {parts}: {f.query or '(text not stored)'}"


def repeat_terminal_lines(c: Comparison) -> list[str]:
    """One line per repeated variant: runs per query and flaky queries."""
    return [
        f"repeats of {r.variant}: {r.repeats} runs per query; {r.n_flaky} of {r.n_queries} queries flaky "
        "(both verdicts of a binary metric; comparison.md lists them)"
        for r in c.repeats
    ]


def repeat_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s section on repeated runs: how they enter the interval, the flaky queries."""
    if not c.repeats:
        return []
    out = ["## Repeated runs and flaky queries", "", REPEATS_HOW + ".", ""]
    for r in c.repeats:
        out += [
            f"### {_md_cell(r.variant)}: {r.repeats} runs per query, "
            f"{r.n_flaky} of {r.n_queries} queries flaky",
            "",
        ]
        out += [f"- {_md_cell(flaky_line(f))}" for f in r.flaky]
        if r.n_flaky > len(r.flaky):
            out.append(f"- ... {r.n_flaky - len(r.flaky)} more (the job's repeats.json has every query)")
        out.append("")
    return out


SLICES_HOW = (
    "exploratory: the comparison's test within each slice, p adjusted by Benjamini-Hochberg across the "
    "slices of each split, variant and metric"
)


def _slice_effect(r: SliceRow) -> str:
    if r.verdict == "untested":
        return r.note
    if not math.isfinite(r.ci_low):
        return _signed(r.effect)
    return f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]"


def slice_summary(c: Comparison, variant: str, split: str) -> str:
    """``2 hurt, 1 helps, 20 no evidence, 4 too small`` for one variant and split."""
    if c.slices is None:
        return ""
    rows = [r for r in c.slices.rows if r.variant == variant and r.split == split]
    counts = {v: sum(1 for r in rows if r.verdict == v) for v in SLICE_VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def slice_terminal_lines(c: Comparison, top: int = 5) -> list[str]:
    """Per variant and split, the slices where it hurts (at most ``top``, worst first)."""
    if c.slices is None or not c.slices.rows:
        return []
    ms = ", ".join(display_name(m) for m in c.slices.metrics)
    out = [f"slices where a variant hurts ({ms}; {SLICES_HOW}; every slice: comparison.md):"]
    for v in c.variants:
        for s in c.splits:
            hurts = c.slices.hurts(v, s)
            if not any(r.variant == v and r.split == s for r in c.slices.rows):
                continue
            shown = "; ".join(
                f"{r.name} {display_name(r.metric)} {_slice_effect(r)} p_adj {_p(r.p_adjusted)}"
                for r in hurts[:top]
            )
            more = f"; ... {len(hurts) - top} more" if len(hurts) > top else ""
            out.append(f"  {v}, {s}: {shown + more if hurts else 'none'} ({slice_summary(c, v, s)})")
    return out


def slice_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s section: every slice of every variant and split, worst first."""
    if c.slices is None:
        return []
    sec = c.slices
    out = [
        "## Where it helps and hurts: slices (exploratory)",
        "",
        "A slice is the queries sharing a tag, a parent intent (`intent_l1`) or a leaf intent (`intent_l2`); "
        f"slices overlap. Each is compared on its own: {SLICES_HOW}. `hurts` / `helps`: adjusted p below "
        f"{sec.alpha}; a slice with fewer than {sec.min_groups} paired groups is `too small` (its means "
        "shown, not tested). Treat a verdict as a lead to look at, not a decision. Queries compared as in "
        "the whole comparison; `failed` counts the slice's failed queries (baseline / variant).",
        "",
    ]
    out += [f"- {n}" for n in sec.notes]
    if sec.notes:
        out.append("")
    if not sec.rows:
        return [*out, "No slices: the records carry no tags and no gold intents.", ""]
    for v in c.variants:
        for s in c.splits:
            rows = [r for r in sec.rows if r.variant == v and r.split == s]
            if not rows:
                continue
            out += [
                f"### {_md_cell(v)} · {s}: {slice_summary(c, v, s)}",
                "",
                "| slice | metric | queries (groups) | failed | base -> var | effect [95% CI] | p "
                "| p_adj (BH) | verdict |",
                "|---|---|---:|---:|---|---|---:|---:|---|",
            ]
            for r in rows:
                means = f"{_num(r.baseline_mean)} -> {_num(r.variant_mean)}"
                out.append(
                    f"| {_md_cell(r.name)} | {display_name(r.metric)} | {r.n_queries} ({r.n_groups}) | "
                    f"{r.n_failed_baseline} / {r.n_failed_variant} | {means} | {_md_cell(_slice_effect(r))} "
                    f"| {_p(r.p_value)} | {_p(r.p_adjusted)} | {_md_cell(r.label or r.verdict)} |"
                )
            out.append("")
    return out


STAGES_HOW = (
    "a stage's share is the mean of a per-query 0/1 indicator over the queries diagnosed (failed queries are "
    "not); effect = variant share - baseline share over the queries diagnosed on both sides, with the same "
    "paired group test; p_adj among the stage rows only; lower is better for every stage but ok"
)


def share_text(x: StageShare) -> str:
    """``ok 5, not_retrieved 2 of 7 diagnosed; 1 failed`` (the stages with any query)."""
    parts = [f"{stage} {n}" for stage, n in x.counts.items() if n]
    return f"{', '.join(parts) or 'none'} of {x.n_diagnosed} diagnosed; {x.n_failed} failed"


def stage_table(c: Comparison, groups: bool) -> tuple[list[str], list[list[str]]]:
    """The stage rows as :func:`table_rows` lays out the main ones (empty without a stage section)."""
    if c.stages is None or not c.stages.rows:
        return [], []
    return table_rows(replace(c, rows=c.stages.rows, metrics=c.stages.metrics), groups)


def stage_terminal_lines(c: Comparison) -> list[str]:
    """The failure stages: queries per stage of every variant and split, then the shares' rows."""
    if c.stages is None:
        return []
    from rag_ablate.core.fmt import format_table

    out = ['failure stages, queries per stage (docs/metrics.md "Stage diagnosis"):']
    out += [f"  {x.split}, {x.variant}: {share_text(x)}" for x in c.stages.shares]
    headers, rows = stage_table(c, groups=False)
    if rows:
        out += [f"how each stage's share moved ({STAGES_HOW}):", format_table(headers, rows)]
    out += [f"note: {n}" for n in c.stages.notes]
    return out


def stage_markdown_lines(c: Comparison) -> list[str]:
    """``comparison.md``'s section on the failure stages."""
    if c.stages is None:
        return []
    out = [
        "## Failure stages",
        "",
        'Which stage lost each query (docs/metrics.md, "Stage diagnosis"), per split and variant:',
        "",
        *(f"- {x.split}, {_md_cell(x.variant)}: {share_text(x)}" for x in c.stages.shares),
        "",
    ]
    headers, rows = stage_table(c, groups=True)
    if rows:
        out += [
            f"How each stage's share moved: {STAGES_HOW}.",
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "---|" * len(headers),
            *("| " + " | ".join(_md_cell(x) for x in r) + " |" for r in rows),
            "",
        ]
    out += [*(f"- {n}" for n in c.stages.notes), *([""] if c.stages.notes else [])]
    return out


def format_markdown(c: Comparison, max_flips: int = 10) -> str:
    headers, rows = table_rows(c)
    out = [
        f"# Comparison against `{c.baseline}`",
        "",
        "Paired and group-aware, per split. Effect = variant mean - baseline mean; the 95% CI inverts the "
        "group sign-flip test (the shifts it does not reject) and p comes from the same test; the group "
        f"bootstrap (B = {c.B}, seed {c.seed}) gives the SE and a percentile interval (`se`, `boot_ci_low`, "
        "`boot_ci_high` in comparison.json). p_adj is Holm over variants x metrics on holdout and "
        "Benjamini-Hochberg on dev; the latency metrics are a family of their own (`family` in "
        "comparison.json), so timing noise does not move the other rows' p_adj. "
        f"`+` significantly better, `-` significantly worse at alpha {c.alpha} "
        f"(by the metric's direction); `~` marks a Monte Carlo p. Verdict: {VERDICT_WORDS}.",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(_md_cell(x) for x in r) + " |" for r in rows),
        "",
        *gate_markdown_lines(c),
        *mix_markdown(c.mix, c.variants, c.metrics, c.splits, c.mix_weights, c.B),
        *judge_spread_lines(c),
        *repeat_markdown_lines(c),
        *pairwise_markdown_lines(c),
        *ppi_markdown_lines(c.ppi),
        *tradeoff_markdown_lines(c),
        "## Queries compared",
        "",
        f"Failed queries never vanish: {WHICH_QUERIES}. `error_rate` is compared like any metric.",
        "",
        "| split | variant | queries | failed in baseline | failed in variant | ok on both "
        "| left out (why) | failed queries' median ms (base / var) |",
        "|---|---|---:|---:|---:|---:|---|---|",
        *(
            f"| {p.split} | {_md_cell(p.variant)} | {p.n_queries} | {p.n_failed_baseline}/{p.n_baseline} | "
            f"{p.n_failed_variant}/{p.n_variant} | {p.n_ok_both} | {p.left_out_text()} | "
            f"{_ms(p.failed_latency_ms_baseline)} / {_ms(p.failed_latency_ms_variant)} |"
            for p in c.pairs
        ),
        "",
        *(
            ["Failure-aware against ok-only (rows where a query failed):", ""]
            + [f"- {_md_cell(ok_only_line(r))}" for r in ok_only_rows(c)]
            + [""]
            if ok_only_rows(c)
            else []
        ),
    ]
    if c.confounded or c.unchecked:
        out += ["## Confounding guard", ""]
        out += [f"- **{v}** CONFOUNDED, differs in: {', '.join(f)}" for v, f in c.confounded.items()]
        out += [f"- **{v}** UNCHECKED: {why}" for v, why in c.unchecked.items()]
        out.append("")
    if c.no_op:
        out += ["## No-op variants", "", *(f"- **NO-OP**: {_md_cell(no_op_text(v))}" for v in c.no_op), ""]
    if c.notes:
        out += ["## Notes", "", *(f"- {n}" for n in c.notes), ""]
    if c.latency_note:
        out += ["## How latency was measured", "", c.latency_note, ""]
    out += slice_markdown_lines(c)
    out += stage_markdown_lines(c)
    out += ["## Per-query flips", ""]
    for v, by_metric in c.flips.items():
        for m, by_split in by_metric.items():
            for s, kinds in by_split.items():
                if not kinds["improved"] and not kinds["regressed"]:
                    continue
                n = {label: c.n_flips(v, m, s, label) for label in ("improved", "regressed")}
                counts = f"{n['improved']} improved, {n['regressed']} regressed"
                out.append(f"### {v} · {display_name(m)} · {s}: {counts}")
                out.append("")
                for label in ("improved", "regressed"):
                    fl = kinds[label]
                    for f in fl[:max_flips]:
                        out.append(
                            f"- {label}: `{f.query_id}` {_num(f.baseline)} -> {_num(f.variant)}  {f.query}"
                        )
                    if n[label] > len(fl):  # cut to the largest changes (Comparison.cap_flips)
                        out.append(
                            f"- ... {n[label] - min(len(fl), max_flips)} more {label} (comparison.json "
                            f"has the {len(fl)} largest changes; every query's values: the jobs' records)"
                        )
                    elif len(fl) > max_flips:
                        out.append(f"- ... {len(fl) - max_flips} more {label} (comparison.json has all)")
                out.append("")
    return "\n".join(out)


def tradeoff_terminal_lines(c: Comparison) -> list[str]:
    """One line per split: the Pareto frontier and, with a quality bar, the cheapest variant clearing it."""
    t = c.tradeoff
    if t is None:
        return []
    out = []
    for st in t.splits:
        front = ", ".join(p.variant for p in st.points if p.frontier) or "none"
        line = (
            f"quality vs cost ({st.split}, {display_name(t.quality_metric)} vs "
            f"{tradeoff.cost_display(t.cost_metric)}): Pareto frontier {front}"
        )
        if t.quality_bar is not None:
            line += f"; {tradeoff.choice_sentence(t, st)}"
        out.append(line + " (tradeoff.md)")
    return out


def tradeoff_markdown_lines(c: Comparison) -> list[str]:
    """The trade-off tables as a section of ``comparison.md`` (the same as ``tradeoff.md``)."""
    if c.tradeoff is None:
        return []
    text = tradeoff.format_markdown(c.tradeoff)
    return ["##" + text.lstrip("#").replace("\n## ", "\n### ").rstrip("\n"), ""]


def write_outputs(c: Comparison, out_dir: Path) -> list[Path]:
    """``comparison.json`` and ``comparison.md`` in ``out_dir``; ``tradeoff.json`` and ``tradeoff.md``
    too when the comparison has its trade-off."""
    j, md = out_dir / COMPARISON_JSON, out_dir / COMPARISON_MD
    write_json_atomic(j, c.to_dict())
    write_text_atomic(md, format_markdown(c))
    paths = [j, md]
    if c.tradeoff is not None:
        paths += tradeoff.write(c.tradeoff, out_dir)
    return paths
