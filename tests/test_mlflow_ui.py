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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.cli.main import main
from rag_ablate.records.jsonl import read_records
from rag_ablate.tracking.ui import baseline_run_name, headline_metrics, mlflow_metrics
from tests.conftest import copy_shared, mlflow_ui, require_chromium

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


@pytest.fixture(scope="module")
def ui(default_sweep: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One ``rag-ablate ui`` for this module's browser tests (each start costs about 3.5 s of CPU):
    started as a user would in the folder of a copy of README's sweep, whose store also holds the
    runs of :func:`_hostile_runs` (an experiment of their own). ``port``, ``printed`` (what the
    command printed), ``cwd`` (the copy) and ``hostile`` (that experiment's id and run ids)."""
    folder = tmp_path_factory.mktemp("ui")
    copy = copy_shared(default_sweep, folder / "sweep")
    hostile = _hostile_runs(f"sqlite:///{copy['out'] / 'mlflow.db'}")
    with mlflow_ui(folder / "ui.log", cwd=copy["cwd"]) as port:
        yield {
            "port": port,
            "printed": (folder / "ui.log").read_text(),
            "cwd": copy["cwd"],
            "hostile": hostile,
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
    assert f"latency_p95_ms {p95['effect']:+.3f}" in child
    tokens = _row(sweep["comparison"], "holdout", "chunk=256", "context_tokens_at_5")
    digits = 1 if abs(tokens["effect"]) >= 100 else 3
    assert f"context_tokens@5 {tokens['effect']:+.{digits}f}" in child  # cost beyond latency
    assert "leaks: acl_leak" in child
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
    assert sorted(row[:3] for row in table["data"]) == [  # a row per variant and split
        ["baseline", "baseline", "dev"],
        ["baseline", "baseline", "holdout"],
        ["chunk=256", "variant", "dev"],
        ["chunk=256", "variant", "holdout"],
    ]
    key = parent.data.tags["rag_ablate.ui_view"]
    exp = client.get_experiment(sweep["experiment"].experiment_id)
    state = json.loads(exp.tags[f"mlflow.sharedViewState.{key}"])
    assert parent.info.run_id in state["searchFilter"]
    assert state["orderByKey"] == "metrics.`headline/holdout_recall_at_5`" and state["orderByAsc"] is False
    assert state["chartsSearchFilter"] == "headline/"
    link = f"http://[::1]:5000/#/experiments/{exp.experiment_id}/runs?viewStateShareKey={key}"
    assert link in sweep["proc"].stdout  # tracking.ui_port's default, kept for rag-ablate ui
    assert parent.data.tags["rag_ablate.ui_port"] == "5000"


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
def test_ui_serves_on_the_port_the_sweep_links_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``rag-ablate ui`` serves where the latest sweep's printed links point (tracking.ui_port, kept
    on the sweep run), ``--port N`` prints the links for N; MLflow's app runs in this process with one
    worker and no job-execution workers."""
    from rag_ablate.tracking import store as tracking
    from rag_ablate.tracking.tags import UI_PORT_TAG, VIEW_KEY_TAG

    uri = tracking.default_uri(tmp_path)
    exp = tracking.open_store(uri, "rag_ablate", tmp_path / "art", create_folder=True)  # as a run opens it
    sweep_run = tracking.start_parent(uri, exp, "sweep", {"rag_ablate.kind": "sweep"})
    tracking.save_view(uri, exp, sweep_run, {"searchFilter": ""}, 5123)
    key = tracking.latest_sweep_view(uri, "rag_ablate")
    assert key is not None and key[2] == 5123
    assert main(["ui", "--uri", uri, "--dry-run"]) == 0
    out = capsys.readouterr().out
    # links at [::1], where MLflow 3.17 does not open its assistant panel; served there and at 127.0.0.1
    assert f"http://[::1]:5123/#/experiments/{exp}/runs?viewStateShareKey={key[1]}" in out
    assert "uvicorn on 127.0.0.1:5123 and [::1]:5123, 1 worker, in this process" in out
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in out
    assert main(["ui", "--uri", uri, "--port", "5999", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "http://[::1]:5999/#/experiments/" in out and ":5123/#" not in out
    assert "printed its links for port 5123" in out
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(sweep_run).data.tags
    assert tags[UI_PORT_TAG] == "5123" and tags[VIEW_KEY_TAG] == key[1]


def test_printed_hints_name_the_ui_port() -> None:
    from rag_ablate.run.summary import ui_hint

    uri = f"sqlite:///{(Path.cwd() / 'outputs' / 'mlflow.db').resolve()}"
    assert ui_hint(uri) == "MLflow UI: rag-ablate ui   (serves http://[::1]:5000)"
    hint = ui_hint(uri, "http://[::1]:5001/#/x", 5001)
    assert hint.startswith("MLflow UI: rag-ablate ui --port 5001   (serves http://[::1]:5001)")


def test_links_avoid_the_hostnames_where_mlflow_opens_its_assistant(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3.17 opens its assistant panel on a first visit when ``location.hostname`` is localhost,
    127.0.0.1 or ::1 (``[::1]`` for the IPv6 loopback in a URL); the links use ``[::1]``, and
    127.0.0.1 only where this machine has no IPv6 loopback."""
    from rag_ablate.tracking import ui

    assert ui.ui_base("sqlite:///x.db", 5001) == "http://[::1]:5001"
    assert ui.ui_base("http://tracking:5000/", 5001) == "http://tracking:5000"  # a server: its own URL
    monkeypatch.setattr(ui, "ipv6_loopback", lambda: False)
    assert ui.ui_base("sqlite:///x.db", 5001) == "http://127.0.0.1:5001"


@pytest.mark.slow
def test_the_printed_link_opens_the_ranked_runs_view(
    sweep: dict[str, Any], ui: dict[str, Any], tmp_path: Path
) -> None:
    """In Chromium at 1600x1100 with a fresh profile, as a first visit: the printed link's ranked view
    shows each variant's interval and verdict per split beside its cost, every column whole inside
    the window and no assistant panel over it (the link's host is ``[::1]``, where MLflow does not
    open it); the sweep run's page shows the verdict in the description's first paragraph (what
    MLflow shows before "Show more"). With ``RAG_ABLATE_SCREENSHOT_DIR`` set, both pages are saved
    there (docs/img/mlflow-ui.png, docs/img/mlflow-sweep-run.png)."""
    from rag_ablate.report.mlflow_ui import VISIBLE_CHARS
    from rag_ablate.tracking.ui import rank_columns
    from tests.cdp import ASSISTANT_PANEL, open_page, visible

    require_chromium()
    shots = os.environ.get("RAG_ABLATE_SCREENSHOT_DIR")
    # the default store: outputs/mlflow.db under the folder the sweep ran in
    printed = ui["printed"]
    match = re.search(r"(http://\[::1\]:\d+/#/experiments/\S+/runs\?viewStateShareKey=\S+)", printed)
    assert match, printed
    assert f"]:{ui['port']}/" in match[1]
    parent = sweep["parent"].info.run_id
    run_page = f"http://[::1]:{ui['port']}/#/experiments/{sweep['experiment'].experiment_id}/runs/{parent}"
    with open_page(match[1], tmp_path / "profile") as page:
        page.wait_for("document.body.innerText.includes('holdout recall_at_5')")
        page.wait_for("document.body.innerText.includes('chunk=256')")
        time.sleep(2)  # the panel, when MLflow opens it, comes with the page's first data
        assert page.evaluate(ASSISTANT_PANEL) == 0, "MLflow's assistant panel is open"
        tags = rank_columns("recall_at_5", "latency_p95_ms").values()
        cols = ["attributes.`Run Name`", *(f"tags.`{k}`" for k in tags)]
        for col in cols:  # each column's header and first cell whole in the window, nothing over it
            for sel in (f".ag-header-cell[col-id='{col}']", f".ag-row .ag-cell[col-id='{col}']"):
                assert page.evaluate(visible(f'document.querySelector("{sel}")')), f"{sel} not in view"
        dom = page.evaluate("document.documentElement.outerHTML")
        if shots:  # docs/img: RAG_ABLATE_SCREENSHOT_DIR=docs/img
            page.screenshot(Path(shots).resolve() / "mlflow-ui.png")
        # the sweep run's own page, in the same window
        page.goto(run_page, "document.querySelector('[data-testid=note-editor-preview-content] p')")
        run_dom = page.evaluate("document.documentElement.outerHTML")
        if shots:
            page.screenshot(Path(shots).resolve() / "mlflow-sweep-run.png")
    for text in ("baseline (chunk=512)", "chunk=256", "holdout recall_at_5", "holdout latency_p95_ms"):
        assert text in dom, f"{text!r} not on the page"
    for split in ("holdout", "dev"):
        effect = _row(sweep["comparison"], split, "chunk=256", "recall_at_5")
        cell = sweep["children"]["chunk=256"].data.tags[f"{split} recall_at_5"]
        interval = f"Δ {effect['effect']:+.3f} [{effect['ci_low']:+.3f}, {effect['ci_high']:+.3f}]"
        verdict = f"{effect['verdict']}*" if effect["verdict"] else "no evidence, MDE ±"
        assert interval in cell and verdict in cell, cell
        assert f">{cell}<" in dom, f"{cell!r} not on the page"
    # ranked by holdout recall@5, best first
    m = {n: r.data.metrics["headline/holdout_recall_at_5"] for n, r in sweep["children"].items()}
    best, other = sorted(m, key=lambda n: -m[n])
    if m[best] != m[other]:
        assert dom.index(f">{best}<") < dom.index(f">{other}<")
    shown = re.search(r'data-testid="note-editor-preview-content"><p>(.*?)</p>', run_dom)
    assert shown, "no description on the sweep run's page"
    first = re.sub(r"<[^>]+>", "", shown[1])  # the first paragraph's text
    effect = _row(sweep["comparison"], "holdout", "chunk=256", "recall_at_5")
    assert first.startswith("Verdict on recall@5 vs baseline (chunk=512)"), first
    assert f"holdout {effect['effect']:+.3f} [{effect['ci_low']:+.3f}, {effect['ci_high']:+.3f}]" in first
    assert "latency p95 ms" in first and len(first) <= VISIBLE_CHARS


@pytest.mark.slow
def test_ui_serves_the_store_on_both_loopback_addresses(ui: dict[str, Any]) -> None:
    """``rag-ablate ui`` answers MLflow's API on 127.0.0.1 and on [::1] (where its links point)."""
    import httpx

    from rag_ablate.tracking.ui import ipv6_loopback

    hosts = ["127.0.0.1", *(["[::1]"] if ipv6_loopback() else [])]
    for host in hosts:
        r = httpx.get(
            f"http://{host}:{ui['port']}/api/2.0/mlflow/experiments/get-by-name",
            params={"experiment_name": "rag_ablate"},
            timeout=5,
        )
        assert r.status_code == 200 and r.json()["experiment"]["name"] == "rag_ablate", host


@pytest.mark.slow
def test_per_query_view_of_the_default_sweep_says_which_queries_and_agrees(
    default_sweep: dict[str, Any], ui: dict[str, Any], tmp_path: Path
) -> None:
    """As a person would, at 1600x1100 with a fresh profile: the printed link of a split opens a
    view named after the queries it holds, whose column averages are those queries' means in
    records.jsonl (the split's means in comparison.json when the split is traced whole), where
    a lower-is-better metric that improved (fewer context tokens) shows as an increase, in green, and
    where the headline metric's column comes first and is whole in the window, no assistant panel
    over it."""
    from mlflow.tracing.client import TracingClient

    from rag_ablate.tracking import traces as mt
    from tests.cdp import ASSISTANT_PANEL, open_page, visible
    from tests.test_mlflow_traces import _header_badges

    require_chromium()
    out = default_sweep["out"]
    lines = [ln for ln in default_sweep["proc"].stdout.splitlines() if ln.startswith("per-query ")]
    line = next(ln for ln in lines if ", dev (" in ln)
    assert re.search(r"dev \(20 of \d+ queries, a sample stratified by kind\): http", line), lines
    url = line.split(": ", 1)[1]
    variant_split = re.search(r"selectedRunUuid=(\w+)", url)[1]  # type: ignore[index]
    uri = f"sqlite:///{out / 'mlflow.db'}"
    traced = TracingClient(uri).search_traces(
        locations=["1"], run_id=variant_split, max_results=500, include_spans=False
    )
    ids = {json.loads(t.info.request_preview)["query_id"] for t in traced}
    assert len(ids) == 20
    job = next(
        p.parent
        for p in default_sweep["dir"].glob("*/summary.json")
        if json.loads(p.read_text(encoding="utf-8"))["label"] == "chunk=256"
    )
    records = [r for r in read_records(job / "records.jsonl") if r["query_id"] in ids]
    headers = "[...document.querySelectorAll('[role=columnheader]')]"
    headline = headers + ".find(e => e.innerText.startsWith('#3 recall_at_5'))"
    url = url.replace(":5000/", f":{ui['port']}/")  # the module's server, on a copy of this sweep
    with open_page(url, tmp_path / "profile") as page:
        page.wait_for(headline)
        page.wait_for("document.body.innerText.includes('20 of ')")
        time.sleep(2)  # the panel, when MLflow opens it, comes with the page's first data
        assert page.evaluate(ASSISTANT_PANEL) == 0, "MLflow's assistant panel is open"
        assert page.evaluate(visible(headline)), "the headline column is cut"
        dom = page.evaluate("document.documentElement.outerHTML")
        shots = os.environ.get("RAG_ABLATE_SCREENSHOT_DIR")
        if shots:
            page.screenshot(Path(shots).resolve() / "mlflow-eval-compare.png")
    assert "chunk=256 · dev · 20 of " in dom and "baseline (chunk=512) · dev · 20 of " in dom
    badges = _header_badges(dom)
    assert badges, dom[-2000:]
    assert next(iter(badges)) == "#3 recall_at_5"  # the headline metric is the first feedback column
    for name, (avg, _) in badges.items():
        metric = mt.metric_of(name)
        values = [
            mt.feedback(metric, r["metrics"][metric])[1]
            for r in records
            if r["metrics"].get(metric) is not None
        ]
        assert avg == pytest.approx(sum(values) / len(values), abs=0.006), name
    # fewer context tokens for chunk=256: an improvement, shown as an increase (MLflow's green)
    avg, diff = badges["context_tokens_at_5" + mt.NEGATED]
    assert avg < 0 and diff.startswith("+")


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


def _hostile_runs(uri: str) -> dict[str, str]:
    """In the store at ``uri``, an experiment ``hostile`` with three runs whose descriptions are: a
    control (real ``<b>`` and ``<img>``), and the sweep's and a variant's descriptions of
    :func:`_hostile_descriptions`. Their ids by name, and the experiment's as ``experiment``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment("hostile")
    runs = {"experiment": exp}
    sweep, child = _hostile_descriptions()
    for name, text in (("control", "control: <b>bold</b> <img src=x>"), ("sweep", sweep), ("child", child)):
        runs[name] = client.create_run(exp).info.run_id
        client.set_tag(runs[name], NOTE, text)
    return runs


@pytest.mark.slow
def test_the_mlflow_ui_shows_html_from_the_data_as_text(ui: dict[str, Any], tmp_path: Path) -> None:
    """In headless Chromium, MLflow's run page renders a description's HTML (the control run shows a
    real <b> and <img>); the descriptions rag_ablate writes show the same markup as text."""
    from tests.cdp import open_page

    require_chromium()
    runs = ui["hostile"]

    def url(name: str) -> str:
        return f"http://127.0.0.1:{ui['port']}/#/experiments/{runs['experiment']}/runs/{runs[name]}"

    note = "document.querySelector('[data-testid=note-editor-preview-content]')"
    doms = {}
    with open_page("about:blank", tmp_path / "profile", width=1900, height=1200) as page:
        for name, words in (("control", "control:"), ("sweep", "Verdict against"), ("child", "tag=")):
            # this run's page: its id shown, and its description
            ready = f"document.body.innerText.includes({json.dumps(runs[name])})"
            page.goto(url(name), f"{ready} && {note} && {note}.innerText.includes({json.dumps(words)})")
            doms[name] = page.evaluate("document.documentElement.outerHTML")
    dom = doms["control"]
    assert "<b>bold</b>" in dom and '<img src="x"' in dom  # the UI renders HTML: the test can fail
    dom = doms["sweep"]
    assert "Verdict against &lt;i&gt;base&lt;/i&gt;" in dom and "&lt;b&gt;bold&lt;/b&gt;" in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "<script>alert" not in dom
    assert "<b>bold" not in dom and "<i>base" not in dom and 'href="http://127.0.0.1:9/' not in dom
    dom = doms["child"]
    assert "tag=&lt;img src=x onerror=alert(1)&gt;" in dom and '<img src="x"' not in dom


# --------------------------------------------------------------------------- the ranked view and descriptions


def _r(split: str, variant: str, metric: str, effect: float, lo: float, hi: float, verdict: str = "") -> Any:
    from rag_ablate.compare.model import Row
    from rag_ablate.metrics.registry import direction_of

    label = f"{verdict} (after Holm)" if verdict else "no evidence; could detect ±0.05"
    return Row(
        split, variant, metric, direction_of(metric), 0.8, 0.8 + effect, effect, lo, hi, 0.01,
        0.001 if verdict else 0.5, False, 0.5, False, 40, 30,
        adjustment="holm", significant=bool(verdict), verdict=verdict, label=label, mde=0.05,
    )  # fmt: skip


def _comparison() -> Any:
    """A priced sweep's comparison: ``better`` improves recall@5 on both splits at a higher price and
    latency; ``same`` shows no evidence on recall@5 but leaks more on holdout."""
    from rag_ablate.compare.model import Comparison, Point, SplitTradeoff, Tradeoff

    rows = [
        _r("holdout", "better", "recall_at_5", 0.04, 0.01, 0.07, "better"),
        _r("dev", "better", "recall_at_5", 0.03, 0.005, 0.055, "better"),
        _r("holdout", "better", "latency_p95_ms", 3.9, 3.1, 4.6, "worse"),
        _r("holdout", "same", "recall_at_5", -0.026, -0.07, 0.018),
        _r("dev", "same", "recall_at_5", -0.028, -0.06, 0.004),
        _r("holdout", "same", "latency_p95_ms", 0.1, -0.2, 0.4),
        _r("holdout", "same", "acl_leak_rate_at_10", 0.1, 0.05, 0.15, "worse"),
    ]

    def points(shift: float) -> list[Point]:
        return [
            Point("baseline", 0.85 + shift, 0.8, 0.9, 30, 0.4, 0.38, 0.42, 30, baseline=True),
            Point("better", 0.89 + shift, 0.85, 0.93, 30, 0.52, 0.5, 0.55, 30),
            Point("same", 0.824 + shift, 0.78, 0.86, 30, 0.41, 0.39, 0.43, 30),
        ]

    t = Tradeoff(
        "recall_at_5", "usd_per_1k", True, "USD", "baseline", None, 1000, 0, 0.05,
        [SplitTradeoff("dev", 30, points(0.01)), SplitTradeoff("holdout", 30, points(0.0))],
    )  # fmt: skip
    metrics = ["recall_at_5", "latency_p95_ms", "acl_leak_rate_at_10"]
    return Comparison(
        "baseline", ["better", "same"], metrics, ["dev", "holdout"], 1000, 0, 0.05, rows, {}, tradeoff=t
    )


def test_the_ranked_view_shows_effect_interval_verdict_and_cost_per_split() -> None:
    from rag_ablate.report.mlflow_ui import axes, ranked_tags
    from rag_ablate.tracking.ui import TABLE_PX, view_state

    c = _comparison()
    quality, cost = axes(c, "mrr_at_10")  # the comparison's axes, not the end table's first column
    assert (quality, cost) == ("recall_at_5", "usd_per_1k")
    same = ranked_tags(c, "same", quality, cost)
    assert same["holdout recall_at_5"] == "Δ -0.026 [-0.070, +0.018] no evidence, MDE ±0.05"
    assert same["dev recall_at_5"] == "Δ -0.028 [-0.060, +0.004] no evidence, MDE ±0.05"
    assert same["holdout usd_per_1k"] == "0.41 [0.39, 0.43]"  # the trade-off's number, per split
    assert same["other significant effects"] == "acl_leak_rate@10 worse (holdout)"
    better = ranked_tags(c, "better", quality, cost)
    assert better["holdout recall_at_5"] == "Δ +0.040 [+0.010, +0.070] better*"
    assert better["other significant effects"] == "latency_p95_ms worse (holdout)"
    assert ranked_tags(c, "baseline", quality, cost)["holdout recall_at_5"] == "0.850 (baseline)"
    cells = {key: [tags[key] for tags in (same, better)] for key in same}
    state = view_state("RUN", quality, cost, cells, ["baseline (chunk=512)", "same", "better"])
    assert state["orderByKey"] == "metrics.`headline/holdout_recall_at_5`"
    assert state["columnOrder"] == [
        "attributes.`Run Name`",
        "runDateAndNestInfo",  # MLflow's created column, narrowed to its status icon
        "tags.`holdout recall_at_5`",
        "tags.`holdout usd_per_1k`",
        "tags.`dev recall_at_5`",
        "tags.`dev usd_per_1k`",
        "tags.`other significant effects`",
    ]
    # at 1600 px every column fits beside MLflow's sidebar and checkbox column (TABLE_PX), each
    # wide enough for its longest text at 5.6 px a character (Chromium's 13 px font: about 5.5)
    widths = state["columnWidths"]
    assert sum(widths.values()) <= TABLE_PX
    for key, texts in cells.items():
        assert widths[f"tags.`{key}`"] >= 5.6 * max(map(len, texts)), key


def test_other_effects_list_the_worse_first_and_those_on_both_splits_before_one() -> None:
    """A cell too narrow for all of them (MLflow cuts it with an ellipsis) cuts the least telling."""
    from dataclasses import replace

    from rag_ablate.report.mlflow_ui import other_effects

    c = _comparison()
    c = replace(
        c,
        rows=[
            _r("dev", "v", "ndcg_at_10", 0.05, 0.01, 0.09, "better"),
            _r("dev", "v", "bpref", -0.05, -0.09, -0.01, "worse"),
            _r("holdout", "v", "evidence_recall_at_5", -0.05, -0.09, -0.01, "worse"),
            _r("dev", "v", "evidence_recall_at_5", -0.05, -0.09, -0.01, "worse"),
            _r("holdout", "v", "recall_at_5", -0.05, -0.09, -0.01, "worse"),  # the quality axis: left out
        ],
    )
    assert other_effects(c, "v", "recall_at_5") == (
        "evidence_recall@5 worse (holdout, dev); bpref worse (dev); ndcg@10 better (dev)"
    )


def test_the_summary_table_has_a_row_per_variant_and_split() -> None:
    from rag_ablate.report.mlflow_ui import summary_table

    c = _comparison()
    summaries = [{"label": v, "metrics": {}} for v in ("baseline", "better", "same")]
    table = summary_table(c, summaries, "recall_at_5", "usd_per_1k")
    rows = [dict(zip(table, values, strict=True)) for values in zip(*table.values(), strict=True)]
    assert [(r["variant"], r["split"]) for r in rows][:2] == [("baseline", "dev"), ("baseline", "holdout")]
    same = next(r for r in rows if (r["variant"], r["split"]) == ("same", "holdout"))
    assert same["recall_at_5"] == 0.824 and same["delta_recall_at_5"] == -0.026
    assert (same["ci_low"], same["ci_high"], same["mde"]) == (-0.07, 0.018, 0.05)
    assert same["verdict"] == "no evidence; could detect ±0.05"
    assert (same["usd_per_1k"], same["usd_per_1k_low"], same["usd_per_1k_high"]) == (0.41, 0.39, 0.43)
    assert same["other_significant_effects"] == "acl_leak_rate@10 worse (holdout)"


def test_the_sweep_description_opens_on_the_verdict() -> None:
    from rag_ablate.report.mlflow_ui import VISIBLE_CHARS, sweep_description

    c = _comparison()
    text = sweep_description(c, [], "recall_at_5", "baseline (chunk=512)")
    first = text.split("\n\n")[0]  # the paragraph MLflow shows before "Show more"
    assert len(first) <= VISIBLE_CHARS, len(first)
    assert "**better**: better (holdout +0.040 [+0.010, +0.070]*, dev +0.030 [+0.005, +0.055]*, " in first
    assert "USD per 1k queries 0.52 vs 0.4)" in first  # at what cost, on holdout
    assert "**worse**: none" in first
    assert "**no evidence**: same (holdout -0.026 [-0.070, +0.018], could detect ±0.05, " in first
    assert "recall@5 vs baseline (chunk=512)" in first
    # a study of many variants still fits: those without evidence are named only, from the last
    many = _comparison()
    for i in range(8):
        many.variants.append(f"chunk={2**i}")
        many.rows.append(_r("holdout", f"chunk={2**i}", "recall_at_5", 0.01, -0.03, 0.05))
    first = sweep_description(many, [], "recall_at_5", "baseline (chunk=512)").split("\n\n")[0]
    assert len(first) <= VISIBLE_CHARS and "better (holdout +0.040" in first, first
    assert "same (holdout -0.026" in first and first.endswith("chunk=64; chunk=128")


def test_each_variant_line_covers_quality_cost_and_leaks() -> None:
    from rag_ablate.report.mlflow_ui import child_description

    line = child_description(_comparison(), "same", "recall_at_5")
    assert line.startswith(
        "vs baseline on holdout: recall@5 -0.026 [-0.070, +0.018] no evidence; could detect"
    )
    assert "latency_p95_ms +0.100 [-0.200, +0.400] no evidence" in line
    assert "leaks: acl_leak_rate@10 +0.100 [+0.050, +0.150] worse*" in line
    assert "USD per 1k queries 0.41 vs 0.4" in line
    assert "\n" not in line
