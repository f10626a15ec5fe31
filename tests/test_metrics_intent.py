"""Intent accuracy: per-case value, the report's ordering, confusions and output."""

from __future__ import annotations

import json

import pytest

from rag_ablate.metrics.intent import NO_PREDICTION, IntentReport, IntentRow, intent_report, intent_top1

CASES: list[tuple[str | None, str, str | None]] = [
    ("KNOWLEDGE", "S14_returns", "S14_returns"),
    ("KNOWLEDGE", "S14_returns", "S15_refunds"),
    ("KNOWLEDGE", "S14_returns", "S15_refunds"),
    ("KNOWLEDGE", "S15_refunds", "S15_refunds"),
    ("KNOWLEDGE", "S15_refunds", "S14_returns"),
    ("CHITCHAT", "C01_greeting", "C01_greeting"),
    ("CHITCHAT", "C01_greeting", None),
    ("FEEDBACK", "F01_complaint", "C01_greeting"),
    ("FEEDBACK", "F02_praise", "F02_praise"),
    (None, "X01_other", "X01_other"),
]


def test_intent_top1() -> None:
    assert intent_top1("S14_returns", "S14_returns") == 1.0
    assert intent_top1("S14_returns", "S15_refunds") == 0.0
    assert intent_top1("S14_returns", None) == 0.0
    assert intent_top1("S14_returns", "s14_returns") == 0.0  # exact comparison
    with pytest.raises(ValueError):
        intent_top1("", "x")


def test_overall_counts() -> None:
    report = intent_report(CASES)
    assert (report.n, report.correct) == (10, 5)
    assert report.accuracy == 0.5


def test_per_l1_worst_first_ties_by_name() -> None:
    report = intent_report(CASES)
    assert report.per_l1 == [
        IntentRow("KNOWLEDGE", "l1", 5, 2, 0.4),
        IntentRow("CHITCHAT", "l1", 2, 1, 0.5),
        IntentRow("FEEDBACK", "l1", 2, 1, 0.5),
    ]
    # the case without intent_l1 counts overall and per l2 only
    assert sum(row.n for row in report.per_l1) == report.n - 1


def test_per_l2_worst_first_ties_by_name() -> None:
    report = intent_report(CASES)
    assert [(r.name, r.n, r.correct) for r in report.per_l2] == [
        ("F01_complaint", 1, 0),
        ("S14_returns", 3, 1),
        ("C01_greeting", 2, 1),
        ("S15_refunds", 2, 1),
        ("F02_praise", 1, 1),
        ("X01_other", 1, 1),
    ]
    assert all(row.level == "l2" for row in report.per_l2)
    assert report.per_l2[1].accuracy == pytest.approx(1 / 3)


def test_confusions_most_frequent_first_ties_by_names() -> None:
    report = intent_report(CASES)
    assert report.confusions == [
        ("S14_returns", "S15_refunds", 2),
        ("C01_greeting", NO_PREDICTION, 1),
        ("F01_complaint", "C01_greeting", 1),
        ("S15_refunds", "S14_returns", 1),
    ]
    assert intent_report(CASES, top_confusions=2).confusions == report.confusions[:2]
    assert intent_report(CASES, top_confusions=0).confusions == []


def test_all_correct_has_no_confusions() -> None:
    report = intent_report([("A", "a1", "a1"), ("A", "a2", "a2")])
    assert report.accuracy == 1.0
    assert report.confusions == []
    assert "_none_" in report.to_markdown()


def test_to_dict_is_json_serialisable() -> None:
    report = intent_report(CASES)
    data = report.to_dict()
    again = json.loads(json.dumps(data, allow_nan=False))
    assert again == data
    assert data["n"] == 10 and data["correct"] == 5 and data["accuracy"] == 0.5
    assert again["per_l1"][0] == {"name": "KNOWLEDGE", "level": "l1", "n": 5, "correct": 2, "accuracy": 0.4}
    assert again["confusions"][0] == {"gold": "S14_returns", "predicted": "S15_refunds", "count": 2}
    assert len(again["per_l2"]) == 6


def test_to_markdown() -> None:
    text = intent_report(CASES).to_markdown()
    assert "| 10 | 5 | 0.500 |" in text
    assert "| KNOWLEDGE | 5 | 2 | 0.400 |" in text
    assert "| S14_returns | S15_refunds | 2 |" in text
    assert f"| C01_greeting | {NO_PREDICTION} | 1 |" in text
    # tables appear in order: overall, per l1, per l2, confusions
    positions = [text.index(h) for h in ("| n |", "| intent_l1 |", "| intent_l2 |", "| gold intent_l2 |")]
    assert positions == sorted(positions)
    # worst first inside the table
    assert text.index("| F01_complaint |") < text.index("| X01_other |")


def test_markdown_escapes_pipes() -> None:
    text = intent_report([("A|B", "x|y", "z")]).to_markdown()
    assert "| A\\|B | 1 | 0 | 0.000 |" in text
    assert "| x\\|y | z | 1 |" in text


def test_no_l1_at_all() -> None:
    report = intent_report([(None, "a", "a"), (None, "b", None)])
    assert report.per_l1 == []
    assert report.n == 2
    assert "_no cases_" in report.to_markdown()


def test_input_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        intent_report([])
    with pytest.raises(ValueError, match="intent_l2"):
        intent_report([("A", "", "a")])
    with pytest.raises(ValueError, match="intent_l2"):
        intent_report([("A", None, "a")])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="top_confusions"):
        intent_report(CASES, top_confusions=-1)


def test_report_is_frozen() -> None:
    report = intent_report(CASES)
    assert isinstance(report, IntentReport)
    with pytest.raises(AttributeError):
        report.n = 3  # type: ignore[misc]
