"""Evidence labels checked against the current corpus (docs/dataset-format.md, "Quotes").

An evidence entry of ``queries.jsonl`` may carry the ``quote`` it points at: the text
of ``[start, end)`` in its document when the label was written. Documents change
(a paragraph is inserted, a typo fixed), and offsets written against the old text
then point at the wrong characters without anyone noticing. With a quote the label
can be checked and, often, repaired:

* **ok**: ``text[start:end] == quote``;
* **relocated**: it does not, but the quote occurs exactly once in the same
  document: the label moves to that occurrence;
* **ambiguous**: the quote occurs several times in the same document: which one
  was meant cannot be told, the label is reported and not used;
* **stale**: the quote no longer occurs in its document: reported and not used.

The search is exact (no case or whitespace folding) and stays in the label's own
document: evidence moved to another document changes which documents answer the
question, a decision for a person. :func:`check_dataset_labels` therefore only *names*
the other documents that hold a stale quote, as a hint.

:func:`fix_queries` writes a copy of ``queries.jsonl`` with the relocated offsets
(every other line byte for byte as it was); ``rag-ablate validate --fix OUT`` runs it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.dataset.model import LabelCheck, LabelReport, LabelStatus

if TYPE_CHECKING:
    from rag_ablate.dataset.model import Dataset

__all__ = [
    "LabelCheck",
    "LabelReport",
    "LabelStatus",
    "check_dataset_labels",
    "fix_queries",
    "label_params",
    "locate_quote",
    "occurrences",
]

MAX_SHOWN_MATCHES = 5
"""How many match positions an ambiguous label keeps (``n_matches`` has the count)."""


def occurrences(text: str, quote: str, limit: int | None = None) -> list[int]:
    """Start offsets of every occurrence of ``quote`` in ``text``, overlapping ones included.

    Stops after ``limit`` occurrences when one is given. An empty quote has none.
    """
    found: list[int] = []
    if not quote:
        return found
    i = text.find(quote)
    while i >= 0:
        found.append(i)
        if limit is not None and len(found) >= limit:
            break
        i = text.find(quote, i + 1)
    return found


def locate_quote(text: str, start: int, end: int, quote: str) -> tuple[LabelStatus, int, int, list[int]]:
    """Check one label: ``(status, start, end, matches)``.

    ``start, end`` are the label's offsets after the check (the new ones when
    relocated, the written ones otherwise); ``matches`` the start offsets of the
    quote in ``text`` (empty when the label is ok, at most two when ambiguous:
    that is enough to know it is).
    """
    if 0 <= start < end <= len(text) and text[start:end] == quote:
        return "ok", start, end, []
    matches = occurrences(text, quote, limit=2)
    if len(matches) == 1:
        return "relocated", matches[0], matches[0] + len(quote), matches
    return ("ambiguous" if matches else "stale"), start, end, matches


def check_dataset_labels(dataset: Dataset, *, search_corpus: bool = True) -> LabelReport:
    """The loader's label report, with details only a person needs filled in.

    Ambiguous labels get every match in their document (``n_matches``, the first
    :data:`MAX_SHOWN_MATCHES` positions); with ``search_corpus``, stale labels get the
    other documents that hold the quote (``elsewhere``, one search of the whole corpus
    per stale label).
    """
    docs = dataset.documents
    detailed: list[LabelCheck] = []
    for check in dataset.labels.issues:
        if check.status == "ambiguous":
            every = occurrences(docs[check.doc_id].text, check.quote)
            check = replace(check, matches=tuple(every[:MAX_SHOWN_MATCHES]), n_matches=len(every))
        elif check.status == "stale" and search_corpus:
            hits = tuple(
                (doc_id, pos)
                for doc_id, doc in docs.items()
                if doc_id != check.doc_id
                for pos in occurrences(doc.text, check.quote, limit=MAX_SHOWN_MATCHES)
            )
            check = replace(check, elsewhere=hits[:MAX_SHOWN_MATCHES])
        detailed.append(check)
    return LabelReport(dataset.labels.checked, tuple(detailed))


def fix_queries(source: Path, out: Path, relocated: Iterable[LabelCheck]) -> int:
    """Write ``source`` (a queries.jsonl) to ``out`` with the relocated labels' new offsets.

    Lines without a relocated label are copied byte for byte (so line numbers and
    formatting stay); a line with one is re-serialised with the new ``start``/``end``.
    Stale and ambiguous labels are left as written. ``out`` may be ``source``
    itself: the file is replaced atomically. Returns the number of labels changed.
    """
    by_line: dict[int, list[LabelCheck]] = {}
    for check in relocated:
        if check.status == "relocated":
            by_line.setdefault(check.line, []).append(check)
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    changed = 0
    for lineno, checks in by_line.items():
        raw = lines[lineno - 1]
        ending = raw[len(raw.rstrip("\r\n")) :] or "\n"
        obj = json.loads(raw)
        for check in checks:
            entry = obj["evidence"][check.index]
            entry["start"], entry["end"] = check.new_start, check.new_end
            changed += 1
        lines[lineno - 1] = json.dumps(obj, ensure_ascii=False) + ending
    write_text_atomic(out, "".join(lines))
    return changed


def label_params(report: LabelReport) -> Mapping[str, int]:
    """The run parameters that say how far the labels had to be repaired at load."""
    return {
        "dataset.labels_checked": report.checked,
        "dataset.labels_relocated": report.relocated,
        "dataset.labels_stale": report.stale,
        "dataset.labels_ambiguous": report.ambiguous,
    }
