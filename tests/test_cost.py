"""Cost per variant: percentiles against numpy, cost math against a hand-computed example,
the p95 difference's group-bootstrap interval against a brute-force resampling and scipy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import VariantData
from rag_ablate.config.schema import CostConfig, ModelPrice, RunConfig
from rag_ablate.core.errors import ConfigError
from rag_ablate.run.cost import (
    cache_hit_rates,
    cost_metrics,
    final_context_tokens,
    percentile,
    run_cost_metrics,
)
from rag_ablate.settings import validate


def _rec(
    qid: str,
    split: str,
    total: float,
    *,
    status: str = "ok",
    stages: dict[str, float] | None = None,
    usage: dict[str, int] | None = None,
    ttft: float | None = None,
    ctx: dict[int, float] | None = None,
    n_retrieved: int = 0,
    group: str | None = None,
) -> dict[str, Any]:
    return {
        "query_id": qid,
        "split": split,
        "group": group or qid,
        "status": status,
        "timings_ms": {"total": total, **(stages or {})},
        "usage": usage,
        "ttft_ms": ttft,
        "retrieved": [{}] * n_retrieved,
        "metrics": {
            "latency_ms": total,
            **{f"context_tokens_at_{k}": v for k, v in (ctx or {}).items()},
        },
    }


# --------------------------------------------------------------------------- percentiles


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(0, 100))
@settings(max_examples=200, deadline=None)
def test_percentile_is_numpys(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-9)


def test_percentile_on_known_data() -> None:
    # [10, 20, 30, 40]: p50 sits at position 1.5 -> 25; p95 at 2.85 -> 30 + 0.85 * 10 = 38.5
    assert percentile([40, 10, 30, 20], 50) == 25.0
    assert percentile([40, 10, 30, 20], 95) == pytest.approx(38.5)
    assert np.isnan(percentile([], 95))


@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=12),
    st.data(),
    st.sampled_from([0.0, 5.0, 50.0, 95.0, 99.0, 100.0]),
)
@settings(max_examples=150, deadline=None)
def test_weighted_percentiles_equal_repeating_the_sample(values: list[float], data: Any, q: float) -> None:
    x = np.sort(np.array(values))
    weights = np.array(
        [data.draw(st.lists(st.integers(0, 4), min_size=len(x), max_size=len(x))) for _ in range(3)]
    )
    weights[:, 0] += 1  # a row needs some weight
    got = stats.weighted_percentiles(x, weights, q)
    want = [np.percentile(np.repeat(x, w), q) for w in weights]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


# --------------------------------------------------------------------------- cost math


def _example() -> list[dict[str, Any]]:
    """Four dev queries (one failed after 40 ms) and one holdout query."""
    return [
        _rec("a", "dev", 10, stages={"route": 1, "bm25": 4}, usage={"prompt_tokens": 1000,
             "completion_tokens": 200}, ttft=5, ctx={5: 50, 10: 90}, n_retrieved=10),
        _rec("b", "dev", 20, stages={"route": 3, "bm25": 8}, usage={"prompt_tokens": 3000,
             "completion_tokens": 400, "embedding_tokens": 10}, ttft=7, ctx={5: 60, 10: 100}, n_retrieved=4),
        _rec("c", "dev", 30, stages={"route": 2}, ctx={5: 70, 10: 120}, n_retrieved=12),
        _rec("d", "dev", 40, status="failed", usage={"prompt_tokens": 500}),
        _rec("e", "holdout", 100, stages={"route": 5, "bm25": 50}, ctx={5: 10}, n_retrieved=3),
    ]  # fmt: skip


def test_cost_metrics_hand_computed() -> None:
    price = ModelPrice(prompt=2.0, completion=10.0, embedding=0.5)  # USD per 1M tokens
    m = cost_metrics(_example(), "dev", price=price)
    # end to end, the failed query included with its 40 ms: [10, 20, 30, 40]
    assert m["latency_p50_ms"] == 25.0 and m["latency_p95_ms"] == pytest.approx(38.5)
    # stages over the queries that timed them: route [1, 3, 2] -> p50 2, p95 2.9; bm25 [4, 8] -> 6, 7.8
    assert m["route_p50_ms"] == 2.0 and m["route_p95_ms"] == pytest.approx(2.9)
    assert m["bm25_p50_ms"] == 6.0 and m["bm25_p95_ms"] == pytest.approx(7.8)
    assert m["ttft_p50_ms"] == 6.0 and m["ttft_p95_ms"] == pytest.approx(6.9)
    # final list: a -> 10 chunks, at_10 = 90; b -> 4 chunks, at_5 covers it = 60;
    # c -> 12 chunks, longer than every cutoff: the largest, at_10 = 120
    assert m["context_tokens"] == pytest.approx((90 + 60 + 120) / 3)
    # tokens per query over the queries reporting them
    assert m["prompt_tokens"] == pytest.approx((1000 + 3000 + 500) / 3)
    assert m["completion_tokens"] == pytest.approx(300.0)
    assert m["embedding_tokens"] == 10.0
    # money over all 4 queries: a 1000*2 + 200*10 = 4000; b 6000 + 4000 + 5 = 10005; c 0; d 1000
    per_query = (4000 + 10005 + 0 + 1000) / 1e6 / 4
    assert m["usd_per_query"] == pytest.approx(per_query)
    assert m["usd_per_1k"] == pytest.approx(per_query * 1000)


def test_money_is_absent_without_a_price_or_without_tokens() -> None:
    recs = _example()
    assert "usd_per_1k" not in cost_metrics(recs)
    local = [r for r in recs if r["usage"] is None]  # the offline pipeline reports no tokens
    m = cost_metrics(local, price=ModelPrice(prompt=1.0))
    assert "usd_per_1k" not in m and "prompt_tokens" not in m and "ttft_p95_ms" not in m


def test_run_cost_metrics_prefixes_all_and_each_split() -> None:
    m = run_cost_metrics(_example(), ["dev", "holdout"])
    assert m["cost/latency_p50_ms"] == 30.0  # [10, 20, 30, 40, 100]
    assert m["dev/cost/latency_p50_ms"] == 25.0
    assert m["holdout/cost/latency_p95_ms"] == 100.0 and m["holdout/cost/context_tokens"] == 10.0


def test_final_context_tokens_needs_a_retrieval() -> None:
    assert final_context_tokens(_rec("x", "dev", 1)) is None
    assert final_context_tokens(_rec("x", "dev", 1, ctx={1: 5, 3: 9}, n_retrieved=2)) == 9


def test_cache_hit_rates() -> None:
    m = cache_hit_rates(
        {
            "run/cache_bm25_hits": 3.0,
            "run/cache_bm25_misses": 1.0,
            "run/cache_chunks_hits": 0.0,
            "run/cache_chunks_misses": 4.0,
            "run/cache_dense_hits": 0.0,
            "run/cache_dense_misses": 0.0,
            "run/cache_bm25_build_seconds": 2.0,
        }
    )
    want = {"run/cache_bm25_hit_rate": 0.75, "run/cache_chunks_hit_rate": 0.0, "run/cache_hit_rate": 3 / 8}
    assert m == want


def test_unknown_priced_model_lists_the_known_ones() -> None:
    s = RunConfig(cost=CostConfig(model="gpt-x", prices={"my-llm": ModelPrice(1.0, 2.0)}))
    with pytest.raises(ConfigError, match=r"cost\.model 'gpt-x'.*known: my-llm"):
        validate(s)


# --------------------------------------------------------------------------- p95 differences


def _latency_pairs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.lognormal(3.0, 0.5, n)
    return b, b * 1.2 + rng.normal(0, 2, n)


def test_quantile_interval_equals_brute_force_group_resampling() -> None:
    b, v = _latency_pairs(36, 7)
    groups = np.array([f"g{i // 3}" for i in range(36)])  # 12 groups of 3
    counts = list(stats.bootstrap_counts(12, 400, np.random.default_rng(11)))
    res = stats.paired_quantile_test(b, v, groups, 95, counts=counts)
    codes = np.unique(groups, return_inverse=True)[1]
    brute = np.array(
        [
            np.percentile(np.repeat(v, c[codes]), 95) - np.percentile(np.repeat(b, c[codes]), 95)
            for c in np.concatenate(counts)
        ]
    )
    assert res.effect == pytest.approx(np.percentile(v, 95) - np.percentile(b, 95))
    assert res.ci_low == pytest.approx(np.percentile(brute, 2.5))
    assert res.ci_high == pytest.approx(np.percentile(brute, 97.5))
    assert res.se == pytest.approx(np.std(brute, ddof=1))
    far = min(np.sum(brute <= 0), np.sum(brute >= 0))
    assert res.p_value == pytest.approx(min(1.0, 2 * (1 + far) / (len(brute) + 1)))
    assert res.n_groups == 12 and res.bootstrap_unreliable


def test_quantile_interval_matches_scipy_with_singleton_groups() -> None:
    b, v = _latency_pairs(50, 3)
    res = stats.paired_quantile_test(b, v, np.arange(50), 95, B=2000, seed=5)
    ref = sps.bootstrap(
        (b, v),
        lambda x, y: np.percentile(y, 95) - np.percentile(x, 95),
        paired=True,
        vectorized=False,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(5),
    )
    assert res.ci_low == pytest.approx(ref.confidence_interval.low, rel=1e-9)
    assert res.ci_high == pytest.approx(ref.confidence_interval.high, rel=1e-9)


def test_comparison_has_p95_rows_from_the_shared_draw() -> None:
    n = 40
    b, v = _latency_pairs(n, 1)
    v[5] = 5000.0  # one slow query in the variant, failed: left out (latency pairs ok queries only)

    def records(lat: np.ndarray, failed: int | None) -> list[dict[str, Any]]:
        return [
            _rec(f"q{i}", "dev", float(x), status="failed" if i == failed else "ok", group=f"g{i // 2}")
            for i, x in enumerate(lat)
        ]

    c = compare(
        [VariantData("baseline", records(b, None)), VariantData("slow", records(v, 5))],
        metrics=["latency_ms", "latency_p50_ms", "latency_p95_ms"],
        splits=["dev"],
        B=500,
    )
    row = c.row("dev", "slow", "latency_p95_ms")
    ok = np.arange(n) != 5
    assert row is not None and row.tested and row.n_queries == n - 1 and row.n_groups == 20
    assert row.baseline_mean == pytest.approx(np.percentile(b[ok], 95))
    assert row.variant_mean == pytest.approx(np.percentile(v[ok], 95))
    assert row.effect == pytest.approx(np.percentile(v[ok], 95) - np.percentile(b[ok], 95))
    assert row.ci_low <= row.effect <= row.ci_high and row.direction == "lower"
    assert row.adjustment == "bh"  # adjusted with the split's other tests
    p50 = c.row("dev", "slow", "latency_p50_ms")
    assert p50 is not None
    assert p50.effect == pytest.approx(np.percentile(v[ok], 50) - np.percentile(b[ok], 50))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["dev", "holdout"]),
            st.floats(0, 1e5),
            st.none() | st.floats(0, 50),
            st.dictionaries(st.sampled_from([1, 3, 5, 10]), st.floats(0, 5000), max_size=4),
            st.integers(0, 12),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_run_cost_metrics_are_each_records_values_by_definition(
    rows: list[tuple[str, float, float | None, dict[int, float], int]],
) -> None:
    """The run's and each split's cost metrics (read once for all of them, the percentiles of a list
    from one numpy call) are each metric's definition over the split's records, bit for bit."""
    recs = [
        _rec(f"q{i}", split, total, stages={"bm25": total / 3}, ctx=ctx, n_retrieved=n)
        for i, (split, total, _, ctx, n) in enumerate(rows)
    ]
    for rec, (*_, route, _, _) in zip(recs, rows, strict=True):
        if route is not None:
            rec["timings_ms"]["route"] = route
    got = run_cost_metrics(recs, ("dev", "holdout"))
    for prefix, split in (("cost/", None), ("dev/cost/", "dev"), ("holdout/cost/", "holdout")):
        mine = [r for r in recs if split is None or r["split"] == split]
        expected: dict[str, float] = {}
        for name, key in (("latency", "total"), ("bm25", "bm25"), ("route", "route")):
            values = [r["timings_ms"][key] for r in mine if key in r["timings_ms"]]
            if values:
                expected.update({f"{name}_p{q}_ms": percentile(values, q) for q in (50, 95)})
        ctx = [v for r in mine if (v := final_context_tokens(r)) is not None]
        if ctx:
            expected["context_tokens"] = float(np.mean(ctx))
        got_split = {k.removeprefix(prefix): v for k, v in got.items() if k.startswith(prefix)}
        if split is None:
            got_split = {k: v for k, v in got_split.items() if "/" not in k}
        assert {k: v.hex() for k, v in got_split.items()} == {k: v.hex() for k, v in expected.items()}


@settings(max_examples=200, deadline=None)
@given(
    values=st.dictionaries(st.sampled_from([1, 3, 5, 10, 20]), st.none() | st.floats(0, 5000), max_size=5),
    n=st.integers(0, 25),
)
def test_final_context_tokens_is_the_first_covering_k_else_the_last_k_with_a_value(
    values: dict[int, float | None], n: int
) -> None:
    """The value at the first k (ascending) with a value that covers the n retrieved chunks, else at
    the last k with a value below n (the cutoffs looked up from the first covering one, then back)."""
    rec = {"metrics": {f"context_tokens_at_{k}": v for k, v in values.items()}, "retrieved": [{}] * n}
    expected, last = None, None
    for k in sorted(values):
        v = values[k]
        if v is not None:
            if k >= n:
                expected = float(v)
                break
            last = v
    else:
        expected = None if last is None else float(last)
    got = final_context_tokens(rec)  # type: ignore[arg-type]
    assert (got is None and expected is None) or (
        got is not None and expected is not None and got.hex() == expected.hex()
    )
