"""The comparison step on hand-made sweeps: effects, adjustment, flips, flags, gate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import compare, delta_metrics
from rag_ablate.compare.gate import gate
from rag_ablate.compare.guard import changed_factors, confounded_variants
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal, write_outputs
from rag_ablate.compare.run import load_comparison, run_comparison
from rag_ablate.core.errors import ComparisonError, UnknownNameError
from tests.conftest import rag_ablate_cli


def _records(values: dict[str, list[float]], splits: list[str], groups: list[str]) -> list[dict[str, Any]]:
    n = len(splits)
    return [
        {
            "query_id": f"q{i}",
            "query": f"question {i}",
            "split": splits[i],
            "group": groups[i],
            "kind": "answerable",
            "status": "ok",
            "metrics": {m: v[i] for m, v in values.items()},
        }
        for i in range(n)
    ]


def _sweep(seed: int = 0, n: int = 120) -> tuple[list[VariantData], list[str], list[str]]:
    rng = np.random.default_rng(seed)
    splits = ["dev" if i % 3 else "holdout" for i in range(n)]
    groups = [f"g{i // 2}" for i in range(n)]  # pairs of near-duplicates, same split? enforce below
    splits = [splits[2 * (i // 2)] for i in range(n)]
    base_hit = rng.integers(0, 2, n).astype(float)
    better_hit = np.maximum(base_hit, (rng.random(n) < 0.5).astype(float))  # only fixes, never breaks
    base_lat = rng.uniform(10, 20, n)
    variants = [
        VariantData(
            "baseline",
            _records({"hit_at_5": list(base_hit), "latency_ms": list(base_lat)}, splits, groups),
            info={"role": "baseline"},
        ),
        VariantData(
            "better",
            _records({"hit_at_5": list(better_hit), "latency_ms": list(base_lat + 5)}, splits, groups),
        ),
        VariantData(
            "same", _records({"hit_at_5": list(base_hit), "latency_ms": list(base_lat)}, splits, groups)
        ),
    ]
    return variants, splits, groups


def test_effects_and_adjustment() -> None:
    variants, splits, groups = _sweep()
    c = compare(variants, metrics=["hit_at_5", "latency_ms"], B=2000, seed=1)
    assert c.baseline == "baseline" and c.variants == ["better", "same"]
    assert len(c.rows) == 2 * 2 * 2
    for split in ("dev", "holdout"):
        idx = [i for i, s in enumerate(splits) if s == split]
        base = np.array([variants[0].records[i]["metrics"]["hit_at_5"] for i in idx])
        var = np.array([variants[1].records[i]["metrics"]["hit_at_5"] for i in idx])
        r = c.row(split, "better", "hit_at_5")
        assert r is not None
        assert r.effect == pytest.approx(var.mean() - base.mean(), abs=1e-12)
        assert r.n_queries == len(idx) and r.n_groups == len({groups[i] for i in idx})
        assert r.ci_low <= r.effect <= r.ci_high
        same = c.row(split, "same", "hit_at_5")
        assert same is not None and same.effect == 0 and same.p_value == 1 and not same.significant
    # Holm on holdout, BH on dev, each over variants x metrics of one family: latency apart
    for split, fn in (("holdout", stats.holm), ("dev", stats.benjamini_hochberg)):
        for family, metric in (("main", "hit_at_5"), ("timing", "latency_ms")):
            fam = [r for r in c.rows if r.split == split and r.metric == metric]
            assert len(fam) == 2 and {r.family for r in fam} == {family}
            assert [r.p_adjusted for r in fam] == pytest.approx(list(fn([r.p_value for r in fam])))
            assert {r.adjustment for r in fam} == {"holm" if split == "holdout" else "bh"}
    # direction: hits up is better, latency up is worse
    assert c.row("dev", "better", "hit_at_5").verdict == "better"  # type: ignore[union-attr]
    assert c.row("dev", "better", "latency_ms").verdict == "worse"  # type: ignore[union-attr]


def test_timing_noise_does_not_move_quality_rows() -> None:
    """A rerun's latencies differ (the clock); the quality rows keep every number, adjusted p too."""
    variants, _, _ = _sweep()
    metrics = ["hit_at_5", "latency_ms", "latency_p95_ms"]
    first = compare(variants, metrics=metrics, B=500, seed=2)
    rng = np.random.default_rng(7)
    rerun = [
        VariantData(
            v.label,
            [
                {
                    **r,
                    "metrics": {
                        **r["metrics"],
                        "latency_ms": r["metrics"]["latency_ms"] * rng.uniform(0.2, 5),
                    },
                }
                for r in v.records
            ],
            info=v.info,
        )
        for v in variants
    ]
    second = compare(rerun, metrics=metrics, B=500, seed=2)
    quality = [(r.split, r.variant) for r in first.rows if r.metric == "hit_at_5"]
    assert len(quality) == 4
    for split, variant in quality:
        a, b = first.row(split, variant, "hit_at_5"), second.row(split, variant, "hit_at_5")
        assert a is not None and b is not None and a.family == "main"
        assert (a.p_value, a.p_adjusted, a.ci_low, a.ci_high) == (
            b.p_value,
            b.p_adjusted,
            b.ci_low,
            b.ci_high,
        )
    # the latency rows did move, and were adjusted among themselves
    moved = [
        r.metric
        for r in second.rows
        if r.family == "timing" and r.p_value != first.row(r.split, r.variant, r.metric).p_value  # type: ignore[union-attr]
    ]
    assert moved


def test_rerun_gives_identical_numbers() -> None:
    variants, _, _ = _sweep()
    a = compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=3).to_dict()
    b = compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=3).to_dict()
    assert a == b
    c = compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=4).to_dict()
    # another seed draws other bootstrap resamples (the test-inverted CI may coincide: it snaps to data)
    assert [r["se"] for r in a["rows"]] != [r["se"] for r in c["rows"]]
    assert [r["boot_ci_low"] for r in a["rows"]] != [r["boot_ci_low"] for r in c["rows"]]


def test_metric_names_as_typed_in_tables_are_accepted() -> None:
    """``--metrics hit@5`` (the terminal spelling) compares the same values as ``hit_at_5``."""
    variants, _, _ = _sweep()
    typed = compare(variants, metrics=["hit@5"], B=500, seed=2).to_dict()
    canonical = compare(variants, metrics=["hit_at_5"], B=500, seed=2).to_dict()
    assert typed["metrics"] == ["hit_at_5"]
    assert typed["rows"] == canonical["rows"] and len(typed["rows"]) == 4
    assert all(r["n_queries"] > 0 for r in typed["rows"])


def test_flips_list_the_queries_that_changed() -> None:
    variants, _, _ = _sweep()
    c = compare(variants, metrics=["hit_at_5", "latency_ms"], B=500)
    fl = c.flips["better"]["hit_at_5"]["dev"]
    expected = {
        r0["query_id"]
        for r0, r1 in zip(variants[0].records, variants[1].records, strict=True)
        if r0["split"] == "dev" and r0["metrics"]["hit_at_5"] == 0 and r1["metrics"]["hit_at_5"] == 1
    }
    assert {f.query_id for f in fl["improved"]} == expected and fl["regressed"] == []
    assert all(f.query.startswith("question") for f in fl["improved"])
    # latency +5 ms on 10-20 ms is a > 20% relative change for most queries: listed as regressions
    lat = c.flips["better"]["latency_ms"]["dev"]
    assert lat["improved"] == [] and len(lat["regressed"]) > 0


def test_disagreement_flag() -> None:
    n = 200
    splits = ["dev"] * 100 + ["holdout"] * 100
    groups = [f"g{i}" for i in range(n)]
    base = [0.0] * n
    var = [1.0 if i < 60 else 0.0 for i in range(n)]  # big gain on dev, nothing on holdout
    vs = [
        VariantData("baseline", _records({"hit_at_5": base}, splits, groups)),
        VariantData("v", _records({"hit_at_5": var}, splits, groups)),
    ]
    c = compare(vs, metrics=["hit_at_5"], B=1000)
    assert c.row("dev", "v", "hit_at_5").verdict == "better"  # type: ignore[union-attr]
    assert c.row("holdout", "v", "hit_at_5").flag == "better on dev only"  # type: ignore[union-attr]
    assert "better on dev only" in format_terminal(c)
    assert "failed queries: none; no query left out of any pair" in format_terminal(c)


def test_gate() -> None:
    n = 200
    splits = ["dev"] * 100 + ["holdout"] * 100
    groups = [f"g{i}" for i in range(n)]
    base = [1.0] * n
    worse = [0.0 if i % 10 == 0 else 1.0 for i in range(n)]  # -0.10 everywhere
    vs = [
        VariantData("baseline", _records({"recall_at_5": base}, splits, groups)),
        VariantData("worse", _records({"recall_at_5": worse}, splits, groups)),
    ]
    c = compare(vs, metrics=["recall_at_5"], B=2000)
    failures = gate(c, ["holdout/recall_at_5:-0.02"])
    assert len(failures) == 1 and failures[0].startswith(
        "BLOCK worse holdout/recall_at_5:-0.02: effect -0.1 ["
    )
    assert gate(c, ["holdout/recall_at_5:-0.2"]) == []  # within the margin
    assert gate(c, ["holdout/recall@5:-0.02"])  # display spelling accepted
    with pytest.raises(ComparisonError, match="expected SPLIT/METRIC:MARGIN"):
        gate(c, ["recall_at_5 below 2%"])
    with pytest.raises(ComparisonError, match="is not compared"):
        gate(c, ["holdout/ndcg_at_10:-0.02"])


def test_point_gate_blocks_a_drop_beyond_the_margin_even_when_not_significant() -> None:
    """The team's rule is "a drop of more than 2 points blocks", whatever the p; the old gate passed it."""
    splits = ["holdout"] * 6
    groups = [f"g{i}" for i in range(6)]
    vs = [
        VariantData("baseline", _records({"recall_at_5": [1, 1, 1, 1, 1, 1]}, splits, groups)),
        VariantData("v", _records({"recall_at_5": [0, 1, 1, 1, 1, 1]}, splits, groups)),
    ]
    c = compare(vs, metrics=["recall_at_5"], splits=["holdout"], B=1000)
    r = c.row("holdout", "v", "recall_at_5")
    assert r is not None and r.effect < -0.02 and not r.significant
    assert len(gate(c, ["holdout/recall_at_5:-0.02"])) == 1
    assert gate(c, ["holdout/recall_at_5:-0.2"]) == []


def test_unknown_metric_and_baseline() -> None:
    variants, _, _ = _sweep(n=20)
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        compare(variants, metrics=["recal_at_5"])
    with pytest.raises(ComparisonError, match="variants: baseline, better, same"):
        compare(variants, baseline="nope", metrics=["hit_at_5"])


def test_outputs_have_the_documented_columns(tmp_path: Path) -> None:
    variants, _, _ = _sweep()
    c = compare(variants, metrics=["hit_at_5"], B=500)
    paths = write_outputs(c, tmp_path)
    data = json.loads(paths[0].read_text())
    need = {
        "split",
        "variant",
        "metric",
        "baseline_mean",
        "variant_mean",
        "effect",
        "ci_low",
        "ci_high",
        "p_value",
        "p_adjusted",
        "n_queries",
        "n_groups",
        "se",
        "boot_ci_low",
        "boot_ci_high",
        "n_failed_baseline",
        "n_failed_variant",
    }
    assert data["rows"] and all(need <= set(r) for r in data["rows"])
    assert {p["split"] for p in data["pairs"]} == {"dev", "holdout"}
    assert all(p["n_failed_baseline"] == p["n_failed_variant"] == p["n_left_out"] == 0 for p in data["pairs"])
    md = paths[1].read_text()
    assert "| better | hit@5 |" in md and "Per-query flips" in md
    row = c.row("holdout", "better", "hit_at_5")
    assert row is not None and delta_metrics(c, "better")["delta/holdout/hit_at_5"] == row.effect


def test_guard_names_changed_factors() -> None:
    base = {
        "chunk": {"size": 512, "overlap": 64},
        "retrieval": {"method": "bm25", "top_k": 10},
        "paths": {"output_root": "a"},
        "seed": 0,
    }
    one = {**base, "chunk": {"size": 256, "overlap": 32}, "paths": {"output_root": "b"}}
    two = {**one, "retrieval": {"method": "bm25", "top_k": 20}}
    bc, oc = {"chunk": "512", "retrieval": "bm25"}, {"chunk": "256", "retrieval": "bm25"}
    assert changed_factors(base, one, bc, oc) == ["chunk"]  # a group choice counts once; paths ignored
    assert changed_factors(base, two, bc, oc) == ["chunk", "retrieval.top_k"]
    vs = [
        VariantData("baseline", [], config=base, info={"choices": bc}),
        VariantData("chunk=256", [], config=one, info={"choices": oc}),
        VariantData("chunk=256,retrieval.top_k=20", [], config=two, info={"choices": oc}),
    ]
    assert confounded_variants(vs, "baseline") == {
        "chunk=256,retrieval.top_k=20": ["chunk", "retrieval.top_k"]
    }


# --------------------------------------------------------------------------- failed queries (never vanish)


def _fail(records: list[dict[str, Any]], ids: set[str], latency: float | None = None) -> None:
    """Mark queries failed as the runner records them: no quality values, the time until failure."""
    for r in records:
        if r["query_id"] in ids:
            r["status"] = "failed"
            r["error"] = "TimeoutError: simulated"
            r["metrics"] = {} if latency is None else {"latency_ms": latency}


def _holdout12(recall_var: list[float]) -> list[VariantData]:
    """12 holdout queries, one group each (2**12 <= B: exact sign-flip p), recall and latency."""
    splits, groups = ["holdout"] * 12, [f"g{i}" for i in range(12)]
    base = [1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.5, 1.0]
    lat = [10.0] * 12
    return [
        VariantData("baseline", _records({"recall_at_5": base, "latency_ms": lat}, splits, groups)),
        VariantData("v", _records({"recall_at_5": recall_var, "latency_ms": lat}, splits, groups)),
    ]


def test_failed_queries_are_counted_compared_and_named() -> None:
    variants = _holdout12([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0])
    _fail(variants[1].records, {"q0", "q1", "q2", "q3"}, latency=5000.0)  # four timeouts in the variant
    _fail(variants[0].records, {"q11"}, latency=10.0)  # one failure in the baseline
    c = compare(variants, metrics=["recall_at_5", "error_rate", "latency_ms"], splits=["holdout"], B=5000)

    pair = c.pair("holdout", "v")
    assert pair is not None
    assert (pair.n_failed_baseline, pair.n_failed_variant) == (1, 4)
    assert (pair.left_failed_baseline, pair.left_failed_variant, pair.n_ok_both) == (1, 4, 7)

    # failure-aware recall over all 12: a query failed on one side scores 0 there (the other side
    # has a value, so it applied); the 4 variant failures cancel what it gains on the rest
    recall = c.row("holdout", "v", "recall_at_5")
    assert recall is not None and recall.n_queries == 12
    assert recall.baseline_mean == pytest.approx((1 + 0.5 + 0 + 1 + 1 + 0 + 0.5 + 1 + 0 + 1 + 0.5 + 0) / 12)
    assert recall.variant_mean == pytest.approx((0 + 0 + 0 + 0 + 1 + 0 + 0.5 + 1 + 1 + 1 + 1 + 1) / 12)
    assert recall.effect == pytest.approx(0.0) and recall.verdict == ""
    # the ok-only figures beside it: the 7 queries ok on both sides (q4..q10), where it gains
    assert recall.n_ok_queries == 7
    assert recall.ok_baseline_mean == pytest.approx((1 + 0 + 0.5 + 1 + 0 + 1 + 0.5) / 7)
    assert recall.ok_variant_mean == pytest.approx((1 + 0 + 0.5 + 1 + 1 + 1 + 1) / 7)
    assert recall.ok_effect == pytest.approx(1.5 / 7)
    assert (recall.n_failed_baseline, recall.n_failed_variant) == (1, 4)

    # error_rate: 0/1 per query, all 12 queries; 4 fail only in the variant, 1 only in the baseline
    err = c.row("holdout", "v", "error_rate")
    assert err is not None and err.direction == "lower" and err.n_queries == 12
    assert err.baseline_mean == pytest.approx(1 / 12) and err.variant_mean == pytest.approx(4 / 12)
    assert err.effect == pytest.approx(3 / 12)
    # exact sign-flip p by hand: group sums +1 (x4), -1 (x1), 0 (x7), T = 3; with a = the four +1 groups'
    # signed sum, |T*| = |a - e| >= 3 for a = +-4 (any e: 2 * 2 vectors) and a = +-2 with e against a
    # (4 + 4 vectors): 12 of the 2**5 sign patterns
    assert err.p_exact and err.p_value == pytest.approx(12 / 32)
    assert err.ci_low <= err.effect <= err.ci_high

    # latency: the 7 queries ok on both sides; the failures' own time is reported apart
    lat = c.row("holdout", "v", "latency_ms")
    assert lat is not None and lat.n_queries == 7 and lat.effect == 0.0
    assert (pair.failed_latency_ms_baseline, pair.failed_latency_ms_variant) == (10.0, 5000.0)

    text = format_terminal(c)
    assert "holdout, v: failed 1/12 in baseline, 4/12 in variant" in text
    assert "left out 5 (1 failed in baseline, 4 failed in variant)" in text
    md = format_markdown(c)
    assert "| holdout | v | 12 | 1/12 | 4/12 | 7 | 5 (1 failed in baseline, 4 failed in variant) |" in md


def test_error_rate_is_compared_by_default() -> None:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.metrics.registry import REGISTRY, default_compare_metrics
    from rag_ablate.settings import fill_metric_defaults

    assert "error_rate" in default_compare_metrics()
    s = RunConfig()
    assert s.compare.metrics == []  # the schema's default: the registry's set, filled in when composed
    fill_metric_defaults(s)
    assert s.compare.metrics == default_compare_metrics() and "error_rate" in s.compare.metrics
    spec = REGISTRY["error_rate"]
    assert spec.direction == "lower" and spec.binary and not spec.takes_k


def test_a_variant_whose_queries_all_failed_shows_rows_that_say_so() -> None:
    variants = _holdout12([1.0] * 12)
    _fail(variants[1].records, {f"q{i}" for i in range(12)}, latency=30000.0)
    c = compare(variants, metrics=["recall_at_5", "error_rate", "latency_ms"], splits=["holdout"], B=5000)
    recall = c.row("holdout", "v", "recall_at_5")
    assert recall is not None and not recall.tested and recall.note == "all 12 failed in variant"
    assert not recall.significant and recall.verdict == ""
    err = c.row("holdout", "v", "error_rate")
    assert err is not None and err.effect == 1.0 and err.verdict == "worse"
    assert err.p_value == pytest.approx(2 / 2**12)  # exact: all 12 groups must share a sign
    text = format_terminal(c)
    assert "all 12 failed in variant" in text
    data = c.to_dict()
    row = next(r for r in data["rows"] if r["metric"] == "recall_at_5")
    assert row["effect"] is None and row["note"] == "all 12 failed in variant"  # JSON has no NaN
    # a gate on the untestable metric fails: a broken variant does not pass by producing no numbers
    failures = gate(c, ["holdout/recall_at_5:-0.02"])
    assert len(failures) == 1 and "could not be tested (all 12 failed in variant)" in failures[0]
    # latency runs over queries ok on both sides: none here
    assert c.row("holdout", "v", "latency_ms").note == "all 12 failed in variant"  # type: ignore[union-attr]
    # MLflow gets the effects that exist; an untestable metric logs nothing rather than NaN
    assert set(delta_metrics(c, "v")) == {"delta/holdout/error_rate", "p_adj/holdout/error_rate"}


def test_failed_in_both_and_missing_records_are_counted_apart() -> None:
    variants = _holdout12([1.0] * 12)
    _fail(variants[0].records, {"q0", "q1"})
    _fail(variants[1].records, {"q1"})
    variants[1].records = [r for r in variants[1].records if r["query_id"] != "q2"]  # no record
    c = compare(variants, metrics=["recall_at_5", "error_rate"], splits=["holdout"], B=5000)
    pair = c.pair("holdout", "v")
    assert pair is not None
    assert pair.left_out_text() == "3 (1 failed in baseline, 1 failed in both, 1 no record on one side)"
    # recall: q0 failed in the baseline only scores 0 there; q1 (failed in both, applicability
    # unknown) and q2 (no record) are left out
    assert c.row("holdout", "v", "recall_at_5").n_queries == 10  # type: ignore[union-attr]
    # error_rate runs over the queries with a record on both sides
    assert c.row("holdout", "v", "error_rate").n_queries == 11  # type: ignore[union-attr]


# --------------------------------------------------------------------------- seeds


def test_adding_a_variant_leaves_the_other_rows_unchanged() -> None:
    variants, _, _ = _sweep(n=120)  # 20 and 40 groups: Monte Carlo sign-flip p at B=1000
    base, better, same = variants
    keys = ("effect", "ci_low", "ci_high", "boot_ci_low", "boot_ci_high", "se", "p_value", "p_exact")
    metrics = ["hit_at_5", "latency_ms", "error_rate"]

    def numbers(c: Comparison) -> dict[tuple[str, str, str], tuple[Any, ...]]:
        return {
            (r.split, r.variant, r.metric): tuple(getattr(r, k) for k in keys)
            for r in c.rows
            if r.variant == "better"
        }

    two = numbers(compare([base, better], metrics=metrics, B=1000, seed=7))
    three = numbers(compare([base, better, same], metrics=metrics, B=1000, seed=7))
    reordered = numbers(compare([base, same, better], metrics=metrics, B=1000, seed=7))
    # equal up to rounding: the split's draw multiplies every variant's columns in one product per chunk
    assert two.keys() == three.keys() == reordered.keys()
    for key, want in two.items():
        assert three[key] == pytest.approx(want, rel=1e-12, abs=1e-12), key
        assert reordered[key] == pytest.approx(want, rel=1e-12, abs=1e-12), key
    assert not all(v[7] for v in two.values())  # some p are Monte Carlo, so the seeds matter


# --------------------------------------------------------------------------- the confounding guard


def test_guard_counts_a_key_set_inside_a_changed_group() -> None:
    from rag_ablate.compare.guard import changed_factors

    base = {"retrieval": {"method": "bm25", "top_k": 10, "hybrid": {"fusion": "rrf"}}, "seed": 0}
    hybrid = {"retrieval": {"method": "hybrid", "top_k": 10, "hybrid": {"fusion": "rrf"}}, "seed": 0}
    hybrid20 = {"retrieval": {"method": "hybrid", "top_k": 20, "hybrid": {"fusion": "rrf"}}, "seed": 0}
    bc, hc = {"retrieval": "bm25"}, {"retrieval": "hybrid"}
    # grid mode: retrieval=hybrid with retrieval.top_k=20 is two factors, not one
    assert changed_factors(
        base,
        hybrid20,
        bc,
        hc,
        ["retrieval=bm25", "retrieval.top_k=10"],
        ["retrieval=hybrid", "retrieval.top_k=20"],
    ) == ["retrieval", "retrieval.top_k"]
    # the group's own values (a preset with another top_k) stay one factor
    assert changed_factors(base, hybrid20, bc, hc, [], ["retrieval=hybrid"]) == ["retrieval"]
    # an override that leaves the value as the baseline has it changes nothing
    assert changed_factors(
        base, hybrid, bc, hc, ["retrieval.top_k=10"], ["retrieval=hybrid", "retrieval.top_k=10"]
    ) == ["retrieval"]
    vs = [
        VariantData(
            "baseline",
            [],
            config=base,
            overrides=["retrieval=bm25", "retrieval.top_k=10"],
            info={"choices": bc},
        ),
        VariantData(
            "retrieval=hybrid,retrieval.top_k=20",
            [],
            config=hybrid20,
            overrides=["retrieval=hybrid", "retrieval.top_k=20"],
            info={"choices": hc},
        ),
    ]
    assert confounded_variants(vs, "baseline") == {
        "retrieval=hybrid,retrieval.top_k=20": ["retrieval", "retrieval.top_k"]
    }


def _fp(corpus: str, queries: str) -> dict[str, Any]:
    return {"corpus_fingerprint": corpus * 64, "queries_fingerprint": queries * 64}


def test_guard_compares_the_data_by_fingerprint() -> None:
    from rag_ablate.compare.guard import check

    cfg = {"dataset": {"name": "sample", "path": None}, "chunk": {"size": 512}}
    moved = {"dataset": {"name": "copy", "path": "/elsewhere"}, "chunk": {"size": 512}}
    vs = [
        VariantData("baseline", [], config=cfg, info=_fp("a", "b")),
        VariantData("same data elsewhere", [], config=moved, info=_fp("a", "b")),
        VariantData("other queries", [], config=cfg, info=_fp("a", "c")),
        VariantData("other corpus", [], config=cfg, info=_fp("d", "b")),
    ]
    found = check(vs, "baseline")
    # the same files under another path and name: the fingerprints match, nothing changed
    assert found["same data elsewhere"].differences == [] and not found["same data elsewhere"].confounded
    # another query set with an identical config is a confound by itself, named as such
    assert found["other queries"].confounded
    assert found["other queries"].differences == ["query set (fingerprint bbbbbbbbbbbb vs cccccccccccc)"]
    assert found["other corpus"].differences == ["corpus (fingerprint aaaaaaaaaaaa vs dddddddddddd)"]


def test_guard_reports_an_unreadable_config_as_unchecked() -> None:
    from rag_ablate.compare.guard import check, unchecked_variants

    cfg = {"chunk": {"size": 512}}
    vs = [
        VariantData("baseline", [], config=cfg),
        VariantData("ok", [], config={"chunk": {"size": 256}}),
        VariantData("lost", [], config=None, config_problem="config.yaml missing"),
    ]
    assert unchecked_variants(vs, "baseline") == {"lost": "config.yaml missing"}
    assert check(vs, "baseline")["ok"].factors == ["chunk.size"]
    vs[0] = VariantData("baseline", [], config=None, config_problem="config.yaml unreadable (bad yaml)")
    assert unchecked_variants(vs, "baseline") == {
        "ok": "the baseline's config.yaml unreadable (bad yaml)",
        "lost": "the baseline's config.yaml unreadable (bad yaml)",
    }


def _write_job(
    sweep_dir: Path,
    num: int,
    label: str,
    records: list[dict[str, Any]],
    config: str | None,
    info: dict[str, Any],
) -> None:
    job = sweep_dir / str(num)
    job.mkdir(parents=True)
    (job / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (job / "variant.json").write_text(json.dumps({"label": label, "job_num": num, **info}), encoding="utf-8")
    if config is not None:
        (job / "config.yaml").write_text(config, encoding="utf-8")


def test_run_comparison_on_a_sweep_folder(tmp_path: Path) -> None:
    """The one sequence both the sweep's end and `rag-ablate compare` run, on files as jobs write them."""
    from rag_ablate.config.schema import CompareConfig

    variants, _, _ = _sweep(n=60)
    base, better, same = variants
    _fail(same.records, {"q0", "q3"}, latency=900.0)
    fp = _fp("a", "b")
    _write_job(
        tmp_path, 0, "baseline", base.records, "seed: 3\nchunk:\n  size: 512\n", {"role": "baseline", **fp}
    )
    _write_job(tmp_path, 1, "better", better.records, "seed: 3\nchunk:\n  size: 256\n", fp)
    _write_job(tmp_path, 2, "same", same.records, "seed: 3\nchunk: [unclosed\n", fp)
    printed: list[str] = []
    settings = CompareConfig(metrics=["hit_at_5", "error_rate"], B=500, fail_on=["holdout/error_rate:+0.5"])
    run = run_comparison(tmp_path, settings, echo=printed.append)
    c = run.comparison
    assert c.seed == 3  # the sweep's own seed
    assert list(c.unchecked) == ["same"] and c.unchecked["same"].startswith("config.yaml unreadable (")
    assert c.confounded == {}
    assert run.failures == []
    assert [p.name for p in run.paths] == ["comparison.json", "comparison.md", "tradeoff.json", "tradeoff.md"]
    data = json.loads((tmp_path / "comparison.json").read_text())
    # comparison.json is the typed comparison's serialisation: read back, it is the same comparison
    # (the trade-off included), so every view rebuilt from disk renders what was computed
    assert c.tradeoff is not None and data["tradeoff"]["quality_metric"] == c.tradeoff.quality_metric
    again = Comparison.from_dict(data)
    assert again.to_dict() == c.to_dict()
    assert format_markdown(again) == format_markdown(c) == (tmp_path / "comparison.md").read_text()
    assert format_terminal(again) == printed[0]
    assert load_comparison(tmp_path).to_dict() == c.to_dict()
    assert "## Quality against cost" in (tmp_path / "comparison.md").read_text()
    assert set(data["unchecked"]) == {"same"}
    pair = next(p for p in data["pairs"] if p["variant"] == "same" and p["n_failed_variant"])
    assert pair["left_failed_variant"] >= 1
    assert "UNCHECKED: config.yaml unreadable" in printed[0]
    assert "UNCHECKED" in (tmp_path / "comparison.md").read_text()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from(["ok", "fail_base", "fail_var", "fail_both", "no_record"]), min_size=1, max_size=14
    )
)
def test_every_query_is_accounted_for(fates: list[str]) -> None:
    """Whatever fails where, no query vanishes: each is compared or counted as left out, with its reason."""
    n = len(fates)
    splits, groups = ["holdout"] * n, [f"g{i // 2}" for i in range(n)]
    variants = [
        VariantData(
            "baseline", _records({"recall_at_5": [1.0] * n, "latency_ms": [5.0] * n}, splits, groups)
        ),
        VariantData("v", _records({"recall_at_5": [0.0] * n, "latency_ms": [7.0] * n}, splits, groups)),
    ]
    ids = [f"q{i}" for i in range(n)]
    _fail(
        variants[0].records,
        {q for q, f in zip(ids, fates, strict=True) if f in ("fail_base", "fail_both")},
        5.0,
    )
    _fail(
        variants[1].records,
        {q for q, f in zip(ids, fates, strict=True) if f in ("fail_var", "fail_both")},
        7.0,
    )
    gone = {q for q, f in zip(ids, fates, strict=True) if f == "no_record"}
    variants[1].records = [r for r in variants[1].records if r["query_id"] not in gone]
    metrics = ["recall_at_5", "error_rate", "latency_ms"]
    c = compare(variants, metrics=metrics, splits=["holdout"], B=200)

    pair = c.pair("holdout", "v")
    assert pair is not None and pair.n_queries == n
    assert pair.n_ok_both + pair.n_left_out == n
    assert (
        pair.left_failed_baseline,
        pair.left_failed_variant,
        pair.left_failed_both,
        pair.left_no_record,
    ) == (
        fates.count("fail_base"),
        fates.count("fail_var"),
        fates.count("fail_both"),
        fates.count("no_record"),
    )
    by_metric = {r.metric: r for r in c.rows}
    assert set(by_metric) == set(metrics)  # a row for every metric, tested or saying why not
    recall = by_metric["recall_at_5"]
    # failure-aware: a query failed on one side scores 0 there when the other side has a value and
    # this side measures recall at all (some ok query has it); failed in both: left out
    base_measures = any(f in ("ok", "fail_var", "no_record") for f in fates)
    var_measures = any(f in ("ok", "fail_base") for f in fates)
    paired = (
        fates.count("ok")
        + (fates.count("fail_var") if var_measures else 0)
        + (fates.count("fail_base") if base_measures else 0)
    )
    assert recall.n_queries == paired and recall.tested == (paired > 0)
    assert recall.n_ok_queries == (fates.count("ok") if recall.tested else 0)
    if set(fates) == {"no_record"}:
        assert recall.note == "no record in variant"
    elif set(fates) == {"fail_var"}:
        assert recall.note == f"all {n} failed in variant"
    with_record = n - fates.count("no_record")
    assert by_metric["error_rate"].n_queries == with_record  # failures count here
    assert by_metric["error_rate"].tested == (with_record > 0)
    lat = by_metric["latency_ms"]  # over the queries ok on both sides; failures' time apart
    assert lat.n_queries == fates.count("ok") and lat.tested == (fates.count("ok") > 0)
    if with_record:
        err = by_metric["error_rate"]
        diff = fates.count("fail_var") - fates.count("fail_base")
        assert err.effect == pytest.approx(diff / with_record)


# ---------------------------------------------------------------- bad comparison input: a clear line, exit 2


def _compare_cli(folder: Path) -> subprocess.CompletedProcess[str]:
    return rag_ablate_cli(["compare", str(folder)], folder.parent)  # in process: what it says and exits with


def test_compare_refuses_bad_input_with_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    variants, _, _ = _sweep(n=20)
    base, better, _ = variants
    cfg = "seed: 3\nchunk:\n  size: 512\n"

    one = tmp_path / "one"
    _write_job(one, 0, "baseline", base.records, cfg, {"role": "baseline", **_fp("a", "b")})
    other = tmp_path / "other_queries"
    _write_job(other, 0, "baseline", base.records, cfg, {"role": "baseline", **_fp("a", "b")})
    _write_job(other, 1, "better", better.records, cfg, _fp("a", "c"))
    not_sweep = tmp_path / "not_a_sweep"
    (not_sweep / "notes").mkdir(parents=True)
    run_folder = tmp_path / "a_run"
    run_folder.mkdir()
    (run_folder / "records.jsonl").write_text("", encoding="utf-8")

    expected = {
        one: "only one finished variant (baseline)",
        other: "variants ran over another query set than the baseline (better: query set (fingerprint",
        not_sweep: "is not a sweep folder with finished jobs",
        run_folder: "is a single run's folder, not a sweep",
    }
    for folder, message in expected.items():
        out = _compare_cli(folder)
        assert out.returncode == 2, (folder, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert message in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert not (folder / "comparison.json").exists()  # nothing half-written


def test_a_variant_whose_records_equal_the_baseline_is_flagged_no_op(tmp_path: Path) -> None:
    """Same retrieved ids, answers and intents for every query (timings aside): NO-OP in every view."""
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.report.html import write_report

    variants, _, _ = _sweep(n=40)
    base = variants[0].records
    for i, r in enumerate(base):
        r.update(retrieved=[{"doc_id": f"d{i}", "chunk_id": f"d{i}#0", "score": 1.0}], answer=f"a{i}")
        r.update(intent_pred="K_x", intents=["K_x"], timings_ms={"total": 10.0})
    slower = [
        {**r, "timings_ms": {"total": 99.0}, "metrics": {**r["metrics"], "latency_ms": 99.0}} for r in base
    ]
    slower = [{**r, "retrieved": [{**r["retrieved"][0], "score": 0.5}]} for r in slower]  # scores aside too
    other = [dict(r) for r in base]
    other[7] = {**other[7], "retrieved": [{"doc_id": "d8", "chunk_id": "d8#0", "score": 1.0}]}
    reworded = [dict(r) for r in base]
    reworded[3] = {**reworded[3], "answer": "another answer"}
    fp = _fp("a", "b")
    for num, (label, records) in enumerate(
        [("baseline", base), ("top_k=20", slower), ("retrieval=other", other), ("prompt=v2", reworded)]
    ):
        _write_job(
            tmp_path, num, label, records, "seed: 3\n", {"role": "variant" if num else "baseline", **fp}
        )
    printed: list[str] = []
    run = run_comparison(tmp_path, CompareConfig(metrics=["hit_at_5"], B=200), echo=printed.append)
    c = run.comparison
    assert c.no_op == ["top_k=20"]
    assert Comparison.from_dict(json.loads((tmp_path / "comparison.json").read_text())).no_op == ["top_k=20"]
    line = "NO-OP: top_k=20 returned the same retrieved chunks, answers and intents as the baseline"
    assert line in printed[0] and "retrieval=other returned" not in printed[0]
    md = (tmp_path / "comparison.md").read_text()
    assert "## No-op variants" in md and "NO-OP: same records as the baseline" in md
    html = write_report(tmp_path, c, run.source.variants).html.read_text()
    assert html.count('<span class="badge b-warn">no-op</span>') == len(c.splits)  # one row per split
    assert "top_k=20 returned the same retrieved chunks" in html
    from rag_ablate.report.mlflow_ui import sweep_description

    described = sweep_description(c, [], "hit_at_5", "baseline")
    assert "No-op (the same records as the baseline, timings aside): top_k=20" in described
