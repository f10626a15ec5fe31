"""Answers: the extractive generator and the deterministic answer metrics (docs/metrics.md "Answers").

Every expected value below is worked out by hand in the comment next to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.dataset.model import Document, Query
from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context
from rag_ablate.generators.extractive import ExtractiveGenerator
from rag_ablate.metrics.answers import (
    AnswerScoring,
    answer_metrics,
    answer_sentences,
    answer_tokens,
    citation_scores,
    exact_match,
    supports,
    token_f1,
)
from rag_ablate.metrics.refusals import PhraseRule
from rag_ablate.metrics.registry import REGISTRY
from rag_ablate.text.count import count_tokens

# --------------------------------------------------------------------------- exact match and token F1


def test_tokens_are_characters_for_chinese_and_words_for_english() -> None:
    assert answer_tokens("Return shipping is FREE [1].") == ["return", "shipping", "is", "free"]
    # CJK punctuation never counts; a run of Latin letters or digits inside Chinese is one token
    assert answer_tokens("用GPT-4回答。") == ["用", "gpt", "4", "回", "答"]


def test_token_f1_english_is_word_overlap_max_over_references() -> None:
    refs = ["Return shipping is free for faulty items.", "We do."]
    # vs the first: 4 shared of 4 predicted and 7 gold -> P=1, R=4/7, F1 = 2*(4/7)/(1+4/7) = 8/11;
    # vs "We do.": nothing shared -> 0; the max is 8/11
    assert token_f1("Return shipping is free. [1]", refs) == pytest.approx(8 / 11)
    assert token_f1("We do [2]", refs) == 1.0
    assert token_f1("anything", []) == 0.0


def test_token_f1_chinese_is_character_overlap() -> None:
    # answer 五 个 工 作 日 (5), reference 退 款 需 要 五 个 工 作 日 (9): 5 shared -> P=1, R=5/9,
    # F1 = 2*(5/9)/(14/9) = 5/7
    assert token_f1("五个工作日。", ["退款需要五个工作日"]) == pytest.approx(5 / 7)
    # a repeated character counts as often as it occurs on both sides (multisets): 好好 vs 好 -> P=1/2, R=1
    assert token_f1("好好", ["好"]) == pytest.approx(2 / 3)


def test_exact_match_ignores_case_punctuation_spacing_and_markers() -> None:
    assert exact_match("Return shipping is FREE! [1]", ["return shipping is free."]) == 1.0
    assert exact_match("Return shipping is free, mostly.", ["return shipping is free."]) == 0.0
    assert exact_match("一般5至7天送达。[1]", ["我们包邮", "一般 5 至 7 天送达"]) == 1.0
    assert exact_match("一般5到7天送达。", ["一般5至7天送达"]) == 0.0


# --------------------------------------------------------------------------- refusals


def test_refusal_phrases_in_both_languages() -> None:
    rule = PhraseRule()
    assert rule.refuses("文档中没有找到这个问题的答案。")
    assert rule.refuses("抱歉，我无法回答这个问题。")
    assert rule.refuses("Sorry, I DON'T KNOW.")
    assert rule.refuses("The documents do not answer this question.")
    assert not rule.refuses("Refunds take five days. [1]")
    assert not rule.refuses("退款会在五个工作日内到账。[1]")
    assert PhraseRule(["no idea"]).refuses("No idea.") and not rule.refuses("No idea.")


def _query(kind: str, refs: tuple[str, ...] = ()) -> Query:
    return Query(
        query_id="q",
        query="how long do refunds take",
        relevant={"D": 1} if kind == "answerable" else {},
        evidence=(),
        answerable=kind == "answerable",
        requires_rag=kind != "no_rag",
        reference_answers=refs,
        intent_l1=None,
        intent_l2=None,
        split="dev",
        group="q",
    )


DOCS = {"D": Document("D", "Refunds take five days for cards. Shipping costs five dollars.")}


def _record(answer: str, citations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    retrieved = [{"rank": 1, "chunk_id": "D#0", "doc_id": "D", "start": 0, "end": 33, "score": 1.0}]
    return {"answer": answer, "citations": citations or [], "retrieved": retrieved, "status": "ok"}


def test_correct_refusal_on_unanswerable_over_refusal_on_answerable_neither_on_chit_chat() -> None:
    scoring = AnswerScoring()
    refusal = _record("The documents do not answer this question.")
    answer = _record("Refunds take five days. [1]", [{"chunk_id": "D#0"}])
    assert answer_metrics(refusal, _query("unanswerable"), DOCS, scoring) == {
        "refusal": 1.0,
        "correct_refusal": 1.0,
        "asked_clarification": 0.0,
        "answer_language_match": 1.0,  # an English question, an English answer
    }
    assert answer_metrics(answer, _query("unanswerable"), DOCS, scoring)["correct_refusal"] == 0.0
    refs = ("Five days.",)
    got = answer_metrics(refusal, _query("answerable", refs), DOCS, scoring)
    assert (got["over_refusal"], got["token_f1"], got["exact_match"]) == (1.0, 0.0, 0.0)
    assert "citation_coverage" not in got  # a refusal has no sentences to cite for
    got = answer_metrics(answer, _query("answerable", refs), DOCS, scoring)
    # "refunds take five days" vs "five days": 2 shared -> P=2/4, R=1, F1=2/3; the chunk
    # D#0 (the first sentence of D) holds every term of the sentence: precision = coverage = 1
    assert got == pytest.approx(
        {
            "refusal": 0.0,
            "asked_clarification": 0.0,
            "answer_language_match": 1.0,
            "over_refusal": 0.0,
            "exact_match": 0.0,
            "token_f1": 2 / 3,
            "reference_in_answer": 1.0,  # "five days" occurs in "refunds take five days"
            "reference_recall": 1.0,
            "citation_precision": 1.0,
            "citation_coverage": 1.0,
        }
    )
    chat = answer_metrics(refusal, _query("no_rag"), DOCS, scoring)
    # chit-chat: neither correct_refusal nor over_refusal
    assert chat == {"refusal": 1.0, "asked_clarification": 0.0, "answer_language_match": 1.0}


# --------------------------------------------------------------------------- citations


def test_markers_belong_to_the_sentence_they_follow() -> None:
    en = answer_sentences("Refunds take five days. [1] Shipping is free to Mars. [2][1]")
    assert [(s.text, s.markers) for s in en] == [
        ("Refunds take five days.", (1,)),
        ("Shipping is free to Mars.", (2, 1)),
    ]
    zh = answer_sentences("退款需要五个工作日。[1]运费由我们承担。[2]")
    assert [(s.text, s.markers) for s in zh] == [("退款需要五个工作日。", (1,)), ("运费由我们承担。", (2,))]


def test_citation_precision_and_coverage_english() -> None:
    answer = "Refunds take five days. [1] Shipping is free to Mars. [2]"
    sources = ["Refunds take five days for cards.", "Shipping costs five dollars."]
    # sentence 1: refund, take, five, day all in source 1 (4/4 >= 0.5): supported;
    # sentence 2: shipping, free, mars ("is", "to" are stopwords): only shipping in source 2 (1/3): not
    scores = citation_scores(answer, sources, 0.5)
    assert (scores.precision, scores.coverage) == (0.5, 0.5)
    # the same answer at a threshold of 1/3 counts sentence 2 as supported too
    assert citation_scores(answer, sources, 1 / 3).precision == 1.0
    # a marker with no citation behind it supports nothing; an uncited sentence lowers coverage only
    assert citation_scores("Refunds take five days. [3] Bye now.", sources, 0.5).precision == 0.0
    assert citation_scores("Refunds take five days. [1] Bye now.", sources, 0.5).coverage == 0.5
    assert citation_scores("Refunds take five days.", sources, 0.5).precision is None


def test_citation_precision_and_coverage_chinese() -> None:
    source = "退款会在五个工作日内退回。"
    # sentence 1: 退 款 需 要 五 工 作 日 (个 is a stopword); 6 of 8 in the source (需 要 are not): 0.75
    assert supports("退款需要五个工作日。", source, 0.5)
    assert not supports("退款需要五个工作日。", source, 0.8)
    # sentence 2: 运 费 由 我 们 承 担; none in the source
    scores = citation_scores("退款需要五个工作日。[1]运费由我们承担。[1]", [source], 0.5)
    assert (scores.precision, scores.coverage) == (0.5, 0.5)


# --------------------------------------------------------------------------- the extractive generator


def _contexts(*texts: str) -> list[Context]:
    return [Context(n, f"D{n}#0", f"D{n}", 0, len(t), t) for n, t in enumerate(texts, start=1)]


def test_extractive_quotes_supported_sentences_with_markers_and_counts_tokens() -> None:
    gen = ExtractiveGenerator()
    ctx = _contexts("Shipping is free. Gift card refunds are slow.", "Refunds take five days.")
    out = gen.generate("how many days do refunds take", ctx)
    # query terms: many, day, refund, take (how, do are stopwords). Context 2's sentence holds three
    # (3/4 > 0.4); context 1's second sentence holds "refund" only (1/4), quoted second; its first none
    assert out.answer == "Refunds take five days. [1] Gift card refunds are slow. [2]"
    assert [c.chunk_id for c in out.citations] == ["D2#0", "D1#0"]
    assert out.usage is not None and out.usage_count == "local"
    prompt = count_tokens("how many days do refunds take") + sum(count_tokens(c.text) for c in ctx)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (prompt, count_tokens(out.answer))


def test_extractive_refuses_below_the_support_threshold_in_the_query_language() -> None:
    gen = ExtractiveGenerator()
    # 退 款 几 工 作 日 需 要 vs the sentence's 退 款: 2/8 = 0.25 <= 0.4 -> the Chinese refusal
    zh = gen.generate("退款需要几个工作日？", _contexts("退款请联系客服。"))
    assert (zh.answer, zh.citations) == ("文档中没有找到这个问题的答案。", [])
    en = gen.generate("zebra xylophone", _contexts("Refunds take five days."))
    assert en.answer == "The documents do not answer this question."
    # a lower threshold answers the same Chinese query from the same chunk
    assert ExtractiveGenerator(min_support=0.2).generate(
        "退款需要几个工作日？", _contexts("退款请联系客服。")
    ).answer == ("退款请联系客服。[1]")


def test_every_answer_metric_is_registered() -> None:
    for name in ("exact_match", "token_f1", "correct_refusal", "over_refusal", "citation_precision"):
        assert name in REGISTRY and not REGISTRY[name].takes_k
    assert REGISTRY["over_refusal"].direction == "lower"
    assert {"none", "extractive"} <= set(GENERATORS.names())


# --------------------------------------------------------------------------- on the sample, end to end


@pytest.fixture
def sweep(sample_answers_sweep: dict[str, Any]) -> dict[str, Any]:
    """The sample with generator=extractive beside the baseline (generator=none), shared by the
    session (tests/conftest.py): read only."""
    return sample_answers_sweep


@pytest.mark.slow
def test_extractive_scores_on_the_sample_and_refuses_most_unanswerable(sweep: dict[str, Any]) -> None:
    extractive, baseline = sweep["jobs"]["generator=extractive"], sweep["jobs"]["baseline"]
    metrics = json.loads((extractive / "summary.json").read_text(encoding="utf-8"))["metrics"]
    assert metrics["all/token_f1"] > 0.0
    assert metrics["all/correct_refusal"] > 0.5
    base = json.loads((baseline / "summary.json").read_text(encoding="utf-8"))["metrics"]
    assert not any("refusal" in k or "token_f1" in k for k in base)  # generator=none: no answers
    rec = json.loads((extractive / "records.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert rec["answer"] and rec["usage_count"] == "local" and "generate" in rec["timings_ms"]


@pytest.mark.slow
def test_the_comparison_has_a_correct_refusal_row(sweep: dict[str, Any]) -> None:
    rows = json.loads((sweep["dir"] / "comparison.json").read_text(encoding="utf-8"))["rows"]
    refusal = [r for r in rows if r["metric"] == "correct_refusal" and r["variant"] == "generator=extractive"]
    assert {r["split"] for r in refusal} == {"dev", "holdout"}
    # generator=none has no answers: the row says why it is untested instead of inventing a 0
    assert all(r["note"] == "no value in baseline" and r["effect"] is None for r in refusal)
    # the sentence-answer and language metrics are compared too (registered default_compare)
    compared = {r["metric"] for r in rows}
    assert {"reference_in_answer", "reference_recall", "answer_language_match"} <= compared


def test_the_worked_example_in_docs_matches_the_code() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert "### Worked example: answers" in text and "token_f1 = 2 * (5/9) * (5/7)" in text
    ref = ["Return shipping is free for faulty items."]
    answer = "Return shipping is free. [1] You pay for other returns. [2]"
    assert token_f1(answer, ref) == pytest.approx(0.625) and exact_match(answer, ref) == 0.0
    scores = citation_scores(answer, [ref[0], "Shipping costs five dollars."], 0.5)
    assert (scores.precision, scores.coverage) == (0.5, 0.5)
    assert token_f1(
        "一般付款后5至7天送达。[1]", ["一般付款后5至7天送达，可在我的订单里查看物流。"]
    ) == pytest.approx(2 / 3)
