"""One draw per split, one sign stream per test (issue 28 item 2): a subset's bootstrap taken as a
domain of the split's draw agrees with a bootstrap of the subset alone, and sign-flip tests whose
columns share their random signs keep each column's null distribution (docs/statistics.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as sps

from rag_ablate.compare import run, stats, tradeoff
from rag_ablate.compare.analysis import compare, split_draw
from rag_ablate.compare.draws import SharedDraws, domain_ratios
from rag_ablate.compare.mix import mix_columns, mix_weights, pick_mixes
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.slices import compare_slices
from rag_ablate.config.schema import CompareConfig
from rag_ablate.dataset.weights import TagWeights


def _data(n_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, n_groups)
    labels = [f"g{i:04d}" for i in range(n_groups) for _ in range(sizes[i])]
    effect = np.repeat(rng.normal(0.0, 0.3, n_groups), sizes)  # a group effect: groups matter
    b = rng.random(len(labels))
    v = b + 0.05 + effect + rng.normal(0.0, 0.2, len(labels))
    return b, v, labels


def test_a_slice_as_a_domain_of_the_split_draw_matches_its_own_bootstrap() -> None:
    b, v, labels = _data(600, 1)
    in_slice = np.array([int(g[1:]) % 7 == 0 for g in labels])  # 86 of the 600 groups
    groups = [g for g, s in zip(labels, in_slice, strict=True) if s]
    sb, sv = b[in_slice], v[in_slice]
    B = 4_000
    draw = split_draw(0, "dev", labels)
    shared = SharedDraws(B)
    theta = draw.add(shared, groups, stats.group_sums_sizes(sv - sb, np.array(groups)), domain_ratios)
    shared.run()
    domain = stats.paired_test(sb, sv, np.array(groups), B=B, seed=5, theta=theta.result())
    own = stats.paired_test(sb, sv, np.array(groups), B=B, seed=5)
    assert domain.n_groups == own.n_groups == 86 and domain.n_resamples == B  # no empty resample
    assert domain.effect[0] == own.effect[0]  # the estimate itself does not resample
    # the bootstrap SE: equal in expectation (both near the linearised SE); Monte Carlo error of an
    # SE from 4,000 resamples is about 1 / sqrt(2 B) = 1.1%
    lin = stats.linearized_se(sv - sb, np.array(groups))[0]
    assert domain.se[0] == pytest.approx(own.se[0], rel=0.08)
    assert domain.se[0] == pytest.approx(lin, rel=0.08)
    assert domain.boot_ci_low[0] == pytest.approx(own.boot_ci_low[0], abs=0.25 * own.se[0])
    assert domain.boot_ci_high[0] == pytest.approx(own.boot_ci_high[0], abs=0.25 * own.se[0])
    # the sign-flip p and its interval do not use the draw
    assert (domain.p_value[0], domain.ci_low[0]) == (own.p_value[0], own.ci_low[0])


def test_resamples_that_draw_none_of_a_small_domain_are_left_out() -> None:
    b, v, labels = _data(100, 2)
    in_slice = np.array([g in ("g0003", "g0040", "g0077") for g in labels])
    groups = [g for g, s in zip(labels, in_slice, strict=True) if s]
    B = 2_000
    draw = split_draw(0, "dev", labels)
    shared = SharedDraws(B)
    sums_sizes = stats.group_sums_sizes(v[in_slice] - b[in_slice], np.array(groups))
    theta = draw.add(shared, groups, sums_sizes, domain_ratios)  # 3 of 100 groups: gathered
    shared.run()
    drawn = theta.result()
    empty = int(np.isnan(drawn[:, 0]).sum())
    # P(a resample misses all 3 groups) = 0.97 ** 100 = 4.8%: about 95 of 2,000
    assert 50 < empty < 150
    res = stats.paired_test(b[in_slice], v[in_slice], np.array(groups), B=B, theta=drawn)
    assert res.n_resamples == B - empty and np.isfinite(res.se[0]) and np.isfinite(res.boot_ci_low[0])


@pytest.mark.slow
def test_shared_sign_vectors_keep_every_columns_null_distribution() -> None:
    """A/A: 5 metric columns per dataset, one sign stream for all; each column's p is uniform (KS)
    and rejects at about alpha."""
    rng = np.random.default_rng(11)
    n_groups, reps, B = 40, 300, 400
    ps = np.empty((reps, 5))
    for r in range(reps):
        g = np.repeat(np.arange(n_groups), 2)
        base = rng.random((g.size, 5))
        var = (
            base + rng.normal(0.0, 0.1, (g.size, 5)) + np.repeat(rng.normal(0, 0.1, (n_groups, 5)), 2, axis=0)
        )
        ps[r] = stats.paired_test(base, var, g, B=B, seed=r).p_value
    for j in range(5):
        assert sps.kstest(ps[:, j], "uniform").pvalue > 0.001, j
        assert 0.02 < np.mean(ps[:, j] < 0.05) < 0.09, j


@pytest.mark.parametrize("every", [7, 23])  # 86 of 600 groups (in the split's product), 27 (gathered)
def test_a_slices_sign_flip_test_from_the_splits_one_sign_stream_matches_its_own_stream(every: int) -> None:
    """Every sign-flip test of a split takes its groups' signs from the split's one stream: a slice's
    p and interval agree with those of its own stream within Monte Carlo error, and a test over all the
    split's groups draws exactly the vectors of ``paired_test(signflip_seed=draw.sign_seed)``."""
    b, v, labels = _data(600, 3)
    in_slice = np.array([int(g[1:]) % every == 0 for g in labels])
    groups = np.array([g for g, s in zip(labels, in_slice, strict=True) if s])
    sb, sv = b[in_slice], v[in_slice] - 0.04  # an effect near the edge of the interval: p not 0 or 1
    B = 4_000
    draw = split_draw(0, "dev", labels)
    shared = SharedDraws(B)
    signs = draw.add_signs(shared, groups.tolist(), stats.group_sums_sizes(sv - sb, groups))
    whole = draw.add_signs(shared, labels, stats.group_sums_sizes(v - b, np.array(labels)))
    assert signs is not None and whole is not None
    shared.run()
    got = stats.paired_test(sb, sv, groups, B=B, seed=5, signs=signs.result())
    own = stats.paired_test(sb, sv, groups, B=B, seed=5)
    assert got.n_groups == own.n_groups == len(set(groups.tolist())) > 20
    assert got.effect[0] == own.effect[0] and got.se[0] == own.se[0]  # the bootstrap is not the signs'
    # Monte Carlo SD of the difference of two p from independent streams of B vectors
    p = own.p_value[0]
    assert 0.01 < p < 0.99 and abs(got.p_value[0] - p) < 4 * np.sqrt(2 * p * (1 - p) / B)
    assert got.ci_low[0] == pytest.approx(own.ci_low[0], abs=0.15 * own.se[0])
    assert got.ci_high[0] == pytest.approx(own.ci_high[0], abs=0.15 * own.se[0])
    full = stats.paired_test(b, v, np.array(labels), B=B, signs=whole.result())
    alone = stats.paired_test(b, v, np.array(labels), B=B, signflip_seed=draw.sign_seed)
    assert full.p_value[0] == alone.p_value[0]
    assert full.ci_low[0] == pytest.approx(alone.ci_low[0], rel=1e-9)
    assert full.ci_high[0] == pytest.approx(alone.ci_high[0], rel=1e-9)


def test_a_test_with_few_groups_enumerates_its_signs_instead_of_taking_the_stream() -> None:
    b, v, labels = _data(200, 4)
    in_slice = np.array([g in ("g0003", "g0040", "g0077", "g0100") for g in labels])
    groups = [g for g, s in zip(labels, in_slice, strict=True) if s]
    shared = SharedDraws(1_000)
    sums_sizes = stats.group_sums_sizes(v[in_slice] - b[in_slice], np.array(groups))
    assert split_draw(0, "dev", labels).add_signs(shared, groups, sums_sizes) is None  # 2**4 <= B
    sb, sv, g = b[in_slice], v[in_slice], np.array(groups)
    res = stats.paired_test(sb, sv, g, B=1_000, signs=np.zeros((1_000, 2)))  # the zeros are not read
    own = stats.paired_test(sb, sv, g, B=1_000)
    assert res.p_exact[0] and (res.p_value[0], res.ci_low[0]) == (own.p_value[0], own.ci_low[0])


def _variants() -> list[VariantData]:
    """A baseline and a variant over 300 queries in 90 groups, with tags and intents (slices)."""
    rng = np.random.default_rng(8)
    n = 300
    group = rng.integers(0, 90, n)
    tags = [["edge"] if i % 5 == 0 else ["numeric"] if i % 3 == 0 else [] for i in range(n)]
    variants = []
    for job, gain in enumerate((0.0, 0.08)):
        recs = []
        for i in range(n):
            hit = float(rng.random() < 0.5 + gain)
            recs.append(
                {
                    "query_id": f"q{i:03d}", "split": "dev" if i % 4 else "holdout", "group": f"g{group[i]}",
                    "status": "ok", "tags": tags[i], "intent_gold": "K_a" if i % 2 else "K_b",
                    "intent_gold_l1": "KNOWLEDGE",
                    "metrics": {"recall_at_5": hit, "latency_ms": float(rng.lognormal(3, 0.3))},
                }
            )  # fmt: skip
        variants.append(
            VariantData("baseline" if job == 0 else "v", recs, info={"role": "baseline"} if not job else {})
        )
    return variants


def test_the_comparison_its_slices_and_its_trade_off_on_one_draw_equal_each_computed_alone() -> None:
    """``run.statistics`` plans the comparison, its slices and its trade-off on one draw per split
    and one sign stream per split: each number equals the one its own step computes on its own draws
    (the same seeds), up to rounding (the products take other columns beside them)."""
    variants = _variants()
    settings = CompareConfig(B=300, metrics=["recall_at_5", "latency_p95_ms"], min_slice_groups=6)
    together = run.statistics(variants, settings, seed=4)
    alone = compare(variants, metrics=settings.metrics, B=300, seed=4)
    alone.slices = compare_slices(variants, alone, metrics=["recall_at_5"], min_groups=6)
    tradeoff_alone = tradeoff.compute(
        variants, tradeoff.settle_axes(variants, settings, alone.splits), seed=4
    )
    assert together.slices is not None and alone.slices is not None and together.tradeoff is not None
    assert (
        len(together.rows) == len(alone.rows) == 4 and len(together.slices.rows) == len(alone.slices.rows) > 4
    )
    pairs = [
        *zip(together.rows, alone.rows, strict=True),
        *zip(together.slices.rows, alone.slices.rows, strict=True),
    ]
    for got, want in pairs:
        for name in ("effect", "ci_low", "ci_high", "p_value"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-12), name
    for got_t, want_t in zip(together.rows, alone.rows, strict=True):
        assert got_t.se == pytest.approx(want_t.se, rel=1e-9)
    for got_p, want_p in zip(together.tradeoff.splits, tradeoff_alone.splits, strict=True):
        for a, b in zip(got_p.points, want_p.points, strict=True):
            assert (a.variant, a.frontier) == (b.variant, b.frontier)
            for name in ("quality", "quality_low", "quality_high", "cost", "cost_low", "cost_high"):
                assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-9), name


def test_the_numbers_do_not_depend_on_how_many_threads_stream_the_draws(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = CompareConfig(B=300, metrics=["recall_at_5", "latency_p95_ms"], min_slice_groups=6)
    out = []
    for threads in ("1", "2"):
        monkeypatch.setenv("RAG_ABLATE_DRAW_THREADS", threads)
        c = run.statistics(_variants(), settings, seed=4)
        out.append(json.dumps(c.to_dict(), sort_keys=True))
    assert out[0] == out[1]


def test_a_domain_given_as_group_codes_takes_the_same_rows_as_given_as_labels() -> None:
    labels = [f"g{i:03d}" for i in range(40)]
    draw = split_draw(0, "dev", labels)
    rng = np.random.default_rng(3)
    for size in (5, 39):  # a gathered domain (few groups) and a dense one (most groups, zero rows)
        picked = sorted(rng.choice(40, size, replace=False).tolist())
        groups = [labels[i] for i in picked for _ in range(2)]  # each group twice, out of order below
        rng.shuffle(groups)
        cols = rng.random((size, 2))
        from_codes = draw._domain(draw.codes(groups), cols)
        from_labels = draw._domain(groups, cols)
        for got, want in zip(from_codes, from_labels, strict=True):
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_array_equal(got, want)


def test_mix_weights_picked_per_subset_from_the_splits_columns_equal_mix_weights_of_the_subset() -> None:
    tw = TagWeights({"numeric": 0.5}, ("edge",))
    tags = [["numeric"], [], ["edge"], ["numeric", "edge"], ["other"], []]
    w, edge = mix_columns(tags, tw)
    for keep in ([0, 1, 2, 3, 4, 5], [0, 1, 4], [2, 3], []):  # both mixes, production only, edge, none
        mask = np.isin(np.arange(len(tags)), keep)
        names, cols = pick_mixes(w[mask], edge[mask])
        want_names, want_cols = mix_weights([tags[i] for i in keep], tw)
        assert names == want_names
        assert (cols is None) == (want_cols is None)
        if want_cols is not None:
            np.testing.assert_array_equal(cols, want_cols)
