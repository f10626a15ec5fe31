"""Confidential corpora: privacy.store_text=false and privacy.redact=true (rag_ablate.core.privacy).

The detectors are checked on hand-worked examples in Chinese and English, negatives included
(order numbers, dates, prices, ids with a wrong check character, card-like numbers that fail the
Luhn check). The end-to-end tests run ``python -m rag_ablate`` (one run and a two-variant sweep
with its comparison and report) over a tiny corpus whose passages and queries carry unique canary
strings and personal data, then grep every file under the output folder (records, metrics,
comparison, report.html, .hydra, mlartifacts, the MLflow sqlite database's bytes) for them:
absent when they must be, present in the default mode (so the search can fail).
"""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.privacy import (
    PLACEHOLDERS,
    WITHHELD,
    Privacy,
    body_excerpts,
    cn_id_check_char,
    find_pii,
    is_cn_id,
    luhn_valid,
    redact_text,
    withhold_quotes,
)
from rag_ablate.core.retry import excerpt
from tests.conftest import run_module, write_dataset

# --------------------------------------------------------------------------- detectors


def test_cn_id_check_character_worked_by_hand() -> None:
    # 11010519491231002X: digits 1 1 0 1 0 5 1 9 4 9 1 2 3 1 0 0 2
    # weights                7 9 10 5 8 4 2 1 6 3 7 9 10 5 8 4 2
    # products 7+9+0+5+0+20+2+9+24+27+7+18+30+5+0+0+4 = 167; 167 mod 11 = 2 -> "10X98765432"[2] = X
    assert cn_id_check_char("11010519491231002") == "X"
    assert is_cn_id("11010519491231002X") and is_cn_id("11010519491231002x")
    # 44030819990101123: products 28+36+0+15+0+32+2+9+54+27+0+9+0+5+8+8+6 = 239; 239 mod 11 = 8 -> "4"
    assert cn_id_check_char("44030819990101123") == "4"
    assert is_cn_id("440308199901011234")
    assert not is_cn_id("440308199901011235")  # wrong check character
    assert not is_cn_id("11010519491231002Y")
    assert not is_cn_id("110105194902300021")  # 30 February is no birth date (check char aside)
    # ... but it is Luhn-valid: an 18-digit number that is no id can still be taken for a card
    assert redact_text("110105194902300021") == ("[CARD]", {"card": 1})


def test_luhn_worked_by_hand() -> None:
    # 79927398713 (the textbook case): from the right, doubled digits 1->2, 8->16->7, 3->6, 2->4, 9->18->9
    # sum 3 + 2 + 7 + 7 + 6 + 9 + 4 + 7 + 9 + 9 + 7 = 70 -> valid
    assert luhn_valid("79927398713")
    assert not luhn_valid("79927398710")
    assert luhn_valid("4111111111111111")
    assert not luhn_valid("4111111111111112")
    assert not luhn_valid("4111 1111")  # not digits


@pytest.mark.parametrize(
    ("text", "expected", "counts"),
    [
        # English
        (
            "Mail zhang.san@example.com or call +1 (415) 555-0100",
            "Mail [EMAIL] or call [PHONE]",
            {"email": 1, "phone": 1},
        ),
        ("Call (415) 555-0100 or 415-555-0100 today", "Call [PHONE] or [PHONE] today", {"phone": 2}),
        ("London office: +44 20 7946 0958.", "London office: [PHONE].", {"phone": 1}),
        ("Card 4111 1111 1111 1111 expires 2029", "Card [CARD] expires 2029", {"card": 1}),
        ("Amex 3782-822463-10005 on file", "Amex [CARD] on file", {"card": 1}),
        # Chinese
        (
            "请拨打 138 1234 5678，身份证 11010519491231002X",
            "请拨打 [PHONE]，身份证 [CN_ID]",
            {"phone": 1, "cn_id": 1},
        ),
        ("手机13912345678。", "手机[PHONE]。", {"phone": 1}),
        ("联系电话：+86 138-1234-5678 或 010-12345678", "联系电话：[PHONE] 或 [PHONE]", {"phone": 2}),
        ("邮箱li.si@example.cn，谢谢", "邮箱[EMAIL]，谢谢", {"email": 1}),
        (
            "卡号 4111-1111-1111-1111，订单号 20240501123456，价格 ¥1299.00",
            "卡号 [CARD]，订单号 20240501123456，价格 ¥1299.00",
            {"card": 1},
        ),
        ("退款到银行卡6222021381234567890", "退款到银行卡6222021381234567890", {}),  # fails Luhn
        # an e-mail made of a phone number is one e-mail
        ("13812345678@163.com", "[EMAIL]", {"email": 1}),
    ],
)
def test_redact_text_worked_examples(text: str, expected: str, counts: dict[str, int]) -> None:
    assert redact_text(text) == (expected, counts)


@pytest.mark.parametrize(
    "text",
    [
        "order 20240501123456 shipped",  # an order number (fails Luhn, 14 digits)
        "订单号：2024050112345678901",  # 19 digits, fails Luhn
        "4111 1111 1111 1112",  # card-like, fails Luhn
        "dates 2024-05-01 and 2024-06-01 12:30",
        "price $1,299.00, ¥1299.00, +12.5%, pi 3.1415926535897",
        "440308199901011235",  # an id with a wrong check character
        "110105194902300022",  # 30 February (and not Luhn-valid either)
        "123456789012345678",  # random 18 digits
        "version 1.13.2, room 415, year 2024, ext. 5550",
        "call 12345",  # too short to be a phone
        "user@localhost",  # no domain suffix
    ],
)
def test_no_false_positives(text: str) -> None:
    assert find_pii(text) == []
    assert redact_text(text) == (text, {})


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789 -.,:/年月日abc号"), max_size=40))
def test_redaction_is_idempotent_and_keeps_unflagged_text(text: str) -> None:
    once, counts = redact_text(text)
    assert redact_text(once) == (once, {})  # placeholders are never flagged again
    if not counts:
        assert once == text
    assert sum(counts.values()) == sum(once.count(PLACEHOLDERS[k]) for k in counts)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=10**17 - 1))
def test_only_ids_with_their_check_character_are_ids(n: int) -> None:
    first17 = f"{n:017d}"
    ok = first17 + cn_id_check_char(first17)
    wrong = [first17 + c for c in "0123456789X" if c != cn_id_check_char(first17)]
    assert not any(is_cn_id(w) for w in wrong)
    # an id needs a real birth date too: the redaction agrees with is_cn_id
    assert (redact_text(ok)[1].get("cn_id") == 1) == is_cn_id(ok)


# --------------------------------------------------------------------------- how Chinese text writes them


@pytest.mark.parametrize(
    ("text", "expected", "counts"),
    [
        ("手机１５９１２３４５６７８。", "手机[PHONE]。", {"phone": 1}),  # full-width digits
        ("电话 138.1234.5678，或 +86.139.1234.5678", "电话 [PHONE]，或 [PHONE]", {"phone": 2}),  # dotted
        ("Call 415.555.0100 or +44.20.7946.0958.", "Call [PHONE] or [PHONE].", {"phone": 2}),
        ("卡号,4111111111111111", "卡号,[CARD]", {"card": 1}),  # right after an ASCII comma
        ("card.4111111111111111.", "card.[CARD].", {"card": 1}),  # ... or a period
        ("卡号：4111\u00a01111\u00a01111\u00a01111。", "卡号：[CARD]。", {"card": 1}),  # no-break spaces
        ("Card 4111\u202f1111\u202f1111\u202f1111 ok", "Card [CARD] ok", {"card": 1}),  # narrow ones
        ("身份证 110105 19491231 002X", "身份证 [CN_ID]", {"cn_id": 1}),  # in groups
        ("id 110105-1949-1231-002x.", "id [CN_ID].", {"cn_id": 1}),
        ("身份证１１０１０５１９４９１２３１００２Ｘ", "身份证[CN_ID]", {"cn_id": 1}),  # full width
        ("邮箱 zhang＠example．com，谢谢", "邮箱 [EMAIL]，谢谢", {"email": 1}),  # full-width @ and .
        ("写信到zhang@例子.中国，谢谢", "写信到[EMAIL]，谢谢", {"email": 1}),  # internationalised domain
        ("mail a@münchen.de or b@xn--fsqu00a.xn--fiqs8s", "mail [EMAIL] or [EMAIL]", {"email": 2}),
        # still not personal data once normalised: amounts, decimals, dates, grouped order numbers
        ("价格 ￥１，２９９．００，pi 3.1415926535897", "价格 ￥１，２９９．００，pi 3.1415926535897", {}),
        (
            "日期 ２０２４－０５－０１，订单 2024 0501 1234 56",
            "日期 ２０２４－０５－０１，订单 2024 0501 1234 56",
            {},
        ),
        (
            "1,234,567,890,123,456 and 4111 1111 1111 1112",
            "1,234,567,890,123,456 and 4111 1111 1111 1112",
            {},
        ),
        ("id 110105 19491231 0021", "id 110105 19491231 0021", {}),  # wrong check character
    ],
)
def test_redact_text_reads_widths_and_separators(text: str, expected: str, counts: dict[str, int]) -> None:
    assert redact_text(text) == (expected, counts)


_SPACES = [" ", "\u00a0", "\u202f", "\u3000"]  # space, no-break, narrow no-break, ideographic


def _full_width(draw: st.DrawFn, text: str) -> str:
    """``text`` with each ASCII character written full width or not, at random."""
    wide = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(
        chr(ord(c) + 0xFEE0) if w and "!" <= c <= "~" else c for c, w in zip(text, wide, strict=True)
    )


def _digits(draw: st.DrawFn, n: int) -> str:
    return "".join(draw(st.lists(st.sampled_from("0123456789"), min_size=n, max_size=n)))


@st.composite
def _mobile(draw: st.DrawFn) -> str:
    number = "1" + draw(st.sampled_from("3456789")) + _digits(draw, 9)
    sep = draw(st.sampled_from(["", "-", ".", "－", "\u2013", *_SPACES]))
    prefix = draw(st.sampled_from(["", "+86 ", "+86-", "+86.", "＋８６ "]))
    return prefix + _full_width(draw, number[:3] + sep + number[3:7] + sep + number[7:])


@st.composite
def _card(draw: st.DrawFn) -> str:
    head = draw(st.sampled_from(["4", "51", "62"])) + _digits(draw, 12)
    head += draw(st.sampled_from([d for d in "0123456789" if luhn_valid(head + "0" + d)]))
    body = head + next(d for d in "0123456789" if luhn_valid(head + d))  # 15 + 1 check digit
    sep = draw(st.sampled_from(["", "-", "－", *_SPACES]))
    return _full_width(draw, sep.join(body[i : i + 4] for i in range(0, 16, 4)))


@st.composite
def _cn_id(draw: st.DrawFn) -> str:
    born = draw(st.dates(min_value=datetime.date(1900, 1, 1), max_value=datetime.date(2025, 12, 31)))
    first17 = (
        draw(st.sampled_from("123456789")) + _digits(draw, 5) + born.strftime("%Y%m%d") + _digits(draw, 3)
    )
    number = first17 + cn_id_check_char(first17)
    if number.endswith("X") and draw(st.booleans()):
        number = number[:-1] + "x"
    cuts = draw(st.sampled_from([(18,), (6, 8, 4), (6, 4, 4, 4), (3, 3, 4, 4, 4)]))
    sep = draw(st.sampled_from(["", "-", *_SPACES]))
    parts, at = [], 0
    for n in cuts:
        parts.append(number[at : at + n])
        at += n
    return _full_width(draw, sep.join(parts))


@st.composite
def _email(draw: st.DrawFn) -> str:
    local = draw(st.from_regex(r"[a-z][a-z0-9._]{0,8}[a-z0-9]", fullmatch=True))
    domain = draw(
        st.sampled_from(["example.com", "mail.163.com", "例子.中国", "münchen.de", "xn--fsqu00a.xn--fiqs8s"])
    )
    at = draw(st.sampled_from(["@", "＠", "﹫"]))
    dot = draw(st.sampled_from([".", "．"]))
    return local + at + domain.replace(".", dot)


@st.composite
def _other_phone(draw: st.DrawFn) -> str:
    sep = draw(st.sampled_from(["-", ".", "－"]))
    na = (
        f"{draw(st.sampled_from('23456789'))}{_digits(draw, 2)}{sep}{_digits(draw, 3)}{sep}{_digits(draw, 4)}"
    )
    intl = f"+44{sep}20{sep}{_digits(draw, 4)}{sep}{_digits(draw, 4)}"
    return _full_width(draw, draw(st.sampled_from([na, intl])))


_BEFORE = ["", "请拨打 ", "手机：", "卡号,", "卡号.", "身份证号码 ", "Call ", "card: ", "（", "mail "]
_AFTER = ["", "。", "，谢谢", " today.", "）", ", thanks"]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        [
            ("phone", _mobile()),
            ("card", _card()),
            ("cn_id", _cn_id()),
            ("email", _email()),
            ("phone", _other_phone()),
        ]
    ).flatmap(lambda p: st.tuples(st.just(p[0]), p[1])),
    st.sampled_from(_BEFORE),
    st.sampled_from(_AFTER),
)
def test_each_format_is_redacted_whatever_its_separators_and_widths(
    found: tuple[str, str], before: str, after: str
) -> None:
    kind, value = found
    text = before + value + after
    assert redact_text(text) == (before + PLACEHOLDERS[kind] + after, {kind: 1}), text


@st.composite
def _not_personal(draw: st.DrawFn) -> str:
    day = draw(st.dates(min_value=datetime.date(1900, 1, 1), max_value=datetime.date(2099, 12, 31)))
    amount = draw(st.integers(min_value=0, max_value=10**9))
    text = draw(
        st.sampled_from(
            [
                day.isoformat(),
                f"{day.year}年{day.month}月{day.day}日",
                day.strftime("%Y.%m.%d"),
                f"¥{amount:,}.{draw(st.integers(0, 99)):02d}",
                f"${amount / 100:,.2f}",
                str(draw(st.integers(min_value=0, max_value=10**10 - 1))),
                f"{amount}.{draw(st.integers(0, 10**6))}",
            ]
        )
    )
    return _full_width(draw, text)


@settings(max_examples=300, deadline=None)
@given(_not_personal(), st.sampled_from(_BEFORE), st.sampled_from(_AFTER))
def test_dates_amounts_and_ordinary_numbers_are_left_alone(value: str, before: str, after: str) -> None:
    text = before + value + after
    assert redact_text(text) == (text, {}), text


# --------------------------------------------------------------------------- records and messages


def test_store_text_false_drops_text_and_quotes_from_a_record() -> None:
    rec = {
        "query_id": "q1",
        "query": "where is my parcel zqx",
        "answer": "It is in Lyon.",
        "status": "bad_response",
        "error": 'eval: no \'retrieved\' list; body: {"echo": "where is my parcel zqx"}',
        "metrics": {"citation_precision": 1.0},
        "judge": {
            "repeats": [
                {"errors": {"relevance": "not an integer 0-5: 'It is in Lyon, France'"}, "scores": {}}
            ]
        },
    }
    out = Privacy(store_text=False).record(rec)
    assert "query" not in out and "answer" not in out
    assert "zqx" not in json.dumps(out) and "Lyon" not in json.dumps(out)
    assert out["error"].startswith("eval: no ")
    assert out["metrics"] == {"citation_precision": 1.0}  # computed before the text was dropped
    assert rec["query"] == "where is my parcel zqx"  # the record itself is left as it is


def test_redact_counts_add_up_across_a_resumed_record() -> None:
    guard = Privacy(redact=True)
    rec = {"query_id": "q1", "query": "mail a@example.com", "answer": "call 13812345678", "status": "ok"}
    once = guard.record(rec)
    assert once["query"] == "mail [EMAIL]" and once["answer"] == "call [PHONE]"
    assert once["redacted"] == {"email": 1, "phone": 1, "cn_id": 0, "card": 0}
    assert guard.record(once)["redacted"] == once["redacted"]  # read back by resume=: not counted twice
    assert guard.run_metrics([once, once])["privacy/redacted_total"] == 4.0


def test_judge_calibration_items_are_stored_like_records() -> None:
    from rag_ablate.judges.calibration import CalibrationItem

    item = CalibrationItem(
        "q1",
        "rater-1",
        "Mail zhang.san@example.com for refunds",
        {"relevance": 4},
        {"relevance": None},
        {"relevance": "the judge call failed: 'Mail zhang.san@example.com for refunds'"},
    )
    hidden = Privacy(store_text=False).judged_answer(item)
    assert hidden.answer == "" and "zhang" not in hidden.errors["relevance"]
    redacted = Privacy(redact=True).judged_answer(item)
    assert redacted.answer == "Mail [EMAIL] for refunds"
    assert redacted.errors["relevance"] == "the judge call failed: 'Mail [EMAIL] for refunds'"
    assert Privacy().judged_answer(item) is item


def test_withhold_quotes_and_excerpts() -> None:
    msg = "judge: HTTP 500; body: 'secret zqx passage text' and \"more\" for where is it"
    expected = f'judge: HTTP 500; body: {WITHHELD} and "more" for {WITHHELD}'  # short quotes name keys
    assert withhold_quotes(msg, ["where is it"]) == expected
    assert excerpt(b"zqx body") == "zqx body"
    with body_excerpts(False):
        assert excerpt(b"zqx body") == "<8 bytes, not quoted: privacy.store_text=false>"
    assert excerpt("zqx body") == "zqx body"


# --------------------------------------------------------------------------- end to end

DOCS = [
    {
        "doc_id": "D1",
        "title": "Contact desk",
        "text": "The support desk zqxpassagealpha answers mail at zhang.san@example.com within one day. "
        "Call the hotline +1 (415) 555-0100 for urgent refunds.",
    },
    {
        "doc_id": "D2",
        "title": "Refund hotline 客服",
        "text": "Refund hotline zqxpassagebeta 退款请联系客服，手机 138 1234 5678。"
        "Refund hotline identity check uses id 11010519491231002X.",
    },
    {
        "doc_id": "D3",
        "title": "Cards",
        "text": "Refunds zqxpassagegamma go back to card 4111 1111 1111 1111 after five business days.",
    },
    {
        "doc_id": "D4",
        "title": "Shipping",
        "text": "Standard shipping takes three days zqxpassagedelta. Express shipping arrives the next day.",
    },
]
QUERIES = [
    {
        "query_id": "c1",
        "query": "zqxquerykilo what mail address answers support desk mail",
        "relevant": {"D1": 2},
    },
    {"query_id": "c2", "query": "zqxquerylima refund hotline identity check id", "relevant": {"D2": 2}},
    {
        "query_id": "c3",
        "query": "zqxquerymike refunds to card 6222 0213 8123 4561 business days, mail wang.wu@example.org",
        "relevant": {"D3": 2},
    },
    {
        "query_id": "c4",
        "query": "zqxquerynovember express shipping, call 139-8765-4321, id 110105 19491231 002X",
        "relevant": {"D4": 2},
    },
    # the refund hotline of D2 ranks first, D1 (the gold) second: top_k=1 loses it (a recall flip)
    {"query_id": "c5", "query": "zqxqueryoscar refund hotline urgent", "relevant": {"D1": 2}},
    {
        "query_id": "c6",
        "query": "zqxquerypapa standard shipping days, 手机１５９.１２３４.５６７８ 邮箱 zhao＠例子.中国 "
        "卡号,4111\u00a01111\u00a01111\u00a01111",
        "relevant": {"D4": 2},
    },
]
QUERY_CANARIES = [f"zqxquery{w}" for w in ("kilo", "lima", "mike", "november", "oscar", "papa")]
PASSAGE_CANARIES = ["zqxpassagealpha", "zqxpassagebeta", "zqxpassagegamma", "zqxpassagedelta"]
PII = [
    "zhang.san@example.com",
    "wang.wu@example.org",
    "555-0100",
    "138 1234 5678",
    "139-8765-4321",
    "11010519491231002X",
    "4111 1111 1111 1111",
    "6222 0213 8123 4561",
    # full width, in groups, dotted, an internationalised domain, no-break spaces
    "110105 19491231 002X",
    "１５９.１２３４.５６７８",
    "zhao＠例子.中国",
    "4111\u00a01111\u00a01111\u00a01111",
]


def _forms(needle: str) -> list[bytes]:
    """The bytes a text can be stored as: UTF-8, and JSON with non-ASCII escaped."""
    return list(dict.fromkeys([needle.encode(), json.dumps(needle)[1:-1].encode()]))


def hits(root: Path, needles: list[str]) -> dict[str, list[str]]:
    """needle -> the files under ``root`` (every file: records, .hydra, mlartifacts, mlflow.db, ...)
    whose bytes contain it."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    data = {str(p.relative_to(root)): p.read_bytes() for p in files}
    return {n: sorted(name for name, b in data.items() if any(f in b for f in _forms(n))) for n in needles}


def _run(cwd: Path, dataset: Path, cache: Path, *args: str) -> None:
    common = [
        f"dataset.path={dataset}",
        "generator=extractive",
        "progress=false",
        f"cache.dir={cache}",  # the cache (chunk texts, index vocabularies) is kept outside the outputs
        "tracking.traces=all",
    ]
    proc = run_module("rag_ablate", [*args, *common], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def canary_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("canaries") / "ds", DOCS, QUERIES, with_intents=False)


def _outputs(tmp_path_factory: pytest.TempPathFactory, dataset: Path, *privacy: str) -> Path:
    """One run and a two-variant sweep (with its comparison and report) into one output folder."""
    cwd = tmp_path_factory.mktemp("run")
    cache = tmp_path_factory.mktemp("cache")
    _run(cwd, dataset, cache, *privacy)
    _run(cwd, dataset, cache, "-m", "retrieval.top_k=1,10", *privacy)
    return cwd / "outputs"


@pytest.fixture(scope="module")
def default_out(tmp_path_factory: pytest.TempPathFactory, canary_dataset: Path) -> Path:
    return _outputs(tmp_path_factory, canary_dataset)


@pytest.fixture(scope="module")
def no_text_out(tmp_path_factory: pytest.TempPathFactory, canary_dataset: Path) -> Path:
    return _outputs(tmp_path_factory, canary_dataset, "privacy.store_text=false")


@pytest.fixture(scope="module")
def redacted_out(tmp_path_factory: pytest.TempPathFactory, canary_dataset: Path) -> Path:
    return _outputs(tmp_path_factory, canary_dataset, "privacy.redact=true")


def _sweep(out: Path) -> Path:
    (sweep,) = list((out / "multirun").iterdir())
    return sweep


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in out.rglob("records.jsonl") for line in p.read_text().splitlines()]


@pytest.mark.slow
def test_default_mode_stores_the_text_so_the_search_can_fail(default_out: Path) -> None:
    found = hits(default_out, QUERY_CANARIES + PASSAGE_CANARIES + PII)
    assert all(found.values()), {n: f for n, f in found.items() if not f}
    assert "mlflow.db" in found["zqxquerykilo"]  # traces: the query text
    assert "mlflow.db" in found["zqxpassagebeta"]  # traces: the passages
    sweep = _sweep(default_out).relative_to(default_out)
    assert str(sweep / "comparison.json") in found["zqxqueryoscar"]  # flips quote the query
    assert str(sweep / "report.html") in found["zqxqueryoscar"]


@pytest.mark.slow
def test_store_text_false_stores_no_text_anywhere(no_text_out: Path) -> None:
    found = hits(no_text_out, QUERY_CANARIES + PASSAGE_CANARIES + PII)
    assert found == {n: [] for n in found}
    records = _records(no_text_out)
    assert records and all("query" not in r and "answer" not in r for r in records)
    # answer metrics were computed before the text was dropped; ids, offsets and scores are kept
    assert any("citation_precision" in (r.get("metrics") or {}) for r in records)
    assert all(
        {"doc_id", "start", "end", "score"} <= set(r["retrieved"][0]) for r in records if r["retrieved"]
    )
    sweep = _sweep(no_text_out)
    comparison = json.loads((sweep / "comparison.json").read_text())
    flips = [
        f
        for by_m in comparison["flips"].values()
        for by_s in by_m.values()
        for d in by_s.values()
        for fl in d.values()
        for f in fl
    ]
    assert flips and all(f["query"] == "" and f["query_id"].startswith("c") for f in flips)
    report = (sweep / "report.html").read_text()
    assert "<th>query id</th>" in report and "<th>query</th>" not in report
    # traces were logged, with ids only; the setting is a param of every run
    summaries = [json.loads(p.read_text()) for p in no_text_out.rglob("summary.json")]
    assert summaries and all(s["traces"] == len(QUERIES) for s in summaries)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{no_text_out / 'mlflow.db'}")
    run = client.get_run(summaries[0]["run_id"])
    assert run.data.params["privacy.store_text"] == "False"


@pytest.mark.slow
def test_redact_true_stores_no_personal_data(redacted_out: Path) -> None:
    assert hits(redacted_out, PII) == {n: [] for n in PII}
    found = hits(redacted_out, [*PLACEHOLDERS.values(), "zqxquerymike"])
    assert all(found.values()), found  # text is stored, personal data is replaced
    sweep = _sweep(redacted_out).relative_to(redacted_out)
    assert str(sweep / "comparison.json") in found["[CARD]"]  # the flips are redacted too
    summaries = [json.loads(p.read_text()) for p in redacted_out.rglob("summary.json")]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{redacted_out / 'mlflow.db'}")
    for s in summaries:
        m = s["metrics"]
        # every query is redacted once per stored record: c3's card and e-mail, c4's phone ...
        assert m["privacy/redacted_email"] >= 2 and m["privacy/redacted_card"] >= 1
        assert m["privacy/redacted_phone"] >= 1
        logged = client.get_run(s["run_id"]).data.metrics
        assert {k: v for k, v in logged.items() if k.startswith("privacy/")} == {
            k: v for k, v in m.items() if k.startswith("privacy/")
        }
    records = _records(redacted_out)
    c3 = next(r for r in records if r["query_id"] == "c3")
    assert c3["query"] == "zqxquerymike refunds to card [CARD] business days, mail [EMAIL]"
    assert c3["redacted"]["card"] >= 1 and c3["redacted"]["email"] >= 1


# --------------------------------------------------------------------------- error bodies (system=http)

BODY_CANARY = "zqxbodysierra"
BODY_PII = "leak.body@example.net"


class _Service(BaseHTTPRequestHandler):
    """Answers c1 and c2 with a document; refuses c3 (HTTP 400) and garbles c4 (not JSON), both
    bodies quoting the query and personal data; the rest get an empty list."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        qid, query = body["query_id"], body["query"]
        leak = f"{BODY_CANARY} {BODY_PII} you asked: {query}"
        if qid == "c3":
            code, payload = 400, json.dumps({"detail": leak}).encode()
        elif qid == "c4":
            code, payload = 200, f"<html>{leak}</html>".encode()
        else:
            hit = {"doc_id": "D1", "chunk_id": "D1#0", "start": 0, "end": 20, "score": 1.0}
            found = {"retrieved": [hit] if qid in ("c1", "c2") else [], "intentLeafIds": []}
            code, payload = 200, json.dumps(found).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _http_run(cwd: Path, dataset: Path, base_url: str, *privacy: str) -> Path:
    args = [
        "system=http",
        f"system.base_url={base_url}",
        "system.chat_path=null",
        "system.retries=0",
        "system.max_error_rate=1.0",  # two of six queries fail on purpose
        f"dataset.path={dataset}",
        "progress=false",
        "tracking.traces=all",
        *privacy,
    ]
    proc = run_module("rag_ablate", args, cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd / "outputs"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["default", "store_text=false", "redact=true"])
def test_error_messages_keep_no_response_body(
    mode: str, service: str, canary_dataset: Path, tmp_path: Path
) -> None:
    privacy = [] if mode == "default" else [f"privacy.{mode}"]
    out = _http_run(tmp_path, canary_dataset, service, *privacy)
    records = {r["query_id"]: r for r in _records(out)}
    assert records["c3"]["status"] == "http_error" and records["c4"]["status"] == "bad_response"
    assert "HTTP 400" in records["c3"]["error"]  # what went wrong is still said
    found = hits(out, [BODY_CANARY, BODY_PII, "zqxquerymike"])
    if mode == "default":
        assert all(found.values()), found  # the excerpts quote the bodies
    elif mode == "store_text=false":
        assert found == {n: [] for n in found}
        assert "bytes, not quoted: privacy.store_text=false" in records["c3"]["error"]
    else:
        assert found[BODY_PII] == [] and found[BODY_CANARY]  # the body is quoted, its e-mail is not
        assert "[EMAIL]" in records["c3"]["error"]
        assert (
            json.loads((out.glob("runs/*/metrics.json").__next__()).read_text())["privacy/redacted_email"]
            >= 2
        )
