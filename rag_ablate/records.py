"""Per-query records: write, read, score and aggregate.

A record is one JSON line per query in ``records.jsonl``: the query's identity
(id, split, group, kind, gold intent), the system's trace (retrieved chunks with
doc ids, offsets and scores; predicted intent; status; stage timings) and the
per-query metric values. :func:`score_record` computes the values from the
record's own fields plus the dataset, so every number can be recomputed from disk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.dataset import SPLITS, Dataset, Document, Query
from rag_ablate.metrics import context_tokens, evidence_recall, intent_top1, retrieval_metrics
from rag_ablate.systems import Trace

Record = dict[str, Any]
RECORDS_FILE = "records.jsonl"


def make_record(query: Query, trace: Trace) -> Record:
    return {
        "query_id": query.query_id,
        "query": query.query,
        "split": query.split,
        "group": query.group,
        "kind": query.kind,
        "intent_gold": query.intent_l2,
        "intent_gold_l1": query.intent_l1,
        **{k: v for k, v in trace.to_dict().items() if k != "query_id"},
    }


def score_record(
    rec: Mapping[str, Any],
    query: Query,
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
) -> dict[str, float | None]:
    """Per-query metric values of one record.

    A failed query gets no quality values, only ``latency_ms`` (its time until
    it failed), so latency percentiles include slow failures.
    """
    out: dict[str, float | None] = {}
    timings = rec.get("timings_ms") or {}
    if "total" in timings:
        out["latency_ms"] = float(timings["total"])
    if rec["status"] != "ok":
        return out
    if routed and query.intent_l2 is not None:
        out["intent_top1"] = intent_top1(query.intent_l2, rec.get("intent_pred"))
    if query.kind == "no_rag":
        return out
    retrieved = rec.get("retrieved") or []
    texts = [docs[r["doc_id"]].text[r["start"] : r["end"]] for r in retrieved]
    for k in ks:
        out[f"context_tokens_at_{k}"] = float(context_tokens(texts, k))
    if query.kind == "answerable":
        out.update(retrieval_metrics([r["doc_id"] for r in retrieved], query.relevant, ks))
        if query.evidence:
            chunks = [(r["doc_id"], r["start"], r["end"]) for r in retrieved]
            spans = [(e.doc_id, e.start, e.end) for e in query.evidence]
            for k in ks:
                out[f"evidence_recall_at_{k}"] = evidence_recall(chunks, spans, k)
    return out


def scored(
    rec: Record,
    query: Query,
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
) -> Record:
    """``rec`` with its ``metrics``; a crash while scoring makes the query failed, not the run.

    The failed record keeps its trace and latency; ``error`` says ``scoring failed: ...``.
    """
    try:
        return {**rec, "metrics": score_record(rec, query, docs, ks, routed=routed)}
    except Exception as exc:  # a bad trace (unknown doc id, broken offsets, ...) fails one query only
        failed = {**rec, "status": "failed", "error": f"scoring failed: {type(exc).__name__}: {exc}"}
        total = (rec.get("timings_ms") or {}).get("total")
        failed["metrics"] = {} if total is None else {"latency_ms": float(total)}
        return failed


def write_records(path: Path, records: Iterable[Record]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def read_records(path: Path) -> list[Record]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def rescore(records: Sequence[Record], dataset: Dataset, ks: Sequence[int], routed: bool) -> list[Record]:
    """Recompute every record's metrics from its trace (records on disk suffice)."""
    by_id = {q.query_id: q for q in dataset.queries}
    return [scored(r, by_id[r["query_id"]], dataset.documents, ks, routed=routed) for r in records]


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def aggregate(records: Sequence[Record]) -> dict[str, float]:
    """Split-prefixed means and counts: ``dev/recall_at_5``, ``holdout/n_failed``, ``all/...``.

    Means run over the queries that have a value (answerable ones for retrieval
    metrics); failed queries count in ``n_failed`` and ``error_rate``, and in
    ``latency_ms`` (timed until they failed), never in the quality metrics. A
    metric no query has a value for (intent accuracy when every routed query
    failed) is absent, not 0.
    """
    out: dict[str, float] = {}
    for split in (*SPLITS, "all"):
        rows = [r for r in records if split == "all" or r["split"] == split]
        p = f"{split}/"
        out[p + "n_queries"] = float(len(rows))
        for kind in ("answerable", "unanswerable", "no_rag"):
            out[p + f"n_{kind}"] = float(sum(1 for r in rows if r["kind"] == kind))
        failed = sum(1 for r in rows if r["status"] != "ok")
        out[p + "n_failed"] = float(failed)
        out[p + "error_rate"] = failed / len(rows) if rows else 0.0
        values: dict[str, list[float]] = {}
        for r in rows:
            for name, v in (r.get("metrics") or {}).items():
                if v is not None and not (isinstance(v, float) and math.isnan(v)):
                    values.setdefault(name, []).append(float(v))
        for name in sorted(values):
            out[p + name] = float(np.mean(values[name]))
        lat = values.get("latency_ms")
        if lat:
            out[p + "latency_ms_p50"] = _percentile(lat, 50)
            out[p + "latency_ms_p95"] = _percentile(lat, 95)
    return out
