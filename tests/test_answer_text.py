"""Answer metrics on real Chinese text (issue 26): refusals and clarification requests, sentence
answers against span references, numbers as tokens, and the answer's language.

Each worked-example table of docs/metrics.md ("Refusals and clarifications", "Sentence answers",
"answer_language_match") is read back and checked row by row against the code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import GeneratorConfig, MetricsConfig
from rag_ablate.dataset.model import Document, Query
from rag_ablate.metrics.answers import (
    AnswerScoring,
    answer_language_match,
    answer_metrics,
    answer_tokens,
    reference_in_answer,
    reference_recall,
    token_f1,
)
from rag_ablate.metrics.refusals import PhraseRule
from rag_ablate.text.normalize import han_share, normal_form, script_of

DOCS_MD = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

# the nine Chinese wordings of issue 26 (the first five are its own), then the seeds' own two
# and the English one
REFUSALS = [
    "根据提供的段落，无法确定该保险的理赔期限。",
    "段落中未提及退货运费由谁承担。",
    "资料中没有提到这一点。",
    "无法作答。",
    "信息不足以回答这个问题。",
    "抱歉，提供的文档里没有相关内容。",
    "上下文没有给出具体金额。",
    "文中并未涉及该产品的保修政策。",
    "给定的资料里找不到答案。",
    "资料不足",
    "暂无相关政策",
    "The passages do not contain the answer.",
    "The passages you provided don\u2019t mention it.",  # a typographic apostrophe
    "Passage 2 does not say when the trial ended.",
]
ANSWERS = [
    "价格不包含运费。",  # 不包含 about the price, not about the material
    "The package does not contain batteries.",
    "In this context the vaccine does not provide immunity.",  # the source word is not the subject
    "上传文件时没有相关限制。",  # 文件 (a file) is not the material the answer read
    "申请材料不包含身份证复印件。",
    "签收后7天内可以无理由退货。[1]",
    "Refunds take five days. [1]",
]


def _docs_table(heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` in docs/metrics.md, header row dropped."""
    text = DOCS_MD.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows[1:]


def _code(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("answer", REFUSALS)
def test_the_common_refusal_wordings_refuse(answer: str) -> None:
    assert PhraseRule().refuses(answer)
    assert not PhraseRule().asks_back(answer)


@pytest.mark.parametrize("answer", ANSWERS)
def test_answers_that_mention_a_negation_do_not_refuse(answer: str) -> None:
    assert not PhraseRule().refuses(answer)


def test_a_phrase_inside_text_copied_from_a_passage_is_no_refusal() -> None:
    # the legal set's false positive: the extractive answer quotes a judgment that mentions 无法找到
    passage = "本院认为，原告无法找到该保险产品的名称，故不予支持。"
    answer = "原告无法找到该保险产品的名称，故不予支持。[1]"
    rule = PhraseRule()
    assert rule.refuses(answer) and not rule.refuses(answer, [passage])
    # the phrase alone in a passage does not excuse the answer's own refusal sentence
    assert rule.refuses("文档中没有找到这个问题的答案。", ["订单没有找到时请联系客服。"])
    # scored from a record: the passage is the retrieved chunk's span of its document
    docs = {"J": Document("J", "判决书。" + passage)}
    chunk = {"rank": 1, "chunk_id": "J#0", "doc_id": "J", "start": 0, "end": 30, "score": 1.0}
    rec = {"answer": answer, "citations": [], "status": "ok", "retrieved": [chunk]}
    got = answer_metrics(rec, _query("unanswerable", question="保险产品叫什么？"), docs, AnswerScoring())
    assert got["refusal"] == 0.0 and got["correct_refusal"] == 0.0
    # a context entry that carries its own text (a service's chunk without offsets) counts too
    rec_ctx = {**rec, "retrieved": None, "context": [{"chunk_id": "c", "doc_id": None, "text": passage}]}
    assert answer_metrics(rec_ctx, _query("unanswerable"), {}, AnswerScoring())["refusal"] == 0.0


def test_configured_phrases_add_to_the_curated_sets() -> None:
    m = MetricsConfig(refusal_phrases=["本店不提供此服务"], clarification_phrases=["麻烦发一下订单号"])
    scoring = AnswerScoring.from_config(m)
    assert scoring.rule.refuses("本店不提供此服务。") and scoring.rule.refuses("无法作答。")
    assert scoring.rule.asks_back("麻烦发一下订单号。") and scoring.rule.asks_back("您是指哪一款？")
    assert not PhraseRule().refuses("本店不提供此服务。")
    # the extractive generator's own refusal sentences count, whatever they were set to say
    own = GeneratorConfig(name="extractive", refusal_en="Nothing on that, sorry.")
    assert AnswerScoring.from_config(MetricsConfig(), own).rule.refuses("Nothing on that, sorry.")
    assert not AnswerScoring.from_config(MetricsConfig()).rule.refuses("Nothing on that, sorry.")


def _query(
    kind: str, refs: tuple[str, ...] = (), behavior: Any = None, question: str = "退货运费谁出？"
) -> Query:
    return Query(
        query_id="q",
        query=question,
        relevant={"D": 1} if kind == "answerable" else {},
        evidence=(),
        answerable=kind == "answerable",
        requires_rag=True,
        reference_answers=refs,
        intent_l1=None,
        intent_l2=None,
        split="dev",
        group="q",
        expected_behavior=behavior,
    )


def _metrics(answer: str, query: Query) -> dict[str, float | None]:
    return answer_metrics({"answer": answer, "citations": None, "status": "ok"}, query, {}, AnswerScoring())


def test_expected_behaviour_decides_what_is_correct_and_clarification_has_its_own_metrics() -> None:
    ask = "请问您指的是哪一个订单？"
    clarify = _query("unanswerable", behavior="clarify")
    assert _metrics(ask, clarify) == {
        "refusal": 0.0,
        "asked_clarification": 1.0,
        "correct_clarification": 1.0,
        "answer_language_match": 1.0,
    }
    assert _metrics("无法作答。", clarify)["correct_clarification"] == 0.0
    # an answerable query the dataset marks refuse (out of scope): a refusal is correct there
    assert _metrics("无法作答。", _query("unanswerable", behavior="refuse"))["correct_refusal"] == 1.0
    # without expected_behavior the kind decides: answerable -> over_refusal, not clarification
    got = _metrics(ask, _query("answerable", refs=("7天",)))
    assert got["over_refusal"] == 0.0 and got["asked_clarification"] == 1.0
    assert "correct_clarification" not in got and "correct_refusal" not in got


def test_the_refusal_worked_example_in_docs_matches_the_code() -> None:
    rows = _docs_table("### Worked example: refusals")
    assert len(rows) >= 15
    rule = PhraseRule()
    for answer_cell, passage_cell, refusal, asked in rows:
        passages = _code(passage_cell)
        for answer in _code(answer_cell):
            assert rule.refuses(answer, passages) == (refusal == "1"), answer
            assert rule.asks_back(answer, passages) == (asked == "1"), answer


# --------------------------------------------------------------------------- sentence answers


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("三万五千元", "35000元"),
        ("3.5万元", "35000元"),
        ("3万5千元", "35000元"),
        ("３５,０００元", "35000元"),  # full-width digits and a thousands separator
        ("二〇二二年一月三日", "2022年1月3日"),
        ("2022-01-03", "2022年1月3日"),
        ("2022/1/3", "2022年1月3日"),
        ("1月3号", "1月3日"),
        ("百分之三十", "30%"),
        ("三百零五", "305"),
        ("一点五倍", "1.5倍"),
        ("3.50元", "3.5元"),
        ("千万不要", "千万不要"),  # not a number: a run starts with a digit or 十
    ],
)
def test_the_normal_form_writes_numbers_amounts_and_dates_one_way(text: str, normal: str) -> None:
    assert normal_form(text) == normal


def test_a_sentence_answer_contains_its_span_reference() -> None:
    sentence = "根据判决，合同于2022年1月3日生效。[1]"
    assert reference_in_answer(sentence, ["1月3日"]) == 1.0 and reference_recall(sentence, ["1月3日"]) == 1.0
    assert token_f1(sentence, ["1月3日"]) < 0.5  # what F1 alone said of it
    assert reference_in_answer("赔偿金额为三万五千元。", ["3.5万元"]) == 1.0
    assert reference_in_answer("合同于2022年1月13日生效。", ["1月3日"]) == 0.0  # 13 is not 3
    # in order and contiguous: the same characters elsewhere are recall, not containment
    assert reference_in_answer("日3月1", ["1月3日"]) == 0.0 and reference_recall("日3月1", ["1月3日"]) == 1.0
    # the best reference counts; a reference without tokens never matches
    assert reference_recall("运费自理", ["运费由商城承担", "自理"]) == 1.0
    assert reference_in_answer("运费自理", ["。", ""]) == 0.0


def test_numbers_and_decimals_stay_one_token_in_f1() -> None:
    assert answer_tokens("3.5万元") == ["3.5", "万", "元"]
    assert answer_tokens("Pay 35,000 or 1,2") == ["pay", "35000", "or", "1", "2"]
    # 3.5 is not 3 and 5: "3.5万元" vs "5万元" shares 万 元 only (P = R = 2/3)
    assert token_f1("3.5万元", ["5万元"]) == pytest.approx(2 / 3)


def test_the_sentence_answer_worked_example_in_docs_matches_the_code() -> None:
    rows = _docs_table("### Worked example: sentence answers")
    assert len(rows) == 4
    for answer_cell, ref_cell, contained, recall, f1 in rows:
        (answer,), (ref,) = _code(answer_cell), _code(ref_cell)
        assert reference_in_answer(answer, [ref]) == float(contained), answer
        num, _, den = recall.partition("/")
        assert reference_recall(answer, [ref]) == pytest.approx(float(num) / float(den or 1)), answer
        assert token_f1(answer, [ref]) == pytest.approx(float(f1), abs=0.005), answer


# --------------------------------------------------------------------------- answer language


def test_the_script_is_han_or_latin_by_share_with_latin_words_as_units() -> None:
    assert script_of("iPhone 15 Pro Max 的保修期是一年") == "han"  # 7 Han, 3 words
    assert script_of("When will it ship?") == "latin"
    assert script_of("48") is None and han_share("…") is None
    assert script_of("用GPT回答", threshold=0.8) == "latin"  # 3/4 below a threshold of 0.8
    assert answer_language_match("48", "forty-eight") is None  # the question has no script
    assert answer_language_match("退货运费谁出？", "The store pays. [1]") == 0.0


def test_the_language_worked_example_in_docs_matches_the_code() -> None:
    rows = _docs_table("### Worked example: answer language")
    assert len(rows) == 5
    for question_cell, answer_cell, _, match in rows:
        (question,), (answer,) = _code(question_cell), _code(answer_cell)
        assert answer_language_match(question, answer) == float(match), answer
    # metrics.han_share moves the line: at 0.7 the Apple Pay answer (6/9) reads as Latin
    scoring = AnswerScoring(han_share=0.7)
    got = answer_metrics(
        {"answer": "可以用 Apple Pay 或 PayPal 付款", "citations": None, "status": "ok"},
        _query("answerable", question="可以用什么付款？"),
        {},
        scoring,
    )
    assert got["answer_language_match"] == 0.0


# --------------------------------------------------------------------------- where they show


def test_the_new_metrics_are_end_table_columns_when_a_variant_answers() -> None:
    from rag_ablate.metrics.registry import measured_summary_metrics
    from rag_ablate.run.summary import summary_rows

    assert measured_summary_metrics() == [
        "reference_in_answer", "reference_recall", "correct_clarification", "answer_language_match"
    ]  # fmt: skip
    retrieval = {"label": "bm25", "metrics": {"dev/recall_at_5": 0.5, "holdout/recall_at_5": 0.25}}
    assert summary_rows([retrieval], ["recall_at_5"])[0] == ["variant", "recall@5", "ms p50 / p95", "failed"]
    answers = {
        "label": "extractive",
        "metrics": {"dev/reference_in_answer": 0.5, "holdout/reference_in_answer": 0.25,
                    "dev/answer_language_match": 1.0, "holdout/answer_language_match": 1.0},
    }  # fmt: skip
    headers, rows = summary_rows([retrieval, answers], ["recall_at_5"])
    assert headers[:4] == ["variant", "recall@5", "reference_in_answer", "answer_language_match"]
    assert rows[0][2] == "- / -" and rows[1][2] == "0.500 / 0.250"
