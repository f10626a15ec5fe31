"""The dataset contract: one test per rule, each checking file, line and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.errors import DatasetError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError, sample_dataset_path
from tests.conftest import DOCS, INTENTS, QUERIES, write_dataset


def _queries() -> list[dict[str, Any]]:
    return copy.deepcopy(QUERIES)


def _expect(
    tmp_path: Path,
    *,
    file: str,
    line: int | None,
    field: str | None,
    match: str,
    docs: list[dict[str, Any]] | None = None,
    queries: list[dict[str, Any]] | None = None,
    intents: list[dict[str, Any]] | None = None,
) -> DatasetValidationError:
    folder = write_dataset(tmp_path / "ds", docs, queries, intents)
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(folder)
    err = info.value.errors[0]
    assert (err.file, err.line, err.field) == (file, line, field), str(err)
    assert match in str(err)
    return info.value


def test_tiny_dataset_loads(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    assert len(ds.documents) == 4 and len(ds.queries) == 8
    kinds = {q.query_id: q.kind for q in ds.queries}
    assert kinds["q5"] == "unanswerable" and kinds["q6"] == "no_rag" and kinds["q1"] == "answerable"
    by_id = {q.query_id: q for q in ds.queries}
    assert by_id["q7"].group == by_id["q8"].group == "tpl_where"
    assert by_id["q7"].split == by_id["q8"].split
    assert {q.split for q in ds.queries} <= {"dev", "holdout"}
    assert ds.splits_assigned == 8 and ds.groups_computed == 6


def test_fingerprints_change_with_content(tmp_path: Path) -> None:
    a = load_dataset(write_dataset(tmp_path / "a"))
    docs = copy.deepcopy(DOCS)
    docs[0]["text"] += " Extra sentence."
    b = load_dataset(write_dataset(tmp_path / "b", docs=docs))
    assert a.corpus_fingerprint != b.corpus_fingerprint
    assert a.queries_fingerprint == b.queries_fingerprint


def test_duplicate_doc_id(tmp_path: Path) -> None:
    docs = [*DOCS, {"doc_id": "RET", "text": "again"}]
    _expect(tmp_path, docs=docs, file="corpus.jsonl", line=5, field="doc_id", match="duplicate doc_id 'RET'")


def test_duplicate_query_id(tmp_path: Path) -> None:
    qs = _queries()
    qs[2]["query_id"] = "q1"
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=3, field="query_id", match="duplicate query_id")


@pytest.mark.parametrize(
    "bad_id",
    ["q 1", "q1 ", "q\t1", "q\n1", "q\x001", "q\x1b[31m1", "q\u30001", "q\u00a01", "q\u200b1", "q\u202e1"],
    ids=["space", "trailing", "tab", "newline", "nul", "escape", "ideographic", "nbsp", "zero-width", "rtl"],
)
def test_ids_with_whitespace_or_control_characters_are_refused(tmp_path: Path, bad_id: str) -> None:
    """TREC files split columns on whitespace, a NUL ends a C string, an ESC acts on a terminal:
    such ids fail validation with file, line and field, before anything runs."""
    qs = _queries()
    qs[1]["query_id"] = bad_id
    err = _expect(
        tmp_path / "q",
        queries=qs,
        file="queries.jsonl",
        line=2,
        field="query_id",
        match="must be free of whitespace",
    ).errors[0]
    assert "\x1b" not in str(err) and "\x00" not in str(err) and "\n" not in str(err)
    docs = [*DOCS, {"doc_id": bad_id.replace("q", "d"), "text": "a document"}]
    _expect(tmp_path / "d", docs=docs, file="corpus.jsonl", line=len(docs), field="doc_id", match="doc_id ")


def test_missing_text(tmp_path: Path) -> None:
    docs = copy.deepcopy(DOCS)
    docs[1]["text"] = "   "
    _expect(tmp_path, docs=docs, file="corpus.jsonl", line=2, field="text", match="non-empty")


def test_missing_query(tmp_path: Path) -> None:
    qs = _queries()
    del qs[3]["query"]
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=4, field="query", match="required")


def test_relevant_unknown_doc(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["relevant"] = {"NOPE": 2}
    _expect(
        tmp_path,
        queries=qs,
        file="queries.jsonl",
        line=1,
        field="relevant",
        match="'NOPE' is not in the corpus",
    )


def test_relevant_bad_grade(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["relevant"] = {"RET": 0}
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=1, field="relevant", match="integer >= 1")


def test_evidence_unknown_doc(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["evidence"] = [{"doc_id": "NOPE", "start": 0, "end": 3}]
    _expect(
        tmp_path,
        queries=qs,
        file="queries.jsonl",
        line=1,
        field="evidence[0].doc_id",
        match="not in the corpus",
    )


@pytest.mark.parametrize("start,end", [(-1, 3), (5, 5), (7, 3), (0, 10_000)])
def test_evidence_offsets_out_of_range(tmp_path: Path, start: int, end: int) -> None:
    qs = _queries()
    qs[0]["evidence"] = [{"doc_id": "RET", "start": start, "end": end}]
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=1, field="evidence[0]", match="0 <= start < end")


def test_answerable_true_without_relevant(tmp_path: Path) -> None:
    qs = _queries()
    qs[4]["answerable"] = True
    _expect(
        tmp_path, queries=qs, file="queries.jsonl", line=5, field="answerable", match="'relevant' is empty"
    )


def test_answerable_false_with_relevant(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["answerable"] = False
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=1, field="answerable", match="is not empty")


def test_unknown_intent(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["intent_l2"] = "K_nope"
    err = _expect(
        tmp_path, queries=qs, file="queries.jsonl", line=1, field="intent_l2", match="not in intents.jsonl"
    )
    assert "K_returns" in str(err.errors[0])  # lists the valid names


def test_intent_wrong_parent(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["intent_l1"] = "CHITCHAT"
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=1, field="intent_l1", match="not the parent")


def test_group_spans_both_splits(tmp_path: Path) -> None:
    qs = _queries()
    qs[6]["split"] = "dev"
    qs[7]["split"] = "holdout"
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=7, field="split", match="spans both splits")


def test_bad_split_value(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["split"] = "test"
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=1, field="split", match="dev, holdout")


def test_unknown_field_is_a_typo(tmp_path: Path) -> None:
    qs = _queries()
    qs[1]["relevent"] = {"RET": 1}
    _expect(tmp_path, queries=qs, file="queries.jsonl", line=2, field="relevent", match="unknown field")


def test_invalid_json_line(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "ds")
    with (folder / "queries.jsonl").open("a", encoding="utf-8") as f:
        f.write("\n{not json}\n")
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(folder)
    err = info.value.errors[0]
    assert (err.file, err.line) == ("queries.jsonl", 10) and "invalid JSON" in str(err)


def test_duplicate_intent(tmp_path: Path) -> None:
    intents = [*INTENTS, dict(INTENTS[0])]
    _expect(
        tmp_path,
        intents=intents,
        file="intents.jsonl",
        line=5,
        field="intent_l2",
        match="duplicate intent_l2",
    )


def test_all_problems_reported_and_nothing_loaded(tmp_path: Path) -> None:
    qs = _queries()
    qs[0]["relevant"] = {"NOPE": 1}
    qs[2]["split"] = "train"
    folder = write_dataset(tmp_path / "ds", queries=qs)
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(folder)
    assert [e.line for e in info.value.errors] == [1, 3]


def test_missing_folder_and_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="dataset folder not found"):
        load_dataset(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"missing corpus\.jsonl"):
        load_dataset(tmp_path / "empty")


def test_requires_rag_defaults_from_intent(tiny_dataset: Path) -> None:
    q6 = next(q for q in load_dataset(tiny_dataset).queries if q.query_id == "q6")
    assert q6.requires_rag is False and q6.kind == "no_rag"


def test_sample_dataset_meets_issue_requirements() -> None:
    ds = load_dataset(sample_dataset_path())
    s = ds.summary()
    assert s["documents"] >= 60
    assert s["queries"] >= 200
    assert s["unanswerable"] >= 0.10 * s["queries"]
    assert s["multi_doc"] >= 20
    assert s["no_rag"] >= 10
    leaves = ds.intents
    assert len(leaves) >= 8 and len({i.intent_l1 for i in leaves.values()}) >= 3
    assert any(not i.requires_rag for i in leaves.values())
    lengths = sorted(len(d.text) for d in ds.documents.values())
    in_range = sum(1 for n in lengths if 400 <= n <= 3000)
    assert in_range >= 0.8 * len(lengths)
    assert s["groups_multi"] >= 8
    assert 0.2 <= s["splits"]["holdout"] / s["queries"] <= 0.4
    # every group sits in one split
    split_of: dict[str, set[str]] = {}
    for q in ds.queries:
        split_of.setdefault(q.group, set()).add(q.split)
    assert all(len(v) == 1 for v in split_of.values())
    # evidence spans are real text
    for q in ds.queries:
        for e in q.evidence:
            assert ds.documents[e.doc_id].text[e.start : e.end].strip()
    json.dumps(s, ensure_ascii=False)
