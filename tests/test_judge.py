"""judge=openai: rubric prompts in both languages, the contexts' shuffle, strict parsing with one
repair, judge errors, repeats and the cache, pairwise order agreement; against the deterministic
OpenAI-compatible server of tests/fake_llm.py (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import STORE_FILE, Cache
from rag_ablate.core.errors import ConfigError
from rag_ablate.generators.base import Context
from rag_ablate.judges import JUDGE_METRICS, JUDGES, JudgeInput
from rag_ablate.judges.openai import (
    OpenAIJudge,
    build_pairwise_prompt,
    build_prompt,
    judge_prompt_hash,
    load_object,
    parse_reply,
    renumber,
    shuffled_contexts,
)
from rag_ablate.metrics.answers import answer_sentences
from tests.conftest import REPO
from tests.fake_llm import FakeLLM

CANARY = "sk-canary-judge-5e81b7c0d2"  # a fake key: must never reach a file

CONTEXTS = [
    Context(1, "RET#0", "RET", 0, 50, "You can return most items within 30 days of delivery."),
    Context(
        2, "RET#1", "RET", 50, 120, "Refunds go back to the original payment method within 5 business days."
    ),
    Context(3, "SHIP#0", "SHIP", 0, 45, "Standard shipping takes 3 to 5 business days."),
    Context(
        4, "WARR#0", "WARR", 0, 60, "Electronics carry a one year warranty against manufacturing defects."
    ),
]
ANSWER = "You can return items within 30 days [1]. The refund arrives within 5 business days [2]."


def _input(**overrides: Any) -> JudgeInput:
    values: dict[str, Any] = {
        "query_id": "q-return-window",
        "question": "How long do I have to return an item?",
        "answer": ANSWER,
        "contexts": CONTEXTS,
        "references": ["Within 30 days of delivery."],
        "citations": [(0, CONTEXTS[0].text), (1, CONTEXTS[1].text)],
    }
    values.update(overrides)
    return JudgeInput(**values)


def _settings(url: str = "http://127.0.0.1:1/v1", **overrides: Any) -> RunConfig:
    """The shipped conf/judge/openai.yaml, pointed at the test server."""
    s = RunConfig()
    for key, value in OmegaConf.to_container(OmegaConf.load(REPO / "conf/judge/openai.yaml")).items():  # type: ignore[union-attr]
        setattr(s.judge, str(key), value)
    s.judge.base_url = url
    s.judge.model = "judge-model"
    s.judge.backoff_s = 0.01
    for key, value in overrides.items():
        setattr(s.judge, key, value)
    return s


_OPEN: list[OpenAIJudge] = []


def _judge(settings_: RunConfig, cache: Cache | None = None) -> OpenAIJudge:
    judge = JUDGES.get("openai")(settings_, cache)
    assert isinstance(judge, OpenAIJudge)
    _OPEN.append(judge)
    return judge


@pytest.fixture(autouse=True)
def _close_judges() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _prompt_of(body: dict[str, Any]) -> str:
    return str(body["messages"][0]["content"])


GOOD = '{"faithfulness": 5, "relevance": 4, "completeness": 3, "refusal": false, "support": [true, false]}'


# ---------------------------------------------------------------------- prompts


def test_english_prompt_holds_the_rubric_shuffled_passages_and_cited_pairs() -> None:
    s = _settings()
    p = build_prompt(s.judge, _input())
    order = shuffled_contexts(CONTEXTS, "q-return-window", 0, 5)
    label = {c.n: i for i, c in enumerate(order, 1)}
    assert p.lang == "en" and p.asked == JUDGE_METRICS and p.n_support == 2
    assert p.text.startswith("You are a strict and impartial grader")
    assert "Question:\nHow long do I have to return an item?\n" in p.text
    # the passages in the judge's order, renumbered 1..n
    shown = "\n\n".join(f"[{i}] {c.text}" for i, c in enumerate(order, 1))
    assert f"Passages the assistant was given:\n{shown}\n" in p.text
    # the answer's markers follow the passages' new numbers
    answer = (
        f"You can return items within 30 days [{label[1]}]. "
        f"The refund arrives within 5 business days [{label[2]}]."
    )
    assert f"Answer to grade (its [n] markers cite the passages above):\n{answer}\n" in p.text
    assert "- Within 30 days of delivery." in p.text
    assert (
        '1. Sentence: "You can return items within 30 days." / cited passage: '
        '"You can return most items within 30 days of delivery."\n'
        '2. Sentence: "The refund arrives within 5 business days." / cited passage: '
        '"Refunds go back to the original payment method within 5 business days."'
    ) in p.text
    # one rubric line per level, 0 first, with the shipped wording
    assert (
        "faithfulness:\n  0 = The answer contradicts the passages, or is made up entirely.\n  1 = " in p.text
    )
    assert "  5 = The answer covers every point of the reference answers (the wording may differ)." in p.text
    for metric in JUDGE_METRICS:
        levels = re.findall(rf"{metric}:\n((?:  \d = .*\n?)+)", p.text)[0]
        assert [line[2] for line in levels.strip("\n").split("\n")] == list("012345")
    assert '- "support": a list of exactly 2 booleans, one per cited pair' in p.text
    assert p.text.rstrip().endswith("else false")
    keys = re.findall(r'^- "(\w+)":', p.text, re.M)
    assert keys == ["faithfulness", "relevance", "completeness", "refusal", "support"]


def test_chinese_prompt_and_what_is_not_asked() -> None:
    s = _settings()
    answer = "收货后30天内可以退货[1]。"
    p = build_prompt(
        s.judge,
        _input(question="退货期限是多久？", answer=answer, references=[], citations=[(0, CONTEXTS[0].text)]),
    )
    assert p.lang == "zh" and p.asked == ("faithfulness", "relevance") and p.n_support == 1
    assert p.text.startswith("你是一名严格、公正的评分员")
    assert "问题：\n退货期限是多久？\n" in p.text
    assert "参考答案（正确回答应当包含的内容）：\n（无）\n" in p.text  # no references: completeness not asked
    assert "completeness" not in p.text
    assert "  0 = 回答与段落相矛盾，或完全是编造的。" in p.text
    assert "  1 = 回答停留在话题上，但没有给出所问的内容；拒绝作答得 1 分（拒绝是否正确另行判断）。" in p.text
    assert '1. 句子："收货后30天内可以退货。" / 引用的段落："You can return most items' in p.text
    assert '- "support": 恰好 1 个布尔值组成的列表' in p.text
    assert re.findall(r'^- "(\w+)":', p.text, re.M) == ["faithfulness", "relevance", "refusal", "support"]

    # no citations: no support key, the pairs section says so
    p = build_prompt(s.judge, _input(answer="Within 30 days.", citations=[]))
    assert p.n_support == 0 and '"support"' not in p.text
    assert "Cited pairs (a sentence of the answer and the passage it cites):\n(none)\n" in p.text


def test_prompt_hash_covers_every_template_and_rubric() -> None:
    s = _settings()
    h = judge_prompt_hash(s.judge)
    assert len(h) == 16 and judge_prompt_hash(_settings(temperature=0.7, repeats=3).judge) == h
    changed_rubric = {k: list(v) for k, v in s.judge.rubric_zh.items()}
    changed_rubric["completeness"][5] += "。"
    changes: list[tuple[str, Any]] = [
        ("rubric_zh", changed_rubric),
        ("prompt_en", s.judge.prompt_en + " "),
        ("pairwise_zh", s.judge.pairwise_zh + " "),
        ("repair_en", s.judge.repair_en + " "),
        ("citation_zh", s.judge.citation_zh + " "),
        ("keys_en", {**s.judge.keys_en, "refusal": "true or false"}),
        ("none_en", "(nothing)"),
    ]
    for field, value in changes:
        kwargs: dict[str, Any] = {field: value}
        assert judge_prompt_hash(_settings(**kwargs).judge) != h, field


def test_shuffle_is_reproducible_per_query_and_depends_on_the_seed() -> None:
    many = [Context(i, f"c{i}", "d", 0, 1, f"text {i}") for i in range(1, 9)]
    order = shuffled_contexts(many, "q1", 0, 8)
    assert order == shuffled_contexts(many, "q1", 0, 8)  # the same in every run and call
    orders = {tuple(c.n for c in shuffled_contexts(many, "q1", seed, 8)) for seed in range(10)}
    assert len(orders) >= 9  # 8! orders: ten seeds practically never collide
    by_query = {tuple(c.n for c in shuffled_contexts(many, f"q{i}", 0, 8)) for i in range(10)}
    assert len(by_query) >= 9
    assert [c.n for c in order] != list(range(1, 9))
    # only the top max_contexts are shown
    assert sorted(c.n for c in shuffled_contexts(many, "q1", 0, 3)) == [1, 2, 3]


@given(
    n=st.integers(1, 8),
    max_contexts=st.integers(1, 8),
    seed=st.integers(0, 10**6),
    qid=st.text(min_size=1, max_size=12),
    cited=st.lists(st.integers(1, 10), max_size=5),
)
@settings(max_examples=60, deadline=None)
def test_renumbered_markers_still_point_at_the_same_text(
    n: int, max_contexts: int, seed: int, qid: str, cited: list[int]
) -> None:
    contexts = [Context(i, f"c{i}", "d", 0, 1, f"passage {i}") for i in range(1, n + 1)]
    order = shuffled_contexts(contexts, qid, seed, max_contexts)
    assert sorted(c.n for c in order) == list(range(1, min(n, max_contexts) + 1))
    answer = " ".join(f"Claim {k} [{k}]." for k in cited)
    shown = renumber(answer, order)
    for k, mark in zip(cited, re.findall(r"\[(\d+|\?)\]", shown), strict=True):
        if k <= min(n, max_contexts):
            assert order[int(mark) - 1].text == f"passage {k}"
        else:
            assert mark == "?"  # a number that names no context shown


def test_renumber_handles_lists_of_markers() -> None:
    order = [CONTEXTS[2], CONTEXTS[0], CONTEXTS[1]]  # shown as [1]=3, [2]=1, [3]=2
    assert renumber("A [1, 2]. B [3]. C [1，3]. D [4].", order) == "A [2, 3]. B [1]. C [2, 1]. D [?]."


# ---------------------------------------------------------------------- strict parsing


NAMES = [*JUDGE_METRICS, "refusal", "support"]


def test_parse_a_good_reply_and_a_fenced_one() -> None:
    p = parse_reply(GOOD, NAMES, 2)
    assert p.errors == {}
    assert p.values == {
        "faithfulness": 5,
        "relevance": 4,
        "completeness": 3,
        "refusal": False,
        "support": [True, False],
    }
    fenced = f"```json\n{GOOD}\n```"
    assert parse_reply(fenced, NAMES, 2).values == p.values
    assert parse_reply(f"  ```\n{GOOD}```  ", NAMES, 2).values == p.values
    # keys not asked are ignored
    assert parse_reply('{"relevance": 0, "note": "x"}', ["relevance"]).values == {"relevance": 0}


@pytest.mark.parametrize(
    ("reply", "errors"),
    [
        (
            '{"faithfulness": "high", "relevance": 4.0, "completeness": 6, '
            '"refusal": "false", "support": [true]}',
            {
                "faithfulness": "not an integer 0-5: 'high'",
                "relevance": "not an integer 0-5: 4.0",
                "completeness": "not an integer 0-5: 6",
                "refusal": "not true or false: 'false'",
                "support": "a list of 1 values, expected 2 (one per cited pair)",
            },
        ),
        (
            '{"faithfulness": true, "relevance": -1, "completeness": "4", "support": [true, "yes"]}',
            {
                "faithfulness": "not an integer 0-5: true",
                "relevance": "not an integer 0-5: -1",
                "completeness": "not an integer 0-5: '4'",
                "refusal": "missing from the reply",
                "support": 'not a list of booleans: [true, "yes"]',
            },
        ),
    ],
)
def test_parse_invalid_keys_fail_one_by_one(reply: str, errors: dict[str, str]) -> None:
    p = parse_reply(reply, NAMES, 2)
    assert p.errors == errors and p.values == {}


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", "the reply is empty"),
        (f"Here is my grade: {GOOD}", "the reply is not valid JSON"),
        (f"{GOOD} I hope this helps.", "the reply is not valid JSON"),
        ("[5, 4, 3]", "the reply is JSON but not an object: [5, 4, 3]"),
        ("faithfulness: 5", "the reply is not valid JSON"),
        (f"```python\n{GOOD}\n```", "the reply is not valid JSON"),  # only a json (or bare) fence is stripped
    ],
)
def test_a_reply_that_is_not_one_json_object_fails_every_key(reply: str, message: str) -> None:
    p = parse_reply(reply, NAMES, 2)
    assert p.values == {} and set(p.errors) == set(NAMES)
    assert all(e.startswith(message) for e in p.errors.values()), p.errors
    with pytest.raises(ValueError, match=re.escape(message)):
        load_object(reply)


# ---------------------------------------------------------------------- the judge over HTTP


def test_judge_scores_one_answer(fake_llm: FakeLLM) -> None:
    fake_llm.respond = lambda body, call: GOOD
    result = _judge(_settings(fake_llm.url)).judge(_input())
    (req,) = fake_llm.requests
    body = req["body"]
    assert body["response_format"] == {"type": "json_object"} and body["temperature"] == 0.0
    assert body["stream"] is False and body["model"] == "judge-model" and len(body["messages"]) == 1
    assert result["model"] == "judge-model" and result["prompt_hash"] == judge_prompt_hash(_settings().judge)
    (rep,) = result["repeats"]
    assert rep["scores"] == {"faithfulness": 5, "relevance": 4, "completeness": 3}
    assert rep["errors"] == {} and rep["refusal"] is False and rep["support"] == [True, False]
    assert rep["repaired"] is False and rep["cached"] is False and rep["latency_ms"] > 0
    assert rep["usage"]["completion_tokens"] == len(GOOD.split()) and rep["usage_count"] is None
    json.dumps(result)  # records are JSON

    no_json_mode = _judge(_settings(fake_llm.url, json_mode=False))
    no_json_mode.judge(_input())
    assert "response_format" not in fake_llm.requests[-1]["body"]


def test_completeness_is_not_asked_without_references(fake_llm: FakeLLM) -> None:
    fake_llm.respond = lambda body, call: '{"faithfulness": 4, "relevance": 5, "refusal": false}'
    rep = _judge(_settings(fake_llm.url)).judge(_input(references=[], citations=[]))["repeats"][0]
    assert rep["scores"] == {"faithfulness": 4, "relevance": 5, "completeness": None}
    assert rep["errors"] == {} and rep["support"] is None and not rep["repaired"]
    assert len(fake_llm.requests) == 1


def test_repair_succeeds_on_the_second_reply(fake_llm: FakeLLM) -> None:
    replies = [
        'Sure! {"faithfulness": 5, "relevance": 4, "completeness": 3, '
        '"refusal": false, "support": [true, true]}',
        GOOD,
    ]
    fake_llm.respond = lambda body, call: replies[call - 1]
    rep = _judge(_settings(fake_llm.url)).judge(_input())["repeats"][0]
    assert rep["repaired"] is True and rep["errors"] == {}
    assert rep["scores"] == {"faithfulness": 5, "relevance": 4, "completeness": 3} and rep["support"] == [
        True,
        False,
    ]
    first, second = fake_llm.bodies()
    # the repair message follows the bad reply in the same conversation
    assert second["messages"][:2] == [first["messages"][0], {"role": "assistant", "content": replies[0]}]
    repair = second["messages"][2]
    assert repair["role"] == "user" and repair["content"].startswith(
        "Your reply could not be used: the reply is not valid JSON"
    )
    assert '- "support": a list of exactly 2 booleans' in repair["content"]
    assert rep["usage"]["total_tokens"] > 0 and rep["latency_ms"] > 0  # both calls counted


def test_a_key_still_invalid_after_repair_is_a_judge_error(fake_llm: FakeLLM) -> None:
    replies = [
        '{"faithfulness": 5, "relevance": "high", "completeness": 2, '
        '"refusal": false, "support": [true, false]}',
        '{"faithfulness": 1, "relevance": "very high", "completeness": 0, '
        '"refusal": true, "support": [false, false]}',
    ]
    fake_llm.respond = lambda body, call: replies[(call - 1) % 2]
    rep = _judge(_settings(fake_llm.url)).judge(_input())["repeats"][0]
    assert rep["repaired"] is True
    # the valid keys of the first reply stand; only relevance is asked again and fails again
    assert rep["scores"] == {"faithfulness": 5, "relevance": None, "completeness": 2}
    assert rep["errors"] == {"relevance": "not an integer 0-5: 'very high'"}
    assert rep["refusal"] is False and rep["support"] == [True, False]
    repair = fake_llm.bodies()[1]["messages"][2]["content"]
    assert repair.startswith("""Your reply could not be used: "relevance": not an integer 0-5: 'high'""")


def test_a_support_list_of_the_wrong_length_is_a_citation_support_error(fake_llm: FakeLLM) -> None:
    reply = (
        '{"faithfulness": 4, "relevance": 4, "completeness": 4, '
        '"refusal": false, "support": [true, true, true]}'
    )
    fake_llm.respond = lambda body, call: reply
    rep = _judge(_settings(fake_llm.url)).judge(_input())["repeats"][0]
    assert rep["scores"] == {"faithfulness": 4, "relevance": 4, "completeness": 4}
    assert rep["support"] is None
    assert rep["errors"] == {"citation_support": "a list of 3 values, expected 2 (one per cited pair)"}


def test_a_failed_call_is_an_error_for_every_key_never_a_zero(fake_llm: FakeLLM) -> None:
    fake_llm.failures = [(500, {})] * 2
    rep = _judge(_settings(fake_llm.url, retries=1)).judge(_input())["repeats"][0]
    assert rep["scores"] == {"faithfulness": None, "relevance": None, "completeness": None}
    assert set(rep["errors"]) == {"faithfulness", "relevance", "completeness", "refusal", "citation_support"}
    assert all(
        e.startswith("the judge call failed: judge endpoint") and "HTTP 500" in e
        for e in rep["errors"].values()
    )
    assert rep["refusal"] is None and rep["support"] is None and rep["usage"] is None


def test_a_failed_repair_call_keeps_the_first_reply_and_says_why(fake_llm: FakeLLM) -> None:
    fake_llm.usage = False  # and the server sends no usage: a local count, marked

    def respond(body: dict[str, Any], call: int) -> str:
        fake_llm.failures.append((503, {}))  # the next request (the repair) fails
        return '{"faithfulness": 3, "relevance": 9, "refusal": true}'

    fake_llm.respond = respond
    rep = _judge(_settings(fake_llm.url, retries=0)).judge(_input(citations=[]))["repeats"][0]
    assert rep["scores"] == {"faithfulness": 3, "relevance": None, "completeness": None}
    assert rep["errors"]["relevance"].startswith(
        "not an integer 0-5: 9; the repair call failed: judge endpoint"
    )
    assert rep["errors"]["completeness"].startswith("missing from the reply; the repair call failed")
    assert set(rep["errors"]) == {"relevance", "completeness"} and rep["refusal"] is True
    assert rep["repaired"] is True and len(fake_llm.requests) == 2
    assert rep["usage_count"] == "local" and rep["usage"]["completion_tokens"] > 0


def test_repeats_cache_and_a_changed_prompt(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.respond = lambda body, call: GOOD.replace('"relevance": 4', f'"relevance": {call % 6}')
    s = _settings(fake_llm.url, repeats=3)
    first = _judge(s, Cache(tmp_path / "cache")).judge(_input())
    assert [r["scores"]["relevance"] for r in first["repeats"]] == [1, 2, 3]  # three independent calls
    assert len(fake_llm.requests) == 3 and len({json.dumps(b) for b in fake_llm.bodies()}) == 1

    cache = Cache(tmp_path / "cache")  # a rerun replays every repeat, in any order
    again = _judge(s, cache).judge(_input())
    assert len(fake_llm.requests) == 3 and all(r["cached"] for r in again["repeats"])
    assert [r["scores"] for r in again["repeats"]] == [r["scores"] for r in first["repeats"]]
    assert [r["latency_ms"] for r in again["repeats"]] == [r["latency_ms"] for r in first["repeats"]]
    assert cache.metrics()["run/cache_llm_calls_hits"] == 3.0

    rubric = {k: list(v) for k, v in s.judge.rubric_en.items()}
    rubric["faithfulness"][0] = "The answer is wrong."
    changed = _judge(_settings(fake_llm.url, repeats=1, rubric_en=rubric), cache).judge(_input())
    assert changed["prompt_hash"] != first["prompt_hash"] and not changed["repeats"][0]["cached"]
    assert len(fake_llm.requests) == 4
    _judge(_settings(fake_llm.url, repeats=1, seed=1), cache).judge(_input())  # another shuffle: a new prompt
    assert len(fake_llm.requests) == 5


def test_the_key_never_reaches_the_cache(
    fake_llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_ABLATE_JUDGE_TEST_KEY", CANARY)
    fake_llm.respond = lambda body, call: GOOD if call % 2 == 0 else "not json"  # every judgement repaired
    judge = _judge(
        _settings(fake_llm.url, api_key_env="RAG_ABLATE_JUDGE_TEST_KEY", repeats=2), Cache(tmp_path)
    )
    result = judge.judge(_input())
    assert all(r["auth"] == f"Bearer {CANARY}" for r in fake_llm.requests) and len(fake_llm.requests) == 4
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == sorted(STORE_FILE + end for end in ("", "-shm", "-wal"))
    with contextlib.closing(sqlite3.connect(tmp_path / STORE_FILE)) as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone() == (4,)  # 2 repeats x (call + repair)
    for p in files:
        assert CANARY.encode() not in p.read_bytes(), p
    assert CANARY not in json.dumps(result)


# ---------------------------------------------------------------------- pairwise


BASE = "Items can be returned within 30 days of delivery [1]."
VARIANT = "Shipping takes 3 to 5 business days [3]."


def _answers(body: dict[str, Any]) -> tuple[str, str]:
    prompt = _prompt_of(body)
    first = prompt.split("Answer 1:\n", 1)[1].split("\n\nAnswer 2:\n", 1)[0]
    second = prompt.split("Answer 2:\n", 1)[1].split("\n\n", 1)[0]
    return first, second


def test_pairwise_win_needs_both_orders(fake_llm: FakeLLM) -> None:
    # a fair judge: prefers the answer that says "30 days", wherever it stands
    fake_llm.respond = lambda body, call: (
        '{"winner": "1"}' if "30 days" in _answers(body)[0] else '{"winner": 2}'
    )
    judge = _judge(_settings(fake_llm.url))
    result = judge.pairwise(_input(answer=BASE), VARIANT)
    assert result["winner"] == "a" and result["consistent"] is True
    assert [(o["first"], o["verdict"], o["error"]) for o in result["orders"]] == [
        ("a", "a", None),
        ("b", "a", None),
    ]
    one, two = fake_llm.bodies()
    order = shuffled_contexts(CONTEXTS, "q-return-window", 0, 5)
    label = {c.n: i for i, c in enumerate(order, 1)}
    base_shown = BASE.replace("[1]", f"[{label[1]}]")
    variant_shown = VARIANT.replace("[3]", f"[{label[3]}]")
    assert _answers(one) == (base_shown, variant_shown) and _answers(two) == (variant_shown, base_shown)
    for body in (one, two):  # names hidden: only "Answer 1" / "Answer 2"
        prompt = _prompt_of(body)
        assert "baseline" not in prompt.lower() and "variant" not in prompt.lower()
        assert body["response_format"] == {"type": "json_object"}
    assert '- "winner": "1" when Answer 1 is better' in _prompt_of(one)

    fake_llm.respond = lambda body, call: '{"winner": "tie"}'
    assert judge.pairwise(_input(answer=BASE), VARIANT)["winner"] == "tie"


def test_pairwise_position_bias_is_a_tie(fake_llm: FakeLLM) -> None:
    fake_llm.respond = lambda body, call: '{"winner": "1"}'  # always the first answer shown
    result = _judge(_settings(fake_llm.url)).pairwise(_input(answer=BASE), VARIANT)
    assert result["winner"] == "tie" and result["consistent"] is False
    assert [o["verdict"] for o in result["orders"]] == ["a", "b"]


def test_pairwise_failed_order_is_an_error_not_a_tie(fake_llm: FakeLLM) -> None:
    # the second order answers nonsense, also after its repair
    fake_llm.respond = lambda body, call: (
        '{"winner": "1"}' if _answers(body)[0].startswith("Items") else '{"winner": "Answer 2"}'
    )
    result = _judge(_settings(fake_llm.url)).pairwise(_input(answer=BASE), VARIANT)
    assert result["winner"] is None and result["consistent"] is None
    first, second = result["orders"]
    assert first["verdict"] == "a" and first["error"] is None
    assert second["verdict"] is None and second["error"] == """not "1", "2" or "tie": 'Answer 2'"""
    assert second["repaired"] is True and len(fake_llm.requests) == 3


def test_pairwise_prompt_in_chinese() -> None:
    p = build_pairwise_prompt(
        _settings().judge, _input(question="退货期限是多久？"), "三十天[1]。", "五天[2]。"
    )
    assert p.lang == "zh" and p.text.startswith("你是一名公正的评分员")
    assert "回答 1：\n三十天[" in p.text and "回答 2：\n五天[" in p.text
    assert '- "winner": 回答 1 更好时为 "1"' in p.text


# ---------------------------------------------------------------------- config


def test_judge_none_builds_nothing_and_the_default_is_none() -> None:
    assert RunConfig().judge.name == "none"
    assert JUDGES.get("none")(RunConfig(), None) is None
    assert set(JUDGES.names()) == {"none", "openai"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"base_url": "ftp://x"}, r"judge=openai needs judge\.base_url starting with http"),
        ({"model": None}, r"judge=openai needs judge\.model"),
        ({"mode": "listwise"}, r"judge\.mode must be one of pointwise \| pairwise, got 'listwise'"),
        ({"repeats": 0}, r"judge\.repeats must be >= 1, got 0"),
        ({"concurrency": 0}, r"judge\.concurrency must be >= 1"),
        ({"max_contexts": 0}, r"judge\.max_contexts must be >= 1"),
        ({"timeout_s": 0.0}, r"judge\.timeout_s must be > 0"),
        (
            {"prompt_en": "Grade {answer} by {rubric} as {keys}"},
            r"judge\.prompt_en must contain \{question\} and \{contexts\}",
        ),
        ({"repair_zh": "再来一次"}, r"judge\.repair_zh must contain \{error\} and \{keys\}"),
        (
            {"keys_zh": {"faithfulness": "x"}},
            r"judge\.keys_zh must describe the JSON keys relevance, completeness",
        ),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, Any], message: str) -> None:
    s = _settings(**overrides)
    if "model" in overrides:
        s.judge.model = overrides["model"]
    with pytest.raises(ConfigError, match=message):
        _judge(s)


def test_rubric_needs_six_levels_and_support_its_count() -> None:
    s = _settings()
    short = {k: list(v) for k, v in s.judge.rubric_en.items()}
    short["relevance"] = short["relevance"][:5]
    with pytest.raises(
        ConfigError, match=r"judge\.rubric_en\.relevance must hold 6 non-empty lines .* got 5"
    ):
        _judge(_settings(rubric_en=short))
    with pytest.raises(ConfigError, match=r"judge\.keys_en\.support must contain \{n\}"):
        _judge(_settings(keys_en={**s.judge.keys_en, "support": "a list of booleans"}))


def test_composed_config_selects_and_checks_the_judge() -> None:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()

    def compose_settings(*overrides: str) -> RunConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_settings(compose("config", overrides=normalize_overrides(list(overrides))))

    assert compose_settings().judge.name == "none"
    s = compose_settings("judge=openai", "judge.repeats=3")
    assert s.judge.temperature == 0.0 and s.judge.repeats == 3 and s.judge.json_mode is True
    assert [len(s.judge.rubric_zh[m]) for m in JUDGE_METRICS] == [6, 6, 6]
    with pytest.raises(ConfigError, match=r"judge\.mode must be one of pointwise \| pairwise, got 'both'"):
        compose_settings("judge=openai", "judge.mode=both")


def test_sentence_indexes_follow_answer_sentences() -> None:
    """JudgeInput.citations name sentences by their index in answer_sentences (the contract)."""
    sentences = answer_sentences(ANSWER)
    assert [s.markers for s in sentences] == [(1,), (2,)]
    pairs = [(i, CONTEXTS[n - 1].text) for i, s in enumerate(sentences) for n in s.markers]
    assert pairs == _input().citations
