"""The records as columns (lane cmp33, issue 28 item 2): the comparison's planners read every record
once into :class:`~rag_ablate.compare.columns.VariantColumns`; each column holds exactly what the
record-at-a-time functions give (failed queries, None, NaN, missing names, error-rate shares,
latency from the timings, duplicate ids, records without tags, metadata), and the comparison planned
on shared columns is the comparison planned alone, byte for byte."""

from __future__ import annotations

import gc
import math
from typing import Any

import numpy as np
import pytest

from rag_ablate.compare import run, tradeoff
from rag_ablate.compare.analysis import compare, failed, value
from rag_ablate.compare.columns import VariantColumns
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.slices import compare_slices
from rag_ablate.config.schema import CompareConfig
from rag_ablate.run.slices import slice_keys


def _records(job: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(job)
    recs: list[dict[str, Any]] = []
    for i in range(120):
        status = "error" if i % 17 == 3 else "timeout" if i % 29 == 4 else "ok"
        m: dict[str, Any] = {
            "recall_at_5": float(rng.random() < 0.5 + 0.1 * job),
            "mrr_at_10": float(rng.random()),
        }
        m["latency_ms"] = None if i % 7 == 0 else float(rng.lognormal(3, 0.3))
        if i % 5 == 0:
            m["token_f1"] = None if i % 10 else float(rng.random())
        if i % 11 == 0:
            m["mrr_at_10"] = math.nan
        if i % 13 == 0:
            m["error_rate"] = 0.5
        if i % 19 == 0:
            del m["latency_ms"]
        if status != "ok":
            m = {"recall_at_5": None} if i % 2 else {}
        rec: dict[str, Any] = {
            "query_id": f"q{i}",
            "split": "dev" if i % 4 else "holdout",
            "group": f"g{i // 3}",
            "status": status,
            "query": f"text {i}",
            "intent_gold": "K_a" if i % 2 else None,
            "intent_gold_l1": "KNOWLEDGE",
            "timings_ms": {"total": float(rng.lognormal(3.2, 0.3))},
            "metrics": m,
        }
        if i % 23:
            rec["tags"] = ["edge"] if i % 5 == 0 else ["numeric", "numeric"] if i % 3 == 0 else []
        if i % 8 == 0:
            rec["metadata"] = {"lang": "zh" if i % 16 else 7}
        if i == 9:
            rec["intent_gold"] = 1  # not a string: its slices are read from the record alone
        recs.append(rec)
    recs.append({**recs[5], "metrics": {"recall_at_5": 0.0}})  # the same query again: the last one counts
    if job:
        recs.append(
            {
                "query_id": "own",
                "split": "dev",
                "group": "gx",
                "status": "ok",
                "metrics": {"recall_at_5": 1.0},
            }
        )
    return recs


def _same(got: np.ndarray, want: list[float | None]) -> bool:
    return bool(np.array_equal(got, np.array([math.nan if w is None else w for w in want]), equal_nan=True))


def test_each_column_holds_what_the_record_at_a_time_functions_give() -> None:
    recs = _records(0)
    cols = VariantColumns(recs)
    assert cols.failed.tolist() == [failed(r) for r in recs]
    for m in ("recall_at_5", "mrr_at_10", "token_f1", "latency_ms", "error_rate", "ndcg_at_5"):
        assert _same(cols.value(m), [value(r, m) for r in recs]), m
    for split in ("dev", "holdout", "nope"):
        by_id = {r["query_id"]: r for r in recs if r["split"] == split}
        assert list(cols.by_id(split).items()) == list(by_id.items())
        assert [recs[i] for i in cols.rows(split)] == list(by_id.values())
        rows = cols.rows(split)
        members = cols.members(rows)
        want: dict[Any, list[int]] = {}
        for j, r in enumerate(by_id.values()):
            for key in slice_keys(r):
                want.setdefault(key, []).append(j)
        assert members == want
    assert _same(cols.spent_latency(), [tradeoff._latency(r) for r in recs])
    assert cols.untagged() == sum(1 for r in recs if r.get("tags") is None)
    assert cols.names() == set().union(*(r["metrics"] for r in recs))
    plain = cols.plain(["mrr_at_10", "token_f1"])
    for m, col in plain.items():
        raw = [r["metrics"].get(m) for r in recs]
        assert _same(col, [x if x is not None and math.isfinite(x) else None for x in raw]), m


def test_the_planners_share_one_read_of_each_variant_and_pair_queries_as_the_comparison_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    variants = [
        VariantData(label, _records(job), config={"seed": 1}, info={"role": "baseline"} if not job else {})
        for job, label in enumerate(("baseline", "v"))
    ]
    built: list[int] = []
    collector: list[bool] = []
    original = VariantColumns.__init__

    def counted(self: VariantColumns, records: Any) -> None:
        built.append(id(records))
        collector.append(gc.isenabled())
        original(self, records)

    monkeypatch.setattr(VariantColumns, "__init__", counted)
    settings = CompareConfig(B=200, min_slice_groups=2, slice_metrics=["recall_at_5", "error_rate"])
    together = run.statistics(variants, settings, seed=3)
    assert sorted(built) == sorted(id(v.records) for v in variants)  # each variant read once
    # planned with the cyclic collector paused (at 1M queries its collections were a third of
    # planning), and on again after
    assert collector == [False, False] and gc.isenabled()
    alone = compare(variants, B=200, seed=3)
    assert together.pairs == alone.pairs and together.pairs[0].n_failed_baseline > 0
    for got, want in zip(together.rows, alone.rows, strict=True):
        assert (got.metric, got.note, got.n_queries) == (want.metric, want.note, want.n_queries)
        assert np.array_equal(
            [got.baseline_mean, got.effect], [want.baseline_mean, want.effect], equal_nan=True
        )
    slices = compare_slices(variants, alone, metrics=["recall_at_5", "error_rate"], min_groups=2)
    assert together.slices is not None
    assert [(r.name, r.n_slice, r.n_queries, r.n_groups) for r in together.slices.rows] == [
        (r.name, r.n_slice, r.n_queries, r.n_groups) for r in slices.rows
    ]


def test_columns_let_go_after_planning_are_read_again_when_asked_for() -> None:
    recs = _records(1)
    cols = VariantColumns(recs)
    want = cols.value("recall_at_5").copy()
    names = cols.names()
    by_id = cols.by_id("dev")
    cols.release()
    assert cols.by_id("dev") is by_id and cols.names() == names  # kept for the comparison's end
    assert _same(cols.value("recall_at_5"), want.tolist())
    assert cols.untagged() == sum(1 for r in recs if "tags" not in r) == 7


def test_integer_group_codes_factorise_as_np_unique_numbers_them() -> None:
    from rag_ablate.compare.stats import _factorise

    rng = np.random.default_rng(2)
    for n, high in ((1, 1), (50, 3), (500, 500), (500, 5000)):
        g = rng.integers(0, high, n)
        want = np.unique(g, return_inverse=True)[1]
        for dtype in (np.int64, np.int32, np.uint16):
            codes, k = _factorise(g.astype(dtype), n)
            assert codes.dtype == np.int64 and np.array_equal(codes, want) and k == int(want.max()) + 1
