"""The production mix: weights from tags, weighted means, the weighted bootstrap, validation."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import compare, delta_metrics
from rag_ablate.compare.mix import weighted_paired_bootstrap, weighted_paired_bootstraps
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
from rag_ablate.config.schema import DatasetConfig, register_configs
from rag_ablate.core.errors import ConfigError
from rag_ablate.dataset.weights import (
    TagWeights,
    check_folder,
    effective_n,
    problems,
    run_metrics,
    validate,
    weighted_mean,
)
from rag_ablate.records.scoring import aggregate
from rag_ablate.settings import to_settings
from tests.conftest import DOCS, QUERIES, run_module, write_dataset

register_configs()


# --------------------------------------------------------------------------- the weight of a query


def test_a_query_weighs_the_product_of_its_tags_and_edge_cases_weigh_0_unless_weighted_in() -> None:
    tw = TagWeights({"numeric": 0.5, "templated": 0.2})
    assert tw.weight([]) == 1.0  # untagged
    assert tw.weight(["paraphrase"]) == 1.0  # a tag without a weight
    assert tw.weight(["numeric"]) == 0.5
    assert tw.weight(["numeric", "templated"]) == pytest.approx(0.1)  # 0.5 * 0.2
    assert tw.weight(["numeric", "numeric"]) == 0.5  # a repeated tag counts once
    assert tw.weight(["edge", "paraphrase"]) == 0.0  # edge cases are out by default
    weighted_in = TagWeights({"edge": 0.05, "numeric": 0.5})
    assert weighted_in.weight(["edge"]) == 0.05
    assert weighted_in.weight(["edge", "numeric"]) == pytest.approx(0.025)
    custom = TagWeights({}, ("ambiguous", "conflict"))
    assert custom.weight(["conflict"]) == 0.0 and custom.weight(["edge"]) == 1.0
    assert custom.is_edge(["x", "ambiguous"]) and not custom.is_edge(["edge"])
    assert tw.describe() == (
        "edge 0 (edge case), numeric 0.5, templated 0.2; "
        "a query weighs the product over its tags, other tags 1"
    )


def test_weights_from_a_config_yaml_mapping_and_from_the_dataclass_agree() -> None:
    cfg = DatasetConfig(slice_weights={"edge": 0.05}, edge_tags=["edge", "conflict"])
    a = TagWeights.from_config(cfg)
    b = TagWeights.from_config(
        {"name": "x", "slice_weights": {"edge": 0.05}, "edge_tags": ["edge", "conflict"]}
    )
    assert a == b == TagWeights({"edge": 0.05}, ("edge", "conflict"))
    assert TagWeights.from_config({}) == TagWeights()  # a config.yaml written before the fields existed


def test_weighted_mean_and_effective_n_by_hand() -> None:
    # (0.2 * 1 + 0.5 * 2 + 1 * 0 + 0 * 100) / 1.7 = 1.2 / 1.7
    assert weighted_mean([0.2, 0.5, 1.0, 100.0], [1, 2, 0, 0]) == pytest.approx(1.2 / 3)
    assert weighted_mean([1.0, 0.0], [3, 1]) == pytest.approx(0.75)
    assert effective_n([1, 1, 1, 1]) == pytest.approx(4.0)
    assert effective_n([1, 1, 0, 0]) == pytest.approx(2.0)
    assert effective_n([2, 1, 1]) == pytest.approx(16 / 6)  # (sum w)^2 / sum w^2


# --------------------------------------------------------------------------- run metrics


def _rec(qid: str, split: str, tags: list[str], recall: float | None, status: str = "ok") -> dict[str, Any]:
    metrics: dict[str, Any] = {"latency_ms": 10.0}
    if recall is not None:
        metrics["recall_at_5"] = recall
    return {
        "query_id": qid,
        "split": split,
        "group": qid,
        "kind": "answerable",
        "tags": tags,
        "status": status,
        "metrics": metrics,
    }


RUN = [
    _rec("a", "dev", [], 1.0),
    _rec("b", "dev", ["numeric"], 0.0),
    _rec("c", "dev", ["numeric", "templated"], 1.0),
    _rec("d", "dev", ["edge"], 0.0),
    _rec("e", "dev", ["edge", "numeric"], 0.0),
    _rec("f", "holdout", ["paraphrase"], 0.5),
    _rec("g", "holdout", ["edge"], 1.0),
    _rec("h", "holdout", ["numeric"], None, status="failed"),  # no quality value: out of every mean
]


def test_production_weighted_means_of_a_run_against_a_hand_computation() -> None:
    tw = TagWeights({"numeric": 0.5, "templated": 0.4})
    m = aggregate(RUN, tw)
    # dev weights a 1, b 0.5, c 0.2, d 0, e 0: (1*1 + 0.5*0 + 0.2*1) / 1.7
    assert m["dev/prod/recall_at_5"] == pytest.approx(1.2 / 1.7)
    assert m["dev/recall_at_5"] == pytest.approx(2 / 5)  # the plain mean is unchanged
    assert m["dev/edge/recall_at_5"] == 0.0  # d and e
    assert m["holdout/prod/recall_at_5"] == 0.5  # f only (g is an edge case, h failed)
    assert m["holdout/edge/recall_at_5"] == 1.0
    # all: a 1, b .5, c .2, f 1 -> (1 + 0 + .2 + .5) / 2.7
    assert m["all/prod/recall_at_5"] == pytest.approx(1.7 / 2.7)
    assert m["all/edge/recall_at_5"] == pytest.approx(1 / 3)
    assert (m["dev/prod/n_queries"], m["dev/edge/n_queries"]) == (3.0, 2.0)
    assert m["holdout/prod/n_queries"] == 2.0  # f and the failed h (weight 0.5) count; its values do not
    assert m["dev/prod/n_eff"] == pytest.approx(1.7**2 / (1 + 0.25 + 0.04))
    # latency includes failed queries, as the plain mean: holdout f (1) and h (0.5)
    assert m["holdout/prod/latency_ms"] == 10.0


def test_edge_weight_0_excludes_edge_cases_from_the_headline_and_reports_them_on_their_own() -> None:
    m = aggregate(RUN, TagWeights({"edge": 0.0}))
    non_edge_dev = [1.0, 0.0, 1.0]
    assert m["dev/prod/recall_at_5"] == pytest.approx(np.mean(non_edge_dev))
    assert m["dev/edge/recall_at_5"] == 0.0
    # weighted in at 0.5: they count half
    m2 = aggregate(RUN, TagWeights({"edge": 0.5}))
    assert m2["dev/prod/recall_at_5"] == pytest.approx((1 + 0 + 1 + 0.5 * 0 + 0.5 * 0) / 4.0)
    assert m2["dev/edge/recall_at_5"] == 0.0  # still reported on their own, as a plain mean


def test_no_prod_keys_when_every_query_weighs_1() -> None:
    plain = [r for r in RUN if "edge" not in r["tags"]]
    assert run_metrics(plain, TagWeights(), ("dev", "holdout", "all")) == {}
    assert not [k for k in aggregate(plain, TagWeights()) if "/prod/" in k or "/edge/" in k]
    assert aggregate(RUN) == aggregate(RUN, None)  # without weights: the plain metrics only
    assert not [k for k in aggregate(RUN) if "/prod/" in k]


# --------------------------------------------------------------------------- the weighted bootstrap


def _brute_force(
    b: np.ndarray, v: np.ndarray, groups: list[str], w: np.ndarray, B: int, seed: int
) -> tuple[float, float, float, int]:
    """Resample groups with replacement (the draws ``rng.integers(0, G, (B, G))``), concatenate
    their queries, and take the weighted mean of the differences of each resample."""
    uniq = sorted(set(groups))
    members = {g: [i for i, x in enumerate(groups) if x == g] for g in uniq}
    draws = np.random.default_rng(seed).integers(0, len(uniq), size=(B, len(uniq)))
    thetas = []
    for row in draws:
        idx = [i for k in row for i in members[uniq[k]]]
        ww = w[idx]
        if ww.sum() == 0:
            continue
        thetas.append(float(np.sum(ww * (v[idx] - b[idx])) / ww.sum()))
    t = np.array(thetas)
    lo, hi = np.percentile(t, [2.5, 97.5])
    return float(lo), float(hi), float(t.std(ddof=1)), len(t)


def test_weighted_bootstrap_interval_equals_a_brute_force_resampling_with_the_same_seed() -> None:
    rng = np.random.default_rng(7)
    n = 45
    groups = [f"g{rng.integers(0, 18):02d}" for _ in range(n)]
    b = rng.random(n)
    v = np.clip(b + rng.normal(0.05, 0.2, n), 0, 1)
    w = rng.choice([0.0, 0.25, 1.0], size=n, p=[0.2, 0.3, 0.5])
    res = weighted_paired_bootstrap(b, v, groups, w, B=2000, seed=11)
    lo, hi, se, n_used = _brute_force(b, v, groups, w, 2000, 11)
    assert (res.ci_low, res.ci_high, res.se) == pytest.approx((lo, hi, se), abs=1e-12)
    assert res.n_resamples == n_used
    assert res.effect == pytest.approx(np.sum(w * (v - b)) / w.sum(), abs=1e-15)
    assert res.baseline == pytest.approx(np.sum(w * b) / w.sum())
    assert res.variant == pytest.approx(np.sum(w * v) / w.sum())
    assert res.n_queries == int(np.count_nonzero(w))
    assert res.n_groups == len({g for g, x in zip(groups, w, strict=True) if x > 0})


def test_weighted_bootstrap_drops_resamples_that_drew_only_zero_weight_groups() -> None:
    # two groups, one of weight 0: a quarter of the resamples draw it twice and have no ratio
    b = np.array([0.0, 0.0, 1.0])
    v = np.array([1.0, 0.0, 1.0])
    res = weighted_paired_bootstrap(b, v, ["x", "x", "y"], [1.0, 1.0, 0.0], B=4000, seed=3)
    lo, hi, _, n_used = _brute_force(b, v, ["x", "x", "y"], np.array([1.0, 1.0, 0.0]), 4000, 3)
    assert res.n_resamples == n_used and 2800 < n_used < 3200
    assert (res.ci_low, res.ci_high) == pytest.approx((lo, hi))
    assert (lo, hi) == (0.5, 0.5)  # every usable resample holds group x only
    assert res.effect == 0.5


def test_several_metrics_and_weightings_at_once_equal_one_at_a_time() -> None:
    rng = np.random.default_rng(9)
    n = 50
    groups = [str(rng.integers(0, 20)) for _ in range(n)]
    b, v = rng.random((n, 3)), rng.random((n, 3))
    w = np.column_stack([rng.choice([0.0, 0.5, 1.0], n), (rng.random(n) < 0.3).astype(float)])
    together = weighted_paired_bootstraps(b, v, groups, w, B=1500, seed=2)
    for k in range(2):
        for j in range(3):
            alone = weighted_paired_bootstrap(b[:, j], v[:, j], groups, w[:, k], B=1500, seed=2)
            got = together[k][j]
            assert (got.n_resamples, got.n_queries, got.n_groups) == (
                alone.n_resamples,
                alone.n_queries,
                alone.n_groups,
            )
            assert (got.effect, got.ci_low, got.ci_high, got.se) == pytest.approx(
                (alone.effect, alone.ci_low, alone.ci_high, alone.se), abs=1e-12
            )


def test_with_equal_weights_the_weighted_interval_is_the_plain_bootstrap_interval() -> None:
    rng = np.random.default_rng(1)
    n = 60
    groups = [str(rng.integers(0, 25)) for _ in range(n)]
    b, v = rng.random(n), rng.random(n)
    counts = list(stats.bootstrap_counts(len(set(groups)), 3000, np.random.default_rng(5)))
    plain = stats.paired_test(b, v, np.array(groups), counts=counts)
    weighted = weighted_paired_bootstrap(b, v, groups, np.full(n, 2.5), counts=counts)
    assert weighted.effect == pytest.approx(float(plain.effect[0]))
    assert (weighted.ci_low, weighted.ci_high) == pytest.approx(
        (float(plain.boot_ci_low[0]), float(plain.boot_ci_high[0])), abs=1e-12
    )
    assert weighted.se == pytest.approx(float(plain.se[0]), abs=1e-12)


@pytest.mark.slow
def test_weighted_bootstrap_interval_covers_the_production_effect() -> None:
    """Simulated populations where the effect differs by tag: the 95% interval covers the
    true production-weighted effect about 95% of the time (60 groups)."""
    rng = np.random.default_rng(2026)
    tw = TagWeights({"numeric": 0.5})
    effects = {"": 0.02, "numeric": 0.10, "edge": -0.30}
    # the true production effect: E[w d] / E[w] with tag shares 0.6 / 0.3 / 0.1
    shares = {"": 0.6, "numeric": 0.3, "edge": 0.1}
    weights = {"": 1.0, "numeric": 0.5, "edge": 0.0}
    truth = sum(shares[t] * weights[t] * effects[t] for t in shares) / sum(
        shares[t] * weights[t] for t in shares
    )
    hits, runs = 0, 300
    for _ in range(runs):
        groups, tags, d = [], [], []
        for g in range(60):
            shift = rng.normal(0, 0.1)  # a group's queries move together
            for _ in range(int(rng.integers(1, 4))):
                t = str(rng.choice(list(shares), p=list(shares.values())))
                groups.append(f"g{g}")
                tags.append([t] if t else [])
                d.append(effects[t] + shift + rng.normal(0, 0.2))
        w = np.array([tw.weight(t) for t in tags])
        res = weighted_paired_bootstrap(
            np.zeros(len(d)), np.array(d), groups, w, B=1000, seed=int(rng.integers(1 << 31))
        )
        hits += res.ci_low <= truth <= res.ci_high
    assert 0.91 <= hits / runs <= 0.99


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_a_negative_or_non_finite_weight_is_a_config_error(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"dataset\.slice_weights\.numeric must be a finite number >= 0"):
        TagWeights({"numeric": bad})


def test_a_weight_for_a_tag_no_query_has_is_an_error_listing_the_dataset_tags() -> None:
    tags = [["numeric"], ["numeric", "paraphrase"], []]
    with pytest.raises(ConfigError) as exc:
        validate(TagWeights({"numerc": 0.5}), tags, "data/queries.jsonl")
    msg = str(exc.value)
    assert msg.startswith("data/queries.jsonl: dataset.slice_weights names tag 'numerc', which no query has")
    assert "the dataset's tags: numeric (2), paraphrase (1)" in msg


def test_every_query_weighing_0_is_an_error() -> None:
    with pytest.raises(ConfigError, match="every query weighs 0"):
        validate(TagWeights({"numeric": 0.0}), [["numeric"], ["edge"], ["numeric", "x"]], "q.jsonl")


def test_an_edge_tag_no_query_has_is_a_warning_the_default_edge_tag_is_not() -> None:
    assert problems(TagWeights(), [["numeric"]]) == ([], [])
    errors, warnings = problems(TagWeights({}, ("edge", "conflcit")), [["numeric"]])
    assert not errors
    assert warnings == [
        "dataset.edge_tags names tag 'conflcit', which no query has; the dataset's tags: numeric (1)"
    ]


def _compose(overrides: list[str]) -> Any:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=normalize_overrides(overrides))


def test_slice_weights_on_the_command_line_compose_and_a_negative_one_fails_at_composition() -> None:
    s = to_settings(
        _compose(["++dataset.slice_weights={edge: 0.05, numeric: 0.5}", "dataset.edge_tags=[edge,x]"])
    )
    assert s.dataset.slice_weights == {"edge": 0.05, "numeric": 0.5}
    assert s.dataset.edge_tags == ["edge", "x"]
    assert to_settings(_compose([])).dataset.edge_tags == ["edge"]
    with pytest.raises(ConfigError, match=r"dataset\.slice_weights\.numeric must be >= 0, got -1"):
        to_settings(_compose(["++dataset.slice_weights={numeric: -1}"]))


def test_a_sweep_checks_the_weights_against_the_dataset_folder_before_it_runs(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "d", queries=[{**q, "tags": ["numeric"]} for q in QUERIES])
    check_folder(DatasetConfig(path=str(folder), slice_weights={"numeric": 0.5}))  # fine
    check_folder(DatasetConfig(path=str(folder)))  # nothing to check
    with pytest.raises(ConfigError, match=r"names tag 'edgy'.*the dataset's tags: numeric \(8\)"):
        check_folder(DatasetConfig(path=str(folder), slice_weights={"edgy": 0.1}))
    # the embedded sample carries edge cases
    check_folder(DatasetConfig(slice_weights={"edge": 0.05, "numeric": 0.5}))


# --------------------------------------------------------------------------- the comparison


def _variant(
    label: str, values: dict[str, float], tags: dict[str, list[str]], config: Any = None
) -> VariantData:
    recs = [
        {
            "query_id": q,
            "query": f"query {q}",
            "split": "dev" if int(q[1:]) % 2 else "holdout",
            "group": f"g{int(q[1:]) // 4}",
            "kind": "answerable",
            "tags": tags[q],
            "status": "ok",
            "metrics": {"recall_at_5": x},
        }
        for q, x in values.items()
    ]
    return VariantData(label=label, records=recs, config=config)


def _crafted() -> tuple[dict[str, float], dict[str, float], dict[str, list[str]]]:
    """160 queries in 40 groups; the variant helps ordinary queries (+0.1 on average) and
    breaks the edge cases (1 -> 0)."""
    rng = np.random.default_rng(4)
    ids = [f"q{i}" for i in range(160)]
    tags = {q: (["edge"] if i % 5 == 3 else (["numeric"] if i % 3 == 0 else [])) for i, q in enumerate(ids)}
    base = {q: (1.0 if "edge" in tags[q] else float(rng.choice([0.0, 0.5, 1.0]))) for q in ids}
    var = {
        q: (0.0 if "edge" in tags[q] else min(1.0, base[q] + float(rng.choice([0.0, 0.2, 0.2])))) for q in ids
    }
    return base, var, tags


def test_comparison_reports_the_production_weighted_effect_and_the_edge_cases_on_their_own(
    tmp_path: Path,
) -> None:
    base, var, tags = _crafted()
    config = {"dataset": {"slice_weights": {"numeric": 0.5}, "edge_tags": ["edge"]}}
    c = compare(
        [_variant("baseline", base, tags, config), _variant("chunk=256", var, tags, config)],
        metrics=["recall_at_5"],
        B=2000,
    )
    assert c.mix_weights.startswith("edge 0 (edge case), numeric 0.5")
    for split, parity in (("dev", 1), ("holdout", 0)):
        qs = [q for q in base if int(q[1:]) % 2 == parity]
        w = np.array([TagWeights({"numeric": 0.5}).weight(tags[q]) for q in qs])
        d = np.array([var[q] - base[q] for q in qs])
        edge = np.array(["edge" in tags[q] for q in qs])
        prod = next(r for r in c.mix if (r.split, r.mix) == (split, "production"))
        assert prod.effect == pytest.approx(float(np.sum(w * d) / w.sum()))
        assert prod.n_queries == int(np.count_nonzero(w)) and prod.ci_low < prod.effect < prod.ci_high
        assert prod.ci_low > 0  # helps the production mix ...
        edge_row = next(r for r in c.mix if (r.split, r.mix) == (split, "edge"))
        assert edge_row.effect == -1.0 and edge_row.n_queries == int(edge.sum())  # ... breaks every edge case
        plain = c.row(split, "chunk=256", "recall_at_5")
        assert plain is not None and plain.effect == pytest.approx(float(d.mean()))
        assert plain.effect < prod.effect  # the plain mean is dragged down by the over-collected edge cases
        # the same interval as a brute-force weighted resampling on the split's shared draw
        groups = [f"g{int(q[1:]) // 4}" for q in qs]
        bq, vq = np.array([base[q] for q in qs]), np.array([var[q] for q in qs])
        digest = hashlib.sha256("\x1f".join(sorted(set(groups))).encode()).hexdigest()[:16]
        seed = stats.derive_seed(0, split, digest)  # the split's shared draw (compare.analysis)
        lo, hi, _, _ = _brute_force(bq, vq, groups, w, 2000, seed)
        assert (prod.ci_low, prod.ci_high) == pytest.approx((lo, hi), abs=1e-12)
    deltas = delta_metrics(c, "chunk=256")
    prod_hold = next(r for r in c.mix if (r.split, r.mix) == ("holdout", "production"))
    assert deltas["delta/holdout/prod/recall_at_5"] == prod_hold.effect  # the child run's MLflow metric
    assert not [k for k in deltas if "/edge/" in k]
    data = c.to_dict()["production_mix"]
    assert data["weights"] == c.mix_weights and {r["mix"] for r in data["rows"]} == {"production", "edge"}
    json.dumps(c.to_dict())  # finite values only
    back = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))  # comparison.json read back
    assert back.mix == c.mix and back.mix_weights == c.mix_weights
    md = format_markdown(c)
    assert "## Production mix" in md and "numeric 0.5" in md
    term = format_terminal(c)
    assert "production mix (edge 0 (edge case), numeric 0.5; a query weighs the product" in term
    assert "-1.000 [-1.000, -1.000]" in term  # the edge cases' effect


def test_no_production_rows_when_nothing_is_weighted_and_a_note_when_the_weights_do_not_fit() -> None:
    base, var, tags = _crafted()
    plain_tags = {q: [t for t in ts if t != "edge"] for q, ts in tags.items()}
    c = compare(
        [_variant("baseline", base, plain_tags), _variant("v", var, plain_tags)],
        metrics=["recall_at_5"],
        B=500,
    )
    assert c.mix == [] and c.mix_weights == "" and "Production mix" not in format_markdown(c)
    bad = {"dataset": {"slice_weights": {"numerc": 0.5}}}
    c2 = compare(
        [_variant("baseline", base, tags, bad), _variant("v", var, tags)], metrics=["recall_at_5"], B=500
    )
    assert c2.mix == []
    assert any("production mix not computed" in n and "'numerc'" in n and "numeric (" in n for n in c2.notes)
    # records written before tags were recorded: no rows, and a note when weights were asked for
    old = [
        VariantData(v.label, [{k: x for k, x in r.items() if k != "tags"} for r in v.records], bad)
        for v in (_variant("baseline", base, tags), _variant("v", var, tags))
    ]
    c3 = compare(old, metrics=["recall_at_5"], B=500)
    assert c3.mix == [] and any("carry no tags" in n for n in c3.notes)


# --------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_run_writes_prod_and_edge_means_and_a_bad_tag_stops_it(tmp_path: Path) -> None:
    tagged = []
    for q in QUERIES:
        extra = {"q2": ["edge"], "q3": ["numeric"], "q7": ["numeric", "templated"]}.get(q["query_id"], [])
        tagged.append({**q, "tags": extra})
    folder = write_dataset(tmp_path / "data", docs=DOCS, queries=tagged)
    args = [
        f"dataset.path={folder}",
        "tracking=none",
        "progress=false",
        "chunk=128",
        "++dataset.slice_weights={numeric: 0.5}",
    ]
    proc = run_module("rag_ablate", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = next((tmp_path / "outputs").rglob("metrics.json")).parent
    metrics = json.loads((job / "metrics.json").read_text())
    records = [json.loads(line) for line in (job / "records.jsonl").read_text().splitlines()]
    by_tags = {r["query_id"]: r["tags"] for r in records}
    assert by_tags["q7"] == ["numeric", "templated"]
    for split in ("dev", "holdout", "all"):
        rows = [
            r for r in records if (split == "all" or r["split"] == split) and "recall_at_5" in r["metrics"]
        ]
        w = [0.0 if "edge" in r["tags"] else (0.5 if "numeric" in r["tags"] else 1.0) for r in rows]
        x = [r["metrics"]["recall_at_5"] for r in rows]
        if sum(w) > 0:
            assert metrics[f"{split}/prod/recall_at_5"] == pytest.approx(np.dot(w, x) / sum(w))
        edge = [r["metrics"]["recall_at_5"] for r in rows if "edge" in r["tags"]]
        if edge:
            assert metrics[f"{split}/edge/recall_at_5"] == pytest.approx(np.mean(edge))
    bad = run_module("rag_ablate", [*args[:-1], "++dataset.slice_weights={numerc: 0.5}"], tmp_path)
    assert bad.returncode != 0
    assert (
        "names tag 'numerc', which no query has; the dataset's tags: edge (1), numeric (2), templated (1)"
        in (bad.stderr)
    )


def test_statistics_md_worked_example_matches_the_code() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "statistics.md").read_text(encoding="utf-8")
    section = text.split("## The production mix")[1].split("\n## ")[0]
    printed = section.split("# 0.3478")[1].splitlines()[0]
    groups = list("abbbcccdefghhh")
    d = [1, 0, 1, -1, 1, 0, -1, 1, 2, 0, 1, 0, 1, 1]
    tags = [[]] * 8 + [["edge"], [], [], ["numeric"], ["numeric"], ["numeric"]]
    w = [TagWeights({"numeric": 0.5}).weight(t) for t in tags]
    r = weighted_paired_bootstrap(np.zeros(14), d, groups, w, B=10_000, seed=0)
    numbers = (round(r.effect, 4), round(r.ci_low, 4), round(r.ci_high, 4), r.n_queries, r.n_groups)
    got = " ".join(map(str, numbers)) + f" {round(r.n_eff, 2)}"
    assert "# 0.3478" + printed == "# " + got
    assert r.effect == pytest.approx(4 / 11.5)
    edge = weighted_paired_bootstrap(
        np.zeros(14), d, groups, [float("edge" in t) for t in tags], B=10_000, seed=0
    )
    assert (edge.effect, edge.n_groups, edge.n_resamples) == (2.0, 1, 6566)
    assert "6,566 of the 10,000" in section


def test_mlflow_gets_the_prod_and_edge_means_of_the_configured_metrics_only() -> None:
    from rag_ablate.tracking.ui import mlflow_metrics

    full = {
        "dev/prod/recall_at_5": 0.8,
        "dev/edge/recall_at_5": 0.2,
        "dev/prod/recall_at_1": 0.5,
        "dev/prod/n_queries": 30.0,
        "dev/prod/n_eff": 25.0,
        "all/prod/recall_at_5": 0.7,
    }
    assert mlflow_metrics(full, ["recall_at_5"]) == {
        "dev/prod/recall_at_5": 0.8,
        "dev/edge/recall_at_5": 0.2,
        "dev/prod/n_queries": 30.0,
    }
