"""RAGChecker's meta-evaluation set: the ``ragchecker-meta`` importer, the pairwise items of
``human_judgements`` ({answers, preference, rater}) and the agreement figures of
benchmarks/bench_judge_agreement.py. Synthetic instances written here, then the real file from
../shared/data/ragchecker-meta with exact counts."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.dataset.importers.common import import_dataset
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError
from tests.conftest import shared_path


def _entry(iid: int, labels: tuple[int, int, int], **over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "instance_id": iid,
        "dataset": "kiwi",
        "query_id": str(100 + iid),
        "query": f"How does method {iid} work?",
        "gt_answer": f"Method {iid} works by counting.",
        "model1": {"model_name": "bm25_llama3_8b", "response": f"It counts ({iid}).", "critiques": "-"},
        "model2": {
            "model_name": "e5_mistral_gpt_4",
            "response": f"By counting things ({iid}).",
            "critiques": "-",
        },
        "correctness_label": labels[0],
        "completeness_label": labels[1],
        "overall_label": labels[2],
    }
    e.update(over)
    return e


def ragchecker_source(root: Path) -> Path:
    """Five instances, two entries each, with the odd cases: an empty response, the same text on
    both sides, a label out of range, an entry whose texts differ, an instance without reference."""
    entries = [
        _entry(0, (1, 1, 1)),
        _entry(0, (0, 2, 1)),
        _entry(2, (2, 2, 2), model1={"model_name": "a", "response": ""}),
        _entry(2, (1, 2, 2), model1={"model_name": "a", "response": ""}),
        _entry(4, (0, 0, 0), model2={"model_name": "b", "response": "It counts (4)."}),
        _entry(4, (0, 0, 3), model2={"model_name": "b", "response": "It counts (4)."}),  # label 3
        _entry(6, (-1, -2, -1)),
        _entry(6, (-1, -1, -1), query="another question"),  # texts differ from the first entry
        _entry(8, (0, 0, 0), gt_answer=" "),  # no reference answer
        _entry(8, (0, 0, 0), gt_answer=" "),
        "not an object",
    ]
    root.mkdir(parents=True)
    (root / "human_labeled_data.json").write_text(json.dumps(entries), encoding="utf-8")
    return root


def test_import_maps_instances_to_queries_with_pairwise_human_judgements(tmp_path: Path) -> None:
    report = import_dataset("ragchecker-meta", ragchecker_source(tmp_path / "src"), tmp_path / "out")
    assert (report.documents, report.queries, report.answerable) == (4, 4, 4)
    skipped = dict(report.skipped)
    assert set(skipped) == {"human_labeled_data.json[10]", "rcm-4/annotator2", "rcm-6/annotator2", "rcm-8"}
    assert "'overall_label' must be an integer -2..2, got 3" in skipped["rcm-4/annotator2"]
    assert "texts differ" in skipped["rcm-6/annotator2"]
    assert "gt_answer" in skipped["rcm-8"]
    assert report.mapped == {
        "instances with an empty response (kept as an empty answer)": 1,
        "instances whose two responses are the same text": 1,
    }

    rows = {
        r["query_id"]: r
        for r in map(
            json.loads, (tmp_path / "out" / "queries.jsonl").read_text(encoding="utf-8").splitlines()
        )
    }
    q0 = rows["rcm-0"]
    assert q0["query"] == "How does method 0 work?"
    assert q0["relevant"] == {"rcm-0-reference": 1}
    assert q0["reference_answer"] == ["Method 0 works by counting."]
    assert q0["tags"] == ["ragchecker-meta", "kiwi"]
    assert q0["metadata"] == {
        "source": "ragchecker-meta",
        "instance_id": 0,
        "dataset": "kiwi",
        "query_id": "100",
        "systems": ["bm25_llama3_8b", "e5_mistral_gpt_4"],
    }
    assert q0["human_judgements"] == [
        {
            "answers": ["It counts (0).", "By counting things (0)."],
            "preference": {"correctness": 1, "completeness": 1, "overall": 1},
            "rater": "annotator1",
        },
        {
            "answers": ["It counts (0).", "By counting things (0)."],
            "preference": {"correctness": 0, "completeness": 2, "overall": 1},
            "rater": "annotator2",
        },
    ]
    assert [j["rater"] for j in rows["rcm-4"]["human_judgements"]] == ["annotator1"]
    assert [j["rater"] for j in rows["rcm-6"]["human_judgements"]] == ["annotator1"]

    ds = load_dataset(tmp_path / "out")
    by_id = {q.query_id: q for q in ds.queries}
    empty = by_id["rcm-2"].human_preferences
    assert [p.answers for p in empty] == [("", "By counting things (2).")] * 2
    assert [dict(p.preference) for p in empty] == [
        {"correctness": 2, "completeness": 2, "overall": 2},
        {"correctness": 1, "completeness": 2, "overall": 2},
    ]
    assert by_id["rcm-2"].human_judgements == ()  # the 0-5 items stay apart
    assert ds.summary()["human_preferences"] == 6
    assert ds.documents["rcm-0-reference"].text == "Method 0 works by counting."


@pytest.mark.parametrize(
    ("item", "field", "says"),
    [
        (
            {"answers": ["a"], "preference": {"overall": 1}},
            "human_judgements[0].answers",
            "list of 2 strings",
        ),
        (
            {"answers": ["a", "b"], "preference": {"overall": 3}},
            "human_judgements[0].preference.overall",
            "-2..2",
        ),
        (
            {"answers": ["a", "b"], "preference": {"overall": 1.0}},
            "human_judgements[0].preference.overall",
            "-2..2",
        ),
        (
            {"answers": ["a", "b"], "preference": {"overall": True}},
            "human_judgements[0].preference.overall",
            "-2..2",
        ),
        ({"answers": ["a", "b"], "preference": {}}, "human_judgements[0].preference", "non-empty object"),
        (
            {"answers": ["a", "b"], "preference": {"Overall": 1}},
            "human_judgements[0].preference.Overall",
            "aspect",
        ),
        (
            {"answers": ["a", "b"], "preference": {"overall": 1}, "who": "x"},
            "human_judgements[0].who",
            "unknown field",
        ),
        (
            {"answers": ["a", "b"], "preference": {"overall": 1}, "rater": 7},
            "human_judgements[0].rater",
            "string",
        ),
    ],
)
def test_bad_preference_items_are_refused_with_their_field(
    tmp_path: Path, item: dict[str, Any], field: str, says: str
) -> None:
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"doc_id": "d", "text": "t"}) + "\n", encoding="utf-8")
    q = {"query_id": "q1", "query": "why?", "relevant": {"d": 1}, "human_judgements": [item]}
    (tmp_path / "queries.jsonl").write_text(json.dumps(q) + "\n", encoding="utf-8")
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(tmp_path)
    errors = [e for e in info.value.errors if e.field == field]
    assert len(errors) == 1 and says in str(errors[0]) and errors[0].line == 1, info.value.errors


def test_real_ragchecker_meta(tmp_path: Path) -> None:
    src = shared_path("data", "ragchecker-meta")
    raw = json.loads((src / "human_labeled_even.json").read_text(encoding="utf-8"))
    report = import_dataset("ragchecker-meta", src, tmp_path / "rcm")
    assert (report.documents, report.queries, report.skipped) == (140, 140, [])
    assert report.mapped == {
        "instances with an empty response (kept as an empty answer)": 5,
        "instances whose two responses are the same text": 3,
    }
    ds = load_dataset(tmp_path / "rcm")
    prefs = [p for q in ds.queries for p in q.human_preferences]
    assert len(prefs) == 280 and Counter(p.rater for p in prefs) == {"annotator1": 140, "annotator2": 140}
    assert Counter(p.preference["correctness"] for p in prefs) == {0: 103, -1: 69, 1: 56, -2: 32, 2: 20}
    assert Counter(p.preference["overall"] for p in prefs) == {-1: 85, 0: 72, 1: 67, -2: 32, 2: 24}
    # every label lands on its own instance and annotator, in the source's order
    by_id = {q.query_id: q for q in ds.queries}
    for i, e in enumerate(raw):
        p = by_id[f"rcm-{e['instance_id']}"].human_preferences[i % 2]
        assert p.rater == f"annotator{i % 2 + 1}"
        assert p.answers == (e["model1"]["response"], e["model2"]["response"])
        assert dict(p.preference) == {a: e[f"{a}_label"] for a in ("correctness", "completeness", "overall")}
    assert Counter(q.tags[1] for q in ds.queries) == {d: 14 for d in {e["dataset"] for e in raw}}
    assert ds.summary()["human_preferences"] == 280


# --------------------------------------------------------------------------- the agreement benchmark


def test_agreement_figures_follow_upstreams_normalisation() -> None:
    from benchmarks import bench_judge_agreement as bja

    assert bja.votes(["b", "b"]) == 2 and bja.votes(["a", "tie"]) == -1 and bja.votes(["a", "b"]) == 0
    assert math.isnan(bja.votes(["b", None])) and math.isnan(bja.votes([]))
    # NaN -> median, then linear onto [-2, 2]
    assert bja.normalise([0, 1, math.nan, 2, 2]).tolist() == [-2.0, 0.0, 1.0, 2.0, 2.0]  # median 1.5
    assert bja.normalise([1, 1]).tolist() == [1.0, 1.0]
    judge = [2, 1, 0, -1, -2, 0]
    human = {"overall": [[2, 1], [1, 2], [0, 0], [-1, -2], [-2, -1], [1]]}
    got = bja.agreement(judge, human)["overall"]
    assert got["annotator1"] == {
        "pearson": 96.1,
        "spearman": 95.6,
        "n": 6,
    }
    assert got["annotator2"]["n"] == 5 and got["pooled"]["n"] == 11
    assert got["human_human"] == {"pearson": 80.0, "spearman": 80.0, "n": 5}
    assert math.isnan(bja.correlation([0, 0, 0], [1, 2, 3])["pearson"])  # a judge that always ties
    assert bja.pick(list(range(140)), 20)[:3] == [0, 7, 14] and len(bja.pick(list(range(140)), 0)) == 140


def test_agreement_benchmark_judges_both_orders_against_a_real_server(tmp_path: Path, fake_llm: Any) -> None:
    """A judge that always picks the answer shown first: every asked instance flips with the order."""
    from benchmarks import bench_judge_agreement as bja

    import_dataset("ragchecker-meta", ragchecker_source(tmp_path / "src"), tmp_path / "ds")
    ds = load_dataset(tmp_path / "ds")
    fake_llm.respond = lambda body, call: '{"winner": "1"}'
    settings = bja._settings([f"judge.base_url={fake_llm.url}", "judge.model=m"])
    rows, prompt_hash = bja.judge_all(settings, tmp_path / "cache", ds, ds.queries)
    assert [r["identical"] for r in rows] == [False, False, True, False]  # rcm-4: the same text twice
    asked = [r for r in rows if not r["identical"]]
    assert [r["verdicts"] for r in asked] == [["a", "b"]] * 3 and [r["score"] for r in rows] == [0.0] * 4
    prompts = [b["messages"][-1]["content"] for b in fake_llm.bodies()]
    assert len(prompts) == 6 and all("bm25_llama3_8b" not in p and "e5_mistral" not in p for p in prompts)
    assert prompts[0].index("It counts (0).") < prompts[0].index("By counting things (0).")  # model1 first
    assert prompts[1].index("By counting things (0).") < prompts[1].index("It counts (0).")  # then swapped
    bias = bja.position_bias(rows)
    assert (bias["inconsistent"], bias["identical"], bias["first_position_share"]) == (3, 1, 1.0)
    assert bias["inconsistent_share_of_asked"] == 1.0 and prompt_hash
    assert math.isnan(
        bja.agreement([r["score"] for r in rows], bja.human_labels(ds.queries))["overall"]["pooled"][
            "pearson"
        ]
    )
