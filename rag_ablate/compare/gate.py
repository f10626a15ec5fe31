"""The regression gate for CI: ``--fail-on holdout/recall_at_5:-0.02`` (and ``compare.fail_on``).

A rule is ``SPLIT/METRIC:MARGIN[:EVIDENCE]``, or ``SPLIT/METRIC:superior[:MARGIN]``. The parts are
separated by ``:`` because Hydra's override parser refuses ``<``, ``>``, ``=`` and ``!`` in an
unquoted value, while ``compare.fail_on=[holdout/recall_at_5:-0.02]`` parses as written.

``MARGIN`` is in the metric's units and signed like the effect (variant - baseline). For a
higher-is-better metric the tolerated change is a drop (``-0.02``); for a lower-is-better one
(``MetricSpec.direction``) an increase (``holdout/latency_p95_ms:+50``). A margin on the wrong side
is refused: ``recall_at_5:0.02`` would demand a gain, which is what ``:superior`` says.

``EVIDENCE``, what the margin is checked against:

* ``point`` (the default): block when the effect itself is worse than the margin -- "a drop of more
  than 2 points blocks the release", whatever its p;
* ``noninferior``: block unless the row's interval lies entirely on the good side of the margin
  (its lower end above ``-0.02`` for a higher-is-better metric), i.e. the data show the variant is
  not worse by more than the margin;
* ``superior``: block unless the variant is significantly better after adjustment (Holm on
  holdout, BH on dev), and, with a margin, its interval's worse end beyond it.

A variant that could not be tested on the rule's metric (every query failed, no record) is
blocked: a broken variant does not pass a gate because it produced no numbers.

Every rule gets a verdict per variant (:class:`~rag_ablate.compare.model.GateResult`, kept on the
comparison and rendered in every view). A blocked gate exits :data:`EXIT_BLOCKED`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rag_ablate.compare.model import Comparison, GateResult, Row
from rag_ablate.core.errors import ComparisonError
from rag_ablate.metrics.registry import direction_of, metric_name, parse_metric_name

EVIDENCE = ("point", "noninferior", "superior")
_RULE = re.compile(r"^(?P<split>dev|holdout)/(?P<metric>[A-Za-z0-9_@]+)(?P<rest>(:[^:]*)*)$")
_OLD = re.compile(r"^\s*(?P<head>[^<>=]+?)\s*[<>]=?\s*(?P<bound>[-+]?[0-9.]+)\s*$")
SYNTAX = (
    "SPLIT/METRIC:MARGIN[:point|noninferior] or SPLIT/METRIC:superior[:MARGIN], e.g. "
    "holdout/recall_at_5:-0.02 (block a drop of more than 0.02), "
    "holdout/recall_at_5:-0.02:noninferior, holdout/recall_at_5:superior, holdout/latency_p95_ms:+50"
)


def _fmt(x: float) -> str:
    return f"{x:+g}"


@dataclass(frozen=True)
class GateRule:
    split: str
    metric: str
    evidence: str
    margin: float
    text: str

    @classmethod
    def parse(cls, text: str) -> GateRule:
        raw = text.strip()
        old = _OLD.match(raw)
        if old:
            new = f"{old['head'].strip()}:{_fmt(float(old['bound']))}"
            raise ComparisonError(
                f"gate rule '{raw}': '<' and '>' are no longer read (Hydra's override parser refuses "
                f"them); write {new} (blocks when the effect is worse than {old['bound']}; "
                f"add :noninferior to require the interval, or use :superior). Syntax: {SYNTAX}"
            )
        m = _RULE.match(raw)
        if not m:
            raise ComparisonError(f"cannot read gate rule '{raw}'; expected {SYNTAX}")
        spec, k = parse_metric_name(m["metric"])
        metric = metric_name(spec.base, k)
        evidence, margin = "", math.nan
        for part in m["rest"].split(":")[1:]:
            word = part.strip().lower()
            if word in EVIDENCE and not evidence:
                evidence = word
                continue
            try:
                number = float(word)
            except ValueError:
                number = math.nan
            if not math.isfinite(number) or not math.isnan(margin):
                raise ComparisonError(
                    f"gate rule '{raw}': '{part}' is not a margin (a number, given once) or one evidence "
                    f"({', '.join(EVIDENCE)}); expected {SYNTAX}"
                )
            margin = number
        evidence = evidence or "point"
        if math.isnan(margin):
            if evidence != "superior":
                raise ComparisonError(
                    f"gate rule '{raw}': a {evidence} rule needs a margin, e.g. {m['split']}/{metric}:"
                    f"{'-' if direction_of(metric) == 'higher' else '+'}0.02; expected {SYNTAX}"
                )
            margin = 0.0
        rule = cls(m["split"], metric, evidence, margin, raw)
        rule._check_side()
        return rule

    @property
    def sign(self) -> float:
        """+1 when higher is better for the metric, -1 when lower is."""
        return 1.0 if direction_of(self.metric) == "higher" else -1.0

    def _check_side(self) -> None:
        if self.margin == 0:
            return
        worse_side = self.sign * self.margin < 0
        if self.evidence == "superior" and worse_side:
            raise ComparisonError(
                f"gate rule '{self.text}': a superiority margin is a required gain; {self.metric} is "
                f"{direction_of(self.metric)}-is-better, so it is {_fmt(-self.margin)}"
            )
        if self.evidence != "superior" and not worse_side:
            want = f"{self.split}/{self.metric}:{_fmt(-self.margin)}"
            if self.evidence != "point":
                want += f":{self.evidence}"
            raise ComparisonError(
                f"gate rule '{self.text}': {self.metric} is {direction_of(self.metric)}-is-better, so a "
                f"tolerated change is {'a drop (negative)' if self.sign > 0 else 'an increase (positive)'}: "
                f"write {want}; to require a gain use {self.split}/{self.metric}:superior"
            )

    def meaning(self, alpha: float) -> str:
        """The rule in words."""
        level = f"{100 * (1 - alpha):g}%"
        worse, end = ("below", "lower") if self.sign > 0 else ("above", "upper")
        if self.evidence == "point":
            return f"block when the effect is {worse} {_fmt(self.margin)} (point estimate, whatever its p)"
        if self.evidence == "noninferior":
            better = "above" if self.sign > 0 else "below"
            return (
                f"block unless the {level} interval's {end} end is {better} {_fmt(self.margin)} "
                "(shown not worse by more than the margin)"
            )
        extra = f" with the interval's {end} end beyond {_fmt(self.margin)}" if self.margin else ""
        return f"block unless significantly better after adjustment (p_adj < {alpha:g}){extra}"

    def judge(self, row: Row, alpha: float) -> GateResult:
        """This rule's verdict on one row (its split, metric and a variant)."""
        worse_end = row.ci_low if self.sign > 0 else row.ci_high
        if not row.tested:
            passed, why = False, f"could not be tested ({row.note})"
        elif self.evidence == "point":
            passed = self.sign * (row.effect - self.margin) >= 0
            where = "within" if passed else "beyond"
            why = f"effect {row.effect:+.4g} is {where} the margin {_fmt(self.margin)}"
        elif self.evidence == "noninferior":
            passed = self.sign * (worse_end - self.margin) > 0
            why = (
                f"interval end {worse_end:+.4g} is {'clear of' if passed else 'not clear of'} "
                f"the margin {_fmt(self.margin)}"
            )
        else:
            passed = row.verdict == "better" and self.sign * (worse_end - self.margin) > 0
            why = (
                f"significantly better (p_adj {row.p_adjusted:.3g})"
                if passed
                else f"not shown better (p_adj {row.p_adjusted:.3g}, interval end {worse_end:+.4g})"
            )
        return GateResult(
            rule=self.text,
            variant=row.variant,
            split=self.split,
            metric=self.metric,
            evidence=self.evidence,
            margin=self.margin,
            passed=passed,
            effect=row.effect,
            ci_low=row.ci_low,
            ci_high=row.ci_high,
            p_adjusted=row.p_adjusted,
            adjustment=row.adjustment,
            meaning=self.meaning(alpha),
            reason=why,
        )


def parse_rules(rules: Sequence[str], metrics: Sequence[str] | None = None) -> list[GateRule]:
    """Every rule parsed; the first that cannot be read raises with the syntax. With ``metrics`` (the
    comparison's), a rule on a metric that is not compared raises too."""
    parsed = [GateRule.parse(r) for r in rules]
    if metrics is None:
        return parsed
    compared = [metric_name(spec.base, k) for spec, k in map(parse_metric_name, metrics)]
    for rule in parsed:
        if rule.metric not in compared:
            raise ComparisonError(
                f"gate rule '{rule.text}': metric {rule.metric} is not compared "
                f"(compared: {', '.join(compared)})"
            )
    return parsed


def evaluate(comparison: Comparison, rules: Sequence[str]) -> list[GateResult]:
    """Each rule's verdict on each variant, in rule then variant order."""
    results = []
    for rule in parse_rules(rules, comparison.metrics):
        for variant in comparison.variants:
            row = comparison.row(rule.split, variant, rule.metric)
            if row is not None:
                results.append(rule.judge(row, comparison.alpha))
    return results


def result_line(g: GateResult) -> str:
    """``BLOCK chunk=256 holdout/recall_at_5:-0.02: effect -0.026 [-0.081, +0.026] p_adj 1 (holm);
    effect -0.026 is beyond the margin -0.02 -- block when ...``."""
    numbers = "no numbers"
    if math.isfinite(g.effect):
        interval = f"[{g.ci_low:+.4g}, {g.ci_high:+.4g}]"
        numbers = f"effect {g.effect:+.4g} {interval} p_adj {g.p_adjusted:.3g} ({g.adjustment})"
    return f"{g.verdict} {g.variant} {g.rule}: {numbers}; {g.reason} -- {g.meaning}"


def gate(comparison: Comparison, rules: Sequence[str]) -> list[str]:
    """One line per blocked rule and variant (empty: the gate passes)."""
    return [result_line(g) for g in evaluate(comparison, rules) if not g.passed]
