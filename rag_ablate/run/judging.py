"""The judge phase of a run: every answered query judged by an LLM judge, and the judge's run metrics.

After the system pass, :func:`judge_records` hands every ``ok`` record with an answer and no
``judge`` value yet to the configured judge (``judge=openai``; a thread pool of
``judge.concurrency``), stores what it returned as ``record["judge"]`` and scores the record
again, so the judged metrics (``faithfulness``, ``relevance``, ``completeness``,
``judge_error_<metric>``) and the judge's refusal and citation-support verdicts land in its
``metrics`` (:func:`rag_ablate.metrics.answers.answer_metrics`). Records that already carry a
judgement are kept as they are, so ``resume=`` judges only what is missing. A judge that fails
never fails the query: the failure is recorded per metric and counted as a judge error.

:func:`judge_run_metrics` turns the judgements into the run's ``judge/...`` metrics: agreement
and spread of the repeats per metric, the length-bias check, error rates, calls, cache hits,
tokens and money. Everything is computed from the records, so it can be recomputed from
``records.jsonl`` alone. The judge's money is evaluation cost: it is kept under ``judge/``,
apart from the system's ``cost/`` metrics. See docs/metrics.md "Judged answers".
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from rag_ablate.core.errors import RunStopError
from rag_ablate.metrics.answers import (
    AnswerScoring,
    answer_sentences,
    answer_tokens,
    cited_texts,
    judge_scores,
)
from rag_ablate.metrics.registry import judged_metrics
from rag_ablate.records.trace import Judgement, JudgeRepeat, Record

if TYPE_CHECKING:
    from rag_ablate.config.schema import ModelPrice
    from rag_ablate.dataset.model import Dataset, Document, Query
    from rag_ablate.judges import Judge, JudgeInput
    from rag_ablate.run.budget import SpendMeter

PREFIX = "judge/"


def needs_judgement(rec: Record) -> bool:
    """An ok record with an answer that has no judgement yet."""
    return rec.get("status") == "ok" and rec.get("answer") is not None and rec.get("judge") is None


def judge_input(
    rec: Record, query: Query, docs: Mapping[str, Document], max_contexts: int
) -> JudgeInput | None:
    """What the judge sees of one record; None for a failed record or one without an answer.

    ``contexts``: the record's top ``max_contexts`` retrieved chunks in rank order, their texts cut
    from the corpus; ``references``: the query's reference answers; ``citations``: one (answer
    sentence index, cited text) pair per ``[n]`` marker of each sentence, in order (a marker that
    points at nothing gets an empty text: it supports nothing whatever the judge says).
    """
    from rag_ablate.generators.base import Context
    from rag_ablate.judges import JudgeInput

    if rec.get("status") != "ok" or rec.get("answer") is None:
        return None
    answer = str(rec["answer"])
    retrieved = list(rec.get("retrieved") or [])
    contexts = []
    placed = [r for r in retrieved if r["doc_id"] is not None]  # a chunk named by id only has no text
    for n, r in enumerate(placed[: max(0, max_contexts)], start=1):
        start, end, doc_id = int(r["start"]), int(r["end"]), str(r["doc_id"])
        text = docs[doc_id].text[start:end]
        contexts.append(Context(n, str(r["chunk_id"]), doc_id, start, end, text))
    texts = cited_texts(rec.get("citations") or [], retrieved, docs)
    pairs: list[tuple[int, str]] = []
    for i, sent in enumerate(answer_sentences(answer)):
        for n in sent.markers:
            cited = texts[n - 1] if 1 <= n <= len(texts) else None
            pairs.append((i, cited or ""))
    return JudgeInput(
        query_id=query.query_id,
        question=query.query,
        answer=answer,
        contexts=contexts,
        references=list(query.reference_answers),
        citations=pairs,
    )


def failed_judgement(judge: Judge, error: str) -> Judgement:
    """The ``judge`` value of a query whose judging raised: every repeat failed every metric."""
    judged = judged_metrics()
    errors = {m: error for m in (*judged, "refusal", "citation_support")}
    repeat: JudgeRepeat = {
        "scores": {m: None for m in judged},
        "errors": errors,
        "refusal": None,
        "support": None,
        "repaired": False,
        "cached": False,
        "latency_ms": None,
        "usage": None,
        "usage_count": None,
    }
    return {
        "model": judge.model,
        "prompt_hash": judge.prompt_hash,
        "repeats": [repeat.copy() for _ in range(max(1, judge.repeats))],
    }


def _judged_misses(rec: Record, query: Query) -> Record:
    """A failed query misses the judged metrics the judge would have asked about its answer
    (``None``, never a 0: their failure-aware form counts it as a miss); an ok record is returned
    as it is."""
    from rag_ablate.judges import asked_metrics

    metrics = rec.get("metrics") or {}
    if rec.get("status") == "ok":
        return rec
    missed = {m: None for m in asked_metrics(bool(query.reference_answers)) if m not in metrics}
    return {**rec, "metrics": {**metrics, **missed}} if missed else rec


def judge_records(
    records: Sequence[Record],
    judge: Judge,
    dataset: Dataset,
    *,
    ks: Sequence[int],
    routed: bool,
    answers: AnswerScoring | None = None,
    max_contexts: int = 5,
    concurrency: int = 1,
    progress: bool = False,
    label: str = "",
    on_record: Callable[[Record], None] | None = None,
    meter: SpendMeter | None = None,
) -> list[Record]:
    """``records`` in the same order, every one that :func:`needs_judgement` judged and scored again.
    ``meter`` (``cost.max_usd``) is checked before each judgement and charged after it.

    ``on_record`` gets each judged record as soon as it is done (the job appends it to
    ``records.jsonl``, so an interrupted judge phase keeps what it judged). When the system
    answers, a failed query's record names the judged metrics it misses, with None. A judge that raises
    gives the query a judgement whose every metric failed (:func:`failed_judgement`); the
    query itself stays ok.
    """
    from rag_ablate.records.scoring import scored

    by_id = {q.query_id: q for q in dataset.queries}
    out = list(records)
    if any(r.get("answer") is not None for r in records):  # the system answers: its failures miss them
        out = [_judged_misses(r, by_id[r["query_id"]]) for r in records]
    todo: list[tuple[int, JudgeInput]] = []
    for i, rec in enumerate(records):
        if needs_judgement(rec):
            inp = judge_input(rec, by_id[rec["query_id"]], dataset.documents, max_contexts)
            if inp is not None:
                todo.append((i, inp))
    if not todo:
        return out

    def one(inp: JudgeInput) -> Judgement:
        if meter is not None:  # cost.max_usd: no judgement that could pass it starts
            meter.check()
        try:
            return judge.judge(inp)
        except RunStopError:
            raise  # the judge's endpoint is down: the run stops
        except Exception as exc:  # the contract says a judge records its failures; never lose a query
            return failed_judgement(judge, f"{type(exc).__name__}: {exc}")

    bar = tqdm(total=len(todo), desc=f"judging [{label}]", unit="q", disable=not progress, leave=False)
    try:
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            futures = {pool.submit(one, inp): i for i, inp in todo}
            for fut in as_completed(futures):
                i = futures[fut]
                rec = out[i]
                judged: Record = {**rec, "judge": fut.result()}
                out[i] = scored(
                    judged, by_id[rec["query_id"]], dataset.documents, ks, routed=routed, answers=answers
                )
                if on_record is not None:
                    on_record(out[i])
                if meter is not None:
                    meter.charge_judgement(out[i])
                bar.update(1)
    finally:
        bar.close()
    return out


# --------------------------------------------------------------------------------------- run metrics


def _repeats(rec: Record) -> list[JudgeRepeat]:
    judgement = rec.get("judge")
    reps = (judgement.get("repeats") if judgement else None) or []
    return [r for r in reps if isinstance(r, Mapping)]


def judge_errors(records: Sequence[Record], metric: str) -> list[str]:
    """Why each failed judgement of ``metric`` failed, one text per failed repeat (the run's error budget
    quotes the most common one)."""
    return [str(e) for r in records for rep in _repeats(r) if (e := (rep.get("errors") or {}).get(metric))]


def repeat_sd(scores: Sequence[float]) -> float:
    """The sample standard deviation (ddof 1) of one query's repeat scores (needs two or more)."""
    return float(np.std(np.asarray(scores, dtype=np.float64), ddof=1))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho of ``x`` and ``y`` (scipy); None with fewer than 3 pairs or a constant side,
    where it is undefined (never a warning, never NaN)."""
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # anything scipy warns about would be a bug here
        rho = float(spearmanr(x, y).statistic)
    return rho if math.isfinite(rho) else None


def metric_agreement(records: Sequence[Record], metric: str) -> dict[str, float]:
    """One judged metric's run metrics (names without the ``judge/<metric>/`` prefix).

    Over the queries the metric applies to (those with ``judge_error_<metric>`` in their
    metrics): ``error_rate`` (the mean share of failed repeats); over the queries with two or more
    valid repeats: ``agreement_exact`` (share whose repeats all gave the same score),
    ``agreement_within1`` (share whose scores span at most one point) and ``repeat_sd`` (mean
    within-query sample SD); over the queries with a score: ``length_corr``, Spearman's rho of
    the score with the answer's length in tokens (absent with fewer than 3 answers or a constant
    side). A statistic without any query is absent.
    """
    out: dict[str, float] = {}
    key = f"judge_error_{metric}"
    judged = [(r, e) for r in records if (e := (r.get("metrics") or {}).get(key)) is not None]
    applies = [r for r, _ in judged]
    if not applies:
        return out
    out["error_rate"] = float(np.mean([float(e) for _, e in judged]))
    out["n_queries"] = float(len(applies))
    multi = [s for s in (judge_scores(r.get("judge"), metric)[0] for r in applies) if len(s) >= 2]
    if multi:
        out["agreement_exact"] = float(np.mean([max(s) == min(s) for s in multi]))
        out["agreement_within1"] = float(np.mean([max(s) - min(s) <= 1 for s in multi]))
        out["repeat_sd"] = float(np.mean([repeat_sd(s) for s in multi]))
    scored_rows = [(r, v) for r in applies if (v := (r.get("metrics") or {}).get(metric)) is not None]
    rho = spearman(
        [float(v) for _, v in scored_rows],
        [float(len(answer_tokens(str(r.get("answer") or "")))) for r, _ in scored_rows],
    )
    if rho is not None:
        out["length_corr"] = rho
    return out


def judge_run_metrics(
    records: Sequence[Record], *, price: ModelPrice | None = None
) -> dict[str, float]:
    """The run's ``judge/...`` metrics from its records (empty when no record was judged).

    ``judge/queries`` judged answers; ``judge/calls`` judge repeats behind them (one model call
    each, replays from the cache included), ``judge/cache_hits`` of those replayed,
    ``judge/repairs`` repeats that needed the repair call; ``judge/prompt_tokens``,
    ``judge/completion_tokens``, ``judge/total_tokens`` summed over the repeats (a replay counts
    its original call's tokens, like the system's cost); with a price for the judge's model,
    ``judge/usd`` for the run and ``judge/usd_per_1k`` per 1,000 judged answers; per judged
    metric, :func:`metric_agreement` as ``judge/<metric>/<name>``.
    """
    if not any(r.get("judge") for r in records):  # no judgement at all (a run without a judge): no more
        return {}
    judged = [r for r in records if r.get("status") == "ok" and _repeats(r)]
    if not judged:
        return {}
    reps = [rep for r in judged for rep in _repeats(r)]
    out: dict[str, float] = {
        "queries": float(len(judged)),
        "calls": float(len(reps)),
        "cache_hits": float(sum(1 for rep in reps if rep.get("cached") is True)),
        "repairs": float(sum(1 for rep in reps if rep.get("repaired") is True)),
    }
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        counts = [
            float(n)
            for rep in reps
            if isinstance(u := rep.get("usage"), Mapping) and isinstance(n := u.get(key), int | float)
        ]
        if counts:
            out[key] = float(sum(counts))
    if price is not None and ("prompt_tokens" in out or "completion_tokens" in out):
        usd = (
            out.get("prompt_tokens", 0.0) * price.prompt
            + out.get("completion_tokens", 0.0) * price.completion
        )
        out["usd"] = usd / 1_000_000
        out["usd_per_1k"] = out["usd"] / len(judged) * 1000
    for metric in judged_metrics():
        out.update({f"{metric}/{k}": v for k, v in metric_agreement(judged, metric).items()})
    return {PREFIX + k: v for k, v in out.items()}


def repeat_spread(rec: Record, metric: str) -> tuple[float, int] | None:
    """One query's within-query variance of ``metric`` over the judge's repeats and the number of
    valid repeats (None with fewer than two): the judge's own noise in that query's mean score."""
    scores, _ = judge_scores(rec.get("judge"), metric)
    if len(scores) < 2:
        return None
    return float(np.var(np.asarray(scores, dtype=np.float64), ddof=1)), len(scores)
