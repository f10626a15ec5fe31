"""What a comparison is made of: variants as loaded, result rows, flips, pairs.

Everything here is plain data; :mod:`rag_ablate.compare.analysis` fills it and
:mod:`rag_ablate.compare.render` prints it. ``Comparison.to_dict`` is the
layout of ``comparison.json`` (documented in README, "The comparison step").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_ablate.records import Record


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
    significant: bool = False
    verdict: str = ""  # better | worse | "" (not significant)
    flag: str = ""  # dev and holdout disagree, see analysis._flag_disagreements
    note: str = ""  # why the row has no numbers

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
        }


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """NaN and inf become null: JSON has no NaN."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
