"""The comparison's streamed bootstrap (one draw handed chunk by chunk to every test that uses it)
gives the numbers of the tests run one by one on the whole draw, and the percentiles found in a
window of sorted positions equal those over every position.

References: ``np.percentile`` over the resample written out value by value (numpy's default
linear interpolation is the definition stats.weighted_percentiles documents), and the tests'
own ``counts=`` path on a materialised draw.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.compare import stats
from rag_ablate.compare.draws import CHUNK, SharedDraws, quantiles, ratios


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=15),
    data=st.data(),
)
def test_weighted_percentiles_many_equal_numpy_on_the_written_out_resample(
    values: list[float], data: st.DataObject
) -> None:
    x = np.sort(np.array(values))
    rows = data.draw(st.integers(1, 5))
    w = np.array(
        [data.draw(st.lists(st.integers(0, 4), min_size=len(x), max_size=len(x))) for _ in range(rows)]
    )
    w[:, 0] += w.sum(axis=1) == 0  # every row has some weight
    qs = (0.0, 50.0, 95.0, 99.0, 100.0)
    got = stats.weighted_percentiles_many(x, w, qs)
    for r in range(rows):
        expanded = np.repeat(x, w[r])
        np.testing.assert_allclose(got[r], np.percentile(expanded, qs), rtol=0, atol=1e-9)


@pytest.mark.parametrize("window", [1, 3, 1024])
def test_windowed_quantile_effects_equal_the_full_computation(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small windows force many resamples' percentiles outside the window (the fallback), large
    ones keep them all inside; either way the effects equal those over every position."""
    monkeypatch.setattr(stats, "QUANTILE_WINDOW_MIN", window)
    monkeypatch.setattr(stats, "QUANTILE_WINDOW_SD", 0.0)
    rng = np.random.default_rng(3)
    n, n_groups = 400, 120
    groups = rng.integers(0, n_groups, n)
    groups[:n_groups] = np.arange(n_groups)  # every group present
    base = np.round(rng.gamma(2.0, 50.0, n), 1)  # ties included
    var = base * rng.uniform(0.8, 1.1, n)
    qs = (50.0, 95.0, 99.0)
    setup = stats.quantile_setup(base, var, groups, qs)
    codes, _ = stats._factorise(groups, n)
    ob, ov = np.argsort(base, kind="stable"), np.argsort(var, kind="stable")
    for counts in stats.bootstrap_counts(n_groups, 600, np.random.default_rng(9), chunk=CHUNK):
        got = stats.quantile_effects(counts, setup)
        c = counts.astype(np.int64)
        want = stats.weighted_percentiles_many(
            var[ov], c[:, codes[ov]], qs
        ) - stats.weighted_percentiles_many(base[ob], c[:, codes[ob]], qs)
        np.testing.assert_array_equal(got, want)


def test_the_streamed_draw_equals_each_test_on_its_own_draw() -> None:
    rng = np.random.default_rng(5)
    n, n_groups, B = 600, 150, 1_100  # B not a multiple of the chunk
    groups = np.sort(rng.integers(0, n_groups, n))
    groups[:n_groups] = np.arange(n_groups)
    base = rng.random((n, 2))
    var = base + rng.normal(0.02, 0.1, (n, 2))
    lat_b, lat_v = rng.gamma(2.0, 40.0, n), rng.gamma(2.0, 38.0, n)
    seed = stats.derive_seed(0, "holdout", "g")
    qs = (50.0, 95.0)

    shared = SharedDraws(B)
    theta = shared.add("holdout", seed, n_groups, ratios(stats.group_sums_sizes(var - base, groups)))
    setup = stats.quantile_setup(lat_b, lat_v, groups, qs)
    effects = shared.add_linear_chunk("holdout", seed, n_groups, setup.sizes_before, quantiles(setup))
    with pytest.raises(ValueError, match="another seed"):
        shared.add("holdout", seed + 1, n_groups, ratios(stats.group_sums_sizes(var - base, groups)))
    shared.run()

    alone = stats.paired_test(base, var, groups, B=B, seed=seed)
    streamed = stats.paired_test(base, var, groups, B=B, seed=seed, theta=theta.result())
    for field in (
        "effect",
        "ci_low",
        "ci_high",
        "se",
        "p_value",
        "p_bootstrap",
        "boot_ci_low",
        "boot_ci_high",
    ):
        np.testing.assert_array_equal(getattr(streamed, field), getattr(alone, field), err_msg=field)

    q_alone = stats.paired_quantile_tests(lat_b, lat_v, groups, qs, B=B, seed=seed)
    q_streamed = stats.paired_quantile_tests(
        lat_b, lat_v, groups, qs, B=B, seed=seed, effects=effects.result()
    )
    assert q_streamed == q_alone
    # and each percentile alone, as the comparison computed it before several were done at once
    for q, res in zip(qs, q_alone, strict=True):
        assert stats.paired_quantile_test(lat_b, lat_v, groups, q, B=B, seed=seed) == res


def test_bootstrap_counts_in_small_blocks_equal_one_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are drawn in blocks that stay in cache; the draws are those of one big draw."""
    monkeypatch.setattr(stats, "COUNT_BLOCK_ELEMS", 37)
    chunks = list(stats.bootstrap_counts(9, 503, np.random.default_rng(1), chunk=100))
    idx = np.random.default_rng(1).integers(0, 9, (503, 9))
    expected = np.stack([np.bincount(row, minlength=9) for row in idx])
    np.testing.assert_array_equal(np.concatenate(chunks), expected)
    reused = [
        c.copy() for c in stats.bootstrap_counts(9, 503, np.random.default_rng(1), chunk=100, reuse=True)
    ]
    np.testing.assert_array_equal(np.concatenate(reused), expected)


@pytest.mark.parametrize("window", [1, 64])
def test_resample_percentiles_equal_the_written_out_percentile(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trade-off's cost percentile per resample, found in a window of sorted positions, equals
    the percentile over every position (tradeoff.weighted_stat), NaN where a resample draws no value."""
    from rag_ablate.compare.tradeoff import weighted_stat

    monkeypatch.setattr(stats, "QUANTILE_WINDOW_MIN", window)
    monkeypatch.setattr(stats, "QUANTILE_WINDOW_SD", 0.0 if window == 1 else 8.0)
    rng = np.random.default_rng(4)
    n_groups = 40
    codes = rng.integers(0, 3, 30)  # values in 3 of the 40 groups: about 4% of resamples draw none
    values = np.round(rng.gamma(2.0, 50.0, codes.size), 0)  # ties included
    for q in (50.0, 95.0):
        setup = stats.percentile_setup(values, codes, n_groups, q)
        got, want = [], []
        for counts in stats.bootstrap_counts(n_groups, 1000, np.random.default_rng(1)):
            got.append(stats.resample_percentiles(counts, setup))
            want.append(weighted_stat(values, counts[:, codes], q))
        assert 0 < np.isnan(np.concatenate(got)).sum() < 100
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))


def test_a_draw_lets_its_consumers_columns_go_and_keeps_their_results() -> None:
    """Memory at scale: once run, the draw holds none of the (G, k) columns its consumers planned
    (at 100,000 queries 140 MB), while the consumers' results stay; the same numbers as a product
    written out."""
    rng = np.random.default_rng(2)
    n_groups, B = 40, 300
    cols = rng.random((n_groups, 3))
    signs = rng.random((n_groups, 2))
    shared = SharedDraws(B)
    linear = shared.add_linear("g", 7, n_groups, cols, lambda prod: prod)
    flips = shared.add_signs(("g", "signs"), 8, n_groups, signs)
    gone = [weakref.ref(cols), weakref.ref(signs)]
    expected = np.vstack(
        [c @ cols for c in stats.bootstrap_counts(n_groups, B, np.random.default_rng(7), CHUNK)]
    )
    del cols, signs
    shared.run()
    assert [ref() for ref in gone] == [None, None]
    np.testing.assert_array_equal(linear.result(), expected)
    assert flips.result().shape == (B, 2)
