"""Evidence labels checked against the current corpus (rag_ablate.dataset.labels, ``validate --fix``).

Each test edits the tiny dataset's corpus the way documents really change (a
sentence inserted before the quoted one, the quoted sentence rewritten, a phrase
repeated) and checks what the loader, ``rag-ablate validate`` and ``--fix`` do:
relocated labels get their new offsets and a fixed copy validates; stale and
ambiguous ones are reported with file and line and make ``validate`` fail. The
importers' quotes are checked against the spans they point at.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.cli.main import main
from rag_ablate.dataset.importers.common import IMPORTERS, import_dataset
from rag_ablate.dataset.labels import check_dataset_labels, fix_queries, label_params, locate_quote
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError, LabelReport
from tests.conftest import DOCS, QUERIES, run_module, shared_path, write_dataset
from tests.test_importers import _SOURCES

Q1_QUOTE = "You can return most items within 30 days of delivery."  # RET, q1 (line 1)
Q3_QUOTE = "Express shipping arrives the next day when ordered before noon."  # SHIP, q3 (line 3)
INSERTED = "Holiday purchases get extra time. "


def _docs() -> list[dict[str, Any]]:
    return copy.deepcopy(DOCS)


def _quoted_queries() -> list[dict[str, Any]]:
    """The tiny dataset's queries with every evidence span carrying its quote."""
    texts = {d["doc_id"]: d["text"] for d in DOCS}
    qs = copy.deepcopy(QUERIES)
    for q in qs:
        for e in q.get("evidence", []):
            e["quote"] = texts[e["doc_id"]][e["start"] : e["end"]]
    return qs


def _doc(docs: list[dict[str, Any]], doc_id: str) -> dict[str, Any]:
    return next(d for d in docs if d["doc_id"] == doc_id)


def _write(tmp_path: Path, docs: list[dict[str, Any]], name: str = "ds") -> Path:
    return write_dataset(tmp_path / name, docs=docs, queries=_quoted_queries())


def _moved(tmp_path: Path) -> Path:
    """RET gains a sentence in front: q1's quote moves right by len(INSERTED)."""
    docs = _docs()
    _doc(docs, "RET")["text"] = INSERTED + _doc(docs, "RET")["text"]
    return _write(tmp_path, docs)


def _deleted(tmp_path: Path) -> Path:
    """SHIP's express sentence is rewritten: q3's quote is gone."""
    docs = _docs()
    ship = _doc(docs, "SHIP")
    ship["text"] = ship["text"].replace(Q3_QUOTE, "Express orders placed before noon arrive the next day.")
    return _write(tmp_path, docs)


# --------------------------------------------------------------------------- one label


def test_locate_quote_rules() -> None:
    text = "abc def abc xyz"
    assert locate_quote(text, 4, 7, "def") == ("ok", 4, 7, [])
    assert locate_quote(text, 0, 3, "xyz") == ("relocated", 12, 15, [12])
    assert locate_quote(text, 0, 3, "nope") == ("stale", 0, 3, [])
    status, start, end, matches = locate_quote(text, 4, 7, "abc")
    assert (status, start, end, matches) == ("ambiguous", 4, 7, [0, 8])
    # at its offsets it is fine even though it occurs twice
    assert locate_quote(text, 8, 11, "abc")[0] == "ok"
    # offsets beyond a shortened document are relocated, not an error
    assert locate_quote("xyz", 40, 43, "xyz") == ("relocated", 0, 3, [0])
    # overlapping occurrences count: "aa" occurs twice in "aaa"
    assert locate_quote("aaa", 5, 7, "aa")[0] == "ambiguous"


# --------------------------------------------------------------------------- the loader


def test_untouched_corpus_checks_every_quote(tmp_path: Path) -> None:
    ds = load_dataset(_write(tmp_path, _docs()))
    assert ds.labels == LabelReport(checked=4, issues=())
    assert all(e.quote is not None for q in ds.queries for e in q.evidence)
    assert label_params(ds.labels) == {
        "dataset.labels_checked": 4,
        "dataset.labels_relocated": 0,
        "dataset.labels_stale": 0,
        "dataset.labels_ambiguous": 0,
    }


def test_moved_quote_is_relocated_at_load(tmp_path: Path) -> None:
    ds = load_dataset(_moved(tmp_path))
    (check,) = ds.labels.issues
    start = len(INSERTED)
    assert (check.query_id, check.line, check.field, check.status) == ("q1", 1, "evidence[0]", "relocated")
    assert (check.start, check.new_start, check.new_end) == (0, start, start + len(Q1_QUOTE))
    q1 = next(q for q in ds.queries if q.query_id == "q1")
    (span,) = q1.evidence
    assert ds.documents["RET"].text[span.start : span.end] == Q1_QUOTE  # the run scores the new place
    assert ds.summary()["labels_relocated"] == 1
    assert label_params(ds.labels)["dataset.labels_relocated"] == 1


def test_deleted_quote_is_stale_and_left_out(tmp_path: Path) -> None:
    ds = load_dataset(_deleted(tmp_path))
    (check,) = ds.labels.issues
    assert (check.query_id, check.line, check.status) == ("q3", 3, "stale")
    q3 = next(q for q in ds.queries if q.query_id == "q3")
    assert q3.evidence == ()  # the old offsets point at other text now: not scored
    assert label_params(ds.labels)["dataset.labels_stale"] == 1


def test_quote_field_rules(tmp_path: Path) -> None:
    for value, field in ((3, "evidence[0].quote"), ("", "evidence[0].quote")):
        qs = _quoted_queries()
        qs[0]["evidence"][0]["quote"] = value
        with pytest.raises(DatasetValidationError) as info:
            load_dataset(write_dataset(tmp_path / f"bad{value!r}", queries=qs))
        err = info.value.errors[0]
        assert (err.file, err.line, err.field) == ("queries.jsonl", 1, field)
    qs = _quoted_queries()
    qs[0]["evidence"][0]["page"] = 3
    with pytest.raises(DatasetValidationError, match="optionally quote"):
        load_dataset(write_dataset(tmp_path / "extra", queries=qs))
    # without a quote, offsets beyond the text stay an error as before
    qs = copy.deepcopy(QUERIES)
    qs[0]["evidence"][0]["end"] = 10_000
    with pytest.raises(DatasetValidationError, match="len\\(text\\)"):
        load_dataset(write_dataset(tmp_path / "range", queries=qs))


# --------------------------------------------------------------------------- rag-ablate validate


def test_validate_reports_a_moved_quote_and_fix_writes_new_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _moved(tmp_path)
    assert main(["validate", str(folder)]) == 0  # relocated labels are repaired, not errors
    out = capsys.readouterr().out
    start = len(INSERTED)
    assert "evidence quotes  4 checked: 3 at their offsets, 1 relocated, 0 stale, 0 ambiguous" in out
    shown = repr(Q1_QUOTE[:47] + "...")  # long quotes are shortened in messages
    assert f"queries.jsonl:1: field 'evidence[0]': relocated: q1: quote {shown} of doc 'RET'" in out
    assert f"'RET' [0, {len(Q1_QUOTE)}) -> [{start}, {start + len(Q1_QUOTE)})" in out

    fixed = tmp_path / "fixed"
    fixed.mkdir()
    shutil.copy(folder / "corpus.jsonl", fixed / "corpus.jsonl")
    shutil.copy(folder / "intents.jsonl", fixed / "intents.jsonl")
    assert main(["validate", str(folder), "--fix", str(fixed)]) == 0  # a folder: fixed/queries.jsonl
    assert f"written {fixed / 'queries.jsonl'}: 1 label(s) relocated" in capsys.readouterr().out

    before = (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    after = (fixed / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    assert before[1:] == after[1:]  # every other line byte for byte
    q1 = json.loads(after[0])
    assert q1["evidence"] == [
        {"doc_id": "RET", "start": start, "end": start + len(Q1_QUOTE), "quote": Q1_QUOTE}
    ]
    assert {k: v for k, v in q1.items() if k != "evidence"} == {
        k: v for k, v in json.loads(before[0]).items() if k != "evidence"
    }
    # the fixed copy validates with every quote at its offsets
    ds = load_dataset(fixed)
    assert ds.labels == LabelReport(checked=4, issues=())
    assert main(["validate", str(fixed)]) == 0
    assert "4 checked: 4 at their offsets, 0 relocated" in capsys.readouterr().out


def test_fix_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _moved(tmp_path)
    queries = folder / "queries.jsonl"
    assert main(["validate", str(folder), "--fix", str(queries)]) == 0
    assert load_dataset(folder).labels.issues == ()
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.jsonl", "intents.jsonl", "queries.jsonl"]


def test_validate_fails_on_a_deleted_quote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _deleted(tmp_path)
    assert main(["validate", str(folder)]) == 1
    captured = capsys.readouterr()
    assert "1 relocated" not in captured.out and "0 relocated, 1 stale, 0 ambiguous" in captured.out
    assert "queries.jsonl:3: field 'evidence[0]': stale: q3: quote " in captured.out
    assert "no longer occurs in the document; the label is not used" in captured.out
    assert "OK: the dataset follows the contract" not in captured.out
    assert "NOT OK: 1 evidence label(s) stale or ambiguous" in captured.err
    # --fix cannot repair it: the copy keeps it as written and validate still fails
    out = tmp_path / "fixed.jsonl"
    assert main(["validate", str(folder), "--fix", str(out)]) == 1
    assert "1 stale or ambiguous label(s) left as written" in capsys.readouterr().out
    assert out.read_bytes() == (folder / "queries.jsonl").read_bytes()


def test_stale_quote_found_in_another_document_is_named_not_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _docs()
    ship, warr = _doc(docs, "SHIP"), _doc(docs, "WARR")
    ship["text"] = ship["text"].replace(Q3_QUOTE, "Express orders arrive the next day.")
    warr["text"] += " " + Q3_QUOTE  # the sentence moved to another document
    folder = _write(tmp_path, docs)
    ds = load_dataset(folder)
    (check,) = check_dataset_labels(ds).issues
    assert check.status == "stale"
    assert check.elsewhere == (("WARR", len(_doc(DOCS, "WARR")["text"]) + 1),)
    assert main(["validate", str(folder)]) == 1
    assert "it occurs in 'WARR' at" in capsys.readouterr().out
    assert next(q for q in ds.queries if q.query_id == "q3").evidence == ()


def test_ambiguous_quote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs()
    ret = _doc(docs, "RET")
    # the quoted sentence now appears twice, and no longer at its old offsets
    ret["text"] = "Note. " + Q1_QUOTE + " " + ret["text"]
    folder = _write(tmp_path, docs)
    ds = load_dataset(folder)
    (check,) = check_dataset_labels(ds).issues
    first = len("Note. ")
    second = first + len(Q1_QUOTE) + 1  # the original first sentence
    assert (check.status, check.n_matches, check.matches) == ("ambiguous", 2, (first, second))
    assert next(q for q in ds.queries if q.query_id == "q1").evidence == ()
    assert main(["validate", str(folder), "--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["labels_ambiguous"] == 1 and summary["labels_checked"] == 4
    (issue,) = summary["label_issues"]
    assert (issue["line"], issue["field"], issue["status"]) == (1, "evidence[0]", "ambiguous")
    assert f"occurs 2 times in the document (at {first}, {second})" in issue["message"]


def test_fix_queries_keeps_blank_lines_and_line_numbers(tmp_path: Path) -> None:
    folder = _moved(tmp_path)
    src = folder / "queries.jsonl"
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    src.write_text("\n" + "".join(lines), encoding="utf-8")  # q1 is now on line 2
    ds = load_dataset(folder)
    (check,) = ds.labels.issues
    assert check.line == 2
    out = tmp_path / "out.jsonl"
    assert fix_queries(src, out, ds.labels.issues) == 1
    fixed = out.read_text(encoding="utf-8").splitlines()
    assert fixed[0] == "" and json.loads(fixed[1])["evidence"][0]["start"] == len(INSERTED)


# --------------------------------------------------------------------------- importers write quotes


def _quotes_match(folder: Path) -> int:
    """Every evidence entry written has a quote equal to the corpus at its offsets; returns the count."""
    texts = {
        d["doc_id"]: d["text"]
        for d in map(json.loads, (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines())
    }
    n = 0
    for line in (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines():
        for e in json.loads(line).get("evidence", []):
            assert e["quote"] == texts[e["doc_id"]][e["start"] : e["end"]], e
            n += 1
    ds = load_dataset(folder)
    assert ds.labels == LabelReport(checked=n, issues=())
    return n


@pytest.mark.parametrize("fmt", IMPORTERS.names())
def test_importers_write_quotes_equal_to_the_corpus(tmp_path: Path, fmt: str) -> None:
    src = _SOURCES[fmt](tmp_path / "src")
    import_dataset(fmt, src, tmp_path / "out")
    n = _quotes_match(tmp_path / "out")
    assert n > 0 if fmt in ("squad", "clapnq") else n == 0  # BEIR has judgements, no spans


def test_article_unit_quotes_follow_shifted_offsets(tmp_path: Path) -> None:
    src = _SOURCES["squad"](tmp_path / "src")
    import_dataset("squad", src, tmp_path / "out", doc_unit="article")
    assert _quotes_match(tmp_path / "out") > 0


def test_covid_qa_quotes(tmp_path: Path) -> None:
    src = shared_path("data", "covid-qa", "200423_covidQA.json")
    import_dataset("squad", src, tmp_path / "covid")
    assert _quotes_match(tmp_path / "covid") == sum(
        len(q.evidence) for q in load_dataset(tmp_path / "covid").queries
    )


# --------------------------------------------------------------------------- a run records the counts


@pytest.mark.slow
def test_a_run_logs_relocated_and_stale_counts(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    docs = _docs()
    _doc(docs, "RET")["text"] = INSERTED + _doc(docs, "RET")["text"]  # q1 moves
    ship = _doc(docs, "SHIP")
    ship["text"] = ship["text"].replace(Q3_QUOTE, "Express orders arrive the next day.")  # q3 is gone
    folder = _write(tmp_path, docs)
    proc = run_module("rag_ablate", [f"dataset.path={folder}", "progress=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 relocated, 1 stale and 0 ambiguous (left out)" in proc.stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rag_ablate")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    params = {k: v for k, v in run.data.params.items() if k.startswith("dataset.labels_")}
    assert params == {
        "dataset.labels_checked": "4",
        "dataset.labels_relocated": "1",
        "dataset.labels_stale": "1",
        "dataset.labels_ambiguous": "0",
    }
    # the run scored q1's evidence at its new place and left q3's out
    lines = next((tmp_path / "outputs").rglob("records.jsonl")).read_text(encoding="utf-8").splitlines()
    records = {r["query_id"]: r for r in map(json.loads, lines)}
    assert "evidence_recall_at_5" in records["q1"]["metrics"]
    assert "evidence_recall_at_5" not in records["q3"]["metrics"]


def test_clapnq_dev_quotes(tmp_path: Path) -> None:
    src = shared_path("data", "clapnq-dev")
    import_dataset("clapnq", src, tmp_path / "clapnq")
    ds = load_dataset(tmp_path / "clapnq")
    # 299 answerable questions with located selected sentences, one span per sentence
    assert sum(1 for q in ds.queries if q.evidence) == 299
    assert _quotes_match(tmp_path / "clapnq") == sum(len(q.evidence) for q in ds.queries) == 893
