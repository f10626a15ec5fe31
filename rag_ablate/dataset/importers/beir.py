"""BEIR folders: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl``
(``_id``, ``text``) and ``qrels/{train,dev,test}.tsv`` (``query-id corpus-id score``).

Every present qrels file is read; a pair in several files keeps its highest grade;
grades <= 0 are not relevant: they become the query's ``nonrelevant`` (judged, not relevant).
With both ``dev.tsv`` and ``test.tsv`` the official split is kept (dev -> ``dev``, test ->
``holdout``; train-only queries -> ``dev``), except that a near-duplicate group spanning both
moves whole to the split of its majority (reported in ``notes``). Queries without any qrels
are unjudged, not unanswerable: they are skipped and reported.
"""

from __future__ import annotations

from pathlib import Path

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.importers.common import (
    IMPORTERS,
    Case,
    Importer,
    ImportRun,
    JsonlWriter,
    doc_record,
    iter_jsonl,
    nonempty_str,
)

_QRELS_SPLITS = ("train", "dev", "test")


def _read_qrels(path: Path, label: str, run: ImportRun) -> list[tuple[str, str, int]]:
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


def _import_beir(folder: Path, out: JsonlWriter, run: ImportRun) -> list[Case]:
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
    for lineno, obj in iter_jsonl(folder / "corpus.jsonl", run, "corpus.jsonl"):
        doc_id = nonempty_str(obj.get("_id"))
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
            doc_record(
                doc_id,
                text,
                title if isinstance(title, str) and title.strip() else None,
                metadata if isinstance(metadata, dict) else {},
            )
        )
    run.documents = out.count

    queries: dict[str, str] = {}
    for lineno, obj in iter_jsonl(folder / "queries.jsonl", run, "queries.jsonl"):
        qid = nonempty_str(obj.get("_id"))
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
    cases: list[Case] = []
    for qid, text in queries.items():
        judged = grades.get(qid)
        if judged is None:
            run.skip(qid, "query skipped", "unjudged (no qrels)")
            continue
        relevant: dict[str, int] = {}
        nonrelevant: list[str] = []  # judged, grade <= 0: the query's 'nonrelevant'
        lost = False
        for did, grade in judged.items():
            if did not in doc_ids:
                run.skip(qid, "qrels pair dropped", f"document '{did}' is not in the corpus")
                lost = lost or grade >= 1
            elif grade >= 1:
                relevant[did] = grade
            else:
                nonrelevant.append(did)
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
        cases.append(Case(qid, text, relevant, [], [], ["beir"], fixed, tuple(nonrelevant)))
    if official:
        run.note("qrels", "dev.tsv -> split 'dev', test.tsv -> split 'holdout' (holdout_share not used)")
        if both:
            run.note("qrels", f"{both} query(ies) in both dev.tsv and test.tsv: put into holdout")
        if train_only:
            run.note("qrels", f"{train_only} query(ies) only in train.tsv: put into dev")
    return cases


@IMPORTERS.register("beir")
class Beir(Importer):
    """A BEIR folder (corpus.jsonl, queries.jsonl, qrels/*.tsv)."""

    summary = "BEIR folder: corpus.jsonl, queries.jsonl, qrels/{train,dev,test}.tsv"

    def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
        return _import_beir(source, out, run)
