"""What a comparison is made of: variants as loaded, result rows, flips, pairs, slices, the
production mix, pairwise judging and quality against cost.

Everything here is plain data. :mod:`rag_ablate.compare` fills one :class:`Comparison`
(:func:`rag_ablate.compare.run.run_comparison`); every view renders that same object: the terminal
table and ``comparison.md`` (:mod:`rag_ablate.compare.render`), ``report.html``
(:mod:`rag_ablate.report.html`) and the MLflow descriptions (:mod:`rag_ablate.report.mlflow_ui`).
``Comparison.to_dict`` is the layout of ``comparison.json`` (README, "The comparison step") and
``Comparison.from_dict`` reads it back into the same type, so a view rebuilt from disk renders
what the comparison step computed.
"""

from __future__ import annotations

import heapq
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from rag_ablate.compare.mix import MixRow
from rag_ablate.metrics.registry import spec_of
from rag_ablate.records.trace import Record


@dataclass
class VariantData:
    """One variant as found on disk or in MLflow.

    ``config`` is the job's resolved config, or None when it could not be read
    (``config_problem`` says why); the confounding guard then reports the
    variant as unchecked instead of passing it.
    """

    label: str
    records: list[Record]
    config: dict[str, Any] | None = None
    overrides: list[str] = field(default_factory=list)
    run_id: str | None = None
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    config_problem: str = ""
    outputs: str | None = None  # fingerprint of every query's retrieved ids, answer and intents (no timings)


@dataclass
class Row:
    """One split x variant x metric.

    The interval ``[ci_low, ci_high]`` inverts the group sign-flip test (the
    shifts it does not reject); ``boot_ci_low``/``boot_ci_high`` are the
    percentile bootstrap interval and ``se`` the bootstrap SE, kept as
    secondary fields. ``note`` is set, and the numbers are NaN, when the
    metric applies but no query could be paired (e.g. every query failed in
    the variant); such a row is never significant.
    """

    split: str
    variant: str
    metric: str
    direction: str
    baseline_mean: float
    variant_mean: float
    effect: float
    ci_low: float
    ci_high: float
    se: float
    p_value: float
    p_exact: bool
    p_bootstrap: float
    bootstrap_unreliable: bool
    n_queries: int
    n_groups: int
    boot_ci_low: float = math.nan
    boot_ci_high: float = math.nan
    n_failed_baseline: int = 0
    n_failed_variant: int = 0
    p_adjusted: float = math.nan
    adjustment: str = ""
    family: str = ""  # the adjustment's family in the split: "main", or "timing" (latency metrics)
    significant: bool = False
    verdict: str = ""  # better | worse | "" (not significant)
    flag: str = ""  # dev and holdout disagree, see analysis._flag_disagreements
    note: str = ""  # why the row has no numbers
    # LLM-judged metrics only (analysis.judge_spread): the judge's own noise next to the CI
    judge_repeat_sd_baseline: float = math.nan  # mean within-query SD of the judge's repeats, baseline
    judge_repeat_sd_variant: float = math.nan  # the same in the variant
    judge_noise_se: float = math.nan  # SE of the effect that the judge's repeat noise alone explains
    # what the numbers say, in words that agree with the interval beside them (analysis.label_rows)
    mde: float = math.nan  # minimum detectable effect at 80% power, two-sided alpha, from the bootstrap SE
    label: str = ""  # better | worse | "worse unadjusted, n.s. after Holm" | "no evidence; could detect ..."
    # a metric with a failure-aware form (MetricSpec.miss): the row's numbers are failure-aware (a
    # failed query the metric applies to scores the miss); beside them the ok-only figures, over
    # the queries ok on both sides (NaN: none; or no failure-aware form, the row is ok-only then)
    ok_baseline_mean: float = math.nan
    ok_variant_mean: float = math.nan
    ok_effect: float = math.nan
    n_ok_queries: int = 0

    @property
    def tested(self) -> bool:
        return not self.note


@dataclass
class GateResult:
    """One gate rule's verdict on one variant (:mod:`rag_ablate.compare.gate`).

    ``effect``, ``ci_low``/``ci_high`` and ``p_adjusted`` are the row's the rule read (NaN when the
    variant could not be tested, which blocks); ``meaning`` is the rule in words and ``reason`` why
    it passed or blocked."""

    rule: str
    variant: str
    split: str
    metric: str
    evidence: str  # point | noninferior | superior
    margin: float
    passed: bool
    effect: float
    ci_low: float
    ci_high: float
    p_adjusted: float
    adjustment: str
    meaning: str
    reason: str

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "BLOCK"


@dataclass
class Pair:
    """The queries of one split as the baseline and one variant have them.

    ``n_queries``: queries with a record on either side. The ok-only figures run over queries
    ``ok`` on both sides; the others are left out of them, counted by why (disjoint): failed in
    the baseline only, in the variant only, in both, or without a record on one side. A metric's
    failure-aware form scores a failed query as a miss instead; ``error_rate`` uses failed
    queries too; latency does not (a failure's time is apart: ``failed_latency_ms_*``, the median
    time of each side's failed queries, None when none failed).
    """

    split: str
    variant: str
    n_queries: int
    n_baseline: int
    n_variant: int
    n_failed_baseline: int
    n_failed_variant: int
    n_ok_both: int
    left_failed_baseline: int
    left_failed_variant: int
    left_failed_both: int
    left_no_record: int
    failed_latency_ms_baseline: float | None = None
    failed_latency_ms_variant: float | None = None

    @property
    def n_left_out(self) -> int:
        return (
            self.left_failed_baseline + self.left_failed_variant + self.left_failed_both + self.left_no_record
        )

    def left_out_text(self) -> str:
        """``3 (1 failed in baseline, 2 failed in variant)``, or ``0``."""
        parts = [
            (self.left_failed_baseline, "failed in baseline"),
            (self.left_failed_variant, "failed in variant"),
            (self.left_failed_both, "failed in both"),
            (self.left_no_record, "no record on one side"),
        ]
        why = ", ".join(f"{n} {what}" for n, what in parts if n)
        return f"{self.n_left_out} ({why})" if why else "0"


@dataclass(slots=True)  # a comparison of 100,000 queries holds about a million of them
class Flip:
    query_id: str
    query: str
    baseline: float
    variant: float


# variant -> metric -> split -> {"improved": [...], "regressed": [...]}
Flips = dict[str, dict[str, dict[str, dict[str, list[Flip]]]]]

#: flipped queries a comparison keeps per variant, metric, split and direction: the largest changes
#: (:meth:`Comparison.cap_flips`; every query's values stay in the jobs' records)
FLIPS_KEPT = 50


def flip_order(f: Flip) -> tuple[float, str]:
    """Largest change first, then by query id: the order the views list flips in."""
    return (-abs(f.variant - f.baseline), f.query_id)

#: verdicts of a slice, worst first (:mod:`rag_ablate.compare.slices`)
SLICE_VERDICTS = ("hurts", "no evidence", "helps", "too small", "untested")


@dataclass
class SliceRow:
    """One split x variant x metric x slice (``tag=multi_doc``, ``intent_l2=K_product``, ...).

    The effect, interval and p come from the comparison's test run within the slice.
    ``p_adjusted`` is Benjamini-Hochberg over the slices tested for the same split, variant
    and metric (exploratory). ``verdict``: ``helps`` / ``hurts`` (adjusted p below alpha,
    by the metric's direction), ``no evidence``, ``too small`` (fewer paired groups than
    ``compare.min_slice_groups``: not tested) or ``untested`` (no paired query; ``note``
    says why). ``n_slice`` counts the slice's queries with a record on either side; the
    failed and left-out counts are the slice's, as :class:`Pair` counts them.
    """

    split: str
    variant: str
    metric: str
    kind: str
    value: str
    direction: str
    n_slice: int
    n_queries: int
    n_groups: int
    n_failed_baseline: int
    n_failed_variant: int
    n_left_out: int
    baseline_mean: float = math.nan
    variant_mean: float = math.nan
    effect: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    p_value: float = math.nan
    p_exact: bool = False
    p_adjusted: float = math.nan
    verdict: str = ""
    note: str = ""
    mde: float = math.nan  # minimum detectable effect at 80% power (as Row.mde)
    label: str = ""  # for "no evidence": the words that agree with the interval (as Row.label)

    @property
    def name(self) -> str:
        return f"{self.kind}={self.value}"

    @property
    def tested(self) -> bool:
        return self.verdict in ("hurts", "no evidence", "helps")


@dataclass
class SliceSection:
    """The per-slice comparison: settings, rows (per variant, split and metric, worst first), notes."""

    metrics: list[str]
    min_groups: int
    alpha: float
    rows: list[SliceRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hurts(self, variant: str, split: str | None = None) -> list[SliceRow]:
        """The slices where ``variant`` hurts (in ``split``, or any), worst first."""
        return [
            r for r in self.rows if r.variant == variant and r.verdict == "hurts" and split in (None, r.split)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "exploratory": True,
            "adjustment": "bh",
            "metrics": self.metrics,
            "min_groups": self.min_groups,
            "alpha": self.alpha,
            "notes": self.notes,
            "rows": [{**_finite(asdict(r)), "slice": r.name} for r in self.rows],
        }


@dataclass
class StageShare:
    """One variant's failure stages in one split (docs/metrics.md "Stage diagnosis"): the queries per
    stage; ``n_diagnosed`` is their sum, ``n_failed`` the failed queries (not diagnosed)."""

    variant: str
    split: str
    n_diagnosed: int
    n_failed: int
    counts: dict[str, int] = field(default_factory=dict)  # stage -> queries, every stage


@dataclass
class StageSection:
    """Which stage lost the queries, per variant, and how each stage's share moved against the
    baseline: ``rows`` are the comparison's rows of the ``stage_<stage>`` metrics (the same paired
    group test over the queries diagnosed on both sides; p adjusted among these rows only)."""

    stages: list[str]
    metrics: list[str]  # stage_<stage> of the stages with rows, in pipeline order
    shares: list[StageShare] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def share(self, variant: str, split: str) -> StageShare | None:
        return next((x for x in self.shares if (x.variant, x.split) == (variant, split)), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": self.stages,
            "metrics": self.metrics,
            "shares": [asdict(x) for x in self.shares],
            "rows": [_finite(asdict(r)) for r in self.rows],
            "notes": self.notes,
        }


@dataclass
class FlakyQuery:
    """A query whose repeats (``system.repeats``) gave both verdicts of a binary metric."""

    split: str
    query_id: str
    query: str | None  # its text (None: not stored)
    verdicts: dict[str, list[float | None]]  # each flaky metric's verdict per repeat (None: failed)


@dataclass
class RepeatSummary:
    """One variant's repeated runs (rag_ablate.compare.repeats): how many per query, and its flaky
    queries (the first ``FLAKY_SHOWN`` of ``n_flaky``, by split and query id)."""

    variant: str
    repeats: int  # the most runs of a query
    n_queries: int
    n_flaky: int
    flaky: list[FlakyQuery] = field(default_factory=list)


@dataclass
class Comparison:
    baseline: str
    variants: list[str]
    metrics: list[str]
    splits: list[str]
    B: int
    seed: int
    alpha: float
    rows: list[Row]
    flips: Flips
    pairs: list[Pair] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    confounded: dict[str, list[str]] = field(default_factory=dict)  # variant -> what it changes (guard)
    unchecked: dict[str, str] = field(default_factory=dict)  # variant -> why the guard could not check it
    no_op: list[str] = field(default_factory=list)  # variants whose records equal the baseline's (no timings)
    slices: SliceSection | None = None  # per-slice effects (rag_ablate.compare.slices); None: not computed
    mix: list[MixRow] = field(default_factory=list)  # production-weighted and edge rows (compare.mix)
    mix_weights: str = ""  # the weighting of ``mix``, in words
    pairwise: PairwiseReport | None = None  # judge.mode=pairwise (rag_ablate.compare.pairwise); None: not run
    tradeoff: Tradeoff | None = None  # quality against cost (rag_ablate.compare.tradeoff); None: not computed
    gate: list[GateResult] = field(default_factory=list)  # the regression gate's verdicts (compare.gate)
    latency_method: str = ""  # how the latency rows' times were measured (rag_ablate.compare.timing)
    stages: StageSection | None = None  # failure stages (rag_ablate.compare.stages); None: none diagnosed
    # the sweep's one quality axis and one cost axis (compare.quality_metric / compare.cost_metric, the
    # auto rule applied once by tradeoff.choose_metrics): every view's verdict, plot and ranking use them
    quality_metric: str = ""
    cost_metric: str = ""
    # judged metrics corrected by the dataset's human_judgements (rag_ablate.compare.ppi); None: no labels
    ppi: PPISection | None = None
    # system.repeats > 1: each repeated variant's runs per query and flaky queries (compare.repeats)
    repeats: list[RepeatSummary] = field(default_factory=list)
    # variant -> metric -> split -> direction -> how many queries flipped, for each list of ``flips``
    # that :meth:`cap_flips` cut to its largest changes (a list not cut holds them all)
    flip_counts: dict[str, dict[str, dict[str, dict[str, int]]]] = field(default_factory=dict)

    def n_flips(self, variant: str, metric: str, split: str, direction: str) -> int:
        """How many queries flipped (``flips`` may list only the largest changes of them)."""
        listed = self.flips.get(variant, {}).get(metric, {}).get(split, {}).get(direction, [])
        counted = self.flip_counts.get(variant, {}).get(metric, {}).get(split, {})
        return counted.get(direction, len(listed))

    def cap_flips(self, keep: int = FLIPS_KEPT) -> None:
        """Keep the ``keep`` largest changes of each list of flips, largest first (:func:`flip_order`),
        counting the flips of each list cut in ``flip_counts``. At 100,000 queries a comparison has
        about a million flips: they made most of ``comparison.json`` (148 MB) and of its render time."""
        for v, by_metric in self.flips.items():
            for m, by_split in by_metric.items():
                for s, by_direction in by_split.items():
                    for direction, fl in by_direction.items():
                        if len(fl) > keep:
                            counts = self.flip_counts.setdefault(v, {}).setdefault(m, {}).setdefault(s, {})
                            counts[direction] = len(fl)
                            by_direction[direction] = heapq.nsmallest(keep, fl, key=flip_order)

    def row(self, split: str, variant: str, metric: str) -> Row | None:
        for r in self.rows:
            if (r.split, r.variant, r.metric) == (split, variant, metric):
                return r
        return None

    @property
    def latency_note(self) -> str:
        """How latency was measured, when the comparison has latency rows (else empty): every view
        prints it beside them."""
        timed = any(spec_of(m).family == "timing" for m in self.metrics)
        return self.latency_method if timed else ""

    def pair(self, split: str, variant: str) -> Pair | None:
        for p in self.pairs:
            if (p.split, p.variant) == (split, variant):
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "variants": self.variants,
            "metrics": self.metrics,
            "splits": self.splits,
            "B": self.B,
            "seed": self.seed,
            "alpha": self.alpha,
            "notes": self.notes,
            "confounded": self.confounded,
            "unchecked": self.unchecked,
            "no_op": self.no_op,
            "pairs": [{**asdict(p), "n_left_out": p.n_left_out} for p in self.pairs],
            "rows": [_finite(asdict(r)) for r in self.rows],
            "flips": {
                v: {
                    m: {s: {k: [_flip_dict(f) for f in fl] for k, fl in d.items()} for s, d in bys.items()}
                    for m, bys in bym.items()
                }
                for v, bym in self.flips.items()
            },
            "slices": None if self.slices is None else self.slices.to_dict(),
            "production_mix": {"weights": self.mix_weights, "rows": [_finite(asdict(r)) for r in self.mix]},
            "pairwise": None if self.pairwise is None else self.pairwise.to_dict(),
            "tradeoff": None if self.tradeoff is None else self.tradeoff.to_dict(),
            "gate": [{**_finite(asdict(g)), "verdict": g.verdict} for g in self.gate],
            "latency_method": self.latency_method,
            "stages": None if self.stages is None else self.stages.to_dict(),
            "quality_metric": self.quality_metric,
            "cost_metric": self.cost_metric,
            "ppi": None if self.ppi is None else self.ppi.to_dict(),
            "repeats": [asdict(r) for r in self.repeats],
            "flip_counts": self.flip_counts,
        }

    @classmethod
    def from_dict(cls, d: typing.Mapping[str, Any]) -> Comparison:
        """The comparison that :meth:`to_dict` wrote (``comparison.json``), as the same type.

        JSON's nulls for numbers that were NaN come back as NaN; keys a writer added for readers
        (``n_left_out``, ``slice``, ``plot_split``, ...) are derived again, not stored.
        """
        mix = d.get("production_mix") or {}
        c = _load(cls, {k: v for k, v in d.items() if k != "production_mix"})
        c.mix = _value(list[MixRow], mix.get("rows") or [])
        c.mix_weights = str(mix.get("weights") or "")
        return c


# --------------------------------------------------------------------------- reading JSON back

T = TypeVar("T")


def _load(cls: type[T], d: typing.Mapping[str, Any]) -> T:
    """A dataclass from a mapping of its fields (nested dataclasses, lists, dicts, Optional)."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _value(hints[f.name], d[f.name]) for f in fields(cls) if f.init and f.name in d}  # type: ignore[arg-type]
    return cls(**kwargs)


def _value(t: Any, v: Any) -> Any:
    args = typing.get_args(t)
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if v is None:
            return math.nan if inner == [float] and type(None) not in args else None
        return _value(inner[0], v) if len(inner) == 1 else v
    if v is None:
        return math.nan if t is float else None
    if is_dataclass(t) and isinstance(t, type):
        return _load(t, v)
    if origin is list:
        return [_value(args[0], x) for x in v]
    if origin is dict:
        return {k: _value(args[1], x) for k, x in v.items()}
    if t is float:
        return float(v)
    return v


# --------------------------------------------------------------------------- quality against cost


@dataclass
class Point:
    """One variant on one split."""

    variant: str
    quality: float
    quality_low: float
    quality_high: float
    n_quality: int  # queries with a quality value
    cost: float
    cost_low: float
    cost_high: float
    n_cost: int  # queries with a cost value
    baseline: bool = False
    frontier: bool = False
    clears_bar: bool | None = None  # None: no bar set
    cost_ratio: float | None = None  # cost / cost of the iso-quality choice
    # cost minus the baseline's, with its percentile interval over the same group draws (NaN: none;
    # 0 for the baseline itself)
    cost_effect: float = math.nan
    cost_effect_low: float = math.nan
    cost_effect_high: float = math.nan


@dataclass
class SplitTradeoff:
    split: str
    n_groups: int
    points: list[Point]
    choice: str | None = None  # the cheapest variant clearing the quality bar

    def point(self, variant: str) -> Point | None:
        return next((p for p in self.points if p.variant == variant), None)


@dataclass
class Tradeoff:
    quality_metric: str
    cost_metric: str
    quality_higher: bool
    cost_unit: str
    baseline: str
    quality_bar: float | None
    B: int
    seed: int
    alpha: float
    splits: list[SplitTradeoff]
    notes: list[str] = field(default_factory=list)

    def split(self, name: str) -> SplitTradeoff | None:
        return next((s for s in self.splits if s.split == name), None)

    @property
    def plot_split(self) -> str:
        """The split plotted: holdout when there is one (confirmatory), else the first."""
        names = [s.split for s in self.splits]
        return "holdout" if "holdout" in names else (names[0] if names else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for s in d["splits"]:
            s["points"] = [{k: _json_value(v) for k, v in p.items()} for p in s["points"]]
        d["plot_split"] = self.plot_split
        return d


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


_FLIP_FIELDS = tuple(f.name for f in fields(Flip))


def _flip_dict(f: Flip) -> dict[str, Any]:
    """``asdict(f)`` for a Flip's plain fields, built directly (a fifth of the time; a comparison of
    100,000 queries can hold a million flips)."""
    return {name: getattr(f, name) for name in _FLIP_FIELDS}


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """NaN and inf become null: JSON has no NaN."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


VERDICTS = ("a", "b", "tie")


@dataclass
class PairwiseQuery:
    """One query's outcome: +1 variant wins, -1 baseline wins, 0 tie/inconsistent, None error."""

    query_id: str
    group: str
    outcome: int | None
    verdicts: list[str | None]  # per order, in the judge's order: "a" (baseline), "b" (variant), "tie"
    firsts: list[str]  # which answer was shown first in each order
    consistent: bool | None
    error: str | None = None
    identical: bool = False  # the two answers are the same text: a tie, the judge is not asked


@dataclass
class PairwiseResult:
    """One split x variant against the baseline."""

    split: str
    variant: str
    n_pairs: int  # queries ok with an answer on both sides
    n: int  # of those, judged without error
    wins: int
    losses: int
    ties: int  # identical answers included
    inconsistent: int
    errors: int
    identical: int  # ties because both answers are the same text (the judge was not asked)
    net_win_rate: float  # (wins - losses) / n
    ci_low: float  # paired group-bootstrap percentile interval of the net win rate
    ci_high: float
    se: float
    p_value: float  # group sign-flip test of net win rate = 0
    p_exact: bool
    n_groups: int
    inconsistent_share: float  # inconsistent / n
    first_position_share: float  # decided order verdicts that picked the answer shown first
    error_queries: list[dict[str, str]] = field(default_factory=list)  # [{query_id, error}]
    note: str = ""  # why there are no numbers
    queries: list[PairwiseQuery] = field(default_factory=list)


@dataclass
class PairwiseReport:
    baseline: str
    model: str
    prompt_hash: str
    B: int
    seed: int
    alpha: float
    results: list[PairwiseResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "model": self.model,
            "prompt_hash": self.prompt_hash,
            "B": self.B,
            "seed": self.seed,
            "alpha": self.alpha,
            "outcome": "+1 variant wins, -1 baseline wins, 0 tie or inconsistent orders; errors not in n",
            "interval": "paired group bootstrap, percentile",
            "results": [_finite(asdict(r)) for r in self.results],
        }


# --------------------------------------------------------------------------- prediction-powered inference


@dataclass
class PPIRow:
    """One split x variant x judged metric (:mod:`rag_ablate.compare.ppi`): the judge's plain means
    of both sides and of the paired effect (variant minus baseline), each beside its
    prediction-powered estimate (the judge's mean plus the mean human-minus-judge difference over
    the human-labelled answers); every interval is the percentile group bootstrap at 1 - alpha.

    ``n_queries``/``n_groups``: the queries both sides have a judged value for (a failed query
    scores 0 on both scales). ``n_labelled_*``: of those, the answered ones whose answer a person
    scored (``human_judgements``, mean over raters); ``judge_bias_*``: the judge's mean minus the
    people's over them. ``note`` (and NaN estimates) when a side has fewer than the minimum labels.
    """

    split: str
    variant: str
    metric: str
    n_queries: int
    n_groups: int
    n_labelled_baseline: int
    n_labelled_variant: int
    n_labelled_both: int
    judge_bias_baseline: float = math.nan
    judge_bias_variant: float = math.nan
    baseline_plain: float = math.nan
    baseline_plain_low: float = math.nan
    baseline_plain_high: float = math.nan
    baseline_ppi: float = math.nan
    baseline_ppi_low: float = math.nan
    baseline_ppi_high: float = math.nan
    variant_plain: float = math.nan
    variant_plain_low: float = math.nan
    variant_plain_high: float = math.nan
    variant_ppi: float = math.nan
    variant_ppi_low: float = math.nan
    variant_ppi_high: float = math.nan
    effect_plain: float = math.nan
    effect_plain_low: float = math.nan
    effect_plain_high: float = math.nan
    effect_ppi: float = math.nan
    effect_ppi_low: float = math.nan
    effect_ppi_high: float = math.nan
    note: str = ""


@dataclass
class PPISection:
    """The prediction-powered estimates of a comparison (``Comparison.ppi``)."""

    labels: str  # where the human labels came from (the baseline's dataset folder)
    min_labels: int  # labelled answers a side needs for its estimates
    B: int
    seed: int
    alpha: float
    rows: list[PPIRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "min_labels": self.min_labels,
            "B": self.B,
            "seed": self.seed,
            "alpha": self.alpha,
            "estimator": "judge mean over the queries + mean (human - judge) over the labelled answers",
            "interval": "percentile group bootstrap",
            "rows": [_finite(asdict(r)) for r in self.rows],
            "notes": self.notes,
        }
