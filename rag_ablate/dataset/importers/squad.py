"""SQuAD v1.1 / v2.0 JSON, and the variants of its layout found in the wild.

``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``, as used by
COVID-QA, DuReader-robust, CMRC, CJRC and many others. One document per paragraph
(``doc_unit="context"``) or per article (``doc_unit="article"``: the contexts
joined with a blank line, answer offsets shifted). Offsets are Python ``str``
indices. A stored ``answer_start`` that does not point at the answer text is
repaired by string search (the occurrence nearest to the stored offset; the
whitespace-stripped text is tried too) and counted in ``relocated_spans``.
Evidence spans exclude the whitespace around an answer.

Variants of the SQuAD 2.0 layout that are mapped, each counted in
:attr:`~rag_ablate.dataset.importers.ImportReport.mapped`:

* ``is_impossible`` given as a string (``"true"``/``"false"``, any case) or a
  number (``1``/``0``) instead of a JSON boolean;
* unanswerable questions whose ``answers`` hold entries with empty text (and no
  ``is_impossible: true``); with ``is_impossible: false`` that is a contradiction
  and the question is skipped with its reason;
* yes/no questions: an answer ``YES``/``NO`` (any case) or ``是``/``否`` whose
  ``answer_start`` does not point at that word (usually ``-1``). The question is
  answerable, its paragraph is the relevant document, and it has no evidence span
  (the word is never searched for in the context: it would match at random);
* ``plausible_answers`` on unanswerable questions: ignored, the question stays
  unanswerable;
* answers on a question marked impossible: ignored, the flag decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.importers.common import (
    IMPORTERS,
    Case,
    Importer,
    ImportRun,
    JsonlWriter,
    dedupe,
    doc_record,
    nonempty_str,
    read_json,
    short,
    unique_id,
)

ARTICLE_JOINER = "\n\n"

# Names of the variants counted in ImportReport.mapped (one count per question).
IMPOSSIBLE_AS_STRING = "is_impossible given as a string"
IMPOSSIBLE_AS_NUMBER = "is_impossible given as a number"
EMPTY_ANSWER_UNANSWERABLE = "unanswerable: answers with empty text"
YES_NO_ANSWERABLE = "yes/no answer: answerable, no evidence span"
PLAUSIBLE_IGNORED = "plausible_answers ignored (unanswerable)"
ANSWERS_IGNORED = "answers ignored (is_impossible is true)"

_YES_NO = frozenset({"yes", "no", "是", "否"})
_TRUE_WORDS = frozenset({"true"})
_FALSE_WORDS = frozenset({"false"})


def _as_offset(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _occurrences(haystack: str, needle: str) -> Iterator[int]:
    pos = haystack.find(needle)
    while pos != -1:
        yield pos
        pos = haystack.find(needle, pos + 1)


def _locate_answer(context: str, text: str, start: int | None) -> tuple[tuple[int, int] | None, bool]:
    """The ``[start, end)`` of the answer inside ``context`` without surrounding whitespace.

    Returns ``(span, relocated)``; ``span`` is None when the text is nowhere in the
    context. ``relocated`` is True when the stored offset did not point at the text
    and the span was found by searching (nearest occurrence to the stored offset).
    """
    stripped = text.strip()
    if not stripped:
        return None, False
    lead = len(text) - len(text.lstrip())
    if start is not None and start >= 0 and context[start : start + len(text)] == text:
        return (start + lead, start + lead + len(stripped)), False
    ref = 0 if start is None else start
    for needle, shift in ((text, lead), (stripped, 0)):
        target = ref + lead - shift  # where this needle should start
        best: int | None = None
        for pos in _occurrences(context, needle):
            if best is None or abs(pos - target) < abs(best - target):
                best = pos
            if pos > target:
                break  # later occurrences are further away
        if best is not None:
            begin = best + shift
            return (begin, begin + len(stripped)), True
        if needle == stripped:
            break
    return None, False


def _impossible_flag(value: object) -> tuple[bool | None, str | None, str | None]:
    """``is_impossible`` as ``(flag, variant, error)``.

    ``flag`` is None when the field is absent; ``variant`` names a non-canonical
    spelling that was accepted; ``error`` says why a value cannot be read.
    """
    if value is None or isinstance(value, bool):
        return value, None, None
    if isinstance(value, int | float):
        if value in (0, 1):
            return bool(value), IMPOSSIBLE_AS_NUMBER, None
        return None, None, f"is_impossible must be true/false (or 1/0), got {value!r}"
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS or word in _FALSE_WORDS:
            return word in _TRUE_WORDS, IMPOSSIBLE_AS_STRING, None
        return None, None, f"is_impossible must be true/false, got {value!r}"
    return None, None, f"is_impossible must be true/false, got {type(value).__name__}"


@dataclass
class _Paragraph:
    where: str
    doc_id: str
    offset: int  # where the paragraph's context starts in the document text
    context: str
    qas: list[Any]


def _qas(para: dict[str, Any]) -> list[Any]:
    qas = para.get("qas")
    return qas if isinstance(qas, list) else []


def _articles(data: Any, path: Path) -> list[Any]:
    articles = data.get("data") if isinstance(data, dict) else data
    if not isinstance(articles, list):
        raise DatasetError(
            'not a SQuAD-style file: expected {"data": [{"paragraphs": [...]}, ...]}',
            file=str(path),
            field="data",
        )
    return articles


@dataclass
class _Answers:
    """The answers of one question, sorted by what they are."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    refs: list[str] = field(default_factory=list)  # span texts and yes/no words, in answer order
    failed: list[str] = field(default_factory=list)  # why an answer could not be used
    yes_no: int = 0
    empty: int = 0
    relocated: int = 0

    @property
    def usable(self) -> bool:
        return bool(self.spans) or self.yes_no > 0


def _read_answers(answers: list[Any], para: _Paragraph) -> _Answers:
    out = _Answers()
    failed = out.failed
    for n, ans in enumerate(answers):
        if not isinstance(ans, dict):
            failed.append(f"answer {n} is not a JSON object")
            continue
        text = ans.get("text")
        if not isinstance(text, str):
            failed.append(f"answer {n} has no text")
            continue
        if not text.strip():
            out.empty += 1
            continue
        start = _as_offset(ans.get("answer_start"))
        at_start = start is not None and start >= 0 and para.context[start : start + len(text)] == text
        if text.strip().lower() in _YES_NO and not at_start:
            out.yes_no += 1
            out.refs.append(text.strip())
            continue
        span, moved = _locate_answer(para.context, text, start)
        if span is None:
            failed.append(f"answer {n} {short(text)} is not in the context")
            continue
        out.relocated += moved
        out.spans.append((para.offset + span[0], para.offset + span[1]))
        out.refs.append(text.strip())
    return out


def _question(
    qa: object, where: str, para: _Paragraph, first_at: dict[str, str], run: ImportRun
) -> Case | None:
    if not isinstance(qa, dict):
        run.skip(where, "question skipped", "not a JSON object")
        return None
    qid = nonempty_str(qa.get("id"))
    if qid is None:
        run.skip(where, "question skipped", "missing question id")
        return None
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        run.skip(qid, "question skipped", f"empty or missing question text ({where})")
        return None
    question = question.strip()
    if qid in first_at:
        run.skip(qid, "duplicate question id", f"{where}; kept {first_at[qid]}")
        return None
    impossible, flag_variant, flag_error = _impossible_flag(qa.get("is_impossible"))
    if flag_error is not None:
        run.skip(qid, "question skipped", f"{flag_error} ({where})")
        return None
    raw = qa.get("answers")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        run.skip(qid, "question skipped", f"answers must be a list, got {type(raw).__name__} ({where})")
        return None
    answers = _read_answers(raw, para)
    failed = answers.failed
    plausible = qa.get("plausible_answers")
    has_plausible = isinstance(plausible, list) and bool(plausible)
    unanswerable = Case(qid, question, {}, [], [], ["squad", "unanswerable"])

    if impossible is True:
        _count_flag(run, flag_variant)
        if answers.usable or failed:
            run.count(ANSWERS_IGNORED)
        elif answers.empty:
            run.count(EMPTY_ANSWER_UNANSWERABLE)
        if has_plausible:
            run.count(PLAUSIBLE_IGNORED)
        return unanswerable

    if answers.usable:
        _count_flag(run, flag_variant)
        for reason in failed:
            run.skip(qid, "answer dropped", reason)
        if answers.empty:
            run.skip(qid, "answer dropped", f"{answers.empty} answer(s) with empty text")
        run.relocated += answers.relocated
        tags = ["squad"]
        if not answers.spans:
            run.count(YES_NO_ANSWERABLE)
            tags.append("yes_no")
        evidence = [(para.doc_id, s, e) for s, e in sorted(set(answers.spans))]
        return Case(qid, question, {para.doc_id: 1}, evidence, dedupe(answers.refs), tags)

    if failed:
        run.skip(
            qid,
            "question skipped",
            f"none of its {len(raw)} answer(s) is in the context ({where}): {'; '.join(failed)}",
        )
        return None
    if impossible is False:
        what = "only answers with empty text" if answers.empty else "no answers"
        run.skip(qid, "question skipped", f"is_impossible is false but the question has {what} ({where})")
        return None
    if answers.empty or has_plausible:
        # No flag: answers with empty text (or SQuAD 2.0's plausible_answers) say "no answer".
        if answers.empty:
            run.count(EMPTY_ANSWER_UNANSWERABLE)
        if has_plausible:
            run.count(PLAUSIBLE_IGNORED)
        return unanswerable
    run.skip(qid, "question skipped", f"no answers and not marked is_impossible ({where})")
    return None


def _count_flag(run: ImportRun, variant: str | None) -> None:
    if variant is not None:
        run.count(variant)


@IMPORTERS.register("squad")
class Squad(Importer):
    """SQuAD v1.1 / v2.0 JSON (one file, or a folder holding exactly one ``.json``)."""

    summary = "SQuAD v1.1/v2.0 JSON (COVID-QA, CMRC, DuReader, CJRC...)"
    doc_units = ("context", "article")

    def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
        path = source
        if path.is_dir():
            candidates = sorted(path.glob("*.json"))
            if len(candidates) != 1:
                raise DatasetError(
                    f"squad import expects a JSON file, or a folder with exactly one .json file; "
                    f"{path} holds {len(candidates)}",
                    file=str(path),
                )
            path = candidates[0]
        paragraphs = _documents(_articles(read_json(path), path), doc_unit, out, run)
        run.documents = out.count
        cases: list[Case] = []
        first_at: dict[str, str] = {}
        for para in paragraphs:
            for k, qa in enumerate(para.qas):
                where_q = f"{para.where}.qas[{k}]"
                case = _question(qa, where_q, para, first_at, run)
                if case is not None:
                    first_at[case.query_id] = where_q
                    cases.append(case)
        return cases


def _documents(articles: list[Any], doc_unit: str, out: JsonlWriter, run: ImportRun) -> list[_Paragraph]:
    """Write one document per context (or article); return the paragraphs with their document."""
    titles: list[str | None] = []
    for art in articles:
        titles.append(nonempty_str(art.get("title")) if isinstance(art, dict) else None)
    title_count = Counter(t for t in titles if t is not None)
    taken: set[str] = set()
    paragraphs: list[_Paragraph] = []

    def assign(candidate: str, where: str) -> str:
        doc_id = unique_id(candidate, taken)
        if doc_id != candidate:
            run.note(where, f"document id '{candidate}' already used; renamed to '{doc_id}'")
        return doc_id

    for i, art in enumerate(articles):
        where_a = f"data[{i}]"
        if not isinstance(art, dict) or not isinstance(art.get("paragraphs"), list):
            run.skip(where_a, "article skipped", "not an object with a 'paragraphs' list")
            continue
        title = titles[i]
        unique_title = title if title is not None and title_count[title] == 1 else None
        paras = art["paragraphs"]
        usable: list[tuple[int, dict[str, Any], str]] = []
        for j, para in enumerate(paras):
            where_p = f"{where_a}.paragraphs[{j}]"
            if not isinstance(para, dict):
                run.skip(where_p, "paragraph skipped", "not a JSON object")
                continue
            context = para.get("context")
            qas = _qas(para)
            if not isinstance(context, str) or not context.strip():
                if not qas:
                    run.skip(where_p, "paragraph skipped", "empty or missing context")
                for k, qa in enumerate(qas):
                    qid = nonempty_str(qa.get("id")) if isinstance(qa, dict) else None
                    run.skip(qid or f"{where_p}.qas[{k}]", "question skipped", f"empty context ({where_p})")
                continue
            usable.append((j, para, context))
        if not usable:
            continue
        if doc_unit == "context":
            for j, para, context in usable:
                where_p = f"{where_a}.paragraphs[{j}]"
                explicit = nonempty_str(para.get("document_id")) or nonempty_str(para.get("id"))
                if explicit is not None:
                    candidate = explicit
                elif unique_title is not None:
                    candidate = unique_title if len(paras) == 1 else f"{unique_title}-{j}"
                else:
                    candidate = f"{i}-{j}"
                doc_id = assign(candidate, where_p)
                out.write(
                    doc_record(doc_id, context, title, {"source": "squad", "article": i, "paragraph": j})
                )
                paragraphs.append(_Paragraph(where_p, doc_id, 0, context, _qas(para)))
        else:
            ids = {nonempty_str(p.get("document_id")) for _, p, _ in usable}
            shared = next(iter(ids)) if len(ids) == 1 else None
            candidate = shared or unique_title or str(i)
            doc_id = assign(candidate, where_a)
            offset = 0
            for j, para, context in usable:
                paragraphs.append(
                    _Paragraph(f"{where_a}.paragraphs[{j}]", doc_id, offset, context, _qas(para))
                )
                offset += len(context) + len(ARTICLE_JOINER)
            text = ARTICLE_JOINER.join(c for _, _, c in usable)
            out.write(
                doc_record(doc_id, text, title, {"source": "squad", "article": i, "paragraphs": len(usable)})
            )
    return paragraphs
