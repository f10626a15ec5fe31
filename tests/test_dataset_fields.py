"""The dataset contract's query fields from the seeds' sets, and gold chunk ids.

* ``metadata``, ``applicable_version``, ``expected_behavior`` and ``relevant_chunks`` load with good
  values and are refused with bad ones, each error naming file, line and field; ``validate``
  counts them.
* ``expected_behavior`` must agree with the gold, and decides the refusal metrics.
* ``relevant_chunks``: chunk-level metrics on hand-made cases, against ranx and pytrec_eval; absent
  (never 0) when a retrieved item carries no chunk id; doc-level metrics absent when only chunks
  are labelled; a failed query misses them.
* Records keep the fields, round-trip through ``records.jsonl`` and rescore to the same values;
  metadata, expected behaviour and version are slices of a run and of a comparison.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.cli.main import main
from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.slices import compare_slices
from rag_ablate.core.errors import DatasetError
from rag_ablate.core.layout import SLICES_JSON
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, DatasetValidationError, Query
from rag_ablate.metrics.answers import AnswerScoring
from rag_ablate.metrics.retrieval import CHUNK_BASES, chunk_metrics
from rag_ablate.records.jsonl import read_records, write_records
from rag_ablate.records.scoring import aggregate, make_record, rescore, scored
from rag_ablate.records.trace import RetrievedChunk, Trace
from rag_ablate.run.slices import MAX_METADATA_VALUES, SliceKey, mlflow_key, slice_metrics
from tests.conftest import QUERIES, run_in_process, write_dataset
from tests.test_metrics_retrieval import RANX_WARNING, _pytrec_values, _ranx_values, _reference_run
from tests.test_slices import _rec as slice_record

KS = [1, 3, 5]


def _load(tmp_path: Path, *extra: dict[str, Any]) -> Dataset:
    return load_dataset(write_dataset(tmp_path / "ds", queries=[*QUERIES, *extra]))


def _errors(tmp_path: Path, *extra: dict[str, Any]) -> list[DatasetError]:
    with pytest.raises(DatasetValidationError) as exc:
        _load(tmp_path, *extra)
    return exc.value.errors


def _q(qid: str, **fields: Any) -> dict[str, Any]:
    return {"query_id": qid, "query": f"question {qid} about something", **fields}


# --------------------------------------------------------------------------- loading and validation


def test_the_fields_load_and_validate_counts_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = _load(
        tmp_path,
        _q("m1", relevant={"RET": 1}, metadata={"product": "phone", "n": 2.5}, applicable_version="2026-10"),
        _q("m2", relevant_chunks={"kb-1": 2, "kb-2": 1}, expected_behavior="answer"),
        _q("m3", expected_behavior="refuse", metadata={}),
        _q("m4", relevant={"SHIP": 1}, expected_behavior="clarify"),
        _q("m5", expected_behavior="clarify"),
    )
    by = {q.query_id: q for q in ds.queries}
    assert by["m1"].metadata == {"product": "phone", "n": 2.5} and by["m1"].applicable_version == "2026-10"
    assert by["m2"].relevant_chunks == {"kb-1": 2, "kb-2": 1} and by["m2"].kind == "answerable"
    assert by["m2"].relevant == {}  # gold chunks alone make a query answerable
    assert (by["m3"].kind, by["m3"].behavior, by["m3"].metadata) == ("unanswerable", "refuse", {})
    assert (by["m4"].kind, by["m4"].behavior) == ("answerable", "clarify")
    assert (by["m5"].kind, by["m5"].behavior) == ("unanswerable", "clarify")
    assert by["q1"].behavior == "answer" and by["q1"].expected_behavior is None  # from the gold
    s = ds.summary()
    assert (s["with_relevant_chunks"], s["with_metadata"], s["with_applicable_version"]) == (1, 1, 1)
    assert s["expected_behavior"] == {"answer": 1, "refuse": 1, "clarify": 2}

    assert main(["validate", str(ds.path)]) == 0
    out = capsys.readouterr().out
    assert (
        "query fields    relevant_chunks 1, metadata 1, applicable_version 1, "
        "expected_behavior answer 1 / refuse 1 / clarify 2"
    ) in out


BAD = [
    ({"metadata": ["phone"]}, "metadata", "must be a JSON object {key: value}, got list"),
    ({"metadata": "phone"}, "metadata", "must be a JSON object {key: value}, got str"),
    ({"applicable_version": 3}, "applicable_version", "must be a string, got int"),
    ({"applicable_version": "  "}, "applicable_version", "must be a non-empty string"),
    (
        {"expected_behavior": "deflect"},
        "expected_behavior",
        "must be one of answer, refuse, clarify, got 'deflect'",
    ),
    ({"expected_behavior": True}, "expected_behavior", "must be one of answer, refuse, clarify, got True"),
    ({"relevant_chunks": ["kb-1"]}, "relevant_chunks", "must be an object {chunk_id: grade}, got list"),
    ({"relevant_chunks": {"kb-1": 0}}, "relevant_chunks", "grade of 'kb-1' must be an integer >= 1, got 0"),
    (
        {"relevant_chunks": {"kb-1": 1.5}},
        "relevant_chunks",
        "grade of 'kb-1' must be an integer >= 1, got 1.5",
    ),
    ({"relevant_chunks": {" ": 1}}, "relevant_chunks", "a chunk id must be a non-empty string"),
    (
        {"relevant_chunks": {"kb-1": 1}, "answerable": False},
        "answerable",
        "answerable is false but 'relevant_chunks' is not empty",
    ),
    (
        {"answerable": True},
        "answerable",
        "answerable is true but 'relevant' is empty (and so is 'relevant_chunks')",
    ),
    (
        {"relevant": {"RET": 1}, "expected_behavior": "refuse"},
        "expected_behavior",
        "'refuse' on an answerable query",
    ),
    (
        {"relevant_chunks": {"c": 1}, "expected_behavior": "refuse"},
        "expected_behavior",
        "'refuse' on an answerable",
    ),
    ({"expected_behavior": "answer"}, "expected_behavior", "'answer' on an unanswerable query"),
]


@pytest.mark.parametrize(("fields", "field", "message"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_values_name_file_line_and_field(
    tmp_path: Path, fields: dict[str, Any], field: str, message: str
) -> None:
    errors = _errors(tmp_path, _q("bad", **fields))
    line = len(QUERIES) + 1
    assert [(e.file, e.line, e.field) for e in errors] == [("queries.jsonl", line, field)]
    assert message in errors[0].reason
    assert str(errors[0]).startswith(f"queries.jsonl:{line}: field '{field}': ")


def test_answer_on_a_turn_that_needs_no_retrieval_and_refuse_on_chit_chat_are_fine(tmp_path: Path) -> None:
    ds = _load(
        tmp_path,
        _q("c1", requires_rag=False, expected_behavior="answer"),
        _q("c2", requires_rag=False, expected_behavior="refuse"),
    )
    assert [(q.kind, q.behavior) for q in ds.queries[-2:]] == [("no_rag", "answer"), ("no_rag", "refuse")]


# --------------------------------------------------------------------------- refusal metrics


def _answered(q: Query, answer: str) -> dict[str, Any]:
    rec = make_record(q, Trace(q.query_id, answer=answer, timings_ms={"total": 1.0}))
    return dict(scored(rec, q, {}, KS, routed=False, answers=AnswerScoring()).get("metrics") or {})


def test_refusal_metrics_follow_expected_behavior(tmp_path: Path) -> None:
    ds = _load(
        tmp_path,
        _q("r1", expected_behavior="clarify"),  # unanswerable, but should ask back: neither metric
        _q("r2", relevant={"RET": 1}, expected_behavior="clarify"),
        _q("r3", requires_rag=False, expected_behavior="refuse"),  # out of scope: must decline
        _q("r4", expected_behavior="refuse"),
        _q("r5", requires_rag=False),  # chit-chat without expected_behavior: neither, as before
    )
    by = {q.query_id: q for q in ds.queries}
    refusing = "Sorry, I cannot answer that."
    for qid in ("r1", "r2", "r5"):
        m = _answered(by[qid], refusing)
        assert m["refusal"] == 1.0 and "correct_refusal" not in m and "over_refusal" not in m, qid
    assert _answered(by["r3"], refusing)["correct_refusal"] == 1.0
    assert _answered(by["r3"], "Here is a joke.")["correct_refusal"] == 0.0
    assert _answered(by["r4"], refusing)["correct_refusal"] == 1.0
    assert _answered(by["q1"], refusing)["over_refusal"] == 1.0  # answerable without the field: answer


# --------------------------------------------------------------------------- chunk-level metrics


def test_chunk_metrics_worked_example() -> None:
    # docs/metrics.md "Worked example: chunk ids": distinct ranking c3 c7 c1 c9
    m = chunk_metrics(["c3", "c7", "c3", "c1", "c9"], {"c7": 2, "c9": 1}, [1, 3, 5])
    assert list(m) == [f"{b}_at_{k}" for k in (1, 3, 5) for b in CHUNK_BASES]
    assert [m[f"{b}_at_1"] for b in CHUNK_BASES] == [0.0, 0.0, 0.0, 0.0]
    ideal = 3 + 1 / np.log2(3)
    assert (m["chunk_hit_at_3"], m["chunk_recall_at_3"], m["chunk_mrr_at_3"]) == (1.0, 0.5, 0.5)
    assert m["chunk_ndcg_at_3"] == pytest.approx(3 / np.log2(3) / ideal)
    assert (m["chunk_recall_at_5"], m["chunk_mrr_at_5"]) == (1.0, 0.5)
    assert m["chunk_ndcg_at_5"] == pytest.approx((3 / np.log2(3) + 1 / np.log2(5)) / ideal)
    with pytest.raises(ValueError):
        chunk_metrics(["c1"], {}, [1])


@RANX_WARNING
@pytest.mark.slow
def test_chunk_metrics_match_ranx_and_pytrec_eval() -> None:
    rng = np.random.default_rng(7)
    qrels: dict[str, dict[str, int]] = {}
    runs: dict[str, dict[str, float]] = {}
    ours: dict[str, dict[str, float]] = {}
    ks = [1, 3, 5, 10]
    for i in range(60):
        pool = int(rng.integers(3, 30))
        judged = rng.choice(pool, size=int(rng.integers(1, min(pool, 8) + 1)), replace=False)
        gold = {f"kb-{j}": int(rng.integers(1, 4)) for j in judged}
        ranking = [f"kb-{j}" for j in rng.integers(0, pool, size=int(rng.integers(1, 20)))]
        q = f"q{i:03d}"
        qrels[q], runs[q], ours[q] = gold, _reference_run(ranking), chunk_metrics(ranking, gold, ks)
    for tool, ref in (
        ("ranx", _ranx_values(qrels, runs, ks)),
        ("pytrec_eval", _pytrec_values(qrels, runs, ks)),
    ):
        for q, values in ours.items():
            expected = {
                f"chunk_{name}": v
                for name, v in ref[q].items()
                if f"chunk_{name.split('_at_')[0]}" in CHUNK_BASES
            }
            assert values == pytest.approx(expected, abs=1e-9), (tool, q)


def _chunk(rank: int, chunk_id: str, doc_id: str = "RET") -> RetrievedChunk:
    return RetrievedChunk(rank, chunk_id, doc_id, 0, 10, 1.0 / rank)


def test_chunk_metrics_are_scored_when_both_sides_have_chunk_ids(tmp_path: Path) -> None:
    ds = _load(
        tmp_path,
        _q("k1", relevant_chunks={"kb-9": 1}),  # gold chunks only
        _q("k2", relevant={"RET": 2}, relevant_chunks={"kb-9": 1}),  # both
    )
    by = {q.query_id: q for q in ds.queries}
    docs = ds.documents

    def metrics(qid: str, retrieved: list[RetrievedChunk], status: str = "ok") -> dict[str, Any]:
        trace = Trace(qid, status=status, retrieved=retrieved, timings_ms={"total": 1.0})  # type: ignore[arg-type]
        return dict(scored(make_record(by[qid], trace), by[qid], docs, KS, routed=False)["metrics"])

    m = metrics("k1", [_chunk(1, "kb-1"), _chunk(2, "kb-9", "SHIP")])
    assert (m["chunk_hit_at_1"], m["chunk_hit_at_3"], m["chunk_mrr_at_5"]) == (0.0, 1.0, 0.5)
    assert not any(k.startswith(("recall_", "hit_", "ndcg_", "mrr_")) for k in m)  # no doc-level gold
    both = metrics("k2", [_chunk(1, "kb-1"), _chunk(2, "kb-9", "SHIP")])
    assert (both["recall_at_1"], both["chunk_recall_at_1"], both["chunk_recall_at_3"]) == (1.0, 0.0, 1.0)
    # a retrieved item without a chunk id: the chunk metrics are absent, never 0
    bare = metrics("k2", [_chunk(1, ""), _chunk(2, "kb-9")])
    assert "recall_at_1" in bare and not any(k.startswith("chunk_") for k in bare)
    # nothing retrieved is a miss; a failed query misses them in the failure-aware form
    assert metrics("k1", [])["chunk_recall_at_5"] == 0.0
    failed = metrics("k1", [], status="timeout")
    assert failed["chunk_recall_at_5"] is None and "recall_at_5" not in failed
    # queries without relevant_chunks never get them
    assert not any(k.startswith("chunk_") for k in metrics("q1", [_chunk(1, "kb-9")]))


# --------------------------------------------------------------------------- records and slices


def test_records_keep_the_fields_and_round_trip(tmp_path: Path) -> None:
    ds = _load(
        tmp_path,
        _q("k1", relevant_chunks={"kb-9": 1}, metadata={"product": "phone", "tags": ["a", "b"]}),
        _q("k2", expected_behavior="refuse", applicable_version="v2"),
    )
    by = {q.query_id: q for q in ds.queries}
    retrieved = {"k1": [_chunk(1, "kb-9")], "k2": [], "q1": []}
    records = [
        scored(
            make_record(by[q], Trace(q, retrieved=r, timings_ms={"total": 2.0})),
            by[q],
            ds.documents,
            KS,
            routed=False,
        )
        for q, r in retrieved.items()
    ]
    assert records[0]["metadata"] == {"product": "phone", "tags": ["a", "b"]}
    assert (records[1]["expected_behavior"], records[1]["applicable_version"]) == ("refuse", "v2")
    assert not {"metadata", "expected_behavior", "applicable_version"} & set(records[2])  # only when given
    path = tmp_path / "records.jsonl"
    write_records(path, records)
    back = read_records(path)
    assert back == json.loads(json.dumps(records))
    again = rescore(back, ds, KS, routed=False)
    assert [r["metrics"] for r in again] == [r["metrics"] for r in records]
    assert aggregate(again)["all/chunk_recall_at_1"] == 1.0


def _rec(qid: str, value: float, **fields: Any) -> dict[str, Any]:
    """A dev record of an answerable query (tests/test_slices.py's) with ``fields`` added."""
    return {**slice_record(qid, "dev", [], None, None, {"recall_at_5": value}, latency=1.0), **fields}


def test_metadata_version_and_behaviour_are_slices_of_a_run() -> None:
    records = [
        _rec("a", 1.0, metadata={"product": "phone", "channel": ["app", "web"], "score": 0.5, "x": {"y": 1}}),
        _rec("b", 0.0, metadata={"product": "tv", "vip": True}, applicable_version="v2"),
        _rec("c", 0.5, metadata={"product": "phone"}, expected_behavior="clarify"),
        _rec("d", 0.25),
    ]
    table = slice_metrics(records)  # type: ignore[arg-type]
    names = [s.key.name for s in table.slices]
    assert names == [
        "expected_behavior=clarify",
        "applicable_version=v2",
        "metadata.channel=app",
        "metadata.channel=web",
        "metadata.product=phone",
        "metadata.product=tv",
        "metadata.vip=true",
    ]  # floats and nested objects are kept in the record, not sliced
    phone = table.get("metadata.product", "phone")
    assert (
        phone is not None and phone.mean("dev", "recall_at_5") == 0.75 and phone.n("dev", "recall_at_5") == 2
    )
    assert table.kinds[-3:] == ["metadata.channel", "metadata.product", "metadata.vip"]
    assert "| metadata.product=phone | 2 | 0 | 0.750 (2) |" in table.to_markdown(["recall_at_5"])
    assert mlflow_key(SliceKey("metadata.pro/duct", "a=b"), "dev", "recall_at_5") == (
        "slice/metadata.pro_duct.a_b/dev/recall_at_5"
    )
    # a key with a value per query (an id) is not sliced
    many = [
        _rec(f"q{i}", 1.0, metadata={"ticket": f"T-{i}", "product": "phone"})
        for i in range(MAX_METADATA_VALUES + 1)
    ]
    kinds = {s.key.kind for s in slice_metrics(many).slices}  # type: ignore[arg-type]
    assert kinds == {"metadata.product"}


def test_a_metadata_slice_in_a_comparison() -> None:
    """The variant breaks the `product=tv` queries and helps the `phone` ones: the comparison's slice
    section finds both, by the metadata of the records."""
    base, var = [], []
    for i in range(30):
        product = "tv" if i % 2 else "phone"
        meta = {"product": product}
        base.append(_rec(f"q{i}", 1.0 if product == "tv" else 0.0, metadata=meta))
        var.append(_rec(f"q{i}", 0.0 if product == "tv" else 1.0, metadata=meta))
    variants = [VariantData("baseline", base, info={"role": "baseline"}), VariantData("v", var)]  # type: ignore[arg-type]
    c = compare(variants, metrics=["recall_at_5"], splits=["dev"], B=500, seed=1)
    sec = compare_slices(variants, c, metrics=["recall_at_5"], min_groups=6)
    by = {r.name: r for r in sec.rows}
    assert by["metadata.product=tv"].verdict == "hurts" and by["metadata.product=tv"].effect == -1.0
    assert by["metadata.product=phone"].verdict == "helps"


@pytest.mark.slow
def test_a_run_keeps_the_fields_scores_local_chunk_ids_and_slices_by_metadata(tmp_path: Path) -> None:
    """A whole job on the tiny dataset (system=local names its chunks <doc_id>#<n>)."""
    queries = [dict(q) for q in QUERIES]
    queries[0].update(relevant_chunks={"RET#0": 2}, metadata={"product": "returns"})
    queries[1]["metadata"] = {"product": "shipping"}
    queries.append(_q("c1", expected_behavior="clarify", metadata={"product": "returns"}))
    ds = write_dataset(tmp_path / "ds", queries=queries)
    args = [
        f"dataset.path={ds}",
        f"paths.output_root={tmp_path / 'out'}",
        f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"cache.dir={tmp_path / 'cache'}",
        "progress=false",
    ]
    proc = run_in_process(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = next((tmp_path / "out" / "runs").iterdir())
    records = {r["query_id"]: r for r in read_records(job / "records.jsonl")}
    q1, c1 = records[queries[0]["query_id"]], records["c1"]
    assert q1["metadata"] == {"product": "returns"} and "expected_behavior" not in q1
    assert (c1["expected_behavior"], c1["kind"]) == ("clarify", "unanswerable")
    ranked = [e["chunk_id"] for e in q1["retrieved"]]
    expected = chunk_metrics(ranked, {"RET#0": 2}, [1, 3, 5, 10])
    assert {k: v for k, v in q1["metrics"].items() if k.startswith("chunk_")} == expected
    assert "RET#0" in ranked[:3] and expected["chunk_hit_at_3"] == 1.0
    assert not any(k.startswith("chunk_") for r in records.values() if r is not q1 for k in r["metrics"])
    metrics = json.loads((job / "metrics.json").read_text(encoding="utf-8"))
    split = q1["split"]
    assert metrics[f"{split}/chunk_recall_at_5"] == expected["chunk_recall_at_5"]
    slices = json.loads((job / SLICES_JSON).read_text(encoding="utf-8"))
    names = {s["name"]: s for s in slices["slices"]}
    wanted = {"metadata.product=returns", "metadata.product=shipping", "expected_behavior=clarify"}
    assert wanted <= set(names)
    assert names["metadata.product=returns"]["metrics"]["all/n_queries"] == 2.0
