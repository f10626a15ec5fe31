"""TREC run and qrels files round-trip through ranx and pytrec_eval with our numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.dataset.load import load_dataset
from rag_ablate.run.export import trec_run_lines, write_trec
from rag_ablate.run.runner import evaluate
from rag_ablate.systems.local import LocalSystem

# on the tests that run ranx only: resolving the category imports numba, which the others do not need
RANX_WARNING = pytest.mark.filterwarnings(
    "ignore:unsafe cast from uint64 to int64:numba.core.errors.NumbaTypeSafetyWarning"
)


def _records(tiny_dataset: Path) -> tuple[list[dict], object]:
    ds = load_dataset(tiny_dataset)
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 12, 3  # several chunks per document: duplicates to de-duplicate
    s.chunk.unit = "token"
    target = LocalSystem(s)
    target.prepare(ds)
    return evaluate(target, ds, [1, 3, 5, 10]), ds


def test_run_lines_dedupe_and_keep_order(tiny_dataset: Path) -> None:
    records, _ = _records(tiny_dataset)
    rec = next(r for r in records if r["query_id"] == "q2")
    docs = [x["doc_id"] for x in rec["retrieved"]]
    assert len(docs) > len(set(docs))  # the chunk list repeats documents
    lines = [ln.split() for ln in trec_run_lines([rec], "my run")]
    assert [ln[2] for ln in lines] == list(dict.fromkeys(docs))
    assert [int(ln[3]) for ln in lines] == list(range(1, len(lines) + 1))
    assert all(ln[5] == "my_run" for ln in lines)
    scores = [float(ln[4]) for ln in lines]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == len(scores)


@RANX_WARNING
@pytest.mark.slow
def test_trec_files_round_trip_through_ranx_and_pytrec_eval(tiny_dataset: Path, tmp_path: Path) -> None:
    import pytrec_eval
    from ranx import Qrels, Run, evaluate

    records, ds = _records(tiny_dataset)
    run_path, qrels_path = write_trec(records, ds, tmp_path, "bm25")  # type: ignore[arg-type]
    qrels = Qrels.from_file(str(qrels_path), kind="trec")
    run = Run.from_file(str(run_path), kind="trec")
    per_query = evaluate(
        qrels, run, ["recall@5", "ndcg_burges@5", "mrr@10"], return_mean=False, make_comparable=True
    )
    ours = {r["query_id"]: r["metrics"] for r in records if r["kind"] == "answerable"}
    qids = sorted(qrels.qrels)
    assert set(qids) == set(ours)
    for i, q in enumerate(sorted(qrels.qrels)):
        assert per_query["recall@5"][i] == pytest.approx(ours[q]["recall_at_5"], abs=1e-12)
        assert per_query["ndcg_burges@5"][i] == pytest.approx(ours[q]["ndcg_at_5"], abs=1e-12)
        assert per_query["mrr@10"][i] == pytest.approx(ours[q]["mrr_at_10"], abs=1e-12)

    with qrels_path.open() as f:
        tq = pytrec_eval.parse_qrel(f)
    with run_path.open() as f:
        tr = pytrec_eval.parse_run(f)
    res = pytrec_eval.RelevanceEvaluator(tq, {"recall.5"}).evaluate(tr)
    for q, m in res.items():
        assert m["recall_5"] == pytest.approx(ours[q]["recall_at_5"], abs=1e-12)
