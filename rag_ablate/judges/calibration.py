"""Judge calibration: how well the LLM judge agrees with people (docs/metrics.md "Judge calibration").

A dataset may carry ``human_judgements`` on its queries (docs/dataset-format.md): answers a
person scored 0-5 on ``faithfulness``, ``relevance`` and/or ``completeness``. In a run with a
pointwise judge, :func:`run_calibration` asks the judge about each of those answers and reports,
per metric, over the (human score, judge score) pairs:

* ``exact``: the share of pairs with the same score;
* ``within1``: the share that differ by at most one point;
* ``kappa``: Cohen's weighted kappa with quadratic weights on the fixed categories 0-5,
  ``1 - sum(w * O) / sum(w * E)`` with ``w_ij = (i - j)**2``, ``O`` the 6 x 6 table of observed
  pairs and ``E`` the table chance would give (the outer product of the two score distributions,
  divided by n). It is undefined (``None`` with a reason, never NaN) without pairs, or when every
  score on both sides is one and the same category (``sum(w * E) = 0``: there is no disagreement
  chance could produce, so agreement beyond chance means nothing).

What the judge sees for a human-judged answer: the query's question, the answer, its reference
answers, and as contexts the query's relevant documents in full (highest grade first, then in
the order the query lists them), followed by any document its evidence spans point into that
is not among them. The answer was not produced by this run's retrieval, so the gold passages
are the fair ground to judge it on; an unanswerable query has none (empty contexts). No
citation pairs are sent (the answer's ``[n]`` markers refer to someone else's contexts).

The judge's score of an answer is the mean of its valid repeat scores, rounded half up to an
integer (with ``judge.repeats=1``: its score). A metric the judge failed on (a judge error) is
counted as ``judge_errors`` and left out of the pairs, never scored 0; a metric the judge was
not asked (``completeness`` when the query has no reference answer) is counted as
``not_judged``. The judge's own repeat agreement (``judge/<metric>/agreement_exact`` and
``agreement_within1`` of the run, :mod:`rag_ablate.run.judging`) is reported next to it.

Outputs in the job folder: ``judge_calibration.json`` and ``judge_calibration.md`` (names in
:mod:`rag_ablate.core.layout`), and the run metrics ``judge/<metric>/human_kappa``,
``human_exact``, ``human_within1`` and ``human_n``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rag_ablate.core.fsio import write_json_atomic, write_text_atomic
from rag_ablate.core.layout import JUDGE_CALIBRATION_JSON, JUDGE_CALIBRATION_MD
from rag_ablate.dataset.model import HUMAN_SCORE_MAX, Dataset, Document, HumanJudgement, Query
from rag_ablate.generators.base import Context
from rag_ablate.metrics.registry import human_metrics

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache
    from rag_ablate.judges import Judge, JudgeInput

#: the score categories of every judged metric
CATEGORIES = HUMAN_SCORE_MAX + 1
#: the judge's own repeat agreement (run metrics computed by rag_ablate.run.judging) shown beside
REPEAT_KEYS = ("agreement_exact", "agreement_within1", "repeat_sd")


# --------------------------------------------------------------------------- agreement statistics


def _scores(values: Sequence[int], name: str) -> npt.NDArray[np.int64]:
    arr = np.asarray(values, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() > HUMAN_SCORE_MAX):
        raise ValueError(f"{name}: scores must be integers 0-{HUMAN_SCORE_MAX}")
    return arr


def confusion(a: Sequence[int], b: Sequence[int]) -> npt.NDArray[np.int64]:
    """The 6 x 6 table of pairs: row = ``a``'s score, column = ``b``'s score."""
    x, y = _scores(a, "a"), _scores(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b are not aligned: {x.size} and {y.size} scores")
    table = np.zeros((CATEGORIES, CATEGORIES), dtype=np.int64)
    np.add.at(table, (x, y), 1)
    return table


def weighted_kappa(a: Sequence[int], b: Sequence[int]) -> tuple[float | None, str | None]:
    """Cohen's kappa with quadratic weights on the categories 0-5: ``(kappa, None)``, or
    ``(None, why)`` when it is undefined (no pairs; every score on both sides the same)."""
    observed = confusion(a, b).astype(np.float64)
    n = observed.sum()
    if n == 0:
        return None, "no pairs"
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0)) / n
    idx = np.arange(CATEGORIES, dtype=np.float64)
    weights = (idx[:, None] - idx[None, :]) ** 2
    chance = float((weights * expected).sum())
    if chance == 0.0:
        only = int(np.flatnonzero(observed.sum(axis=1))[0])
        return None, f"undefined: every score on both sides is {only} (one category only)"
    return 1.0 - float((weights * observed).sum()) / chance, None


@dataclass
class Agreement:
    """Agreement of human and judge scores on one metric (``None`` where there are no pairs)."""

    metric: str
    n: int  # pairs with a human and a valid judge score
    exact: float | None
    within1: float | None
    kappa: float | None
    kappa_note: str | None  # why kappa is None
    human_mean: float | None
    judge_mean: float | None
    judge_errors: int = 0  # human-scored answers whose judgement of this metric failed
    not_judged: int = 0  # human-scored answers the judge was not asked this metric about
    repeat: dict[str, float] = field(default_factory=dict)  # the judge's own repeat agreement
    confusion: list[list[int]] = field(default_factory=list)  # rows: human 0-5, columns: judge 0-5


def agreement(metric: str, human: Sequence[int], judge: Sequence[int]) -> Agreement:
    """Exact and within-one agreement and quadratic-weighted kappa of two aligned score lists."""
    table = confusion(human, judge)
    n = int(table.sum())
    kappa, note = weighted_kappa(human, judge)
    if n == 0:
        return Agreement(metric, 0, None, None, kappa, note, None, None, confusion=table.tolist())
    diff = np.abs(np.asarray(human, dtype=np.int64) - np.asarray(judge, dtype=np.int64))
    return Agreement(
        metric=metric,
        n=n,
        exact=float(np.mean(diff == 0)),
        within1=float(np.mean(diff <= 1)),
        kappa=kappa,
        kappa_note=note,
        human_mean=float(np.mean(human)),
        judge_mean=float(np.mean(judge)),
        confusion=table.tolist(),
    )


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def judge_score(judgement: Mapping[str, Any], metric: str) -> tuple[int | None, str | None]:
    """The judge's score of one metric from a ``record["judge"]`` value.

    ``(score, None)``: the mean of the valid repeat scores, rounded half up; ``(None, error)``:
    every repeat failed on it; ``(None, None)``: the judge was not asked (no score, no error).
    """
    valid: list[float] = []
    errors: list[str] = []
    for rep in judgement.get("repeats") or []:
        score = (rep.get("scores") or {}).get(metric)
        if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score):
            valid.append(float(score))
        elif (rep.get("errors") or {}).get(metric):
            errors.append(str(rep["errors"][metric]))
    if valid:
        return min(HUMAN_SCORE_MAX, max(0, round_half_up(sum(valid) / len(valid)))), None
    if errors:
        return None, errors[0]
    return None, None


# --------------------------------------------------------------------------- what the judge sees


def reference_contexts(query: Query, docs: Mapping[str, Document]) -> list[Context]:
    """The gold passages of a query as judge contexts (see the module docstring): its relevant
    documents in full, highest grade first (ties in the query's order), then documents its
    evidence points into that are not relevant-listed. Numbered 1..n."""
    order = {d: i for i, d in enumerate(query.relevant)}
    doc_ids = sorted(query.relevant, key=lambda d: (-query.relevant[d], order[d]))
    for span in query.evidence:
        if span.doc_id not in doc_ids:
            doc_ids.append(span.doc_id)
    return [
        Context(n=i, chunk_id=d, doc_id=d, start=0, end=len(docs[d].text), text=docs[d].text)
        for i, d in enumerate((d for d in doc_ids if d in docs), start=1)
    ]


def judge_input(query: Query, docs: Mapping[str, Document], answer: str) -> JudgeInput:
    """What the judge is asked about an answer that this run did not produce (human-judged, or
    in the pairwise comparison): the query's gold passages as contexts, no citation pairs."""
    from rag_ablate.judges import JudgeInput

    return JudgeInput(
        query_id=query.query_id,
        question=query.query,
        answer=answer,
        contexts=reference_contexts(query, docs),
        references=list(query.reference_answers),
        citations=[],
    )


# --------------------------------------------------------------------------- the calibration


@dataclass
class CalibrationItem:
    """One human judgement and what the judge said about the same answer."""

    query_id: str
    rater: str | None
    answer: str
    human: dict[str, int]
    judge: dict[str, int | None]  # the judge's score per metric the human scored
    errors: dict[str, str]  # metric -> why the judge failed on it (a judge error)
    not_judged: list[str] = field(default_factory=list)  # metrics the judge was not asked


@dataclass
class Calibration:
    model: str
    prompt_hash: str
    repeats: int
    n_judgements: int  # human judgements in the dataset
    n_answers: int  # distinct (query, answer) pairs judged
    metrics: list[Agreement]
    items: list[CalibrationItem]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt_hash": self.prompt_hash,
            "repeats": self.repeats,
            "n_judgements": self.n_judgements,
            "n_answers": self.n_answers,
            "contexts": "the query's relevant documents in full (docs/metrics.md, Judge calibration)",
            "judge_score": "mean of the valid repeat scores, rounded half up",
            "kappa": "Cohen's weighted kappa, quadratic weights, categories 0-5",
            "metrics": {a.metric: asdict(a) for a in self.metrics},
            "items": [asdict(i) for i in self.items],
        }

    def run_metrics(self) -> dict[str, float]:
        """``judge/<metric>/human_kappa``, ``human_exact``, ``human_within1``, ``human_n``
        (a statistic that is undefined is left out, never NaN)."""
        out: dict[str, float] = {}
        for a in self.metrics:
            out[f"judge/{a.metric}/human_n"] = float(a.n)
            for key, v in (("human_kappa", a.kappa), ("human_exact", a.exact), ("human_within1", a.within1)):
                if v is not None:
                    out[f"judge/{a.metric}/{key}"] = v
        return out


def calibrate(
    judge: Judge, dataset: Dataset, run_metrics: Mapping[str, float] | None = None, *, concurrency: int = 1
) -> Calibration | None:
    """Judge every human-judged answer of ``dataset`` once (``concurrency`` calls in flight) and
    compare; None when the dataset has no human judgements."""
    judged = [(q, h) for q in dataset.queries for h in q.human_judgements]
    if not judged:
        return None
    todo = {(q.query_id, h.answer): q for q, h in judged}  # distinct answers, in dataset order
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = pool.map(
            lambda kq: judge.judge(judge_input(kq[1], dataset.documents, kq[0][1])), todo.items()
        )
        verdicts = dict(zip(todo, results, strict=True))
    items = [_item(q, h, verdicts[(q.query_id, h.answer)]) for q, h in judged]
    metrics = [_metric_agreement(m, items, run_metrics or {}) for m in human_metrics()]
    return Calibration(
        model=judge.model,
        prompt_hash=judge.prompt_hash,
        repeats=judge.repeats,
        n_judgements=len(judged),
        n_answers=len(verdicts),
        metrics=[a for a in metrics if a.n or a.judge_errors or a.not_judged],
        items=items,
    )


def _item(q: Query, h: HumanJudgement, verdict: Mapping[str, Any]) -> CalibrationItem:
    scores: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    not_judged: list[str] = []
    for metric in h.scores:
        score, error = judge_score(verdict, metric)
        scores[metric] = score
        if error is not None:
            errors[metric] = error
        elif score is None:
            not_judged.append(metric)
    return CalibrationItem(q.query_id, h.rater, h.answer, dict(h.scores), scores, errors, not_judged)


def _metric_agreement(metric: str, items: Sequence[CalibrationItem], run: Mapping[str, float]) -> Agreement:
    human: list[int] = []
    judge: list[int] = []
    errors = not_judged = 0
    for it in items:
        if metric not in it.human:
            continue
        score = it.judge.get(metric)
        if score is not None:
            human.append(it.human[metric])
            judge.append(score)
        elif metric in it.not_judged:
            not_judged += 1
        else:
            errors += 1
    a = agreement(metric, human, judge)
    a.judge_errors, a.not_judged = errors, not_judged
    a.repeat = {k: float(run[f"judge/{metric}/{k}"]) for k in REPEAT_KEYS if f"judge/{metric}/{k}" in run}
    return a


# --------------------------------------------------------------------------- outputs


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def format_markdown(cal: Calibration) -> str:
    """The agreement table of ``judge_calibration.md``."""
    lines = [
        f"# Judge calibration against human judgements ({cal.model}, prompt {cal.prompt_hash})",
        "",
        f"{cal.n_judgements} human judgements of {cal.n_answers} answers; judge repeats: {cal.repeats}. "
        "Kappa: Cohen's weighted kappa, quadratic weights, scores 0-5. Repeat agreement: the judge "
        "with itself over this run's answers (share of queries whose repeats agree exactly / within one).",
        "",
        "| metric | n | exact | within 1 | kappa | human mean | judge mean | judge errors | "
        "repeat exact | repeat within 1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in cal.metrics:
        kappa = _cell(a.kappa) if a.kappa is not None else f"- ({a.kappa_note})"
        lines.append(
            f"| {a.metric} | {a.n} | {_cell(a.exact)} | {_cell(a.within1)} | {kappa} | "
            f"{_cell(a.human_mean)} | {_cell(a.judge_mean)} | {a.judge_errors} | "
            f"{_cell(a.repeat.get('agreement_exact'))} | {_cell(a.repeat.get('agreement_within1'))} |"
        )
    skipped = [a for a in cal.metrics if a.not_judged]
    if skipped:
        lines += [
            "",
            *(f"- {a.metric}: {a.not_judged} human score(s) the judge was not asked" for a in skipped),
        ]
    return "\n".join(lines) + "\n"


def format_terminal(cal: Calibration) -> str:
    parts = []
    for a in cal.metrics:
        kappa = f"{a.kappa:.2f}" if a.kappa is not None else f"- ({a.kappa_note})"
        parts.append(
            f"{a.metric} n={a.n} exact {_cell(a.exact)} within1 {_cell(a.within1)} kappa {kappa}"
            + (f", {a.judge_errors} judge error(s)" if a.judge_errors else "")
        )
    return "judge vs human: " + "; ".join(parts)


def write_calibration(cal: Calibration, job_dir: Path) -> list[Path]:
    """``judge_calibration.json`` and ``judge_calibration.md`` in ``job_dir``."""
    j, md = job_dir / JUDGE_CALIBRATION_JSON, job_dir / JUDGE_CALIBRATION_MD
    write_json_atomic(j, cal.to_dict())
    write_text_atomic(md, format_markdown(cal))
    return [j, md]


def run_calibration(
    s: RunConfig,
    dataset: Dataset,
    cache: Cache | None,
    run_metrics: Mapping[str, float],
    job_dir: Path,
    *,
    echo: bool = True,
) -> dict[str, float]:
    """The runner's one call: with a pointwise judge and human judgements in the dataset, judge
    them, write the two files and return the run metrics to log; otherwise do nothing ({})."""
    if s.judge.name == "none" or s.judge.mode != "pointwise":
        return {}
    if not any(q.human_judgements for q in dataset.queries):
        return {}
    from rag_ablate.judges import JUDGES

    judge = JUDGES.get(s.judge.name)(s, cache)
    if judge is None or judge.mode != "pointwise":
        if judge is not None:
            judge.close()
        return {}
    try:  # a failure here propagates: the runner logs everything else, then ends the run non-zero
        cal = calibrate(judge, dataset, run_metrics, concurrency=s.judge.concurrency)
    finally:
        judge.close()
    if cal is None:
        return {}
    # the answers and judge errors as privacy.store_text / privacy.redact let them be stored
    from rag_ablate.core.privacy import Privacy

    guard = Privacy.from_config(s.privacy)
    cal.items = [guard.judged_answer(item) for item in cal.items]
    write_calibration(cal, job_dir)
    if echo:
        print(format_terminal(cal))
    return cal.run_metrics()
