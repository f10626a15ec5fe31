"""The judge phase and the judged metrics (docs/metrics.md "Judged answers").

Per-query values come from hand-written ``record["judge"]`` values (the contract of
rag_ablate.judges); run metrics are checked against hand computations and scipy; a whole run
judges the answers of ``generator=extractive`` through ``judge=openai`` against the fake
OpenAI-compatible server of tests/fake_llm.py.
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import spearmanr

from rag_ablate.compare.analysis import judge_spread
from rag_ablate.config.schema import ModelPrice, RunConfig
from rag_ablate.core.layout import (
    COMPARISON_JSON,
    COMPARISON_MD,
    RECORDS_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    VARIANT_FILE,
)
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Document, Query
from rag_ablate.judges import JUDGE_METRICS
from rag_ablate.metrics.answers import AnswerScoring, answer_metrics, judge_support
from rag_ablate.metrics.registry import REGISTRY, default_compare_metrics, human_metrics, judged_metrics
from rag_ablate.run.judging import judge_run_metrics, metric_agreement, spearman
from tests.conftest import DOCS as CONFTEST_DOCS
from tests.conftest import run_module
from tests.fake_llm import FakeLLM

# --------------------------------------------------------------------------- per query

DOCS = {"D": Document("D", "Refunds take five days for cards. Shipping costs five dollars.")}
RETRIEVED = [
    {"rank": 1, "chunk_id": "D#0", "doc_id": "D", "start": 0, "end": 33, "score": 2.0},
    {"rank": 2, "chunk_id": "D#1", "doc_id": "D", "start": 34, "end": 62, "score": 1.0},
]
# sentence 1 cites [1] "Refunds take five days for cards." (lexically supported: 4/4 terms);
# sentence 2 cites [2] "Shipping costs five dollars." (terms shipping free mars: 1/3 < 0.5, unsupported)
ANSWER = "Refunds take five days. [1] Shipping is free to Mars. [2]"
CITATIONS = [{"chunk_id": "D#0"}, {"chunk_id": "D#1"}]


def _query(kind: str = "answerable", refs: tuple[str, ...] = ("Five days.",)) -> Query:
    return Query(
        query_id="q",
        query="how long do refunds take",
        relevant={"D": 1} if kind == "answerable" else {},
        evidence=(),
        answerable=kind == "answerable",
        requires_rag=kind != "no_rag",
        reference_answers=refs if kind == "answerable" else (),
        intent_l1=None,
        intent_l2=None,
        split="dev",
        group="q",
    )


def _repeat(
    faithfulness: Any = None,
    relevance: Any = None,
    completeness: Any = None,
    *,
    refusal: bool | None = False,
    support: list[bool] | None = None,
    errors: dict[str, str] | None = None,
    cached: bool = False,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    scores = {"faithfulness": faithfulness, "relevance": relevance, "completeness": completeness}
    return {
        "scores": scores,
        "errors": errors
        if errors is not None
        else {m: "not an integer 0-5" for m, v in scores.items() if v is None},
        "refusal": refusal,
        "support": support,
        "repaired": False,
        "cached": cached,
        "latency_ms": 10.0,
        "usage": usage,
        "usage_count": None,
    }


def _record(answer: str = ANSWER, *repeats: dict[str, Any], citations: Any = None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "query_id": "q",
        "status": "ok",
        "answer": answer,
        "citations": CITATIONS if citations is None else citations,
        "retrieved": RETRIEVED,
    }
    if repeats:
        rec["judge"] = {"model": "m", "prompt_hash": "0123abcd4567ef89", "repeats": list(repeats)}
    return rec


def _metrics(rec: dict[str, Any], query: Query | None = None) -> dict[str, float | None]:
    return answer_metrics(rec, query or _query(), DOCS, AnswerScoring())


def test_judged_metrics_are_means_over_repeats_and_failures_are_errors_not_zero() -> None:
    rec = _record(
        ANSWER,
        _repeat(4, 5, None, support=[True, False]),  # completeness unparsable
        _repeat(3, 5, 2, support=[True, True]),
        _repeat(None, 4, 4, refusal=True, support=[False, True], errors={"faithfulness": "HTTP 500"}),
    )
    got = _metrics(rec)
    # faithfulness (4 + 3) / 2 valid repeats, 1 of 3 failed; relevance (5 + 5 + 4) / 3;
    # completeness (2 + 4) / 2
    assert got["faithfulness"] == pytest.approx(3.5) and got["judge_error_faithfulness"] == pytest.approx(
        1 / 3
    )
    assert got["relevance"] == pytest.approx(14 / 3) and got["judge_error_relevance"] == 0.0
    assert got["completeness"] == pytest.approx(3.0) and got["judge_error_completeness"] == pytest.approx(
        1 / 3
    )
    # refusal verdicts F, F, T: the majority says it answers (and no refusal phrase)
    assert got["refusal"] == 0.0 and got["over_refusal"] == 0.0
    # support per pair: [T, T, F] -> T and [F, T, T] -> T: the judge overrides the lexical "unsupported"
    assert (got["citation_precision"], got["citation_coverage"]) == (1.0, 1.0)
    lexical = _metrics(_record(ANSWER))
    assert (lexical["citation_precision"], lexical["citation_coverage"]) == (0.5, 0.5)
    assert not any(k in lexical for k in ("faithfulness", "judge_error_faithfulness"))


def test_a_metric_every_repeat_failed_is_absent_with_error_rate_one() -> None:
    rec = _record(ANSWER, _repeat(None, 3, 5), _repeat("high", 2, True))  # a string, a bool: not scores
    got = _metrics(rec)
    assert "faithfulness" not in got and got["judge_error_faithfulness"] == 1.0
    assert got["completeness"] == 5.0 and got["judge_error_completeness"] == 0.5  # True is not a score


def test_completeness_only_where_the_query_has_references() -> None:
    rec = _record(ANSWER, _repeat(4, 4, None, errors={}))  # not asked: null without an error
    no_refs = _metrics(rec, _query(refs=()))
    assert "completeness" not in no_refs and "judge_error_completeness" not in no_refs
    assert no_refs["faithfulness"] == 4.0 and no_refs["judge_error_faithfulness"] == 0.0
    unanswerable = _metrics(rec, _query("unanswerable"))
    assert "completeness" not in unanswerable and unanswerable["relevance"] == 4.0


def test_refusal_is_the_judges_majority_else_the_phrase_rule_and_their_agreement_is_reported() -> None:
    plain = "Refunds take five days. [1]"
    declines = "The documents do not answer this question."
    unans = _query("unanswerable")
    # the judge's majority (2 of 3) says the answer declines: a refusal the phrase list misses
    judged = _record(
        plain, _repeat(3, 3, refusal=True), _repeat(3, 3, refusal=True), _repeat(3, 3, refusal=False)
    )
    got = _metrics(judged, unans)
    assert got["refusal"] == 1.0 and got["correct_refusal"] == 1.0
    assert got["refusal_rule_agreement"] == 0.0  # the phrase rule said it answers
    assert "citation_precision" not in got  # a refusal gets no citation metrics
    # a tie has no majority: the phrase rule alone decides, and there is no agreement to report
    tie = _metrics(_record(plain, _repeat(3, 3, refusal=True), _repeat(3, 3, refusal=False)), unans)
    assert tie["correct_refusal"] == 0.0 and "refusal_rule_agreement" not in tie
    # the judge's verdict wins over a phrase (it says the answer answers); failed verdicts do not vote
    phrase = _metrics(_record(declines, _repeat(0, 0, refusal=False), _repeat(0, 0, refusal=None)))
    assert phrase["over_refusal"] == 0.0 and phrase["refusal_rule_agreement"] == 0.0
    agree = _metrics(_record(declines, _repeat(0, 0, refusal=True)), unans)
    assert agree["correct_refusal"] == 1.0 and agree["refusal_rule_agreement"] == 1.0
    assert _metrics(_record(plain, _repeat(3, 3, refusal=None)))["refusal"] == 0.0


def test_judge_support_falls_back_to_the_lexical_rule_where_it_has_no_verdict() -> None:
    # the pairs: (sentence 0, [1]) lexically supported, (sentence 1, [2]) lexically not
    # a tie on pair 0 -> lexical (supported); pair 1 the judge says True twice -> supported
    tie = _record(ANSWER, _repeat(3, 3, support=[True, True]), _repeat(3, 3, support=[False, True]))
    assert judge_support(tie["judge"], 2) == [None, True]
    assert _metrics(tie)["citation_precision"] == 1.0
    # the judge says [1] does not support its sentence: precision 0 (the lexical rule said 1/2)
    no = _record(ANSWER, _repeat(3, 3, support=[False, False]))
    assert (_metrics(no)["citation_precision"], _metrics(no)["citation_coverage"]) == (0.0, 0.0)
    # a support list of the wrong length (or failed: None) is no verdict: the lexical rule decides
    wrong = _record(ANSWER, _repeat(3, 3, support=[False]), _repeat(3, 3, support=None))
    assert judge_support(wrong["judge"], 2) is None
    assert _metrics(wrong)["citation_precision"] == 0.5
    # a marker that points at nothing ([3] of two citations) supports nothing, whatever the judge says
    dangling = _record("Refunds take five days. [3]", _repeat(3, 3, support=[True]))
    assert _metrics(dangling)["citation_precision"] == 0.0


def test_judged_metrics_are_registered_and_compared_when_present() -> None:
    # the judge's metrics are the registry's judged ones, which a person may also score
    assert JUDGE_METRICS == judged_metrics() == human_metrics()
    assert JUDGE_METRICS == ("faithfulness", "relevance", "completeness")
    for m in JUDGE_METRICS:
        spec, err = REGISTRY[m], REGISTRY[f"judge_error_{m}"]
        assert (spec.direction, spec.binary, spec.takes_k, spec.family) == ("higher", False, False, "quality")
        assert (err.direction, err.binary, err.takes_k, err.family) == ("lower", False, False, "judge")
        assert m in default_compare_metrics() and f"judge_error_{m}" not in default_compare_metrics()


# --------------------------------------------------------------------------- run metrics


def _judged(answer: str, faith: list[int | None], *, cached: int = 0) -> dict[str, Any]:
    reps = [
        _repeat(
            f,
            4,
            None,
            errors=None if f is not None else {"faithfulness": "bad", "completeness": "bad"},
            cached=i < cached,
            usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        )
        for i, f in enumerate(faith)
    ]
    rec = _record(answer, *reps)
    rec["metrics"] = _metrics(rec)
    return rec


def test_agreement_spread_and_length_bias_by_hand_and_by_scipy() -> None:
    records = [
        _judged("one two three", [4, 4], cached=2),  # mean 4, length 3 tokens
        _judged("one two three four five", [3, 5]),  # mean 4, length 5
        _judged("one two", [2, 3]),  # mean 2.5, length 2
        _judged("a b c d e f g h", [5, None]),  # mean 5 (one valid repeat), length 8
        {"query_id": "f", "status": "failed", "answer": None, "metrics": {"latency_ms": 3.0}},
    ]
    got = judge_run_metrics(records, price=ModelPrice(prompt=2.0, completion=8.0))
    f = "judge/faithfulness/"
    # queries with >= 2 valid repeats: [4,4] [3,5] [2,3]; all equal: 1 of 3; within one point: 2 of 3
    assert got[f + "agreement_exact"] == pytest.approx(1 / 3)
    assert got[f + "agreement_within1"] == pytest.approx(2 / 3)
    # sample SDs: 0, |5-3|/sqrt(2) = sqrt(2), |3-2|/sqrt(2) = sqrt(0.5)
    assert got[f + "repeat_sd"] == pytest.approx((0 + math.sqrt(2) + math.sqrt(0.5)) / 3)
    # error rate: failed shares 0, 0, 0, 1/2 -> 1/8
    assert got[f + "error_rate"] == pytest.approx(0.125)
    # Spearman of means [4, 4, 2.5, 5] with lengths [3, 5, 2, 8]: ranks [2.5, 2.5, 1, 4] and [2, 3, 1, 4]
    rx, ry = np.array([2.5, 2.5, 1, 4]), np.array([2, 3, 1, 4])
    hand = float(np.corrcoef(rx, ry)[0, 1])
    assert got[f + "length_corr"] == pytest.approx(hand)
    assert got[f + "length_corr"] == pytest.approx(spearmanr([4, 4, 2.5, 5], [3, 5, 2, 8]).statistic)
    # relevance is 4 on every repeat: full agreement, no spread, and no length correlation (constant)
    r = "judge/relevance/"
    assert (got[r + "agreement_exact"], got[r + "repeat_sd"]) == (1.0, 0.0)
    assert r + "length_corr" not in got
    # calls: 8 repeats behind 4 judged answers, 2 replayed; tokens summed; money at 2 and 8 USD per 1M
    assert (got["judge/queries"], got["judge/calls"], got["judge/cache_hits"]) == (4.0, 8.0, 2.0)
    assert (got["judge/prompt_tokens"], got["judge/completion_tokens"]) == (800.0, 80.0)
    usd = (800 * 2.0 + 80 * 8.0) / 1e6
    assert got["judge/usd"] == pytest.approx(usd) and got["judge/usd_per_1k"] == pytest.approx(usd / 4 * 1000)
    assert not any(k.startswith("cost/") for k in got)  # evaluation cost stays apart from the system's
    assert "judge/usd" not in judge_run_metrics(records)  # no price: no money, tokens still counted


def test_length_corr_is_absent_below_three_answers_or_for_a_constant_side() -> None:
    two = [_judged("one two", [2, 2]), _judged("one two three", [4, 4])]
    assert "length_corr" not in metric_agreement(two, "faithfulness")
    same_length = [_judged("a b", [s, s]) for s in (1, 3, 5)]
    assert "length_corr" not in metric_agreement(same_length, "faithfulness")
    assert spearman([1, 2, 3], [3, 3, 3]) is None and spearman([1, 2], [1, 2]) is None
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert judge_run_metrics([_record(ANSWER)]) == {}  # nothing judged: no judge/ metrics at all


def test_comparison_rows_carry_the_judges_repeat_spread() -> None:
    base = {q: _judged("x y", s) for q, s in (("a", [4, 4]), ("b", [3, 5]))}
    var = {q: _judged("x y", s) for q, s in (("a", [2, 3]), ("b", [5, None]))}
    got = judge_spread("faithfulness", ["a", "b"], base, var)
    # baseline: SDs 0 and sqrt(2) -> mean sqrt(2)/2; variances 0, 2 over k = 2 -> mean 0.5
    # variant: only "a" has two valid repeats: SD sqrt(0.5), variance 0.5 / 2 = 0.25
    assert got["judge_repeat_sd_baseline"] == pytest.approx(math.sqrt(2) / 2)
    assert got["judge_repeat_sd_variant"] == pytest.approx(math.sqrt(0.5))
    assert got["judge_noise_se"] == pytest.approx(math.sqrt((0.5 + 0.25) / 2))
    assert judge_spread("token_f1", ["a", "b"], base, var) == {}


# --------------------------------------------------------------------------- a whole run


BROKEN_Q = "how long does express shipping take"  # every reply, repair included, is not JSON
REPAIRED_Q = "is water damage covered by the warranty"  # the first reply is broken, the repair is fine
REFUSED_Q = "who pays return shipping for a faulty item"  # the judge says the answer declines


def faith(question: str, repeat: int) -> int:
    """The scripted faithfulness score of a question's repeat: some repeats agree, some do not."""
    return (len(question) + repeat * (len(question) % 3)) % 6


class ScriptedJudge:
    """What the fake endpoint answers as the judge: deterministic per question and repeat."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}

    def __call__(self, body: dict[str, Any], call: int) -> str:
        messages = body["messages"]
        prompt = messages[0]["content"]
        question = prompt.split("Question:\n", 1)[1].split("\n", 1)[0]
        repair = len(messages) > 1
        with self.lock:  # a repeat is the n-th first call for the question (repeats run in order)
            if not repair:
                self.seen[question] = self.seen.get(question, 0) + 1
            repeat = self.seen[question] - 1
        if question == BROKEN_Q or (question == REPAIRED_Q and not repair):
            return "I think it is a 4 out of 5."
        found = re.search(r"a list of exactly (\d+) booleans", prompt)
        reply: dict[str, Any] = {
            "faithfulness": faith(question, repeat),
            "relevance": 4,
            "refusal": question == REFUSED_Q,
        }
        if '- "completeness"' in prompt:
            reply["completeness"] = 3
        if found:
            reply["support"] = [False] * int(found.group(1))  # the judge finds no citation supported
        return json.dumps(reply)


def _run(args: list[str], cwd: Path) -> None:
    proc = run_module("rag_ablate", args, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _job(out: Path) -> Path:
    (records,) = [p for p in out.rglob(RECORDS_FILE) if "mlartifacts" not in p.parts]
    return records.parent


def _read(job: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (job / RECORDS_FILE).read_text(encoding="utf-8").splitlines()]


def _mlflow(out: Path, job: Path) -> tuple[dict[str, float], dict[str, str]]:
    from mlflow.tracking import MlflowClient

    run_id = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    run = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}").get_run(run_id)
    return run.data.metrics, run.data.params


def _judge_args(url: str, out: Path, dataset: Path) -> list[str]:
    return [
        f"dataset.path={dataset}",
        "generator=extractive",
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=m",
        "judge.repeats=2",
        "judge.concurrency=2",
        "judge.max_error_rate=0.5",  # BROKEN_Q's judgements fail on purpose
        "+cost.prices={m: {prompt: 1.0, completion: 4.0}}",
        f"paths.output_root={out}",
        "progress=false",
    ]


@pytest.mark.slow
def test_a_judged_run_end_to_end_then_resume_judges_only_what_is_missing(
    fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path
) -> None:
    from rag_ablate.judges.openai import judge_prompt_hash

    fake_llm.respond = ScriptedJudge()
    out = tmp_path / "outputs"
    args = _judge_args(fake_llm.url, out, tiny_dataset)
    _run(args, tmp_path)
    job = _job(out)
    records = _read(job)
    judged = [r for r in records if r["status"] == "ok" and r.get("answer") is not None]
    assert judged and all(r["status"] == "ok" for r in records)
    assert all(len(r["judge"]["repeats"]) == 2 and r["judge"]["model"] == "m" for r in judged)
    assert not any("judge" in r for r in records if r not in judged)
    by_q = {r["query"]: r for r in judged}
    ds = load_dataset(str(tiny_dataset))
    queries = {q.query_id: q for q in ds.queries}
    overridden = 0
    assert {BROKEN_Q, REPAIRED_Q, REFUSED_Q} <= set(by_q)
    for q, r in by_q.items():
        m = r["metrics"]
        if q == BROKEN_Q:  # every repeat failed every key after its repair: errors, never 0, query ok
            assert "faithfulness" not in m and "relevance" not in m
            assert m["judge_error_faithfulness"] == m["judge_error_relevance"] == 1.0
            continue
        assert m["faithfulness"] == pytest.approx((faith(q, 0) + faith(q, 1)) / 2), q
        assert m["relevance"] == 4.0 and m["judge_error_faithfulness"] == 0.0
        if m["refusal"] == 0.0 and "citation_precision" in m:  # the judge's "unsupported" wins
            assert m["citation_precision"] == 0.0 and m["citation_coverage"] == 0.0
            lexical = answer_metrics(
                {**r, "judge": None}, queries[r["query_id"]], ds.documents, AnswerScoring()
            )
            overridden += lexical["citation_precision"] > 0
    assert overridden  # the lexical rule found support where the judge found none
    assert by_q[REFUSED_Q]["metrics"]["refusal"] == 1.0 and by_q[REFUSED_Q]["metrics"]["over_refusal"] == 1.0
    assert all(rep["repaired"] for rep in by_q[REPAIRED_Q]["judge"]["repeats"])
    # the one query with a reference answer is the only one asked for completeness
    assert [q for q, r in by_q.items() if "completeness" in r["metrics"]] == [
        "how many days do I have to return an item"
    ]
    assert by_q["how many days do I have to return an item"]["metrics"]["completeness"] == 3.0

    # every call reached the server once: two repeats per answer, plus a repair for each broken reply
    n_repairs = 4  # BROKEN_Q and REPAIRED_Q, two repeats each
    assert len(fake_llm.requests) == 2 * len(judged) + n_repairs
    metrics, params = _mlflow(out, job)
    assert (metrics["judge/queries"], metrics["judge/calls"]) == (len(judged), 2 * len(judged))
    assert metrics["judge/repairs"] == n_repairs and metrics["judge/cache_hits"] == 0
    scored_q = [q for q in by_q if q != BROKEN_Q]
    exact = [faith(q, 0) == faith(q, 1) for q in scored_q]
    within = [abs(faith(q, 0) - faith(q, 1)) <= 1 for q in scored_q]
    assert metrics["judge/faithfulness/agreement_exact"] == pytest.approx(sum(exact) / len(scored_q))
    assert metrics["judge/faithfulness/agreement_within1"] == pytest.approx(sum(within) / len(scored_q))
    assert metrics["judge/faithfulness/error_rate"] == pytest.approx(1 / len(judged))
    tokens = [rep["usage"] for r in judged for rep in r["judge"]["repeats"] if rep["usage"]]
    usd = sum(u["prompt_tokens"] * 1.0 + u["completion_tokens"] * 4.0 for u in tokens) / 1e6
    assert metrics["judge/usd_per_1k"] == pytest.approx(usd / len(judged) * 1000)
    assert not any(k.startswith("cost/usd") for k in metrics)  # cost.model unset: the system costs nothing
    assert any(k.endswith("/faithfulness") for k in metrics)  # per split, like every compared metric
    cfg = _composed("judge=openai", f"judge.base_url={fake_llm.url}", "judge.model=m").judge
    assert params["judge.prompt_hash"] == judge_prompt_hash(cfg)
    assert (params["judge.name"], params["judge.model"], params["judge.repeats"]) == ("openai", "m", "2")

    # an interrupted judge phase: three answers lost their judgement; resume= judges only those
    missing = {r["query_id"] for r in judged[:3]}
    kept = [{**r, "judge": None, "metrics": {}} if r["query_id"] in missing else r for r in records]
    (job / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    (job / SUMMARY_FILE).unlink()
    before = len(fake_llm.requests)
    _run([f"resume={job}", "cache.enabled=false", "progress=false"], tmp_path)
    again = _read(job)
    asked = {
        r["body"]["messages"][0]["content"].split("Question:\n", 1)[1].split("\n", 1)[0]
        for r in fake_llm.requests[before:]
    }
    assert asked == {r["query"] for r in judged if r["query_id"] in missing}
    assert [r["judge"] for r in again if r["query_id"] not in missing] == [
        r["judge"] for r in records if r["query_id"] not in missing
    ]
    judged_ids = {r["query_id"] for r in judged}
    assert all(r["judge"] is not None for r in again if r["query_id"] in judged_ids)
    metrics2, _ = _mlflow(out, job)
    assert metrics2["judge/calls"] == metrics["judge/calls"]


def _composed(*overrides: str) -> RunConfig:
    """The settings a run composes from conf/ (with the judge's templates and rubric)."""
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_settings(compose("config", overrides=normalize_overrides(list(overrides))))


def _sweep(args: list[str], cwd: Path) -> Path:
    _run(["-m", *args, "tracking=none", "progress=false", "compare.B=200"], cwd)
    (folder,) = (cwd / "outputs" / "multirun").iterdir()
    return folder


@pytest.mark.slow
def test_a_sweep_over_generators_with_a_judge_has_faithfulness_rows(
    fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path
) -> None:
    fake_llm.respond = ScriptedJudge()
    args = [
        a
        for a in _judge_args(fake_llm.url, tmp_path / "outputs", tiny_dataset)
        if a != "generator=extractive"
    ]
    sweep = _sweep(["generator=none,extractive", *args], tmp_path)
    rows = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))["rows"]
    faith_rows = [r for r in rows if r["metric"] == "faithfulness"]
    assert faith_rows and {r["split"] for r in faith_rows} <= {"dev", "holdout"}
    # generator=none has no answers to judge: the row says why instead of inventing a number
    assert all(r["note"] == "no value in baseline" and r["effect"] is None for r in faith_rows)
    assert [r for r in rows if r["metric"] == "correct_refusal"]  # the deterministic rows are still there
    base = json.loads((sweep / "0" / SUMMARY_FILE).read_text(encoding="utf-8"))["metrics"]
    assert not any(k.startswith("judge/") for k in base)  # nothing judged: no judge metrics at all
    var = json.loads((sweep / "1" / SUMMARY_FILE).read_text(encoding="utf-8"))["metrics"]
    assert var["judge/calls"] > 0 and "all/faithfulness" in var


@pytest.mark.slow
def test_the_comparison_shows_the_judges_repeat_spread_next_to_the_ci(
    fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path
) -> None:
    fake_llm.respond = ScriptedJudge()
    args = _judge_args(fake_llm.url, tmp_path / "outputs", tiny_dataset)
    sweep = _sweep(["generator.max_sentences=1,2", *args], tmp_path)
    comparison = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))
    rows = [r for r in comparison["rows"] if r["metric"] == "faithfulness" and r["note"] == ""]
    assert rows
    variants = {
        json.loads((sweep / d / VARIANT_FILE).read_text(encoding="utf-8"))["label"]: _read(sweep / d)
        for d in ("0", "1")
    }
    for row in rows:  # recomputed from the records of both sides
        base = {r["query_id"]: r for r in variants[comparison["baseline"]] if r["split"] == row["split"]}
        var = {r["query_id"]: r for r in variants[row["variant"]] if r["split"] == row["split"]}
        qids = [
            q for q in base if "faithfulness" in base[q]["metrics"] and "faithfulness" in var[q]["metrics"]
        ]
        assert row["n_queries"] == len(qids)
        expected = judge_spread("faithfulness", qids, base, var)
        assert row["judge_noise_se"] == pytest.approx(expected["judge_noise_se"])
        assert row["judge_repeat_sd_baseline"] == pytest.approx(expected["judge_repeat_sd_baseline"])
    assert all(r["judge_noise_se"] is None for r in comparison["rows"] if r["metric"] == "token_f1")
    md = (sweep / COMPARISON_MD).read_text(encoding="utf-8")
    assert "## Judge repeat spread" in md and "judge-noise SE" in md


def test_judge_records_judges_only_answers_without_a_judgement_and_records_a_failed_call(
    fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path
) -> None:
    from rag_ablate.core.cache import Cache
    from rag_ablate.judges import JUDGES
    from rag_ablate.run.judging import judge_input, judge_records

    fake_llm.respond = ScriptedJudge()
    fake_llm.failures = [(500, {})]  # the first call fails (no retries): that repeat's every key failed
    ds = load_dataset(str(tiny_dataset))
    by_id = {q.query_id: q for q in ds.queries}
    ret = {"rank": 1, "chunk_id": "RET#0", "doc_id": "RET", "start": 0, "end": 53, "score": 3.0}
    ship = {"rank": 2, "chunk_id": "SHIP#0", "doc_id": "SHIP", "start": 46, "end": 156, "score": 1.0}
    answer = "You can return most items within 30 days. [1] Express shipping arrives the next day. [2]"
    base = {
        "status": "ok",
        "retrieved": [ret, ship],
        "citations": [{"chunk_id": "RET#0"}, {"doc_id": "SHIP"}],
    }
    earlier = {"model": "m", "prompt_hash": "x", "repeats": [_repeat(5, 5, 5)]}
    records = [
        {**base, "query_id": "q1", "query": by_id["q1"].query, "answer": answer},
        {**base, "query_id": "q3", "query": by_id["q3"].query, "answer": answer, "judge": earlier},
        {**base, "query_id": "q4", "query": by_id["q4"].query, "answer": None},
        {**base, "query_id": "q5", "query": by_id["q5"].query, "status": "timeout", "answer": None},
    ]
    inp = judge_input(records[0], by_id["q1"], ds.documents, max_contexts=1)
    assert inp is not None and [c.text for c in inp.contexts] == [DOCS_TEXT["RET"][:53]]
    # [1] cites the RET chunk by id, [2] the whole SHIP document; one pair per marker, in order
    assert inp.citations == [(0, DOCS_TEXT["RET"][:53]), (1, DOCS_TEXT["SHIP"])]
    assert inp.references == ["30 days"] and inp.question == by_id["q1"].query
    assert judge_input(records[2], by_id["q4"], ds.documents, 5) is None
    assert judge_input(records[3], by_id["q5"], ds.documents, 5) is None

    s = _composed("judge=openai", f"judge.base_url={fake_llm.url}", "judge.model=m", "judge.repeats=2")
    s.judge.retries = 0
    judge = JUDGES.get("openai")(s, Cache(tmp_path / "cache"))
    assert judge is not None
    written: list[dict[str, Any]] = []
    try:
        out = judge_records(
            records, judge, ds, ks=[1, 5], routed=False, on_record=written.append, concurrency=2
        )
    finally:
        judge.close()
    assert [r["query_id"] for r in written] == ["q1"] and out[1:3] == records[1:3]  # nothing else judged
    # the failed query is not judged; it names the judged metrics it misses, with None (never a 0)
    assert out[3] == {**records[3], "metrics": {"faithfulness": None, "relevance": None}}
    failed, ok = out[0]["judge"]["repeats"]
    assert failed["scores"] == {"faithfulness": None, "relevance": None, "completeness": None}
    assert (
        "500" in failed["errors"]["faithfulness"] and failed["refusal"] is None and failed["support"] is None
    )
    m = out[0]["metrics"]
    assert m["faithfulness"] == ok["scores"]["faithfulness"] and m["judge_error_faithfulness"] == 0.5
    assert m["completeness"] == 3.0 and out[0]["status"] == "ok" and "recall_at_5" in m
    assert ok["support"] == [False, False] and m["citation_precision"] == 0.0  # the judge's verdicts


DOCS_TEXT = {d["doc_id"]: d["text"] for d in CONFTEST_DOCS}
