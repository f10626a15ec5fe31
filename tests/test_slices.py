"""Slices: every metric per tag and per intent in each run, and where a variant helps or hurts.

Per run: slice means against hand computations, records alone enough to recompute them,
old records without tags still readable, a bounded set of MLflow keys MLflow accepts.
Per comparison: a crafted pair of variants where the change helps one slice and hurts
another while the overall effect is zero (both detected, worst first); slices too small
to test listed as such; Benjamini-Hochberg against scipy; the sample sweep writes
slices.json per run and a slices section in comparison.json, names the hurting slices in
the MLflow run description, and report.html shows the "where it hurts" table in Chromium.
"""

from __future__ import annotations

import json
import math
import operator
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.load import load_sweep_dir
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.compare.run import run_comparison
from rag_ablate.compare.slices import compare_slices, resolve_metrics
from rag_ablate.config.schema import CompareConfig
from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.core.layout import COMPARISON_JSON, RECORDS_FILE, SLICES_JSON, SLICES_MD, VARIANT_FILE
from rag_ablate.records.jsonl import read_records, write_records
from rag_ablate.report.html import write_report
from rag_ablate.report.mlflow_ui import child_description, sweep_description
from rag_ablate.run.slices import (
    MLFLOW_MAX_SLICES,
    MLFLOW_MIN_QUERIES,
    SliceKey,
    members,
    mlflow_key,
    mlflow_slice_metrics,
    record_tags,
    slice_keys,
    slice_metrics,
    sliced,
)
from tests.conftest import QUERIES, chromium, run_module, write_dataset

# --------------------------------------------------------------------------- per run, by hand


def _rec(
    qid: str,
    split: str,
    tags: list[str] | None,
    l1: str | None,
    l2: str | None,
    metrics: dict[str, float],
    status: str = "ok",
    group: str | None = None,
    latency: float = 10.0,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "query_id": qid,
        "query": f"query {qid}",
        "split": split,
        "group": group or qid,
        "kind": "answerable",
        "intent_gold": l2,
        "intent_gold_l1": l1,
        "status": status,
        "timings_ms": {"total": latency},
        "metrics": {**metrics, "latency_ms": latency},
    }
    if tags is not None:
        rec["tags"] = tags
    return rec


HAND = [
    _rec("r1", "dev", ["a", "b"], "K", "K_x", {"recall_at_5": 1.0}, latency=10.0),
    _rec("r2", "dev", ["a"], "K", "K_y", {"recall_at_5": 0.0}, latency=20.0),
    _rec("r3", "dev", ["b"], "K", "K_x", {}, status="failed", latency=30.0),
    _rec("r4", "holdout", ["a"], "C", "C_g", {"intent_top1": 1.0}, latency=40.0),
    _rec("r5", "dev", None, "K", "K_x", {"recall_at_5": 0.5}, latency=50.0),  # written before tags
]


def test_slice_metrics_match_a_hand_computation() -> None:
    table = slice_metrics(HAND)
    names = [s.key.name for s in table.slices]
    # by kind (tag, intent_l1, intent_l2), then by value
    assert names == [
        "tag=a",
        "tag=b",
        "intent_l1=C",
        "intent_l1=K",
        "intent_l2=C_g",
        "intent_l2=K_x",
        "intent_l2=K_y",
    ]
    a, b = table.get("tag", "a"), table.get("tag", "b")
    kx, k = table.get("intent_l2", "K_x"), table.get("intent_l1", "K")
    assert a is not None and b is not None and kx is not None and k is not None
    # tag=a: r1 (1.0) and r2 (0.0) on dev, r4 on holdout (no recall there)
    assert (
        a.metrics["dev/n_queries"] == 2
        and a.mean("dev", "recall_at_5") == 0.5
        and a.n("dev", "recall_at_5") == 2
    )
    assert a.metrics["holdout/n_queries"] == 1 and a.mean("holdout", "recall_at_5") is None
    assert a.mean("holdout", "intent_top1") == 1.0 and a.metrics["all/n_queries"] == 3
    assert a.mean("dev", "latency_ms") == 15.0
    # tag=b: r1 ok, r3 failed: the failure counts in n_failed and latency, never in recall
    assert b.metrics["dev/n_failed"] == 1 and b.metrics["dev/error_rate"] == 0.5
    assert b.mean("dev", "recall_at_5") == 1.0 and b.n("dev", "recall_at_5") == 1
    assert b.mean("dev", "latency_ms") == 20.0  # (10 + 30) / 2, the failure timed until it failed
    # the record without tags is in its intent slices: K_x = r1, r3, r5
    assert kx.metrics["dev/n_queries"] == 3 and kx.mean("dev", "recall_at_5") == 0.75
    assert k.mean("dev", "recall_at_5") == 0.5  # (1 + 0 + 0.5) / 3
    assert table.n_records == 5 and table.n_without_tags == 1

    md = table.to_markdown(["recall_at_5"])
    dev = md.split("## dev")[1].split("## holdout")[0]
    assert dev.index("| tag=a | 2 | 0 | 0.500 (2) |") < dev.index(
        "| tag=b | 2 | 1 | 1.000 (1) |"
    )  # worst first
    assert "1 of 5 records carry no tags" in md
    data = table.to_dict()
    assert data["n_without_tags"] == 1 and data["slices"][0]["name"] == "tag=a"
    json.dumps(data)  # plain JSON


def test_mlflow_keys_are_bounded_and_valid() -> None:
    from mlflow.utils.validation import _validate_metric_name

    recs = []
    for i in range(30):  # 30 tags x 30 queries on each split: far more than the bound
        for split in ("dev", "holdout"):
            for j in range(30):
                tags = [f"t{i:02d}", "a=b/c 中文"] if j < 25 else [f"t{i:02d}"]
                recs.append(_rec(f"{split}{i}_{j}", split, tags, "K", None, {"recall_at_5": (i + j) % 2}))
    recs += [_rec(f"small{j}", "dev", ["rare"], None, None, {"recall_at_5": 1.0}) for j in range(5)]
    table = slice_metrics(recs)
    logged = mlflow_slice_metrics(table, "recall_at_5")
    assert 0 < len(logged) <= 2 * MLFLOW_MAX_SLICES
    for key in logged:
        _validate_metric_name(key)  # raises for a name MLflow refuses
        assert re.fullmatch(r"slice/[^/]+/(dev|holdout)/recall_at_5", key)
    # the largest slices come first: the shared tag (750 queries per split) and the intent (900)
    assert "slice/intent_l1.K/dev/recall_at_5" in logged
    odd = mlflow_key(SliceKey("tag", "a=b/c 中文"), "dev", "recall_at_5")
    assert odd == "slice/tag.a_b_c 中文/dev/recall_at_5" and odd in logged
    assert not any(".rare/" in k for k in logged)  # 5 queries < MLFLOW_MIN_QUERIES
    assert mlflow_key(SliceKey("tag", ".."), "dev", "m") == "slice/tag._/dev/m"
    # the value logged is the slice's mean
    shared = table.get("tag", "a=b/c 中文")
    assert shared is not None and logged[odd] == shared.mean("dev", "recall_at_5")
    assert mlflow_slice_metrics(table, "recall_at_5", min_queries=10_000) == {}
    assert MLFLOW_MIN_QUERIES == 20


# --------------------------------------------------------------------------- per comparison, crafted


def crafted(failed_in_variant: int = 2) -> list[VariantData]:
    """A change that helps every `short` query that was a miss and hurts `multi_doc` the same way.

    30 `short` queries: baseline misses 20 (recall 0), the variant finds all. 30 `multi_doc`
    queries: baseline finds all, the variant misses 20. The overall effect is exactly 0.
    Intents alternate, so each intent slice mixes both and shows no effect. Three `rare`
    queries (three groups) are too small to test. ``failed_in_variant`` more multi_doc queries
    fail in the variant.
    """
    base, var = [], []
    for i in range(30):
        l2 = "K_x" if i % 2 else "K_y"
        base.append(_rec(f"s{i}", "dev", ["short"], "K", l2, {"recall_at_5": 0.0 if i < 20 else 1.0}))
        var.append(_rec(f"s{i}", "dev", ["short"], "K", l2, {"recall_at_5": 1.0}))
        base.append(_rec(f"m{i}", "dev", ["multi_doc"], "K", l2, {"recall_at_5": 1.0}))
        var.append(_rec(f"m{i}", "dev", ["multi_doc"], "K", l2, {"recall_at_5": 0.0 if i < 20 else 1.0}))
    for i in range(3):
        base.append(_rec(f"r{i}", "dev", ["rare"], "C", "C_g", {"recall_at_5": 1.0}))
        var.append(_rec(f"r{i}", "dev", ["rare"], "C", "C_g", {"recall_at_5": 1.0}))
    for i in range(failed_in_variant):
        base.append(_rec(f"f{i}", "dev", ["multi_doc"], "K", "K_y", {"recall_at_5": 1.0}))
        var.append(_rec(f"f{i}", "dev", ["multi_doc"], "K", "K_y", {}, status="failed"))
    return [
        VariantData("baseline", base, info={"role": "baseline"}),
        VariantData("bigger_chunks", var),
    ]


def _section(variants: list[VariantData], min_groups: int = 6) -> tuple[Any, Any]:
    c = compare(variants, metrics=["recall_at_5", "error_rate"], splits=["dev"], B=2000, seed=3)
    c.slices = compare_slices(variants, c, metrics=["recall_at_5"], min_groups=min_groups)
    return c, c.slices


def test_a_change_that_helps_one_slice_and_hurts_another() -> None:
    c, sec = _section(crafted())
    overall = c.row("dev", "bigger_chunks", "recall_at_5")
    # nothing overall over the queries ok on both sides; the failure-aware effect counts the two
    # failed queries as misses (the baseline has a value for them)
    assert overall is not None and overall.ok_effect == 0.0 and not overall.significant
    assert overall.effect == pytest.approx(-2 / 65)
    by = {r.name: r for r in sec.rows}
    hurt, helped = by["tag=multi_doc"], by["tag=short"]
    assert hurt.verdict == "hurts" and helped.verdict == "helps"
    assert hurt.effect == pytest.approx(-20 / 30) and helped.effect == pytest.approx(20 / 30)
    assert hurt.ci_high < 0 < helped.ci_low and hurt.p_adjusted < 0.05 and helped.p_adjusted < 0.05
    assert (hurt.baseline_mean, hurt.variant_mean) == (1.0, pytest.approx(1 / 3))
    # the two failed queries are counted on the slice's row, not silently dropped
    assert (hurt.n_slice, hurt.n_queries, hurt.n_failed_variant, hurt.n_left_out) == (32, 30, 2, 2)
    assert (helped.n_failed_variant, helped.n_left_out) == (0, 0)
    # each intent mixes both: no evidence either way
    for name in ("intent_l2=K_x", "intent_l2=K_y", "intent_l1=K"):
        assert by[name].verdict == "no evidence", name
    # worst first: what hurts, then no evidence, then what helps, then what is too small
    verdicts = [r.verdict for r in sec.rows]
    assert verdicts[0] == "hurts" and sec.rows[0].name == "tag=multi_doc"
    assert verdicts == sorted(verdicts, key=["hurts", "no evidence", "helps", "too small"].index)
    assert [r.name for r in sec.hurts("bigger_chunks")] == ["tag=multi_doc"]

    text = format_terminal(c)
    assert "bigger_chunks, dev: tag=multi_doc recall@5 -0.667 [" in text
    md = format_markdown(c)
    assert "## Where it helps and hurts: slices (exploratory)" in md
    assert re.search(
        r"\| tag=multi_doc \| recall@5 \| 30 \(30\) \| 0 / 2 \| 1\.000 -> 0\.333 \| -0\.667 \[", md
    )
    line = child_description(c, "bigger_chunks", "recall_at_5")
    assert "Hurts on slices: tag=multi_doc (dev recall@5 -0.667)" in line and "exploratory" in line
    summary = sweep_description(c, [], "recall_at_5", "baseline")
    assert "Slices where a variant hurts" in summary and "bigger_chunks: tag=multi_doc" in summary
    json.dumps(c.to_dict())  # JSON without NaN


def test_too_small_slices_are_listed_not_tested() -> None:
    _, sec = _section(crafted())
    rare = next(r for r in sec.rows if r.name == "tag=rare")
    assert rare.verdict == "too small" and not rare.tested
    assert (rare.n_queries, rare.n_groups) == (3, 3)
    assert math.isnan(rare.p_value) and math.isnan(rare.p_adjusted)
    assert rare.baseline_mean == rare.variant_mean == 1.0  # described, not tested
    assert "compare.min_slice_groups=6" in rare.note
    assert sec.rows[-1].verdict == "too small"  # listed last
    # with a lower bar the same slice is tested
    _, low = _section(crafted(), min_groups=2)
    assert next(r for r in low.rows if r.name == "tag=rare").verdict == "no evidence"
    with pytest.raises(ConfigError, match="min_slice_groups"):
        _section(crafted(), min_groups=0)


def test_bh_across_slices_agrees_with_scipy() -> None:
    from scipy.stats import false_discovery_control

    _, sec = _section(crafted(), min_groups=2)
    tested = [r for r in sec.rows if r.tested]
    assert len(tested) == len(sec.rows) == 8  # 3 tags, intent_l1 K and C, intent_l2 K_x, K_y and C_g
    p = np.array([r.p_value for r in tested])
    want = false_discovery_control(p, method="bh")
    assert [r.p_adjusted for r in tested] == pytest.approx(list(want), rel=1e-12)
    # by hand: the smallest adjusted p is min over ranks j of k p_(j) / j, k = 8 slices
    ranked = sorted(p)
    by_hand = min(1.0, *(8 * pj / j for j, pj in enumerate(ranked, start=1)))
    assert min(r.p_adjusted for r in tested) == pytest.approx(by_hand)


def test_slice_metrics_setting_and_old_records() -> None:
    settings = CompareConfig()
    variants = crafted()
    assert resolve_metrics(variants, settings) == ["recall_at_5"]  # auto: the quality metric
    assert resolve_metrics(variants, CompareConfig(quality_metric="ndcg@10")) == ["ndcg_at_10"]
    assert resolve_metrics(variants, CompareConfig(slice_metrics=["auto", "recall@5", "error_rate"])) == [
        "recall_at_5",
        "error_rate",
    ]
    with pytest.raises(ConfigError, match="percentile"):
        resolve_metrics(variants, CompareConfig(slice_metrics=["latency_p95_ms"]))
    with pytest.raises(UnknownNameError):
        resolve_metrics(variants, CompareConfig(slice_metrics=["recal@5"]))
    # records written before tags were recorded: readable, in their intent slices, and said so
    for v in variants:
        for r in v.records:
            r.pop("tags")
    _, sec = _section(variants)
    assert {r.kind for r in sec.rows} == {"intent_l1", "intent_l2"}
    assert any("records without tags" in n and "baseline 65" in n for n in sec.notes)


def test_error_rate_per_slice_counts_failures() -> None:
    variants = crafted(failed_in_variant=8)
    c = compare(variants, metrics=["recall_at_5"], splits=["dev"], B=2000, seed=3)
    sec = compare_slices(variants, c, metrics=["error_rate"], min_groups=6)
    md = next(r for r in sec.rows if r.name == "tag=multi_doc")
    assert md.n_queries == 38 and md.effect == pytest.approx(8 / 38) and md.verdict == "hurts"
    assert next(r for r in sec.rows if r.name == "tag=short").effect == 0.0


# --------------------------------------------------------------------------- a crafted sweep folder, rendered


def _write_job(folder: Path, num: int, v: VariantData) -> None:
    folder.mkdir(parents=True)
    write_records(folder / RECORDS_FILE, v.records)
    role = "baseline" if v.label == "baseline" else "variant"
    info = {"label": v.label, "job_num": num, "role": role}
    (folder / VARIANT_FILE).write_text(json.dumps(info), encoding="utf-8")


@pytest.mark.slow
def test_report_shows_where_it_hurts_in_chromium(tmp_path: Path) -> None:
    from PIL import Image

    sweep = tmp_path / "sweep"
    for num, v in enumerate(crafted()):
        _write_job(sweep / str(num), num, v)
    settings = CompareConfig(metrics=["recall_at_5"], splits=["dev"], B=2000)
    run = run_comparison(sweep, settings, seed=3, guard=False, echo=lambda _: None)
    comp = json.loads((sweep / COMPARISON_JSON).read_text("utf-8"))
    sec = comp["slices"]
    assert sec["exploratory"] is True and sec["adjustment"] == "bh" and sec["metrics"] == ["recall_at_5"]
    assert sec["rows"][0]["slice"] == "tag=multi_doc" and sec["rows"][0]["verdict"] == "hurts"
    assert run.comparison.slices is not None
    report = write_report(sweep, run.comparison, run.source.variants)
    page = report.html.read_text("utf-8")
    assert '<section id="hurts"><h2>Where it hurts</h2>' in page
    hurts_table = page.split('<section id="hurts">')[1].split("</table>")[0]
    assert "tag=multi_doc" in hurts_table and "tag=short" not in hurts_table
    assert "-0.667 [" in hurts_table and "1.000 &rarr; 0.333" in hurts_table
    assert "<h3>Where it helps</h3>" in page and "Exploratory" in page

    shot = tmp_path / "report.png"  # the DOM and the screenshot from one start of Chromium
    args = ["--dump-dom", "--hide-scrollbars", f"--screenshot={shot}"]
    dom = chromium(report.html.as_uri(), tmp_path / "profile", *args, window="1280,2400")
    text = re.sub(r"<[^>]+>", " ", dom)
    assert "Where it hurts" in text and "tag=multi_doc" in text
    assert shot.is_file()
    with Image.open(shot) as im:
        assert im.size == (1280, 2400)
        colors = dict((c, n) for n, c in im.convert("RGB").getcolors(maxcolors=1 << 20) or [])
    # the hurting slice's effect cell is painted (tr.worse td.eff); the overall row is not worse here
    assert colors.get((0xFB, 0xE0, 0xDE), 0) > 1000
    assert colors.get((0xDC, 0xF3, 0xE3), 0) > 1000  # and the helping one (tr.better td.eff)


# --------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_a_run_writes_slices_that_records_alone_reproduce(tmp_path: Path) -> None:
    tags = {"q1": ["short"], "q2": ["multi_doc"], "q3": ["short"], "q7": ["templated"], "q8": ["templated"]}
    queries = [{**q, "tags": tags.get(q["query_id"], [])} for q in QUERIES]
    data = write_dataset(tmp_path / "data", queries=queries)
    proc = run_module(
        "rag_ablate",
        [f"dataset.path={data}", "progress=false", "tracking=none", "hydra.run.dir=run"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    records = read_records(run / RECORDS_FILE)
    assert {r["query_id"]: r["tags"] for r in records} == {q["query_id"]: q["tags"] for q in queries}
    written = json.loads((run / SLICES_JSON).read_text("utf-8"))
    assert written == json.loads(json.dumps(slice_metrics(records).to_dict()))  # records alone suffice
    by = {s["name"]: s for s in written["slices"]}
    templated = by["tag=templated"]
    values = {r["query_id"]: r["metrics"]["recall_at_5"] for r in records if r["query_id"] in ("q7", "q8")}
    split_of = {r["query_id"]: r["split"] for r in records}
    for split in ("dev", "holdout"):
        mine = [values[q] for q in values if split_of[q] == split]
        if mine:
            assert templated["metrics"][f"{split}/recall_at_5"] == pytest.approx(sum(mine) / len(mine))
    assert templated["metrics"]["all/n_queries"] == 2 and written["n_without_tags"] == 0
    assert "intent_l2=K_shipping" in by and "intent_l1=CHITCHAT" in by
    assert "| tag=templated |" in (run / SLICES_MD).read_text("utf-8")


@pytest.fixture(scope="module")
def sample_sweep(default_sweep: dict[str, Any]) -> dict[str, Any]:
    """README's sweep on the embedded sample (shared by the session: tests/conftest.py)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{default_sweep['out'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    return {"dir": default_sweep["dir"], "proc": default_sweep["proc"], "runs": runs, "client": client}


@pytest.mark.slow
def test_the_sample_sweep_has_slices_per_run_and_in_the_comparison(sample_sweep: dict[str, Any]) -> None:
    sweep: Path = sample_sweep["dir"]
    variants = load_sweep_dir(sweep)
    for v in variants:
        job = Path(v.source)
        data = json.loads((job / SLICES_JSON).read_text("utf-8"))
        names = {s["name"] for s in data["slices"]}
        assert {"tag=paraphrase", "tag=numeric", "tag=multi_doc", "intent_l1=KNOWLEDGE"} <= names
        assert any(n.startswith("intent_l2=") for n in names)
        assert (job / SLICES_MD).is_file()
    comp = json.loads((sweep / COMPARISON_JSON).read_text("utf-8"))
    sec = comp["slices"]
    assert sec["metrics"] == ["recall_at_5"] and sec["min_groups"] == 6
    rows = sec["rows"]
    assert {r["split"] for r in rows} == {"dev", "holdout"} and {r["variant"] for r in rows} == {"chunk=256"}
    assert {r["verdict"] for r in rows} <= {"hurts", "no evidence", "helps", "too small", "untested"}
    for r in rows:
        if r["verdict"] == "too small":
            assert r["n_groups"] < 6 and r["p_value"] is None
        else:
            assert r["n_groups"] >= 6 and 0 < r["p_adjusted"] <= 1
    # the slice's means are those of its queries in the two runs' records
    base = next(v for v in variants if v.label == "baseline")
    row = next(r for r in rows if r["slice"] == "tag=numeric" and r["split"] == "holdout")
    vals = [
        rec["metrics"]["recall_at_5"]
        for rec in base.records
        if rec["split"] == "holdout" and "numeric" in rec["tags"] and "recall_at_5" in rec["metrics"]
    ]
    assert row["baseline_mean"] == pytest.approx(sum(vals) / len(vals)) and row["n_queries"] == len(vals)
    assert "slices where a variant hurts" in sample_sweep["proc"].stdout
    assert '<section id="hurts"><h2>Where it hurts</h2>' in (sweep / "report.html").read_text("utf-8")


@pytest.mark.slow
def test_the_sample_sweep_logs_bounded_slice_metrics_and_names_them(sample_sweep: dict[str, Any]) -> None:
    client = sample_sweep["client"]
    children = [r for r in sample_sweep["runs"] if r.data.tags.get("rag_ablate.kind") == "variant"]
    assert len(children) == 2
    for run in children:
        keys = {k: v for k, v in run.data.metrics.items() if k.startswith("slice/")}
        assert 0 < len(keys) <= 2 * MLFLOW_MAX_SLICES
        assert all(k.endswith(("/dev/recall_at_5", "/holdout/recall_at_5")) for k in keys)
        table = json.loads(Path(client.download_artifacts(run.info.run_id, SLICES_JSON)).read_text("utf-8"))
        by = {s["name"]: s for s in table["slices"]}
        assert keys["slice/tag.paraphrase/holdout/recall_at_5"] == pytest.approx(
            by["tag=paraphrase"]["metrics"]["holdout/recall_at_5"]
        )
        for name, s in by.items():
            n = min(s["n_values"][sp].get("recall_at_5", 0) for sp in ("dev", "holdout"))
            key = f"slice/{name.replace('=', '.', 1)}/dev/recall_at_5"
            if n < MLFLOW_MIN_QUERIES:
                assert key not in keys, key
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {SLICES_JSON, SLICES_MD} <= arts
        if run.data.tags.get("ablation.role") != "baseline":
            assert "Hurts on slices: " in run.data.tags["mlflow.note.content"]
    parent = next(r for r in sample_sweep["runs"] if r.data.tags.get("rag_ablate.kind") == "sweep")
    assert "Slices where a variant hurts" in parent.data.tags["mlflow.note.content"]


_SLICE_RECORD = st.fixed_dictionaries(
    {},
    optional={
        "tags": st.lists(st.sampled_from(["a", "b", "edge"]), max_size=3) | st.none(),
        "intent_gold_l1": st.sampled_from(["K", "O"]) | st.none(),
        "intent_gold": st.sampled_from(["K_x", "O_y"]) | st.none(),
        "expected_behavior": st.sampled_from(["answer", "refuse"]) | st.none(),
        "applicable_version": st.sampled_from(["v1", "v2"]) | st.none(),
        "metadata": st.dictionaries(
            st.sampled_from(["p", "q"]),
            st.sampled_from(["x", "y"])
            | st.integers(0, 2)
            | st.booleans()
            | st.lists(st.sampled_from(["x", 1]))
            | st.floats()
            | st.none(),
            max_size=2,
        ),
    },
)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(_SLICE_RECORD, max_size=12))
def test_members_are_each_slice_keys_records_in_order(records: list[dict[str, Any]]) -> None:
    """members() groups records by (kind, value) pairs: the slices and rows of grouping by slice_keys."""
    expected: dict[SliceKey, list[Any]] = {}
    for rec in records:
        for key in slice_keys(rec):  # type: ignore[arg-type]
            expected.setdefault(key, []).append(rec)
    got = members(records)  # type: ignore[arg-type]
    assert list(got) == list(sliced(expected))
    assert all(got[k] == v and all(map(operator.is_, got[k], v)) for k, v in sliced(expected).items())


def test_records_without_tags_are_those_with_no_tags_key_or_tags_none() -> None:
    """n_without_tags counts a record with no ``tags`` key and one whose tags are None (record_tags is
    None for both), not one with an empty list; counted in the pass that groups the slices."""
    base = {"split": "dev", "kind": "answerable", "status": "ok", "metrics": {"recall_at_5": 1.0}}
    records = [
        {**base, "query_id": "q1"},
        {**base, "query_id": "q2", "tags": None},
        {**base, "query_id": "q3", "tags": []},
        {**base, "query_id": "q4", "tags": ["a"]},
    ]
    table = slice_metrics(records)  # type: ignore[arg-type]
    assert table.n_without_tags == sum(record_tags(r) is None for r in records) == 2  # type: ignore[arg-type]
    assert [s.key.name for s in table.slices] == ["tag=a"]
