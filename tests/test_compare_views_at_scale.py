"""The comparison's views at scale (issue 28), on objects built in memory: no sweep.

A comparison keeps the largest changes of each list of flipped queries and counts them all, and every
view (terminal, comparison.md, report.html, comparison.json read back) prints the count, not the
length of what was kept; report.html's recall curves and per-intent accuracy take one pass over the
records; records read for a comparison share their field names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.compare.analysis import _pair, compare, failed, plan_compare
from rag_ablate.compare.draws import SharedDraws
from rag_ablate.compare.load import load_sweep_dir
from rag_ablate.compare.model import FLIPS_KEPT, Comparison, Flip, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.core.layout import RECORDS_FILE, VARIANT_FILE
from rag_ablate.report import html as html_report

N_REGRESSED = FLIPS_KEPT + 70


def _comparison() -> Comparison:
    # regressed: baseline 1.0, variant falling by query number, so the largest changes are the last ones
    regressed = [Flip(f"q{i:03d}", f"text {i}", 1.0, 1.0 - (i + 1) / 1000) for i in range(N_REGRESSED)]
    improved = [Flip("q900", "text 900", 0.0, 1.0), Flip("q901", "text 901", 0.2, 0.5)]
    return Comparison(
        baseline="baseline", variants=["v"], metrics=["recall_at_5"], splits=["dev"], B=100, seed=0,
        alpha=0.05, rows=[],
        flips={"v": {"recall_at_5": {"dev": {"regressed": regressed, "improved": improved}}}},
    )  # fmt: skip


def test_the_largest_changes_are_kept_and_every_flip_counted() -> None:
    c = _comparison()
    c.cap_flips()
    kept = c.flips["v"]["recall_at_5"]["dev"]
    assert [f.query_id for f in kept["regressed"]] == [f"q{i:03d}" for i in range(N_REGRESSED - 1, 69, -1)]
    assert [f.query_id for f in kept["improved"]] == ["q900", "q901"]  # a short list stays as it was
    assert c.n_flips("v", "recall_at_5", "dev", "regressed") == N_REGRESSED
    assert c.n_flips("v", "recall_at_5", "dev", "improved") == 2
    assert c.flip_counts == {"v": {"recall_at_5": {"dev": {"regressed": N_REGRESSED}}}}
    back = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back.flips == c.flips and back.flip_counts == c.flip_counts
    assert back.n_flips("v", "recall_at_5", "dev", "regressed") == N_REGRESSED


def test_the_comparison_cuts_its_flips_as_cap_flips_does_before_building_them() -> None:
    """``plan_compare(keep_flips=...)`` keeps the same flips, in the same order, and counts the same
    lists as :meth:`Comparison.cap_flips` on every flip: ties of a binary metric (every change is 1)
    go to the smaller query ids, a short list keeps its query order."""
    rng = np.random.default_rng(3)
    n = 400
    base_hit, var_hit = rng.random(n) < 0.5, rng.random(n) < 0.5
    base_rec, var_rec = rng.random(n), rng.random(n)
    var_rec[:5] = base_rec[:5] - 0.5  # 5 regressed by the same size: ties broken by query id

    def records(hit: np.ndarray, recall: np.ndarray) -> list[dict[str, Any]]:
        ids = rng.permutation(n)  # records in no particular order of their ids
        return [
            _record(
                int(i), "dev", {"hit_at_5": float(hit[i]), "recall_at_5": float(recall[i])}, query=f"t{i}"
            )
            for i in ids
        ]

    variants = [
        VariantData("baseline", records(base_hit, base_rec)),
        VariantData("v", records(var_hit, var_rec)),
    ]
    whole = compare(variants, metrics=["hit_at_5", "recall_at_5"], splits=["dev"], B=100)
    whole.cap_flips(keep=7)
    draws = SharedDraws(100)
    cut = plan_compare(
        variants, metrics=["hit_at_5", "recall_at_5"], splits=["dev"], keep_flips=7, draws=draws
    )
    draws.run()
    c = cut()
    assert c.flips == whole.flips and c.flip_counts == whole.flip_counts
    assert c.n_flips("v", "hit_at_5", "dev", "improved") == int(np.sum(~base_hit & var_hit)) > 7
    kept = c.flips["v"]["hit_at_5"]["dev"]["improved"]
    assert len(kept) == 7 and [f.query_id for f in kept] == sorted(f.query_id for f in kept)


def test_every_view_prints_the_count_of_flips_not_what_was_kept() -> None:
    c = _comparison()
    c.cap_flips()
    assert f"per-query flips of v on recall@5: dev: 2 improved, {N_REGRESSED} regressed" in format_terminal(c)
    md = format_markdown(c)
    assert f"### v · recall@5 · dev: 2 improved, {N_REGRESSED} regressed" in md
    assert f"- ... {N_REGRESSED - 10} more regressed (comparison.json has the {FLIPS_KEPT} largest" in md
    assert "- regressed: `q119` 1.000 -> 0.880" in md  # the largest change first
    page = html_report.render(
        title="t", variants=[VariantData("baseline", []), VariantData("v", [])], comparison=c, plan=None,
        tradeoff_png=None, recall_png=None,
    )  # fmt: skip
    assert f"v: dev, {N_REGRESSED} regressed (top 10 of {N_REGRESSED})" in page
    assert f"comparison.json: the {FLIPS_KEPT} largest of each" in page


def _record(i: int, split: str, metrics: dict[str, float | None], **kw: Any) -> dict[str, Any]:
    return {"query_id": f"q{i}", "split": split, "group": f"g{i}", "status": "ok", "metrics": metrics, **kw}


def test_recall_curves_and_intents_count_what_each_record_has() -> None:
    """The report's one pass over the records: a recall@k first seen late, a None value, a failed
    query and another split's are counted as the plain means over the records with a value."""
    base = [
        _record(0, "dev", {"recall_at_5": 1.0, "mrr_at_5": 1.0}, intent_gold="a", intent_pred="a"),
        _record(1, "dev", {"recall_at_5": 0.5, "recall_at_1": None}, intent_gold="a", intent_pred="b"),
        _record(2, "dev", {"recall_at_1": 1.0, "recall_at_10": 0.25}, intent_gold="b", intent_pred="b"),
        _record(3, "dev", {"recall_at_5": 0.0}, intent_gold="b", intent_pred=None, status="error"),
        _record(4, "test", {"recall_at_5": 0.0}, intent_gold="b", intent_pred="c"),
    ]
    other = [_record(0, "dev", {"recall_at_10": 0.75}, intent_gold="b", intent_pred="b")]
    variants = [VariantData("baseline", base), VariantData("v", other)]
    curves = html_report.recall_curves(variants, ["dev", "holdout"])
    assert curves == {"dev": {"baseline": [(1, 1.0), (5, 0.75), (10, 0.25)], "v": [(10, 0.75)]}}
    order, table = html_report.intent_accuracy(variants)
    assert order == ["a", "b"]  # the worst first: a 0.5 (baseline only), b 0.75 on average
    assert table == {"a": {"baseline": (2, 0.5)}, "b": {"baseline": (2, 0.5), "v": (1, 1.0)}}


def test_records_read_for_a_comparison_share_their_field_names(tmp_path: Path) -> None:
    """100,000 records hold each field and metric name once, not once per record."""
    job = tmp_path / "s" / "0"
    job.mkdir(parents=True)
    (job / VARIANT_FILE).write_text(json.dumps({"label": "baseline", "job_num": 0}))
    recs = [_record(i, "dev", {"recall_at_5": 1.0}, retrieved=[{"doc_id": "d"}]) for i in range(3)]
    lines = [json.dumps(r) for r in recs]
    (job / RECORDS_FILE).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    (v,) = load_sweep_dir(tmp_path / "s")
    first, *rest = v.records
    for r in rest:
        assert [id(k) for k in r] == [id(k) for k in first]
        assert [id(k) for k in r["metrics"]] == [id(k) for k in first["metrics"]]
        assert len(r["retrieved"]) == 1 and r["metrics"] == {"recall_at_5": 1.0}


def test_records_read_for_a_comparison_share_equal_numbers_and_keep_them_exact(tmp_path: Path) -> None:
    """Equal metric values are one float object (a third of a record's size at 100,000 queries);
    -0.0 keeps its sign, an int stays an int, a NaN stays NaN, and nothing else changes."""
    job = tmp_path / "s" / "0"
    job.mkdir(parents=True)
    (job / VARIANT_FILE).write_text(json.dumps({"label": "baseline", "job_num": 0}))
    metrics = [
        {"recall_at_5": 1 / 3, "mrr_at_5": 0.0, "hit_at_5": 1.0, "n": 1, "d": -0.0, "x": float("nan")},
        {"recall_at_5": 1 / 3, "mrr_at_5": 0.0, "hit_at_5": 1.0, "n": 1, "d": 0.0, "x": None},
    ]
    recs = [_record(i, "dev", m, timings_ms={"total": 2.5}) for i, m in enumerate(metrics)]
    (job / RECORDS_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    (v,) = load_sweep_dir(tmp_path / "s")
    a, b = (r["metrics"] for r in v.records)
    for k in ("recall_at_5", "mrr_at_5", "hit_at_5"):
        assert a[k] is b[k] and a[k] == metrics[0][k]
    assert v.records[0]["timings_ms"]["total"] is v.records[1]["timings_ms"]["total"]
    assert str(a["d"]) == "-0.0" and str(b["d"]) == "0.0" and type(a["n"]) is int and a["x"] != a["x"]
    assert json.dumps(a) == json.dumps(metrics[0]) and json.dumps(b) == json.dumps(metrics[1])


def test_the_pairing_counted_from_failure_masks_equals_the_count_over_the_records() -> None:
    """The split's Pair (who failed where, who has no record, the median time of the failures) counted
    from the comparison's failure masks equals the count over every record, failures, missing records
    and the variant's own queries included."""
    rng = np.random.default_rng(5)

    def rec(i: int) -> dict[str, Any]:
        bad = rng.random() < 0.2
        return _record(i, "dev", {"latency_ms": float(rng.integers(1, 100))}, status="error" if bad else "ok")

    base = {f"q{i}": rec(i) for i in range(300) if rng.random() < 0.9}
    var = {f"q{i}": rec(i) for i in range(320) if rng.random() < 0.9}  # 20 queries of its own
    b_failed = np.array([failed(r) for r in base.values()])
    v_failed = np.array([q in var and failed(var[q]) for q in base])
    in_var = np.array([q in var for q in base])
    var_only = [r for q, r in var.items() if q not in base]
    got = _pair("dev", "v", base, var, var_only, in_var, b_failed, v_failed)
    ids = list(base) + [q for q in var if q not in base]
    kinds = [
        "none" if q not in base or q not in var
        else "both" if failed(base[q]) and failed(var[q])
        else "base" if failed(base[q])
        else "var" if failed(var[q])
        else "ok"
        for q in ids
    ]  # fmt: skip
    assert (got.n_queries, got.left_no_record, got.left_failed_both) == (
        len(ids),
        kinds.count("none"),
        kinds.count("both"),
    )
    assert (got.left_failed_baseline, got.left_failed_variant, got.n_ok_both) == (
        kinds.count("base"),
        kinds.count("var"),
        kinds.count("ok"),
    )
    assert got.n_failed_baseline == sum(failed(r) for r in base.values()) > 0
    assert got.n_failed_variant == sum(failed(r) for r in var.values()) > 0
    assert got.failed_latency_ms_variant == float(
        np.median([r["metrics"]["latency_ms"] for r in var.values() if failed(r)])
    )
    assert got.failed_latency_ms_baseline == float(
        np.median([r["metrics"]["latency_ms"] for r in base.values() if failed(r)])
    )
