"""Quality against cost: Pareto frontier, iso-quality choice, bootstrap intervals, the plot."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.compare import tradeoff
from rag_ablate.compare.analysis import split_draw
from rag_ablate.compare.model import VariantData
from rag_ablate.config.schema import CompareConfig, ModelPrice
from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.report import plots as report_plots
from rag_ablate.run import cost
from tests.conftest import REPO

# --------------------------------------------------------------------------- frontier


def test_frontier_on_hand_made_points() -> None:
    points = [
        (0.80, 10.0),  # A: tied with B
        (0.80, 10.0),  # B: tied with A, both stay
        (0.70, 5.0),  # C: cheapest
        (0.60, 6.0),  # D: beaten by C on both
        (0.90, 20.0),  # E: best quality
        (0.90, 25.0),  # F: same quality as E, dearer: beaten
        (0.80, 12.0),  # G: same quality as A, dearer: beaten
        (math.nan, 1.0),  # H: no quality value
    ]
    assert tradeoff.pareto_frontier(points) == [True, True, True, False, True, False, False, False]


def test_frontier_of_one_variant_and_of_a_lower_is_better_quality() -> None:
    assert tradeoff.pareto_frontier([(0.5, 3.0)]) == [True]
    # error rate: lower is better, so (0.1, 5) beats (0.2, 5) and (0.3, 1) is cheapest
    pts = [(0.1, 5.0), (0.2, 5.0), (0.3, 1.0)]
    assert tradeoff.pareto_frontier(pts, quality_higher=False) == [True, False, True]
    # read as higher-is-better, (0.3, 1) is best and cheapest: it beats both others
    assert tradeoff.pareto_frontier(pts, quality_higher=True) == [False, False, True]


def _beats(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5).map(lambda x: x / 5), st.integers(0, 5).map(float)),
        min_size=1,
        max_size=9,
    )
)
def test_frontier_matches_the_definition(points: list[tuple[float, float]]) -> None:
    front = tradeoff.pareto_frontier(points)
    for i, p in enumerate(points):
        beaten = any(_beats(q, p) for j, q in enumerate(points) if j != i)
        assert front[i] == (not beaten)
    # never empty, and every point off it is beaten by a point on it
    assert any(front)
    for i, p in enumerate(points):
        if not front[i]:
            assert any(_beats(q, p) for j, q in enumerate(points) if front[j])


# --------------------------------------------------------------------------- iso-quality


def test_iso_quality_takes_the_cheapest_whose_lower_bound_clears_the_bar() -> None:
    pts = [
        ("A", 0.90, 0.86, 0.94, 100.0),  # clears, dear
        ("B", 0.88, 0.84, 0.92, 50.0),  # mean above the bar, interval not: does not clear
        ("C", 0.87, 0.855, 0.89, 80.0),  # clears, cheaper than A
        ("D", 0.95, 0.90, 0.99, 80.0),  # clears at C's cost with better quality: wins the tie
    ]
    assert tradeoff.iso_quality(pts, 0.85) == "D"
    assert tradeoff.iso_quality(pts[:3], 0.85) == "C"
    assert tradeoff.iso_quality(pts[:3], 0.84) == "B"  # a bound equal to the bar clears it
    assert tradeoff.iso_quality(pts, 0.91) is None
    # lower-is-better quality: the upper bound must be at or below the bar
    low = [("x", 0.05, 0.02, 0.08, 10.0), ("y", 0.04, 0.03, 0.05, 20.0)]
    assert tradeoff.iso_quality(low, 0.06, quality_higher=False) == "y"
    assert tradeoff.iso_quality(low, 0.10, quality_higher=False) == "x"


# --------------------------------------------------------------------------- data


def _rec(
    qid: str,
    split: str,
    group: str,
    recall: float | None,
    latency: float,
    tokens: float,
    *,
    usage: dict[str, int] | None = None,
    status: str = "ok",
) -> dict[str, Any]:
    metrics: dict[str, float] = {"latency_ms": latency}
    if status == "ok":
        metrics["context_tokens_at_5"] = tokens
        if recall is not None:
            metrics["recall_at_5"] = recall
    return {
        "query_id": qid,
        "query": f"query {qid}",
        "split": split,
        "group": group,
        "kind": "answerable",
        "status": status,
        "retrieved": [{"doc_id": "d"}] * 5 if status == "ok" else [],
        "timings_ms": {"route": latency / 4, "total": latency},
        "usage": usage,
        "metrics": metrics,
    }


def _variant(label: str, shift: float, seed: int, price: ModelPrice | None = None) -> VariantData:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(40):
        split = "holdout" if i % 3 == 0 else "dev"
        group = f"g{i // 3}"  # near-duplicate groups of up to 3 queries
        recall = float(min(1.0, max(0.0, round(rng.uniform(0.3, 1.0) + shift, 2))))
        failed = i == 7
        recs.append(
            _rec(
                f"q{i}",
                split,
                group,
                None if failed else recall,
                float(rng.gamma(2.0, 10.0) + 100 * shift),
                float(rng.integers(200, 800)),
                usage={"prompt_tokens": int(rng.integers(100, 900)), "completion_tokens": 50}
                if price
                else None,
                status="failed" if failed else "ok",
            )
        )
    config: dict[str, Any] = {"seed": 0}
    if price is not None:
        config["cost"] = {"model": "m", "prices": {"m": vars(price)}}
    return VariantData(
        label=label, records=recs, config=config, info={"role": "baseline" if shift == 0 else ""}
    )


def _brute_interval(
    variant: VariantData, split: str, groups: list[str], extract: Any, q: float | None, B: int, seed: int
) -> tuple[float, float]:
    """Draw the same counts as the module (the comparison's draw of the split), expand every
    resample, compute the statistic with numpy."""
    rng = np.random.default_rng(split_draw(seed, split, groups).seed)
    G = len(groups)
    draws = rng.integers(0, G, size=(B, G))
    index = {g: i for i, g in enumerate(groups)}
    rows = [(extract(r), index[r["group"]]) for r in variant.records if r["split"] == split]
    rows = [(v, g) for v, g in rows if v is not None]
    boot = []
    for b in range(B):
        counts = np.bincount(draws[b], minlength=G)
        sample = [v for v, g in rows for _ in range(counts[g])]
        if not sample:
            continue
        boot.append(np.mean(sample) if q is None else np.percentile(sample, q))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(lo), float(hi)


def test_intervals_equal_a_brute_force_group_bootstrap() -> None:
    variants = [_variant("baseline", 0.0, 1), _variant("v1", 0.1, 2)]
    B, seed = 300, 7
    t = tradeoff.compute(variants, CompareConfig(B=B, cost_metric="latency_p95_ms"), seed=seed)
    t2 = tradeoff.compute(variants, CompareConfig(B=B, cost_metric="context_tokens"), seed=seed)
    for split in ("dev", "holdout"):
        groups = sorted({r["group"] for r in variants[0].records if r["split"] == split})
        for v in variants:
            p = t.split(split).point(v.label)  # type: ignore[union-attr]
            p2 = t2.split(split).point(v.label)  # type: ignore[union-attr]
            assert p is not None and p2 is not None
            q_lo, q_hi = _brute_interval(
                v, split, groups, lambda r: r["metrics"].get("recall_at_5"), None, B, seed
            )
            c_lo, c_hi = _brute_interval(v, split, groups, cost.query_latency_ms, 95, B, seed)
            k_lo, k_hi = _brute_interval(v, split, groups, cost.final_context_tokens, None, B, seed)
            assert (p.quality_low, p.quality_high) == pytest.approx((q_lo, q_hi), rel=1e-12, abs=1e-12)
            assert (p.cost_low, p.cost_high) == pytest.approx((c_lo, c_hi), rel=1e-12)
            assert (p2.cost_low, p2.cost_high) == pytest.approx((k_lo, k_hi), rel=1e-12)
            # the numbers themselves are the cost module's and the plain mean
            assert p.cost == pytest.approx(cost.cost_metrics(v.records, split)["latency_p95_ms"], rel=1e-12)
            assert p2.cost == pytest.approx(cost.cost_metrics(v.records, split)["context_tokens"], rel=1e-12)
            recalls = [
                r["metrics"]["recall_at_5"] for r in v.records if r["split"] == split and r["status"] == "ok"
            ]
            assert p.quality == pytest.approx(np.mean(recalls), rel=1e-12)
            assert p.quality_low <= p.quality <= p.quality_high
            assert p.n_cost == p.n_quality + (1 if split == "dev" else 0)  # q7 (dev) failed: timed, no recall


def test_money_interval_counts_every_query_as_the_cost_module_does() -> None:
    price = ModelPrice(prompt=0.15, completion=0.6)
    variants = [_variant("baseline", 0.0, 3, price), _variant("v1", 0.05, 4, price)]
    variants[1].records[2]["usage"] = None  # a query that reported no usage spent nothing
    t = tradeoff.compute(variants, CompareConfig(B=200), seed=1)
    assert t.cost_metric == "usd_per_1k" and t.cost_unit == "USD"
    for v in variants:
        p = t.split("dev").point(v.label)  # type: ignore[union-attr]
        assert p is not None
        assert p.cost == pytest.approx(
            cost.cost_metrics(v.records, "dev", price=price)["usd_per_1k"], rel=1e-12
        )
        groups = sorted({r["group"] for r in v.records if r["split"] == "dev"})
        lo, hi = _brute_interval(v, "dev", groups, lambda r: cost.query_usd(r, price) * 1000, None, 200, 1)
        assert (p.cost_low, p.cost_high) == pytest.approx((lo, hi), rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-50, 50, allow_nan=False), min_size=1, max_size=12),
    st.data(),
    st.sampled_from([0.0, 5.0, 37.5, 50.0, 95.0, 100.0]),
)
def test_weighted_percentile_equals_numpy_on_the_expanded_sample(
    values: list[float], data: st.DataObject, q: float
) -> None:
    weights = data.draw(st.lists(st.integers(0, 4), min_size=len(values), max_size=len(values)))
    w = np.array([weights], dtype=np.int64)
    got = tradeoff.weighted_stat(np.array(values), w, q)[0]
    got_mean = tradeoff.weighted_stat(np.array(values), w, None)[0]
    expanded = [v for v, k in zip(values, weights, strict=True) for _ in range(k)]
    if not expanded:
        assert math.isnan(got) and math.isnan(got_mean)
    else:
        assert got == pytest.approx(float(np.percentile(expanded, q)), rel=1e-9, abs=1e-9)
        assert got_mean == pytest.approx(float(np.mean(expanded)), rel=1e-9, abs=1e-9)


# --------------------------------------------------------------------------- choices and config


def test_auto_metrics_prefer_money_then_latency_then_tokens() -> None:
    priced = [
        _variant("baseline", 0.0, 1, ModelPrice(prompt=1.0)),
        _variant("v", 0.1, 2, ModelPrice(prompt=1.0)),
    ]
    assert tradeoff.choose_metrics(priced, CompareConfig(), ["dev"]) == ("recall_at_5", "usd_per_1k")
    timed = [_variant("baseline", 0.0, 1), _variant("v", 0.1, 2)]
    assert tradeoff.choose_metrics(timed, CompareConfig(), ["dev"]) == ("recall_at_5", "latency_p95_ms")
    for v in timed:
        for r in v.records:
            r["timings_ms"] = {}
            r["metrics"].pop("latency_ms")
    assert tradeoff.choose_metrics(timed, CompareConfig(), ["dev"]) == ("recall_at_5", "context_tokens")
    chosen = CompareConfig(quality_metric="ndcg_at_10", cost_metric="route_p50_ms")
    assert tradeoff.choose_metrics(timed, chosen, ["dev"]) == ("ndcg_at_10", "route_p50_ms")


def test_bad_metric_names_fail_when_the_config_is_checked() -> None:
    with pytest.raises(UnknownNameError, match="recall_at_<k>"):
        tradeoff.check_settings(CompareConfig(quality_metric="recal_at_5"))
    with pytest.raises(ConfigError, match="latency_p95_ms"):
        tradeoff.check_settings(CompareConfig(cost_metric="speed"))
    with pytest.raises(ConfigError, match="finite"):
        tradeoff.check_settings(CompareConfig(quality_bar=math.inf))
    tradeoff.check_settings(CompareConfig(cost_metric="ttft_p95_ms", quality_bar=0.85))


def test_bar_gives_the_choice_and_cost_ratios() -> None:
    variants = [_variant("baseline", 0.0, 1), _variant("cheap", -0.2, 2), _variant("good", 0.3, 3)]
    t = tradeoff.compute(
        variants, CompareConfig(B=300, cost_metric="context_tokens", quality_bar=0.5), seed=0
    )
    for s in t.splits:
        clear = [p for p in s.points if p.clears_bar]
        assert all(p.quality_low >= 0.5 for p in clear)
        assert all(p.quality_low < 0.5 for p in s.points if not p.clears_bar)
        if clear:
            best = min(clear, key=lambda p: p.cost)
            assert s.choice == best.variant
            for p in s.points:
                assert p.cost_ratio == pytest.approx(p.cost / best.cost)
    md = tradeoff.format_markdown(t)
    assert "cheapest variant with holdout recall@5 >= 0.500" in md or "no variant clears holdout" in md
    d = t.to_dict()
    assert d["plot_split"] == "holdout" and d["quality_bar"] == 0.5
    assert {p["variant"] for p in d["splits"][0]["points"]} == {"baseline", "cheap", "good"}


# --------------------------------------------------------------------------- the plot


def test_plot_is_a_real_png_with_cjk_labels(tmp_path: Path) -> None:
    from PIL import Image

    variants = [_variant("baseline", 0.0, 1), _variant("分块=256", -0.1, 2), _variant("chunk=1024", 0.2, 3)]
    t = tradeoff.compute(variants, CompareConfig(B=200, quality_bar=0.6), seed=0)
    path = report_plots.plot(t, tmp_path / tradeoff.PLOT_FILE, labels={"baseline": "baseline (chunk=512)"})
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 20_000
    with Image.open(path) as im:
        w, h = im.size
        assert w >= 600 and h >= 400
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50  # markers, bars, frontier, bar line, anti-aliased text


@pytest.mark.slow
def test_plotting_logs_no_font_lookups(tmp_path: Path) -> None:
    """A sweep logs at INFO (Hydra's logging): drawing the plot must not add matplotlib's font
    lookup lines ("findfont: Failed to find font weight normal ...") to the user's terminal."""
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO); "
        "from rag_ablate.report import plots as report_plots; plt = report_plots.pyplot(); "
        "fig, ax = plt.subplots(); ax.set_title('分块 chunk', weight='bold'); ax.set_xlabel('延迟 ms'); "
        "report_plots.save_figure(fig, __import__('pathlib').Path(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "p.png")],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert "findfont" not in out.stderr, out.stderr


@pytest.mark.slow
def test_a_plain_import_does_not_load_matplotlib() -> None:
    code = (
        "import sys, rag_ablate.compare.tradeoff, rag_ablate.report.html, rag_ablate.sweep.driver, "
        "rag_ablate.run.runner; "
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_variant_whose_queries_all_failed_has_no_quality_and_is_off_the_frontier(tmp_path: Path) -> None:
    import json

    broken = _variant("broken", 0.0, 5)
    broken.info = {}
    for r in broken.records:
        r["status"] = "failed"
        r["metrics"] = {"latency_ms": r["metrics"]["latency_ms"]}
    variants = [_variant("baseline", 0.0, 1), broken]
    t = tradeoff.compute(variants, CompareConfig(B=200, quality_bar=0.1), seed=0)
    p = t.split("holdout").point("broken")  # type: ignore[union-attr]
    assert p is not None and p.n_quality == 0 and math.isnan(p.quality) and math.isnan(p.quality_low)
    assert p.n_cost > 0 and math.isfinite(p.cost)  # failed queries are still timed
    assert not p.frontier and p.clears_bar is False
    assert t.split("holdout").choice == "baseline"  # type: ignore[union-attr]
    d = json.loads(json.dumps(t.to_dict()))  # NaN becomes null
    assert [q["quality"] for q in d["splits"][1]["points"] if q["variant"] == "broken"] == [None]
    assert "| broken | - [-, -] |" in tradeoff.format_markdown(t)
    assert report_plots.plot(t, tmp_path / "p.png").is_file()


# --------------------------------------------------------------------------- cost against the baseline


def test_cost_effect_is_the_paired_bootstrap_of_the_cost_difference() -> None:
    """Each variant's cost minus the baseline's, its interval from the resamples both share."""
    variants = [_variant("baseline", 0.0, 1), _variant("v1", 0.1, 2)]
    B, seed = 300, 7
    t = tradeoff.compute(variants, CompareConfig(B=B, cost_metric="latency_p95_ms"), seed=seed)
    for split in ("dev", "holdout"):
        s = t.split(split)
        assert s is not None
        base, p = s.point("baseline"), s.point("v1")
        assert base is not None and p is not None
        assert (base.cost_effect, base.cost_effect_low, base.cost_effect_high) == (0.0, 0.0, 0.0)
        assert p.cost_effect == pytest.approx(p.cost - base.cost, rel=1e-12)
        groups = sorted({r["group"] for r in variants[0].records if r["split"] == split})
        rng = np.random.default_rng(split_draw(seed, split, groups).seed)
        draws = rng.integers(0, len(groups), size=(B, len(groups)))
        index = {g: i for i, g in enumerate(groups)}

        def p95(v: VariantData, counts: Any, split: str = split, index: dict[str, int] = index) -> float:
            rows = [r for r in v.records if r["split"] == split]
            return float(
                np.percentile(
                    [cost.query_latency_ms(r) for r in rows for _ in range(counts[index[r["group"]]])], 95
                )
            )

        diffs = []
        for b in range(B):
            counts = np.bincount(draws[b], minlength=len(groups))
            diffs.append(p95(variants[1], counts) - p95(variants[0], counts))
        lo, hi = np.percentile(diffs, [2.5, 97.5])
        assert (p.cost_effect_low, p.cost_effect_high) == pytest.approx((lo, hi), rel=1e-9)


def test_latency_cost_is_the_time_the_comparison_compares() -> None:
    """After the interleaved timing pass (records' latency_ms replaced), the plotted p95 is that
    pass's, as in the comparison's latency rows, not the job's own timings_ms.total."""
    variants = [_variant("baseline", 0.0, 1), _variant("v1", 0.1, 2)]
    for v in variants:
        for r in v.records:
            r["metrics"]["latency_ms"] = 1.0 + len(r["query_id"])  # the pass's time, not timings_ms.total
    t = tradeoff.compute(variants, CompareConfig(B=200, cost_metric="latency_p95_ms"), seed=0)
    p = t.split("dev").point("v1")  # type: ignore[union-attr]
    times = [r["metrics"]["latency_ms"] for r in variants[1].records if r["split"] == "dev"]
    assert p is not None and p.cost == pytest.approx(float(np.percentile(times, 95)))


def test_the_axes_are_chosen_once_and_kept_on_the_comparison() -> None:
    from rag_ablate.compare.analysis import compare

    price = ModelPrice(prompt=1e-6)
    variants = [_variant("baseline", 0.0, 1, price), _variant("v1", 0.1, 2, price)]
    c = compare(variants, metrics=["recall_at_5"], splits=["dev", "holdout"], B=200)
    tradeoff.attach(c, variants, CompareConfig(B=200), seed=0)
    assert (c.quality_metric, c.cost_metric) == ("recall_at_5", "usd_per_1k")  # no answers; priced: money
    assert c.tradeoff is not None
    assert (c.tradeoff.quality_metric, c.tradeoff.cost_metric) == (c.quality_metric, c.cost_metric)
    again = type(c).from_dict(c.to_dict())
    assert (again.quality_metric, again.cost_metric) == ("recall_at_5", "usd_per_1k")
    v1 = again.tradeoff.split("dev").point("v1")  # type: ignore[union-attr]
    assert v1 is not None and math.isfinite(v1.cost_effect) and v1.cost_effect_low <= v1.cost_effect_high
