"""TREC exports, so results meet trec_eval, ranx and ir_measures.

``run.trec``: one line per retrieved document, ``qid Q0 doc_id rank score run``.
The ranked chunks are first mapped to documents and de-duplicated keeping the
first occurrence, as the metrics do. Scores are derived from the rank
(``n - rank + 1``) because tools re-sort by score and break ties their own way;
rank-derived scores make every tool see exactly rag_ablate's order.

``qrels.trec``: ``qid 0 doc_id grade`` for answerable queries that need retrieval
(unanswerable and no-retrieval cases have no judgements, as in the metrics).
Failed queries have no run lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.dataset.model import Dataset
from rag_ablate.metrics.retrieval import unique_docs
from rag_ablate.records.trace import Record

RUN_FILE = "run.trec"
QRELS_FILE = "qrels.trec"


def _safe(s: str) -> str:
    if any(c.isspace() for c in s):
        raise ValueError(f"TREC files cannot hold ids with whitespace: {s!r}")
    return s


def trec_run_lines(records: Iterable[Record], run_name: str) -> list[str]:
    name = "".join(c if not c.isspace() else "_" for c in run_name) or "run"
    lines = []
    for r in records:
        if r["status"] != "ok" or r["kind"] != "answerable":
            continue
        docs = unique_docs(x["doc_id"] for x in r.get("retrieved") or [] if x["doc_id"] is not None)
        n = len(docs)
        for rank, doc in enumerate(docs, start=1):
            lines.append(f"{_safe(r['query_id'])} Q0 {_safe(doc)} {rank} {n - rank + 1} {name}")
    return lines


def trec_qrels_lines(dataset: Dataset, query_ids: Sequence[str] | None = None) -> list[str]:
    keep = set(query_ids) if query_ids is not None else None
    lines = []
    for q in dataset.queries:
        if q.kind != "answerable" or (keep is not None and q.query_id not in keep):
            continue
        judged = {**dict.fromkeys(q.nonrelevant, 0), **q.relevant}  # nonrelevant: grade 0
        for doc, grade in sorted(judged.items()):
            lines.append(f"{_safe(q.query_id)} 0 {_safe(doc)} {grade}")
    return lines


def write_trec(records: Sequence[Record], dataset: Dataset, folder: Path, run_name: str) -> list[Path]:
    run_path, qrels_path = folder / RUN_FILE, folder / QRELS_FILE
    write_text_atomic(run_path, "\n".join(trec_run_lines(records, run_name)) + "\n")
    write_text_atomic(qrels_path, "\n".join(trec_qrels_lines(dataset)) + "\n")
    return [run_path, qrels_path]
