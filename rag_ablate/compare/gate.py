"""The regression gate: ``--fail-on 'holdout/recall_at_5<-0.02'`` for CI.

A rule fails when a variant's effect on that split and metric is beyond the
bound **and** significant after adjustment. A variant that could not be tested
on the rule's metric (every query failed, no record) fails the rule too: a
broken variant must not pass a gate because it produced no numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag_ablate.compare.model import Comparison, Row
from rag_ablate.core.errors import ComparisonError
from rag_ablate.metrics.registry import parse_metric_name

_RULE = re.compile(
    r"^\s*(?P<split>dev|holdout)/(?P<metric>[A-Za-z0-9_@]+)\s*(?P<op><|>)\s*(?P<bound>[-+]?[0-9.]+)\s*$"
)


@dataclass(frozen=True)
class GateRule:
    split: str
    metric: str
    op: str
    bound: float
    text: str

    @classmethod
    def parse(cls, text: str) -> GateRule:
        m = _RULE.match(text)
        if not m:
            raise ComparisonError(
                f"cannot read --fail-on '{text}'; expected SPLIT/METRIC<BOUND or SPLIT/METRIC>BOUND, "
                "e.g. 'holdout/recall_at_5<-0.02' or 'holdout/latency_ms>50'"
            )
        spec, k = parse_metric_name(m["metric"])
        metric = spec.base if k is None else f"{spec.base}_at_{k}"
        try:
            bound = float(m["bound"])
        except ValueError:
            raise ComparisonError(f"--fail-on '{text}': '{m['bound']}' is not a number") from None
        return cls(m["split"], metric, m["op"], bound, text.strip())

    def applies_to(self, row: Row) -> bool:
        return (row.split, row.metric) == (self.split, self.metric)

    def violated_by(self, row: Row) -> bool:
        if not self.applies_to(row) or not row.significant:
            return False
        return row.effect < self.bound if self.op == "<" else row.effect > self.bound


def gate(comparison: Comparison, rules: Sequence[str]) -> list[str]:
    """Messages for every rule a variant breaks (empty: the gate passes)."""
    parsed = [GateRule.parse(r) for r in rules]
    failures = []
    for rule in parsed:
        if rule.metric not in comparison.metrics:
            raise ComparisonError(
                f"--fail-on '{rule.text}': metric {rule.metric} is not compared "
                f"(compared: {', '.join(comparison.metrics)})"
            )
        for row in comparison.rows:
            if rule.applies_to(row) and not row.tested:
                failures.append(
                    f"{row.variant}: {row.split}/{row.metric} could not be tested ({row.note}) "
                    f"-- rule '{rule.text}'"
                )
            elif rule.violated_by(row):
                failures.append(
                    f"{row.variant}: {row.split}/{row.metric} effect {row.effect:+.4f} "
                    f"[{row.ci_low:+.4f}, {row.ci_high:+.4f}] {rule.op} {rule.bound:+g} "
                    f"and significant (p_adj {row.p_adjusted:.4g}) -- rule '{rule.text}'"
                )
    return failures
