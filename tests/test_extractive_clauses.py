"""The extractive generator on legal and news text: long sentences are quoted by their best clauses."""

from __future__ import annotations

from rag_ablate.config.schema import GeneratorConfig
from rag_ablate.generators.base import Context
from rag_ablate.generators.extractive import ExtractiveGenerator, clauses, cut_to_tokens
from rag_ablate.text.count import count_tokens

# one sentence of a judgment: 137 tokens between two 。, as legal text writes them
JUDGMENT = (
    "本院经审理查明，原告张某与被告某保险公司于2019年3月签订人身保险合同，约定保险期间为一年，"
    "保险金额为人民币30万元，被告应在事故发生后三十日内履行赔付义务，原告于2019年10月5日发生交通事故"
    "并于次日向被告报案，被告以原告未如实告知既往病史为由拒绝赔付，双方协商未果，原告遂诉至本院。"
)


def _one(text: str) -> list[Context]:
    return [Context(1, "J#0", "J", 0, len(text), text)]


def test_a_long_chinese_sentence_is_quoted_by_its_best_clauses_within_the_cap() -> None:
    assert count_tokens(JUDGMENT) > 100
    whole = ExtractiveGenerator(max_sentence_tokens=0).generate("被告为什么拒绝赔付？", _one(JUDGMENT))
    assert whole.answer == f"{JUDGMENT}[1]"  # 0: whole sentences, as before
    for cap, expected in (
        (
            60,
            "原告于2019年10月5日发生交通事故并于次日向被告报案，被告以原告未如实告知既往病史为由拒绝赔付，双方协商未果",
        ),
        (20, "被告以原告未如实告知既往病史为由拒绝赔付"),
    ):
        out = ExtractiveGenerator(max_sentence_tokens=cap).generate("被告为什么拒绝赔付？", _one(JUDGMENT))
        assert out.answer == f"{expected}[1]"
        assert count_tokens(expected) <= cap and expected in JUDGMENT  # bounded, quoted verbatim
        assert [c.chunk_id for c in out.citations] == ["J#0"]
    # the refusal is decided on the whole sentence: the cut never turns an answer into a refusal
    amount = ExtractiveGenerator(max_sentence_tokens=20).generate("保险金额是多少？", _one(JUDGMENT))
    assert amount.answer == "保险金额为人民币30万元[1]"
    # the default reads the cap from the config
    assert ExtractiveGenerator.from_config(GeneratorConfig()).max_sentence_tokens == 60


def test_english_clauses_split_after_a_comma_and_a_space_and_cut_at_a_word() -> None:
    sentence = "Fees of 3,500 dollars apply, unless waived: the refund takes 10:30 hours"
    assert [sentence[a:b] for a, b in clauses(sentence)] == [
        "Fees of 3,500 dollars apply,",
        " unless waived:",
        " the refund takes 10:30 hours",
    ]
    assert cut_to_tokens("one two three four", 2, cjk=False) == "one two"
    assert cut_to_tokens("退款需要五个工作日", 4, cjk=True) == "退款需要"
    long = ", ".join(f"clause {i} about nothing" for i in range(30)) + ", and refunds take five days."
    out = ExtractiveGenerator(max_sentence_tokens=12).generate("how long do refunds take", _one(long))
    assert (
        out.answer == "clause 29 about nothing, and refunds take five days. [1]"
    )  # the earliest best run of 12
