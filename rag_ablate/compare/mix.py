"""The production mix in the comparison: weighted paired intervals per variant, and their tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats
from rag_ablate.core.errors import ComparisonError, ConfigError
from rag_ablate.dataset.weights import (
    Counts,
    FloatArray,
    TagWeights,
    effective_n,
    normalised,
    problems,
    trivial,
)
from rag_ablate.records.trace import Record


@dataclass(frozen=True)
class WeightedResult:
    """A weighted paired difference (variant - baseline) with its group-bootstrap interval.

    ``effect`` = ``sum w d / sum w``; ``baseline``/``variant`` the two weighted means;
    ``ci_low``/``ci_high`` the percentile interval of the bootstrap ``theta*``, ``se``
    their SD (ddof 1), ``p_bootstrap`` ``min(1, 2 min(share(theta* <= 0), share(theta* >= 0)))``.
    ``n_resamples``: resamples used (a resample that drew only zero-weight groups has
    no ratio and is left out). ``n_queries``/``n_groups``: queries and groups with a
    weight > 0; ``n_eff``: Kish's effective number of queries.
    """

    baseline: float
    variant: float
    effect: float
    ci_low: float
    ci_high: float
    se: float
    p_bootstrap: float
    n_queries: int
    n_groups: int
    n_eff: float
    n_resamples: int
    bootstrap_unreliable: bool


def weighted_paired_bootstrap(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike,
    weights: npt.ArrayLike,
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Counts | None = None,
) -> WeightedResult:
    """The production-weighted effect of one metric and its group-bootstrap interval (module docstring).

    ``counts``: the split's shared count chunks (:func:`rag_ablate.compare.stats.bootstrap_counts`
    over the sorted distinct ``groups``); else drawn from ``default_rng(seed)``, the same
    draws ``rng.integers(0, G, (B, G))`` would give. Every group is resampled, zero-weight
    ones too, so the draw is the one the plain rows use.
    """
    return weighted_paired_bootstraps(
        baseline, variant, groups, weights, B=B, seed=seed, alpha=alpha, counts=counts
    )[0][0]


def _matrix(x: npt.ArrayLike, name: str) -> FloatArray:
    a = np.asarray(x, dtype=np.float64)
    a = a[:, None] if a.ndim == 1 else a
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise ComparisonError(f"{name}: expected shape (n,) or (n, m) with n, m >= 1, got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ComparisonError(f"{name}: NaN or inf value")
    return a


def weighted_paired_bootstraps(
    baseline: npt.ArrayLike,
    variant: npt.ArrayLike,
    groups: npt.ArrayLike,
    weights: npt.ArrayLike,
    *,
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    counts: Counts | None = None,
    draws: npt.ArrayLike | None = None,
) -> list[list[WeightedResult]]:
    """:func:`weighted_paired_bootstrap` for m metric columns ((n, m) values) under k weightings
    ((n, k) weights) at once, on one draw: result ``[k][m]``. Each weight column needs a
    positive sum. One product per count chunk serves every column.

    ``draws``: the products already computed from a shared draw, the concatenation over its
    chunks of ``c @ weighted_group_sums(...)`` (:func:`weighted_draws`); ``counts`` is then
    ignored and the result equals ``counts=`` with that draw's chunks."""
    b, v = _matrix(baseline, "baseline"), _matrix(variant, "variant")
    w = _matrix(weights, "weights")
    m, k = b.shape[1], w.shape[1]
    wn, d, sums = _weighted_setup(b, v, w, groups)
    n_groups_all = sums.shape[0]
    if draws is not None:
        drawn = np.asarray(draws, dtype=np.float64)
        if drawn.ndim != 2 or drawn.shape[1] != sums.shape[1]:
            raise ComparisonError(f"draws: expected shape (B, {sums.shape[1]}), got {drawn.shape}")
    else:
        if counts is None:
            counts = list(stats.bootstrap_counts(n_groups_all, B, np.random.default_rng(seed)))
        parts = []
        for ch in counts:
            c = np.asarray(ch)
            if c.ndim != 2 or c.shape[1] != n_groups_all:
                raise ComparisonError(f"counts: expected shape (c, {n_groups_all}), got {c.shape}")
            parts.append(weighted_draws(c, sums))
        drawn = np.concatenate(parts, axis=0)
    out = []
    for kk in range(k):
        den = drawn[:, k * m + kk]
        ok = den > 0  # a resample of zero-weight groups only has no ratio
        theta = drawn[ok, kk * m : (kk + 1) * m] / den[ok, None]
        n_boot = theta.shape[0]
        n_groups = int(np.count_nonzero(sums[:, k * m + kk] > 0))
        row = []
        for j in range(m):
            t = theta[:, j]
            wd = wn[:, kk] * d[:, j]
            if n_boot >= 2:
                lo, hi = (float(x) for x in np.percentile(t, [100 * alpha / 2, 100 * (1 - alpha / 2)]))
                se = float(t.std(ddof=1))
                tol = stats.TIE_RTOL * float(np.abs(wd).sum())
                below, above = int(np.count_nonzero(t <= tol)), int(np.count_nonzero(t >= -tol))
                p = min(1.0, 2.0 * min(below, above) / n_boot)
            else:
                lo = hi = se = p = math.nan
            row.append(
                WeightedResult(
                    baseline=float(np.dot(wn[:, kk], b[:, j])),
                    variant=float(np.dot(wn[:, kk], v[:, j])),
                    effect=float(wd.sum()),
                    ci_low=lo,
                    ci_high=hi,
                    se=se,
                    p_bootstrap=p,
                    n_queries=int(np.count_nonzero(w[:, kk] > 0)),
                    n_groups=n_groups,
                    n_eff=effective_n(w[:, kk]),
                    n_resamples=n_boot,
                    bootstrap_unreliable=n_groups < stats.MIN_RELIABLE_GROUPS,
                )
            )
        out.append(row)
    return out


def _weighted_setup(
    b: FloatArray, v: FloatArray, w: FloatArray, groups: npt.ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Normalised weights (n, k), differences (n, m) and the (G, k m + k) group sums: column
    ``kk * m + j`` sums ``w_kk * d_j``, column ``k m + kk`` sums ``w_kk``."""
    n, m = b.shape
    k = w.shape[1]
    if v.shape != b.shape or w.shape[0] != n:
        raise ComparisonError(
            f"baseline, variant and weights are not aligned: {b.shape}, {v.shape}, {w.shape}"
        )
    wn = np.column_stack([normalised(w[:, j]) for j in range(k)])
    d = v - b
    num = (wn[:, :, None] * d[:, None, :]).reshape(n, k * m)  # column kk * m + j: w_kk * d_j
    sums, _ = stats.group_sums(np.column_stack([num, wn]), groups)
    return wn, d, sums


def weighted_group_sums(
    baseline: npt.ArrayLike, variant: npt.ArrayLike, groups: npt.ArrayLike, weights: npt.ArrayLike
) -> FloatArray:
    """The (G, k m + k) group sums that :func:`weighted_draws` multiplies."""
    b, v = _matrix(baseline, "baseline"), _matrix(variant, "variant")
    return _weighted_setup(b, v, _matrix(weights, "weights"), groups)[2]


def weighted_draws(counts: npt.NDArray[np.generic], sums: FloatArray) -> FloatArray:
    """One count chunk's weighted sums of every d column, then of every weight column."""
    return np.asarray(np.asarray(counts).astype(np.float64) @ sums, dtype=np.float64)


@dataclass
class MixRow:
    """One split x variant x metric of the production mix: ``mix`` is ``production``
    (the weighted effect) or ``edge`` (the edge cases' own effect, a plain mean)."""

    split: str
    variant: str
    metric: str
    mix: str
    direction: str
    baseline_mean: float
    variant_mean: float
    effect: float
    ci_low: float
    ci_high: float
    se: float
    p_bootstrap: float
    n_queries: int
    n_groups: int
    n_eff: float
    n_resamples: int
    bootstrap_unreliable: bool


def mix_rows(
    split: str,
    variant: str,
    metrics: Sequence[tuple[str, str]],
    b: FloatArray,
    v: FloatArray,
    groups: npt.ArrayLike,
    tag_lists: Sequence[Sequence[str]],
    tw: TagWeights,
    counts: Counts | None,
    alpha: float,
    draws: FloatArray | None = None,
) -> list[MixRow]:
    """The production rows (when some query weighs > 0) and the edge rows (when some query
    is an edge case) of metrics measured on the same paired queries: ``metrics`` are
    (name, direction) of the columns of ``b`` and ``v`` (n, m). One shared bootstrap draw:
    its ``counts``, or the ``draws`` already multiplied out (:func:`mix_weights`,
    :func:`weighted_group_sums`, :func:`weighted_draws`)."""
    mixes, weights = mix_weights(tag_lists, tw)
    if weights is None:
        return []
    res = weighted_paired_bootstraps(b, v, np.array(groups), weights, alpha=alpha, counts=counts, draws=draws)
    return [
        MixRow(
            split=split,
            variant=variant,
            metric=metric,
            mix=mix,
            direction=direction,
            baseline_mean=r.baseline,
            variant_mean=r.variant,
            effect=r.effect,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            se=r.se,
            p_bootstrap=r.p_bootstrap,
            n_queries=r.n_queries,
            n_groups=r.n_groups,
            n_eff=r.n_eff,
            n_resamples=r.n_resamples,
            bootstrap_unreliable=r.bootstrap_unreliable,
        )
        for mix, results in zip(mixes, res, strict=True)
        for (metric, direction), r in zip(metrics, results, strict=True)
    ]


def mix_weights(tag_lists: Sequence[Sequence[str]], tw: TagWeights) -> tuple[list[str], FloatArray | None]:
    """The mixes of :func:`mix_rows` and their (n, k) weight columns: ``production`` (the
    weights) and ``edge`` (the edge-case indicator), each only when some query weighs > 0
    there; ([], None) when neither applies. Queries with the same tags share one lookup."""
    return pick_mixes(*mix_columns(tag_lists, tw))


def mix_columns(tag_lists: Sequence[Sequence[str]], tw: TagWeights) -> tuple[FloatArray, FloatArray]:
    """Each query's production weight and edge-case indicator (0 or 1), before :func:`pick_mixes`
    (a comparison computes them once per split and picks them for each subset of its queries)."""
    known: dict[tuple[str, ...], tuple[float, float]] = {}
    w = np.empty(len(tag_lists))
    edge = np.empty(len(tag_lists))
    for i, t in enumerate(tag_lists):
        key = tuple(t)
        if key not in known:
            known[key] = (tw.weight(t), 1.0 if tw.is_edge(t) else 0.0)
        w[i], edge[i] = known[key]
    return w, edge


def pick_mixes(w: FloatArray, edge: FloatArray) -> tuple[list[str], FloatArray | None]:
    """:func:`mix_weights` of the queries whose :func:`mix_columns` are ``w`` and ``edge``."""
    mixes = [(name, x) for name, x in (("production", w), ("edge", edge)) if x.sum() > 0]
    if not mixes:
        return [], None
    return [name for name, _ in mixes], np.column_stack([x for _, x in mixes])


def settle(
    weights: TagWeights | None,
    base_config: Mapping[str, Any] | None,
    base_records: Sequence[Record],
    other_configs: Mapping[str, Mapping[str, Any] | None],
) -> tuple[TagWeights | None, list[str]]:
    """The weighting a comparison uses, or None when there is nothing to weigh; plus notes.

    ``weights`` wins; else the baseline's ``dataset.slice_weights``/``edge_tags`` (its
    config.yaml), else the default (edge cases out). None when the records carry no
    tags, when every query weighs 1 and none is an edge case, or when the weights do
    not fit the records' tags (a note says why).
    """
    notes: list[str] = []
    ds = (base_config or {}).get("dataset")
    configured = weights is not None or (isinstance(ds, Mapping) and bool(ds.get("slice_weights")))
    try:
        tw = weights or TagWeights.from_config(ds if isinstance(ds, Mapping) else {})
    except ConfigError as exc:
        return None, [f"production mix not computed: {exc}"]
    if not any("tags" in r for r in base_records):
        if configured:
            notes.append(
                "production mix not computed: the records carry no tags (written by an older version)"
            )
        return None, notes
    tag_lists = [[str(t) for t in r.get("tags") or ()] for r in base_records]
    if trivial(tw, tag_lists):
        return None, notes
    errors, warnings = problems(tw, tag_lists)
    if errors:
        return None, [f"production mix not computed: {'; '.join(errors)}"]
    notes += warnings
    if weights is None:
        for label, cfg in other_configs.items():
            other = (cfg or {}).get("dataset")
            if isinstance(other, Mapping):
                try:
                    theirs = TagWeights.from_config(other)
                except ConfigError:
                    continue
                if theirs != tw:
                    notes.append(
                        f"variant {label} has other dataset.slice_weights/edge_tags ({theirs.describe()}); "
                        "the production mix uses the baseline's"
                    )
    return tw, notes


def _num(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _signed(v: float) -> str:
    if not math.isfinite(v):
        return "-"
    return f"{v:+.1f}" if abs(v) >= 100 else f"{v:+.3f}"


def _effect(r: MixRow | None) -> tuple[str, str]:
    if r is None:
        return "-", "-"
    return (
        f"{_signed(r.effect)} [{_signed(r.ci_low)}, {_signed(r.ci_high)}]",
        f"{r.n_queries}/{r.n_groups}" + ("!" if r.bootstrap_unreliable else ""),
    )


def mix_table(
    rows: Sequence[MixRow], variants: Sequence[str], metrics: Sequence[str], splits: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """Headers and rows: per variant x metric x split, the production effect, then the edge cases'."""
    from rag_ablate.metrics.registry import display_name

    by_key = {(r.split, r.variant, r.metric, r.mix): r for r in rows}
    headers = [
        "variant",
        "metric",
        "split",
        "production base -> var",
        "production effect [95% CI]",
        "queries/groups",
        "edge cases base -> var",
        "edge effect [95% CI]",
        "edge queries/groups",
    ]
    body = []
    for v in variants:
        for m in metrics:
            for s in splits:
                prod, edge = by_key.get((s, v, m, "production")), by_key.get((s, v, m, "edge"))
                if prod is None and edge is None:
                    continue
                means = [
                    "-" if r is None else f"{_num(r.baseline_mean)} -> {_num(r.variant_mean)}"
                    for r in (prod, edge)
                ]
                body.append([v, display_name(m), s, means[0], *_effect(prod), means[1], *_effect(edge)])
    return headers, body


MIX_TEXT = (
    "production mix ({weights}; 95% CI: group bootstrap with the weights carried along, B={B}; "
    "! fewer than 30 groups; descriptive: not adjusted, not gated)"
)


def mix_terminal(
    rows: Sequence[MixRow],
    variants: Sequence[str],
    metrics: Sequence[str],
    splits: Sequence[str],
    describe: str,
    B: int,
) -> list[str]:
    """Lines under the terminal table (none without production-mix rows)."""
    if not rows:
        return []
    from rag_ablate.core.fmt import format_table

    headers, body = mix_table(rows, variants, metrics, splits)
    if not body:
        return []
    head = MIX_TEXT.format(weights=describe, B=B).removesuffix(")") + "; every metric: comparison.md):"
    return [head, format_table(headers, body)]


def mix_markdown(
    rows: Sequence[MixRow],
    variants: Sequence[str],
    metrics: Sequence[str],
    splits: Sequence[str],
    describe: str,
    B: int,
) -> list[str]:
    """The ``## Production mix`` section of comparison.md (none without rows)."""
    if not rows:
        return []
    headers, body = mix_table(rows, variants, metrics, splits)
    esc = [[c.replace("|", "\\|") for c in r] for r in body]
    return [
        "## Production mix",
        "",
        f"Effects weighted by `dataset.slice_weights` ({describe}): each query's weight is the product "
        "of its tags' weights, edge cases weigh 0 unless weighted in, and the effect is "
        "`sum w d / sum w` over the paired queries. The edge rows are the edge cases' own plain effect. "
        f"The 95% CI is the group bootstrap percentile interval (B = {B}, the draw the table above "
        "uses) with the weights carried along; these rows are descriptive (not adjusted, not gated). "
        "queries/groups: those with a weight > 0; `!` fewer than 30 groups, where a bootstrap interval "
        "is too narrow. Latency percentiles (p50, p95) have no weighted row. See docs/statistics.md, "
        '"The production mix".',
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(r) + " |" for r in esc),
        "",
    ]
