"""Per-query retrieval metrics (docs/metrics.md, "Retrieval").

Document level: the ranked list is de-duplicated keeping the first occurrence,
and only the first k *unique* documents count. ``R`` is the set of documents with
grade >= 1; grades <= 0 are judged non-relevant. An empty ``R`` is a caller error
(unanswerable cases never enter these means) and raises ``ValueError``.

Evidence level: chunks are *not* de-duplicated (a chunk is a (doc_id, start,
end) character range); a gold evidence span counts as covered when one of the
first k chunks lies in the same document and overlaps it.

Cost: one pass over the ranked list that stops after ``max(ks)`` unique
documents, one sort of the relevant grades, then O(1) work per k.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

from rag_ablate.errors import ConfigError
from rag_ablate.metrics.registry import metric_name

__all__ = [
    "RETRIEVAL_BASES",
    "SET_BASES",
    "evidence_recall",
    "retrieval_metrics",
    "set_metrics",
    "unique_docs",
]

RETRIEVAL_BASES: tuple[str, ...] = ("hit", "recall", "precision", "mrr", "ndcg", "full_recall")
"""The metric bases ``retrieval_metrics`` returns for every k, in this order."""

SET_BASES: tuple[str, ...] = ("set_recall", "set_hit")
"""The metric bases ``set_metrics`` returns for every k, in this order."""


def unique_docs(doc_ids: Iterable[str]) -> list[str]:
    """The ids in order, each kept at its first occurrence only."""
    seen: set[str] = set()
    out: list[str] = []
    for doc_id in doc_ids:
        if doc_id not in seen:
            seen.add(doc_id)
            out.append(doc_id)
    return out


def _check_ks(ks: Sequence[int]) -> list[int]:
    if isinstance(ks, (str, bytes)):
        raise TypeError("ks must be a sequence of integers, not a string")
    checked = list(ks)
    for k in checked:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"cutoff k must be a positive integer, got {k!r}")
    return checked


@lru_cache(maxsize=256)
def _names_at(k: int) -> tuple[str, ...]:
    return tuple(metric_name(base, k) for base in RETRIEVAL_BASES)


def _gain(grade: int) -> float:
    return float(2**grade - 1)


def retrieval_metrics(
    ranked_doc_ids: Sequence[str],
    relevant: Mapping[str, int],
    ks: Sequence[int],
) -> dict[str, float]:
    """hit, recall, precision, mrr, ndcg and full_recall at every k in ``ks``.

    ``ranked_doc_ids`` is the ranking mapped to document ids (duplicates
    allowed); ``relevant`` maps doc id -> grade. Keys are canonical names
    (``recall_at_5``), grouped by k in the order of ``ks``.

    * precision divides by k even when fewer than k unique documents came back;
    * ndcg uses gain ``2**grade - 1`` and discount ``log2(rank + 1)``; the ideal
      DCG takes the grades of ``R`` sorted descending, cut at k.

    Raises ``ValueError`` when no document has grade >= 1 and ``ConfigError`` for
    a cutoff that is not a positive integer.
    """
    if isinstance(ranked_doc_ids, (str, bytes)):
        raise TypeError("ranked_doc_ids must be a sequence of doc ids, not a string")
    checked_ks = _check_ks(ks)
    grades = [g for g in relevant.values() if g >= 1]
    n_rel = len(grades)
    if n_rel == 0:
        raise ValueError(
            "retrieval metrics need at least one relevant document (grade >= 1); "
            "unanswerable cases must not enter retrieval means"
        )
    if not checked_ks:
        return {}
    max_k = max(checked_ks)

    # Prefix sums over the first max_k unique documents: index i covers ranks 1..i.
    hits_prefix = [0]
    dcg_prefix = [0.0]
    first_rel_rank = 0  # 0: no relevant document seen
    seen: set[str] = set()
    for doc_id in ranked_doc_ids:
        if doc_id in seen:
            continue
        seen.add(doc_id)
        rank = len(hits_prefix)
        grade = relevant.get(doc_id, 0)
        if grade >= 1:
            hits_prefix.append(hits_prefix[-1] + 1)
            dcg_prefix.append(dcg_prefix[-1] + _gain(grade) / math.log2(rank + 1))
            if first_rel_rank == 0:
                first_rel_rank = rank
        else:
            hits_prefix.append(hits_prefix[-1])
            dcg_prefix.append(dcg_prefix[-1])
        if rank == max_k:
            break
    n_ranked = len(hits_prefix) - 1

    ideal_prefix = [0.0]
    for rank, grade in enumerate(heapq.nlargest(max_k, grades), start=1):
        ideal_prefix.append(ideal_prefix[-1] + _gain(grade) / math.log2(rank + 1))

    out: dict[str, float] = {}
    for k in checked_ks:
        upto = min(k, n_ranked)
        hits = hits_prefix[upto]
        values = (
            1.0 if hits > 0 else 0.0,
            hits / n_rel,
            hits / k,
            1.0 / first_rel_rank if 0 < first_rel_rank <= k else 0.0,
            dcg_prefix[upto] / ideal_prefix[min(k, n_rel)],
            1.0 if hits == n_rel else 0.0,
        )
        for name, value in zip(_names_at(k), values, strict=True):
            out[name] = value
    return out


def set_metrics(
    ranked_doc_ids: Sequence[str],
    relevant_sets: Sequence[Iterable[str]],
    ks: Sequence[int],
) -> dict[str, float]:
    """set_recall and set_hit at every k in ``ks`` for alternative evidence sets.

    Each set in ``relevant_sets`` is enough to answer on its own. With ``top`` the
    first k *unique* documents of the ranking (de-duplicated as in
    :func:`retrieval_metrics`):

    * ``set_recall_at_k`` = max over sets S of ``|S & top| / |S|``: the share of the
      best-covered set that was found;
    * ``set_hit_at_k`` = 1 if some set lies wholly in ``top``, else 0.

    Raises ``ValueError`` for no sets or an empty set, ``ConfigError`` for a bad k.
    """
    if isinstance(ranked_doc_ids, (str, bytes)):
        raise TypeError("ranked_doc_ids must be a sequence of doc ids, not a string")
    checked_ks = _check_ks(ks)
    sets = [frozenset(s) for s in relevant_sets]
    if not sets or not all(sets):
        raise ValueError("set metrics need at least one non-empty set of relevant doc ids")
    if not checked_ks:
        return {}
    # rank (1-based) of each document among the unique ones, up to max k
    rank_of: dict[str, int] = {}
    for doc_id in unique_docs(ranked_doc_ids)[: max(checked_ks)]:
        rank_of[doc_id] = len(rank_of) + 1
    out: dict[str, float] = {}
    for k in checked_ks:
        best = 0.0
        for s in sets:
            best = max(best, sum(1 for d in s if rank_of.get(d, k + 1) <= k) / len(s))
        out[f"set_recall_at_{k}"] = best
        out[f"set_hit_at_{k}"] = 1.0 if best == 1.0 else 0.0
    return out


def _merge(ranges: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Sorted, disjoint union of non-empty [start, end) ranges, as starts and ends."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in sorted(ranges):
        if end <= start:
            continue  # an empty chunk covers nothing
        if ends and start < ends[-1]:
            ends[-1] = max(ends[-1], end)
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


def evidence_recall(
    ranked_chunks: Sequence[tuple[str, int, int]],
    evidence: Sequence[tuple[str, int, int]],
    k: int,
) -> float:
    """Share of evidence spans overlapped by one of the first k chunks of the same doc.

    Chunks and spans are ``(doc_id, start, end)`` with ``[start, end)`` character
    offsets; two ranges overlap when ``start < other_end and other_start < end``,
    so touching ranges ([0, 10) and [10, 20)) do not. An empty chunk
    (``start == end``) holds no character and covers nothing. Chunks are not
    de-duplicated: the first k *chunks* count.

    Raises ``ValueError`` for empty evidence, a span with ``end <= start``, a
    chunk with ``end < start`` or any negative offset, and ``ConfigError`` for
    a k that is not a positive integer.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"cutoff k must be a positive integer, got {k!r}")
    if len(evidence) == 0:
        raise ValueError("evidence_recall needs at least one evidence span")
    for doc_id, start, end in evidence:
        if start < 0 or end <= start:
            raise ValueError(f"evidence span ({doc_id!r}, {start}, {end}) must satisfy 0 <= start < end")

    per_doc: dict[str, list[tuple[int, int]]] = {}
    for doc_id, start, end in ranked_chunks[:k]:
        if start < 0 or end < start:
            raise ValueError(f"chunk ({doc_id!r}, {start}, {end}) must satisfy 0 <= start <= end")
        per_doc.setdefault(doc_id, []).append((start, end))
    merged = {doc_id: _merge(ranges) for doc_id, ranges in per_doc.items()}

    covered = 0
    for doc_id, start, end in evidence:
        if doc_id not in merged:
            continue
        starts, ends = merged[doc_id]
        # Last merged range starting before the span ends; the ranges are
        # disjoint and sorted, so it reaches furthest right among candidates.
        i = bisect_left(starts, end) - 1
        if i >= 0 and ends[i] > start:
            covered += 1
    return covered / len(evidence)
