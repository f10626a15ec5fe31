"""The comparison step on hand-made sweeps: effects, adjustment, flips, flags, gate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate import compare, stats
from rag_ablate.compare import VariantData
from rag_ablate.errors import ComparisonError, UnknownNameError
from rag_ablate.guard import changed_factors, confounded_variants


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
    c = compare.compare(variants, metrics=["hit_at_5", "latency_ms"], B=2000, seed=1)
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
    # Holm on holdout, BH on dev, each over variants x metrics
    for split, fn in (("holdout", stats.holm), ("dev", stats.benjamini_hochberg)):
        fam = [r for r in c.rows if r.split == split]
        assert [r.p_adjusted for r in fam] == pytest.approx(list(fn([r.p_value for r in fam])))
        assert {r.adjustment for r in fam} == {"holm" if split == "holdout" else "bh"}
    # direction: hits up is better, latency up is worse
    assert c.row("dev", "better", "hit_at_5").verdict == "better"  # type: ignore[union-attr]
    assert c.row("dev", "better", "latency_ms").verdict == "worse"  # type: ignore[union-attr]


def test_rerun_gives_identical_numbers() -> None:
    variants, _, _ = _sweep()
    a = compare.compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=3).to_dict()
    b = compare.compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=3).to_dict()
    assert a == b
    c = compare.compare(variants, metrics=["hit_at_5", "latency_ms"], B=1000, seed=4).to_dict()
    assert [r["ci_low"] for r in a["rows"]] != [r["ci_low"] for r in c["rows"]]


def test_flips_list_the_queries_that_changed() -> None:
    variants, _, _ = _sweep()
    c = compare.compare(variants, metrics=["hit_at_5", "latency_ms"], B=500)
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


def test_missing_values_pair_only_what_both_have() -> None:
    variants, _, _ = _sweep(n=40)
    variants[1].records[1]["status"] = "failed"
    variants[1].records[1]["metrics"] = {}
    c = compare.compare(variants, metrics=["hit_at_5"], B=500)
    r = c.row(variants[1].records[1]["split"], "better", "hit_at_5")
    total = sum(1 for x in variants[0].records if x["split"] == variants[1].records[1]["split"])
    assert r is not None and r.n_queries == total - 1


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
    c = compare.compare(vs, metrics=["hit_at_5"], B=1000)
    assert c.row("dev", "v", "hit_at_5").verdict == "better"  # type: ignore[union-attr]
    assert c.row("holdout", "v", "hit_at_5").flag == "better on dev only"  # type: ignore[union-attr]
    assert "better on dev only" in compare.format_terminal(c)


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
    c = compare.compare(vs, metrics=["recall_at_5"], B=2000)
    failures = compare.gate(c, ["holdout/recall_at_5<-0.02"])
    assert len(failures) == 1 and "worse: holdout/recall_at_5 effect -0.1000" in failures[0]
    assert compare.gate(c, ["holdout/recall_at_5<-0.2"]) == []  # beyond the bound only
    assert compare.gate(c, ["holdout/recall@5<-0.02"])  # display spelling accepted
    with pytest.raises(ComparisonError, match="expected SPLIT/METRIC<BOUND"):
        compare.gate(c, ["recall_at_5 below 2%"])
    with pytest.raises(ComparisonError, match="is not compared"):
        compare.gate(c, ["holdout/ndcg_at_10<-0.02"])


def test_gate_ignores_non_significant_effects() -> None:
    splits = ["holdout"] * 6
    groups = [f"g{i}" for i in range(6)]
    vs = [
        VariantData("baseline", _records({"recall_at_5": [1, 1, 1, 1, 1, 1]}, splits, groups)),
        VariantData("v", _records({"recall_at_5": [0, 1, 1, 1, 1, 1]}, splits, groups)),
    ]
    c = compare.compare(vs, metrics=["recall_at_5"], splits=["holdout"], B=1000)
    r = c.row("holdout", "v", "recall_at_5")
    assert r is not None and r.effect < -0.02 and not r.significant
    assert compare.gate(c, ["holdout/recall_at_5<-0.02"]) == []


def test_unknown_metric_and_baseline() -> None:
    variants, _, _ = _sweep(n=20)
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        compare.compare(variants, metrics=["recal_at_5"])
    with pytest.raises(ComparisonError, match="variants: baseline, better, same"):
        compare.compare(variants, baseline="nope", metrics=["hit_at_5"])


def test_outputs_have_the_documented_columns(tmp_path: Path) -> None:
    variants, _, _ = _sweep()
    c = compare.compare(variants, metrics=["hit_at_5"], B=500)
    paths = compare.write_outputs(c, tmp_path)
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
    }
    assert data["rows"] and all(need <= set(r) for r in data["rows"])
    md = paths[1].read_text()
    assert "| better | hit@5 |" in md and "Per-query flips" in md
    assert (
        compare.delta_metrics(c, "better")["delta/holdout/hit_at_5"]
        == c.row("holdout", "better", "hit_at_5").effect
    )  # type: ignore[union-attr]


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
