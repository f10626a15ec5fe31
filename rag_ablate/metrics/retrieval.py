"""Per-query retrieval metrics (docs/metrics.md, "Retrieval").

Document level: the ranked list is de-duplicated keeping the first occurrence,
and only the first k *unique* documents count. ``R`` is the set of documents with
grade >= 1; grades <= 0 are judged non-relevant. An empty ``R`` is a caller error
(unanswerable cases never enter these means) and raises ``ValueError``.

Chunk level (:func:`chunk_metrics`): the same definitions over chunk ids, against a
query's gold chunk ids (``relevant_chunks``).

Evidence level: chunks are *not* de-duplicated (a chunk is a (doc_id, start,
end) character range); a gold evidence span counts as covered when one of the
first k chunks lies in the same document and overlaps it (:func:`evidence_recall`),
and :func:`evidence_coverage_at` measures how much of each span's text the first k
chunks hold.

Label coverage (:func:`judged_at`, :func:`bpref`): how much of the ranking was ever
labelled, and trec_eval's bpref, which ranks the relevant documents against the judged
non-relevant ones only (unlabelled documents are skipped, not read as misses).

Cost (:func:`retrieval_metrics`): the ranking is scanned at C speed (a set of
its ids, ``list.index`` per relevant document), the Python work runs over the
relevant documents only, the ideal DCG is cached per grade pattern and the
discounts ``log2(rank + 1)`` come from a table; then O(log n) work per k. The
values are bit-identical to summing gains rank by rank over the whole ranking.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import accumulate, islice

from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.registry import metric_name, metric_names_at

__all__ = [
    "CHUNK_BASES",
    "RETRIEVAL_BASES",
    "SET_BASES",
    "bpref",
    "chunk_metrics",
    "cutoffs",
    "evidence_at",
    "evidence_coverage_at",
    "evidence_recall",
    "evidence_recall_at",
    "judged_at",
    "ranking_metrics",
    "ranking_names",
    "ranking_values",
    "retrieval_metrics",
    "set_metrics",
    "unique_docs",
]

RETRIEVAL_BASES: tuple[str, ...] = ("hit", "recall", "precision", "mrr", "ndcg", "full_recall")
"""The metric bases ``retrieval_metrics`` returns for every k, in this order."""

SET_BASES: tuple[str, ...] = ("set_recall", "set_hit")
"""The metric bases ``set_metrics`` returns for every k, in this order."""

CHUNK_BASES: tuple[str, ...] = ("chunk_hit", "chunk_recall", "chunk_mrr", "chunk_ndcg")
"""The metric bases ``chunk_metrics`` returns for every k, in this order: the document-level
``hit``, ``recall``, ``mrr`` and ``ndcg`` computed over chunk ids."""

_CHUNK_OF = {base.removeprefix("chunk_"): base for base in CHUNK_BASES}


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


_GAINS: tuple[float, ...] = tuple(float(2**g - 1) for g in range(64))
"""``2**g - 1`` as a float for grades 0..63 (larger grades compute it)."""

_LOG2: list[float] = [0.0] + [math.log2(rank + 1) for rank in range(1, 1025)]
"""``log2(rank + 1)`` per rank (index 0 unused), replaced by a longer one on demand: the nDCG discounts."""

_NAMES: dict[tuple[int, ...], tuple[str, ...]] = {}
_IDEAL: dict[tuple[int, ...], list[float]] = {}
_SMALL_RELEVANT = 16  # up to this many judged docs: C-level scans of the ranking; more: one dict


def _gain(grade: int) -> float:
    return _GAINS[grade] if grade < 64 else float(2**grade - 1)


def _log2(rank: int) -> float:
    global _LOG2
    table = _LOG2
    if rank >= len(table):  # a longer table replaces the old one whole (threads may score at once)
        table = _LOG2 = table + [math.log2(r + 1) for r in range(len(table), 2 * rank + 1)]
    return table[rank]


_CHECKED: dict[int, tuple[tuple[int, ...], int]] = {}  # id(checked tuple) -> (the tuple, max k)
_CANONICAL: dict[tuple[int, ...], tuple[int, ...]] = {}  # a tuple of plain ints -> its checked tuple


def cutoffs(ks: Sequence[int]) -> tuple[tuple[int, ...], int]:
    """``ks`` as a tuple and its largest value (0 for none); ConfigError for a bad k.

    The tuple returned for plain ints is one shared object per value, and passing it back is not
    checked again (a tuple cannot change): scoring checks a run's cutoffs once per query, and each
    metric function it calls finds them checked by identity."""
    known = _CHECKED.get(id(ks))
    if known is not None and known[0] is ks:
        return known
    if isinstance(ks, (str, bytes)):
        raise TypeError("ks must be a sequence of integers, not a string")
    key = tuple(ks)
    max_k = 0
    plain = True
    for k in key:
        if type(k) is not int:
            if isinstance(k, bool) or not isinstance(k, int):
                raise ConfigError(f"cutoff k must be a positive integer, got {k!r}")
            plain = False
        if k < 1:
            raise ConfigError(f"cutoff k must be a positive integer, got {k!r}")
        if k > max_k:
            max_k = k
    if not plain:
        return key, max_k
    canonical = _CANONICAL.get(key)
    if canonical is None:
        if len(_CANONICAL) >= 64:
            _CANONICAL.clear()
            _CHECKED.clear()
        canonical = _CANONICAL[key] = key
    # keyed by id: the tuple stays in _CANONICAL, so its id is not reused while the entry lives
    checked = _CHECKED[id(canonical)] = (canonical, max_k)
    return checked


def _names(ks: tuple[int, ...]) -> tuple[str, ...]:
    names = _NAMES.get(ks)
    if names is None:
        if len(_NAMES) > 256:
            _NAMES.clear()
        names = _NAMES[ks] = tuple(metric_name(base, k) for k in ks for base in RETRIEVAL_BASES)
    return names


def _ideal(grades: list[int], max_k: int) -> list[float]:
    """Ideal DCG prefix sums (index i: the best i grades), cached per grade pattern."""
    top = tuple(sorted(grades, reverse=True)[:max_k])  # heapq.nlargest's result, without its overhead
    ideal = _IDEAL.get(top)
    if ideal is None:
        if len(_IDEAL) > 4096:
            _IDEAL.clear()
        ideal = [0.0]
        acc = 0.0
        for rank, grade in enumerate(top, start=1):
            acc = acc + _gain(grade) / _log2(rank)
            ideal.append(acc)
        _IDEAL[top] = ideal
    return ideal


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

    Cost: the work runs over the relevant documents, not over the ranking: each is
    looked up in the ranking (C-level scans, or one dict of first positions when
    many documents are judged), the unique rank of each found one is the number of
    distinct ids before it plus one, and the sums run in rank order (so values are
    bit-identical to summing over the whole ranking, see docs/metrics.md).
    """
    if isinstance(ranked_doc_ids, (str, bytes)):
        raise TypeError("ranked_doc_ids must be a sequence of doc ids, not a string")
    key, max_k = cutoffs(ks)
    n = len(ranked_doc_ids)
    grades: list[int] = []
    found: list[tuple[int, int]] = []  # (index of the first occurrence in the ranking, grade)
    if len(relevant) <= _SMALL_RELEVANT:
        present = set(ranked_doc_ids)
        index = ranked_doc_ids.index
        for doc_id, grade in relevant.items():
            if grade >= 1:
                grades.append(grade)
                if doc_id in present:
                    found.append((index(doc_id), grade))
        has_duplicates = len(present) != n
    else:
        first = dict(zip(reversed(ranked_doc_ids), range(n - 1, -1, -1), strict=True))
        for doc_id, grade in relevant.items():
            if grade >= 1:
                grades.append(grade)
                i = first.get(doc_id)
                if i is not None:
                    found.append((i, grade))
        has_duplicates = len(first) != n
    n_rel = len(grades)
    if n_rel == 0:
        raise ValueError(
            "retrieval metrics need at least one relevant document (grade >= 1); "
            "unanswerable cases must not enter retrieval means"
        )
    if not key:
        return {}

    # ranks (1-based, among unique documents) of the relevant documents found, ascending,
    # and the DCG prefix sums over them (index h: the first h found)
    found.sort()
    ranks: list[int] = []
    dcg = [0.0]
    acc = 0.0
    seen: set[str] = set()
    prev = 0
    for i, grade in found:
        if has_duplicates:
            seen.update(ranked_doc_ids[prev:i])
            prev = i
            rank = len(seen) + 1
        else:
            rank = i + 1
        if rank > max_k:
            break
        ranks.append(rank)
        acc = acc + _gain(grade) / _log2(rank)
        dcg.append(acc)
    return dict(zip(_names(key), _values_at(key, ranks, dcg, _ideal(grades, max_k), n_rel), strict=True))


def _values_at(
    key: tuple[int, ...], ranks: list[int], dcg: list[float], ideal: list[float], n_rel: int
) -> list[float]:
    """The values of :data:`RETRIEVAL_BASES` at every k of ``key``, grouped by k: from the relevant
    documents' ranks (ascending, within the largest k), the DCG and ideal DCG prefix sums. None found:
    every value is 0.0 (0 hits over n_rel and k, 0.0 over an ideal DCG above 0, n_rel at least 1)."""
    if not ranks:
        return [0.0] * (len(RETRIEVAL_BASES) * len(key))
    first_rank = ranks[0]
    values: list[float] = []
    for k in key:
        hits = bisect_right(ranks, k)
        values.extend(
            (
                1.0 if hits > 0 else 0.0,
                hits / n_rel,
                hits / k,
                1.0 / first_rank if 0 < first_rank <= k else 0.0,
                dcg[hits] / ideal[k if k < n_rel else n_rel],
                1.0 if hits == n_rel else 0.0,
            )
        )
    return values


_JUDGED_NAMES: dict[tuple[int, ...], tuple[str, ...]] = {}  # ks -> ranking_metrics's names


def ranking_metrics(
    ranked_doc_ids: Sequence[str], labels: Mapping[str, int], ks: Sequence[int]
) -> dict[str, float]:
    """:func:`retrieval_metrics`, :func:`judged_at` and ``bpref`` (:func:`bpref`) in that order, from one
    pass over the ranking's unique documents (what scoring calls): ``labels`` maps every judged document
    to its grade (a judged non-relevant one to 0 or less), so ``R`` is its documents with grade >= 1.

    The same values bit for bit as the three functions (``retrieval_metrics(ranked, R's grades, ks)``,
    ``judged_at(ranked, labels, ks)``, ``bpref(ranked, labels)``): the same sums in the same order;
    the same ValueError when no document has grade >= 1. :func:`ranking_names` and
    :func:`ranking_values` give its names and values apart."""
    key = cutoffs(ks)[0]
    return dict(zip(ranking_names(key), ranking_values(ranked_doc_ids, labels, key), strict=True))


def ranking_names(ks: Sequence[int]) -> tuple[str, ...]:
    """The names of :func:`ranking_metrics` at the cutoffs ``ks``, in its order."""
    key = cutoffs(ks)[0]
    names = _JUDGED_NAMES.get(key)
    if names is None:
        if len(_JUDGED_NAMES) > 256:
            _JUDGED_NAMES.clear()
        names = (*_names(key), *metric_names_at("judged", key), metric_name("bpref"))
        _JUDGED_NAMES[key] = names
    return names


def ranking_values(
    ranked_doc_ids: Sequence[str], labels: Mapping[str, int], ks: Sequence[int]
) -> list[float]:
    """The values of :func:`ranking_metrics`, in the order of :func:`ranking_names` (scoring puts every
    value of a record into its metrics at once)."""
    key, max_k = cutoffs(ks)
    rel_grades = [g for g in labels.values() if g >= 1]
    n_rel = len(rel_grades)
    if n_rel == 0:
        raise ValueError(
            "retrieval metrics need at least one relevant document (grade >= 1); "
            "unanswerable cases must not enter retrieval means"
        )
    unique = list(dict.fromkeys(ranked_doc_ids))  # the ranking de-duplicated, first occurrences, in C
    grades = list(map(labels.get, unique))  # each unique document's grade, None when unlabelled
    n_nonrel = len(labels) - n_rel
    ranks: list[int] = []  # ranks (1-based, among unique documents) of the relevant ones within max_k
    dcg = [0.0]  # DCG prefix sums over them
    judged = [0]  # labelled documents among the first i unique ones (up to max_k)
    acc = 0.0
    above = 0  # bpref: judged non-relevant documents ranked so far
    total = 0.0
    n_judged = 0
    for rank, grade in enumerate(grades, start=1):
        if grade is not None:
            n_judged += 1
            if grade >= 1:
                total += 1.0 - min(above, n_rel) / min(n_nonrel, n_rel) if above else 1.0
                if rank <= max_k:
                    ranks.append(rank)
                    acc = acc + _gain(grade) / _log2(rank)
                    dcg.append(acc)
            else:
                above += 1
        if rank <= max_k:
            judged.append(n_judged)
    values = _values_at(key, ranks, dcg, _ideal(rel_grades, max_k), n_rel) if key else []
    n = len(judged) - 1
    values.extend([judged[k if k < n else n] / k for k in key])
    values.append(total / n_rel)
    return values


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


def chunk_metrics(
    ranked_chunk_ids: Sequence[str],
    relevant_chunks: Mapping[str, int],
    ks: Sequence[int],
) -> dict[str, float]:
    """chunk_hit, chunk_recall, chunk_mrr and chunk_ndcg at every k in ``ks``: gold chunk ids
    (a query's ``relevant_chunks``, chunk id -> grade) against the chunk ids of the ranking.

    The same definitions as :func:`retrieval_metrics` with chunk ids in place of document ids (a
    chunk id listed twice counts once, at its first rank); keys grouped by k in the order of ``ks``.
    Raises ``ValueError`` when no chunk has grade >= 1, ``ConfigError`` for a bad k.
    """
    values = retrieval_metrics(ranked_chunk_ids, relevant_chunks, ks)
    out: dict[str, float] = {}
    for k in ks:
        for base, chunk_base in _CHUNK_OF.items():
            out[f"{chunk_base}_at_{k}"] = values[f"{base}_at_{k}"]
    return out


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
    a k that is not a positive integer. :func:`evidence_recall_at` gives every
    cutoff at once.
    """
    return evidence_recall_at(ranked_chunks, evidence, [k])[0]


def evidence_recall_at(
    ranked_chunks: Sequence[tuple[str, int, int]],
    evidence: Sequence[tuple[str, int, int]],
    ks: Sequence[int],
) -> list[float]:
    """:func:`evidence_recall` at every k in ``ks`` (in that order), in one pass over the chunks.

    Each span is covered from the position of the first chunk (same document, non-empty)
    that overlaps it; the value at k is the share of spans covered within the first k
    chunks. Every chunk among the first ``max(ks)`` is checked (same errors as
    :func:`evidence_recall`). :func:`evidence_at` gives it with :func:`evidence_coverage_at`.
    """
    return evidence_at(ranked_chunks, evidence, ks)[0]


def _checked_spans(evidence: Sequence[tuple[str, int, int]]) -> Sequence[tuple[str, int, int]]:
    """``evidence`` after checking it: non-empty, every span ``0 <= start < end`` (ValueError)."""
    if len(evidence) == 0:
        raise ValueError("evidence metrics need at least one evidence span")
    for doc_id, start, end in evidence:
        if start < 0 or end <= start:
            raise ValueError(f"evidence span ({doc_id!r}, {start}, {end}) must satisfy 0 <= start < end")
    return evidence


def _checked_chunks(
    ranked_chunks: Sequence[tuple[str, int, int]], max_k: int
) -> Sequence[tuple[str, int, int]]:
    """The first ``max_k`` chunks after checking each: ``0 <= start <= end`` (ValueError)."""
    top = ranked_chunks[:max_k]
    for doc_id, start, end in top:
        if start < 0 or end < start:
            raise ValueError(f"chunk ({doc_id!r}, {start}, {end}) must satisfy 0 <= start <= end")
    return top


def evidence_coverage_at(
    ranked_chunks: Sequence[tuple[str, int, int]],
    evidence: Sequence[tuple[str, int, int]],
    ks: Sequence[int],
) -> list[float]:
    """``evidence_coverage_at_k`` for every k in ``ks`` (in that order): per evidence span, the share
    of its characters that lie in the first k chunks (the union of the chunks of its document,
    clipped to the span, so two chunks holding the same characters count them once); the mean over
    the spans.

    Chunks and spans as in :func:`evidence_recall` (``[start, end)`` offsets, chunks not
    de-duplicated, same errors). A span one chunk overlaps by a single character is *covered* for
    ``evidence_recall`` but adds one character here: evidence a re-chunking splits over two chunks
    shows up as lower coverage when only one of them is retrieved.
    """
    return evidence_at(ranked_chunks, evidence, ks)[1]


def evidence_at(
    ranked_chunks: Sequence[tuple[str, int, int]],
    evidence: Sequence[tuple[str, int, int]],
    ks: Sequence[int],
) -> tuple[list[float], list[float]]:
    """:func:`evidence_recall_at` and :func:`evidence_coverage_at` from one pass over the chunks (what
    scoring calls): a chunk overlaps a span exactly when its clipped range is not empty, so a span's
    first piece is where it is covered for recall."""
    key, max_k = cutoffs(ks)
    spans = _checked_spans(evidence)
    top = _checked_chunks(ranked_chunks, max_k)
    top_docs = [chunk[0] for chunk in top]
    # per span overlapped by a chunk among the first max_k: the positions (1-based) of those chunks in
    # chunk order, and after each the share of the span its chunks so far cover (their clipped ranges'
    # union over the span's length); the chunks of the span's document are found by scans in C (a span
    # no chunk overlaps adds 0.0 to every total: skipped, bit for bit)
    firsts: list[int] = []  # each covered span's first position
    hit: list[tuple[list[int], list[float]]] = []
    for doc_id, s, e in spans:
        positions: list[int] = []
        shares: list[float] = []
        ranges: list[tuple[int, int]] = []
        i = -1
        for _ in range(top_docs.count(doc_id)):
            i = top_docs.index(doc_id, i + 1)
            _, start, end = top[i]
            lo, hi = (s if s > start else start), (e if e < end else end)
            if lo < hi:
                positions.append(i + 1)
                ranges.append((lo, hi))
                covered = hi - lo if len(ranges) == 1 else _union_length(sorted(ranges))
                shares.append(covered / (e - s))
        if positions:
            firsts.append(positions[0])
            hit.append((positions, shares))
    n = len(spans)
    if not hit:  # no span overlapped: every value is 0.0 (what the sums below give, 0 / n)
        return [0.0] * len(key), [0.0] * len(key)
    firsts.sort()
    recall = [bisect_right(firsts, k) / n for k in key]
    coverage: list[float] = []
    for k in key:
        total = 0.0
        for positions, shares in hit:
            within = bisect_right(positions, k)  # the span's chunks among the first k
            if within:
                total += shares[within - 1]
        coverage.append(total / n)
    return recall, coverage


def _union_length(ranges: list[tuple[int, int]]) -> int:
    """Characters in the union of sorted ``[start, end)`` ranges."""
    covered = 0
    reach = -1
    for lo, hi in ranges:
        if hi > reach:
            covered += hi - max(lo, reach)
            reach = hi
    return covered


def judged_at(ranked_doc_ids: Sequence[str], labels: Collection[str], ks: Sequence[int]) -> dict[str, float]:
    """``judged_at_k`` for every k in ``ks``: the documents among the first k *unique* documents of
    the ranking that have any relevance label (any grade, a judged non-relevant 0 included), divided
    by k (as precision is, even when fewer than k came back).

    It says how much of what a variant retrieves the labels can judge at all: with sparse labels a
    variant that finds other, unlabelled documents reads as worse on recall and nDCG whether those
    documents are relevant or not. Equal to ir_measures' ``Judged@k`` and to trec_eval's ``P.k`` on
    qrels whose every label is made relevant. ``ConfigError`` for a bad k.
    """
    if isinstance(ranked_doc_ids, (str, bytes)):
        raise TypeError("ranked_doc_ids must be a sequence of doc ids, not a string")
    key, max_k = cutoffs(ks)
    top = islice(dict.fromkeys(ranked_doc_ids), max_k)  # the first max_k unique documents, in order
    marks = list(accumulate(map(labels.__contains__, top), initial=0))
    n = len(marks) - 1
    return dict(zip(metric_names_at("judged", key), [marks[k if k < n else n] / k for k in key], strict=True))


def bpref(ranked_doc_ids: Sequence[str], relevant: Mapping[str, int]) -> float:
    """trec_eval's ``bpref`` of the ranking (all of it, de-duplicated keeping the first occurrence).

    ``R`` = the documents with grade >= 1, ``N`` = the judged non-relevant ones (grade <= 0);
    unlabelled documents are skipped. Each relevant document retrieved adds
    ``1 - min(n, |R|) / min(|N|, |R|)``, ``n`` the judged non-relevant documents ranked above it
    (1 when ``n`` is 0); the sum is divided by ``|R|``. With no judged non-relevant document it is
    the share of ``R`` retrieved. Raises ``ValueError`` when no document has grade >= 1.
    """
    if isinstance(ranked_doc_ids, (str, bytes)):
        raise TypeError("ranked_doc_ids must be a sequence of doc ids, not a string")
    n_rel = sum(1 for g in relevant.values() if g >= 1)
    if n_rel == 0:
        raise ValueError("bpref needs at least one relevant document (grade >= 1)")
    n_nonrel = len(relevant) - n_rel
    above = 0  # judged non-relevant documents ranked so far
    total = 0.0
    seen: set[str] = set()  # labelled documents met (a repeat counts once; unlabelled ones never count)
    for doc_id in ranked_doc_ids:
        grade = relevant.get(doc_id)
        if grade is None or doc_id in seen:
            continue
        seen.add(doc_id)
        if grade >= 1:
            total += 1.0 - min(above, n_rel) / min(n_nonrel, n_rel) if above else 1.0
        else:
            above += 1
    return total / n_rel
