"""Intent routing accuracy (docs/metrics.md, "Intent").

``intent_top1`` is 1 when the predicted leaf intent equals the gold
``intent_l2`` (exact string comparison), else 0; a missing prediction (``None``)
is wrong. ``intent_report`` aggregates over every case that carries
``intent_l2``, answerable or not: overall, per gold ``intent_l1`` and per gold
``intent_l2`` (worst accuracy first, ties by name), plus the most frequent
confusion pairs (gold -> predicted; a missing prediction shows as
``NO_PREDICTION``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["NO_PREDICTION", "IntentReport", "IntentRow", "intent_report", "intent_top1"]

NO_PREDICTION = "<none>"
"""How a missing prediction appears in confusion pairs."""


@dataclass(frozen=True)
class IntentRow:
    """Accuracy of one gold intent (``level`` says whether l1 or l2)."""

    name: str
    level: Literal["l1", "l2"]
    n: int
    correct: int
    accuracy: float


@dataclass(frozen=True)
class IntentReport:
    """Intent accuracy overall, per l1, per l2, and the top confusion pairs."""

    n: int
    correct: int
    accuracy: float
    per_l1: list[IntentRow]
    per_l2: list[IntentRow]
    confusions: list[tuple[str, str, int]]

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: plain dicts, lists, strings and numbers."""
        return {
            "n": self.n,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "per_l1": [asdict(row) for row in self.per_l1],
            "per_l2": [asdict(row) for row in self.per_l2],
            "confusions": [
                {"gold": gold, "predicted": predicted, "count": count}
                for gold, predicted, count in self.confusions
            ],
        }

    def to_markdown(self) -> str:
        """Markdown tables: overall, per intent_l1, per intent_l2, top confusions."""
        lines = [
            "## Intent accuracy",
            "",
            "| n | correct | accuracy |",
            "|---:|---:|---:|",
            f"| {self.n} | {self.correct} | {self.accuracy:.3f} |",
        ]
        for title, header, rows in (
            ("Per intent_l1 (worst first)", "intent_l1", self.per_l1),
            ("Per intent_l2 (worst first)", "intent_l2", self.per_l2),
        ):
            lines += ["", f"### {title}", ""]
            if not rows:
                lines.append("_no cases_")
                continue
            lines += [f"| {header} | n | correct | accuracy |", "|---|---:|---:|---:|"]
            lines += [f"| {_cell(r.name)} | {r.n} | {r.correct} | {r.accuracy:.3f} |" for r in rows]
        lines += ["", "### Top confusions (gold -> predicted)", ""]
        if not self.confusions:
            lines.append("_none_")
        else:
            lines += ["| gold intent_l2 | predicted | count |", "|---|---|---:|"]
            lines += [
                f"| {_cell(gold)} | {_cell(predicted)} | {count} |"
                for gold, predicted, count in self.confusions
            ]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """Escape a value for a markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _check_label(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def intent_top1(gold_l2: str, predicted_l2: str | None) -> float:
    """1.0 if ``predicted_l2 == gold_l2``, else 0.0; ``None`` (no prediction) is 0.0."""
    _check_label(gold_l2, "gold intent_l2")
    return 1.0 if predicted_l2 == gold_l2 else 0.0


def _rows(counts: Counter[str], correct: Counter[str], level: Literal["l1", "l2"]) -> list[IntentRow]:
    rows = [IntentRow(name, level, n, correct[name], correct[name] / n) for name, n in counts.items()]
    rows.sort(key=lambda row: (row.accuracy, row.name))
    return rows


def intent_report(
    cases: Iterable[tuple[str | None, str, str | None]],
    top_confusions: int = 10,
) -> IntentReport:
    """Aggregate ``(gold_l1, gold_l2, predicted_l2)`` cases into an :class:`IntentReport`.

    Cases whose ``gold_l1`` is ``None`` count overall and per l2 but not per l1.
    ``top_confusions`` caps the confusion list (0 for none). Raises
    ``ValueError`` for no cases, an empty or missing gold ``intent_l2``, or a
    negative ``top_confusions``.
    """
    if isinstance(top_confusions, bool) or not isinstance(top_confusions, int) or top_confusions < 0:
        raise ValueError(f"top_confusions must be a non-negative integer, got {top_confusions!r}")
    n = 0
    n_correct = 0
    l1_n: Counter[str] = Counter()
    l1_correct: Counter[str] = Counter()
    l2_n: Counter[str] = Counter()
    l2_correct: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for gold_l1, gold_l2, predicted in cases:
        _check_label(gold_l2, "gold intent_l2")
        if gold_l1 is not None:
            _check_label(gold_l1, "gold intent_l1")
        if predicted is not None and not isinstance(predicted, str):
            raise ValueError(f"predicted intent must be a string or None, got {predicted!r}")
        hit = int(intent_top1(gold_l2, predicted))
        n += 1
        n_correct += hit
        l2_n[gold_l2] += 1
        l2_correct[gold_l2] += hit
        if gold_l1 is not None:
            l1_n[gold_l1] += 1
            l1_correct[gold_l1] += hit
        if hit == 0:
            pairs[(gold_l2, NO_PREDICTION if predicted is None else predicted)] += 1
    if n == 0:
        raise ValueError("intent_report needs at least one case that carries intent_l2")

    confusions = sorted(
        ((gold, predicted, count) for (gold, predicted), count in pairs.items()),
        key=lambda item: (-item[2], item[0], item[1]),
    )[:top_confusions]
    return IntentReport(
        n=n,
        correct=n_correct,
        accuracy=n_correct / n,
        per_l1=_rows(l1_n, l1_correct, "l1"),
        per_l2=_rows(l2_n, l2_correct, "l2"),
        confusions=confusions,
    )
