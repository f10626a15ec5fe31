"""The regression gate (rules with a margin and a choice of evidence, exit 3) and the words beside the
numbers (labels that agree with the interval, the minimum detectable effect)."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from rag_ablate.compare.analysis import compare, label_rows
from rag_ablate.compare.gate import GateRule, evaluate, gate
from rag_ablate.compare.model import Comparison, Row, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.compare.stats import min_detectable_effect, paired_test
from rag_ablate.config.schema import CompareConfig
from rag_ablate.core.errors import EXIT_BLOCKED, ComparisonError, ConfigError
from rag_ablate.records.trace import Record
from rag_ablate.report.html import render
from rag_ablate.settings import validate_compare
from tests.conftest import REPO, rag_ablate_cli, run_in_process

README = (REPO / "README.md").read_text(encoding="utf-8")
STATISTICS_MD = (REPO / "docs" / "statistics.md").read_text(encoding="utf-8")


def _row(metric: str, effect: float, lo: float, hi: float, p_adj: float, **kw: Any) -> Row:
    higher = metric != "latency_p95_ms"
    significant = p_adj < 0.05
    verdict = "" if not significant else ("better" if (effect > 0) == higher else "worse")
    fields: dict[str, Any] = {
        "split": "holdout",
        "variant": "v",
        "metric": metric,
        "direction": "higher" if higher else "lower",
        "baseline_mean": 0.8,
        "variant_mean": 0.8 + effect,
        "effect": effect,
        "ci_low": lo,
        "ci_high": hi,
        "se": (hi - lo) / 4,
        "p_value": p_adj,
        "p_exact": False,
        "p_bootstrap": p_adj,
        "bootstrap_unreliable": False,
        "n_queries": 110,
        "n_groups": 93,
        "p_adjusted": p_adj,
        "adjustment": "holm",
        "significant": significant,
        "verdict": verdict,
        **kw,
    }
    return Row(**fields)


def _comparison(*rows: Row) -> Comparison:
    metrics = list(dict.fromkeys(r.metric for r in rows))
    return Comparison("baseline", ["v"], metrics, ["holdout"], 1000, 0, 0.05, list(rows), {})


def _verdict(c: Comparison, rule: str) -> bool:
    (result,) = evaluate(c, [rule])
    return result.passed


# the sample's chunk=256 on holdout recall@5: a 2.6-point drop, far from significant
SAMPLE_DROP = _row("recall_at_5", -0.026, -0.083, 0.026, 1.0)


def test_point_rule_blocks_a_drop_beyond_the_margin_whatever_its_p() -> None:
    c = _comparison(SAMPLE_DROP)
    assert not _verdict(c, "holdout/recall_at_5:-0.02")
    assert _verdict(c, "holdout/recall_at_5:-0.05")
    assert _verdict(c, "holdout/recall_at_5:-0.05:point")  # point is the default evidence
    (g,) = evaluate(c, ["holdout/recall_at_5:-0.02"])
    assert (g.verdict, g.evidence, g.margin, g.effect, g.p_adjusted) == ("BLOCK", "point", -0.02, -0.026, 1.0)
    assert g.meaning == "block when the effect is below -0.02 (point estimate, whatever its p)"


def test_noninferiority_needs_the_interval_clear_of_the_margin() -> None:
    wide, narrow = SAMPLE_DROP, _row("recall_at_5", -0.005, -0.015, 0.004, 1.0)
    assert not _verdict(_comparison(wide), "holdout/recall_at_5:-0.05:noninferior")  # -0.083 < -0.05
    assert _verdict(_comparison(wide), "holdout/recall_at_5:-0.05")  # the point estimate is within it
    assert _verdict(_comparison(narrow), "holdout/recall_at_5:-0.02:noninferior")
    (g,) = evaluate(_comparison(wide), ["holdout/recall_at_5:-0.05:noninferior"])
    assert "95% interval's lower end is above -0.05" in g.meaning and "-0.083" in g.reason


def test_superiority_needs_a_significant_gain_after_adjustment() -> None:
    gain = _row("recall_at_5", 0.03, 0.01, 0.05, 0.01)
    raw_only = _row("recall_at_5", 0.03, 0.01, 0.05, 0.2)  # interval excludes 0, Holm does not confirm
    assert _verdict(_comparison(gain), "holdout/recall_at_5:superior")
    assert not _verdict(_comparison(raw_only), "holdout/recall_at_5:superior")
    assert not _verdict(_comparison(SAMPLE_DROP), "holdout/recall_at_5:superior")
    assert not _verdict(_comparison(gain), "holdout/recall_at_5:superior:+0.02")  # lower end 0.01 < 0.02


def test_the_margin_follows_the_metric_direction() -> None:
    slower = _comparison(_row("latency_p95_ms", 60.0, 40.0, 80.0, 0.001))
    assert not _verdict(slower, "holdout/latency_p95_ms:+50")
    assert _verdict(slower, "holdout/latency_p95_ms:+70")
    assert not _verdict(slower, "holdout/latency_p95_ms:+70:noninferior")  # upper end 80 > 70
    with pytest.raises(ComparisonError, match=r"lower-is-better.*write holdout/latency_p95_ms:\+50"):
        GateRule.parse("holdout/latency_p95_ms:-50")
    with pytest.raises(
        ComparisonError, match=r"higher-is-better.*write holdout/recall_at_5:-0.02;.*superior"
    ):
        GateRule.parse("holdout/recall_at_5:0.02")


def test_an_untested_variant_is_blocked() -> None:
    nan = math.nan
    broken = _row("recall_at_5", nan, nan, nan, nan, note="all 40 failed in variant")
    (g,) = evaluate(_comparison(broken), ["holdout/recall_at_5:-0.5"])
    assert not g.passed and g.reason == "could not be tested (all 40 failed in variant)"


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("holdout/recall_at_5<-0.02", "no longer read.*write holdout/recall_at_5:-0.02 "),
        ("holdout/latency_ms>50", r"write holdout/latency_ms:\+50 "),
        ("holdout/recall_at_5", "a point rule needs a margin, e.g. holdout/recall_at_5:-0.02"),
        ("holdout/recall_at_5:-0.02:-0.03", "not a margin"),
        ("holdout/recall_at_5:-0.02:strict", "not a margin"),
        ("test/recall_at_5:-0.02", "cannot read gate rule"),
    ],
)
def test_unreadable_rules_are_refused_with_the_syntax(rule: str, message: str) -> None:
    with pytest.raises(ComparisonError, match=message):
        GateRule.parse(rule)
    # a sweep refuses it before any job runs (exit 2, nothing ran)
    with pytest.raises(ConfigError, match=r"compare\.fail_on: "):
        validate_compare(CompareConfig(fail_on=[rule]))


def _readme_gate_lines() -> list[list[str]]:
    """README's gate commands ("Regression gate for CI"), as argument lists (comments dropped)."""
    section = README[
        README.index("**Regression gate for CI.**") : README.index("Settings of the automatic comparison")
    ]
    lines = [ln for ln in section.splitlines() if "--fail-on " in ln or "compare.fail_on=" in ln]
    commands = [shlex.split(ln, comments=True) for ln in lines if ln.startswith(("rag-ablate ", "python -m"))]
    assert len(commands) >= 4, lines
    return commands


def test_readme_gate_rules_survive_hydras_override_parser() -> None:
    """The sweep form parses as README writes it, into the rules the compare form takes."""
    commands = _readme_gate_lines()
    cli_rules = {c[c.index("--fail-on") + 1] for c in commands if "--fail-on" in c}
    (sweep,) = [c for c in commands if c[:3] == ["python", "-m", "rag_ablate"]]
    (override,) = [a for a in sweep if a.startswith("compare.fail_on=")]
    parsed = OverridesParser.create().parse_override(override).value()
    assert isinstance(parsed, list) and len(parsed) >= 2 and all(isinstance(r, str) for r in parsed)
    for rule in [*parsed, *cli_rules]:
        assert GateRule.parse(rule).text == rule
    validate_compare(CompareConfig(fail_on=list(parsed)))


# --------------------------------------------------------------------------- README's lines, run


SAMPLE_EXPECTED = {  # what each README rule does to chunk=256 on the embedded sample
    "holdout/recall_at_5:-0.02": EXIT_BLOCKED,  # -2.6 points, p_adj 1.0: the team's rule blocks it
    "holdout/recall_at_5:-0.05": 0,
    "holdout/recall_at_5:-0.02:noninferior": EXIT_BLOCKED,  # the interval reaches -0.08
    "holdout/recall_at_5:superior": EXIT_BLOCKED,
    "holdout/latency_p95_ms:+50": 0,
}


@pytest.mark.slow
def test_readme_compare_gate_lines_run_as_written(default_sweep: dict[str, Any], tmp_path: Path) -> None:
    sweep_dir = str(default_sweep["dir"])
    seen = set()
    for i, cmd in enumerate(c for c in _readme_gate_lines() if c[0] == "rag-ablate"):
        rule = cmd[cmd.index("--fail-on") + 1]
        args = [sweep_dir if a == "SWEEP" else a for a in cmd[1:]]
        out = tmp_path / str(i)  # the shared sweep is only read
        proc = rag_ablate_cli([*args, "--B", "2000", "--out", str(out)], tmp_path)
        assert proc.returncode == SAMPLE_EXPECTED[rule], (cmd, proc.stdout[-2000:], proc.stderr[-2000:])
        verdict = "PASS" if proc.returncode == 0 else "BLOCK"
        line = next(
            ln for ln in proc.stdout.splitlines() if ln.strip().startswith(f"{verdict} chunk=256 {rule}:")
        )
        assert re.search(r"effect [-+][0-9.]+ \[[-+][0-9.]+, [-+][0-9.]+\] p_adj [0-9.]+ \(holm\)", line), (
            line
        )
        if proc.returncode:
            assert "regression gate BLOCKED" in proc.stderr and rule in proc.stderr
        saved = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
        assert [(g["rule"], g["verdict"]) for g in saved["gate"]] == [(rule, verdict)]
        md = (out / "comparison.md").read_text(encoding="utf-8")
        assert f"| {verdict} | chunk=256 | `{rule}` |" in md
        # every "no evidence" says what could have been detected, slices included
        slices = md[md.index("## Where it helps and hurts") :]
        assert "| no evidence |" not in slices and "| no evidence; could detect ±" in slices
        quiet = [r for r in saved["slices"]["rows"] if r["verdict"] == "no evidence"]
        assert quiet and all(r["label"] for r in quiet)
        assert all(r["mde"] > 0 for r in quiet if "could detect" in r["label"])
        assert "Regression gate" in (out / "report.html").read_text(encoding="utf-8")
        seen.add(rule)
    assert seen == set(SAMPLE_EXPECTED)


@pytest.mark.slow
def test_readme_sweep_gate_line_runs_through_hydra_and_exits_3(tmp_path: Path) -> None:
    (sweep,) = [c for c in _readme_gate_lines() if c[0] == "python"]
    # no per-query traces: the gate reads the comparison (test_mlflow_traces.py reads traces)
    extra = ["progress=false", "compare.B=1000", "tracking.traces=none"]
    proc = run_in_process([*sweep[3:], *extra], tmp_path)
    assert proc.returncode == EXIT_BLOCKED, proc.stderr[-3000:]
    assert "regression gate BLOCKED" in proc.stderr
    assert "BLOCK chunk=256 holdout/recall_at_5:-0.02:" in proc.stderr
    (sweep_dir,) = (tmp_path / "outputs" / "multirun").iterdir()
    assert json.loads((sweep_dir / "failures.json").read_text(encoding="utf-8"))["failed"] is False
    gate_rows = json.loads((sweep_dir / "comparison.json").read_text(encoding="utf-8"))["gate"]
    assert {(g["rule"], g["verdict"]) for g in gate_rows} == {
        ("holdout/recall_at_5:-0.02", "BLOCK"),
        ("holdout/latency_p95_ms:+50", "PASS"),
    }
    # the sweep's MLflow run says it too
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    (parent,) = client.search_runs([exp.experiment_id], "tags.`rag_ablate.kind` = 'sweep'")
    note = parent.data.tags["mlflow.note.content"]
    assert "Regression gate BLOCKED: BLOCK chunk=256 `holdout/recall_at_5:-0.02`" in note


# --------------------------------------------------------------------------- words that match numbers


def _records(values: dict[str, list[float]], groups: list[str]) -> list[Record]:
    n = len(groups)
    return [
        {
            "query_id": f"q{i}",
            "split": "holdout",
            "group": groups[i],
            "status": "ok",
            "metrics": {m: v[i] for m, v in values.items()},
        }
        for i in range(n)
    ]


def test_an_interval_excluding_zero_is_never_labelled_plain_ns() -> None:
    """Holm over 6 metrics lifts a raw p of ~0.03 above 0.05: the row says both, in every view."""
    rng = np.random.default_rng(3)
    n = 120
    groups = [f"g{i}" for i in range(n)]
    metrics = ["hit_at_1", "hit_at_3", "hit_at_5", "recall_at_1", "recall_at_3", "recall_at_5"]
    base = {m: list(rng.integers(0, 2, n).astype(float)) for m in metrics}
    var = {m: list(base[m]) for m in metrics}
    for i in range(6):  # 6 queries lost on one metric only: p ~ 2 / 2**6
        var["recall_at_5"][i * 7] = 0.0
        base["recall_at_5"][i * 7] = 1.0
    vs = [VariantData("baseline", _records(base, groups)), VariantData("v", _records(var, groups))]
    c = compare(vs, metrics=metrics, splits=["holdout"], B=5000)
    r = c.row("holdout", "v", "recall_at_5")
    assert r is not None and r.ci_high < 0 and r.p_value < 0.05 <= r.p_adjusted, r
    assert r.label == "worse unadjusted, n.s. after Holm"
    for row in c.rows:  # no row whose interval excludes 0 reads "no evidence"
        excludes = row.ci_low > 0 or row.ci_high < 0
        assert excludes == ("unadjusted" in row.label or row.significant), row
    line = next(ln for ln in format_terminal(c).splitlines() if ln.startswith("v ") and "recall@5" in ln)
    assert "worse unadjusted, n.s. after Holm" in line
    assert "worse unadjusted, n.s. after Holm" in format_markdown(c)
    html = render(title="t", variants=vs, comparison=c, plan=None, tradeoff_png=None, recall_png=None)
    assert "worse unadjusted, n.s. after Holm" in html


def test_no_evidence_comes_with_the_effect_the_data_could_detect() -> None:
    rng = np.random.default_rng(0)
    n = 200
    groups = [f"g{i // 2}" for i in range(n)]
    base = list(rng.integers(0, 2, n).astype(float))
    var = list(rng.integers(0, 2, n).astype(float))
    vs = [
        VariantData("baseline", _records({"recall_at_5": base}, groups)),
        VariantData("v", _records({"recall_at_5": var}, groups)),
    ]
    c = compare(vs, metrics=["recall_at_5"], splits=["holdout"], B=4000)
    r = c.row("holdout", "v", "recall_at_5")
    assert r is not None and r.ci_low < 0 < r.ci_high
    assert r.mde == pytest.approx(2.8016 * r.se, rel=1e-4)
    assert r.label == f"no evidence; could detect ±{r.mde:.2g}"
    assert r.label in format_terminal(c) and r.label in format_markdown(c)
    assert c.to_dict()["rows"][0]["mde"] == r.mde
    again = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.rows[0].label == r.label and again.rows[0].mde == r.mde


def test_an_unbounded_interval_says_nothing_could_be_detected() -> None:
    row = _row("recall_at_5", -0.1, -math.inf, math.inf, 1.0)
    label_rows([row], 0.05)
    assert row.mde == math.inf and row.label == "no evidence; 93 groups cannot detect any effect"


def test_mde_shrinks_by_sqrt2_when_the_groups_double() -> None:
    """Same per-group noise, twice the groups: the detectable effect is ~1/sqrt(2) as large."""
    ratios = []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        mdes = []
        for n_groups in (150, 300):
            sizes = rng.integers(1, 4, n_groups)
            groups = np.repeat(np.arange(n_groups), sizes)
            shared = rng.normal(0, 0.3, n_groups)[groups]  # near-duplicates move together
            d = shared + rng.normal(0, 0.3, groups.size)
            se = paired_test(np.zeros(groups.size), d, groups, B=2000, seed=seed).se[0]
            mdes.append(min_detectable_effect(float(se)))
        ratios.append(mdes[1] / mdes[0])
    assert float(np.mean(ratios)) == pytest.approx(1 / math.sqrt(2), abs=0.05)


def test_statistics_md_worked_mde_example() -> None:
    """docs/statistics.md's worked example of the minimum detectable effect."""
    groups = list("abbbcccdefghhh")
    d = [1, 0, 1, -1, 1, 0, -1, 1, 2, 0, 1, 0, 1, 1]
    r = paired_test(np.zeros(14), d, groups, B=10_000, seed=0)
    mde = min_detectable_effect(float(r.se[0]), alpha=0.05)
    assert (round(float(r.se[0]), 4), round(mde, 4)) == (0.2151, 0.6025)
    assert "SE = 0.2151" in STATISTICS_MD and "MDE = 2.8016 x 0.2151 = 0.6025" in STATISTICS_MD


def test_gate_lines_name_the_blocked_variant_and_rule() -> None:
    assert gate(_comparison(SAMPLE_DROP), ["holdout/recall_at_5:-0.05"]) == []
    (line,) = gate(_comparison(SAMPLE_DROP), ["holdout/recall_at_5:-0.02"])
    assert line == (
        "BLOCK v holdout/recall_at_5:-0.02: effect -0.026 [-0.083, +0.026] p_adj 1 (holm); effect -0.026 "
        "is beyond the margin -0.02 -- block when the effect is below -0.02 (point estimate, whatever its p)"
    )


def test_a_sweep_with_an_unreadable_rule_stops_before_any_job(tmp_path: Path) -> None:
    proc = run_in_process(["-m", "chunk=256,512", "compare.fail_on=[holdout/recall_at_5<-0.02]"], tmp_path)
    assert proc.returncode != 0  # Hydra's own parser refuses '<': the reason the syntax uses ':'
    proc = run_in_process(["-m", "chunk=256,512", "compare.fail_on=[holdout/recall_at_5:0.02]"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "write holdout/recall_at_5:-0.02" in proc.stderr
    assert not list((tmp_path / "outputs").glob("multirun/*/0/records.jsonl"))


def test_a_rule_on_a_metric_not_compared_is_refused_before_the_comparison() -> None:
    with pytest.raises(ConfigError, match="metric ndcg_at_10 is not compared"):
        validate_compare(CompareConfig(metrics=["recall@5"], fail_on=["holdout/ndcg_at_10:-0.02"]))
    validate_compare(CompareConfig(metrics=["recall@5"], fail_on=["holdout/recall_at_5:-0.02"]))
