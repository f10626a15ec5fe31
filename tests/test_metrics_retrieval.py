"""Retrieval metrics, evidence recall and the token count.

Reference cross-checks (ranx and pytrec_eval are test-only dependencies). Our
per-query values must equal theirs to 1e-9 on the de-duplicated ranking, given
to them as doc -> strictly decreasing score (score = number of docs - rank, so
no tie-breaking convention matters):

======================  ==========================  ==================================
ours                    ranx 0.3.21                  pytrec_eval (trec_eval 9)
======================  ==========================  ==================================
hit_at_k                ``hit_rate@k``               ``success.k`` -> ``success_k``
recall_at_k             ``recall@k``                 ``recall.k`` -> ``recall_k``
precision_at_k          ``precision@k``              ``P.k`` -> ``P_k``
mrr_at_k                ``mrr@k``                    ``recip_rank`` on the run cut to the
                                                     first k docs (it has no cutoff)
ndcg_at_k               ``ndcg_burges@k``            ``ndcg_cut.k`` -> ``ndcg_cut_k`` on
                                                     qrels re-graded to ``2**g - 1``
full_recall_at_k        recall@k == 1                recall_k == 1 (neither has it)
======================  ==========================  ==================================

Conventions checked along the way:

* grade-0 qrels entries are judged non-relevant for both tools (ranx
  ``rel_lvl=1`` is the default; trec_eval's relevance level is 1), like ours;
* precision divides by k even when fewer than k docs were retrieved, in both
  tools, like ours;
* ranx ``ndcg@k`` is the Järvelin form (linear gain), so it does NOT match; its
  ``ndcg_burges@k`` uses gain ``2**rel - 1`` and discount ``log2(rank + 1)``;
* trec_eval's ``ndcg_cut`` uses the grade itself as the gain and offers no gain
  map for the cut variant; re-grading each qrel g -> 2**g - 1 (0 -> 0, 1 -> 1,
  2 -> 3, 3 -> 7) makes its linear gain equal ours while keeping the same set
  of relevant docs, so ``ndcg_cut_k`` then matches exactly;
* the tools cannot see duplicates (a run is a dict), so the de-duplication rule
  is checked separately: the metrics of a ranking equal those of its
  ``unique_docs``.

ranx compiles its numba kernels on first use; the compiler emits
``NumbaTypeSafetyWarning: unsafe cast from uint64 to int64`` for ranx's own
parallel loops. That one warning is ignored below; everything else is an error.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.retrieval import (
    bpref,
    evidence_coverage_at,
    evidence_recall,
    judged_at,
    ranking_metrics,
    retrieval_metrics,
    unique_docs,
)
from rag_ablate.text.count import context_tokens, count_tokens, is_cjk_text
from tests.conftest import shared_path

# on the tests that run ranx only: resolving the category imports numba, which the others do not need
RANX_WARNING = pytest.mark.filterwarnings(
    "ignore:unsafe cast from uint64 to int64:numba.core.errors.NumbaTypeSafetyWarning"
)

KS = (1, 2, 3, 5, 10, 20)
BASES = ("hit", "recall", "precision", "mrr", "ndcg", "full_recall")
TOL = 1e-9


# --------------------------------------------------------------------------- worked examples


def test_worked_example_single_query() -> None:
    relevant = {"quality": 2, "order": 1}
    ranking = ["invoice", "quality", "normal", "order"]
    m = retrieval_metrics(ranking, relevant, [3])
    assert m["hit_at_3"] == 1.0
    assert m["recall_at_3"] == 0.5
    assert m["mrr_at_3"] == 0.5
    assert m["precision_at_3"] == pytest.approx(1 / 3)
    assert m["full_recall_at_3"] == 0.0
    dcg = 3 / math.log2(3)
    idcg = 3 / math.log2(2) + 1 / math.log2(3)
    assert round(dcg, 4) == 1.8928
    assert round(idcg, 4) == 3.6309
    assert m["ndcg_at_3"] == pytest.approx(1.8928 / 3.6309, abs=1e-4)
    assert m["ndcg_at_3"] == pytest.approx(dcg / idcg, abs=1e-12)
    assert round(m["ndcg_at_3"], 4) == 0.5213
    # at k = 4 the second relevant doc enters
    m4 = retrieval_metrics(ranking, relevant, [4])
    assert m4["recall_at_4"] == 1.0
    assert m4["full_recall_at_4"] == 1.0


def test_worked_example_two_cases_and_an_unanswerable_one() -> None:
    cases: list[tuple[list[str], dict[str, int]]] = [
        (["faq", "refund-policy", "refund-policy"], {"refund-policy": 1}),
        (["billing", "faq"], {"cancel-guide": 1}),
        (["faq"], {}),  # unanswerable: no relevant document
    ]
    per_query: list[dict[str, float]] = []
    unanswerable = 0
    for ranking, relevant in cases:
        if not any(g >= 1 for g in relevant.values()):
            unanswerable += 1
            with pytest.raises(ValueError, match="unanswerable"):
                retrieval_metrics(ranking, relevant, [2])
            continue
        per_query.append(retrieval_metrics(ranking, relevant, [2]))
    assert unanswerable == 1
    assert len(per_query) == 2
    assert [q["recall_at_2"] for q in per_query] == [1.0, 0.0]
    assert [q["mrr_at_2"] for q in per_query] == [0.5, 0.0]
    assert sum(q["recall_at_2"] for q in per_query) / 2 == 0.5
    assert sum(q["mrr_at_2"] for q in per_query) / 2 == 0.25


# --------------------------------------------------------------------------- unit behaviour


def test_unique_docs_keeps_first_occurrence() -> None:
    assert unique_docs(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]
    assert unique_docs([]) == []
    assert unique_docs(iter(["x", "x"])) == ["x"]


def test_duplicates_never_raise_a_score() -> None:
    relevant = {"a": 1, "b": 2}
    # with duplicates, "b" would sit at rank 3 if duplicates counted; it is rank 2
    with_dups = retrieval_metrics(["a", "a", "b", "c"], relevant, [2])
    assert with_dups == retrieval_metrics(["a", "b", "c"], relevant, [2])
    assert with_dups["recall_at_2"] == 1.0
    # a duplicate of a relevant doc is not a second hit
    m = retrieval_metrics(["a", "a", "a"], {"a": 1, "b": 1}, [3])
    assert m["recall_at_3"] == 0.5
    assert m["precision_at_3"] == pytest.approx(1 / 3)


def test_key_names_and_order() -> None:
    m = retrieval_metrics(["a"], {"a": 1}, [5, 1])
    assert list(m) == [f"{b}_at_{k}" for k in (5, 1) for b in BASES]
    assert retrieval_metrics(["a"], {"a": 1}, []) == {}


def test_empty_ranking_scores_zero() -> None:
    m = retrieval_metrics([], {"a": 3}, [1, 5])
    assert set(m.values()) == {0.0}


def test_precision_divides_by_k_and_short_lists() -> None:
    m = retrieval_metrics(["a", "b"], {"a": 1, "b": 1, "c": 1}, [10])
    assert m["precision_at_10"] == pytest.approx(0.2)
    assert m["recall_at_10"] == pytest.approx(2 / 3)
    assert m["full_recall_at_10"] == 0.0


def test_ndcg_ideal_is_cut_at_k_and_uses_exponential_gain() -> None:
    relevant = {"a": 3, "b": 1, "c": 2}
    m = retrieval_metrics(["b", "a"], relevant, [1, 2])
    assert m["ndcg_at_1"] == pytest.approx(1 / 7)
    dcg2 = 1 + 7 / math.log2(3)
    idcg2 = 7 + 3 / math.log2(3)
    assert m["ndcg_at_2"] == pytest.approx(dcg2 / idcg2)
    perfect = retrieval_metrics(["a", "c", "b"], relevant, [1, 2, 3, 10])
    for k in (1, 2, 3, 10):
        assert perfect[f"ndcg_at_{k}"] == pytest.approx(1.0)


def test_zero_and_negative_grades_are_not_relevant() -> None:
    m = retrieval_metrics(["z", "n", "a"], {"z": 0, "n": -1, "a": 1}, [2, 3])
    assert m["hit_at_2"] == 0.0
    assert m["mrr_at_3"] == pytest.approx(1 / 3)
    assert m["full_recall_at_3"] == 1.0
    with pytest.raises(ValueError):
        retrieval_metrics(["z"], {"z": 0}, [1])
    with pytest.raises(ValueError):
        retrieval_metrics(["z"], {}, [1])


@pytest.mark.parametrize("bad_k", [0, -1, 2.0, True, "5"])
def test_bad_k_raises(bad_k: object) -> None:
    with pytest.raises(ConfigError, match="positive integer"):
        retrieval_metrics(["a"], {"a": 1}, [bad_k])  # type: ignore[list-item]


def test_string_ranking_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        retrieval_metrics("abc", {"a": 1}, [1])
    with pytest.raises(TypeError):
        retrieval_metrics(["a"], {"a": 1}, "1")  # type: ignore[arg-type]


def test_long_lists_are_linear() -> None:
    n = 50_000
    ranking = [f"d{i % (n // 2)}" for i in range(n)]  # every doc twice
    relevant = {f"d{i}": 1 + i % 3 for i in range(0, n // 2, 7)}
    start = time.perf_counter()
    m = retrieval_metrics(ranking, relevant, [1, 10, 100, n])
    elapsed = time.perf_counter() - start
    assert m[f"recall_at_{n}"] == 1.0
    assert m[f"ndcg_at_{n}"] == pytest.approx(
        retrieval_metrics(unique_docs(ranking), relevant, [n])[f"ndcg_at_{n}"]
    )
    assert elapsed < 2.0  # quadratic work on 25k unique docs would take minutes


# --------------------------------------------------------------------------- reference cross-checks


def _reference_run(ranking: Sequence[str]) -> dict[str, float]:
    docs = unique_docs(ranking)
    return {doc: float(len(docs) - rank) for rank, doc in enumerate(docs)}


def _gain_regraded(qrels: Mapping[str, int]) -> dict[str, int]:
    return {doc: (2**g - 1 if g > 0 else 0) for doc, g in qrels.items()}


def _ranx_values(
    qrels: dict[str, dict[str, int]], runs: dict[str, dict[str, float]], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    from ranx import Qrels, Run, evaluate  # here, not at the top: collecting the file stays quick

    names = {
        "hit": "hit_rate@{k}",
        "recall": "recall@{k}",
        "precision": "precision@{k}",
        "mrr": "mrr@{k}",
        "ndcg": "ndcg_burges@{k}",
    }
    run = Run(runs)
    metrics = [template.format(k=k) for k in ks for template in names.values()]
    evaluate(Qrels(qrels), run, metrics, save_results_in_run=True)
    out: dict[str, dict[str, float]] = {q: {} for q in runs}
    for q in runs:
        for k in ks:
            for base, template in names.items():
                out[q][f"{base}_at_{k}"] = float(run.scores[template.format(k=k)][q])
            out[q][f"full_recall_at_{k}"] = 1.0 if out[q][f"recall_at_{k}"] == 1.0 else 0.0
    return out


def _pytrec_values(
    qrels: dict[str, dict[str, int]], runs: dict[str, dict[str, float]], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    import pytrec_eval

    cut = ",".join(str(k) for k in ks)
    plain = pytrec_eval.RelevanceEvaluator(qrels, {f"success.{cut}", f"recall.{cut}", f"P.{cut}"})
    gained = pytrec_eval.RelevanceEvaluator(
        {q: _gain_regraded(r) for q, r in qrels.items()}, {f"ndcg_cut.{cut}"}
    )
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"})
    base = plain.evaluate(runs)
    ndcg = gained.evaluate(runs)
    out: dict[str, dict[str, float]] = {q: {} for q in runs}
    for k in ks:
        cut_runs = {q: {d: s for d, s in run.items() if s > len(run) - k} for q, run in runs.items()}
        rr_k = rr.evaluate(cut_runs)
        for q in runs:
            values = out[q]
            values[f"hit_at_{k}"] = base[q][f"success_{k}"]
            values[f"recall_at_{k}"] = base[q][f"recall_{k}"]
            values[f"precision_at_{k}"] = base[q][f"P_{k}"]
            values[f"mrr_at_{k}"] = rr_k[q]["recip_rank"]
            values[f"ndcg_at_{k}"] = ndcg[q][f"ndcg_cut_{k}"]
            values[f"full_recall_at_{k}"] = 1.0 if values[f"recall_at_{k}"] == 1.0 else 0.0
    return out


def _assert_close(ours: Mapping[str, float], ref: Mapping[str, float], tool: str, q: str) -> None:
    assert set(ours) == set(ref)
    for name, value in ours.items():
        assert value == pytest.approx(ref[name], abs=TOL), f"{tool} {q} {name}: {value} != {ref[name]}"


def _cross_check(cases: Sequence[tuple[list[str], dict[str, int]]], ks: Sequence[int]) -> None:
    qrels = {f"q{i:04d}": dict(rel) for i, (_, rel) in enumerate(cases)}
    runs = {f"q{i:04d}": _reference_run(ranking) for i, (ranking, _) in enumerate(cases)}
    ours = {f"q{i:04d}": retrieval_metrics(ranking, rel, ks) for i, (ranking, rel) in enumerate(cases)}
    for tool, ref in (
        ("ranx", _ranx_values(qrels, runs, ks)),
        ("pytrec_eval", _pytrec_values(qrels, runs, ks)),
    ):
        for q in qrels:
            _assert_close(ours[q], ref[q], tool, q)
    # duplicates were only seen by us: de-duplicating first must change nothing
    for ranking, rel in cases:
        assert retrieval_metrics(unique_docs(ranking), rel, ks) == retrieval_metrics(ranking, rel, ks)


_POOL = [f"d{i}" for i in range(12)]


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[str], dict[str, int]]:
    qrels = draw(st.dictionaries(st.sampled_from(_POOL), st.integers(0, 3), max_size=8))
    qrels[draw(st.sampled_from(_POOL))] = draw(st.integers(1, 3))  # R is never empty
    ranking = draw(st.lists(st.sampled_from([*_POOL, "x1", "x2"]), min_size=1, max_size=25))
    return ranking, qrels


@RANX_WARNING
@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(cases=st.lists(_case(), min_size=1, max_size=4))
def test_matches_ranx_and_pytrec_eval_hypothesis(cases: list[tuple[list[str], dict[str, int]]]) -> None:
    _cross_check(cases, KS)


@RANX_WARNING
@pytest.mark.slow
def test_matches_ranx_and_pytrec_eval_seeded_batch() -> None:
    rng = np.random.default_rng(20240611)
    cases: list[tuple[list[str], dict[str, int]]] = []
    n_dups = 0
    n_zero = 0
    for _ in range(200):
        pool = int(rng.integers(3, 40))
        judged = rng.choice(pool, size=int(rng.integers(1, min(pool, 10) + 1)), replace=False)
        grades = rng.integers(0, 4, size=judged.size)
        if not (grades >= 1).any():
            grades[int(rng.integers(0, grades.size))] = int(rng.integers(1, 4))
        ranking = [f"doc{j}" for j in rng.integers(0, pool, size=int(rng.integers(1, 31)))]
        qrels = {f"doc{j}": int(g) for j, g in zip(judged, grades, strict=True)}
        n_dups += len(ranking) != len(set(ranking))
        n_zero += any(g == 0 for g in qrels.values())
        cases.append((ranking, qrels))
    assert n_dups > 50 and n_zero > 50  # the batch does exercise both conventions
    _cross_check(cases, (1, 3, 5, 10, 25))


# --------------------------------------------------------------------------- evidence recall


def test_evidence_recall_overlaps() -> None:
    evidence = [("d1", 10, 20)]
    assert evidence_recall([("d1", 0, 10)], evidence, 1) == 0.0  # touching: no overlap
    assert evidence_recall([("d1", 20, 30)], evidence, 1) == 0.0  # touching on the right
    assert evidence_recall([("d1", 0, 11)], evidence, 1) == 1.0
    assert evidence_recall([("d1", 19, 40)], evidence, 1) == 1.0
    assert evidence_recall([("d1", 12, 15)], evidence, 1) == 1.0  # inside
    assert evidence_recall([("d1", 0, 100)], evidence, 1) == 1.0  # around
    assert evidence_recall([("d2", 0, 100)], evidence, 1) == 0.0  # another document


def test_evidence_recall_counts_chunks_not_docs_and_cuts_at_k() -> None:
    evidence = [("d1", 0, 5), ("d1", 50, 60), ("d2", 0, 5), ("d3", 7, 9)]
    chunks = [("d1", 0, 10), ("d1", 10, 20), ("d2", 3, 4), ("d1", 55, 70)]
    assert evidence_recall(chunks, evidence, 1) == 0.25
    assert evidence_recall(chunks, evidence, 2) == 0.25  # second chunk of d1 still counts as a chunk
    assert evidence_recall(chunks, evidence, 3) == 0.5
    assert evidence_recall(chunks, evidence, 4) == 0.75
    assert evidence_recall(chunks, evidence, 100) == 0.75
    # repeated chunks take slots of k
    assert evidence_recall([("d1", 0, 10), ("d1", 0, 10), ("d2", 0, 5)], evidence, 2) == 0.25
    assert evidence_recall([], evidence, 3) == 0.0


def test_evidence_recall_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        docs = ["a", "b", "c"]
        chunks = [
            (docs[int(rng.integers(0, 3))], int(s), int(s + rng.integers(0, 15)))
            for s in rng.integers(0, 60, size=int(rng.integers(0, 12)))
        ]
        evidence = [
            (docs[int(rng.integers(0, 3))], int(s), int(s + rng.integers(1, 10)))
            for s in rng.integers(0, 60, size=int(rng.integers(1, 6)))
        ]
        k = int(rng.integers(1, 14))
        expected = sum(
            any(cd == d and cs < ce and s < ce and cs < e for cd, cs, ce in chunks[:k])
            for d, s, e in evidence
        ) / len(evidence)
        assert evidence_recall(chunks, evidence, k) == expected


def test_evidence_recall_input_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        evidence_recall([("d1", 0, 10)], [], 1)
    with pytest.raises(ValueError, match="start < end"):
        evidence_recall([("d1", 0, 10)], [("d1", 5, 5)], 1)
    with pytest.raises(ValueError, match="start <= end"):
        evidence_recall([("d1", 10, 0)], [("d1", 0, 5)], 1)
    with pytest.raises(ConfigError):
        evidence_recall([("d1", 0, 10)], [("d1", 0, 5)], 0)


def test_empty_chunk_covers_nothing() -> None:
    # by the formula alone [5, 5) would "overlap" [3, 8); it holds no character
    assert evidence_recall([("d1", 5, 5)], [("d1", 3, 8)], 1) == 0.0


# --------------------------------------------------------------------------- evidence coverage


def test_evidence_coverage_counts_the_characters_a_split_leaves_out() -> None:
    evidence = [("d1", 10, 20)]
    # one chunk sharing one character covers the span for evidence_recall, a tenth of it here
    assert evidence_recall([("d1", 0, 11)], evidence, 1) == 1.0
    assert evidence_coverage_at([("d1", 0, 11)], evidence, [1]) == [pytest.approx(0.1)]
    # the evidence split over two chunks: half of it with one, all of it with both
    halves = [("d1", 0, 15), ("x", 0, 99), ("d1", 15, 30)]
    assert evidence_coverage_at(halves, evidence, [1, 2, 3]) == [0.5, 0.5, 1.0]
    # overlapping chunks count a character once; touching, empty and other-document chunks add none
    assert evidence_coverage_at([("d1", 10, 16), ("d1", 12, 18)], evidence, [2]) == [pytest.approx(0.8)]
    assert evidence_coverage_at(
        [("d1", 0, 10), ("d1", 20, 30), ("d1", 14, 14), ("d2", 0, 99)], evidence, [4]
    ) == [0.0]
    # the mean over the spans; no chunks at all
    assert evidence_coverage_at([("d1", 0, 15)], [("d1", 10, 20), ("d1", 0, 5)], [1]) == [0.75]
    assert evidence_coverage_at([], evidence, [1, 5]) == [0.0, 0.0]


def test_evidence_coverage_matches_brute_force_and_never_exceeds_recall() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        docs = ["a", "b"]
        chunks = [
            (docs[int(rng.integers(0, 2))], int(s), int(s + rng.integers(0, 15)))
            for s in rng.integers(0, 60, size=int(rng.integers(0, 12)))
        ]
        evidence = [
            (docs[int(rng.integers(0, 2))], int(s), int(s + rng.integers(1, 20)))
            for s in rng.integers(0, 60, size=int(rng.integers(1, 5)))
        ]
        ks = sorted({int(k) for k in rng.integers(1, 14, size=3)})
        got = evidence_coverage_at(chunks, evidence, ks)
        for k, value in zip(ks, got, strict=True):
            shares = []
            for d, s, e in evidence:
                held = {c for cd, cs, ce in chunks[:k] if cd == d for c in range(cs, ce)}
                shares.append(len(held & set(range(s, e))) / (e - s))
            assert value == pytest.approx(sum(shares) / len(shares), abs=1e-12)
            assert value <= evidence_recall(chunks, evidence, k) + 1e-12


def test_evidence_coverage_input_errors_are_evidence_recalls() -> None:
    with pytest.raises(ValueError, match="at least one"):
        evidence_coverage_at([("d1", 0, 10)], [], [1])
    with pytest.raises(ValueError, match="start < end"):
        evidence_coverage_at([("d1", 0, 10)], [("d1", 5, 5)], [1])
    with pytest.raises(ValueError, match="start <= end"):
        evidence_coverage_at([("d1", 10, 0)], [("d1", 0, 5)], [1])
    with pytest.raises(ConfigError):
        evidence_coverage_at([("d1", 0, 10)], [("d1", 0, 5)], [0])


# --------------------------------------------------------------------------- judged@k and bpref


def test_judged_and_bpref_skip_unlabelled_documents() -> None:
    labels = {"r1": 2, "r2": 1, "n1": 0}
    # judged: any label counts, duplicates count once, the division is by k
    assert judged_at(["x", "r1", "x", "n1", "y"], labels, [1, 2, 3, 10]) == {
        "judged_at_1": 0.0, "judged_at_2": 0.5, "judged_at_3": 2 / 3, "judged_at_10": 0.2,
    }  # fmt: skip
    # bpref: unlabelled documents above a relevant one cost nothing, judged non-relevant ones do
    assert bpref(["x", "y", "r1", "r2"], labels) == 1.0
    assert bpref(["n1", "r1", "x"], labels) == 0.0  # r1 behind min(|N|, |R|) = 1 judged non-relevant
    two_nonrel = {**labels, "n2": 0}
    assert bpref(["n1", "x", "r1", "r2", "n2"], two_nonrel) == 0.5  # each behind 1 of min(2, 2)
    # no judged non-relevant document: the share of R retrieved anywhere
    assert bpref(["x", "r2"], {"r1": 1, "r2": 1}) == 0.5
    with pytest.raises(ValueError, match="grade >= 1"):
        bpref(["n1"], {"n1": 0})
    with pytest.raises(ConfigError):
        judged_at(["r1"], labels, [0])


def _pytrec_judged_bpref(
    qrels: dict[str, dict[str, int]], runs: dict[str, dict[str, float]], ks: Sequence[int]
) -> dict[str, dict[str, float]]:
    """judged_at_k as trec_eval's P.k on the labels all made relevant; trec_eval's bpref."""
    import pytrec_eval

    cut = ",".join(str(k) for k in ks)
    labelled = {q: dict.fromkeys(r, 1) for q, r in qrels.items()}
    precision = pytrec_eval.RelevanceEvaluator(labelled, {f"P.{cut}"}).evaluate(runs)
    pref = pytrec_eval.RelevanceEvaluator(qrels, {"bpref"}).evaluate(runs)
    return {
        q: {**{f"judged_at_{k}": precision[q][f"P_{k}"] for k in ks}, "bpref": pref[q]["bpref"]} for q in runs
    }


def _cross_check_judged(cases: Sequence[tuple[list[str], dict[str, int]]], ks: Sequence[int]) -> None:
    qrels = {f"q{i:04d}": dict(rel) for i, (_, rel) in enumerate(cases)}
    runs = {f"q{i:04d}": _reference_run(ranking) for i, (ranking, _) in enumerate(cases)}
    ref = _pytrec_judged_bpref(qrels, runs, ks)
    for i, (ranking, rel) in enumerate(cases):
        ours = {**judged_at(ranking, rel, ks), "bpref": bpref(ranking, rel)}
        _assert_close(ours, ref[f"q{i:04d}"], "pytrec_eval", f"q{i:04d}")
        fused = ranking_metrics(ranking, rel, ks)  # what scoring calls: the same values
        assert {name: fused[name] for name in ours} == ours


@settings(max_examples=300, deadline=None)
@given(
    ranking=st.lists(st.sampled_from([f"d{i}" for i in range(12)]), max_size=20),
    labels=st.dictionaries(st.sampled_from([f"d{i}" for i in range(14)]), st.integers(-1, 70), min_size=1),
    ks=st.lists(st.integers(1, 15), max_size=4),
)
def test_ranking_metrics_are_the_three_functions_bit_for_bit(
    ranking: list[str], labels: dict[str, int], ks: list[int]
) -> None:
    """ranking_metrics (one pass: what scoring calls) equals retrieval_metrics, judged_at and bpref
    called one after the other: the same names in the same order, the same floats bit for bit, the
    same error when no document is relevant."""
    if not any(g >= 1 for g in labels.values()):
        with pytest.raises(ValueError, match="at least one relevant document"):
            ranking_metrics(ranking, labels, ks)
        return
    expected = {**retrieval_metrics(ranking, labels, ks), **judged_at(ranking, labels, ks)}
    expected["bpref"] = bpref(ranking, labels)
    got = ranking_metrics(ranking, labels, ks)
    assert list(got) == list(expected)
    assert [v.hex() for v in got.values()] == [v.hex() for v in expected.values()]


def test_judged_and_bpref_match_pytrec_eval_seeded_batch() -> None:
    rng = np.random.default_rng(20261204)
    cases: list[tuple[list[str], dict[str, int]]] = []
    for _ in range(300):
        pool = int(rng.integers(3, 40))
        judged = rng.choice(pool, size=int(rng.integers(1, min(pool, 12) + 1)), replace=False)
        grades = rng.integers(0, 4, size=judged.size)
        if not (grades >= 1).any():
            grades[0] = 1
        ranking = [f"doc{j}" for j in rng.integers(0, pool, size=int(rng.integers(1, 31)))]
        cases.append((ranking, {f"doc{j}": int(g) for j, g in zip(judged, grades, strict=True)}))
    assert sum(0 in rel.values() for _, rel in cases) > 100  # judged non-relevant documents are exercised
    _cross_check_judged(cases, (1, 3, 5, 10, 25))


@pytest.mark.slow
def test_judged_and_bpref_match_pytrec_eval_on_clapnq(tmp_path: Path) -> None:
    """Real rankings: BM25 over ClapNQ dev's passages for its 300 answerable questions, scored against
    the dataset's labels and against the same labels with sparse judged non-relevant passages added
    (every fifth passage of the corpus, grade 0), as a pooled qrels file would have them."""
    from rag_ablate.dataset.importers import import_dataset
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.pipeline.bm25 import BM25Retriever
    from rag_ablate.text.analyzers import get_analyzer

    import_dataset("clapnq", shared_path("data", "clapnq-dev"), tmp_path / "clapnq")
    ds = load_dataset(tmp_path / "clapnq")
    doc_ids = list(ds.documents)
    texts = [d.text for d in ds.documents.values()]
    bm25 = BM25Retriever(texts, [(d, 0) for d in doc_ids], get_analyzer("en"))
    sparse_nonrel = dict.fromkeys(doc_ids[::5], 0)
    plain: list[tuple[list[str], dict[str, int]]] = []
    pooled: list[tuple[list[str], dict[str, int]]] = []
    for q in ds.queries:
        if q.kind == "answerable":
            ranking = [doc_ids[i] for i, _ in bm25.search(q.query, 50)]
            plain.append((ranking, dict(q.relevant)))
            pooled.append((ranking, {**sparse_nonrel, **q.relevant}))
    assert len(plain) == 300
    _cross_check_judged(plain, (1, 5, 10, 50))
    _cross_check_judged(pooled, (1, 5, 10, 50))
    # on the dataset's own labels (relevant only) judged@k is precision@k: say so in the docs
    ranking, rel = plain[0]
    assert (
        judged_at(ranking, rel, [5])["judged_at_5"] == retrieval_metrics(ranking, rel, [5])["precision_at_5"]
    )


# --------------------------------------------------------------------------- token counts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("   \n\t", 0),
        ("你好世界", 4),
        ("你好，世界。", 6),  # CJK punctuation: one token per character
        ("退货运费由谁承担？", 9),
        ("Hello world", 2),
        ("Hello, world.", 4),  # ASCII punctuation: one token per character
        ("GPT4 costs 3.5 dollars", 6),  # GPT4, costs, 3, ., 5, dollars
        ("snake_case", 3),
        ("café naïve", 2),
        ("cafe\u0301", 1),  # decomposed accent is composed first (NFC)
        ("用GPT-4回答", 6),  # 用, GPT, -, 4, 回, 答
        ("耳机买了10天坏了, who pays?", 12),  # 耳 机 买 了 / 10 / 天 坏 了 / , / who / pays / ?
        ("こんにちは", 5),
        ("안녕하세요", 5),
        ("全角　空格", 4),  # U+3000 ideographic space does not count
        ("ＡＢＣ", 3),  # full-width letters are CJK-block characters
    ],
)
def test_count_tokens(text: str, expected: int) -> None:
    assert count_tokens(text) == expected


def test_count_tokens_type_error() -> None:
    with pytest.raises(TypeError):
        count_tokens(None)  # type: ignore[arg-type]


def test_context_tokens() -> None:
    chunks = ["退货运费", "who pays the return shipping", "第三段"]
    assert context_tokens(chunks, 1) == 4
    assert context_tokens(chunks, 2) == 9
    assert context_tokens(chunks, 10) == 12
    assert context_tokens([], 5) == 0
    with pytest.raises(ConfigError):
        context_tokens(chunks, 0)
    with pytest.raises(TypeError):
        context_tokens("abc", 1)


def test_is_cjk_text() -> None:
    assert is_cjk_text("耳机坏了，谁付运费？")
    assert not is_cjk_text("Who pays the return shipping?")
    assert is_cjk_text("这个AirPods耳机坏了")  # 6 of 13 non-space characters
    assert not is_cjk_text("Apple的AirPods耳机坏了")  # 5 of 17: below 0.3
    assert not is_cjk_text("The word 坏 means broken")
    assert not is_cjk_text("")
    assert not is_cjk_text("   ")
    assert is_cjk_text("ab中", threshold=1 / 3)  # boundary is inclusive
    assert not is_cjk_text("ab中", threshold=0.34)
    with pytest.raises(ValueError):
        is_cjk_text("x", threshold=1.5)


def test_json_of_metrics_round_trips() -> None:
    m = retrieval_metrics(["a", "b"], {"b": 2}, [1, 2])
    assert json.loads(json.dumps(m)) == m
