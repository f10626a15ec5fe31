"""Where a variant helps and where it hurts: the comparison run within each slice.

A slice is the queries sharing a tag, a parent intent or a leaf intent
(:mod:`rag_ablate.run.slices`); a query's slices are read from the baseline's record
(the variant's when the baseline has none). For each split, each variant against
the baseline, each slice and each slice metric (``compare.slice_metrics``; ``auto`` is
the comparison's quality metric: ``compare.quality_metric``, else an answer metric
when the records have one, else ``recall_at_5``):

* the queries are paired exactly as the whole comparison pairs them
  (:mod:`rag_ablate.compare.analysis`): quality metrics over the queries ``ok`` on both
  sides, ``error_rate`` over every query with a record on both, ``latency_ms`` with
  failed queries included; the slice's failed and left-out queries are counted on
  its row, never dropped silently;
* a slice with fewer than ``compare.min_slice_groups`` paired near-duplicate groups is
  listed as ``too small`` (its means shown, no test): with G groups the group sign-flip
  test cannot give p below 2 / 2**G;
* otherwise the effect, its interval (inverting the group sign-flip test) and p come
  from :func:`rag_ablate.compare.stats.paired_test` on the slice's queries alone: its
  bootstrap is the slice's domain of the split's one draw (the comparison's: each resample's
  mean over the slice's queries it drew, :mod:`rag_ablate.compare.draws`), its sign flips
  are its groups' signs in the split's one stream of sign vectors;
* p is adjusted by Benjamini-Hochberg over the slices tested for the same split,
  variant and metric. This is exploratory: slices are many, overlap, and were not
  chosen in advance; a slice verdict is a lead to look at, not a release decision;
* verdict ``hurts`` / ``helps`` when the adjusted p is below alpha (by the metric's
  direction), else ``no evidence``. Rows come per variant, split and metric, worst
  first: hurts, no evidence, helps (each by the effect, most harmful first), then too
  small and untested.

See docs/statistics.md, "Slices".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import (
    _untested_note,
    base_draw,
    detectable,
    quantile_of,
    unconfirmed_words,
)
from rag_ablate.compare.columns import Columns, VariantColumns, take
from rag_ablate.compare.draws import Collector, SharedDraws, domain_ratios
from rag_ablate.compare.load import pick_baseline
from rag_ablate.compare.model import SLICE_VERDICTS, Comparison, SliceRow, SliceSection, VariantData
from rag_ablate.config.schema import CompareConfig
from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.registry import auto_quality, direction_of, metric_name, parse_metric_name
from rag_ablate.records.trace import Record
from rag_ablate.run.slices import SliceKey, slice_keys, sliced

AUTO = "auto"


def check_settings(settings: CompareConfig) -> None:
    """Composition-time checks of ``compare.slice_metrics`` and ``compare.min_slice_groups``."""
    if settings.min_slice_groups < 1:
        raise ConfigError(f"compare.min_slice_groups must be >= 1, got {settings.min_slice_groups}")
    for m in settings.slice_metrics:
        if m != AUTO:
            _canonical(m)


def _canonical(m: str) -> str:
    spec, k = parse_metric_name(m)  # unknown names fail, listing the valid ones
    name = metric_name(spec.base, k)
    if quantile_of(name) is not None:
        raise ConfigError(
            f"compare.slice_metrics: {m} is a percentile of the split; slices compare per-query means "
            "(use latency_ms)"
        )
    return name


def resolve_metrics(
    variants: Sequence[VariantData], settings: CompareConfig, columns: Columns | None = None
) -> list[str]:
    """The slice metrics, ``auto`` resolved to the comparison's quality metric (see the module docstring)."""
    out: list[str] = []
    cols = columns if columns is not None else Columns()
    for m in settings.slice_metrics:
        if m == AUTO:
            if settings.quality_metric != AUTO:
                m = settings.quality_metric
            else:
                m = auto_quality(cols.present(variants))
        name = _canonical(m)
        if name not in out:
            out.append(name)
    return out


def _improvement(r: SliceRow) -> float:
    """The effect signed so that positive is better (NaN for a row without one)."""
    return r.effect if r.direction == "higher" else -r.effect


def _order_key(r: SliceRow) -> tuple[int, float, str, str]:
    imp = _improvement(r)
    return (SLICE_VERDICTS.index(r.verdict), imp if math.isfinite(imp) else math.inf, r.kind, r.value)


def compare_slices(
    variants: Sequence[VariantData],
    comparison: Comparison,
    *,
    metrics: Sequence[str],
    min_groups: int,
    B: int | None = None,
    seed: int | None = None,
    alpha: float | None = None,
) -> SliceSection:
    """Per-slice effects of every variant of ``comparison`` (see the module docstring), on draws of
    their own (:func:`plan_slices`, then the draws). ``B``, ``seed`` and ``alpha`` default to the
    comparison's."""
    draws = SharedDraws(comparison.B if B is None else B)
    done = plan_slices(
        variants,
        baseline=comparison.baseline,
        compared=comparison.variants,
        splits=comparison.splits,
        metrics=metrics,
        min_groups=min_groups,
        seed=comparison.seed if seed is None else seed,
        alpha=comparison.alpha if alpha is None else alpha,
        draws=draws,
    )
    draws.run()
    return done()


def plan_slices(
    variants: Sequence[VariantData],
    *,
    baseline: str,
    compared: Sequence[str],
    splits: Sequence[str],
    metrics: Sequence[str],
    min_groups: int,
    seed: int,
    alpha: float,
    draws: SharedDraws,
    columns: Columns | None = None,
) -> Callable[[], SliceSection]:
    """Plan the per-slice effects of the variants ``compared`` against ``baseline`` (labels), each
    slice's bootstrap a domain of its split's draw on ``draws`` (the comparison's, when it registers
    on the same ``draws``); after ``draws.run()`` the returned function finishes them. ``columns``:
    the records as columns, shared with the other planners (:mod:`rag_ablate.compare.columns`)."""
    if min_groups < 1:
        raise ConfigError(f"compare.min_slice_groups must be >= 1, got {min_groups}")
    B = draws.B
    base, _ = pick_baseline(variants, baseline)
    others = [v for v in variants if v.label in compared]
    section = SliceSection(list(metrics), min_groups, alpha)
    cols = columns if columns is not None else Columns()
    untagged = {v.label: n for v in (base, *others) if (n := cols.of(v).untagged())}
    if untagged:
        counts = ", ".join(f"{label} {n}" for label, n in untagged.items())
        section.notes.append(
            f"records without tags (written before tags were recorded): {counts}; they are in their intent "
            "slices only"
        )
    rows: list[SliceRow] = []
    # every slice test is a domain of its split's draw: each draw runs once, and one product per chunk
    # serves every test of the split (the comparison's, the slices', the trade-off's)
    tests: list[tuple[SliceRow, _Test]] = []
    bc = cols.of(base)
    for split in splits:
        base_by_id = bc.by_id(split)
        if not base_by_id:
            continue
        base_ids = list(base_by_id)
        base_rows = bc.rows(split)
        draw, base_codes = base_draw(cols, base, seed, split)
        base_side = _Side.at(bc, base_rows, metrics)
        base_members = bc.members(base_rows)
        for var in others:
            vc = cols.of(var)
            var_by_id = vc.by_id(split)
            extra_rows = vc.own(split, bc)
            extra = [vc.records[i] for i in extra_rows.tolist()]
            # every array over the split's queries: the baseline's, then the variant's own
            table = _Table(
                base_ids + [r["query_id"] for r in extra],
                base_side.padded(len(extra)),
                _Side.at(vc, np.concatenate([vc.aligned(bc, split), extra_rows]), metrics),
                np.concatenate([base_codes, np.full(len(extra), -1, dtype=np.intp)]),
            )
            members = {k: list(v) for k, v in base_members.items()}
            for i, rec in enumerate(extra, start=len(base_by_id)):
                for key in slice_keys(rec):
                    members.setdefault(key, []).append(i)
            for key, positions in sliced(members).items():
                idx = np.asarray(positions, dtype=np.intp)
                for m in metrics:
                    planned = _slice_row(
                        split, var.label, m, key, idx, table, base_by_id, var_by_id, min_groups
                    )
                    if planned is None:
                        continue
                    row, test = planned
                    rows.append(row)
                    if test is not None:
                        test.theta = draw.add(draws, test.groups, test.sums_sizes, domain_ratios)
                        test.signs = draw.add_signs(draws, test.groups, test.sums_sizes)
                        tests.append((row, test))

    def done() -> SliceSection:
        for row, test in tests:
            res = stats.paired_test(
                test.b,
                test.v,
                test.groups,
                B=B,
                seed=stats.derive_seed(seed, "slice", row.split, row.kind, row.value),
                alpha=alpha,
                theta=test.theta.result() if test.theta is not None else None,
                signs=test.signs.result() if test.signs is not None else None,
            )
            row.effect = float(res.effect[0])
            row.ci_low, row.ci_high = float(res.ci_low[0]), float(res.ci_high[0])
            row.p_value, row.p_exact = float(res.p_value[0]), bool(res.p_exact[0])
            row.mde = detectable(float(res.se[0]), row.ci_low, row.ci_high, alpha)
            row.verdict = "no evidence"  # until the adjustment says otherwise
        _adjust(rows, alpha)
        variant_order = {v: i for i, v in enumerate(compared)}
        split_order = {s: i for i, s in enumerate(splits)}
        metric_order = {m: i for i, m in enumerate(metrics)}
        rows.sort(
            key=lambda r: (
                variant_order[r.variant],
                split_order[r.split],
                metric_order[r.metric],
                *_order_key(r),
            )
        )
        section.rows = rows
        return section

    return done


@dataclass
class _Side:
    """One side's records of a split as arrays: which queries have a record, which failed, and each
    slice metric's :func:`value` (NaN: none)."""

    has: npt.NDArray[np.bool_]
    failed: npt.NDArray[np.bool_]
    values: dict[str, npt.NDArray[np.float64]]

    @classmethod
    def at(cls, cols: VariantColumns, rows: npt.NDArray[np.intp], metrics: Sequence[str]) -> _Side:
        """The records at ``rows`` of ``cols`` (-1: no record)."""
        return cls(
            rows >= 0,
            take(cols.failed, rows, False),
            {m: take(cols.value(m), rows, math.nan) for m in metrics},
        )

    def padded(self, n: int) -> _Side:
        """The same with ``n`` queries without a record after these."""
        no = np.zeros(n, dtype=bool)
        nan = np.full(n, math.nan)
        return _Side(
            np.concatenate([self.has, no]),
            np.concatenate([self.failed, no]),
            {m: np.concatenate([x, nan]) for m, x in self.values.items()},
        )


@dataclass
class _Table:
    """A split's queries for one variant against the baseline (the baseline's, then the variant's
    own), both sides as arrays, and each query's group code in the split's draw (-1: none)."""

    ids: list[str]
    base: _Side
    var: _Side
    codes: npt.NDArray[np.intp]


@dataclass
class _Test:
    """A slice's paired test, planned: its values, groups (codes in the split's draw) and (after the
    draws ran) bootstrap ratios and sign-flip sums."""

    b: npt.NDArray[np.float64]
    v: npt.NDArray[np.float64]
    groups: npt.NDArray[np.intp]
    n_groups: int
    sums_sizes: npt.NDArray[np.float64]
    theta: Collector | None = None
    signs: Collector | None = None  # None: the test enumerates every sign vector


def _slice_row(
    split: str,
    variant: str,
    metric: str,
    key: SliceKey,
    idx: npt.NDArray[np.intp],
    table: _Table,
    base_by_id: Mapping[str, Record],
    var_by_id: Mapping[str, Record],
    min_groups: int,
) -> tuple[SliceRow, _Test | None] | None:
    """One slice's row and its test to run (None: too small or untested); None when the metric
    applies to none of its queries (recall on chitchat). ``idx``: the slice's positions in ``table``
    (the queries paired as :func:`~rag_ablate.compare.analysis._pair` pairs them)."""
    bs, vs = table.base, table.var
    bv, vv = bs.values[metric][idx], vs.values[metric][idx]
    ok_both = bs.has[idx] & vs.has[idx] & ~bs.failed[idx] & ~vs.failed[idx]
    paired = bs.has[idx] & vs.has[idx] & np.isfinite(bv) & np.isfinite(vv)
    codes = table.codes[idx[paired]]
    n_groups = int(np.count_nonzero(np.bincount(codes)))  # codes >= 0: the baseline's queries
    n_ok_both = int(ok_both.sum())
    row = SliceRow(
        split=split,
        variant=variant,
        metric=metric,
        kind=key.kind,
        value=key.value,
        direction=direction_of(metric),
        n_slice=int(idx.shape[0]),
        n_queries=int(paired.sum()),
        n_groups=n_groups,
        n_failed_baseline=int(bs.failed[idx].sum()),
        n_failed_variant=int(vs.failed[idx].sum()),
        n_left_out=int(idx.shape[0]) - n_ok_both,  # every query ok on both sides is paired
    )
    if not row.n_queries:
        applies = bool(np.isfinite(bv).any() or np.isfinite(vv).any())
        if not applies and n_ok_both > 0:
            return None
        ids = [table.ids[i] for i in idx.tolist()]
        b_sub = {q: base_by_id[q] for q in ids if q in base_by_id}
        v_sub = {q: var_by_id[q] for q in ids if q in var_by_id}
        row.verdict, row.note = "untested", _untested_note(metric, b_sub, v_sub)
        return row, None
    b, v = bv[paired], vv[paired]
    row.baseline_mean, row.variant_mean = float(b.mean()), float(v.mean())
    row.effect = row.variant_mean - row.baseline_mean
    if row.n_groups < min_groups:
        row.verdict = "too small"
        row.note = f"{row.n_groups} group(s) < compare.min_slice_groups={min_groups}: not tested"
        return row, None
    return row, _Test(b, v, codes, row.n_groups, stats.group_sums_sizes(v - b, codes))


def _adjust(rows: Sequence[SliceRow], alpha: float) -> None:
    """Benjamini-Hochberg over the slices tested for each split, variant and metric; the verdicts."""
    families: dict[tuple[str, str, str], list[SliceRow]] = {}
    for r in rows:
        if r.tested:
            families.setdefault((r.split, r.variant, r.metric), []).append(r)
    for family in families.values():
        adj = stats.benjamini_hochberg(np.array([r.p_value for r in family]))
        for r, a in zip(family, adj, strict=True):
            r.p_adjusted = float(a)
            if a < alpha and r.effect != 0:
                r.verdict = "helps" if _improvement(r) > 0 else "hurts"
            else:  # "no evidence", in words that agree with the slice's interval
                r.label = unconfirmed_words(r.ci_low, r.ci_high, r.direction, r.mde, r.n_groups, "BH")
