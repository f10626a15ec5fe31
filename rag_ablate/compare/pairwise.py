"""Pairwise judging in the comparison step (``judge.mode=pairwise``; docs/statistics.md "Pairwise").

For each variant against the baseline and each split, over the queries ``ok`` with an answer
on both sides, the judge sees the question, the query's gold passages and reference answers
(the same ground for both answers, :func:`rag_ablate.judges.calibration.judge_input`), and the
two answers as "Answer 1" and "Answer 2", twice with the positions swapped. Per query:

* ``+1``: the variant wins (both orders pick it);
* ``-1``: the baseline wins (both orders pick it);
* ``0``: a tie (both orders say tie, or the two answers are the same text: then the judge is not
  asked), or *inconsistent* (the orders disagree: position bias);
* a judge error (an order failed): counted and listed apart, never a tie; the query is not in n.

Reported per split and variant: wins, losses, ties, inconsistent, errors, the net win rate
``(wins - losses) / n`` over the n judged queries with its paired group-bootstrap interval (the
mean of the per-query outcomes, resampling near-duplicate groups, :func:`rag_ablate.compare.stats.paired_test`
against 0) and the group sign-flip p, the share of inconsistent orders, and the share of
decided order verdicts that picked the answer shown first (0.5 for a judge without position bias).

The judge is built from the baseline's resolved config (its ``judge`` settings); its calls go
through the model-call cache, so rerunning the comparison costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import failed
from rag_ablate.compare.model import (
    VERDICTS,
    Comparison,
    PairwiseQuery,
    PairwiseReport,
    PairwiseResult,
    VariantData,
)
from rag_ablate.core.errors import ComparisonError, RagAblateError
from rag_ablate.records.trace import Record

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.model import Dataset
    from rag_ablate.judges import Judge

# --------------------------------------------------------------------------- one query


def outcome_of(verdict: Mapping[str, Any]) -> PairwiseQuery:
    """Read a :meth:`Judge.pairwise` value (query id and group are filled in by the caller)."""
    orders = list(verdict.get("orders") or [])
    verdicts: list[str | None] = []
    firsts: list[str] = []
    errors: list[str] = []
    for o in orders:
        v = o.get("verdict")
        verdicts.append(v if v in VERDICTS else None)
        firsts.append(str(o.get("first", "")))
        if v not in VERDICTS:
            errors.append(str(o.get("error") or f"no verdict (got {v!r})"))
    if not orders:
        errors.append("the judge returned no orders")
    if errors:
        return PairwiseQuery("", "", None, verdicts, firsts, None, "; ".join(dict.fromkeys(errors)))
    if len(set(verdicts)) == 1:
        return PairwiseQuery("", "", {"b": 1, "a": -1, "tie": 0}[str(verdicts[0])], verdicts, firsts, True)
    return PairwiseQuery("", "", 0, verdicts, firsts, False)


def _judge_pair(judge: Judge, inp_a: Any, answer_b: str) -> PairwiseQuery:
    try:
        verdict = judge.pairwise(inp_a, answer_b)
    except RagAblateError as exc:  # a call that failed after its retries: a judge error, counted
        return PairwiseQuery("", "", None, [], [], None, f"{type(exc).__name__}: {exc}")
    return outcome_of(verdict)


# --------------------------------------------------------------------------- one split x variant


def _answer(rec: Record | None) -> str | None:
    if rec is None or failed(rec):
        return None
    a = rec.get("answer")
    return a if isinstance(a, str) else None


def pairwise_split(
    judge: Judge,
    dataset: Dataset,
    split: str,
    variant: str,
    base: Sequence[Record],
    var: Sequence[Record],
    *,
    B: int,
    seed: int,
    alpha: float,
    concurrency: int = 1,
) -> PairwiseResult:
    """Judge every query of ``split`` ok with an answer on both sides (``concurrency`` pairs in
    flight); see the module docstring."""
    from rag_ablate.judges.calibration import judge_input

    queries = {q.query_id: q for q in dataset.queries}
    var_by_id = {r["query_id"]: r for r in var if r["split"] == split}
    rows: list[PairwiseQuery] = []
    asks: list[tuple[int, Any, str]] = []  # (its place in rows, the baseline's input, the variant's answer)
    for b in base:
        if b["split"] != split:
            continue
        a_text, b_text = _answer(b), _answer(var_by_id.get(b["query_id"]))
        if a_text is None or b_text is None:
            continue
        q = queries.get(b["query_id"])
        if a_text.strip() == b_text.strip():  # nothing to choose between: a tie, no judge call
            rows.append(PairwiseQuery(b["query_id"], str(b["group"]), 0, [], [], True, identical=True))
            continue
        if q is None:
            raise ComparisonError(
                f"pairwise: query {b['query_id']} of the records is not in dataset {dataset.name} "
                f"({dataset.path})"
            )
        asks.append((len(rows), judge_input(q, dataset.documents, a_text), b_text))
        rows.append(PairwiseQuery(q.query_id, str(b["group"]), None, [], [], None))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        answers = pool.map(lambda a: _judge_pair(judge, a[1], a[2]), asks)
        for (i, _, _), got in zip(asks, answers, strict=True):
            got.query_id, got.group = rows[i].query_id, rows[i].group
            rows[i] = got
    return summarise(split, variant, rows, B=B, seed=seed, alpha=alpha)


def summarise(
    split: str, variant: str, rows: Sequence[PairwiseQuery], *, B: int, seed: int, alpha: float
) -> PairwiseResult:
    """Counts, net win rate with its group-bootstrap interval, position-bias shares."""
    judged = [r for r in rows if r.outcome is not None]
    wins = sum(1 for r in judged if r.outcome == 1)
    losses = sum(1 for r in judged if r.outcome == -1)
    inconsistent = sum(1 for r in judged if r.consistent is False)
    ties = len(judged) - wins - losses - inconsistent
    decided = [(v, f) for r in judged for v, f in zip(r.verdicts, r.firsts, strict=False) if v in ("a", "b")]
    first_share = sum(1 for v, f in decided if v == f) / len(decided) if decided else math.nan
    errors = [{"query_id": r.query_id, "error": r.error or ""} for r in rows if r.outcome is None]
    n = len(judged)
    nan = math.nan
    numbers: dict[str, Any] = {
        "net_win_rate": nan,
        "ci_low": nan,
        "ci_high": nan,
        "se": nan,
        "p_value": nan,
        "p_exact": False,
        "n_groups": 0,
    }
    note = ""
    if n:
        x = np.array([float(r.outcome or 0) for r in judged])
        res = stats.paired_test(
            np.zeros_like(x),
            x,
            np.array([r.group for r in judged]),
            B=B,
            seed=stats.derive_seed(seed, "pairwise", split, variant),
            alpha=alpha,
        )
        numbers = {
            "net_win_rate": float(res.effect[0]),
            "ci_low": float(res.boot_ci_low[0]),
            "ci_high": float(res.boot_ci_high[0]),
            "se": float(res.se[0]),
            "p_value": float(res.p_value[0]),
            "p_exact": bool(res.p_exact[0]),
            "n_groups": res.n_groups,
        }
    elif rows:
        note = f"all {len(rows)} judgements failed"
    else:
        note = "no query ok with an answer on both sides"
    return PairwiseResult(
        split=split,
        variant=variant,
        n_pairs=len(rows),
        n=n,
        wins=wins,
        losses=losses,
        ties=ties,
        inconsistent=inconsistent,
        errors=len(errors),
        identical=sum(1 for r in judged if r.identical),
        inconsistent_share=inconsistent / n if n else nan,
        first_position_share=first_share,
        error_queries=errors,
        note=note,
        queries=list(rows),
        **numbers,
    )


# --------------------------------------------------------------------------- the whole step


def wanted(config: Mapping[str, Any] | None) -> bool:
    """Whether a variant's resolved config asks for the pairwise judge."""
    j = (config or {}).get("judge") or {}
    return isinstance(j, Mapping) and j.get("name", "none") != "none" and j.get("mode") == "pairwise"


def settings_of(config: Mapping[str, Any]) -> RunConfig:
    """A resolved config (``config.yaml`` of a job) as validated settings."""
    from omegaconf import OmegaConf

    from rag_ablate.config.schema import parse_config

    return parse_config(OmegaConf.create(dict(config)))


def _default_judge(s: RunConfig) -> Judge | None:
    from rag_ablate.core.cache import Cache
    from rag_ablate.judges import JUDGES

    root = Path(s.cache.dir) if s.cache.dir else Path.cwd() / s.paths.output_root / "cache"
    return JUDGES.get(s.judge.name)(s, Cache(root, enabled=s.cache.enabled))


def _default_dataset(s: RunConfig) -> Dataset:
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.metrics.registry import human_metrics

    d = s.dataset
    return load_dataset(
        d.path,
        name=d.name,
        holdout_share=d.holdout_share,
        group_threshold=d.group_threshold,
        seed=s.seed,
        human_metrics=human_metrics(),
    )


def run_pairwise(
    variants: Sequence[VariantData],
    c: Comparison,
    *,
    judge_factory: Callable[[RunConfig], Judge | None] = _default_judge,
    dataset_factory: Callable[[RunConfig], Dataset] = _default_dataset,
) -> PairwiseReport | None:
    """The pairwise section of a comparison, or None when the baseline's config does not ask for it
    (``judge.mode=pairwise`` with a judge). Uses ``c``'s baseline, variants, splits, B, seed, alpha."""
    by_label = {v.label: v for v in variants}
    base = by_label.get(c.baseline)
    if base is None or base.config is None or not wanted(base.config):
        return None
    s = settings_of(base.config)
    judge = judge_factory(s)
    if judge is None:
        return None
    try:
        dataset = dataset_factory(s)
        results = [
            pairwise_split(
                judge,
                dataset,
                split,
                label,
                base.records,
                by_label[label].records,
                B=c.B,
                seed=c.seed,
                alpha=c.alpha,
                concurrency=s.judge.concurrency,
            )
            for split in c.splits
            for label in c.variants
        ]
        return PairwiseReport(c.baseline, judge.model, judge.prompt_hash, c.B, c.seed, c.alpha, results)
    finally:
        judge.close()


def pairwise_section(variants: Sequence[VariantData], c: Comparison) -> PairwiseReport | None:
    """:func:`run_pairwise` for the comparison step: a problem that stops it (an invalid judge
    config, a dataset that cannot be loaded) becomes a note of ``c`` instead of failing the step."""
    try:
        return run_pairwise(variants, c)
    except RagAblateError as exc:
        c.notes.append(f"pairwise judge not run: {exc}")
        return None


# --------------------------------------------------------------------------- rendering


def _rate(r: PairwiseResult) -> str:
    if not r.n:
        return "-"
    return f"{r.net_win_rate:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}]"


def _ties(r: PairwiseResult, md: bool = False) -> str:
    same = f" ({r.identical} identical answers)" if r.identical else ""
    return f"{r.ties}{same}" if md else f"{r.ties} ties{same}"


def _share(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{100 * v:.0f}%"


def _p(v: float) -> str:
    return "-" if not math.isfinite(v) else ("<0.001" if v < 0.001 else f"{v:.3f}")


def format_terminal(report: PairwiseReport) -> str:
    lines = [
        f"pairwise judge {report.model} (prompt {report.prompt_hash}), each variant's answer against "
        f"'{report.baseline}', both orders; net win rate = (wins - losses) / n with its 95% group-bootstrap "
        "interval; inconsistent = the two orders disagree (position bias):"
    ]
    for r in report.results:
        if r.note and not r.n:
            lines.append(
                f"  {r.split}, {r.variant}: {r.note}" + (f" ({r.errors} judge errors)" if r.errors else "")
            )
            continue
        lines.append(
            f"  {r.split}, {r.variant}: {r.wins} wins, {r.losses} losses, {_ties(r)}, "
            f"{r.inconsistent} inconsistent, {r.errors} judge errors of {r.n_pairs}; net win rate "
            f"{_rate(r)}, p {_p(r.p_value)}; inconsistent {_share(r.inconsistent_share)}, first position "
            f"picked {_share(r.first_position_share)}"
        )
    return "\n".join(lines)


def format_markdown(report: PairwiseReport, max_errors: int = 10) -> str:
    out = [
        "## Pairwise judge",
        "",
        f"Judge `{report.model}` (prompt `{report.prompt_hash}`) compares each variant's answer with "
        f"`{report.baseline}`'s on the same gold passages, positions swapped and names hidden. A win counts "
        "only when both orders pick the same answer; orders that disagree are *inconsistent* (position "
        "bias) and count as ties; two answers with the same text are a tie without asking the judge "
        "(`identical`); a failed judgement is a judge error, not a tie, and is left out of n. "
        "Net win rate = (wins - losses) / n, 95% paired group-bootstrap interval; p: group sign-flip test "
        "of a net win rate of 0. First position: share of decided order verdicts that picked the answer "
        "shown first (0.5 without position bias).",
        "",
        "| split | variant | pairs | wins | losses | ties | inconsistent | judge errors "
        "| net win rate [95% CI] | p | inconsistent share | first position |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in report.results:
        label = r.variant.replace("|", "\\|")
        out.append(
            f"| {r.split} | {label} | {r.n_pairs} | {r.wins} | {r.losses} | {_ties(r, md=True)} | "
            f"{r.inconsistent} | {r.errors} | {_rate(r) if r.n else r.note} | {_p(r.p_value)} | "
            f"{_share(r.inconsistent_share)} | {_share(r.first_position_share)} |"
        )
    with_errors = [r for r in report.results if r.error_queries]
    if with_errors:
        out += ["", "Judge errors (left out of n):", ""]
        for r in with_errors:
            for e in r.error_queries[:max_errors]:
                out.append(f"- {r.split}, {r.variant}: `{e['query_id']}` {e['error']}")
            if len(r.error_queries) > max_errors:
                out.append(f"- ... {len(r.error_queries) - max_errors} more (comparison.json has all)")
    out.append("")
    return "\n".join(out)


def delta_metrics(report: PairwiseReport, variant: str) -> dict[str, float]:
    """A child run's pairwise numbers as MLflow metrics: ``pairwise/holdout/net_win_rate``, ..."""
    out: dict[str, float] = {}
    for r in report.results:
        if r.variant != variant or not r.n:
            continue
        for key in ("net_win_rate", "inconsistent_share"):
            out[f"pairwise/{r.split}/{key}"] = float(getattr(r, key))
        out[f"pairwise/{r.split}/judge_errors"] = float(r.errors)
    return out
