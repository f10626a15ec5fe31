"""aggregate's one-pass form (issue 28): every number equal, bit for bit, to the plain definition.

The reference below is the definition :func:`rag_ablate.records.scoring.aggregate` documents, written
the direct way (each split's rows filtered, each metric's values collected, ``np.mean`` of them);
the code reads each record once for all splits and all of a run's slices, and averages without
``np.mean``'s overhead. Random records mix splits, kinds, failures (with None for the metrics
that applied), NaN values, stages and times to first token.
"""

from __future__ import annotations

import math
import struct
from typing import Any, cast

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rag_ablate.dataset.model import SPLITS
from rag_ablate.dataset.weights import TagWeights, effective_n, run_metrics, weighted_mean
from rag_ablate.metrics import stages
from rag_ablate.metrics.registry import spec_of
from rag_ablate.records import scoring
from rag_ablate.records.scoring import _mean, _means, aggregate, aggregate_counted, metric_items
from rag_ablate.records.trace import Record
from rag_ablate.run.slices import slice_metrics

_MIX = TagWeights.from_config({"slice_weights": {"a": 0.5}})  # edge cases weigh 0 (the default edge tag)
_NAMES = ("recall_at_5", "ndcg_at_10", "latency_ms", "token_f1", "context_tokens_at_5")


def _reference(records: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    out: dict[str, float] = {}
    counts: dict[str, dict[str, int]] = {}
    statuses = sorted({str(r["status"]) for r in records if r["status"] != "ok"})
    diagnosed = any(r.get("failure_stage") is not None for r in records)
    for split in (*SPLITS, "all"):
        rows = [r for r in records if split == "all" or r["split"] == split]
        p = f"{split}/"
        out[p + "n_queries"] = float(len(rows))
        for kind in ("answerable", "unanswerable", "no_rag"):
            out[p + f"n_{kind}"] = float(sum(1 for r in rows if r["kind"] == kind))
        failed = sum(1 for r in rows if r["status"] != "ok")
        out[p + "n_failed"] = float(failed)
        out[p + "error_rate"] = failed / len(rows) if rows else 0.0
        for status in statuses:
            n = sum(1 for r in rows if r["status"] == status)
            out[p + f"n_status_{status}"] = float(n)
            out[p + f"error_rate_{status}"] = n / len(rows) if rows else 0.0
        if diagnosed:
            for st_ in stages.STAGES:
                n = sum(1 for r in rows if r.get("failure_stage") == st_)
                out[p + "n_" + stages.stage_metric(st_)] = float(n)
        ttft = [float(r["ttft_ms"]) for r in rows if r.get("ttft_ms") is not None]
        if ttft:
            out[p + "ttft_ms_p50"] = float(np.percentile(ttft, 50))
            out[p + "ttft_ms_p95"] = float(np.percentile(ttft, 95))
        values: dict[str, list[float]] = {}
        misses: dict[str, int] = {}
        for r in rows:
            for name, v in r["metrics"].items():
                if v is not None and not math.isnan(v):
                    values.setdefault(name, []).append(float(v))
                elif v is None and r["status"] != "ok":
                    misses[name] = misses.get(name, 0) + 1
        for name in sorted({*values, *misses}):
            ok = values.get(name, [])
            miss = spec_of(name).miss if name in misses else None
            if miss is None:
                if ok:
                    out[p + name] = float(np.mean(ok))
                continue
            out[p + name] = (sum(ok) + miss * misses[name]) / (len(ok) + misses[name])
            if ok:
                out[p + "ok/" + name] = float(np.mean(ok))
        if values.get("latency_ms"):
            out[p + "latency_ms_p50"] = float(np.percentile(values["latency_ms"], 50))
            out[p + "latency_ms_p95"] = float(np.percentile(values["latency_ms"], 95))
        counts[split] = {name: len(v) for name, v in sorted(values.items())}
    return out, counts


def _bits(d: dict[str, float]) -> list[tuple[str, bytes]]:
    """Keys in order with each value's exact bits (equal numbers, equal order)."""
    return [(k, struct.pack("<d", v)) for k, v in d.items()]


_VALUE = st.one_of(
    st.none(),
    st.just(math.nan),
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([0.0, 1.0, 0.1, 1 / 3]),
)


@st.composite
def _records(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=40))):
        status = draw(st.sampled_from(["ok", "ok", "ok", "timeout", "failed"]))
        names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=len(_NAMES)))
        out.append(
            {
                "query_id": str(i),
                "split": draw(st.sampled_from([*SPLITS, "other"])),
                "kind": draw(st.sampled_from(["answerable", "unanswerable", "no_rag"])),
                "status": status,
                "failure_stage": draw(st.none() | st.sampled_from(stages.STAGES)),
                "ttft_ms": draw(st.none() | st.floats(min_value=0, max_value=1e4)),
                "tags": draw(st.lists(st.sampled_from(["a", "b", "edge"]), max_size=2)),
                "intent_gold": None,
                "intent_gold_l1": None,
                "metrics": {name: draw(_VALUE) for name in names},
            }
        )
    return out


def _row(i: int, split: str, status: str, metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "query_id": str(i), "split": split, "kind": "answerable", "status": status, "failure_stage": None,
        "ttft_ms": None, "tags": [], "intent_gold": None, "intent_gold_l1": None, "metrics": metrics,
    }  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(records=_records())
@example(  # a metric the run has but a split has only for its failed queries (from the run's matrix)
    records=[
        _row(0, "dev", "ok", {"recall_at_5": None, "ndcg_at_10": 0.0}),
        _row(1, "dev", "ok", {}),
        _row(2, "holdout", "timeout", {"ndcg_at_10": None}),
    ]
)
def test_aggregate_equals_its_definition_bit_for_bit(records: list[dict[str, Any]]) -> None:
    expected, counts = _reference(records)
    got, got_counts = aggregate_counted(records)
    assert _bits(got) == _bits(expected)
    assert got_counts == counts
    # a split of many records takes its means from one matrix (_Matrix): the same, here on every split
    small, scoring._MATRIX_ROWS = scoring._MATRIX_ROWS, 1
    try:
        by_matrix, matrix_counts = aggregate_counted(records)
        assert (_bits(by_matrix), matrix_counts) == (_bits(expected), counts)
    finally:
        scoring._MATRIX_ROWS = small
    assert _bits(aggregate(records)) == _bits(expected)
    # each slice is the aggregate of its rows (the slices share each record's values)
    for s in slice_metrics(records).slices:
        rows = [r for r in records if s.key.value in r["tags"]]
        assert (_bits(s.metrics), s.n_values) == (lambda e: (_bits(e[0]), e[1]))(_reference(rows))
    # a slice of every record shares the run's unweighted aggregate when the caller passes it
    shared = slice_metrics(records, whole=aggregate_counted(records))
    assert [(s.key, _bits(s.metrics), s.n_values) for s in shared.slices] == [
        (s.key, _bits(s.metrics), s.n_values) for s in slice_metrics(records).slices
    ]


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(min_value=-1e300, max_value=1e300), min_size=1, max_size=7)
    | st.lists(st.floats(min_value=-1e300, max_value=1e300), min_size=1, max_size=300)
    | st.lists(st.sampled_from([0.0, -0.0, 0.1, 1 / 3, 1e16, -1.0]), min_size=1, max_size=20)
)
def test_the_mean_is_numpys_bit_for_bit(values: list[float]) -> None:
    assert struct.pack("<d", _mean(values)) == struct.pack("<d", float(np.mean(values)))


def _reference_mix(records: list[dict[str, Any]]) -> dict[str, float]:
    """The production mix's weighted and edge means as documented, split by split (no trivial mix here)."""
    out: dict[str, float] = {}
    tags = [[str(t) for t in r["tags"]] for r in records]
    w_all = np.array([_MIX.weight(t) for t in tags])
    edge_all = np.array([_MIX.is_edge(t) for t in tags], dtype=bool)
    for split in (*SPLITS, "all"):
        idx = [i for i, r in enumerate(records) if split == "all" or r["split"] == split]
        w, edge = w_all[idx], edge_all[idx]
        out[f"{split}/prod/n_queries"] = float(np.count_nonzero(w > 0))
        out[f"{split}/prod/n_eff"] = effective_n(w)
        out[f"{split}/edge/n_queries"] = float(np.count_nonzero(edge))
        values: dict[str, list[tuple[float, float, bool]]] = {}
        for j, i in enumerate(idx):
            for name, v in records[i]["metrics"].items():
                if v is not None and math.isfinite(v):
                    values.setdefault(name, []).append((float(v), float(w[j]), bool(edge[j])))
        for name in sorted(values):
            x = np.array([t[0] for t in values[name]])
            wn = np.array([t[1] for t in values[name]])
            en = np.array([t[2] for t in values[name]], dtype=bool)
            if wn.sum() > 0:
                out[f"{split}/prod/{name}"] = weighted_mean(x, wn)
            if en.any():
                out[f"{split}/edge/{name}"] = float(x[en].mean())
    return out


def _tagged(i: int, split: str, tags: list[str], metrics: dict[str, Any]) -> dict[str, Any]:
    return {**_row(i, split, "ok", metrics), "tags": tags}


@settings(max_examples=60, deadline=None)
@given(records=_records())
@example(  # records kept whole in two groups of names, interleaved with records read value by value
    records=[
        _tagged(0, "dev", ["a"], {"recall_at_5": 0.5, "ndcg_at_10": 0.25}),
        _tagged(1, "dev", ["edge"], {"ndcg_at_10": 1 / 3, "recall_at_5": 1.0}),
        _tagged(2, "holdout", [], {"recall_at_5": math.inf, "ndcg_at_10": 0.75}),
        _tagged(3, "holdout", ["a", "edge"], {"recall_at_5": 0.1, "ndcg_at_10": 0.2}),
        _tagged(4, "dev", ["b"], {"recall_at_5": None, "ndcg_at_10": 1, "latency_ms": math.nan}),
        _tagged(5, "holdout", ["edge"], {"ndcg_at_10": 0.5, "recall_at_5": 0.0}),
        _tagged(6, "dev", ["a"], {"recall_at_5": 1e308, "ndcg_at_10": 1e308}),  # a sum that overflows
        _tagged(7, "dev", ["edge"], {}),
    ]
)
def test_the_production_mix_equals_its_definition_bit_for_bit(records: list[dict[str, Any]]) -> None:
    """``<split>/prod/`` and ``<split>/edge/`` means: each metric's values gathered once for all splits
    (records whose values are all finite floats transposed by groups of names, the others value by
    value, merged back in record order), what a metric's records give made once per list of records."""
    got = run_metrics(records, _MIX, (*SPLITS, "all"))
    if got:  # a mix is trivial (nothing returned) when no record has a tag it weighs
        assert _bits(got) == _bits(_reference_mix(records))


@settings(max_examples=100, deadline=None)
@given(
    metrics=st.dictionaries(
        st.sampled_from(_NAMES),
        _VALUE | st.sampled_from([math.inf, -math.inf, 2, True, 1e308]),
    )
)
def test_metric_items_are_the_values_that_are_numbers_as_floats(metrics: dict[str, Any]) -> None:
    """A record's items: every value that is neither None nor NaN, as a float, in order; the names whose
    value is None; one tuple object for the names of every record with the same ones (a record of floats
    only is copied in C: its sum, not NaN, says none is NaN, whatever an infinity or an overflow does)."""
    values, nones, names = metric_items(cast(Record, {"metrics": metrics}))
    expected = {k: float(v) for k, v in metrics.items() if v is not None and v == v}
    assert _bits(values) == _bits(expected) and {type(v) for v in values.values()} <= {float}
    assert nones == [k for k, v in metrics.items() if v is None]
    assert names == tuple(expected) and metric_items(cast(Record, {"metrics": dict(metrics)}))[2] is names


@settings(max_examples=60, deadline=None)
@given(
    columns=st.lists(
        st.lists(st.floats(min_value=-1e300, max_value=1e300), max_size=300)
        | st.lists(st.sampled_from([0.0, -0.0, 0.1, 1 / 3, 1e16, -1.0]), min_size=8, max_size=9),
        max_size=8,
    )
)
def test_the_means_of_many_columns_are_numpys_bit_for_bit(columns: list[list[float]]) -> None:
    """A split's means come from one reduce per column length, over a matrix of columns of that length."""
    named = {f"m{i}": column for i, column in enumerate(columns)}
    got = _means(named)
    assert got.keys() == {name for name, column in named.items() if column}
    for name, mean in got.items():
        assert struct.pack("<d", mean) == struct.pack("<d", float(np.mean(named[name])))


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(st.floats(allow_nan=False), min_size=1, max_size=1100)
    | st.lists(
        st.sampled_from([0.0, -0.0, 0.1, 1 / 3, 5e-324, 1e308, -1e308, math.inf, -math.inf]), min_size=1
    )
    | st.lists(st.floats(), min_size=1, max_size=20)  # NaN: numpy's own answer
)
@example(values=[-0.0])
@example(values=[1.0, math.nan])
@example(values=[1e308, -1e308, 1e308])
def test_p50_p95_are_numpys_percentiles_bit_for_bit(values: list[float]) -> None:
    """A short list's percentiles are interpolated in Python as numpy does: ``np.percentile``'s of the
    pair (50, 95), bit for bit (a NaN's payload and a zero's sign included; which zero numpy's partition
    puts where depends on the percentiles asked for together, so a zero goes to numpy)."""
    with np.errstate(invalid="ignore", over="ignore"):
        expected = np.percentile(np.asarray(values, dtype=np.float64), (50, 95)).tolist()
        got = scoring._p50_p95(values)
    assert [struct.pack("<d", v) for v in got] == [struct.pack("<d", v) for v in expected]
