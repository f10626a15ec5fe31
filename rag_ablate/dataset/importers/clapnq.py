"""ClapNQ: ``clapnq_<split>_answerable.jsonl``, ``clapnq_<split>_unanswerable.jsonl``
and the ``question_<split>_*.tsv`` files of one folder (or one ``.jsonl`` file).

Every distinct passage (exact title and text) becomes one document, its id the tsv
``doc-id-list`` entry when that id names exactly this passage, otherwise a stable
hash id. Answerable questions: their gold passage is relevant (grade 1), evidence =
the selected sentences found in it, reference answers = the non-empty written
answers. Unanswerable questions (from the ``unanswerable`` file): per ClapNQ's
README their passage is a randomly chosen passage of the question's Wikipedia page
that does not answer it, so the question gets no relevant document, and that
passage stays in the corpus as a distractor.
"""

from __future__ import annotations

import csv
import hashlib
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
    iter_jsonl,
    nonempty_str,
    short,
    unique_id,
)


def _clapnq_tsv_ids(folder: Path, run: ImportRun) -> dict[str, list[str]]:
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
    variants = dedupe([sentence, sentence.strip(), sentence.strip().rstrip("&").strip()])
    for variant in variants:
        if not variant:
            continue
        for doc_id, text in texts:
            pos = text.find(variant)
            if pos != -1:
                return doc_id, pos, pos + len(variant)
    return None


def _import_clapnq(source: Path, out: JsonlWriter, run: ImportRun) -> list[Case]:
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
        for lineno, obj in iter_jsonl(path, run, path.name):
            keys: list[tuple[str | None, str]] = []
            raw = obj.get("passages")
            for n, p in enumerate(raw if isinstance(raw, list) else []):
                text = p.get("text") if isinstance(p, dict) else None
                if not isinstance(text, str) or not text.strip():
                    run.skip(f"{path.name}:{lineno}", "passage skipped", f"passage {n} has no text")
                    continue
                title = nonempty_str(p.get("title"))
                key = (title, text)
                passages.setdefault(key, _Passage(title, text))
                keys.append(key)
            qid = nonempty_str(obj.get("id"))
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
        passage.doc_id = unique_id(candidate, taken)
        out.write(doc_record(passage.doc_id, passage.text, passage.title, metadata))
    run.documents = out.count

    # Pass 2: questions.
    cases: list[Case] = []
    first_at: dict[str, str] = {}
    no_evidence: list[str] = []
    for fname, lineno, obj, unanswerable, keys in records:
        where = f"{fname}:{lineno}"
        qid = nonempty_str(obj.get("id"))
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
        answers = dedupe(
            [o["answer"].strip() for o in outputs if isinstance(o.get("answer"), str) and o["answer"].strip()]
        )
        if unanswerable:
            if answers:
                run.note(
                    qid, "has a written answer but comes from the unanswerable file: imported as unanswerable"
                )
            first_at[qid] = where
            cases.append(Case(qid, question.strip(), {}, [], [], ["clapnq", "unanswerable"]))
            continue
        if not keys:
            run.skip(qid, "question skipped", f"answerable but no usable passage ({where})")
            continue
        texts = [(passages[k].doc_id, k[1]) for k in keys]
        spans: set[tuple[str, int, int]] = set()
        sentences = dedupe(
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
                    qid, "evidence dropped", f"selected sentence {short(sentence)} is not in the passage"
                )
            else:
                spans.add(found)
        if not spans:
            no_evidence.append(qid)
        first_at[qid] = where
        relevant = {passages[k].doc_id: 1 for k in keys}
        cases.append(Case(qid, question.strip(), relevant, sorted(spans), answers, ["clapnq"]))
    if no_evidence:
        run.note(
            ", ".join(no_evidence[:5]) + (" ..." if len(no_evidence) > 5 else ""),
            f"{len(no_evidence)} answerable question(s) with no located selected sentence: no evidence spans",
        )
    return cases


@IMPORTERS.register("clapnq")
class ClapNQ(Importer):
    """ClapNQ's answerable / unanswerable jsonl files (and its tsv doc ids)."""

    summary = "ClapNQ folder: clapnq_<split>_{answerable,unanswerable}.jsonl (+ question_*.tsv)"

    def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
        return _import_clapnq(source, out, run)
