"""The MLflow UI answers "which variant is better and what does it cost" with no setup.

After the README's sweep, read back through MLflow's API: the sweep run's verdict
table and each variant's one-line verdict (run descriptions), the headline metrics,
params that are inputs only, the baseline's run name, the summary table and the
saved runs view. Then, as a person would: start ``rag-ablate ui``, open the printed
link in headless Chromium and find the variants and the headline columns on the page.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.cli.main import main
from rag_ablate.records.jsonl import read_records
from rag_ablate.tracking.ui import baseline_run_name, headline_metrics, mlflow_metrics
from tests.conftest import chromium, mlflow_ui, require_chromium

NOTE = "mlflow.note.content"


@pytest.fixture(scope="module")
def sweep(default_sweep: dict[str, Any]) -> dict[str, Any]:
    """README's sweep (shared by the session: tests/conftest.py) read back through MLflow."""
    from mlflow.tracking import MlflowClient

    cwd, proc = default_sweep["cwd"], default_sweep["proc"]
    uri = f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if r.data.tags.get("rag_ablate.kind") == "sweep")
    children = {r.info.run_name: r for r in runs if r.data.tags.get("rag_ablate.kind") == "variant"}
    sweep_dir = Path(parent.data.tags["sweep.dir"])
    comparison = json.loads((sweep_dir / "comparison.json").read_text(encoding="utf-8"))
    return {
        "cwd": cwd,
        "uri": uri,
        "client": client,
        "experiment": exp,
        "parent": parent,
        "children": children,
        "comparison": comparison,
        "proc": proc,
    }


def _row(comparison: dict[str, Any], split: str, variant: str, metric: str) -> dict[str, Any]:
    return next(
        r for r in comparison["rows"] if (r["split"], r["variant"], r["metric"]) == (split, variant, metric)
    )


@pytest.mark.slow
def test_baseline_run_name_says_what_it_is(sweep: dict[str, Any]) -> None:
    assert set(sweep["children"]) == {"baseline (chunk=512)", "chunk=256"}
    base = sweep["children"]["baseline (chunk=512)"]
    assert base.data.tags["variant"] == "baseline"  # the label the comparison uses is unchanged


@pytest.mark.slow
def test_sweep_description_holds_the_verdict_table(sweep: dict[str, Any]) -> None:
    text = sweep["parent"].data.tags[NOTE]
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| variant"))
    for column in ("recall@5 dev", "recall@5 holdout", "Δ recall@5 holdout [95% CI]", "p95 ms holdout"):
        assert column in header
    row = next(line for line in lines if line.startswith("| chunk=256 |"))
    effect = _row(sweep["comparison"], "holdout", "chunk=256", "recall_at_5")
    assert f"{effect['effect']:+.3f} [{effect['ci_low']:+.3f}, {effect['ci_high']:+.3f}]" in row
    # the words beside the interval are the row's label, never a bare "n.s."
    assert effect["label"].startswith("no evidence; could detect ±") and effect["label"] in row
    assert any(line.startswith("| baseline (chunk=512) |") for line in lines)
    assert "in-process with warm caches" in text and "Holm" in text


@pytest.mark.slow
def test_each_variant_has_a_one_line_verdict(sweep: dict[str, Any]) -> None:
    # the verdict is the description's first line (per-query trace notes may follow)
    child = sweep["children"]["chunk=256"].data.tags[NOTE].splitlines()[0]
    assert child.startswith("vs baseline on holdout: recall@5 ")
    p95 = _row(sweep["comparison"], "holdout", "chunk=256", "latency_p95_ms")
    assert f"p95 latency ms {p95['effect']:+.3f}" in child
    assert "baseline" in sweep["children"]["baseline (chunk=512)"].data.tags[NOTE]


@pytest.mark.slow
def test_headline_metrics_agree_with_records_and_comparison(sweep: dict[str, Any]) -> None:
    client = sweep["client"]
    for name, run in sweep["children"].items():
        m = run.data.metrics
        headline = sorted(k for k in m if k.startswith("headline/"))
        assert {"headline/holdout_recall_at_5", "headline/dev_recall_at_5", "headline/cost_p95_ms"} <= set(
            headline
        )
        assert len(headline) <= 10  # a handful, not the grid
        assert m["headline/holdout_recall_at_5"] == pytest.approx(m["holdout/recall_at_5"], abs=1e-4)
        # p95 from the per-query end-to-end times, failed queries included
        records = read_records(Path(client.download_artifacts(run.info.run_id, "records.jsonl")))
        p95 = np.percentile([r["timings_ms"]["total"] for r in records], 95)
        assert m["cost/latency_p95_ms"] == pytest.approx(p95)
        assert m["headline/cost_p95_ms"] == pytest.approx(p95, abs=1e-4)
        assert "usd_per_1k" not in " ".join(m)  # the local pipeline has no price: no money, not 0
        if name == "chunk=256":
            effect = _row(sweep["comparison"], "holdout", "chunk=256", "recall_at_5")["effect"]
            assert m["headline/delta_holdout_recall_at_5"] == pytest.approx(effect, abs=1e-4)


@pytest.mark.slow
def test_params_are_inputs_and_outputs_are_metrics(sweep: dict[str, Any]) -> None:
    client = sweep["client"]
    for run in sweep["children"].values():
        params, metrics = run.data.params, run.data.metrics
        assert params["chunk.size"] in ("256", "512")
        outputs = [
            k for k in params if k.startswith("index.") or k in ("chunk.unit_resolved", "dataset.language")
        ]
        assert not outputs, outputs
        for key in ("run/index_build_seconds", "run/index_bytes", "run/index_chunks", "run/cache_hit_rate"):
            assert key in metrics, key
        assert run.data.tags["build.dataset.language"] in ("en", "zh")  # the embedded sample is Chinese
        # per split only what the tables and the comparison use; the whole grid is in metrics.json
        assert not [k for k in metrics if k.startswith("all/")]
        assert "dev/recall_at_5" in metrics and "dev/recall_at_1" not in metrics
        full = json.loads(Path(client.download_artifacts(run.info.run_id, "metrics.json")).read_text())
        assert "dev/recall_at_1" in full and "all/recall_at_5" in full


@pytest.mark.slow
def test_summary_table_and_saved_view_on_the_sweep_run(sweep: dict[str, Any]) -> None:
    client, parent = sweep["client"], sweep["parent"]
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "verdict.json")).read_text())
    assert table["columns"][:2] == ["variant", "role"]
    assert sorted(row[0] for row in table["data"]) == ["baseline", "chunk=256"]
    key = parent.data.tags["rag_ablate.ui_view"]
    exp = client.get_experiment(sweep["experiment"].experiment_id)
    state = json.loads(exp.tags[f"mlflow.sharedViewState.{key}"])
    assert parent.info.run_id in state["searchFilter"]
    assert state["orderByKey"] == "metrics.`headline/holdout_recall_at_5`" and state["orderByAsc"] is False
    assert state["chartsSearchFilter"] == "headline/"
    link = f"#/experiments/{exp.experiment_id}/runs?viewStateShareKey={key}"
    assert link in sweep["proc"].stdout


def test_baseline_name_lists_the_factors_but_not_runtime_settings() -> None:
    factors = [
        {"key": "chunk", "default": "512"},
        {"key": "retrieval", "default": "bm25"},
        {"key": "cache.dir", "default": "null"},
    ]
    assert baseline_run_name(factors) == "baseline (chunk=512, retrieval=bm25)"
    assert baseline_run_name([]) == "baseline"


def test_mlflow_gets_the_configured_metrics_and_metrics_json_the_grid() -> None:
    full = {
        "dev/recall_at_5": 0.8,
        "dev/recall_at_1": 0.5,
        "holdout/recall_at_5": 0.7,
        "holdout/n_failed": 0.0,
        "all/recall_at_5": 0.75,
        "holdout/cost/latency_p95_ms": 9.0,
        "cost/latency_p95_ms": 8.0,
        "run/index_bytes": 10.0,
        "headline/holdout_recall_at_5": 0.7,
    }
    assert mlflow_metrics(full, ["recall_at_5"]) == {
        k: v for k, v in full.items() if k not in ("dev/recall_at_1", "all/recall_at_5")
    }
    head = headline_metrics({**full, "all/error_rate": 0.0, "dev/recall_at_5": 0.123456}, "recall_at_5")
    assert head == {
        "headline/dev_recall_at_5": 0.1235,
        "headline/holdout_recall_at_5": 0.7,
        "headline/cost_p95_ms": 8.0,
        "headline/error_rate": 0.0,
    }


@pytest.mark.slow
def test_ui_starts_light(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag_ablate.tracking import store as tracking

    uri = tracking.default_uri(tmp_path)
    tracking.ensure_experiment(uri, "rag_ablate", tmp_path / "art")
    assert main(["ui", "--uri", uri, "--port", "5123", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in out and "--workers 1" in out


@pytest.mark.slow
def test_the_printed_link_opens_the_ranked_runs_view(sweep: dict[str, Any], tmp_path: Path) -> None:
    require_chromium()
    # the default store: outputs/mlflow.db under the folder the sweep ran in
    with mlflow_ui(tmp_path / "ui.log", cwd=sweep["cwd"]):
        printed = (tmp_path / "ui.log").read_text()
        match = re.search(r"(http://127\.0\.0\.1:\d+/#/experiments/\S+/runs\?viewStateShareKey=\S+)", printed)
        assert match, printed
        dom = chromium(match[1], tmp_path / "profile", "--dump-dom")
        for text in (
            "baseline (chunk=512)",
            "chunk=256",
            "headline/holdout_recall_at_5",
            "headline/delta_holdout_recall_at_5",
            "headline/cost_p95_ms",
        ):
            assert text in dom, f"{text!r} not on the page"
        # ranked by holdout recall@5, best first
        m = {n: r.data.metrics["headline/holdout_recall_at_5"] for n, r in sweep["children"].items()}
        best, other = sorted(m, key=lambda n: -m[n])
        if m[best] != m[other]:
            assert dom.index(f">{best}<") < dom.index(f">{other}<")
        if os.environ.get("RAG_ABLATE_SCREENSHOT"):  # refresh docs/img/mlflow-ui.png by hand
            chromium(match[1], tmp_path / "profile2", f"--screenshot={os.environ['RAG_ABLATE_SCREENSHOT']}")


# --------------------------------------------------------------------------- hostile text in descriptions

HOSTILE_TAG = "<img src=x onerror=alert(1)>"
HOSTILE_LABEL = "<b>bold</b>|[x](http://127.0.0.1:9/)"


def _hostile_descriptions() -> tuple[str, str]:
    """The sweep's and the variant's description of a comparison whose dataset tag, variant label,
    baseline name and failure line carry HTML and Markdown."""
    from rag_ablate.report.mlflow_ui import child_description, sweep_description
    from tests.test_slices import _section, crafted

    variants = crafted()
    for v in variants:
        for rec in v.records:
            rec["tags"] = [HOSTILE_TAG if t == "multi_doc" else t for t in rec.get("tags") or []]
    variants[1].label = HOSTILE_LABEL
    c, _ = _section(variants)
    summaries = [{"label": v.label, "metrics": {"dev/recall_at_5": 0.5}} for v in variants]
    sweep = sweep_description(
        c, summaries, "recall_at_5", "<i>base</i>", failed=["job #2 <script>alert(1)</script>"]
    )
    return sweep, child_description(c, HOSTILE_LABEL, "recall_at_5")


def test_descriptions_show_html_and_markdown_from_the_data_as_text() -> None:
    sweep, child = _hostile_descriptions()
    for text in (sweep, child):
        assert "<img" not in text and "<b>" not in text and "<script" not in text and "<i>" not in text
        assert not re.search(r"(?<!\\)\]\(", text)  # no link: [ and ] escaped
    assert "&lt;img src=x onerror=alert(1)&gt;" in child and "&lt;b&gt;bold&lt;/b&gt;" in sweep
    assert "&lt;i&gt;base&lt;/i&gt;" in sweep and "&lt;script&gt;" in sweep and "\\[x\\]" in sweep
    # the label's '|' cannot end the table cell: every row has the header's number of cells
    rows = [line for line in sweep.splitlines() if line.startswith("|")]
    cells = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
    assert len(cells) == 1, rows


@pytest.mark.slow
def test_the_mlflow_ui_shows_html_from_the_data_as_text(tmp_path: Path) -> None:
    """In headless Chromium, MLflow's run page renders a description's HTML (the control run shows a
    real <b> and <img>); the descriptions rag_ablate writes show the same markup as text."""
    from mlflow.tracking import MlflowClient

    require_chromium()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("hostile")
    control = client.create_run(exp).info.run_id
    client.set_tag(control, NOTE, "control: <b>bold</b> <img src=x>")
    sweep, child = _hostile_descriptions()
    runs = {}
    for name, text in (("sweep", sweep), ("child", child)):
        runs[name] = client.create_run(exp).info.run_id
        client.set_tag(runs[name], NOTE, text)
    with mlflow_ui(tmp_path / "ui.log", uri=uri) as port:

        def page(run_id: str) -> str:
            url = f"http://127.0.0.1:{port}/#/experiments/{exp}/runs/{run_id}"
            return chromium(url, tmp_path / f"profile-{run_id}", "--dump-dom", window="1900,1200")

        dom = page(control)
        assert "<b>bold</b>" in dom and '<img src="x"' in dom  # the UI renders HTML: the test can fail
        dom = page(runs["sweep"])
        assert "Verdict against &lt;i&gt;base&lt;/i&gt;" in dom and "&lt;b&gt;bold&lt;/b&gt;" in dom
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "<script>alert" not in dom
        assert "<b>bold" not in dom and "<i>base" not in dom and 'href="http://127.0.0.1:9/' not in dom
        dom = page(runs["child"])
        assert "tag=&lt;img src=x onerror=alert(1)&gt;" in dom and '<img src="x"' not in dom
