"""judged@k in the comparison: a variant that retrieves unlabelled passages is flagged in every view."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError
from rag_ablate.metrics.registry import MetricSpec
from rag_ablate.records.scoring import score_record
from rag_ablate.report.html import render
from rag_ablate.run.export import trec_qrels_lines
from tests.conftest import QUERIES, write_dataset

WARNING = "the variant retrieves unlabelled passages: its recall may be understated"


def _variant(label: str, judged: dict[str, list[float]]) -> VariantData:
    """12 dev queries, one group each, with these judged_at_k values (and recall_at_5 = 1)."""
    records: list[dict[str, Any]] = [
        {
            "query_id": f"q{i}",
            "query": f"question {i}",
            "split": "dev",
            "group": f"g{i}",
            "kind": "answerable",
            "status": "ok",
            "metrics": {"recall_at_5": 1.0, **{name: values[i] for name, values in judged.items()}},
        }
        for i in range(12)
    ]
    return VariantData(label, records)


def _compare(base: dict[str, list[float]], var: dict[str, list[float]]) -> Comparison:
    return compare([_variant("baseline", base), _variant("dense", var)], splits=["dev"], B=200, seed=0)


def test_a_judged_gap_over_the_threshold_is_a_note_in_every_view() -> None:
    base = {"judged_at_5": [0.4] * 12, "judged_at_10": [0.2] * 12}
    var = {"judged_at_5": [0.3] * 12, "judged_at_10": [0.15] * 12}  # gaps 0.10 and 0.05 (not over)
    c = _compare(base, var)
    (note,) = [n for n in c.notes if "judged" in n]
    assert note == (
        "split 'dev': judged@5 is 0.300 for dense and 0.400 for the baseline (12 queries): " + WARNING
    )
    assert f"note: {note}" in format_terminal(c)
    assert f"- {note}" in format_markdown(c)
    assert note in Comparison.from_dict(c.to_dict()).notes  # comparison.json
    html = render(title="t", variants=[], comparison=c, plan=None, tradeoff_png=None, recall_png=None)
    assert "the variant retrieves unlabelled passages" in html


def test_no_note_within_the_gap_and_the_lower_side_is_named() -> None:
    within = _compare({"judged_at_10": [0.2] * 12}, {"judged_at_10": [0.15] * 12})
    assert not [n for n in within.notes if "judged" in n]  # 0.05 is not more than 0.05
    higher = _compare({"judged_at_10": [0.1] * 12}, {"judged_at_10": [0.3] * 12})
    (note,) = [n for n in higher.notes if "judged" in n]
    assert note.endswith("the baseline retrieves unlabelled passages: its recall may be understated")


def test_the_gap_and_its_words_are_facts_of_the_metric() -> None:
    with pytest.raises(ValueError, match="go together"):
        MetricSpec("x", "higher", False, False, "d", warn_gap=0.1)
    with pytest.raises(ValueError, match="go together"):
        MetricSpec("x", "higher", False, False, "d", warn_gap=-1.0, warn_text="w")


# --------------------------------------------------------------------------- nonrelevant labels


def _queries_with(nonrelevant: list[str]) -> list[dict[str, Any]]:
    return [{**q, "nonrelevant": nonrelevant} if q["query_id"] == "q1" else q for q in QUERIES]


def test_nonrelevant_documents_are_judged_for_judged_and_bpref_and_in_qrels(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "d", queries=_queries_with(["SHIP", "FEES"])))
    q1 = next(q for q in ds.queries if q.query_id == "q1")
    assert q1.nonrelevant == ("SHIP", "FEES") and q1.relevant == {"RET": 2}
    chunk = {"chunk_id": "c", "start": 0, "end": 10, "score": 1.0, "rank": 1}
    rec = {
        "query_id": "q1", "split": q1.split, "kind": "answerable", "status": "ok", "timings_ms": {},
        "retrieved": [{**chunk, "doc_id": d} for d in ("WARR", "SHIP", "RET")],
    }  # fmt: skip
    values = score_record(rec, q1, ds.documents, [1, 3], routed=False)  # type: ignore[arg-type]
    # WARR unlabelled (skipped), SHIP judged non-relevant above RET: 1 - 1/min(2, 1)
    assert (values["judged_at_1"], values["judged_at_3"], values["bpref"]) == (0.0, 2 / 3, 0.0)
    assert values["precision_at_3"] == 1 / 3  # the relevant-only metrics do not read them
    assert "q1 0 SHIP 0" in trec_qrels_lines(ds) and "q1 0 RET 2" in trec_qrels_lines(ds)


@pytest.mark.parametrize(
    ("nonrelevant", "why"),
    [(["NOPE"], "'NOPE' is not in the corpus"), (["RET"], "'RET' is also in 'relevant'"), ("SHIP", "list")],
)
def test_bad_nonrelevant_labels_are_refused_with_the_line(tmp_path: Path, nonrelevant: Any, why: str) -> None:
    folder = write_dataset(tmp_path / "d", queries=_queries_with(nonrelevant))
    with pytest.raises(DatasetValidationError, match="nonrelevant") as info:
        load_dataset(folder)
    assert why in str(info.value) and "queries.jsonl:1" in str(info.value)
