"""Tests of rag_ablate.compare.stats against the reference vectors, scipy, brute force and properties.

Reference vectors: ``../shared/design/stats-vectors.json`` (through ``shared_path``: the
tests skip locally without ``../shared`` and fail in CI). Every value in it is checked
below, except these, which the comparison does not compute on purpose:

* ``*BCa*``, ``ci_bca``, ``bca_z0``, ``bca_a`` -- BCa intervals are optional in the
  design and not implemented; the secondary interval is the percentile one.
* ``*basic_ci``, ``ci_symmetric_basic`` -- basic (reverse-percentile) intervals are not
  reported.
* ``p_shift``, ``p_shift_plus1``, ``p_urbano_centered``, ``p_studentized_sakai`` --
  alternative bootstrap p-values; the reported p is the group sign-flip test and the
  reference-only bootstrap p is ``p_sign_reversal_x2`` (tested).
* ``wilcoxon_p`` -- the Wilcoxon signed-rank test is not part of the comparison.
* ``meta.numpy`` / ``meta.scipy`` -- versions the vectors were made with, not values;
  ``meta.diff`` and ``meta.rng`` state conventions the tests follow (d = variant -
  baseline; bootstrap draws in ``rng.integers(0, n, (B, n))`` order).
* ``p_sign_reversal_x2`` of ``sakai_table5_1_n20`` is checked as a bracket, not to
  1e-12: the reference lost some exact zeros of theta* to decimal rounding (see
  ``test_seeded_numpy_ref``).

Monte Carlo sign-flip p-values of the vectors (``*_mc_p_B9999``,
``scipy_permutation_test_p_B9999``) come from other random streams, so they are checked
within Monte Carlo error, not to 1e-12.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from rag_ablate.compare.stats import (
    MIN_RELIABLE_GROUPS,
    PairedResult,
    benjamini_hochberg,
    bootstrap_counts,
    derive_seed,
    group_sums,
    holm,
    improved,
    linearized_se,
    paired_test,
    signflip_pvalue,
)
from rag_ablate.core.errors import ComparisonError
from tests.conftest import shared_path

TOL = 1e-12
PAIRED = ["sakai_table5_1_n20", "intent_acc_binary_n16", "judge_0to5_n12", "clustered_mrr_n14_g6"]
CLUSTERED = "clustered_mrr_n14_g6"
FIELDS = ("effect", "se", "ci_low", "ci_high", "boot_ci_low", "boot_ci_high", "p_value", "p_bootstrap")


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    path = shared_path("design", "stats-vectors.json")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _pair(vectors: dict[str, Any], name: str) -> tuple[np.ndarray, np.ndarray]:
    inp = vectors[name]["input"]
    return np.asarray(inp["baseline"], dtype=float), np.asarray(inp["variant"], dtype=float)


# --------------------------------------------------------------------------- exact reference values


@pytest.mark.parametrize("name", PAIRED)
def test_mean_diff_exact(vectors: dict[str, Any], name: str) -> None:
    b, v = _pair(vectors, name)
    ex = vectors[name]["exact"]
    r = paired_test(b, v, None, B=200, seed=1)
    assert r.effect.shape == (1,)
    assert r.effect[0] == pytest.approx(ex["mean_diff"], abs=TOL)
    assert r.effect[0] == pytest.approx(ex["mean_variant"] - ex["mean_baseline"], abs=TOL)
    assert r.n_queries == ex["n"]
    assert r.n_groups == ex["n"]
    # grouping never changes the pooled effect
    groups = vectors[name]["input"].get("groups")
    if groups is not None:
        assert paired_test(b, v, groups, B=200).effect[0] == pytest.approx(ex["mean_diff"], abs=TOL)


@pytest.mark.parametrize("name", PAIRED)
def test_ideal_bootstrap_se_exact(vectors: dict[str, Any], name: str) -> None:
    b, v = _pair(vectors, name)
    se = linearized_se(v - b)
    assert se.shape == (1,)
    ex = vectors[name]["exact"]
    assert se[0] == pytest.approx(ex["ideal_bootstrap_se"], abs=TOL)
    # the ideal bootstrap SE is the sample SD (ddof=1) rescaled: sd * sqrt(n - 1) / n
    n = ex["n"]
    assert se[0] == pytest.approx(ex["sd_diff"] * np.sqrt(n - 1) / n, abs=TOL)


def test_cluster_se_cr0_exact(vectors: dict[str, Any]) -> None:
    b, v = _pair(vectors, CLUSTERED)
    groups = vectors[CLUSTERED]["input"]["groups"]
    se = linearized_se(v - b, groups)
    ex = vectors[CLUSTERED]["exact"]
    assert se[0] == pytest.approx(ex["cluster_robust_se_CR0"], abs=TOL)
    # the naive query-level SE (sd / sqrt(n)) the design warns about is far smaller
    naive = linearized_se(v - b)[0] * np.sqrt(ex["n"] / (ex["n"] - 1))
    assert naive == pytest.approx(ex["naive_se"], abs=TOL)
    assert se[0] > 1.5 * naive


def test_linearized_se_is_the_ideal_bootstrap_se() -> None:
    """Enumerate all n**n resamples of a small vector: SD of the means == formula."""
    d = np.array([0.7, -0.2, 0.0, 0.25, 1.5, -0.9])
    n = d.size
    idx = np.array(list(itertools.product(range(n), repeat=n)))
    ideal = d[idx].mean(axis=1).std()  # population SD over the exact distribution
    assert linearized_se(d)[0] == pytest.approx(ideal, abs=TOL)


def test_cluster_bootstrap_se_matches_full_enumeration(vectors: dict[str, Any]) -> None:
    """G**G group resamples of the clustered vector give the ideal cluster SE."""
    b, v = _pair(vectors, CLUSTERED)
    groups = vectors[CLUSTERED]["input"]["groups"]
    sums, sizes = group_sums(v - b, groups)
    n_groups = sums.shape[0]
    idx = np.array(list(itertools.product(range(n_groups), repeat=n_groups)))
    counts = np.stack([np.bincount(row, minlength=n_groups) for row in idx])
    ideal = ((counts @ sums[:, 0]) / (counts @ sizes)).std()
    r = paired_test(b, v, groups, B=20_000, seed=3)
    assert r.se[0] == pytest.approx(ideal, rel=0.03)
    # the linearised (CR0) SE is close to, but not the same as, the ideal cluster SE
    assert linearized_se(v - b, groups)[0] == pytest.approx(ideal, rel=0.03)


@pytest.mark.parametrize("name", PAIRED)
def test_signflip_exact_p_query_level(vectors: dict[str, Any], name: str) -> None:
    b, v = _pair(vectors, name)
    ex = vectors[name]["exact"]
    n = ex["n"]
    # exact enumeration needs 2**n <= B
    r = paired_test(b, v, None, B=2**n, seed=0)
    assert bool(r.p_exact[0])
    assert r.p_value[0] == pytest.approx(ex["signflip_exact_p"], abs=TOL)
    assert r.p_value[0] == pytest.approx(ex["scipy_permutation_test_exact_p"], abs=TOL)
    num, den = (int(t) for t in ex["signflip_exact_count"].split("/"))
    assert r.p_value[0] * den == pytest.approx(num, abs=1e-6)
    # the low-level function agrees
    p, exact = signflip_pvalue(v - b, B=2**n, rng=np.random.default_rng(0))
    assert exact
    assert p[0] == pytest.approx(ex["signflip_exact_p"], abs=TOL)


def test_cluster_signflip_exact_p(vectors: dict[str, Any]) -> None:
    b, v = _pair(vectors, CLUSTERED)
    ex = vectors[CLUSTERED]["exact"]
    groups = vectors[CLUSTERED]["input"]["groups"]
    r = paired_test(b, v, groups)  # 2**6 = 64 <= B = 10,000: exact
    assert r.n_groups == ex["n_groups"] == 6
    assert bool(r.p_exact[0])
    assert r.p_value[0] == pytest.approx(ex["cluster_signflip_exact_p"], abs=TOL)
    num, den = (int(t) for t in ex["cluster_signflip_exact_count"].split("/"))
    assert (num, den) == (12, 64)
    assert r.p_value[0] * den == pytest.approx(num, abs=1e-9)
    _, sizes = group_sums(v - b, groups)
    assert sizes.tolist() == ex["group_sizes"]
    # ignoring the groups is what makes it look significant
    naive = paired_test(b, v, None, B=2**14)
    assert naive.p_value[0] == pytest.approx(ex["signflip_exact_p"], abs=TOL)
    assert naive.p_value[0] < 0.01 < 0.05 < r.p_value[0]
    assert r.bootstrap_unreliable


@pytest.mark.parametrize("name", PAIRED)
def test_inverted_interval_of_the_vectors(vectors: dict[str, Any], name: str) -> None:
    """Exact enumeration: the interval's ends are where the exact p crosses alpha."""
    b, v = _pair(vectors, name)
    ex = vectors[name]["exact"]
    n = ex["n"]
    r = paired_test(b, v, None, B=2**n, seed=0)
    p = ex["signflip_exact_p"]
    assert (not r.ci_low[0] <= 0 <= r.ci_high[0]) == (p < 0.05)
    eps = 1e-6

    def p_at(delta: float) -> float:
        p_delta, exact = signflip_pvalue((v - delta) - b, B=2**n, rng=np.random.default_rng(0))
        assert exact
        return float(p_delta[0])

    for end, inward in ((r.ci_low[0], 1.0), (r.ci_high[0], -1.0)):
        assert p_at(end + inward * eps) >= 0.05 > p_at(end - inward * eps)
    if name in ("sakai_table5_1_n20", "judge_0to5_n12"):
        # p just above 0.05 although the percentile bootstrap interval excludes 0; the lower
        # end is exactly 0 (decimal rounding of 0.1-steps is snapped to the breakpoint)
        boot = vectors[name]["seeded"]["numpy_ref"]["ci_percentile"]
        assert boot[0] > 0 and p >= 0.05
        assert r.ci_low[0] == 0.0


@pytest.mark.parametrize("name", PAIRED)
def test_ttest_crosscheck(vectors: dict[str, Any], name: str) -> None:
    """Sanity of the vectors themselves (the t-test is not part of stats.py)."""
    b, v = _pair(vectors, name)
    p = sps.ttest_rel(v, b).pvalue
    assert p == pytest.approx(vectors[name]["exact"]["ttest_rel_p"], rel=1e-9)


def test_multiple_comparisons_vectors(vectors: dict[str, Any]) -> None:
    mc = vectors["multiple_comparisons"]
    np.testing.assert_allclose(holm(mc["p_raw"]), mc["holm"], rtol=0, atol=TOL)
    np.testing.assert_allclose(benjamini_hochberg(mc["p_raw"]), mc["bh"], rtol=0, atol=TOL)
    np.testing.assert_allclose(holm(mc["p_raw"]), mc["statsmodels_holm"], rtol=0, atol=TOL)
    np.testing.assert_allclose(benjamini_hochberg(mc["p_raw"]), mc["statsmodels_fdr_bh"], rtol=0, atol=TOL)
    np.testing.assert_allclose(
        benjamini_hochberg(mc["p_raw"]), mc["scipy_false_discovery_control_bh"], rtol=0, atol=TOL
    )
    # and against scipy's BH, on a shuffled order (results follow the input order)
    rng = np.random.default_rng(5)
    p = np.asarray(mc["p_raw"])[rng.permutation(len(mc["p_raw"]))]
    np.testing.assert_allclose(benjamini_hochberg(p), sps.false_discovery_control(p), atol=TOL)
    order = np.argsort(p)
    np.testing.assert_allclose(holm(p)[order], mc["holm"], atol=TOL)


# --------------------------------------------------------------------------- seeded values


@pytest.mark.parametrize("name", PAIRED)
def test_seeded_numpy_ref(vectors: dict[str, Any], name: str) -> None:
    """B = 9999 draws of default_rng(12345) in scipy's order reproduce numpy_ref."""
    b, v = _pair(vectors, name)
    meta = vectors["meta"]
    seeded = vectors[name]["seeded"]
    ref = seeded["numpy_ref"]
    r = paired_test(b, v, None, B=meta["B"], seed=meta["seed"], alpha=meta["alpha"])
    assert r.n_resamples == meta["B"] == ref["B"]
    assert r.effect[0] == pytest.approx(ref["theta"], abs=TOL)
    assert r.se[0] == pytest.approx(ref["boot_se"], abs=TOL)
    assert r.se[0] == pytest.approx(seeded["scipy_bootstrap_se"], abs=TOL)
    assert r.boot_ci_low[0] == pytest.approx(ref["ci_percentile"][0], abs=TOL)
    assert r.boot_ci_high[0] == pytest.approx(ref["ci_percentile"][1], abs=TOL)
    np.testing.assert_allclose(
        [r.boot_ci_low[0], r.boot_ci_high[0]], seeded["scipy_bootstrap_paired_percentile_ci"], atol=TOL
    )
    # the mean of the B resampled effects from the same draws
    n = b.size
    counts = np.concatenate(list(bootstrap_counts(n, meta["B"], np.random.default_rng(meta["seed"]))))
    assert np.mean(counts @ (v - b) / n) == pytest.approx(ref["boot_mean"], abs=TOL)
    # p_bootstrap = 2 * min share on either side of 0 (zero counting on both sides). The
    # reference computed theta* as means of resampled values, so for sakai's decimal
    # values some exact zeros came out as +-1e-17 and were not counted; we count them.
    if name != "sakai_table5_1_n20":
        assert r.p_bootstrap[0] == pytest.approx(ref["p_sign_reversal_x2"], abs=TOL)
    else:
        # sakai's differences are multiples of 0.05: count signs in exact integer arithmetic
        ticks = np.round((v - b) * 20).astype(np.int64)
        assert np.array_equal(ticks / 20, np.round(v - b, 12))
        s = counts.astype(np.int64) @ ticks
        below, zero, above = int(np.sum(s < 0)), int(np.sum(s == 0)), int(np.sum(s > 0))
        assert r.p_bootstrap[0] == pytest.approx(2 * min(below + zero, above + zero) / meta["B"], abs=TOL)
        # the reference lies between counting no exact zero and counting all of them
        assert 2 * min(below, above) / meta["B"] < ref["p_sign_reversal_x2"] < r.p_bootstrap[0]


def test_seeded_numpy_ref_cluster(vectors: dict[str, Any]) -> None:
    b, v = _pair(vectors, CLUSTERED)
    meta = vectors["meta"]
    seeded = vectors[CLUSTERED]["seeded"]
    ref = seeded["numpy_ref_cluster"]
    groups = vectors[CLUSTERED]["input"]["groups"]
    r = paired_test(b, v, groups, B=meta["B"], seed=meta["seed"])
    assert r.n_resamples == ref["B"]
    assert r.effect[0] == pytest.approx(ref["theta"], abs=TOL)
    assert r.se[0] == pytest.approx(ref["boot_se"], abs=TOL)
    assert r.se[0] == pytest.approx(seeded["scipy_cluster_bootstrap_se"], abs=TOL)
    assert r.boot_ci_low[0] == pytest.approx(ref["ci_percentile"][0], abs=TOL)
    assert r.boot_ci_high[0] == pytest.approx(ref["ci_percentile"][1], abs=TOL)
    np.testing.assert_allclose(
        [r.boot_ci_low[0], r.boot_ci_high[0]], seeded["scipy_cluster_bootstrap_percentile_ci"], atol=TOL
    )
    sums, sizes = group_sums(v - b, groups)
    counts = np.concatenate(list(bootstrap_counts(6, meta["B"], np.random.default_rng(meta["seed"]))))
    theta = (counts @ sums[:, 0]) / (counts @ sizes)
    assert np.mean(theta) == pytest.approx(ref["boot_mean"], abs=TOL)
    assert r.p_bootstrap[0] == pytest.approx(ref["p_sign_reversal_x2"], abs=TOL)


def test_against_scipy_bootstrap(vectors: dict[str, Any]) -> None:
    """Independent draws: SE and percentile CI agree with scipy within MC error."""
    b, v = _pair(vectors, "sakai_table5_1_n20")

    def mean_diff(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        return np.asarray(np.mean(y - x, axis=axis))

    ref = sps.bootstrap(
        (b, v),
        mean_diff,
        paired=True,
        vectorized=True,
        method="percentile",
        n_resamples=10_000,
        rng=np.random.default_rng(2024),
    )
    r = paired_test(b, v, None, B=10_000, seed=7)
    assert r.se[0] == pytest.approx(ref.standard_error, rel=0.05)
    assert r.boot_ci_low[0] == pytest.approx(ref.confidence_interval.low, abs=0.011)
    assert r.boot_ci_high[0] == pytest.approx(ref.confidence_interval.high, abs=0.011)


def test_monte_carlo_signflip_close_to_exact(vectors: dict[str, Any]) -> None:
    b, v = _pair(vectors, "sakai_table5_1_n20")
    r = paired_test(b, v, None, B=20_000, seed=11)  # 2**20 > 20,000: Monte Carlo
    assert not bool(r.p_exact[0])
    exact = vectors["sakai_table5_1_n20"]["exact"]["signflip_exact_p"]
    assert r.p_value[0] == pytest.approx(exact, abs=0.006)  # ~3.5 MC standard errors


@pytest.mark.parametrize("name", PAIRED)
def test_monte_carlo_p_of_the_vectors_within_mc_error(vectors: dict[str, Any], name: str) -> None:
    """The vectors' B = 9999 Monte Carlo p-values used other streams: agree within MC error."""
    b, v = _pair(vectors, name)
    seeded = vectors[name]["seeded"]
    groups = vectors[name]["input"].get("groups")
    refs = [("scipy_permutation_test_p_B9999", None), ("numpy_signflip_mc_p_B9999", None)]
    if groups is not None:
        refs.append(("numpy_cluster_signflip_mc_p_B9999", groups))
    for key, g in refs:
        r = paired_test(b, v, g, B=9_999, seed=vectors["meta"]["seed"])
        p_ref = seeded[key]
        # two independent estimates (or one exact): 4 standard errors of their difference
        sd = np.sqrt(2 * p_ref * (1 - p_ref) / 9_999)
        assert abs(r.p_value[0] - p_ref) <= 4 * sd + 1e-4, key


# --------------------------------------------------------------------------- API behaviour


def test_exact_switch_at_two_to_the_g() -> None:
    rng = np.random.default_rng(0)
    for n_groups, exact in [(13, True), (14, False)]:
        d = rng.normal(size=n_groups)
        r = paired_test(np.zeros(n_groups), d, None, B=10_000, seed=0)
        assert bool(r.p_exact[0]) is exact
        if exact:
            assert (r.p_value[0] * 2**13) == pytest.approx(round(r.p_value[0] * 2**13), abs=1e-9)


def test_multi_metric_matches_single_columns() -> None:
    rng = np.random.default_rng(1)
    n, m = 300, 4
    groups = rng.integers(0, 90, n)
    base = rng.random((n, m))
    var = base + rng.normal(0.02, 0.1, (n, m))
    var[:, 2] = base[:, 2]  # one metric identical
    r = paired_test(base, var, groups, B=1_000, seed=9)
    assert r.effect.shape == r.se.shape == r.p_value.shape == (m,)
    assert r.effect[2] == 0 and r.ci_low[2] == r.ci_high[2] == 0 and r.p_value[2] == 1
    assert not np.any(r.p_exact[[0, 1, 3]])  # 2**G > B: Monte Carlo, one stream shared by the columns
    shared = derive_seed(9, "signflip")
    for j in range(m):
        # every column's sign vectors come from the one stream derive_seed(seed, "signflip") ...
        rj = paired_test(base[:, j], var[:, j], groups, B=1_000, seed=9, signflip_seed=shared)
        for field in FIELDS:  # (products of all columns at once against byte-table lookups: rounding)
            assert getattr(r, field)[j] == pytest.approx(getattr(rj, field)[0], rel=1e-9, abs=1e-12), field
        # ... which is what signflip_pvalue draws from a generator with that seed
        sums, _ = group_sums(var[:, j] - base[:, j], groups)
        p, exact = signflip_pvalue(sums, B=1_000, rng=np.random.default_rng(shared))
        assert not exact and p[0] == pytest.approx(r.p_value[j], abs=1e-12)


def test_adding_a_metric_never_changes_another_metrics_result() -> None:
    """A6: with explicit per-metric seeds, p and interval of a metric ignore the other columns."""
    rng = np.random.default_rng(8)
    n = 240
    groups = rng.integers(0, 70, n)
    base = rng.random((n, 3))
    var = base + rng.normal(0.03, 0.2, (n, 3))
    seeds = [derive_seed(7, "holdout", "variant-a", metric) for metric in ("recall@5", "mrr", "ndcg@10")]
    full = paired_test(base, var, groups, B=2_000, seed=1, signflip_seeds=seeds)
    part = paired_test(
        base[:, [2, 0]], var[:, [2, 0]], groups, B=2_000, seed=1, signflip_seeds=seeds[::2][::-1]
    )
    for field in ("p_value", "ci_low", "ci_high"):
        assert getattr(part, field)[0] == pytest.approx(getattr(full, field)[2], abs=1e-12), field
        assert getattr(part, field)[1] == pytest.approx(getattr(full, field)[0], abs=1e-12), field
    # by default the columns share one stream, seeded derive_seed(seed, "signflip")
    default = paired_test(base, var, groups, B=2_000, seed=1)
    explicit = paired_test(base, var, groups, B=2_000, seed=1, signflip_seed=derive_seed(1, "signflip"))
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(default, field), getattr(explicit, field))


def test_shared_counts_equal_own_draw() -> None:
    rng = np.random.default_rng(2)
    n = 200
    groups = np.repeat(np.arange(50), 4)
    base, var = rng.random(n), rng.random(n)
    seed = derive_seed(0, "holdout")
    shared = list(bootstrap_counts(50, 2_000, np.random.default_rng(seed)))
    a = paired_test(base, var, groups, B=2_000, seed=seed)
    b = paired_test(base, var, groups, B=2_000, seed=seed, counts=shared)
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    with pytest.raises(ComparisonError, match="shape"):
        paired_test(base[:100], var[:100], groups[:100], counts=shared)


def test_bootstrap_counts_shape_and_draws() -> None:
    chunks = list(bootstrap_counts(7, 1_001, np.random.default_rng(4), chunk=250))
    assert [c.shape for c in chunks] == [(250, 7)] * 4 + [(1, 7)]
    allc = np.concatenate(chunks).astype(np.int64)
    assert np.all(allc.sum(axis=1) == 7)
    idx = np.random.default_rng(4).integers(0, 7, (1_001, 7))
    expected = np.stack([np.bincount(row, minlength=7) for row in idx])
    np.testing.assert_array_equal(allc, expected)
    assert chunks[0].dtype == np.uint8
    assert next(bootstrap_counts(3_000, 1, np.random.default_rng(0))).dtype == np.uint16
    with pytest.raises(ComparisonError):
        next(bootstrap_counts(0, 10, np.random.default_rng(0)))
    with pytest.raises(ComparisonError):
        next(bootstrap_counts(5, 0, np.random.default_rng(0)))


def test_group_sums_labels_and_codes() -> None:
    d = np.array([[1.0, 10.0], [2.0, 20.0], [4.0, 40.0], [8.0, 80.0]])
    sums, sizes = group_sums(d, ["b", "a", "b", "c"])
    np.testing.assert_array_equal(sums, [[2.0, 20.0], [5.0, 50.0], [8.0, 80.0]])
    np.testing.assert_array_equal(sizes, [1, 2, 1])
    sums1, sizes1 = group_sums(d[:, 0], np.array([2, 0, 2, 1]))
    assert sums1.shape == (3, 1)
    np.testing.assert_array_equal(sums1[:, 0], [2.0, 8.0, 5.0])
    np.testing.assert_array_equal(sizes1, [1, 1, 2])
    # non-contiguous codes are refactorised: no empty groups
    _, sizes2 = group_sums(d[:, 0], np.array([0, 5, 5, 9]))
    np.testing.assert_array_equal(sizes2, [1, 2, 1])


def test_bootstrap_unreliable_threshold() -> None:
    rng = np.random.default_rng(0)
    few = MIN_RELIABLE_GROUPS - 1
    d = rng.normal(size=few)
    assert paired_test(np.zeros(few), d, None, B=100).bootstrap_unreliable
    d = rng.normal(size=MIN_RELIABLE_GROUPS)
    assert not paired_test(np.zeros(MIN_RELIABLE_GROUPS), d, None, B=100).bootstrap_unreliable


def test_result_is_read_only() -> None:
    r = paired_test([0.0, 1.0, 0.5], [1.0, 1.0, 0.0], None, B=50)
    assert isinstance(r, PairedResult)
    with pytest.raises(ValueError):
        r.effect[0] = 3.0


def test_improved_direction() -> None:
    e = np.array([-0.1, 0.0, 0.2])
    np.testing.assert_array_equal(improved(e, "higher"), [False, False, True])
    np.testing.assert_array_equal(improved(e, "lower"), [True, False, False])
    with pytest.raises(ComparisonError):
        improved(e, "up")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("baseline", "variant", "groups", "kwargs", "match"),
    [
        ([1.0, 2.0], [1.0, 2.0, 3.0], None, {}, "not aligned"),
        ([1.0, float("nan")], [1.0, 2.0], None, {}, "non-finite"),
        ([1.0, 2.0], [1.0, float("inf")], None, {}, "non-finite"),
        ([], [], None, {}, "empty"),
        ([1.0, 2.0], [1.0, 2.0], ["a"], {}, "length"),
        ([1.0, 2.0], [1.0, 2.0], [1.0, float("nan")], {}, "NaN"),
        ([1.0, 2.0], [1.0, 2.0], ["a", None], {}, "None"),
        ([1.0, 2.0], [1.0, 2.0], None, {"B": 0}, "B must"),
        ([1.0, 2.0], [1.0, 2.0], None, {"alpha": 1.5}, "alpha"),
        (["x", "y"], [1.0, 2.0], None, {}, "not numeric"),
        (np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), None, {}, "shape"),
        ([1.0, 2.0], [1.0, 2.0], None, {"counts": []}, "empty"),
        ([1.0, 2.0], [1.0, 2.0], None, {"counts": [np.array([[2, 1]])]}, "sum"),
        ([1.0, 2.0], [1.0, 2.0], None, {"signflip_seeds": [1, 2]}, "one seed per metric"),
        ([1.0, 2.0], [1.0, 2.0], None, {"signflip_seeds": [-1]}, "non-negative int"),
        ([1.0, 2.0], [1.0, 2.0], None, {"signflip_seeds": [True]}, "non-negative int"),
        ([1.0, 2.0], [1.0, 2.0], None, {"signflip_seeds": ["7"]}, "non-negative int"),
    ],
)
def test_invalid_inputs_raise(
    baseline: Any, variant: Any, groups: Any, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ComparisonError, match=match):
        paired_test(baseline, variant, groups, **kwargs)


# --------------------------------------------------------------------------- interval by test inversion


def brute_force_p(d: np.ndarray, labels: np.ndarray, delta: float) -> float:
    """Reference: exact two-sided group sign-flip p of ``d - delta``, by plain enumeration."""
    sums = np.array([np.sum(d[labels == g] - delta) for g in np.unique(labels)])
    t_obs = abs(float(sums.sum()))
    tol = 1e-9 * float(np.abs(sums).sum())
    hits = sum(
        abs(float(np.dot(eps, sums))) >= t_obs - tol
        for eps in itertools.product((1.0, -1.0), repeat=sums.size)
    )
    return hits / float(1 << sums.size)


# 8 groups, 14 queries; group sums 1, 0, 0, 1, 2, 0, 1, 2 (total 7, effect 0.5)
HAND_SIZES = [1, 3, 3, 1, 1, 1, 1, 3]
HAND_LABELS = np.repeat(np.array(list("abcdefgh")), HAND_SIZES)
HAND_D = np.array([1, 0, 1, -1, 1, 0, -1, 1, 2, 0, 1, 0, 1, 1], dtype=np.float64)


def test_interval_agrees_with_p_where_the_percentile_interval_did_not() -> None:
    """The old contradiction: percentile interval excludes 0, sign-flip p > alpha.

    By hand: |T| = 7 is reached only by sign vectors that flip nothing but the three
    zero-sum groups (2**3 of them) and by their negatives: p = 16 / 256 = 0.0625. Just
    below delta = 0 every shifted group sum is positive and only the all-plus and
    all-minus vectors reach |T_obs|: p = 2 / 256. So the inverted interval starts at 0.
    """
    base = np.zeros(HAND_D.size)
    r = paired_test(base, HAND_D, HAND_LABELS, B=10_000, seed=0)
    assert r.ci_method == "signflip_inversion"
    assert bool(r.p_exact[0]) and r.n_groups == 8
    assert r.effect[0] == 0.5
    assert r.p_value[0] == 16 / 256 == brute_force_p(HAND_D, HAND_LABELS, 0.0)
    assert brute_force_p(HAND_D, HAND_LABELS, -1e-3) == 2 / 256
    # the percentile bootstrap excludes 0 although the test does not reject at 0.05 ...
    assert r.boot_ci_low[0] > 0 and r.p_value[0] >= 0.05
    # ... the inverted interval includes 0, and it starts exactly there
    assert r.ci_low[0] == 0.0 <= r.effect[0] <= r.ci_high[0]
    # at alpha = 0.1 the same p rejects, and the interval excludes 0
    r10 = paired_test(base, HAND_D, HAND_LABELS, B=10_000, seed=0, alpha=0.1)
    assert r10.p_value[0] < 0.1 and r10.ci_low[0] > 0
    for res, alpha in ((r, 0.05), (r10, 0.1)):
        includes0 = bool(res.ci_low[0] <= 0 <= res.ci_high[0])
        assert includes0 == bool(res.p_value[0] >= alpha)


@pytest.mark.parametrize("alpha", [0.05, 0.1])
def test_interval_ends_are_where_p_crosses_alpha_exact(alpha: float) -> None:
    r = paired_test(np.zeros(HAND_D.size), HAND_D, HAND_LABELS, B=10_000, seed=0, alpha=alpha)
    eps = 1e-7
    for end, inward in ((r.ci_low[0], 1.0), (r.ci_high[0], -1.0)):
        assert np.isfinite(end)
        assert brute_force_p(HAND_D, HAND_LABELS, end) >= alpha
        assert brute_force_p(HAND_D, HAND_LABELS, end + inward * eps) >= alpha
        assert brute_force_p(HAND_D, HAND_LABELS, end - inward * eps) < alpha


def test_interval_ends_are_where_p_crosses_alpha_monte_carlo() -> None:
    """Monte Carlo (2**G > B): the test on shifted data with the same sign vectors crosses alpha there."""
    rng = np.random.default_rng(12)
    labels = np.repeat(np.arange(60), rng.integers(1, 5, 60))
    base = rng.random(labels.size)
    var = base + 0.05 + rng.normal(0.0, 0.2, 60)[labels] + rng.normal(0.0, 0.1, labels.size)
    seeds = [derive_seed(3, "dev", "v", "mrr")]
    r = paired_test(base, var, labels, B=4_000, seed=3, signflip_seeds=seeds)
    assert not bool(r.p_exact[0])
    eps = 1e-6

    def p_at(delta: float) -> float:
        return float(paired_test(base, var - delta, labels, B=4_000, seed=3, signflip_seeds=seeds).p_value[0])

    for end, inward in ((r.ci_low[0], 1.0), (r.ci_high[0], -1.0)):
        assert p_at(end + inward * eps) >= 0.05
        assert p_at(end - inward * eps) < 0.05
    # a 95% interval of this size: close to the percentile bootstrap interval
    assert r.ci_low[0] == pytest.approx(r.boot_ci_low[0], abs=2 * r.se[0])
    assert r.ci_high[0] == pytest.approx(r.boot_ci_high[0], abs=2 * r.se[0])


@st.composite
def small_group_data(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n_groups = draw(st.integers(1, 9))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n_groups, max_size=n_groups))
    labels = np.repeat(np.arange(n_groups), sizes)
    d = np.array(draw(st.lists(st.integers(-4, 4), min_size=labels.size, max_size=labels.size)))
    return d.astype(np.float64) / 4, labels


@settings(max_examples=150, deadline=None, database=None)
@given(small_group_data(), st.sampled_from([0.05, 0.1, 0.2, 0.3]))
def test_interval_excludes_zero_iff_p_below_alpha(data: tuple[np.ndarray, np.ndarray], alpha: float) -> None:
    d, labels = data
    r = paired_test(np.zeros(d.size), d, labels, B=512, seed=0, alpha=alpha)  # 2**G <= 512: exact
    assert bool(r.p_exact[0])
    lo, hi, p = r.ci_low[0], r.ci_high[0], r.p_value[0]
    assert lo <= r.effect[0] <= hi
    assert (not lo <= 0 <= hi) == (p < alpha)
    assert p == pytest.approx(brute_force_p(d, labels, 0.0), abs=1e-12)
    # the test can only reject when 2 / 2**G < alpha; otherwise the interval is the whole line
    assert np.isinf(lo) == np.isinf(hi) == (2 / 2**r.n_groups >= alpha and bool(np.any(d != 0)))


def test_interval_edge_cases() -> None:
    # all differences 0: [0, 0]
    r = paired_test(np.ones(6), np.ones(6), np.arange(6) // 2, B=100)
    assert (r.ci_low[0], r.ci_high[0], r.p_value[0]) == (0.0, 0.0, 1.0)
    # 5 groups: the smallest exact p is 2 / 32 > 0.05, nothing is ever rejected
    r = paired_test(np.zeros(5), np.full(5, 3.0), None, B=100)
    assert r.p_value[0] == 2 / 32 and r.ci_low[0] == -np.inf and r.ci_high[0] == np.inf
    # 8 equal differences: every shift but the effect itself is rejected (p = 2 / 256)
    r = paired_test(np.zeros(8), np.full(8, 0.25), None, B=1_000)
    assert r.p_value[0] == 2 / 256 and r.ci_low[0] == r.ci_high[0] == 0.25
    # a metric that never changes beside one that does: columns are independent
    base = np.zeros((8, 2))
    var = np.column_stack([np.zeros(8), HAND_D[:8]])
    r = paired_test(base, var, None, B=1_000)
    assert (r.ci_low[0], r.ci_high[0]) == (0.0, 0.0)
    assert r.ci_low[1] < r.effect[1] < r.ci_high[1]


def test_worked_example_of_the_docs() -> None:
    """docs/statistics.md quotes these numbers for the same data: they must stay true."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "statistics.md").read_text(encoding="utf-8")
    groups = list("abbbcccdefghhh")
    assert groups == HAND_LABELS.tolist()
    r = paired_test(np.zeros(14), HAND_D, groups, B=10_000, seed=0)
    r10 = paired_test(np.zeros(14), HAND_D, groups, B=10_000, seed=0, alpha=0.1)
    quoted = [
        f"**p = {r.p_value[0]:.4f}**",
        f"**[{r.boot_ci_low[0]:.4f}, {r.boot_ci_high[0]:.4f}]**",
        f"`p_bootstrap` is {r.p_bootstrap[0]:.4f}",
        f"**[{r.ci_low[0]:.4f}, {r.ci_high[0]:.4f}]**",
        f"**[{r10.ci_low[0]:.4f}, {r10.ci_high[0]:.4f}]**",
        f"# {r.effect} {r.p_value} {r.ci_low} {r.ci_high} {r.boot_ci_low} {r.boot_ci_high}",
    ]
    for text in quoted:
        assert text in doc, text
    # "p is still 16/256 at delta = 4/3 and drops to 10/256 just beyond it"
    assert r.ci_high[0] == pytest.approx(4 / 3, abs=1e-12)
    assert brute_force_p(HAND_D, HAND_LABELS, 4 / 3) == 16 / 256
    assert brute_force_p(HAND_D, HAND_LABELS, 4 / 3 + 1e-6) == 10 / 256
    # the Holm / BH table of the docs
    raw = [0.001, 0.008, 0.039, 0.041, 0.042, 0.060, 0.074, 0.205, 0.212, 0.216]
    for name, adjust in (("Holm", holm), ("BH", benjamini_hochberg)):
        row = "| " + name + " | " + " | ".join(f"{x:.3f}".lstrip("0") for x in adjust(raw)) + " |"
        assert row in doc, row


# --------------------------------------------------------------------------- Holm and BH edge cases


def test_adjustments_edge_cases() -> None:
    for adjust in (holm, benjamini_hochberg):
        np.testing.assert_array_equal(adjust([0.03]), [0.03])
        np.testing.assert_array_equal(adjust([1.0, 1.0, 1.0]), [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(adjust([0.0, 1.0]), [0.0, 1.0])
        assert adjust([]).shape == (0,)
        out = adjust(np.array([0.4, 0.01, 0.4, 0.01]))
        assert out[0] == out[2] and out[1] == out[3]  # ties get equal values
        assert np.all(out >= [0.4, 0.01, 0.4, 0.01])
        assert np.all(out <= 1.0)
        bads: list[Any] = [[0.1, float("nan")], [1.2], [-0.1], [[0.1, 0.2]], ["x"]]
        for bad in bads:
            with pytest.raises(ComparisonError):
                adjust(bad)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03]), [0.03, 0.04, 0.04])
    np.testing.assert_allclose(holm([0.5, 0.4]), [0.8, 0.8])
    np.testing.assert_allclose(holm([0.01, 0.01]), [0.02, 0.02])
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.01]), [0.01, 0.01])


# --------------------------------------------------------------------------- derive_seed


def test_derive_seed_is_a_stable_contract() -> None:
    assert derive_seed(0, "holdout") == 7311495893301717107
    assert derive_seed(0, "dev") == 6779473847750754105
    assert derive_seed(12345) == 3486339757182763419
    assert derive_seed(0, "holdout") == derive_seed(np.int64(0), "holdout")  # type: ignore[arg-type]
    assert derive_seed(0, "a", "b") != derive_seed(0, "ab")
    assert derive_seed(0, "holdout") != derive_seed(1, "holdout")
    assert 0 <= derive_seed(-5, "dev", "变体") < 2**63
    with pytest.raises(ComparisonError):
        derive_seed(0, 1)  # type: ignore[arg-type]
    with pytest.raises(ComparisonError):
        derive_seed("0", "dev")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- properties

grid = st.integers(0, 16).map(lambda k: k / 16)  # exact binary fractions: sums are exact


@st.composite
def paired_data(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 40))
    base = np.array(draw(st.lists(grid, min_size=n, max_size=n)))
    var = np.array(draw(st.lists(grid, min_size=n, max_size=n)))
    groups = np.array(draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)))
    return base, var, groups


PROPS = settings(max_examples=60, deadline=None, database=None)


@PROPS
@given(paired_data(), st.booleans())
def test_swap_negates_effect_keeps_p(data: tuple[np.ndarray, ...], grouped: bool) -> None:
    base, var, groups = data
    g = groups if grouped else None
    r = paired_test(base, var, g, B=300, seed=3)
    s = paired_test(var, base, g, B=300, seed=3)
    np.testing.assert_array_equal(s.effect, -r.effect)
    np.testing.assert_array_equal(s.p_value, r.p_value)
    np.testing.assert_array_equal(s.p_bootstrap, r.p_bootstrap)
    np.testing.assert_allclose(s.se, r.se, atol=1e-12)
    np.testing.assert_allclose(s.boot_ci_low, -r.boot_ci_high, atol=1e-12)
    np.testing.assert_allclose(s.boot_ci_high, -r.boot_ci_low, atol=1e-12)
    # the same sign vectors test -d at -delta: the interval mirrors (ends are exact breakpoints)
    np.testing.assert_allclose(s.ci_low, -r.ci_high, atol=1e-9)
    np.testing.assert_allclose(s.ci_high, -r.ci_low, atol=1e-9)


@PROPS
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40),
    st.integers(0, 10_000),
    st.booleans(),
)
def test_identical_systems(values: list[float], seed: int, grouped: bool) -> None:
    x = np.asarray(values)
    g = np.arange(x.size) // 3 if grouped else None
    r = paired_test(x, x.copy(), g, B=200, seed=seed)
    assert r.effect[0] == 0 and r.se[0] == 0
    assert r.ci_low[0] == 0 and r.ci_high[0] == 0
    assert r.boot_ci_low[0] == 0 and r.boot_ci_high[0] == 0
    assert r.p_value[0] == 1 and r.p_bootstrap[0] == 1


@PROPS
@given(paired_data(), st.floats(-100, 100, allow_nan=False), st.booleans())
def test_adding_a_constant_changes_nothing(data: tuple[np.ndarray, ...], const: float, grouped: bool) -> None:
    base, var, groups = data
    g = groups if grouped else None
    r = paired_test(base, var, g, B=300, seed=5)
    s = paired_test(base + const, var + const, g, B=300, seed=5)
    # differences move by rounding only (~1e-14); ties stay ties (tolerance), so p is identical
    np.testing.assert_array_equal(s.p_value, r.p_value)
    for field in ("effect", "se", "ci_low", "ci_high", "boot_ci_low", "boot_ci_high"):
        np.testing.assert_allclose(getattr(s, field), getattr(r, field), atol=1e-9)
    # with an exactly representable constant, everything is bit-identical
    k = round(const * 16) / 16
    t = paired_test(base + k, var + k, g, B=300, seed=5)
    for field in FIELDS:
        np.testing.assert_array_equal(getattr(t, field), getattr(r, field))


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.filter_too_much],
)
@given(
    st.lists(
        st.lists(st.tuples(grid, grid), min_size=1, max_size=4),
        min_size=12,
        max_size=25,
    )
)
def test_duplicates_inside_a_group_do_not_shrink_the_ci(groups_data: list[list[tuple[float, float]]]) -> None:
    base = np.array([b for grp in groups_data for b, _ in grp])
    var = np.array([v for grp in groups_data for _, v in grp])
    labels = np.array([g for g, grp in enumerate(groups_data) for _ in grp])
    n_groups = len(groups_data)
    sums, sizes = group_sums(var - base, labels)
    assume(np.unique(sums[:, 0] / sizes).size >= 4)  # a non-degenerate spread of group means

    orig = paired_test(base, var, labels, B=2_000, seed=1)
    # every query duplicated inside its own group
    same = paired_test(np.tile(base, 2), np.tile(var, 2), np.tile(labels, 2), B=2_000, seed=1)
    # every query duplicated as a new group
    new = paired_test(
        np.tile(base, 2), np.tile(var, 2), np.concatenate([labels, labels + n_groups]), B=2_000, seed=1
    )
    width = float(orig.boot_ci_high[0] - orig.boot_ci_low[0])
    assert float(same.boot_ci_high[0] - same.boot_ci_low[0]) == pytest.approx(width, rel=1e-9, abs=1e-12)
    assert same.se[0] == pytest.approx(orig.se[0], rel=1e-9)
    assert same.p_value[0] == orig.p_value[0]
    assert float(new.boot_ci_high[0] - new.boot_ci_low[0]) < 0.9 * width
    # the test-inversion interval ignores in-group duplicates too (2**G > B: Monte Carlo)
    np.testing.assert_allclose(
        [same.ci_low[0], same.ci_high[0]], [orig.ci_low[0], orig.ci_high[0]], atol=1e-9
    )
    assert 0.6 < new.se[0] / orig.se[0] < 0.8  # ideal: 1 / sqrt(2)


# --------------------------------------------------------------------------- A/A simulation


@pytest.mark.slow
def test_aa_simulation_false_positive_rate() -> None:
    """A system against itself plus noise with a shared per-group effect.

    Differences d_i = u_g + e_i (u_g ~ N(0, 1), e_i ~ N(0, 0.5)) are symmetric
    around 0, so every rejection is a false positive. The group-level sign-flip
    stays near alpha; a query-level test on the same data is far too liberal.
    """
    rng = np.random.default_rng(20240501)
    # 2,000 simulations as 40 draws of a group structure with 50 independent data columns each
    # (paired_test tests every column on its own, with its own sign-flip seed)
    n_draws, per_draw, n_groups, alpha, B = 40, 50, 40, 0.05, 999
    n_sim = n_draws * per_draw
    rej_group = rej_query = rej_boot = covered = 0
    for draw in range(n_draws):
        sizes = rng.integers(1, 13, n_groups)
        labels = np.repeat(np.arange(n_groups), sizes)
        n = labels.size
        base = rng.random((n, per_draw))
        var = base + rng.normal(0.0, 1.0, (n_groups, per_draw))[labels] + rng.normal(0.0, 0.5, (n, per_draw))
        r = paired_test(base, var, labels, B=B, seed=draw)
        q = paired_test(base, var, None, B=B, seed=draw)
        rej_group += int((r.p_value < alpha).sum())
        rej_boot += int((r.p_bootstrap < alpha).sum())
        rej_query += int((q.p_value < alpha).sum())
        covered += int(((r.ci_low <= 0) & (r.ci_high >= 0)).sum())
    fpr_group, fpr_query = rej_group / n_sim, rej_query / n_sim
    assert 0.03 <= fpr_group <= 0.07, fpr_group
    assert covered == n_sim - rej_group  # the interval covers the true effect 0 iff p >= alpha
    assert fpr_query > 0.15, fpr_query
    # the group bootstrap p over 40 groups is somewhat liberal but nowhere near the query level
    assert rej_boot / n_sim < fpr_query
