"""The fast scoring paths (issue 16) equal the previous implementation and the reference tools.

``retrieval_metrics`` now works over the relevant documents (C-level scans of the ranking,
a table of discounts, the ideal DCG cached per grade pattern) and ``evidence_recall_at``
scores every cutoff in one pass. The previous implementations are kept below, verbatim in
substance, as the reference: the new values must be *equal* (``==``, not approximately),
on random cases with duplicates, grade-0 judgements, short and long rankings, and more
judged documents than the small-relevant path handles. pytrec_eval and ranx check the
same cases to 1e-9 (see tests/test_metrics_retrieval.py for the measure mapping).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.registry import metric_name, metric_names_at
from rag_ablate.metrics.retrieval import (
    RETRIEVAL_BASES,
    cutoffs,
    evidence_at,
    evidence_recall,
    evidence_recall_at,
    judged_at,
    retrieval_metrics,
    unique_docs,
)

# on the tests that run ranx only: resolving the category imports numba, which the others do not need
RANX_WARNING = pytest.mark.filterwarnings(
    "ignore:unsafe cast from uint64 to int64:numba.core.errors.NumbaTypeSafetyWarning"
)

TOL = 1e-9


# ------------------------------------------------------------------ the previous implementations


def previous_retrieval_metrics(
    ranked_doc_ids: Sequence[str], relevant: Mapping[str, int], ks: Sequence[int]
) -> dict[str, float]:
    """retrieval_metrics as of commit bb01fea: one pass over the ranking, prefix sums per rank."""
    grades = [g for g in relevant.values() if g >= 1]
    n_rel = len(grades)
    if n_rel == 0:
        raise ValueError("unanswerable")
    max_k = max(ks)
    hits_prefix = [0]
    dcg_prefix = [0.0]
    first_rel_rank = 0
    seen: set[str] = set()
    for doc_id in ranked_doc_ids:
        if doc_id in seen:
            continue
        seen.add(doc_id)
        rank = len(hits_prefix)
        grade = relevant.get(doc_id, 0)
        if grade >= 1:
            hits_prefix.append(hits_prefix[-1] + 1)
            dcg_prefix.append(dcg_prefix[-1] + float(2**grade - 1) / math.log2(rank + 1))
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
        ideal_prefix.append(ideal_prefix[-1] + float(2**grade - 1) / math.log2(rank + 1))
    out: dict[str, float] = {}
    for k in ks:
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
        for base, value in zip(RETRIEVAL_BASES, values, strict=True):
            out[metric_name(base, k)] = value
    return out


def previous_evidence_recall(
    ranked_chunks: Sequence[tuple[str, int, int]], evidence: Sequence[tuple[str, int, int]], k: int
) -> float:
    """evidence_recall as of commit bb01fea: merged chunk ranges per document, one bisect per span."""
    per_doc: dict[str, list[tuple[int, int]]] = {}
    for doc_id, start, end in ranked_chunks[:k]:
        per_doc.setdefault(doc_id, []).append((start, end))
    covered = 0
    for doc_id, start, end in evidence:
        starts: list[int] = []
        ends: list[int] = []
        for s, e in sorted(per_doc.get(doc_id, [])):
            if e <= s:
                continue
            if ends and s < ends[-1]:
                ends[-1] = max(ends[-1], e)
            else:
                starts.append(s)
                ends.append(e)
        i = bisect_left(starts, end) - 1
        if i >= 0 and ends[i] > start:
            covered += 1
    return covered / len(evidence)


def previous_evidence_coverage(
    ranked_chunks: Sequence[tuple[str, int, int]], evidence: Sequence[tuple[str, int, int]], k: int
) -> float:
    """evidence_coverage at k as of commit 3f02a23, per k: each span's clipped chunks among the first k
    of its document (one: its length; more: their sorted union's), over the span's length, summed over
    the spans in order, divided by their number."""
    total = 0.0
    for doc_id, s, e in evidence:
        within = [(max(s, cs), min(e, ce)) for cd, cs, ce in ranked_chunks[:k] if cd == doc_id]
        within = [(lo, hi) for lo, hi in within if lo < hi]
        if len(within) == 1:
            total += (within[0][1] - within[0][0]) / (e - s)
        elif within:
            covered, reach = 0, -1
            for lo, hi in sorted(within):
                if hi > reach:
                    covered += hi - max(lo, reach)
                    reach = hi
            total += covered / (e - s)
    return total / len(evidence)


# ------------------------------------------------------------------ random cases


@st.composite
def ranking_case(
    draw: st.DrawFn, pool: int = 30, min_len: int = 0
) -> tuple[list[str], dict[str, int], list[int]]:
    docs = [f"d{i}" for i in range(pool)]
    qrels = draw(st.dictionaries(st.sampled_from(docs), st.integers(-1, 4), max_size=pool))
    qrels[draw(st.sampled_from(docs))] = draw(st.integers(1, 4))  # R is never empty
    ranking = draw(st.lists(st.sampled_from([*docs, "x1", "x2", "x3"]), min_size=min_len, max_size=60))
    ks = draw(st.lists(st.integers(1, 70), min_size=1, max_size=5))
    return ranking, qrels, ks


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(case=ranking_case())
def test_retrieval_metrics_equal_the_previous_implementation(
    case: tuple[list[str], dict[str, int], list[int]],
) -> None:
    ranking, qrels, ks = case
    got = retrieval_metrics(ranking, qrels, ks)
    assert got == previous_retrieval_metrics(ranking, qrels, ks)
    assert list(got) == list(previous_retrieval_metrics(ranking, qrels, ks))  # same key order
    assert retrieval_metrics(tuple(ranking), qrels, tuple(ks)) == got  # any sequence


def test_many_judged_documents_and_long_rankings_equal_the_previous_implementation() -> None:
    # > 16 judged documents take the dict-of-first-positions path; long lists cross the discount table
    import random

    rng = random.Random(16)
    for _ in range(200):
        pool = rng.randint(20, 3000)
        ranking = [f"d{rng.randrange(pool)}" for _ in range(rng.randint(0, 2500))]
        qrels = {f"d{rng.randrange(pool)}": rng.randint(0, 5) for _ in range(rng.randint(1, 400))}
        qrels[f"d{rng.randrange(pool)}"] = rng.randint(1, 70)  # grades beyond the gain table too
        ks = rng.sample([1, 2, 5, 10, 100, 1000, 2000, 5000], rng.randint(1, 4))
        assert retrieval_metrics(ranking, qrels, ks) == previous_retrieval_metrics(ranking, qrels, ks)


def _pytrec_and_ranx(
    cases: Sequence[tuple[list[str], dict[str, int]]], ks: Sequence[int]
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    import pytrec_eval  # here, not at the top: collecting the file stays quick
    from ranx import Qrels, Run, evaluate

    qrels = {f"q{i}": dict(rel) for i, (_, rel) in enumerate(cases)}
    runs: dict[str, dict[str, float]] = {}
    for i, (ranking, _) in enumerate(cases):
        docs = unique_docs(ranking)
        runs[f"q{i}"] = {d: float(len(docs) - r) for r, d in enumerate(docs)}
    cut = ",".join(map(str, ks))
    regraded = {q: {d: 2**g - 1 if g > 0 else 0 for d, g in r.items()} for q, r in qrels.items()}
    pt = pytrec_eval.RelevanceEvaluator(
        regraded, {f"success.{cut}", f"recall.{cut}", f"P.{cut}", f"ndcg_cut.{cut}"}
    )
    pt_res = pt.evaluate(runs)
    rx_names = {"hit": "hit_rate@{k}", "recall": "recall@{k}", "precision": "precision@{k}", "mrr": "mrr@{k}"}
    rx_names["ndcg"] = "ndcg_burges@{k}"
    run = Run(runs)
    evaluate(
        Qrels(qrels), run, [t.format(k=k) for k in ks for t in rx_names.values()], save_results_in_run=True
    )
    pt_out: dict[str, dict[str, float]] = {}
    rx_out: dict[str, dict[str, float]] = {}
    for q in qrels:
        pt_out[q] = {}
        rx_out[q] = {}
        for k in ks:
            for base, name in (
                ("hit", "success"),
                ("recall", "recall"),
                ("precision", "P"),
                ("ndcg", "ndcg_cut"),
            ):
                pt_out[q][f"{base}_at_{k}"] = pt_res[q][f"{name}_{k}"]
            for base, template in rx_names.items():
                rx_out[q][f"{base}_at_{k}"] = float(run.scores[template.format(k=k)][q])
    return pt_out, rx_out


@RANX_WARNING
@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(cases=st.lists(ranking_case(pool=40, min_len=1), min_size=1, max_size=5))
def test_fast_metrics_match_pytrec_eval_and_ranx(
    cases: list[tuple[list[str], dict[str, int], list[int]]],
) -> None:
    ks = (1, 3, 10, 25)
    pairs = [(ranking, {d: g for d, g in rel.items() if g >= 0}) for ranking, rel, _ in cases]
    pairs = [(r, rel) for r, rel in pairs if any(g >= 1 for g in rel.values())]
    if not pairs:
        return
    pt, rx = _pytrec_and_ranx(pairs, ks)
    for i, (ranking, rel) in enumerate(pairs):
        ours = retrieval_metrics(ranking, rel, ks)
        for name, value in pt[f"q{i}"].items():
            assert ours[name] == pytest.approx(value, abs=TOL), ("pytrec_eval", name)
        for name, value in rx[f"q{i}"].items():
            assert ours[name] == pytest.approx(value, abs=TOL), ("ranx", name)


def test_worked_example_with_duplicates_and_a_relevant_doc_past_the_cutoff() -> None:
    # unique ranks: x=1, a=2, y=3, b=4, c=5; relevant a (3), b (1), c (2, past k=4)
    m = retrieval_metrics(["x", "a", "a", "x", "y", "b", "c"], {"a": 3, "b": 1, "c": 2, "z": 0}, [4, 2])
    dcg4 = 7 / math.log2(3) + 1 / math.log2(5)
    idcg4 = 7 + 3 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg_at_4"] == pytest.approx(dcg4 / idcg4, abs=1e-12)
    assert (m["recall_at_4"], m["precision_at_4"], m["mrr_at_4"], m["full_recall_at_4"]) == (
        2 / 3,
        0.5,
        0.5,
        0.0,
    )
    assert (m["hit_at_2"], m["recall_at_2"], m["precision_at_2"]) == (1.0, 1 / 3, 0.5)
    assert list(m)[:6] == [f"{b}_at_4" for b in RETRIEVAL_BASES]


def test_cutoff_errors_are_unchanged() -> None:
    for bad in (0, -3, True, 2.0, "5"):
        with pytest.raises(ConfigError, match="positive integer"):
            retrieval_metrics(["a"], {"a": 1}, [1, bad])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match="positive integer"):
            evidence_recall_at([("a", 0, 5)], [("a", 0, 5)], [bad])  # type: ignore[list-item]


def test_checked_cutoffs_are_shared_and_an_equal_tuple_with_a_bool_is_still_refused() -> None:
    key, max_k = cutoffs([1, 5])
    assert key == (1, 5) and max_k == 5 and cutoffs([1, 5])[0] is key and cutoffs(key) == (key, 5)
    assert metric_names_at("judged", key) == ("judged_at_1", "judged_at_5")
    assert key == (True, 5)  # equal (and of equal hash), so a cache by value would let it through
    with pytest.raises(ConfigError, match="positive integer"):
        cutoffs((True, 5))
    with pytest.raises(ConfigError, match="positive integer"):
        judged_at(["a"], {"a"}, (True, 5))
    with pytest.raises(ConfigError, match="positive integer"):
        metric_names_at("judged", (True, 5))
    assert metric_names_at("judged", key) == ("judged_at_1", "judged_at_5")


# ------------------------------------------------------------------ evidence recall at every k


@st.composite
def evidence_case(
    draw: st.DrawFn,
) -> tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], list[int]]:
    doc = st.sampled_from(["a", "b", "c"])
    chunk = st.tuples(doc, st.integers(0, 60), st.integers(0, 15)).map(lambda t: (t[0], t[1], t[1] + t[2]))
    span = st.tuples(doc, st.integers(0, 60), st.integers(1, 10)).map(lambda t: (t[0], t[1], t[1] + t[2]))
    chunks = draw(st.lists(chunk, max_size=14))
    spans = draw(st.lists(span, min_size=1, max_size=6))
    ks = draw(st.lists(st.integers(1, 16), min_size=1, max_size=4))
    return chunks, spans, ks


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(case=evidence_case())
def test_evidence_recall_at_equals_the_previous_implementation_at_every_k(
    case: tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], list[int]],
) -> None:
    chunks, spans, ks = case
    got = evidence_recall_at(chunks, spans, ks)
    assert got == [previous_evidence_recall(chunks, spans, k) for k in ks]
    assert got == [evidence_recall(chunks, spans, k) for k in ks]
    brute = [
        sum(any(cd == d and cs < ce and s < ce and cs < e for cd, cs, ce in chunks[:k]) for d, s, e in spans)
        / len(spans)
        for k in ks
    ]
    assert got == brute


@settings(max_examples=400, deadline=None)
@given(case=evidence_case())
def test_evidence_at_equals_the_previous_implementation_bit_for_bit(
    case: tuple[list[tuple[str, int, int]], list[tuple[str, int, int]], list[int]],
) -> None:
    """Recall and coverage from one pass: each value what the previous per-k code gave, bit for bit."""
    chunks, spans, ks = case
    recall, coverage = evidence_at(chunks, spans, ks)
    assert [v.hex() for v in recall] == [previous_evidence_recall(chunks, spans, k).hex() for k in ks]
    assert [v.hex() for v in coverage] == [previous_evidence_coverage(chunks, spans, k).hex() for k in ks]


def test_evidence_recall_at_checks_every_chunk_up_to_the_largest_k() -> None:
    chunks = [("a", 0, 10), ("a", 10, 20), ("a", 30, 20)]  # the third is broken
    assert evidence_recall_at(chunks, [("a", 0, 5)], [1, 2]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="start <= end"):
        evidence_recall_at(chunks, [("a", 0, 5)], [1, 3])
    with pytest.raises(ValueError, match="at least one"):
        evidence_recall_at(chunks, [], [1])
    with pytest.raises(ValueError, match="start < end"):
        evidence_recall_at(chunks, [("a", 4, 4)], [1])


# ------------------------------------------------------------------ a record's metrics in one update

_DOCS_OF = [f"D{i}" for i in range(6)]
_CHUNKS_OF = [f"D{i}#{j}" for i in range(6) for j in range(4)]


@settings(max_examples=150, deadline=None)
@given(
    picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=12),
    relevant=st.dictionaries(st.sampled_from(_DOCS_OF), st.integers(0, 3), max_size=4),
    nonrelevant=st.lists(st.sampled_from(_DOCS_OF), max_size=2, unique=True),
    sets=st.lists(st.lists(st.sampled_from(_DOCS_OF), min_size=1, max_size=3, unique=True), max_size=2),
    gold_chunks=st.dictionaries(st.sampled_from(_CHUNKS_OF), st.just(1), max_size=3),
    spans=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 60), st.integers(1, 30)), max_size=3),
    restricted=st.booleans(),
    ks=st.lists(st.integers(1, 12), min_size=1, max_size=4),
)
def test_score_record_equals_its_parts_one_after_another(
    picks: list[tuple[int, int]],
    relevant: dict[str, int],
    nonrelevant: list[str],
    sets: list[list[str]],
    gold_chunks: dict[str, int],
    spans: list[tuple[int, int, int]],
    restricted: bool,
    ks: list[int],
) -> None:
    """score_record puts a record's values into its metrics in one update: the same names in the same
    order and the same values bit for bit as the parts' dicts added one after another (context tokens,
    the access-control leaks, the ranking metrics, the set, chunk and evidence metrics)."""
    from rag_ablate.dataset.model import Document, Query, Span
    from rag_ablate.metrics.acl import acl_metrics
    from rag_ablate.metrics.retrieval import chunk_metrics, ranking_metrics, set_metrics
    from rag_ablate.records.scoring import TokenCounts, score_record

    docs = {
        d: Document(d, "文本 text " * 12, allowed_groups=("staff",) if restricted and i % 2 else None)
        for i, d in enumerate(_DOCS_OF)
    }
    evidence = tuple(Span(_DOCS_OF[d], s, s + n) for d, s, n in spans)
    answerable = any(g >= 1 for g in relevant.values()) or bool(gold_chunks) or bool(evidence)
    if not answerable:
        relevant = {}
    query = Query(
        "q1", "question", relevant, evidence, answerable, True, (), None, None, "dev", "g1",
        user_groups=("staff",), relevant_sets=tuple(map(tuple, sets)), relevant_chunks=gold_chunks,
        nonrelevant=tuple(d for d in nonrelevant if d not in relevant),
    )  # fmt: skip
    if relevant and not any(g >= 1 for g in relevant.values()):
        return  # no relevant document: the ranking metrics raise (a caller error), as before
    retrieved = [
        {
            "rank": r,
            "chunk_id": f"D{d}#{c}",
            "doc_id": f"D{d}",
            "start": 20 * c,
            "end": 20 * c + 30,
            "score": 0.5,
        }
        for r, (d, c) in enumerate(picks, start=1)
    ]
    rec = {"status": "ok", "timings_ms": {"total": 3.5}, "retrieved": retrieved}
    got = score_record(rec, query, docs, ks, routed=False, tokens=TokenCounts())  # type: ignore[arg-type]
    key = cutoffs(ks)[0]
    ranked = [r["doc_id"] for r in retrieved]
    chunks = [(r["doc_id"], r["start"], r["end"]) for r in retrieved]
    want: dict[str, float | None] = {"latency_ms": 3.5}
    want.update(TokenCounts().context_tokens_at(retrieved, docs, key))  # type: ignore[arg-type]
    if restricted:
        want.update(acl_metrics(ranked, docs, query.user_groups, key))
    if answerable:
        if relevant:
            want.update(ranking_metrics(ranked, {**dict.fromkeys(query.nonrelevant, 0), **relevant}, key))
        if sets:
            want.update(set_metrics(ranked, query.relevant_sets, key))
        if gold_chunks:
            want.update(chunk_metrics([r["chunk_id"] for r in retrieved], gold_chunks, key))
        if evidence:
            recall, coverage = evidence_at(chunks, [(e.doc_id, e.start, e.end) for e in evidence], key)
            want.update(zip(metric_names_at("evidence_recall", key), recall, strict=True))
            want.update(zip(metric_names_at("evidence_coverage", key), coverage, strict=True))
    assert list(got) == list(want)
    assert [v.hex() for v in got.values()] == [v.hex() for v in want.values()]  # type: ignore[union-attr]
