"""Alternative evidence sets: ``relevant_sets`` in the contract, set_recall@k and set_hit@k.

A question that either of two sets of documents answers must not be marked wrong
for finding the other one. The metrics are checked against hand-worked rankings,
against ``retrieval_metrics`` where they must agree (one set = recall / full_recall
over that set), and through ``score_record`` on a loaded dataset; the validation
rules each name file, line and field.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError
from rag_ablate.metrics.registry import REGISTRY, parse_metric_name
from rag_ablate.metrics.retrieval import retrieval_metrics, set_metrics
from rag_ablate.records.scoring import aggregate, score_record
from tests.conftest import QUERIES, write_dataset

# S1 = {A, B} and S2 = {C, D, E}: either set answers the question.
SETS = [("A", "B"), ("C", "D", "E")]
# unique ranks: X 1, A 2, C 3, D 4, B 5, E 6 (the second A is a duplicate and takes no rank)
RANKING = ["X", "A", "C", "A", "D", "B", "E"]
# k: (set_recall, set_hit), worked by hand:
#   k=1 {X}            S1 0/2, S2 0/3            -> 0, 0
#   k=2 {X,A}          S1 1/2, S2 0/3            -> 1/2, 0
#   k=3 {X,A,C}        S1 1/2, S2 1/3            -> 1/2, 0
#   k=4 {X,A,C,D}      S1 1/2, S2 2/3            -> 2/3, 0   (the best-covered set changes)
#   k=5 +B             S1 2/2                    -> 1, 1
#   k=6 +E             both sets complete        -> 1, 1
#   k=10 (beyond the list: the same as k=6)      -> 1, 1
EXPECTED = {
    1: (0.0, 0.0),
    2: (0.5, 0.0),
    3: (0.5, 0.0),
    4: (2 / 3, 0.0),
    5: (1.0, 1.0),
    6: (1.0, 1.0),
    10: (1.0, 1.0),
}


def test_two_alternative_sets_against_a_hand_worked_ranking() -> None:
    got = set_metrics(RANKING, SETS, list(EXPECTED))
    assert list(got) == [f"{base}_at_{k}" for k in EXPECTED for base in ("set_recall", "set_hit")]
    for k, (recall, hit) in EXPECTED.items():
        assert got[f"set_recall_at_{k}"] == pytest.approx(recall), k
        assert got[f"set_hit_at_{k}"] == hit, k


def test_finding_the_other_set_is_not_a_miss() -> None:
    # The system found all of S2 and nothing of S1. Over the union of both sets the
    # ordinary metrics call it incomplete; the set metrics call it answered.
    ranking = ["C", "D", "E"]
    relevant = {d: 1 for s in SETS for d in s}
    plain = retrieval_metrics(ranking, relevant, [3])
    assert plain["recall_at_3"] == pytest.approx(3 / 5) and plain["full_recall_at_3"] == 0.0
    sets = set_metrics(ranking, SETS, [3])
    assert sets == {"set_recall_at_3": 1.0, "set_hit_at_3": 1.0}
    # and S1 alone, found at ranks 1-2, is as good
    assert set_metrics(["B", "A"], SETS, [2]) == {"set_recall_at_2": 1.0, "set_hit_at_2": 1.0}


def test_cutoff_counts_unique_documents_only() -> None:
    # duplicates take no rank: A A A B puts B at unique rank 2
    assert set_metrics(["A", "A", "A", "B"], SETS, [2])["set_hit_at_2"] == 1.0
    # a set one document short at k is not a hit, only a partial set_recall
    got = set_metrics(["A", "X", "B"], SETS, [2, 3])
    assert (got["set_recall_at_2"], got["set_hit_at_2"]) == (0.5, 0.0)
    assert (got["set_recall_at_3"], got["set_hit_at_3"]) == (1.0, 1.0)
    # nothing retrieved: zero at every k
    assert set_metrics([], SETS, [1, 5]) == {
        "set_recall_at_1": 0.0,
        "set_hit_at_1": 0.0,
        "set_recall_at_5": 0.0,
        "set_hit_at_5": 0.0,
    }


def test_bad_inputs_raise() -> None:
    with pytest.raises(ValueError, match="non-empty set"):
        set_metrics(["A"], [], [1])
    with pytest.raises(ValueError, match="non-empty set"):
        set_metrics(["A"], [("A",), ()], [1])
    with pytest.raises(ConfigError, match="positive integer"):
        set_metrics(["A"], SETS, [0])
    with pytest.raises(TypeError):
        set_metrics("AB", SETS, [1])


doc_ids = st.sampled_from("ABCDEFGH")


@settings(max_examples=200, deadline=None)
@given(
    ranking=st.lists(doc_ids, max_size=12),
    sets=st.lists(st.sets(doc_ids, min_size=1, max_size=4), min_size=1, max_size=3),
    ks=st.lists(st.integers(1, 10), min_size=1, max_size=4),
)
def test_invariants(ranking: list[str], sets: list[set[str]], ks: list[int]) -> None:
    got = set_metrics(ranking, sets, ks)
    for k in ks:
        # each set alone is an ordinary relevance judgement: the best of their recalls
        per_set = [retrieval_metrics(ranking, dict.fromkeys(s, 1), [k]) for s in sets]
        assert got[f"set_recall_at_{k}"] == pytest.approx(max(m[f"recall_at_{k}"] for m in per_set))
        assert got[f"set_hit_at_{k}"] == max(m[f"full_recall_at_{k}"] for m in per_set)
        assert got[f"set_hit_at_{k}"] == (1.0 if got[f"set_recall_at_{k}"] == 1.0 else 0.0)
    ordered = sorted(set(ks))
    values = [got[f"set_recall_at_{k}"] for k in ordered]
    assert values == sorted(values)  # never falls as k grows


def test_registered_with_a_cutoff() -> None:
    spec, k = parse_metric_name("set_recall@5")
    assert (spec.base, k, spec.direction, spec.binary) == ("set_recall", 5, "higher", False)
    assert REGISTRY["set_hit"].binary and REGISTRY["set_hit"].takes_k


# --------------------------------------------------------------------------- the dataset contract


def _queries() -> list[dict[str, Any]]:
    return copy.deepcopy(QUERIES)


def _errors(
    tmp_path: Path, queries: list[dict[str, Any]]
) -> list[tuple[str | None, int | None, str | None, str]]:
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(write_dataset(tmp_path / "ds", queries=queries))
    return [(e.file, e.line, e.field, e.reason) for e in info.value.errors]


def test_relevant_sets_load_and_score(tmp_path: Path) -> None:
    qs = _queries()
    # q2: who pays return shipping for a faulty item. FEES says it; so do RET and WARR together
    qs[1]["relevant"] = {"FEES": 2, "RET": 1, "WARR": 1}
    qs[1]["relevant_sets"] = [["FEES"], ["RET", "WARR"]]
    ds = load_dataset(write_dataset(tmp_path / "ds", queries=qs))
    by_id = {q.query_id: q for q in ds.queries}
    assert by_id["q2"].relevant_sets == (("FEES",), ("RET", "WARR"))
    assert by_id["q1"].relevant_sets == ()
    assert ds.summary()["with_relevant_sets"] == 1

    def record(qid: str, doc_ids: list[str]) -> dict[str, Any]:
        retrieved = [{"doc_id": d, "start": 0, "end": 20, "score": 1.0} for d in doc_ids]
        return {"query_id": qid, "split": by_id[qid].split, "kind": "answerable", "status": "ok",
                "retrieved": retrieved, "timings_ms": {"total": 5.0}}  # fmt: skip

    # RET then WARR: the second set, complete at k=2; FEES (grade 2) never came back
    m2 = score_record(record("q2", ["RET", "SHIP", "WARR"]), by_id["q2"], ds.documents, [1, 3], routed=False)
    assert (m2["set_recall_at_1"], m2["set_hit_at_1"]) == (0.5, 0.0)
    assert (m2["set_recall_at_3"], m2["set_hit_at_3"]) == (1.0, 1.0)
    assert m2["recall_at_3"] == pytest.approx(2 / 3) and m2["full_recall_at_3"] == 0.0  # unchanged
    # a query without relevant_sets has no set metric: it is left out of their mean, not scored 0
    m1 = score_record(record("q1", ["SHIP"]), by_id["q1"], ds.documents, [1, 3], routed=False)
    assert "set_recall_at_3" not in m1 and m1["recall_at_3"] == 0.0
    agg = aggregate([{**record("q2", []), "split": "dev", "metrics": m2},
                     {**record("q1", []), "split": "dev", "metrics": m1}])  # fmt: skip
    assert agg["all/set_hit_at_3"] == 1.0 and agg["all/recall_at_3"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("value", "field", "reason"),
    [
        ({"FEES": 1}, "relevant_sets", "non-empty list of alternative sets"),
        ([], "relevant_sets", "non-empty list of alternative sets"),
        ([["FEES"], []], "relevant_sets[1]", "non-empty list of doc ids"),
        ([["FEES", 3]], "relevant_sets[0]", "non-empty list of doc ids"),
        ([["FEES"], ["NOPE"]], "relevant_sets[1]", "doc_id 'NOPE' is not in the corpus"),
        ([["FEES"], ["SHIP"]], "relevant_sets[1]", "doc_id 'SHIP' is not in 'relevant'"),
        ([["FEES", "FEES"]], "relevant_sets[0]", "more than once"),
        ([["FEES", "RET"], ["RET", "FEES"]], "relevant_sets[1]", "the same set as relevant_sets[0]"),
    ],
)
def test_validation_errors(tmp_path: Path, value: object, field: str, reason: str) -> None:
    qs = _queries()
    qs[1]["relevant_sets"] = value  # q2, line 2; relevant = {FEES: 2, RET: 1}
    errors = _errors(tmp_path, qs)
    assert errors[0][:3] == ("queries.jsonl", 2, field), errors
    assert reason in errors[0][3]


def test_an_unanswerable_query_has_no_sets(tmp_path: Path) -> None:
    qs = _queries()
    qs[4]["relevant_sets"] = [["SHIP"]]  # q5: answerable false, no relevant
    errors = _errors(tmp_path, qs)
    assert errors == [("queries.jsonl", 5, "relevant_sets", errors[0][3])]
    assert "non-empty 'relevant'" in errors[0][3]


def test_every_problem_is_listed(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["relevant_sets"] = [["NOPE"]]
    qs[2]["relevant_sets"] = [["SHIP"], ["SHIP"]]
    errors = _errors(tmp_path, qs)
    assert [(line, fld) for _, line, fld, _ in errors] == [(1, "relevant_sets[0]"), (3, "relevant_sets[1]")]


def test_metrics_md_worked_example_matches_the_code() -> None:
    from tests.test_docs import DOCS, _number, _section, _table

    section = _section(DOCS / "metrics.md", "Worked example: two sets")
    assert "`S1 = {A, B}` and `S2 = {C, D, E}`" in section and "`X, A, C, A, D, B, E`" in section
    rows = _table(section)
    ks = [int(r[0]) for r in rows]
    assert ks == [1, 2, 3, 4, 5, 10]
    got = set_metrics(["X", "A", "C", "A", "D", "B", "E"], [["A", "B"], ["C", "D", "E"]], ks)
    for row in rows:
        k = row[0]
        assert got[f"set_recall_at_{k}"] == pytest.approx(_number(row[4]), abs=5e-5), k
        assert got[f"set_hit_at_{k}"] == _number(row[5]), k
