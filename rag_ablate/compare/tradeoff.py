"""Quality against cost: every variant's level of both, with intervals, and the Pareto frontier.

Per split, each variant gets one quality number (the mean of a per-query
metric, e.g. ``recall_at_5``, over the queries that have a value) and one cost
number (a percentile or a mean of a per-query cost, named as in
:mod:`rag_ablate.run.cost`: ``latency_p95_ms``, ``context_tokens``, ``usd_per_1k``,
...). Both get a percentile interval from a group bootstrap: the split's
near-duplicate groups are resampled with replacement (one draw per split, from
a seed derived from the run seed, the split and its groups: the comparison's draw,
shared by every variant), and each resample
weights a query by how often its group was drawn.

* **Pareto frontier**: the variants no other variant beats on both axes (at
  least as good on both and strictly better on one). Equal points do not beat
  each other, so both stay on the frontier.
* **Iso-quality view**: for a quality bar (``compare.quality_bar``), the
  cheapest variant whose interval's lower bound clears the bar (upper bound,
  for a lower-is-better quality metric), and each variant's cost relative to it.

Written as ``tradeoff.json`` / ``tradeoff.md``; :func:`plot` draws
``quality_vs_cost.png`` (matplotlib, imported only when plotting). See
docs/statistics.md for the bootstrap.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import LATENCY, SplitDraw, split_draw, value
from rag_ablate.compare.columns import Columns, VariantColumns
from rag_ablate.compare.draws import SharedDraws, domain_ratios
from rag_ablate.compare.load import pick_baseline
from rag_ablate.compare.model import Comparison, Point, SplitTradeoff, Tradeoff, VariantData
from rag_ablate.config.schema import CompareConfig, ModelPrice
from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.registry import auto_quality, direction_of, display_name, parse_metric_name
from rag_ablate.records.trace import Record
from rag_ablate.run import cost

FloatArray = npt.NDArray[np.float64]

TRADEOFF_JSON = "tradeoff.json"
TRADEOFF_MD = "tradeoff.md"
PLOT_FILE = "quality_vs_cost.png"

AUTO = "auto"
# quality ``auto``: the registry's quality axes (MetricSpec.quality_axis, registry.auto_quality)
#: cost names (rag_ablate.run.cost's ``cost/`` section, not registered metrics: the percentile of
#: cost.query_latency_ms, cost.final_context_tokens) tried in order for ``compare.cost_metric=auto``:
#: money, then p95 latency, then tokens
AUTO_COSTS = ("usd_per_1k", "latency_p95_ms", "context_tokens")

_PCT_RE = re.compile(r"^(?P<base>[a-z0-9_]+?)_p(?P<q>[0-9]{1,2}(?:\.[0-9]+)?)_ms$")

# --------------------------------------------------------------------------- per-query values


@dataclass(frozen=True)
class Measure:
    """How one plotted number comes from per-query values.

    ``extract`` gives a query's value (None: the query has none); the number is
    the mean of the values (``q`` None) or their ``q``-th percentile.
    ``higher`` says which way is better.
    """

    name: str
    extract: Callable[[Record], float | None]
    q: float | None
    higher: bool
    unit: str = ""
    #: ``extract`` of every record at once, NaN for None (None: read record by record)
    column: Callable[[VariantColumns], FloatArray] | None = None


def _stage_ms(stage: str) -> Callable[[Record], float | None]:
    def get(rec: Record) -> float | None:
        v = (rec.get("timings_ms") or {}).get(stage)
        return None if v is None else float(v)

    return get


def _latency(rec: Record) -> float | None:
    """A query's latency as the comparison's latency rows time it: its ``latency_ms`` metric (the
    interleaved timing pass's time after :func:`rag_ablate.compare.timing.apply_timing`, NaN where the
    pass failed), else its end-to-end time; a failed query's time counts (it was spent)."""
    metrics = rec.get("metrics") or {}
    if LATENCY in metrics:
        v = metrics[LATENCY]
        return None if v is None else float(v)
    return cost.query_latency_ms(rec)


def _ttft(rec: Record) -> float | None:
    v = rec.get("ttft_ms")
    return None if v is None else float(v)


def _usage(name: str) -> Callable[[Record], float | None]:
    def get(rec: Record) -> float | None:
        return cost.query_tokens(rec, name)

    return get


def _metric(name: str) -> Callable[[Record], float | None]:
    return lambda rec: value(rec, name)


def _metric_column(name: str) -> Callable[[VariantColumns], FloatArray]:
    return lambda cols: cols.value(name)


def _latency_column(cols: VariantColumns) -> FloatArray:
    return cols.spent_latency()


def _usd(price: ModelPrice, scale: float) -> Callable[[Record], float | None]:
    return lambda rec: cost.query_usd(rec, price) * scale


def quality_measure(metric: str) -> Measure:
    """A quality metric: the mean of a registered per-query metric (``recall_at_5``)."""
    parse_metric_name(metric)  # unknown names fail listing the valid ones
    higher = direction_of(metric) == "higher"
    return Measure(metric, _metric(metric), None, higher, column=_metric_column(metric))


def cost_measure(name: str, price: ModelPrice | None = None) -> Measure:
    """A cost metric by its :mod:`rag_ablate.run.cost` name, or a per-query metric's mean.

    ``latency_p95_ms`` (any ``<stage>_p<q>_ms``, ``ttft_p50_ms``),
    ``context_tokens``, ``prompt_tokens``/``completion_tokens``/``embedding_tokens``,
    ``usd_per_query``/``usd_per_1k`` (need ``price``), or a registered metric such
    as ``context_tokens_at_5`` or ``latency_ms``. Lower is always better.
    """
    m = _PCT_RE.match(name)
    if m:
        base, q = m.group("base"), float(m.group("q"))
        if not 0 <= q <= 100:
            raise ConfigError(f"compare.cost_metric '{name}': percentile must be in [0, 100]")
        if base == "latency":
            return Measure(name, _latency, q, False, "ms", _latency_column)
        if base == "ttft":
            return Measure(name, _ttft, q, False, "ms")
        return Measure(name, _stage_ms(base), q, False, "ms")
    if name == "context_tokens":
        return Measure(name, cost.final_context_tokens, None, False, "tokens")
    if name in cost.USAGE_FIELDS:
        return Measure(name, _usage(name), None, False, "tokens")
    if name in ("usd_per_query", "usd_per_1k"):
        if price is None:
            return Measure(name, lambda rec: None, None, False, "USD")
        return Measure(name, _usd(price, 1000.0 if name == "usd_per_1k" else 1.0), None, False, "USD")
    try:
        spec, _ = parse_metric_name(name)
    except Exception as exc:
        raise ConfigError(
            f"compare.cost_metric '{name}' is not a cost: use latency_p95_ms, latency_p50_ms, "
            "<stage>_p95_ms, ttft_p95_ms, context_tokens, prompt_tokens, completion_tokens, "
            f"embedding_tokens, usd_per_1k, usd_per_query or a per-query metric ({exc})"
        ) from None
    return Measure(name, _metric(name), None, spec.direction == "higher", "", _metric_column(name))


def _row_values(rows: Sequence[Record], measure: Measure) -> tuple[list[float], list[str]]:
    """The per-query values of ``measure`` of a split's records ``rows`` and the queries' groups.

    Money counts every query of the split (a query without usage spent 0), as
    :func:`rag_ablate.run.cost.cost_metrics` does; everything else only the queries
    that have a value.
    """
    vals: list[float] = []
    groups: list[str] = []
    money = measure.name.startswith("usd_")
    if money and not any(r.get("usage") for r in rows):
        return [], []
    for r in rows:
        v = measure.extract(r)
        if v is None or not math.isfinite(v):
            continue
        vals.append(float(v))
        groups.append(str(r.get("group", r.get("query_id"))))
    return vals, groups


def _column_values(
    cols: VariantColumns, rows: npt.NDArray[np.intp], measure: Measure
) -> tuple[list[float], list[str]]:
    """:func:`_row_values` of the records at ``rows`` of ``cols``."""
    if measure.column is None:
        if measure.name.startswith("usd_") and not cols.has_usage(rows):
            return [], []
        return _row_values([cols.records[i] for i in rows.tolist()], measure)
    vals = measure.column(cols)[rows]
    kept = np.isfinite(vals)
    groups = cols.group_or_id()
    return vals[kept].tolist(), list(map(groups.__getitem__, rows[kept].tolist()))


def price_of(variant: VariantData) -> ModelPrice | None:
    """The price a variant's tokens are billed at, from its config's ``cost`` section."""
    c = (variant.config or {}).get("cost") or {}
    model = c.get("model")
    prices = c.get("prices") or {}
    if model is None or model not in prices:
        return None
    p = prices[model] or {}
    return ModelPrice(
        prompt=float(p.get("prompt", 0.0)),
        completion=float(p.get("completion", 0.0)),
        embedding=float(p.get("embedding", 0.0)),
    )


def _has_values(variants: Sequence[VariantData], name: str, splits: Sequence[str], columns: Columns) -> bool:
    """Whether some variant has a value of cost ``name`` on one of ``splits`` (:func:`_column_values`)."""
    for v in variants:
        m, cols = cost_measure(name, price_of(v)), columns.of(v)
        if any(_column_values(cols, cols.positions(s), m)[0] for s in splits):
            return True
    return False


def choose_metrics(
    variants: Sequence[VariantData],
    settings: CompareConfig,
    splits: Sequence[str],
    columns: Columns | None = None,
) -> tuple[str, str]:
    """The quality and cost metric plotted: the configured ones, or the defaults for ``auto``.

    Quality ``auto``: the best-ranked quality axis of the registry the records carry (an answer
    metric: ``token_f1``, ``exact_match``), else ``recall_at_5`` (``registry.auto_quality``).
    Cost ``auto``: ``usd_per_1k`` when a price and token usage
    are known, else ``latency_p95_ms`` when queries are timed, else ``context_tokens``.
    ``columns``: the records as columns, shared with the planners (:mod:`rag_ablate.compare.columns`).
    """
    cols = columns if columns is not None else Columns()
    quality = settings.quality_metric
    if quality == AUTO:
        quality = auto_quality(cols.present(variants))
    quality_measure(quality)
    cost_name = settings.cost_metric
    if cost_name == AUTO:
        cost_name = next((c for c in AUTO_COSTS if _has_values(variants, c, splits, cols)), AUTO_COSTS[-1])
    cost_measure(cost_name)
    return quality, cost_name


# --------------------------------------------------------------------------- bootstrap


def weighted_stat(
    values: FloatArray, weights: npt.NDArray[Any], q: float | None, *, presorted: bool = False
) -> FloatArray:
    """Per row of ``weights`` (c, n): the mean, or the q-th percentile, of ``values`` (n,)
    repeated ``weights[b, i]`` times each -- exactly what ``np.mean`` / ``np.percentile``
    (linear) give on the expanded sample. NaN for a row whose weights are all 0.

    The percentile needs no expanded sample: with the values sorted, the
    expanded sample's i-th order statistic is the value at the first position
    whose cumulative weight exceeds i, found for every row at once by one
    cumulative sum and one ``np.searchsorted`` over the rows laid end to end.
    ``presorted``: ``values`` are ascending and ``weights`` in the same order.
    """
    w = np.asarray(weights)
    c, n = w.shape
    out = np.full(c, np.nan)
    if n == 0:
        return out
    if q is None:
        total_f = w.sum(axis=1, dtype=np.float64)
        ok = total_f > 0
        out[ok] = (w[ok] @ values) / total_f[ok]
        return out
    if presorted:
        v = values
    else:
        order = np.argsort(values, kind="stable")
        v, w = values[order], w[:, order]
    # one cumulative sum over the rows laid end to end: row b's entries follow every earlier row's
    flat = np.cumsum(w.ravel().astype(np.int64))  # (several times faster than dtype=)
    ends = flat[n - 1 :: n]
    starts = np.concatenate(([0], ends[:-1]))
    total = ends - starts
    ok = total > 0
    h = (total - 1) * (q / 100.0)
    lo = np.floor(h)
    frac = h - lo
    hi = np.minimum(lo + 1, total - 1)
    base = np.arange(c, dtype=np.int64) * n

    def at(i: FloatArray) -> FloatArray:
        idx = np.searchsorted(flat, starts + i.astype(np.int64), side="right") - base
        return np.asarray(v[np.clip(idx, 0, n - 1)], dtype=np.float64)

    a, b = at(lo), at(hi)
    out[ok] = (a + (b - a) * frac)[ok]
    return out


def point_stat(values: Sequence[float], q: float | None) -> float:
    """The number itself: mean, or numpy's linear percentile; NaN without values."""
    if not values:
        return math.nan
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()) if q is None else float(np.percentile(arr, q))


def _register(
    draws: SharedDraws,
    draw: SplitDraw,
    values: Sequence[float],
    groups: Sequence[str],
    index: Mapping[str, int],
    q: float | None,
) -> Callable[[], FloatArray]:
    """Register the statistic of ``values`` (the mean, or the q-th percentile) over every resample of
    the split's draw on ``draws``: a linear consumer whose columns join the draw's one product per
    chunk (:mod:`rag_ablate.compare.draws`); the returned function gives its (B,) distribution after
    the draws ran (:func:`weighted_stat`'s numbers, NaN for a resample without any value)."""
    vals = np.asarray(values, dtype=np.float64)
    if not vals.size:
        return lambda: np.full(draws.B, np.nan)
    codes = np.fromiter(map(index.__getitem__, groups), np.int64, len(groups))
    n_groups = draw.n_groups
    if q is None:  # the mean: the resampled sum over the resampled count
        sm = np.stack(
            [np.bincount(codes, weights=vals, minlength=n_groups), np.bincount(codes, minlength=n_groups)],
            axis=1,
        ).astype(np.float64)
        got = draws.add_linear(draw.key, draw.seed, n_groups, sm, domain_ratios)
        return lambda: got.result()[:, 0]
    # a percentile: searched in a window of sorted positions (stats.resample_percentiles), exactly
    setup = stats.percentile_setup(vals, codes, n_groups, q)
    got = draws.add_linear_chunk(
        draw.key,
        draw.seed,
        n_groups,
        setup.cols,
        lambda prod, ch: stats.resample_percentiles(ch.counts, setup, sums=prod),
    )
    return got.result


def _interval(boot: FloatArray, alpha: float) -> tuple[float, float]:
    finite = boot[np.isfinite(boot)]
    if finite.size == 0:
        return math.nan, math.nan
    lo, hi = np.percentile(finite, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


# --------------------------------------------------------------------------- frontier and bar


def pareto_frontier(points: Sequence[tuple[float, float]], *, quality_higher: bool = True) -> list[bool]:
    """For (quality, cost) points: True where no other point beats it on both axes.

    ``a`` beats ``b`` when it is at least as good on both (quality higher or
    lower as ``quality_higher`` says; cost lower) and strictly better on one.
    Identical points do not beat each other. A point with a NaN is never on it.
    """
    sign = 1.0 if quality_higher else -1.0
    good = [(sign * q, -c) for q, c in points]  # larger is better on both
    out = []
    for i, (qi, ci) in enumerate(good):
        if not (math.isfinite(qi) and math.isfinite(ci)):
            out.append(False)
            continue
        beaten = any(
            j != i and qj >= qi and cj >= ci and (qj > qi or cj > ci)
            for j, (qj, cj) in enumerate(good)
            if math.isfinite(qj) and math.isfinite(cj)
        )
        out.append(not beaten)
    return out


def iso_quality(
    points: Sequence[tuple[str, float, float, float, float]], bar: float, *, quality_higher: bool = True
) -> str | None:
    """The cheapest variant whose quality interval clears ``bar``; None when none does.

    ``points``: (label, quality, quality CI low, quality CI high, cost). Clearing
    means CI low >= bar (CI high <= bar for a lower-is-better quality). Ties on
    cost go to the better quality, then to the earlier variant.
    """
    best: tuple[float, float, int] | None = None
    choice = None
    for i, (label, qv, lo, hi, c) in enumerate(points):
        bound = lo if quality_higher else hi
        if not (math.isfinite(bound) and math.isfinite(c)):
            continue
        if (bound >= bar) if quality_higher else (bound <= bar):
            key = (c, -qv if quality_higher else qv, i)
            if best is None or key < best:
                best, choice = key, label
    return choice


# --------------------------------------------------------------------------- the trade-off


def compute(
    variants: Sequence[VariantData],
    settings: CompareConfig,
    *,
    seed: int,
    baseline: str | None = None,
) -> Tradeoff:
    """The trade-off of every variant, per split of ``settings.splits``, on draws of its own
    (:func:`plan`, then the draws); see the module docstring."""
    draws = SharedDraws(settings.B)
    done = plan(variants, settings, seed=seed, baseline=baseline, draws=draws)
    draws.run()
    return done()


def plan(
    variants: Sequence[VariantData],
    settings: CompareConfig,
    *,
    seed: int,
    baseline: str | None = None,
    draws: SharedDraws,
    columns: Columns | None = None,
) -> Callable[[], Tradeoff]:
    """Plan the trade-off: each split's statistics registered on its draw on ``draws`` (the comparison's
    draw when the groups are the baseline's and the comparison registers on the same ``draws``); after
    ``draws.run()`` the returned function finishes it (``draws.B`` resamples: ``settings.B`` is not read).
    ``columns``: the records as columns, shared with the other planners
    (:mod:`rag_ablate.compare.columns`)."""
    if not variants:
        raise ConfigError("the trade-off needs at least one variant")
    base, _ = pick_baseline(variants, baseline if baseline is not None else settings.baseline)
    splits = list(settings.splits)
    cols = columns if columns is not None else Columns()
    quality, cost_name = choose_metrics(variants, settings, splits, cols)
    qm = quality_measure(quality)
    notes: list[str] = []
    cost_unit = cost_measure(cost_name).unit
    planned = []
    for split in splits:
        per_variant = []
        all_groups: set[str] = set()
        for v in variants:
            cm = cost_measure(cost_name, price_of(v))
            vc = cols.of(v)
            rows = vc.positions(split)
            qv, qg = _column_values(vc, rows, qm)
            cv, cg = _column_values(vc, rows, cm)
            all_groups.update(qg)
            all_groups.update(cg)
            per_variant.append((v, cm, qv, qg, cv, cg))
        if not all_groups:
            notes.append(f"no variant has {quality} or {cost_name} values on split '{split}'")
            continue
        # the comparison's draw of the split (the same draw when the groups are the baseline's)
        draw = split_draw(seed, split, all_groups)
        index = {g: i for i, g in enumerate(draw.labels.tolist())}
        drawn = [
            (_register(draws, draw, qv, qg, index, None), _register(draws, draw, cv, cg, index, cm.q))
            for _, cm, qv, qg, cv, cg in per_variant
        ]
        planned.append((split, len(index), per_variant, drawn))

    def done() -> Tradeoff:
        out_splits = [
            _split(split, n_groups, per_variant, drawn, base, qm, cost_name, settings, notes)
            for split, n_groups, per_variant, drawn in planned
        ]
        return Tradeoff(
            quality_metric=quality,
            cost_metric=cost_name,
            quality_higher=qm.higher,
            cost_unit=cost_unit,
            baseline=base.label,
            quality_bar=settings.quality_bar,
            B=draws.B,
            seed=seed,
            alpha=settings.alpha,
            splits=out_splits,
            notes=notes,
        )

    return done


def _split(
    split: str,
    n_groups: int,
    per_variant: Sequence[tuple[VariantData, Measure, list[float], list[str], list[float], list[str]]],
    drawn: Sequence[tuple[Callable[[], FloatArray], Callable[[], FloatArray]]],
    base: VariantData,
    qm: Measure,
    cost_name: str,
    settings: CompareConfig,
    notes: list[str],
) -> SplitTradeoff:
    """One split's points, intervals, frontier and bar, from its drawn statistics."""
    points, effects = [], []
    base_i = next(i for i, pv in enumerate(per_variant) if pv[0] is base)
    base_cost = drawn[base_i][1]()
    for (v, cm, qv, _qg, cv, _cg), (boot_q, boot_c_of) in zip(per_variant, drawn, strict=True):
        q_lo, q_hi = _interval(boot_q(), settings.alpha)
        boot_c = boot_c_of()
        c_lo, c_hi = _interval(boot_c, settings.alpha)
        # the cost against the baseline's: both drawn from the same resamples, so the difference
        # of each resample's two statistics is the difference's bootstrap distribution
        effects.append(_interval(boot_c - base_cost, settings.alpha))
        if not cv:
            notes.append(f"{v.label} has no {cost_name} on split '{split}'")
        points.append(
            Point(
                variant=v.label,
                quality=point_stat(qv, None),
                quality_low=q_lo,
                quality_high=q_hi,
                n_quality=len(qv),
                cost=point_stat(cv, cm.q),
                cost_low=c_lo,
                cost_high=c_hi,
                n_cost=len(cv),
                baseline=v is base,
            )
        )
    base_value = points[base_i].cost
    for p, (d_lo, d_hi) in zip(points, effects, strict=True):
        p.cost_effect, p.cost_effect_low, p.cost_effect_high = p.cost - base_value, d_lo, d_hi
    st = SplitTradeoff(split, n_groups, points)
    front = pareto_frontier([(p.quality, p.cost) for p in points], quality_higher=qm.higher)
    for p, f in zip(points, front, strict=True):
        p.frontier = f
    if settings.quality_bar is not None:
        _apply_bar(st, settings.quality_bar, qm.higher)
    return st


def attach(c: Comparison, variants: Sequence[VariantData], settings: CompareConfig, *, seed: int) -> None:
    """Choose the sweep's quality and cost axes once (``compare.quality_metric`` / ``cost_metric``,
    ``auto`` resolved by :func:`choose_metrics`), set them on ``c`` and compute its trade-off on them.
    Every view reads the axes from the comparison (``Comparison.quality_metric`` / ``cost_metric``)."""
    axes = settle_axes(variants, settings, c.splits)
    c.quality_metric, c.cost_metric = axes.quality_metric, axes.cost_metric
    c.tradeoff = compute(variants, axes, seed=seed, baseline=c.baseline)


def settle_axes(
    variants: Sequence[VariantData],
    settings: CompareConfig,
    splits: Sequence[str],
    columns: Columns | None = None,
) -> CompareConfig:
    """``settings`` over ``splits`` with the quality and cost axes chosen (:func:`choose_metrics`:
    ``auto`` resolved), as :func:`attach` computes the trade-off and sets the comparison's axes."""
    quality, cost_name = choose_metrics(variants, settings, splits, columns)
    return replace(settings, splits=list(splits), quality_metric=quality, cost_metric=cost_name)


def _apply_bar(st: SplitTradeoff, bar: float, higher: bool) -> None:
    st.choice = iso_quality(
        [(p.variant, p.quality, p.quality_low, p.quality_high, p.cost) for p in st.points],
        bar,
        quality_higher=higher,
    )
    ref = st.point(st.choice) if st.choice is not None else None
    for p in st.points:
        bound = p.quality_low if higher else p.quality_high
        p.clears_bar = bool(math.isfinite(bound) and ((bound >= bar) if higher else (bound <= bar)))
        if ref is not None and ref.cost > 0 and math.isfinite(p.cost):
            p.cost_ratio = p.cost / ref.cost


# --------------------------------------------------------------------------- output


def fmt(v: float | None, unit: str = "") -> str:
    """A number for tables: 3 decimals below 100, 1 above, '-' for none."""
    if v is None or not math.isfinite(v):
        return "-"
    if unit == "USD":
        return f"{v:.4g}"
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def cost_display(name: str) -> str:
    """A cost metric's name for tables and axes: ``latency p95 ms``, ``USD per 1k queries``."""
    m = _PCT_RE.match(name)
    if m:
        return f"{m.group('base').replace('_', ' ')} p{m.group('q')} ms"
    special = {"usd_per_1k": "USD per 1k queries", "usd_per_query": "USD per query"}
    if name in special:
        return special[name]
    try:
        return display_name(name)
    except Exception:
        return name.replace("_", " ")


def table_rows(t: Tradeoff, st: SplitTradeoff) -> tuple[list[str], list[list[str]]]:
    """Header and rows of one split's table (shared by markdown and HTML)."""
    q, c = display_name(t.quality_metric), cost_display(t.cost_metric)
    level = round(100 * (1 - t.alpha))
    headers = ["variant", f"{q} [{level}% CI]", f"{c} [{level}% CI]", "Pareto frontier"]
    if t.quality_bar is not None:
        headers += [f"clears {q} >= {fmt(t.quality_bar)}" if t.quality_higher else "clears bar", "cost ratio"]
    rows = []
    for p in st.points:
        name = p.variant + (" (baseline)" if p.baseline and p.variant != "baseline" else "")
        row = [
            name,
            f"{fmt(p.quality)} [{fmt(p.quality_low)}, {fmt(p.quality_high)}]",
            f"{fmt(p.cost, t.cost_unit)} [{fmt(p.cost_low, t.cost_unit)}, {fmt(p.cost_high, t.cost_unit)}]",
            "yes" if p.frontier else "",
        ]
        if t.quality_bar is not None:
            chosen = " (cheapest)" if p.variant == st.choice else ""
            row += [
                ("yes" if p.clears_bar else "no") + chosen,
                "-" if p.cost_ratio is None else f"{p.cost_ratio:.2f}x",
            ]
        rows.append(row)
    return headers, rows


def choice_sentence(t: Tradeoff, st: SplitTradeoff) -> str:
    """The iso-quality view in one sentence."""
    if t.quality_bar is None:
        return "no quality bar set (compare.quality_bar)"
    q = display_name(t.quality_metric)
    rel = ">=" if t.quality_higher else "<="
    if st.choice is None:
        return (
            f"no variant clears {st.split} {q} {rel} {fmt(t.quality_bar)} with its "
            f"{round(100 * (1 - t.alpha))}% interval"
        )
    p = st.point(st.choice)
    assert p is not None
    return (
        f"cheapest variant with {st.split} {q} {rel} {fmt(t.quality_bar)} (interval bound): "
        f"{st.choice} at {cost_display(t.cost_metric)} {fmt(p.cost, t.cost_unit)}"
    )


def format_markdown(t: Tradeoff) -> str:
    level = round(100 * (1 - t.alpha))
    lines = [
        f"# Quality against cost: {display_name(t.quality_metric)} vs {cost_display(t.cost_metric)}",
        "",
        f"Per variant: the quality mean and the cost ({t.cost_metric}) with {level}% group-bootstrap "
        f"intervals (B={t.B}, seed {t.seed}); the Pareto frontier holds the variants no other variant "
        "beats on both.",
    ]
    for st in t.splits:
        headers, rows = table_rows(t, st)
        lines += ["", f"## {st.split} ({st.n_groups} groups)", ""]
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "---|" * len(headers))
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
        if t.quality_bar is not None:
            lines += ["", choice_sentence(t, st)]
    if t.notes:
        lines += ["", "Notes:", *(f"- {n}" for n in t.notes)]
    return "\n".join(lines) + "\n"


def write(t: Tradeoff, out_dir: Path) -> list[Path]:
    """Write ``tradeoff.json`` and ``tradeoff.md``."""
    from rag_ablate.core.fsio import write_json_atomic, write_text_atomic

    j, m = out_dir / TRADEOFF_JSON, out_dir / TRADEOFF_MD
    write_json_atomic(j, t.to_dict())
    write_text_atomic(m, format_markdown(t))
    return [j, m]


# --------------------------------------------------------------------------- plotting


def check_settings(settings: CompareConfig) -> None:
    """Fail at composition time on an unknown ``compare.quality_metric`` / ``cost_metric`` or a bad bar."""
    if settings.quality_metric != AUTO:
        quality_measure(settings.quality_metric)
    if settings.cost_metric != AUTO:
        cost_measure(settings.cost_metric)
    if settings.quality_bar is not None and not math.isfinite(settings.quality_bar):
        raise ConfigError(f"compare.quality_bar must be a finite number, got {settings.quality_bar}")
