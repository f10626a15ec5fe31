"""The statistics glue: per split, per variant against the baseline, per metric.

Which queries enter a metric's comparison:

* a metric with a failure-aware form (``MetricSpec.miss``: retrieval, evidence, intent,
  answers, judged scores, leak rate) is failure-aware under its plain name: a query that
  failed on one side scores the miss there (``recall_at_5``: 0) when the metric applies to it
  (its failed record names the metric with None, or the other side has a value and this side
  measures the metric), so a variant that fails more can never lead; a query failed on both
  sides without a known applicability is left out (its difference would be 0). Beside it the row
  keeps the ok-only figures (``ok_*``), over the queries ``ok`` on both sides;
* other metrics (context tokens, latency, leaked-document counts) run over the queries ``ok``
  on both sides that have a value on both; a query that failed on either side is left out of
  them and counted, by why, in the split's :class:`~rag_ablate.compare.model.Pair`. Latency in
  particular: a failure's time is reported apart (``Pair.failed_latency_ms_*``), so errors that
  return fast never read as "faster" and a timeout never as "slower";
* ``error_rate`` is the per-query 0/1 "failed" indicator (lower is better), over
  every query with a record on both sides, so failures are compared with the
  same test, interval and adjustment as any metric (``MetricSpec.uses_failed``).

A metric that applies but has no paired query (every query failed in the
variant, say) becomes a row with a ``note`` and no numbers, never a silent gap.

Seeds: one bootstrap draw per split (derived from the run seed, the split and its
groups), shared by every variant, metric, percentile and weighting, and by the slices
and the trade-off: a test over some of the split's queries is a domain of it
(:mod:`rag_ablate.compare.draws`). Likewise one stream of sign vectors per split, from
which every sign-flip test of the split (every variant, metric and slice) takes its
groups' signs, so adding or removing a variant never changes another variant's numbers.
See docs/statistics.md.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats
from rag_ablate.compare.columns import Columns, take
from rag_ablate.compare.draws import Collector, SharedDraws, domain_ratios, quantiles
from rag_ablate.compare.load import pick_baseline
from rag_ablate.compare.mix import MixRow, mix_columns, mix_rows, pick_mixes, weighted_group_sums
from rag_ablate.compare.mix import settle as settle_weights
from rag_ablate.compare.model import Comparison, Flip, Flips, Pair, Row, VariantData
from rag_ablate.core.errors import ComparisonError
from rag_ablate.dataset.weights import TagWeights
from rag_ablate.metrics.registry import (
    MetricSpec,
    default_compare_metrics,
    direction_of,
    display_name,
    metric_name,
    parse_metric_name,
    spec_of,
)
from rag_ablate.records.trace import Record

# the two metrics whose per-query value is not simply the record's: every other fact about a metric
# (which queries it uses, its scale, quantile, family) is on its MetricSpec
ERROR_RATE = "error_rate"  # the record's status, not a stored value
LATENCY = "latency_ms"  # falls back to timings_ms.total


def family_of(metric: str) -> str:
    """The multiple-comparison family of a metric within a split: ``timing`` or ``main``.

    Metrics read off the clock (``MetricSpec.family == "timing"``) differ between any two runs of
    one variant, so they are adjusted in a family of their own and their noise never moves another
    row's adjusted p.
    """
    return "timing" if spec_of(metric).family == "timing" else "main"


def per_query(metric: str) -> str:
    """The per-query value a metric is computed from (``latency_ms`` for a latency percentile)."""
    return spec_of(metric).quantile_of or metric


def quantile_of(metric: str) -> float | None:
    """The percentile a metric is of its per-query values (None: compared as a per-query mean)."""
    return spec_of(metric).quantile


_SPECS: dict[str, MetricSpec] = {}


def _spec(metric: str) -> MetricSpec:
    """:func:`spec_of`, looked up once per name (the comparison asks it for every record)."""
    spec = _SPECS.get(metric)
    if spec is None:
        spec = _SPECS[metric] = spec_of(metric)
    return spec


def failed(rec: Record) -> bool:
    return bool(rec.get("status", "ok") != "ok")


def value(rec: Record, metric: str) -> float | None:
    """A record's value of ``metric`` as the comparison uses it (None: no value): failure-aware,
    so a failed record that names the metric (it applied) scores its ``MetricSpec.miss``."""
    values = rec.get("metrics") or {}
    if metric == ERROR_RATE:  # a query's repeats stand as one record with their share of failures
        share = values.get(ERROR_RATE)
        return float(share) if share is not None else (1.0 if failed(rec) else 0.0)
    v = values.get(metric)
    if metric == LATENCY and v is None:
        v = (rec.get("timings_ms") or {}).get("total")
    spec = _spec(metric)
    if failed(rec) and not spec.uses_failed:
        return spec.miss if spec.miss is not None and metric in values else None
    if v is None:
        return None
    x = float(v)
    return x if math.isfinite(x) else None


def failed_latency(rec: Record) -> float | None:
    """A failed record's time until it failed (None: not failed, or not timed)."""
    if not failed(rec):
        return None
    v = (rec.get("metrics") or {}).get(LATENCY)
    if v is None:
        v = (rec.get("timings_ms") or {}).get("total")
    return None if v is None or not math.isfinite(float(v)) else float(v)


@dataclass(frozen=True)
class SplitDraw:
    """The one bootstrap draw of a split: its key, seed and groups (sorted labels). Every test of
    the split (failure-aware and ok-on-both metrics, latency percentiles, the production mix,
    slices, the trade-off) is a domain of it (:mod:`rag_ablate.compare.draws`)."""

    key: tuple[str, str]
    seed: int
    labels: npt.NDArray[np.str_]

    @property
    def n_groups(self) -> int:
        return int(self.labels.shape[0])

    def codes(self, groups: Sequence[str]) -> npt.NDArray[np.intp]:
        """Each label's position among the split's groups."""
        g = np.asarray(groups, dtype=self.labels.dtype if len(groups) else np.str_)
        pos = np.searchsorted(self.labels, g)
        if np.any(pos >= self.n_groups) or np.any(self.labels[np.minimum(pos, self.n_groups - 1)] != g):
            raise ComparisonError(f"draw {self.key}: a group that is not among the split's groups")
        return np.asarray(pos, dtype=np.intp)

    def add(
        self,
        shared: SharedDraws,
        groups: Sequence[str] | npt.NDArray[np.intp],
        cols: npt.NDArray[np.float64],
        finish: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
    ) -> Collector:
        """A linear consumer of the draw over the queries whose group labels are ``groups`` (or their
        :meth:`codes`, which sort alike): ``cols`` has one row per distinct label, in sorted order
        (as :func:`stats.group_sums` gives them). A subset of more than 1/:data:`GATHER_BELOW` of the
        split's groups joins the draw's one product with every group (the other groups' rows 0); a
        smaller one multiplies its own groups' counts."""
        cols, rows = self._domain(groups, cols)
        return shared.add_linear(self.key, self.seed, self.n_groups, cols, finish, rows)

    @property
    def sign_seed(self) -> int:
        """The seed of the split's one stream of sign vectors, shared by every sign-flip test of the
        split (``paired_test(signflip_seed=...)`` draws the same vectors)."""
        return stats.derive_seed(self.seed, "signs")

    def add_signs(
        self,
        shared: SharedDraws,
        groups: Sequence[str] | npt.NDArray[np.intp],
        sums_sizes: npt.NDArray[np.float64],
    ) -> Collector | None:
        """The sign-flip sums of a paired test over the queries whose group labels are ``groups``
        (``sums_sizes``: :func:`stats.group_sums_sizes` of their differences), from the split's one
        stream of sign vectors, each test taking the signs of its own groups (the ``signs`` of
        :func:`stats.paired_test`); None when the test enumerates every sign vector (2**G <= B)."""
        n = sums_sizes.shape[0]
        if n < 63 and (1 << n) <= shared.B:
            return None
        cols, rows = self._domain(groups, sums_sizes)
        return shared.add_signs((*self.key, "signs"), self.sign_seed, self.n_groups, cols, rows)

    def _domain(
        self, groups: Sequence[str] | npt.NDArray[np.intp], cols: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp] | None]:
        """``cols`` of the groups ``groups`` (labels, or their :meth:`codes`) as a consumer of the
        split takes them (:meth:`add`)."""
        if isinstance(groups, np.ndarray) and groups.dtype.kind in "iu":
            # the distinct codes, sorted: a mask over the split's groups (np.unique hashes or sorts)
            seen = np.zeros(self.n_groups, dtype=bool)
            seen[groups] = True
            rows = np.flatnonzero(seen).astype(np.intp, copy=False)
        else:
            rows = self.codes(sorted(set(groups)))
        if GATHER_BELOW * rows.shape[0] > self.n_groups:
            full = np.zeros((self.n_groups, cols.shape[1]))
            full[rows] = cols
            return full, None
        return cols, rows


#: a test over fewer than 1/16 of its split's groups gathers their counts instead of joining the
#: split's dense product (measured at 10,000 queries: the dense product is cheaper for slices of an
#: intent or a tag, a gather per test costs more than the columns it saves)
GATHER_BELOW = 16


def split_draw(seed: int, split: str, groups: Iterable[str]) -> SplitDraw:
    """The draw of a split whose queries are in ``groups``: seeded by the run seed, the split and a
    digest of its sorted group labels, so the comparison, its slices and the trade-off draw the
    same resamples."""
    uniq = sorted(set(groups))
    digest = hashlib.sha256("\x1f".join(uniq).encode("utf-8")).hexdigest()[:16]
    return SplitDraw((split, digest), stats.derive_seed(seed, split, digest), np.array(uniq, dtype=np.str_))


def base_draw(
    cols: Columns, base: VariantData, seed: int, split: str
) -> tuple[SplitDraw, npt.NDArray[np.intp]]:
    """The draw of a split whose groups are the baseline's records' (:func:`split_draw`) and each of
    the baseline's queries' group codes in it (in ``Columns.of(base).rows(split)``'s order), made
    once for every planner sharing ``cols``."""

    def make() -> tuple[SplitDraw, npt.NDArray[np.intp]]:
        labels = cols.of(base).groups(cols.of(base).rows(split))
        draw = split_draw(seed, split, labels)
        return draw, draw.codes(labels)

    return cols.memo(("draw", id(base.records), seed, split), make)


def _pair(
    split: str,
    variant: str,
    base: Mapping[str, Record],
    var: Mapping[str, Record],
    var_only: Sequence[Record],
    in_var: npt.NDArray[np.bool_],
    base_failed: npt.NDArray[np.bool_],
    var_failed: npt.NDArray[np.bool_],
) -> Pair:
    """How the split's queries pair: ``in_var``, ``base_failed`` / ``var_failed``, over the baseline's
    ids in order, say which have a record in the variant and which have a failed record on each side
    (no record: not failed). Counted from these masks, so the records are not read again; the
    variant's own queries (``var_only``, no baseline record) are left out as having no record."""
    base_ids = list(base)
    failed_ids = [base_ids[i] for i in np.flatnonzero(base_failed).tolist()]
    var_failed_ids = [base_ids[i] for i in np.flatnonzero(var_failed).tolist()]

    def median_failed(recs: Iterable[Record]) -> float | None:
        times = [t for r in recs if (t := failed_latency(r)) is not None]
        return float(np.median(times)) if times else None

    var_only_failed = [r for r in var_only if failed(r)]
    return Pair(
        split=split,
        variant=variant,
        n_queries=len(base) + len(var_only),
        n_baseline=len(base),
        n_variant=len(var),
        n_failed_baseline=int(base_failed.sum()),
        n_failed_variant=int(var_failed.sum()) + len(var_only_failed),
        n_ok_both=int((in_var & ~base_failed & ~var_failed).sum()),
        left_failed_baseline=int((base_failed & in_var & ~var_failed).sum()),
        left_failed_variant=int((~base_failed & var_failed).sum()),
        left_failed_both=int((base_failed & var_failed).sum()),
        left_no_record=int((~in_var).sum()) + len(var_only),
        failed_latency_ms_baseline=median_failed(base[q] for q in failed_ids),
        failed_latency_ms_variant=median_failed([*(var[q] for q in var_failed_ids), *var_only_failed]),
    )


def _untested_note(metric: str, base: Mapping[str, Record], var: Mapping[str, Record]) -> str:
    """Why a metric has no paired query, in a few words.

    Counted over the queries the metric applies to (a value on either side);
    when it applies to none that could be seen (everything failed), over all.
    """
    ids = [
        q
        for q in (*base, *(q for q in var if q not in base))
        if _has(base, q, metric) or _has(var, q, metric)
    ]
    if not ids:
        ids = list(base) + [q for q in var if q not in base]
    n = len(ids)
    missing = sum(1 for q in ids if q not in base or q not in var)
    in_var = sum(1 for q in ids if q in var and failed(var[q]))
    in_base = sum(1 for q in ids if q in base and failed(base[q]))
    if missing == n:
        if all(q not in var for q in ids):
            return "no record in variant"
        if all(q not in base for q in ids):
            return "no record in baseline"
        return "no record on one side"
    if in_var == n and in_base == n:
        return f"all {n} failed in both"
    if in_var == n:
        return f"all {n} failed in variant"
    if in_base == n:
        return f"all {n} failed in baseline"
    # an answer metric when only one side generates answers (generator=none vs extractive)
    if not any(_has(base, q, metric) for q in ids):
        return "no value in baseline"
    if not any(_has(var, q, metric) for q in ids):
        return "no value in variant"
    return f"none of {n} ok on both sides"


def _has(by_id: Mapping[str, Record], q: str, metric: str) -> bool:
    return q in by_id and value(by_id[q], metric) is not None


def _nan_row(split: str, variant: str, metric: str, pair: Pair, note: str) -> Row:
    nan = math.nan
    return Row(
        split=split,
        variant=variant,
        metric=metric,
        direction=direction_of(metric),
        baseline_mean=nan,
        variant_mean=nan,
        effect=nan,
        ci_low=nan,
        ci_high=nan,
        se=nan,
        p_value=nan,
        p_exact=False,
        p_bootstrap=nan,
        bootstrap_unreliable=True,
        n_queries=0,
        n_groups=0,
        n_failed_baseline=pair.n_failed_baseline,
        n_failed_variant=pair.n_failed_variant,
        note=note,
    )


def _failure_aware(
    by_id: Mapping[str, Record],
    ids: Sequence[str],
    metric: str,
    own: npt.NDArray[np.float64],
    other: npt.NDArray[np.float64],
    failed_ids: npt.NDArray[np.bool_],
) -> npt.NDArray[np.float64]:
    """One side's failure-aware column of a metric with a miss, from its ok-only column ``own``:
    a failed query scores the miss where the metric applies to it (its record names the metric,
    or the other side has a value and this side measures the metric at all). ``failed_ids``: which
    of ``ids`` have a failed record on this side."""
    miss = _spec(metric).miss
    if miss is None:
        return own
    measures = bool(np.isfinite(own).any())
    out = own.copy()
    for i in np.flatnonzero(failed_ids & ~np.isfinite(own)).tolist():
        q = ids[i]
        rec = by_id[q]
        if metric in (rec.get("metrics") or {}) or (measures and math.isfinite(other[i])):
            out[i] = miss
    return out


def _ok_only(b: npt.NDArray[np.float64], v: npt.NDArray[np.float64]) -> tuple[float, float, float, int]:
    """The ok-only figures of a failure-aware row: baseline and variant means and their difference
    over the queries ok on both sides (``b``, ``v``: the ok-only columns), and their count."""
    ok = np.isfinite(b) & np.isfinite(v)
    n = int(ok.sum())
    if not n:
        return math.nan, math.nan, math.nan, 0
    mb, mv = float(b[ok].mean()), float(v[ok].mean())
    return mb, mv, float((v[ok] - b[ok]).mean()), n


def compare(
    variants: Sequence[VariantData],
    *,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    splits: Sequence[str] = ("dev", "holdout"),
    B: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
    flip_threshold: float = 0.2,
    weights: TagWeights | None = None,
) -> Comparison:
    """Compare every variant with the baseline on draws of its own (:func:`plan_compare`, then
    the draws, then the second pass). See the module docstring."""
    draws = SharedDraws(B)
    done = plan_compare(
        variants,
        baseline=baseline,
        metrics=metrics,
        splits=splits,
        seed=seed,
        alpha=alpha,
        flip_threshold=flip_threshold,
        weights=weights,
        draws=draws,
    )
    draws.run()
    return done()


def plan_compare(
    variants: Sequence[VariantData],
    *,
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    splits: Sequence[str] = ("dev", "holdout"),
    seed: int = 0,
    alpha: float = 0.05,
    flip_threshold: float = 0.2,
    weights: TagWeights | None = None,
    keep_flips: int | None = None,
    draws: SharedDraws,
    columns: Columns | None = None,
) -> Callable[[], Comparison]:
    """Plan the comparison of every variant with the baseline. See the module docstring.

    ``metrics``: None or empty = the registry's default set (``MetricSpec.default_compare``).
    ``weights``: the production mix (:mod:`rag_ablate.dataset.weights`); None = the baseline's
    ``dataset.slice_weights``/``edge_tags``. Its rows go to ``Comparison.mix``. ``keep_flips``:
    each list of flips keeps its largest changes, chosen before they are built
    (:meth:`Comparison.cap_flips`'s cut); None keeps every flip.

    Two passes: this first one pairs the queries and registers every test's use of its split's
    bootstrap draw on ``draws``; after ``draws.run()`` (each draw streamed once to the tests of the
    comparison and of whatever else registered on it: the slices, the trade-off;
    :mod:`rag_ablate.compare.draws`) the returned function finishes the tests in the order they were
    planned and returns the comparison. :func:`compare` does both. ``columns``: the records as columns,
    shared with the other planners of the same records (:mod:`rag_ablate.compare.columns`).
    """
    # canonical names (recall@5 -> recall_at_5); unknown names fail with the valid ones
    metrics = [
        metric_name(spec.base, k) for spec, k in map(parse_metric_name, metrics or default_compare_metrics())
    ]
    base, notes = pick_baseline(variants, baseline)
    others = [v for v in variants if v is not base]
    if not others:
        raise ComparisonError("a comparison needs at least one variant besides the baseline")
    counts, B = draws, draws.B
    others_cfg = {o.label: o.config for o in others}
    tw, mix_notes = settle_weights(weights, base.config, base.records, others_cfg)
    notes += mix_notes
    mix: list[MixRow] = []
    rows: list[Row] = []
    pairs: list[Pair] = []
    flips: Flips = {}
    cap = FlipCap(keep_flips)
    finish: list[Callable[[], None]] = []  # the second pass, in the order of the first
    ok_only: dict[tuple[str, str, str], tuple[float, float, float, int]] = {}
    cols = columns if columns is not None else Columns()
    bc = cols.of(base)
    for split in splits:
        base_by_id = bc.by_id(split)
        if not base_by_id:
            notes.append(f"the baseline has no queries in split '{split}'")
            continue
        base_ids = list(base_by_id)
        base_rows = bc.rows(split)
        # each query's group as its position among the split's sorted labels, once per split: codes
        # sort as the labels do, so every test groups and orders its groups alike (and faster)
        draw, base_codes = base_draw(cols, base, seed, split)
        sources = list(dict.fromkeys(per_query(m) for m in metrics))
        ok_base_cols = bc.ok_only(sources, base_rows)
        base_failed = bc.failed[base_rows]
        # the queries' tags and mix weights, once per split (each test picks its queries')
        split_tags = [] if tw is None else bc.tags(base_rows)
        mix_cols = None if tw is None else mix_columns(split_tags, tw)
        for var in others:
            vc = cols.of(var)
            var_by_id = vc.by_id(split)
            var_rows = vc.aligned(bc, split)
            in_var = var_rows >= 0
            var_failed = take(vc.failed, var_rows, False)
            var_only = [vc.records[i] for i in vc.own(split, bc).tolist()]
            pair = _pair(split, var.label, base_by_id, var_by_id, var_only, in_var, base_failed, var_failed)
            pairs.append(pair)
            ok_var_cols = vc.ok_only(sources, var_rows)
            # failure-aware columns of the metrics with a miss; the ok-only figures beside them
            base_cols, var_cols = dict(ok_base_cols), dict(ok_var_cols)
            for src in sources:
                base_cols[src] = _failure_aware(
                    base_by_id, base_ids, src, ok_base_cols[src], ok_var_cols[src], base_failed
                )
                var_cols[src] = _failure_aware(
                    var_by_id, base_ids, src, ok_var_cols[src], ok_base_cols[src], var_failed
                )
                if spec_of(src).miss is not None:
                    ok_only[(split, var.label, src)] = _ok_only(ok_base_cols[src], ok_var_cols[src])
            # metrics measured on the same queries are tested together, on one shared draw
            by_subset: dict[bytes, tuple[npt.NDArray[np.bool_], list[str]]] = {}
            quantile_ms: dict[tuple[str, bytes], tuple[npt.NDArray[np.bool_], list[str]]] = {}
            for m in metrics:
                src = per_query(m)
                paired = np.isfinite(base_cols[src]) & np.isfinite(var_cols[src])
                if paired.any():
                    if quantile_of(m) is not None:  # percentiles of one source over the same queries
                        quantile_ms.setdefault((src, paired.tobytes()), (paired, []))[1].append(m)
                    else:
                        by_subset.setdefault(paired.tobytes(), (paired, []))[1].append(m)
                    continue
                applies = bool(np.isfinite(base_cols[src]).any() or np.isfinite(var_cols[src]).any()) or any(
                    value(r, src) is not None for r in var_only
                )
                if applies or pair.n_ok_both == 0:
                    note = _untested_note(src, base_by_id, var_by_id)
                    rows.append(_nan_row(split, var.label, m, pair, note))
            for paired, ms in quantile_ms.values():
                finish.append(
                    _plan_quantiles(
                        split, var.label, ms, base_codes[paired], paired, base_cols, var_cols, pair
                    )(counts, draw, alpha, rows)
                )
            for paired, ms in by_subset.values():
                qids = list(map(base_ids.__getitem__, np.flatnonzero(paired).tolist()))
                b = np.column_stack([base_cols[m][paired] for m in ms])
                v = np.column_stack([var_cols[m][paired] for m in ms])
                groups = base_codes[paired]
                sums_sizes = stats.group_sums_sizes(v - b, groups)
                theta = draw.add(counts, groups, sums_sizes, domain_ratios)
                signs = draw.add_signs(counts, groups, sums_sizes)
                mixed = None
                if mix_cols is not None:  # the production-weighted and the edge-case effects, same draw
                    tags = list(map(split_tags.__getitem__, np.flatnonzero(paired).tolist()))
                    _, mix_w = pick_mixes(mix_cols[0][paired], mix_cols[1][paired])
                    if mix_w is not None:
                        wsums = weighted_group_sums(b, v, groups, mix_w)
                        mixed = (tags, draw.add(counts, groups, wsums, _same))
                finish.append(
                    _plan_means(
                        split,
                        var,
                        ms,
                        qids,
                        b,
                        v,
                        groups,
                        theta,
                        signs,
                        mixed,
                        base_by_id,
                        var_by_id,
                        pair,
                        seed=seed,
                        B=B,
                        alpha=alpha,
                        tw=tw,
                        flip_threshold=flip_threshold,
                        rows=rows,
                        flips=flips,
                        cap=cap,
                        mix=mix,
                    )
                )

    def done() -> Comparison:
        for step in finish:
            step()
        for r in rows:
            if r.tested and (r.split, r.variant, r.metric) in ok_only:
                r.ok_baseline_mean, r.ok_variant_mean, r.ok_effect, r.n_ok_queries = ok_only[
                    (r.split, r.variant, r.metric)
                ]
        keys = _keys(splits, [o.label for o in others], metrics)
        order = {(s, v, m): i for i, (s, v, m) in enumerate(keys)}
        rows.sort(key=lambda r: order[(r.split, r.variant, r.metric)])
        _adjust(rows, alpha)
        label_rows(rows, alpha)
        _flag_disagreements(rows)
        return Comparison(
            baseline=base.label,
            variants=[v.label for v in others],
            metrics=list(metrics),
            splits=list(splits),
            B=B,
            seed=seed,
            alpha=alpha,
            rows=rows,
            flips=flips,
            flip_counts=cap.counts,
            pairs=pairs,
            notes=notes + gap_notes(base, others, splits, cols),
            mix=mix,
            mix_weights=tw.describe() if tw is not None else "",
        )

    return done


def _same(prod: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return prod


def gap_notes(
    base: VariantData, others: Sequence[VariantData], splits: Sequence[str], columns: Columns | None = None
) -> list[str]:
    """A note per split, variant and metric with a ``MetricSpec.warn_gap`` (``judged_at_k``) whose
    means over the queries with a value on both sides differ by more than it; of a metric measured
    at several cutoffs, the cutoff with the largest difference. The note names the lower side.
    (A watched metric no record of a split names has no value there, failed or not: no note.)"""
    notes: list[str] = []
    cols = columns if columns is not None else Columns()
    watched = [n for n in sorted(cols.of(base).names()) if spec_of(n).warn_gap is not None]
    if not watched:
        return notes
    for split in splits:
        base_by_id = cols.of(base).by_id(split)
        for var in others:
            var_by_id = cols.of(var).by_id(split)
            worst: dict[str, tuple[float, str, float, float, int]] = {}  # base -> its largest gap
            for name in watched:
                both = [
                    (b, v)
                    for q, rec in base_by_id.items()
                    if q in var_by_id
                    and (b := value(rec, name)) is not None
                    and (v := value(var_by_id[q], name)) is not None
                ]
                if both:
                    b_mean, v_mean = (float(x) for x in np.mean(both, axis=0))
                    gap = abs(v_mean - b_mean)
                    spec = spec_of(name)
                    over = gap - (spec.warn_gap or 0.0) > 1e-9  # a gap of exactly warn_gap is not over it
                    if over and gap > worst.get(spec.base, (0.0,))[0]:
                        worst[spec.base] = (gap, name, b_mean, v_mean, len(both))
            for _, name, b_mean, v_mean, n in worst.values():
                lower = "the variant" if v_mean < b_mean else "the baseline"
                notes.append(
                    f"split '{split}': {display_name(name)} is {v_mean:.3f} for {var.label} and "
                    f"{b_mean:.3f} for the baseline ({n} queries): {lower} {spec_of(name).warn_text}"
                )
    return notes


def _plan_means(
    split: str,
    var: VariantData,
    ms: list[str],
    qids: list[str],
    b: npt.NDArray[np.float64],
    v: npt.NDArray[np.float64],
    groups: npt.NDArray[np.intp],
    theta: Collector,
    signs: Collector | None,
    mixed: tuple[list[Any], Collector] | None,
    base_by_id: Mapping[str, Record],
    var_by_id: Mapping[str, Record],
    pair: Pair,
    *,
    seed: int,
    B: int,
    alpha: float,
    tw: TagWeights | None,
    flip_threshold: float,
    rows: list[Row],
    flips: Flips,
    cap: FlipCap,
    mix: list[MixRow],
) -> Callable[[], None]:
    """The second pass of one subset of metrics: the paired test on its streamed draw, the rows,
    flips and production-mix rows."""

    def done() -> None:
        ids = np.array(qids)
        res = stats.paired_test(
            b,
            v,
            groups,
            B=B,
            seed=seed,
            alpha=alpha,
            theta=theta.result(),
            signs=None if signs is None else signs.result(),
        )
        for j, m in enumerate(ms):
            rows.append(
                Row(
                    split=split,
                    variant=var.label,
                    metric=m,
                    direction=direction_of(m),
                    baseline_mean=float(b[:, j].mean()),
                    variant_mean=float(v[:, j].mean()),
                    effect=float(res.effect[j]),
                    ci_low=float(res.ci_low[j]),
                    ci_high=float(res.ci_high[j]),
                    se=float(res.se[j]),
                    p_value=float(res.p_value[j]),
                    p_exact=bool(res.p_exact[j]),
                    p_bootstrap=float(res.p_bootstrap[j]),
                    bootstrap_unreliable=res.bootstrap_unreliable,
                    n_queries=res.n_queries,
                    n_groups=res.n_groups,
                    boot_ci_low=float(res.boot_ci_low[j]),
                    boot_ci_high=float(res.boot_ci_high[j]),
                    n_failed_baseline=pair.n_failed_baseline,
                    n_failed_variant=pair.n_failed_variant,
                )
            )
            for field_name, spread in judge_spread(m, qids, base_by_id, var_by_id).items():
                setattr(rows[-1], field_name, spread)
            _add_flips(
                flips, var.label, m, split, qids, b[:, j], v[:, j], base_by_id, flip_threshold, cap, ids
            )
        if mixed is not None and tw is not None:
            tags, drawn = mixed
            named = [(m, direction_of(m)) for m in ms]
            mix.extend(mix_rows(split, var.label, named, b, v, groups, tags, tw, None, alpha, drawn.result()))

    return done


def _plan_quantiles(
    split: str,
    variant: str,
    ms: list[str],
    groups: npt.NDArray[np.intp],
    paired: npt.NDArray[np.bool_],
    base_cols: Mapping[str, npt.NDArray[np.float64]],
    var_cols: Mapping[str, npt.NDArray[np.float64]],
    pair: Pair,
) -> Callable[[SharedDraws, SplitDraw, float, list[Row]], Callable[[], None]]:
    """Latency percentiles over the same paired queries (``groups``: their groups' codes in the
    split's draw): one running sum per resample serves them all, their intervals from the split's
    shared draw (:func:`stats.paired_quantile_tests`)."""
    src = per_query(ms[0])  # grouped by paired queries of one source: latency_ms for the latency ones
    b = base_cols[src][paired]
    v = var_cols[src][paired]
    qs = tuple(spec_of(m).quantile or 0.0 for m in ms)

    def plan(counts: SharedDraws, draw: SplitDraw, alpha: float, rows: list[Row]) -> Callable[[], None]:
        setup = stats.quantile_setup(b, v, groups, qs, n_groups=draw.n_groups)
        effects = counts.add_linear_chunk(
            draw.key, draw.seed, draw.n_groups, setup.sizes_before, quantiles(setup)
        )

        def done() -> None:
            results = stats.paired_quantile_tests(b, v, groups, qs, alpha=alpha, effects=effects.result())
            for m, res in zip(ms, results, strict=True):
                rows.append(_quantile_row(split, variant, m, res, pair))

        return done

    return plan


def judge_spread(
    metric: str, qids: Sequence[str], base_by_id: Mapping[str, Record], var_by_id: Mapping[str, Record]
) -> dict[str, float]:
    """The judge's own spread for an LLM-judged metric over the paired queries (empty for others).

    ``judge_repeat_sd_baseline`` / ``_variant``: the mean within-query SD of the judge's repeat
    scores (queries with two or more valid repeats). ``judge_noise_se``: the part of the effect's
    uncertainty the judge's repeat noise explains, sqrt(mean(s2_b / k_b) + mean(s2_v / k_v)) / sqrt(n)
    with s2 a query's repeat variance and k its valid repeats, the means over the queries that have
    them and n the paired queries. The CI already contains this noise (each query's value is its
    repeats' mean); when the SE is small next to the CI, the uncertainty is query sampling and more
    repeats would not narrow it. NaN when the judge ran once per query.
    """
    from rag_ablate.run.judging import repeat_spread

    if not spec_of(metric).judged or not qids:
        return {}
    out: dict[str, float] = {}
    noise = 0.0
    known = False
    for side, by_id in (("baseline", base_by_id), ("variant", var_by_id)):
        spreads = [s for s in (repeat_spread(by_id[q], metric) for q in qids) if s is not None]
        if spreads:
            out[f"judge_repeat_sd_{side}"] = float(np.mean([math.sqrt(v) for v, _ in spreads]))
            noise += float(np.mean([v / k for v, k in spreads]))
            known = True
    if known:
        out["judge_noise_se"] = math.sqrt(noise / len(qids))
    return out


def _quantile_row(split: str, variant: str, metric: str, res: stats.QuantileResult, pair: Pair) -> Row:
    """A latency percentile's row: variant minus baseline over the paired queries, failed ones
    included, its interval from the same group-bootstrap draw the means use."""
    return Row(  # baseline_mean / variant_mean hold the two percentiles
        split=split,
        variant=variant,
        metric=metric,
        direction=direction_of(metric),
        baseline_mean=res.baseline,
        variant_mean=res.variant,
        effect=res.effect,
        ci_low=res.ci_low,
        ci_high=res.ci_high,
        se=res.se,
        p_value=res.p_value,
        p_exact=False,
        p_bootstrap=res.p_value,
        bootstrap_unreliable=res.bootstrap_unreliable,
        n_queries=res.n_queries,
        n_groups=res.n_groups,
        boot_ci_low=res.ci_low,
        boot_ci_high=res.ci_high,
        n_failed_baseline=pair.n_failed_baseline,
        n_failed_variant=pair.n_failed_variant,
    )


def _keys(
    splits: Sequence[str], variants: Sequence[str], metrics: Sequence[str]
) -> list[tuple[str, str, str]]:
    return [(s, v, m) for s in splits for v in variants for m in metrics]


@dataclass
class FlipCap:
    """How many flips of each list a comparison keeps (``keep``: the largest changes, in
    :func:`~rag_ablate.compare.model.flip_order`; None keeps every flip) and the count of each list
    it cut (``Comparison.flip_counts``)."""

    keep: int | None = None
    counts: dict[str, dict[str, dict[str, dict[str, int]]]] = field(default_factory=dict)


def _add_flips(
    flips: Flips,
    variant: str,
    metric: str,
    split: str,
    qids: Sequence[str],
    b: npt.NDArray[np.float64],
    v: npt.NDArray[np.float64],
    base_by_id: Mapping[str, Record],
    threshold: float,
    cap: FlipCap,
    ids: npt.NDArray[np.str_],
) -> None:
    """The queries whose value of ``metric`` changed by more than ``threshold`` (any change for a
    binary metric; relative to the larger value for an unbounded one), improved and regressed; a list
    longer than ``cap.keep`` keeps its largest changes, chosen from the arrays before any object is
    built (``ids``: ``qids`` as an array, for the ties) and counted in
    ``cap.counts``, as :meth:`~rag_ablate.compare.model.Comparison.cap_flips` would cut it."""
    spec, _ = parse_metric_name(metric)
    lower = direction_of(metric) == "lower"
    relative = not spec.bounded
    b = np.asarray(b, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    d = v - b
    size = np.abs(d)
    if spec.binary:
        changed = d != 0
    elif relative:
        changed = size > threshold * np.maximum(np.abs(b), np.abs(v))
    else:
        changed = size > threshold
    better = (d < 0) == lower
    out: dict[str, list[Flip]] = {}
    for direction, mask in (("improved", changed & better), ("regressed", changed & ~better)):
        idx = np.flatnonzero(mask)
        if cap.keep is not None and idx.size > cap.keep:
            cap.counts.setdefault(variant, {}).setdefault(metric, {}).setdefault(split, {})[direction] = (
                idx.size
            )
            idx = idx[np.lexsort((ids[idx], -size[idx]))[: cap.keep]]  # largest change, then query id
        # Python floats: no numpy scalar per flip
        out[direction] = [
            Flip(qids[i], str(base_by_id[qids[i]].get("query", "")), x, y)
            for i, x, y in zip(idx.tolist(), b[idx].tolist(), v[idx].tolist(), strict=True)
        ]
    flips.setdefault(variant, {}).setdefault(metric, {})[split] = out


def _adjust(rows: list[Row], alpha: float) -> None:
    """Holm on holdout, BH on dev, each over the split's tested variants x metrics of one family
    (:func:`family_of`: the timing metrics apart from the rest)."""
    families: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        r.family = family_of(r.metric)
        if r.tested:
            families.setdefault((r.split, r.family), []).append(r)
    for (split, _), family in sorted(families.items()):
        p = np.array([r.p_value for r in family])
        if split == "holdout":
            adj, how = stats.holm(p), "holm"
        else:
            adj, how = stats.benjamini_hochberg(p), "bh"
        for r, a in zip(family, adj, strict=True):
            r.p_adjusted = float(a)
            r.adjustment = how
            r.significant = bool(a < alpha) and r.effect != 0
            if r.significant:
                better = (r.effect > 0) == (r.direction == "higher")
                r.verdict = "better" if better else "worse"


ADJUSTMENT_NAMES = {"holm": "Holm", "bh": "BH"}


def label_rows(rows: Sequence[Row], alpha: float) -> None:
    """Each tested row's minimum detectable effect and the words beside its numbers.

    The label never contradicts the interval shown with it: the interval belongs to the raw p, the
    ``+``/``-`` verdict to the adjusted p, so a row whose interval excludes 0 (raw p < alpha) but is
    not significant after adjustment reads ``worse unadjusted, n.s. after Holm``, never a bare
    "n.s.". A row with no evidence either way says how large an effect its data could have
    detected: ``no evidence; could detect ±0.031`` (:func:`stats.min_detectable_effect`, 80%
    power); when the test cannot reject at all (5 groups or fewer at 0.05: the interval is
    unbounded) it says so.
    """
    for r in rows:
        if not r.tested:
            continue
        r.mde = detectable(r.se, r.ci_low, r.ci_high, alpha)
        how = ADJUSTMENT_NAMES.get(r.adjustment, r.adjustment)
        if r.verdict:
            r.label = f"{r.verdict} (after {how})"
        else:
            r.label = unconfirmed_words(r.ci_low, r.ci_high, r.direction, r.mde, r.n_groups, how)


def detectable(se: float, ci_low: float, ci_high: float, alpha: float) -> float:
    """The minimum detectable effect of a row (inf when its interval is unbounded: the test cannot
    reject at all, e.g. 5 groups or fewer at 0.05)."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return math.inf
    return stats.min_detectable_effect(se, alpha)


def unconfirmed_words(
    ci_low: float, ci_high: float, direction: str, mde: float, n_groups: int, how: str
) -> str:
    """The words for a row that is not significant after adjustment (``how``: Holm, BH), in agreement
    with its raw interval: ``worse unadjusted, n.s. after BH`` when the interval excludes 0, else
    ``no evidence; could detect ±0.031`` (or that nothing could be detected)."""
    if ci_low == ci_high == 0:  # every paired difference is 0
        return "no change on any query"
    if ci_low > 0 or ci_high < 0:  # the interval excludes 0 (for a mean: exactly when p < alpha)
        better = (ci_low > 0) == (direction == "higher")
        return f"{'better' if better else 'worse'} unadjusted, n.s. after {how}"
    if not math.isfinite(mde):
        return f"no evidence; {n_groups} groups cannot detect any effect"
    size = f"{mde:.1f}" if mde >= 100 else f"{mde:.2g}"
    return f"no evidence; could detect ±{size}"


def _flag_disagreements(rows: list[Row]) -> None:
    """Flag a variant x metric whose dev and holdout verdicts disagree."""
    by_key: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.variant, r.metric), {})[r.split] = r
    for pair in by_key.values():
        dev, hold = pair.get("dev"), pair.get("holdout")
        if dev is None or hold is None or not dev.tested or not hold.tested or dev.verdict == hold.verdict:
            continue
        if dev.verdict and hold.verdict:
            flag = "dev and holdout conflict"
        elif dev.verdict:
            flag = f"{dev.verdict} on dev only"
        else:
            flag = f"{hold.verdict} on holdout only"
        dev.flag = hold.flag = flag


def delta_metrics(c: Comparison, variant: str) -> dict[str, float]:
    """A child run's effects as MLflow metrics: ``delta/holdout/recall_at_5`` and its adjusted p,
    and the production-weighted effects when the comparison has them (``delta/holdout/prod/...``)."""
    out = {}
    for r in c.rows:
        if r.variant == variant and r.tested:
            out[f"delta/{r.split}/{r.metric}"] = r.effect
            out[f"p_adj/{r.split}/{r.metric}"] = r.p_adjusted
    for w in c.mix:  # the production-weighted effect (compare.mix): delta/holdout/prod/recall_at_5
        if w.variant == variant and w.mix == "production" and math.isfinite(w.effect):
            out[f"delta/{w.split}/prod/{w.metric}"] = w.effect
    return out
