"""Prediction-powered inference for judged metrics (rag_ablate/compare/ppi.py, issue 27 item 2).

A hand-computed example checks the estimator (labels matched to the very answer, raters averaged,
a failed query weighted as the miss); an in-memory comparison checks that the section reaches
comparison.json (and back), comparison.md, the terminal and report.html; the simulation with a
judge of known bias checks the coverage of both intervals (benchmarks/bench_ppi.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.bench_ppi import simulate
from rag_ablate.compare import ppi
from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown
from rag_ablate.compare.run import Source, load_comparison, run_comparison
from rag_ablate.config.schema import CompareConfig
from rag_ablate.dataset.load import read_human_judgements
from rag_ablate.dataset.model import DatasetValidationError, HumanJudgement
from rag_ablate.report.html import render
from tests.conftest import write_jsonl

METRIC = "faithfulness"


def record(
    qid: str, group: str, score: float | None, answer: str | None, split: str = "dev"
) -> dict[str, Any]:
    """A judged record; ``score=None``: the query failed (its record names the metric, no value)."""
    ok = score is not None
    return {
        "query_id": qid,
        "query": f"question {qid}",
        "split": split,
        "group": group,
        "kind": "answerable",
        "status": "ok" if ok else "failed",
        "answer": answer if ok else None,
        "metrics": {METRIC: score, "relevance": score},  # people score faithfulness only
    }


def label(answer: str, *scores: int) -> tuple[HumanJudgement, ...]:
    return tuple(HumanJudgement(answer, {METRIC: s}, rater=f"r{i}") for i, s in enumerate(scores))


def small() -> tuple[list[VariantData], dict[str, tuple[HumanJudgement, ...]]]:
    groups = {"q1": "g1", "q2": "g1", "q3": "g2", "q4": "g3", "q5": "g3", "q6": "g4"}
    base = [(4, "a1"), (5, "a2"), (3, "a3"), (4, "a4"), (2, "a5"), (5, "same")]
    var = [(5, "v1"), (5, "v2"), (4, "v3"), (None, None), (3, "v5"), (5, "same")]
    labels = {
        "q1": label("a1", 3, 4) + label("v1", 4),  # two raters of the baseline's answer: 3.5
        "q3": label("a3", 2) + label(" v3 \n", 3),  # whitespace does not matter
        "q4": label("a4", 4),  # the variant failed on q4: no answer to label
        "q6": label("same", 4),  # both sides answered the same text: one label serves both
        "q2": label("an answer neither run gave", 0),
    }
    return [
        VariantData(
            "base", [record(f"q{i + 1}", groups[f"q{i + 1}"], s, a) for i, (s, a) in enumerate(base)]
        ),
        VariantData("var", [record(f"q{i + 1}", groups[f"q{i + 1}"], s, a) for i, (s, a) in enumerate(var)]),
    ], labels


def test_the_estimates_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ppi, "MIN_LABELS", 3)
    vs, labels = small()
    c = compare(vs, baseline="base", metrics=[METRIC], splits=["dev"], B=200)
    section = ppi.compute(vs, c, labels, "labels", [METRIC])
    (r,) = section.rows
    assert (r.n_queries, r.n_groups) == (6, 4)  # the failed q4 is in, scoring 0 (the miss) on both scales
    assert (r.n_labelled_baseline, r.n_labelled_variant, r.n_labelled_both) == (4, 3, 3)
    (note,) = section.notes  # 3 of 4: the variant's labelled queries are those where its answer was scored
    assert note.startswith(
        f"dev, var, {METRIC}: people scored 4 of the baseline's answers and 3 of the variant's"
    )
    # baseline: judge 23/6; human - judge over q1, q3, q4, q6: -0.5, -1, 0, -1 -> mean -0.625, 6 answered
    assert r.baseline_plain == pytest.approx(23 / 6) and r.judge_bias_baseline == pytest.approx(0.625)
    assert r.baseline_ppi == pytest.approx((23 + 6 * -0.625) / 6)
    # variant: judge 22/6 (q4 failed: 0); human - judge over q1, q3, q6: -1 each; 5 answered of 6
    assert r.variant_plain == pytest.approx(22 / 6) and r.judge_bias_variant == pytest.approx(1.0)
    assert r.variant_ppi == pytest.approx((22 + 5 * -1.0) / 6)
    assert r.effect_plain == pytest.approx(-1 / 6) and r.effect_ppi == pytest.approx(17 / 6 - 77 / 24)
    # the judge's plain means are the comparison row's (failure-aware, the same queries)
    row = c.row("dev", "var", METRIC)
    assert row is not None and (row.baseline_mean, row.variant_mean) == pytest.approx((23 / 6, 22 / 6))
    for side in ("baseline_plain", "baseline_ppi", "variant_ppi", "effect_plain", "effect_ppi"):
        lo, v, hi = (getattr(r, f"{side}_low"), getattr(r, side), getattr(r, f"{side}_high"))
        assert lo <= v <= hi and hi > lo, side
    monkeypatch.setattr(ppi, "MIN_LABELS", 4)  # the variant's 3 labels are too few: plain means only
    (few,) = ppi.compute(vs, c, labels, "labels", [METRIC]).rows
    assert "too few human labels (baseline 4, variant 3; each side needs 4)" in few.note
    assert math.isnan(few.effect_ppi) and few.effect_plain == pytest.approx(-1 / 6)


def test_labels_that_match_no_answer_say_so() -> None:
    vs, _ = small()
    c = compare(vs, baseline="base", metrics=[METRIC], splits=["dev"], B=200)
    section = ppi.compute(vs, c, {"q1": label("someone else's answer", 5)}, "labels", [METRIC])
    assert "score none of these runs' answers" in section.notes[0] and section.rows == []


def judged_sweep(tmp_path: Path, n: int = 60, labelled: int = 40) -> list[VariantData]:
    """Two variants over ``n`` queries in pairs of near-duplicates, a judge that overrates, and people's
    scores of both answers of the first ``labelled`` queries in the dataset folder the configs name."""
    rng = np.random.default_rng(7)
    human_b = rng.integers(1, 5, n)
    human_v = np.minimum(5, human_b + rng.integers(0, 2, n))
    judge_b, judge_v = np.minimum(5, human_b + 1), np.minimum(5, human_v + 1)
    rows = []
    for i in range(n):
        hj = [{"answer": f"base answer {i}", "scores": {METRIC: int(human_b[i])}, "rater": "ann"}]
        hj.append({"answer": f"variant answer {i}", "scores": {METRIC: int(human_v[i])}, "rater": "ann"})
        rows.append(
            {
                "query_id": f"q{i}",
                "query": f"question {i}",
                **({"human_judgements": hj} if i < labelled else {}),
            }
        )
    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "queries.jsonl", rows)
    config = {"dataset": {"path": str(folder)}}

    def records(scores: Any, prefix: str) -> list[dict[str, Any]]:
        return [record(f"q{i}", f"g{i // 2}", float(scores[i]), f"{prefix} answer {i}") for i in range(n)]

    return [
        VariantData("base", records(judge_b, "base"), config=config, info={"role": "baseline"}),
        VariantData("var", records(judge_v, "variant"), config=config),
    ]


def test_the_section_in_every_view(tmp_path: Path) -> None:
    vs = judged_sweep(tmp_path)
    out = tmp_path / "cmp"
    lines: list[str] = []
    res = run_comparison(
        Source(vs, out),
        CompareConfig(metrics=[METRIC, "relevance"], splits=["dev"], B=500),
        guard=False,
        echo=lines.append,
    )
    c = res.comparison
    assert c.ppi is not None and c.ppi.labels == str(tmp_path / "ds")
    (r,) = c.ppi.rows  # relevance: no person scored it, no row
    assert (r.n_labelled_baseline, r.n_labelled_variant, r.n_labelled_both) == (40, 40, 40)
    assert r.judge_bias_baseline > 0.5 and r.baseline_ppi < r.baseline_plain  # the judge overrates
    assert r.effect_ppi_low <= r.effect_ppi <= r.effect_ppi_high
    # what sweep/publish.py logs on the variant's MLflow run
    logged = ppi.delta_metrics(c.ppi, "var")
    assert logged[f"ppi/dev/{METRIC}/effect"] == r.effect_ppi and logged[f"ppi/dev/{METRIC}/n_labelled"] == 40
    assert ppi.delta_metrics(c.ppi, "base") == {}
    # comparison.json holds it and reads back into the same type
    data = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    assert data["ppi"]["rows"][0]["n_labelled_variant"] == 40 and data["ppi"]["min_labels"] == ppi.MIN_LABELS
    again = load_comparison(out)
    assert again.ppi == c.ppi and again.to_dict() == c.to_dict()
    # comparison.md, the terminal and report.html show the row
    effect = ppi.estimate_text(r.effect_ppi, r.effect_ppi_low, r.effect_ppi_high, signed=True)
    md = (out / "comparison.md").read_text(encoding="utf-8")
    assert md == format_markdown(again)
    assert (
        "## Judged metrics corrected by human labels" in md
        and f"| dev | var | {METRIC} | 40 / 40 of 60 |" in md
    )
    assert effect in md
    term = "\n".join(lines)
    assert "judge corrected by human labels" in term and effect in term
    html = render(title="t", variants=vs, comparison=again, plan=None, tradeoff_png=None, recall_png=None)
    assert 'id="ppi"' in html and "Judge corrected by human labels" in html and effect in html


def test_no_labels_no_section_and_unreadable_labels_a_note(tmp_path: Path) -> None:
    vs = judged_sweep(tmp_path, labelled=0)
    c = compare(vs, baseline="base", metrics=[METRIC], splits=["dev"], B=200)
    assert ppi.ppi_section(vs, c) is None and not c.notes  # a dataset without human_judgements: nothing
    bad = [VariantData(v.label, v.records, config={"dataset": {"path": str(tmp_path / "gone")}}) for v in vs]
    assert ppi.ppi_section(bad, c) is None
    assert c.notes and c.notes[0].startswith("prediction-powered estimates not computed: ")
    assert "gone/queries.jsonl: not found" in c.notes[0]
    unjudged = Comparison("base", ["var"], ["recall_at_5"], ["dev"], 200, 0, 0.05, [], {})
    assert ppi.ppi_section(vs, unjudged) is None  # no judged metric compared: the labels are not read


def test_read_human_judgements_names_line_and_field(tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "queries.jsonl",
        [
            {"query_id": "q1", "query": "x", "human_judgements": [{"answer": "a", "scores": {METRIC: 4}}]},
            {"query_id": "q2", "query": "y"},
            {"query_id": "q3", "query": "z", "human_judgements": [{"answer": "b", "scores": {METRIC: 7}}]},
        ],
    )
    with pytest.raises(DatasetValidationError) as err:
        read_human_judgements(tmp_path, human_metrics=[METRIC])
    assert "queries.jsonl:3" in str(err.value) and "human_judgements[0].scores.faithfulness" in str(err.value)
    write_jsonl(
        tmp_path / "queries.jsonl",
        [{"query_id": "q1", "human_judgements": [{"answer": "a", "scores": {METRIC: 4}}]}],
    )
    assert read_human_judgements(tmp_path, human_metrics=[METRIC]) == {
        "q1": (HumanJudgement("a", {METRIC: 4}),)
    }


@pytest.mark.slow  # about 2.5 s of CPU
def test_coverage_of_a_biased_judge() -> None:
    """4,000 simulated experiments (benchmarks/bench_ppi.py): a judge 0.7 (baseline) and 1.1 (variant)
    points too lenient; people score both answers of 150 of 600 queries. The judge's plain intervals
    miss the people's truth; the prediction-powered ones hold it at 0.95 +- 0.015."""
    r = simulate()
    print(f"coverage {r.covered}, widths {r.width}, means {r.mean}, truth {r.truth}")
    assert r.covered["baseline_plain"] < 0.05 and r.covered["effect_plain"] < 0.2
    assert abs(r.covered["baseline_ppi"] - 0.95) <= 0.015 and abs(r.covered["effect_ppi"] - 0.95) <= 0.015
    assert r.mean["effect_ppi"] == pytest.approx(r.truth["effect"], abs=0.005)
    assert r.mean["baseline_ppi"] == pytest.approx(r.truth["level"], abs=0.005)


@pytest.mark.slow  # an MLflow sqlite store
def test_the_corrected_effects_reach_the_variant_s_mlflow_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from rag_ablate.sweep.publish import publish_comparison
    from rag_ablate.tracking import store as tracking

    vs = judged_sweep(tmp_path)
    c = compare(vs, baseline="base", metrics=[METRIC], splits=["dev"], B=200)
    c.ppi = ppi.ppi_section(vs, c)
    assert c.ppi is not None
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    experiment = tracking.open_store(uri, "ppi", tmp_path / "artifacts")
    parent = tracking.start_parent(uri, experiment, "sweep", {})
    vs[1].run_id = tracking.start_run(uri, experiment, "var", parent)
    publish_comparison(uri, parent, vs, c, [])
    logged = MlflowClient(tracking_uri=uri).get_run(vs[1].run_id).data.metrics
    (r,) = c.ppi.rows
    assert logged[f"ppi/dev/{METRIC}/effect"] == pytest.approx(r.effect_ppi)
    assert logged[f"ppi/dev/{METRIC}/n_labelled"] == 40 and f"delta/dev/{METRIC}" in logged
