"""What a comparison is made of: variants as loaded, result rows, flips, pairs.

Everything here is plain data; :mod:`rag_ablate.compare.analysis` fills it and
:mod:`rag_ablate.compare.render` prints it. ``Comparison.to_dict`` is the
layout of ``comparison.json`` (documented in README, "The comparison step").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_ablate.compare.mix import MixRow
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

    @property
    def tested(self) -> bool:
        return not self.note


@dataclass
class Pair:
    """The queries of one split as the baseline and one variant have them.

    ``n_queries``: queries with a record on either side. Quality metrics run
    over queries ``ok`` on both sides; the others are left out, counted by why
    (disjoint): failed in the baseline only, in the variant only, in both, or
    without a record on one side. ``error_rate`` and ``latency_ms`` use failed
    queries too.
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


@dataclass
class Flip:
    query_id: str
    query: str
    baseline: float
    variant: float


# variant -> metric -> split -> {"improved": [...], "regressed": [...]}
Flips = dict[str, dict[str, dict[str, dict[str, list[Flip]]]]]

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
    slices: SliceSection | None = None  # per-slice effects (rag_ablate.compare.slices); None: not computed
    mix: list[MixRow] = field(default_factory=list)  # production-weighted and edge rows (compare.mix)
    mix_weights: str = ""  # the weighting of ``mix``, in words
    pairwise: PairwiseReport | None = None  # judge.mode=pairwise (rag_ablate.compare.pairwise); None: not run

    def row(self, split: str, variant: str, metric: str) -> Row | None:
        for r in self.rows:
            if (r.split, r.variant, r.metric) == (split, variant, metric):
                return r
        return None

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
            "pairs": [{**asdict(p), "n_left_out": p.n_left_out} for p in self.pairs],
            "rows": [_finite(asdict(r)) for r in self.rows],
            "flips": {
                v: {
                    m: {s: {k: [asdict(f) for f in fl] for k, fl in d.items()} for s, d in bys.items()}
                    for m, bys in bym.items()
                }
                for v, bym in self.flips.items()
            },
            "slices": None if self.slices is None else self.slices.to_dict(),
            "production_mix": {"weights": self.mix_weights, "rows": [_finite(asdict(r)) for r in self.mix]},
            "pairwise": None if self.pairwise is None else self.pairwise.to_dict(),
        }


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


