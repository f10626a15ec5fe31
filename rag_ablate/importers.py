"""Import public QA / retrieval datasets into the dataset contract (DATASET_FORMAT.md).

Formats
-------
``squad``
    SQuAD v1.1 / v2.0 JSON (``{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}``),
    as used by COVID-QA, DuReader-robust, CMRC and many others. One document per
    paragraph (``doc_unit="context"``) or per article (``doc_unit="article"``: the
    contexts joined with a blank line, answer offsets shifted). Offsets are Python
    ``str`` indices. A stored ``answer_start`` that does not point at the answer
    text is repaired by string search (the occurrence nearest to the stored offset;
    the whitespace-stripped text is tried too) and counted in ``relocated_spans``.
    Evidence spans exclude the whitespace around an answer.
``beir``
    A BEIR folder: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
    (``_id``, ``text``) and ``qrels/{train,dev,test}.tsv`` (``query-id corpus-id score``).
    Every present qrels file is read; a pair in several files keeps its highest
    grade; grades <= 0 are not relevant. With both ``dev.tsv`` and ``test.tsv`` the
    official split is kept (dev -> ``dev``, test -> ``holdout``; train-only queries ->
    ``dev``), except that a near-duplicate group spanning both moves whole to the
    split of its majority (reported in ``notes``). Queries without any qrels are
    unjudged, not unanswerable: they are skipped and reported.
``clapnq``
    The ClapNQ folder (``clapnq_<split>_answerable.jsonl``,
    ``clapnq_<split>_unanswerable.jsonl`` and the ``question_<split>_*.tsv`` files).
    Every distinct passage (exact title and text) becomes one document, its id the
    tsv ``doc-id-list`` entry when that id names exactly this passage, otherwise a
    stable hash id. Answerable questions: their gold passage is relevant (grade 1),
    evidence = the selected sentences found in it, reference answers = the
    non-empty written answers. Unanswerable questions (from the ``unanswerable``
    file): per ClapNQ's README their passage is a randomly chosen passage of the
    question's Wikipedia page that does not answer it, so the question gets no
    relevant document, and that passage stays in the corpus as a distractor.

Every import writes ``corpus.jsonl`` and ``queries.jsonl`` (UTF-8, one JSON object a
line) with explicit ``split`` for every query and explicit ``group`` for the
near-duplicate groups with more than one member, validates the result with
:func:`rag_ablate.dataset.load_dataset`, and only then moves it into place: a
failed import leaves no half-written folder behind. Nothing that cannot be mapped
is dropped silently; it is listed in :attr:`ImportReport.skipped` with a reason.
Output is deterministic: the same input gives byte-identical files.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import secrets
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rag_ablate.dataset import CORPUS_FILE, INTENTS_FILE, QUERIES_FILE, load_dataset
from rag_ablate.errors import ConfigError, DatasetError, UnknownNameError
from rag_ablate.grouping import assign_splits, group_near_duplicates

FORMATS = ("squad", "beir", "clapnq")
DOC_UNITS = ("context", "article")
ARTICLE_JOINER = "\n\n"

_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN_SKIPS = 10


# --------------------------------------------------------------------------- report


@dataclass
class ImportReport:
    """What an import did: counts, and every item that could not be mapped, with why."""

    format: str
    source: str
    out_dir: str
    documents: int
    queries: int
    answerable: int
    unanswerable: int
    skipped: list[tuple[str, str]]
    relocated_spans: int
    groups_multi: int
    splits: dict[str, int]
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Things that were mapped, but not 1:1 (renamed ids, moved groups...)."""

    def summary(self) -> str:
        lines = [
            f"imported {self.format} from {self.source} into {self.out_dir}",
            f"  {self.documents} documents, {self.queries} queries "
            f"({self.answerable} answerable, {self.unanswerable} unanswerable)",
            "  splits: "
            + ", ".join(f"{s} {n}" for s, n in self.splits.items())
            + f"; near-duplicate groups with more than one query: {self.groups_multi}",
            f"  answer spans relocated by string search: {self.relocated_spans}",
        ]
        if self.skipped:
            by_kind = Counter(reason.split(":", 1)[0] for _, reason in self.skipped)
            lines.append(
                f"  skipped or dropped {len(self.skipped)} item(s): "
                + "; ".join(f"{n} x {kind}" for kind, n in by_kind.most_common())
            )
            for item, reason in self.skipped[:_SHOWN_SKIPS]:
                lines.append(f"    - {item}: {reason}")
            if len(self.skipped) > _SHOWN_SKIPS:
                lines.append(f"    ... and {len(self.skipped) - _SHOWN_SKIPS} more")
        else:
            lines.append("  nothing skipped")
        if self.notes:
            lines.append(f"  notes ({len(self.notes)}):")
            for item, note in self.notes[:_SHOWN_SKIPS]:
                lines.append(f"    - {item}: {note}")
            if len(self.notes) > _SHOWN_SKIPS:
                lines.append(f"    ... and {len(self.notes) - _SHOWN_SKIPS} more")
        return "\n".join(lines)


# --------------------------------------------------------------------------- shared pieces


@dataclass
class _Case:
    query_id: str
    query: str
    relevant: dict[str, int]
    evidence: list[tuple[str, int, int]]
    references: list[str]
    tags: list[str]
    fixed_split: str | None = None

    @property
    def answerable(self) -> bool:
        return bool(self.relevant)


@dataclass
class _Run:
    """Accumulates the outcome of one import."""

    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)
    relocated: int = 0
    documents: int = 0
    surrogates: int = 0

    def skip(self, item: str, kind: str, detail: str | None = None) -> None:
        self.skipped.append((item, kind if detail is None else f"{kind}: {detail}"))

    def note(self, item: str, text: str) -> None:
        self.notes.append((item, text))


class _JsonlWriter:
    """Writes one JSON object a line, UTF-8, ``\\n`` line ends.

    Lone surrogates (from ``"\\ud800"`` escapes in the source) cannot be encoded as
    UTF-8; they are replaced by U+FFFD, which keeps every character offset valid.
    """

    def __init__(self, fh: BinaryIO, run: _Run) -> None:
        self.fh = fh
        self.run = run
        self.count = 0

    def write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:
            self.run.surrogates += len(_SURROGATE.findall(line))
            data = _SURROGATE.sub("\ufffd", line).encode("utf-8")
        self.fh.write(data + b"\n")
        self.count += 1


def _doc_record(doc_id: str, text: str, title: str | None, metadata: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"doc_id": doc_id}
    if title:
        rec["title"] = title
    rec["text"] = text
    if metadata:
        rec["metadata"] = metadata
    return rec


def _nonempty_str(value: object) -> str | None:
    """``value`` as a string when it is a non-blank string or a number, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        value = str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _unique_id(candidate: str, taken: set[str]) -> str:
    name, k = candidate, 1
    while name in taken:
        k += 1
        name = f"{candidate}~{k}"
    taken.add(name)
    return name


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetError("not valid UTF-8", file=str(path), line=line) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"invalid JSON: {exc.msg}", file=str(path), line=exc.lineno) from exc


def _iter_jsonl(path: Path, run: _Run, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Objects of a JSON Lines file; bad lines are reported as ``label:line`` and skipped."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise DatasetError(f"cannot read file: {exc.strerror}", file=str(path)) from exc
    with fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError:
                run.skip(f"{label}:{lineno}", "line skipped", "not valid UTF-8")
                continue
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                run.skip(f"{label}:{lineno}", "line skipped", f"invalid JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                run.skip(f"{label}:{lineno}", "line skipped", "not a JSON object")
                continue
            yield lineno, obj


# --------------------------------------------------------------------------- squad


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


def _squad_articles(data: Any, path: Path) -> list[Any]:
    articles = data.get("data") if isinstance(data, dict) else data
    if not isinstance(articles, list):
        raise DatasetError(
            'not a SQuAD-style file: expected {"data": [{"paragraphs": [...]}, ...]}', file=str(path)
        )
    return articles


def _import_squad(path: Path, doc_unit: str, out: _JsonlWriter, run: _Run) -> list[_Case]:
    if path.is_dir():
        candidates = sorted(path.glob("*.json"))
        if len(candidates) != 1:
            raise DatasetError(
                f"squad import expects a JSON file, or a folder with exactly one .json file; "
                f"{path} holds {len(candidates)}",
                file=str(path),
            )
        path = candidates[0]
    articles = _squad_articles(_read_json(path), path)

    titles: list[str | None] = []
    for art in articles:
        titles.append(_nonempty_str(art.get("title")) if isinstance(art, dict) else None)
    title_count = Counter(t for t in titles if t is not None)
    taken: set[str] = set()
    paragraphs: list[_Paragraph] = []

    def assign(candidate: str, where: str) -> str:
        doc_id = _unique_id(candidate, taken)
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
                    qid = _nonempty_str(qa.get("id")) if isinstance(qa, dict) else None
                    run.skip(qid or f"{where_p}.qas[{k}]", "question skipped", f"empty context ({where_p})")
                continue
            usable.append((j, para, context))
        if not usable:
            continue
        if doc_unit == "context":
            for j, para, context in usable:
                where_p = f"{where_a}.paragraphs[{j}]"
                explicit = _nonempty_str(para.get("document_id")) or _nonempty_str(para.get("id"))
                if explicit is not None:
                    candidate = explicit
                elif unique_title is not None:
                    candidate = unique_title if len(paras) == 1 else f"{unique_title}-{j}"
                else:
                    candidate = f"{i}-{j}"
                doc_id = assign(candidate, where_p)
                out.write(
                    _doc_record(doc_id, context, title, {"source": "squad", "article": i, "paragraph": j})
                )
                paragraphs.append(_Paragraph(where_p, doc_id, 0, context, _qas(para)))
        else:
            ids = {_nonempty_str(p.get("document_id")) for _, p, _ in usable}
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
                _doc_record(doc_id, text, title, {"source": "squad", "article": i, "paragraphs": len(usable)})
            )
    run.documents = out.count

    cases: list[_Case] = []
    first_at: dict[str, str] = {}
    for para in paragraphs:
        for k, qa in enumerate(para.qas):
            where_q = f"{para.where}.qas[{k}]"
            case = _squad_question(qa, where_q, para, first_at, run)
            if case is not None:
                first_at[case.query_id] = where_q
                cases.append(case)
    return cases


def _squad_question(
    qa: object, where: str, para: _Paragraph, first_at: dict[str, str], run: _Run
) -> _Case | None:
    if not isinstance(qa, dict):
        run.skip(where, "question skipped", "not a JSON object")
        return None
    qid = _nonempty_str(qa.get("id"))
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
    if qa.get("is_impossible") is True:
        return _Case(qid, question, {}, [], [], ["squad", "unanswerable"])
    answers = qa.get("answers")
    if not isinstance(answers, list) or not answers:
        run.skip(qid, "question skipped", f"no answers and not marked is_impossible ({where})")
        return None
    spans: list[tuple[int, int]] = []
    refs: list[str] = []
    failed: list[str] = []
    relocated = 0
    for n, ans in enumerate(answers):
        text = ans.get("text") if isinstance(ans, dict) else None
        if not isinstance(text, str) or not text.strip():
            failed.append(f"answer {n} has no text")
            continue
        start = _as_offset(ans.get("answer_start")) if isinstance(ans, dict) else None
        span, moved = _locate_answer(para.context, text, start)
        if span is None:
            failed.append(f"answer {n} {_short(text)} is not in the context")
            continue
        relocated += moved
        spans.append((para.offset + span[0], para.offset + span[1]))
        refs.append(text.strip())
    if not spans:
        run.skip(
            qid,
            "question skipped",
            f"none of its {len(answers)} answer(s) is in the context ({where}): {'; '.join(failed)}",
        )
        return None
    for reason in failed:
        run.skip(qid, "answer dropped", reason)
    run.relocated += relocated
    evidence = [(para.doc_id, s, e) for s, e in sorted(set(spans))]
    return _Case(qid, question, {para.doc_id: 1}, evidence, _dedupe(refs), ["squad"])


# --------------------------------------------------------------------------- beir

_QRELS_SPLITS = ("train", "dev", "test")


def _read_qrels(path: Path, label: str, run: _Run) -> list[tuple[str, str, int]]:
    pairs: list[tuple[str, str, int]] = []
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read qrels file: {exc}", file=str(path)) from exc
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split("\t")]
        if lineno == 1 and len(cells) == 3 and not cells[2].lstrip("-").replace(".", "", 1).isdigit():
            continue  # header: query-id corpus-id score
        if len(cells) != 3:
            run.skip(
                f"{label}:{lineno}",
                "qrels line skipped",
                f"expected 3 tab-separated fields, got {len(cells)}",
            )
            continue
        qid, did, score = cells
        try:
            grade = int(score)
        except ValueError:
            try:
                as_float = float(score)
            except ValueError:
                as_float = float("nan")
            if not as_float.is_integer():
                run.skip(f"{label}:{lineno}", "qrels line skipped", f"score {score!r} is not an integer")
                continue
            grade = int(as_float)
        if not qid or not did:
            run.skip(f"{label}:{lineno}", "qrels line skipped", "empty query or corpus id")
            continue
        pairs.append((qid, did, grade))
    return pairs


def _import_beir(folder: Path, out: _JsonlWriter, run: _Run) -> list[_Case]:
    if not folder.is_dir():
        raise DatasetError(
            "a BEIR dataset is a folder with corpus.jsonl, queries.jsonl and qrels/", file=str(folder)
        )
    for required in ("corpus.jsonl", "queries.jsonl"):
        if not (folder / required).is_file():
            raise DatasetError(f"missing {required} in the BEIR folder {folder}", file=required)
    qrels_files = {s: folder / "qrels" / f"{s}.tsv" for s in _QRELS_SPLITS}
    qrels_files = {s: p for s, p in qrels_files.items() if p.is_file()}
    if not qrels_files:
        raise DatasetError(f"no qrels/train.tsv, qrels/dev.tsv or qrels/test.tsv in {folder}", file="qrels")
    if (folder / "qrels").is_dir():
        for extra in sorted((folder / "qrels").iterdir()):
            if extra.suffix == ".tsv" and extra.stem not in _QRELS_SPLITS:
                run.note(f"qrels/{extra.name}", "ignored: only train.tsv, dev.tsv and test.tsv are read")

    doc_ids: set[str] = set()
    for lineno, obj in _iter_jsonl(folder / "corpus.jsonl", run, "corpus.jsonl"):
        doc_id = _nonempty_str(obj.get("_id"))
        if doc_id is None:
            run.skip(f"corpus.jsonl:{lineno}", "document skipped", "missing _id")
            continue
        if doc_id in doc_ids:
            run.skip(doc_id, "document skipped", f"duplicate _id (corpus.jsonl:{lineno}); kept the first")
            continue
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            run.skip(doc_id, "document skipped", f"empty text (corpus.jsonl:{lineno})")
            continue
        title = obj.get("title")
        metadata = obj.get("metadata")
        doc_ids.add(doc_id)
        out.write(
            _doc_record(
                doc_id,
                text,
                title if isinstance(title, str) and title.strip() else None,
                metadata if isinstance(metadata, dict) else {},
            )
        )
    run.documents = out.count

    queries: dict[str, str] = {}
    for lineno, obj in _iter_jsonl(folder / "queries.jsonl", run, "queries.jsonl"):
        qid = _nonempty_str(obj.get("_id"))
        if qid is None:
            run.skip(f"queries.jsonl:{lineno}", "query skipped", "missing _id")
            continue
        if qid in queries:
            run.skip(qid, "query skipped", f"duplicate _id (queries.jsonl:{lineno}); kept the first")
            continue
        text = obj.get("text")
        if not isinstance(text, str) or not text.strip():
            run.skip(qid, "query skipped", f"empty query text (queries.jsonl:{lineno})")
            continue
        queries[qid] = text.strip()

    grades: dict[str, dict[str, int]] = {}
    in_split: dict[str, set[str]] = {}
    for split, path in qrels_files.items():
        for qid, did, grade in _read_qrels(path, f"qrels/{path.name}", run):
            pairs = grades.setdefault(qid, {})
            pairs[did] = max(grade, pairs.get(did, grade))
            in_split.setdefault(qid, set()).add(split)
    for qid in grades:
        if qid not in queries:
            run.skip(
                qid, "qrels dropped", f"{len(grades[qid])} qrels pair(s) for a query not in queries.jsonl"
            )

    official = "dev" in qrels_files and "test" in qrels_files
    train_only = both = 0
    cases: list[_Case] = []
    for qid, text in queries.items():
        judged = grades.get(qid)
        if judged is None:
            run.skip(qid, "query skipped", "unjudged (no qrels)")
            continue
        relevant: dict[str, int] = {}
        lost = False
        for did, grade in judged.items():
            if did not in doc_ids:
                run.skip(qid, "qrels pair dropped", f"document '{did}' is not in the corpus")
                lost = lost or grade >= 1
            elif grade >= 1:
                relevant[did] = grade
        if not relevant:
            if lost:
                reason = "no relevant document left (its relevant documents are missing from the corpus)"
            else:
                reason = "no relevant document (every grade <= 0)"
            run.skip(qid, "query skipped", reason)
            continue
        fixed: str | None = None
        if official:
            splits = in_split[qid]
            if "test" in splits:
                fixed = "holdout"
                both += "dev" in splits
            else:
                fixed = "dev"
                train_only += "dev" not in splits
        cases.append(_Case(qid, text, relevant, [], [], ["beir"], fixed))
    if official:
        run.note("qrels", "dev.tsv -> split 'dev', test.tsv -> split 'holdout' (holdout_share not used)")
        if both:
            run.note("qrels", f"{both} query(ies) in both dev.tsv and test.tsv: put into holdout")
        if train_only:
            run.note("qrels", f"{train_only} query(ies) only in train.tsv: put into dev")
    return cases


# --------------------------------------------------------------------------- clapnq


def _clapnq_tsv_ids(folder: Path, run: _Run) -> dict[str, list[str]]:
    """``doc-id-list`` per question id, from every ``*.tsv`` with that column."""
    ids: dict[str, list[str]] = {}
    csv.field_size_limit(1 << 30)
    for path in sorted(folder.glob("*.tsv")):
        with path.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh, delimiter="\t")
            if (
                not reader.fieldnames
                or "id" not in reader.fieldnames
                or "doc-id-list" not in reader.fieldnames
            ):
                run.note(path.name, "ignored: no 'id' and 'doc-id-list' columns")
                continue
            for row in reader:
                qid = (row.get("id") or "").strip()
                listed = (row.get("doc-id-list") or "").replace(",", " ").split()
                if qid and listed:
                    ids.setdefault(qid, listed)
    return ids


_Record = tuple[str, int, dict[str, Any], bool, list[tuple[str | None, str]]]
"""file name, line, object, from the unanswerable file, keys of its passages"""


@dataclass
class _Passage:
    title: str | None
    text: str
    tsv_ids: set[str] = field(default_factory=set)
    doc_id: str = ""


def _passage_hash(title: str | None, text: str) -> str:
    return hashlib.sha256(f"{title or ''}\x1f{text}".encode("utf-8", "surrogatepass")).hexdigest()


def _locate_sentence(sentence: str, texts: list[tuple[str, str]]) -> tuple[str, int, int] | None:
    """The first occurrence of a selected sentence in the question's passages."""
    variants = _dedupe([sentence, sentence.strip(), sentence.strip().rstrip("&").strip()])
    for variant in variants:
        if not variant:
            continue
        for doc_id, text in texts:
            pos = text.find(variant)
            if pos != -1:
                return doc_id, pos, pos + len(variant)
    return None


def _import_clapnq(source: Path, out: _JsonlWriter, run: _Run) -> list[_Case]:
    if source.is_file():
        files, folder = [source], source.parent
    elif source.is_dir():
        files, folder = sorted(source.glob("*.jsonl")), source
    else:
        raise DatasetError(f"not found: {source}", file=str(source))
    if not files:
        raise DatasetError(f"no .jsonl files in {source}", file=str(source))
    tsv_ids = _clapnq_tsv_ids(folder, run)

    # Pass 1: records and distinct passages.
    records: list[_Record] = []
    passages: dict[tuple[str | None, str], _Passage] = {}
    for path in files:
        unanswerable = "unanswerable" in path.name.lower()
        for lineno, obj in _iter_jsonl(path, run, path.name):
            keys: list[tuple[str | None, str]] = []
            raw = obj.get("passages")
            for n, p in enumerate(raw if isinstance(raw, list) else []):
                text = p.get("text") if isinstance(p, dict) else None
                if not isinstance(text, str) or not text.strip():
                    run.skip(f"{path.name}:{lineno}", "passage skipped", f"passage {n} has no text")
                    continue
                title = _nonempty_str(p.get("title"))
                key = (title, text)
                passages.setdefault(key, _Passage(title, text))
                keys.append(key)
            qid = _nonempty_str(obj.get("id"))
            listed = tsv_ids.get(qid or "", [])
            if listed and len(listed) == len(keys):
                for key, tsv_id in zip(keys, listed, strict=True):
                    passages[key].tsv_ids.add(tsv_id)
            elif listed:
                run.note(
                    qid or "", f"doc-id-list has {len(listed)} id(s) for {len(keys)} passage(s): not used"
                )
            records.append((path.name, lineno, obj, unanswerable, keys))

    # Document ids: the tsv id when it names exactly one passage, else a stable hash.
    owners: dict[str, set[tuple[str | None, str]]] = {}
    for key, passage in passages.items():
        for tsv_id in passage.tsv_ids:
            owners.setdefault(tsv_id, set()).add(key)
    taken: set[str] = set()
    for key, passage in passages.items():
        digest = _passage_hash(*key)
        metadata: dict[str, Any] = {"source": "clapnq"}
        if len(passage.tsv_ids) == 1 and len(owners[next(iter(passage.tsv_ids))]) == 1:
            candidate = next(iter(passage.tsv_ids))
            metadata["nq_doc_id"] = candidate
        elif passage.tsv_ids:
            first = sorted(passage.tsv_ids)[0]
            candidate = f"{first}~{digest[:8]}"
            metadata["nq_doc_ids"] = sorted(passage.tsv_ids)
            run.note(candidate, f"doc-id-list id '{first}' names several different passages: id made unique")
        else:
            candidate = f"clapnq-{digest[:16]}"
        passage.doc_id = _unique_id(candidate, taken)
        out.write(_doc_record(passage.doc_id, passage.text, passage.title, metadata))
    run.documents = out.count

    # Pass 2: questions.
    cases: list[_Case] = []
    first_at: dict[str, str] = {}
    no_evidence: list[str] = []
    for fname, lineno, obj, unanswerable, keys in records:
        where = f"{fname}:{lineno}"
        qid = _nonempty_str(obj.get("id"))
        if qid is None:
            run.skip(where, "question skipped", "missing id")
            continue
        question = obj.get("input")
        if not isinstance(question, str) or not question.strip():
            run.skip(qid, "question skipped", f"empty or missing question text ({where})")
            continue
        if qid in first_at:
            run.skip(qid, "duplicate question id", f"{where}; kept {first_at[qid]}")
            continue
        outputs = [o for o in obj.get("output") or [] if isinstance(o, dict)]
        answers = _dedupe(
            [o["answer"].strip() for o in outputs if isinstance(o.get("answer"), str) and o["answer"].strip()]
        )
        if unanswerable:
            if answers:
                run.note(
                    qid, "has a written answer but comes from the unanswerable file: imported as unanswerable"
                )
            first_at[qid] = where
            cases.append(_Case(qid, question.strip(), {}, [], [], ["clapnq", "unanswerable"]))
            continue
        if not keys:
            run.skip(qid, "question skipped", f"answerable but no usable passage ({where})")
            continue
        texts = [(passages[k].doc_id, k[1]) for k in keys]
        spans: set[tuple[str, int, int]] = set()
        sentences = _dedupe(
            [
                s
                for o in outputs
                if isinstance(o.get("selected_sentences"), list)
                for s in o["selected_sentences"]
                if isinstance(s, str) and s.strip()
            ]
        )
        for sentence in sentences:
            found = _locate_sentence(sentence, texts)
            if found is None:
                run.skip(
                    qid, "evidence dropped", f"selected sentence {_short(sentence)} is not in the passage"
                )
            else:
                spans.add(found)
        if not spans:
            no_evidence.append(qid)
        first_at[qid] = where
        relevant = {passages[k].doc_id: 1 for k in keys}
        cases.append(_Case(qid, question.strip(), relevant, sorted(spans), answers, ["clapnq"]))
    if no_evidence:
        run.note(
            ", ".join(no_evidence[:5]) + (" ..." if len(no_evidence) > 5 else ""),
            f"{len(no_evidence)} answerable question(s) with no located selected sentence: no evidence spans",
        )
    return cases


# --------------------------------------------------------------------------- driver


def _groups_and_splits(
    cases: list[_Case], holdout_share: float, seed: int, run: _Run
) -> tuple[list[str | None], list[str], int]:
    result = group_near_duplicates([c.query for c in cases], ids=[c.query_id for c in cases], seed=seed)
    group_of = result.group_of
    fixed: list[str | None] = [c.fixed_split for c in cases]
    if any(s is not None for s in fixed):
        members: dict[str, list[int]] = {}
        for i, g in enumerate(group_of):
            members.setdefault(g, []).append(i)
        for g, idx in members.items():
            votes: Counter[str] = Counter()
            for i in idx:
                split = fixed[i]
                if split is not None:
                    votes[split] += 1
            if len(votes) < 2:
                continue
            top = votes.most_common()
            target = top[0][0] if top[0][1] > top[1][1] else fixed[idx[0]]
            moved = [cases[i].query_id for i in idx if fixed[i] not in (None, target)]
            for i in idx:
                fixed[i] = target
            run.note(
                g,
                f"near-duplicate group spans dev and holdout ({dict(sorted(votes.items()))}); "
                f"moved to {target}: {', '.join(moved)}",
            )
    splits = assign_splits(group_of, holdout_share=holdout_share, seed=seed, fixed=fixed)
    explicit = [g if result.sizes[g] > 1 else None for g in group_of]
    multi = sum(1 for n in result.sizes.values() if n > 1)
    return explicit, splits, multi


def _query_record(case: _Case, group: str | None, split: str) -> dict[str, Any]:
    rec: dict[str, Any] = {"query_id": case.query_id, "query": case.query}
    if case.relevant:
        rec["relevant"] = case.relevant
    if case.evidence:
        rec["evidence"] = [{"doc_id": d, "start": s, "end": e} for d, s, e in case.evidence]
    rec["answerable"] = case.answerable
    if case.references:
        rec["reference_answer"] = case.references
    rec["split"] = split
    if group is not None:
        rec["group"] = group
    rec["tags"] = case.tags
    return rec


def _check_out_dir(out_dir: Path, source: Path, overwrite: bool) -> bool:
    """Whether ``out_dir`` exists and must be replaced. Raises when it must not be touched."""
    src, dst = source.resolve(), out_dir.resolve()
    if dst == src or dst in src.parents:
        raise DatasetError(f"the output folder {out_dir} holds the source {source}; choose another folder")
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise DatasetError(f"the output path {out_dir} exists and is not a folder", file=str(out_dir))
    entries = sorted(out_dir.iterdir())
    if not entries:
        return True
    if not overwrite:
        raise DatasetError(
            f"the output folder {out_dir} exists and is not empty; pass overwrite=True (--overwrite) "
            "to replace it",
            file=str(out_dir),
        )
    dataset_files = {CORPUS_FILE, QUERIES_FILE, INTENTS_FILE}
    if not any(e.name in dataset_files for e in entries) or any(e.is_dir() for e in entries):
        raise DatasetError(
            f"refusing to replace {out_dir}: it does not look like a dataset folder "
            "(no corpus.jsonl / queries.jsonl, or it has subfolders)",
            file=str(out_dir),
        )
    return True


def _sibling(out_dir: Path, tag: str) -> Path:
    """A fresh hidden name beside ``out_dir`` (same file system, so rename is atomic)."""
    while True:
        path = out_dir.parent / f".{out_dir.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}"
        if not path.exists():
            return path


def _move_into_place(tmp: Path, out_dir: Path, replace: bool) -> None:
    if not replace:
        os.rename(tmp, out_dir)
        return
    old = _sibling(out_dir, "old")
    os.rename(out_dir, old)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        os.rename(old, out_dir)
        raise
    shutil.rmtree(old)


def import_dataset(
    fmt: str,
    source: Path,
    out_dir: Path,
    *,
    doc_unit: str = "context",
    holdout_share: float = 0.3,
    seed: int = 0,
    overwrite: bool = False,
) -> ImportReport:
    """Import ``source`` (format ``fmt``) into the dataset folder ``out_dir``.

    The folder is written beside ``out_dir`` under a temporary name, validated with
    :func:`load_dataset`, and renamed into place only when it passes.
    """
    if fmt not in FORMATS:
        raise UnknownNameError("import format", fmt, FORMATS)
    if doc_unit not in DOC_UNITS:
        raise UnknownNameError("document unit", doc_unit, DOC_UNITS)
    if doc_unit != "context" and fmt != "squad":
        raise ConfigError(f"doc_unit='{doc_unit}' applies to the squad format only")
    if not 0.0 <= holdout_share <= 1.0:
        raise ConfigError(f"holdout_share must be in [0, 1], got {holdout_share}")
    source, out_dir = Path(source).expanduser(), Path(out_dir).expanduser()
    if not source.exists():
        raise DatasetError(f"source not found: {source}", file=str(source))
    replace = _check_out_dir(out_dir, source, overwrite)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out_dir, "importing")
    tmp.mkdir()  # honours the umask, unlike tempfile.mkdtemp
    run = _Run()
    try:
        with (tmp / CORPUS_FILE).open("wb") as fh:
            writer = _JsonlWriter(fh, run)
            if fmt == "squad":
                cases = _import_squad(source, doc_unit, writer, run)
            elif fmt == "beir":
                cases = _import_beir(source, writer, run)
            else:
                cases = _import_clapnq(source, writer, run)
        if run.documents == 0:
            raise DatasetError(
                f"nothing to import: no document of {source} could be mapped", file=str(source)
            )
        if not cases:
            first = "; ".join(f"{i}: {r}" for i, r in run.skipped[:3])
            raise DatasetError(
                f"nothing to import: no query of {source} could be mapped ({len(run.skipped)} skipped"
                + (f", e.g. {first}" if first else "")
                + ")",
                file=str(source),
            )
        groups, splits, multi = _groups_and_splits(cases, holdout_share, seed, run)
        with (tmp / QUERIES_FILE).open("wb") as fh:
            qwriter = _JsonlWriter(fh, run)
            for case, group, split in zip(cases, groups, splits, strict=True):
                qwriter.write(_query_record(case, group, split))
        if run.surrogates:
            run.note("text", f"{run.surrogates} lone surrogate character(s) replaced by U+FFFD")
        dataset = load_dataset(tmp, holdout_share=holdout_share, seed=seed)
        if len(dataset.queries) != len(cases) or len(dataset.documents) != run.documents:
            raise DatasetError("internal error: the written dataset does not match the import", file=str(tmp))
        _move_into_place(tmp, out_dir, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    answerable = sum(1 for c in cases if c.answerable)
    return ImportReport(
        format=fmt,
        source=str(source),
        out_dir=str(out_dir),
        documents=run.documents,
        queries=len(cases),
        answerable=answerable,
        unanswerable=len(cases) - answerable,
        skipped=run.skipped,
        relocated_spans=run.relocated,
        groups_multi=multi,
        splits={s: splits.count(s) for s in ("dev", "holdout")},
        notes=run.notes,
    )
