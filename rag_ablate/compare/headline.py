"""The verdict at a glance: per split, each variant against the baseline on the sweep's quality axis,
at its cost on the sweep's cost axis, with the other metrics whose change is significant.

A function of the typed :class:`~rag_ablate.compare.model.Comparison` only, so every view that opens
on the verdict (report.html's first screen, the MLflow descriptions) says the same thing:

* ``verdict``: ``better`` / ``worse`` (the quality row's adjusted p below alpha, by the metric's
  direction), ``no evidence`` (with the row's minimum detectable effect), or ``not tested`` (the
  row has no numbers, or the quality metric is not among ``compare.metrics``);
* the cost: the comparison's own row when the cost axis is a compared metric (``latency_p95_ms``),
  else the trade-off's cost difference against the baseline, whose interval comes from the same
  group draws (:func:`rag_ablate.compare.tradeoff.compute`);
* ``others``: the rows of other metrics significant after adjustment, worse first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rag_ablate.compare.model import Comparison, Row

BETTER, WORSE, NO_EVIDENCE, UNTESTED = "better", "worse", "no evidence", "not tested"


@dataclass
class Cost:
    """A variant's cost against the baseline's on the cost axis: the difference and its interval."""

    metric: str
    effect: float
    ci_low: float
    ci_high: float
    baseline: float
    variant: float
    verdict: str = ""  # better | worse | "": the comparison's row's verdict (a trade-off difference has none)
    source: str = ""  # comparison | tradeoff


@dataclass
class Verdict:
    split: str
    variant: str
    verdict: str  # better | worse | no evidence | not tested
    quality: Row | None
    cost: Cost | None
    others: list[Row] = field(default_factory=list)


def quality_axis(c: Comparison) -> str:
    """The sweep's quality metric: the comparison's, else its trade-off's (a comparison.json written
    before the axes were kept on the comparison), else the first compared metric."""
    if c.quality_metric:
        return c.quality_metric
    if c.tradeoff is not None:
        return c.tradeoff.quality_metric
    return c.metrics[0] if c.metrics else ""


def cost_axis(c: Comparison) -> str:
    """The sweep's cost metric (as :func:`quality_axis`); empty when there is none."""
    if c.cost_metric:
        return c.cost_metric
    return c.tradeoff.cost_metric if c.tradeoff is not None else ""


def _cost(c: Comparison, split: str, variant: str) -> Cost | None:
    name = cost_axis(c)
    row = c.row(split, variant, name) if name else None
    if row is not None and row.tested:
        return Cost(
            name, row.effect, row.ci_low, row.ci_high, row.baseline_mean, row.variant_mean, row.verdict,
            "comparison",
        )  # fmt: skip
    st = c.tradeoff.split(split) if c.tradeoff is not None else None
    base = st.point(c.baseline) if st is not None else None
    p = st.point(variant) if st is not None else None
    if p is None or base is None or not math.isfinite(p.cost_effect):
        return None
    return Cost(name, p.cost_effect, p.cost_effect_low, p.cost_effect_high, base.cost, p.cost, "", "tradeoff")


def verdicts(c: Comparison) -> list[Verdict]:
    """One :class:`Verdict` per split and variant, in the comparison's order."""
    quality, cost = quality_axis(c), cost_axis(c)
    out = []
    for split in c.splits:
        for variant in c.variants:
            row = c.row(split, variant, quality)
            word = UNTESTED if row is None or not row.tested else row.verdict or NO_EVIDENCE
            others = [
                r
                for r in c.rows
                if (r.split, r.variant) == (split, variant)
                and r.significant
                and r.metric not in (quality, cost)
            ]
            others.sort(key=lambda r: r.verdict != WORSE)  # worse first, then better, each in metric order
            out.append(Verdict(split, variant, word, row, _cost(c, split, variant), others))
    return out
