"""Dataset importers (rag_ablate.dataset.importers): SQuAD-style JSON, BEIR folders, ClapNQ.

Every test imports a small hand-made source written into tmp_path, checks the
mapping of each edge case, and checks that the output folder passes
``load_dataset``. The SQuAD 2.0 layout variants found in the wild (string or
numeric ``is_impossible``, answers with empty text, yes/no answers,
``plausible_answers``) each have their own test, with the report's counts. The
last tests import the real COVID-QA and ClapNQ dev files from ../shared/data.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.cli.main import main
from rag_ablate.core.errors import ConfigError, DatasetError, UnknownNameError
from rag_ablate.dataset.importers.common import (
    IMPORTERS,
    Case,
    Importer,
    ImportReport,
    ImportRun,
    JsonlWriter,
    import_dataset,
)
from rag_ablate.dataset.importers.squad import (
    ANSWERS_IGNORED,
    EMPTY_ANSWER_UNANSWERABLE,
    IMPOSSIBLE_AS_NUMBER,
    IMPOSSIBLE_AS_STRING,
    PLAUSIBLE_IGNORED,
    YES_NO_ANSWERABLE,
)
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from tests.conftest import shared_path
from tests.test_ragchecker_meta import ragchecker_source

# --------------------------------------------------------------------------- helpers


def _write_json(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return path


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _queries(out: Path) -> dict[str, dict[str, Any]]:
    return {q["query_id"]: q for q in _rows(out / "queries.jsonl")}


def _docs(out: Path) -> dict[str, dict[str, Any]]:
    return {d["doc_id"]: d for d in _rows(out / "corpus.jsonl")}


def _span_texts(out: Path, query: dict[str, Any]) -> list[str]:
    docs = _docs(out)
    return [docs[e["doc_id"]]["text"][e["start"] : e["end"]] for e in query.get("evidence", [])]


def _valid(out: Path, report: ImportReport) -> Dataset:
    """The folder passes the contract and agrees with the report."""
    ds = load_dataset(out)
    assert len(ds.documents) == report.documents
    assert len(ds.queries) == report.queries == report.answerable + report.unanswerable
    assert sum(q.answerable for q in ds.queries) == report.answerable
    # split and (multi-member) group are explicit, so the tool assigns nothing itself
    assert ds.splits_assigned == 0
    assert report.splits == {s: sum(q.split == s for q in ds.queries) for s in ("dev", "holdout")}
    sizes: dict[str, int] = {}
    for q in ds.queries:
        sizes[q.group] = sizes.get(q.group, 0) + 1
    assert report.groups_multi == sum(1 for n in sizes.values() if n > 1)
    for row in _rows(out / "queries.jsonl"):
        assert "split" in row
        assert not any(k.startswith("intent_") for k in row)
        if "group" in row:
            assert sizes[row["group"]] > 1
    return ds


def _reasons(report: ImportReport, item: str) -> list[str]:
    return [reason for it, reason in report.skipped if it == item]


def _question_skips(report: ImportReport) -> int:
    """Skipped entries that stand for a whole question (not a dropped answer or sentence)."""
    return sum(
        1
        for _, reason in report.skipped
        if reason.startswith(("question skipped", "duplicate question id", "query skipped"))
    )


# --------------------------------------------------------------------------- squad

CTX0 = "The quick brown fox jumps over the lazy dog. The dog sleeps. The fox runs."
CTX2 = "Second paragraph about cats. Cats purr."


def _squad_source() -> dict[str, Any]:
    fox2 = CTX0.rindex("fox")
    return {
        "version": "v2.0",
        "data": [
            {
                "title": "Alpha",
                "paragraphs": [
                    {
                        "context": CTX0,
                        "qas": [
                            {
                                "id": "q1",
                                "question": " What jumps? ",
                                "answers": [{"text": "quick brown fox", "answer_start": 4}],
                            },
                            {  # stored offset 2 too far: relocated
                                "id": "q2",
                                "question": "Who is lazy?",
                                "answers": [{"text": "lazy dog", "answer_start": CTX0.index("lazy dog") + 2}],
                            },
                            {  # second answer is nowhere: dropped and reported, question kept
                                "id": "q3",
                                "question": "What does the dog do?",
                                "answers": [
                                    {"text": "The dog sleeps", "answer_start": CTX0.index("The dog sleeps")},
                                    {"text": "cat", "answer_start": 0},
                                ],
                            },
                            {  # the only answer is nowhere: question skipped
                                "id": "q4",
                                "question": "Which elephant?",
                                "answers": [{"text": "elephant", "answer_start": 3}],
                            },
                            {
                                "id": "q5",
                                "question": "Who won in 1999?",
                                "answers": [],
                                "is_impossible": True,
                            },
                            {  # duplicate id: the first q1 is kept
                                "id": "q1",
                                "question": "Another question entirely?",
                                "answers": [{"text": "dog", "answer_start": 40}],
                            },
                            {"id": "q6", "question": "  ", "answers": [{"text": "dog", "answer_start": 40}]},
                            {  # correct offset, whitespace around the answer: span trimmed, not relocated
                                "id": "q7",
                                "question": "Which sentence is about sleeping?",
                                "answers": [
                                    {
                                        "text": " The dog sleeps.",
                                        "answer_start": CTX0.index(" The dog sleeps."),
                                    }
                                ],
                            },
                            {  # "fox" twice: the occurrence nearest to the (wrong) stored offset wins
                                "id": "q8",
                                "question": "Which animal runs?",
                                "answers": [{"text": "fox", "answer_start": fox2 - 3}],
                            },
                            {  # found only once stripped of its (odd) whitespace
                                "id": "q9",
                                "question": "What is the fox jumping over?",
                                "answers": [{"text": "  over the lazy  ", "answer_start": 0}],
                            },
                        ],
                    },
                    {
                        "context": "",
                        "qas": [
                            {"id": "q10", "question": "Empty?", "answers": [{"text": "x", "answer_start": 0}]}
                        ],
                    },
                    {
                        "context": CTX2,
                        "qas": [
                            {
                                "id": 11,  # numeric ids become strings
                                "question": "What purrs?",
                                "answers": [
                                    {"text": "Cats", "answer_start": 29},
                                    {"text": "Cats", "answer_start": 29},
                                    {"text": "Cats purr", "answer_start": 29},
                                ],
                                "is_impossible": False,
                            }
                        ],
                    },
                ],
            },
            {
                "title": "Beta",
                "paragraphs": [
                    {
                        "document_id": "DOC-B",
                        "context": "Beta text here.",
                        "qas": [
                            {
                                "id": "q12",
                                "question": "Beta?",
                                "answers": [{"text": "Beta", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            },
            {
                "title": "Gamma",
                "paragraphs": [
                    {
                        "context": "Gamma context one.",
                        "qas": [
                            {
                                "id": "q13",
                                "question": "Gamma one?",
                                "answers": [{"text": "one", "answer_start": 14}],
                            }
                        ],
                    }
                ],
            },
            {
                "title": "Gamma",  # duplicate title: location ids
                "paragraphs": [
                    {
                        "context": "Gamma context two.",
                        "qas": [
                            {
                                "id": "q14",
                                "question": "Gamma two?",
                                "answers": [{"text": "two", "answer_start": 14}],
                            }
                        ],
                    }
                ],
            },
            {
                "paragraphs": [
                    {
                        "document_id": "DOC-B",  # clashes with article 1: renamed
                        "context": "Another Beta text.",
                        "qas": [
                            {
                                "id": "q15",
                                "question": "Another?",
                                "answers": [{"text": "Another", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            },
        ],
    }


def test_squad_context_unit(tmp_path: Path) -> None:
    src = _write_json(tmp_path / "squad.json", _squad_source())
    out = tmp_path / "out"
    report = import_dataset("squad", src, out)
    _valid(out, report)
    docs, qs = _docs(out), _queries(out)

    assert list(docs) == ["Alpha-0", "Alpha-2", "DOC-B", "2-0", "3-0", "DOC-B~2"]
    assert docs["Alpha-0"]["title"] == "Alpha" and docs["Alpha-0"]["text"] == CTX0
    assert "title" not in docs["DOC-B~2"]
    assert any("DOC-B~2" in note for _, note in report.notes)

    assert report.documents == 6
    assert sorted(qs) == sorted(["q1", "q2", "q3", "q5", "q7", "q8", "q9", "11", "q12", "q13", "q14", "q15"])
    assert (report.queries, report.answerable, report.unanswerable) == (12, 11, 1)
    assert report.relocated_spans == 3  # q2, q8, q9

    assert qs["q1"]["query"] == "What jumps?"
    assert qs["q1"]["relevant"] == {"Alpha-0": 1} and qs["q1"]["answerable"] is True
    assert _span_texts(out, qs["q1"]) == ["quick brown fox"]
    assert qs["q1"]["tags"] == ["squad"]
    assert _span_texts(out, qs["q2"]) == ["lazy dog"]
    assert _span_texts(out, qs["q3"]) == ["The dog sleeps"] and qs["q3"]["reference_answer"] == [
        "The dog sleeps"
    ]
    assert _span_texts(out, qs["q7"]) == ["The dog sleeps."]
    assert qs["q7"]["reference_answer"] == ["The dog sleeps."]
    assert qs["q8"]["evidence"][0]["start"] == CTX0.rindex("fox")
    assert _span_texts(out, qs["q9"]) == ["over the lazy"]
    assert _span_texts(out, qs["11"]) == ["Cats", "Cats purr"]
    assert qs["11"]["reference_answer"] == ["Cats", "Cats purr"]
    assert qs["q13"]["relevant"] == {"2-0": 1} and qs["q15"]["relevant"] == {"DOC-B~2": 1}

    q5 = qs["q5"]
    assert q5["answerable"] is False and "relevant" not in q5 and "evidence" not in q5
    assert q5["tags"] == ["squad", "unanswerable"]

    # every problem is reported, none silently dropped
    assert [r.split(":")[0] for r in _reasons(report, "q3")] == ["answer dropped"]
    assert "'cat'" in _reasons(report, "q3")[0]
    assert _reasons(report, "q4")[0].startswith("question skipped: none of its 1 answer(s)")
    assert "'elephant'" in _reasons(report, "q4")[0]
    assert _reasons(report, "q1")[0].startswith("duplicate question id")
    assert qs["q1"]["query"] == "What jumps?"  # the first one was kept
    assert "question text" in _reasons(report, "q6")[0]
    assert "empty context" in _reasons(report, "q10")[0]
    assert len(report.skipped) == 5
    assert _question_skips(report) == 4  # q4, duplicate q1, q6, q10: 16 questions - 4 = 12
    assert report.mapped == {}  # the canonical layout needs no variant mapping
    text = report.summary()
    assert "12 queries" in text and "q4" in text and "relocated by string search: 3" in text


def test_squad_article_unit_shifts_offsets(tmp_path: Path) -> None:
    src = _write_json(tmp_path / "squad.json", _squad_source())
    out = tmp_path / "out"
    report = import_dataset("squad", src, out, doc_unit="article")
    _valid(out, report)
    docs, qs = _docs(out), _queries(out)
    assert list(docs) == ["Alpha", "DOC-B", "2", "3", "DOC-B~2"]
    assert docs["Alpha"]["text"] == CTX0 + "\n\n" + CTX2  # the empty paragraph is left out
    assert qs["11"]["relevant"] == {"Alpha": 1}
    assert qs["11"]["evidence"][0]["start"] == len(CTX0) + 2 + 29
    assert _span_texts(out, qs["11"]) == ["Cats", "Cats purr"]
    assert _span_texts(out, qs["q2"]) == ["lazy dog"]
    assert report.queries == 12 and report.relocated_spans == 3


def test_squad_chinese_offsets_are_str_indices(tmp_path: Path) -> None:
    ctx = "新型冠状病毒主要通过呼吸道飞沫传播。潜伏期一般为三到七天，最长不超过十四天。"
    source = {
        "data": [
            {
                "title": "新冠病毒",
                "paragraphs": [
                    {
                        "id": "DEV_1",
                        "context": ctx,
                        "qas": [
                            {
                                "id": "DEV_1_QUERY_0",
                                "question": "新冠病毒怎么传播？",
                                "answers": [{"text": "呼吸道飞沫", "answer_start": ctx.index("呼吸道飞沫")}],
                            },
                            {  # offset counted in UTF-8 bytes (a common bug): relocated
                                "id": "DEV_1_QUERY_1",
                                "question": "潜伏期多长？",
                                "answers": [
                                    {
                                        "text": "三到七天",
                                        "answer_start": len(ctx[: ctx.index("三到七天")].encode("utf-8")),
                                    }
                                ],
                            },
                            {
                                "id": "DEV_1_QUERY_2",
                                "question": "最长潜伏期？",
                                "answers": [{"text": "十四天", "answer_start": ctx.index("十四天")}],
                            },
                        ],
                    }
                ],
            }
        ]
    }
    src = _write_json(tmp_path / "cmrc.json", source)
    out = tmp_path / "out"
    report = import_dataset("squad", src, out)
    _valid(out, report)
    qs = _queries(out)
    assert list(_docs(out)) == ["DEV_1"]  # CMRC's paragraph id
    assert _span_texts(out, qs["DEV_1_QUERY_0"]) == ["呼吸道飞沫"]
    assert _span_texts(out, qs["DEV_1_QUERY_1"]) == ["三到七天"]
    assert _span_texts(out, qs["DEV_1_QUERY_2"]) == ["十四天"]
    assert report.relocated_spans == 1 and not report.skipped
    raw = (out / "queries.jsonl").read_text(encoding="utf-8")
    assert "新冠病毒怎么传播" in raw  # written as UTF-8, not \u escapes
    assert "呼吸道飞沫" in (out / "corpus.jsonl").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- squad: layout variants

CTX_EN = "The shop opens at nine. Say yes to returns within 30 days. There is no parking."
CTX_ZH = "本店提供退货服务。礼品卡不能退款。是否可以换货要看商品。"


def _squad_one(qas: list[dict[str, Any]], context: str = CTX_EN, doc_id: str = "P") -> dict[str, Any]:
    """A SQuAD file with one article and one paragraph (document ``doc_id``)."""
    return {"data": [{"title": "T", "paragraphs": [{"document_id": doc_id, "context": context, "qas": qas}]}]}


def _ans(text: str, start: int | None = None, context: str = CTX_EN) -> dict[str, Any]:
    """An answer at its true offset (``start`` None), or at the given (maybe bogus) offset."""
    return {"text": text, "answer_start": context.index(text) if start is None else start}


def _import_one(tmp_path: Path, source: dict[str, Any]) -> tuple[ImportReport, dict[str, dict[str, Any]]]:
    src = _write_json(tmp_path / "src.json", source)
    out = tmp_path / "out"
    report = import_dataset("squad", src, out)
    _valid(out, report)
    return report, _queries(out)


def _answerable_with_span(q: dict[str, Any], doc_id: str = "P") -> None:
    assert q["answerable"] is True and q["relevant"] == {doc_id: 1} and len(q["evidence"]) >= 1


def _unanswerable(q: dict[str, Any]) -> None:
    assert q["answerable"] is False and "relevant" not in q and "evidence" not in q
    assert "reference_answer" not in q and q["tags"] == ["squad", "unanswerable"]


def test_squad_impossible_flag_as_string(tmp_path: Path) -> None:
    report, qs = _import_one(
        tmp_path,
        _squad_one(
            [
                {
                    "id": "a",
                    "question": "When does it open?",
                    "is_impossible": "False",
                    "answers": [_ans("nine")],
                },
                {"id": "b", "question": "Who owns it?", "is_impossible": "TRUE", "answers": []},
                {"id": "c", "question": "Any parking?", "is_impossible": " true ", "answers": []},
            ]
        ),
    )
    _answerable_with_span(qs["a"])
    assert _span_texts(tmp_path / "out", qs["a"]) == ["nine"]
    _unanswerable(qs["b"])
    _unanswerable(qs["c"])
    assert report.mapped == {IMPOSSIBLE_AS_STRING: 3}
    assert (report.answerable, report.unanswerable, report.skipped) == (1, 2, [])


def test_squad_impossible_flag_as_number(tmp_path: Path) -> None:
    report, qs = _import_one(
        tmp_path,
        _squad_one(
            [
                {"id": "a", "question": "When does it open?", "is_impossible": 0, "answers": [_ans("nine")]},
                {"id": "b", "question": "Who owns it?", "is_impossible": 1, "answers": []},
                {"id": "c", "question": "Who founded it?", "is_impossible": 1.0, "answers": []},
            ]
        ),
    )
    _answerable_with_span(qs["a"])
    _unanswerable(qs["b"])
    _unanswerable(qs["c"])
    assert report.mapped == {IMPOSSIBLE_AS_NUMBER: 3}
    assert report.skipped == []


def test_squad_empty_answer_text_is_unanswerable(tmp_path: Path) -> None:
    empty = {"text": "", "answer_start": -1}
    report, qs = _import_one(
        tmp_path,
        _squad_one(
            [
                {"id": "a", "question": "Who owns it?", "answers": [empty]},  # no flag at all
                {
                    "id": "b",
                    "question": "Who founded it?",
                    "answers": [empty, {"text": "  ", "answer_start": 0}],
                },
                {"id": "c", "question": "Which year?", "is_impossible": True, "answers": [empty]},
                {"id": "d", "question": "When does it open?", "answers": [_ans("nine")]},
            ]
        ),
    )
    for qid in ("a", "b", "c"):
        _unanswerable(qs[qid])
    _answerable_with_span(qs["d"])
    assert report.mapped == {EMPTY_ANSWER_UNANSWERABLE: 3}
    assert (report.answerable, report.unanswerable, report.skipped) == (1, 3, [])
    assert "unanswerable: answers with empty text: 3" in report.summary()


def test_squad_yes_no_answers_are_answerable_without_evidence(tmp_path: Path) -> None:
    yes_at = CTX_EN.index("yes")
    source = _squad_one(
        [
            {
                "id": "y",
                "question": "Do you take returns?",
                "is_impossible": False,
                "answers": [_ans("YES", -1)],
            },
            {"id": "n", "question": "Is there parking?", "answers": [_ans("No", -1), _ans("NO", -1)]},
            # "yes" occurs in the context, but a bogus offset does not make it evidence
            {"id": "y2", "question": "Returns ok?", "answers": [_ans("yes", yes_at + 5)]},
            # no answer_start at all: never searched for either
            {"id": "y3", "question": "Open daily?", "answers": [{"text": "yes"}]},
            # the stored offset points at the word: an ordinary span
            {"id": "s", "question": "What to say to returns?", "answers": [_ans("yes", yes_at)]},
        ]
    )
    source["data"].append(
        {
            "title": "Z",
            "paragraphs": [
                {
                    "document_id": "PZ",
                    "context": CTX_ZH,
                    "qas": [
                        {
                            "id": "z1",
                            "question": "可以退货吗？",
                            "is_impossible": "false",
                            "answers": [_ans("是", -1)],
                        },
                        {"id": "z2", "question": "礼品卡能退款吗？", "answers": [_ans("否", -1)]},
                    ],
                }
            ],
        }
    )
    report, qs = _import_one(tmp_path, source)
    for qid, refs in (("y", ["YES"]), ("n", ["No", "NO"]), ("y2", ["yes"]), ("y3", ["yes"])):
        q = qs[qid]
        assert q["answerable"] is True and q["relevant"] == {"P": 1}, qid
        assert "evidence" not in q and q["reference_answer"] == refs and q["tags"] == ["squad", "yes_no"]
    for qid in ("z1", "z2"):
        q = qs[qid]
        assert q["answerable"] is True and q["relevant"] == {"PZ": 1} and "evidence" not in q
    assert qs["z1"]["reference_answer"] == ["是"] and qs["z2"]["reference_answer"] == ["否"]
    q = qs["s"]
    assert q["evidence"] == [{"doc_id": "P", "start": yes_at, "end": yes_at + 3, "quote": "yes"}]
    assert q["tags"] == ["squad"]
    assert report.mapped == {YES_NO_ANSWERABLE: 6, IMPOSSIBLE_AS_STRING: 1}
    assert (report.answerable, report.unanswerable, report.relocated_spans, report.skipped) == (7, 0, 0, [])
    ds = load_dataset(tmp_path / "out")
    assert ds.summary()["with_evidence"] == 1  # answerable without evidence is part of the contract


def test_squad_plausible_answers_never_make_a_question_answerable(tmp_path: Path) -> None:
    plausible = [_ans("nine")]
    report, qs = _import_one(
        tmp_path,
        _squad_one(
            [
                # SQuAD 2.0 as published
                {
                    "id": "a",
                    "question": "When does it close?",
                    "is_impossible": True,
                    "answers": [],
                    "plausible_answers": plausible,
                },
                # no flag, no answers: plausible_answers is what says "unanswerable"
                {"id": "b", "question": "When does it shut?", "answers": [], "plausible_answers": plausible},
                # marked impossible, with a real answer beside the flag: the flag decides
                {
                    "id": "c",
                    "question": "Opening hour on Sunday?",
                    "is_impossible": "true",
                    "answers": [_ans("nine")],
                    "plausible_answers": plausible,
                },
            ]
        ),
    )
    for qid in ("a", "b", "c"):
        _unanswerable(qs[qid])
    assert report.mapped == {PLAUSIBLE_IGNORED: 3, IMPOSSIBLE_AS_STRING: 1, ANSWERS_IGNORED: 1}
    assert report.skipped == []


def test_squad_bad_variants_are_reported_not_guessed(tmp_path: Path) -> None:
    report, qs = _import_one(
        tmp_path,
        _squad_one(
            [
                {"id": "ok", "question": "When does it open?", "answers": [_ans("nine")]},
                {"id": "b1", "question": "Who owns it?", "is_impossible": "maybe", "answers": []},
                {"id": "b2", "question": "Who founded it?", "is_impossible": 2, "answers": []},
                {
                    "id": "b3",
                    "question": "Which year?",
                    "is_impossible": "false",
                    "answers": [{"text": "", "answer_start": -1}],
                },
                {"id": "b4", "question": "Which month?", "is_impossible": False, "answers": []},
                {"id": "b5", "question": "Which day?", "answers": {"text": "nine", "answer_start": 0}},
                {"id": "b6", "question": "Which hour?", "answers": []},
                {"id": "b7", "question": "Which floor?", "answers": [_ans("fifth", 3)]},
                {
                    "id": "b8",
                    "question": "How far?",
                    "answers": [_ans("30 days"), {"text": "", "answer_start": 0}],
                },
            ]
        ),
    )
    assert sorted(qs) == ["b8", "ok"]
    assert _span_texts(tmp_path / "out", qs["b8"]) == ["30 days"]
    assert _reasons(report, "b1") == [
        "question skipped: is_impossible must be true/false, got 'maybe' (data[0].paragraphs[0].qas[1])"
    ]
    assert _reasons(report, "b2")[0].startswith("question skipped: is_impossible must be true/false (or 1/0)")
    assert _reasons(report, "b3")[0].startswith(
        "question skipped: is_impossible is false but the question has only answers with empty text"
    )
    assert _reasons(report, "b4")[0].startswith(
        "question skipped: is_impossible is false but the question has no"
    )
    assert _reasons(report, "b5")[0].startswith("question skipped: answers must be a list, got dict")
    assert _reasons(report, "b6")[0].startswith("question skipped: no answers and not marked is_impossible")
    assert "'fifth' is not in the context" in _reasons(report, "b7")[0]
    assert _reasons(report, "b8") == ["answer dropped: 1 answer(s) with empty text"]
    assert _question_skips(report) == 7 and report.mapped == {}

    (tmp_path / "shape.json").write_text('{"data": {"paragraphs": []}}', encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        import_dataset("squad", tmp_path / "shape.json", tmp_path / "out2")
    assert (info.value.file, info.value.field) == (str(tmp_path / "shape.json"), "data")
    assert not (tmp_path / "out2").exists()


def _variant_source() -> dict[str, Any]:
    """One file with every variant at once (CJRC / CAIL-style data mixes them)."""
    empty = {"text": "", "answer_start": -1}
    en = [
        {"id": "v1", "question": "When does it open?", "is_impossible": "False", "answers": [_ans("nine")]},
        {"id": "v2", "question": "Who owns it?", "is_impossible": "TRUE", "answers": []},
        {"id": "v3", "question": "How long for returns?", "is_impossible": 0, "answers": [_ans("30 days")]},
        {"id": "v4", "question": "Who founded it?", "is_impossible": 1, "answers": [empty]},
        {"id": "v5", "question": "Which year was it built?", "answers": [empty]},
        {
            "id": "v6",
            "question": "Do you take returns?",
            "is_impossible": "false",
            "answers": [_ans("YES", -1)],
        },
        {"id": "v7", "question": "Is there parking?", "answers": [_ans("no", -1)]},
        {
            "id": "v8",
            "question": "When does it close?",
            "is_impossible": True,
            "answers": [],
            "plausible_answers": [_ans("nine")],
        },
        {"id": "v9", "question": "Which floor?", "is_impossible": "maybe", "answers": []},
    ]
    zh = [
        {"id": "z1", "question": "可以退货吗？", "is_impossible": "false", "answers": [_ans("是", -1)]},
        {"id": "z2", "question": "礼品卡能退款吗？", "is_impossible": "false", "answers": [_ans("否", -1)]},
        {
            "id": "z3",
            "question": "礼品卡不能做什么？",
            "is_impossible": "false",
            "answers": [_ans("退款", context=CTX_ZH)],
        },
        {"id": "z4", "question": "营业时间？", "is_impossible": "true", "answers": [empty]},
    ]
    return {
        "version": "v2.0",
        "data": [
            {"title": "Shop", "paragraphs": [{"context": CTX_EN, "qas": en}]},
            {"title": "商店", "paragraphs": [{"context": CTX_ZH, "qas": zh}]},
        ],
    }


VARIANT_COUNTS = {
    IMPOSSIBLE_AS_STRING: 7,  # v1 v2 v6 z1 z2 z3 z4 (v9's "maybe" is skipped, not counted)
    IMPOSSIBLE_AS_NUMBER: 2,  # v3 v4
    EMPTY_ANSWER_UNANSWERABLE: 3,  # v4 v5 z4
    YES_NO_ANSWERABLE: 4,  # v6 v7 z1 z2
    PLAUSIBLE_IGNORED: 1,  # v8
}


def test_squad_variant_file_report(tmp_path: Path) -> None:
    report, qs = _import_one(tmp_path, _variant_source())
    assert report.mapped == VARIANT_COUNTS
    assert (report.queries, report.answerable, report.unanswerable) == (12, 7, 5)
    assert [q for q, v in qs.items() if v["answerable"] and "evidence" not in v] == ["v6", "v7", "z1", "z2"]
    assert [q for q, v in qs.items() if not v["answerable"]] == ["v2", "v4", "v5", "v8", "z4"]
    assert qs["z3"]["relevant"] == {"商店": 1} and _span_texts(tmp_path / "out", qs["z3"]) == ["退款"]
    assert [item for item, _ in report.skipped] == ["v9"]


def test_cli_import_prints_variant_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_json(tmp_path / "cjrc.json", _variant_source())
    assert main(["import", "squad", str(src), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "12 queries (7 answerable, 5 unanswerable)" in printed
    assert "variants mapped (questions per variant; one can count under several):" in printed
    for variant, n in VARIANT_COUNTS.items():
        assert f"    - {variant}: {n}\n" in printed
    assert "v9: question skipped: is_impossible must be true/false, got 'maybe'" in printed


def test_cli_unknown_format_lists_the_registered_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _write_json(tmp_path / "s.json", _variant_source())
    with pytest.raises(SystemExit) as info:
        main(["import", "msmarco", str(src), str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'msmarco'" in err
    assert all(f"'{name}'" in err for name in ("squad", "beir", "clapnq"))
    assert not (tmp_path / "out").exists()


def test_a_new_format_is_one_registered_class(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Registering an Importer is all it takes: the driver and the CLI pick it up."""
    monkeypatch.setattr(IMPORTERS, "_entries", dict(IMPORTERS._entries))

    @IMPORTERS.register("lines")
    class Lines(Importer):
        summary = "one question per line, one document"

        def read(self, source: Path, out: JsonlWriter, run: ImportRun, *, doc_unit: str) -> list[Case]:
            out.write({"doc_id": "D", "text": "the whole corpus"})
            run.documents = out.count
            lines = source.read_text(encoding="utf-8").splitlines()
            return [Case(f"L{i}", text, {"D": 1}, [], [], ["lines"]) for i, text in enumerate(lines)]

    src = tmp_path / "questions.txt"
    src.write_text("what is in the corpus\nwhere is the corpus kept\n", encoding="utf-8")
    assert IMPORTERS.names() == ("squad", "beir", "clapnq", "ragchecker-meta", "lines")
    assert main(["import", "lines", str(src), str(tmp_path / "out")]) == 0
    assert "2 queries (2 answerable, 0 unanswerable)" in capsys.readouterr().out
    assert sorted(_queries(tmp_path / "out")) == ["L0", "L1"]
    with pytest.raises(ConfigError, match="does not apply to the lines format"):
        import_dataset("lines", src, tmp_path / "o2", doc_unit="article")


# --------------------------------------------------------------------------- beir


def _beir_source(root: Path, *, dev: bool = True) -> Path:
    _write_jsonl(
        root / "corpus.jsonl",
        [
            {"_id": "d1", "title": "Paris", "text": "Paris is the capital of France."},
            {"_id": "d2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
            {"_id": "d3", "title": "", "text": "Madrid is the capital of Spain.", "metadata": {"lang": "en"}},
            {"_id": "d4", "title": "Rome", "text": "Rome is the capital of Italy."},
            {"_id": "d5", "title": "Empty", "text": ""},
        ],
    )
    _write_jsonl(
        root / "queries.jsonl",
        [
            {"_id": "q1", "text": "capital of france"},
            {"_id": "q2", "text": "capital of germany"},
            {"_id": "q3", "text": "which city is the seat of the spanish government"},
            {"_id": "q4", "text": "a question nobody judged"},
            {"_id": "q5", "text": "capital of italy"},
            {"_id": "q6", "text": "points only to a missing document"},
            {"_id": "q7", "text": "points only to the empty document"},
            {"_id": "q8", "text": "How tall is the Eiffel tower in Paris today?"},
            {"_id": "q9", "text": "How tall is the Eiffel tower in Paris, today?"},
            {"_id": "q10", "text": "how tall is the eiffel tower in paris today"},
        ],
    )
    test = [("q1", "d1", 2), ("q1", "d2", 0), ("q5", "d4", 2), ("q5", "dX", 1), ("q6", "dY", 1)]
    test += [("q7", "d5", 1), ("q8", "d1", 1), ("q9", "d1", 1), ("qZ", "d1", 1)]
    dev_rows = [("q1", "d1", 1), ("q2", "d2", 1), ("q2", "d3", 2), ("q3", "d3", 0), ("q10", "d1", 1)]
    files = {"test": test, "dev": dev_rows} if dev else {"test": test + dev_rows}
    for name, rows in files.items():
        lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{s}" for q, d, s in rows]
        if name == "test":
            lines.append("broken line without tabs")
        (root / "qrels").mkdir(parents=True, exist_ok=True)
        (root / "qrels" / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_beir_graded_qrels_and_official_splits(tmp_path: Path) -> None:
    src = _beir_source(tmp_path / "beir")
    out = tmp_path / "out"
    report = import_dataset("beir", src, out)
    _valid(out, report)
    qs, docs = _queries(out), _docs(out)

    assert sorted(docs) == ["d1", "d2", "d3", "d4"]
    assert "title" not in docs["d3"] and docs["d3"]["metadata"] == {"lang": "en"}
    assert "empty text" in _reasons(report, "d5")[0]

    assert sorted(qs) == ["q1", "q10", "q2", "q5", "q8", "q9"]
    assert qs["q1"]["relevant"] == {"d1": 2}  # max over dev (1) and test (2); the 0 grade is not relevant
    assert qs["q1"]["nonrelevant"] == ["d2"] and "nonrelevant" not in qs["q2"]  # judged 0: kept as such
    assert qs["q2"]["relevant"] == {"d2": 1, "d3": 2}
    assert qs["q5"]["relevant"] == {"d4": 2}
    assert all(q["tags"] == ["beir"] and q["answerable"] is True for q in qs.values())
    assert report.unanswerable == 0

    assert "every grade <= 0" in _reasons(report, "q3")[0]
    assert "unjudged" in _reasons(report, "q4")[0]
    assert _reasons(report, "q5") == ["qrels pair dropped: document 'dX' is not in the corpus"]
    assert _reasons(report, "q6")[-1].startswith("query skipped: no relevant document left")
    assert _reasons(report, "q7")[-1].startswith("query skipped: no relevant document left")
    assert "not in queries.jsonl" in _reasons(report, "qZ")[0]
    assert any(item == "qrels/test.tsv:11" for item, _ in report.skipped)

    # dev.tsv -> dev, test.tsv -> holdout; q1 is in both -> holdout
    assert qs["q2"]["split"] == "dev"
    assert qs["q1"]["split"] == qs["q5"]["split"] == "holdout"
    # q8, q9 (test) and q10 (dev) are near-duplicates: the group goes whole to its majority
    assert {qs[q]["split"] for q in ("q8", "q9", "q10")} == {"holdout"}
    assert qs["q8"]["group"] == qs["q9"]["group"] == qs["q10"]["group"]
    assert report.groups_multi == 1
    assert any("q10" in note and "holdout" in note for _, note in report.notes)
    assert "group" not in qs["q1"]


def test_beir_without_dev_assigns_splits(tmp_path: Path) -> None:
    src = _beir_source(tmp_path / "beir", dev=False)
    out = tmp_path / "out"
    report = import_dataset("beir", src, out, holdout_share=0.5)
    ds = _valid(out, report)
    assert report.queries == 6
    assert report.splits["holdout"] >= 1 and report.splits["dev"] >= 1
    by_group: dict[str, set[str]] = {}
    for q in ds.queries:
        by_group.setdefault(q.group, set()).add(q.split)
    assert all(len(s) == 1 for s in by_group.values())


# --------------------------------------------------------------------------- clapnq

PASSAGE_A = "Alpha one starts here . Alpha two follows . Alpha three ends it . Alpha four . "
PASSAGE_B = "Beta first line . Beta second line . Beta third line . "
PASSAGE_C = "Gamma talks about something unrelated . It goes on . "
PASSAGE_D = "Beta first line . Beta second line , edited . "
PASSAGE_A2 = PASSAGE_A + "Alpha five . "


def _sentences(text: str) -> list[str]:
    return [s.strip() + " ." for s in text.split(" . ") if s.strip(" .")]


def _clap_row(
    qid: str, question: str, title: str, text: str, outputs: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": qid,
        "input": question,
        "passages": [{"title": title, "text": text, "sentences": _sentences(text)}],
        "output": outputs,
    }


def _out(answer: str, sentences: list[str], *, skip: bool = False) -> dict[str, Any]:
    meta = {"annotator": [1], "has_minimal_answer": False, "non_consecutive": True, "round": 2, "skip": skip}
    return {"answer": answer, "selected_sentences": sentences, "meta": meta}


def _clapnq_source(root: Path) -> Path:
    answerable = [
        _clap_row(
            "101",
            "what does alpha do",
            "Alpha",
            PASSAGE_A,
            [
                _out("Alpha starts and ends.", ["Alpha one starts here .", "Alpha three ends it .&"]),
                _out("", [], skip=True),
            ],
        ),
        _clap_row(
            "-102",
            "tell me about beta",
            "Beta",
            PASSAGE_B,
            [
                _out("Beta has lines.", ["This sentence is not in the passage ."]),
                _out("Beta has lines.", ["Beta first line ."]),
            ],
        ),
        _clap_row(
            "103",
            "what else does alpha do",
            "Alpha",
            PASSAGE_A,
            [_out("Alpha two.", ["Alpha two follows ."])],
        ),
        _clap_row(
            "104",
            "beta second line edited",
            "Beta",
            PASSAGE_D,
            [_out("Edited.", ["Beta second line , edited ."])],
        ),
    ]
    unanswerable = [
        _clap_row(
            "201",
            "why is gamma unrelated",
            "Gamma",
            PASSAGE_C,
            [{"answer": "", "selected_sentences": [], "meta": {}}],
        ),
        _clap_row(
            "202",
            "what is alpha number six",
            "Alpha",
            PASSAGE_A2,
            [{"answer": "", "selected_sentences": [], "meta": {}}],
        ),
    ]
    _write_jsonl(root / "clapnq_dev_answerable.jsonl", answerable)
    _write_jsonl(root / "clapnq_dev_unanswerable.jsonl", unanswerable)
    tsv = {
        "question_dev_answerable.tsv": [
            ("101", "what does alpha do", "111_0-80", "Alpha starts and ends."),
            ("-102", "tell me about beta", "222_0-55", "Beta has\nlines."),  # multi-line cell, quoted
            ("103", "what else does alpha do", "111_0-80", "Alpha two."),
            ("104", "beta second line edited", "222_0-55", "Edited."),  # same id, other text: ambiguous
        ],
        "question_dev_unanswerable.tsv": [("201", "why is gamma unrelated", "", ""), ("202", "x", "", "")],
    }
    for name, rows in tsv.items():
        with (root / name).open("w", encoding="utf-8", newline="") as fh:
            writer = csv.writer(fh, delimiter="\t")
            writer.writerow(["id", "question", "doc-id-list", "answers"])
            writer.writerows(rows)
    (root / "README.md").write_text("not data\n", encoding="utf-8")
    return root


def test_clapnq_answerable_and_unanswerable(tmp_path: Path) -> None:
    src = _clapnq_source(tmp_path / "clapnq")
    out = tmp_path / "out"
    report = import_dataset("clapnq", src, out)
    _valid(out, report)
    docs, qs = _docs(out), _queries(out)

    assert report.documents == 5  # A (shared by 101 and 103), B, D, C, A2
    ids = list(docs)
    assert ids[0] == "111_0-80" and docs["111_0-80"]["text"] == PASSAGE_A
    assert docs["111_0-80"]["title"] == "Alpha"
    assert docs["111_0-80"]["metadata"] == {"source": "clapnq", "nq_doc_id": "111_0-80"}
    b_id, d_id = ids[1], ids[2]
    assert b_id.startswith("222_0-55~") and d_id.startswith("222_0-55~") and b_id != d_id
    assert docs[b_id]["text"] == PASSAGE_B and docs[d_id]["text"] == PASSAGE_D
    c_id, a2_id = ids[3], ids[4]
    assert c_id.startswith("clapnq-") and a2_id.startswith("clapnq-") and c_id != a2_id

    assert (report.answerable, report.unanswerable) == (4, 2)
    q = qs["101"]
    assert q["relevant"] == {"111_0-80": 1} and q["tags"] == ["clapnq"]
    assert _span_texts(out, q) == ["Alpha one starts here .", "Alpha three ends it ."]  # '&' removed
    assert q["reference_answer"] == ["Alpha starts and ends."]  # the skipped annotation adds nothing
    assert qs["103"]["relevant"] == {"111_0-80": 1}
    q = qs["-102"]
    assert q["relevant"] == {b_id: 1} and _span_texts(out, q) == ["Beta first line ."]
    assert q["reference_answer"] == ["Beta has lines."]
    assert _reasons(report, "-102") == [
        "evidence dropped: selected sentence 'This sentence is not in the passage .' is not in the passage"
    ]
    assert qs["104"]["relevant"] == {d_id: 1}

    for qid, doc_id in (("201", c_id), ("202", a2_id)):
        q = qs[qid]
        assert q["answerable"] is False and "relevant" not in q and "evidence" not in q
        assert "reference_answer" not in q
        assert q["tags"] == ["clapnq", "unanswerable"]
        assert doc_id in docs  # its (non-answering) passage stays in the corpus as a distractor
    assert len(report.skipped) == 1


# --------------------------------------------------------------------------- shared behaviour

_SOURCES: dict[str, Callable[[Path], Path]] = {
    "squad": lambda root: _write_json(root / "squad.json", _squad_source()),
    "beir": _beir_source,
    "clapnq": _clapnq_source,
    "ragchecker-meta": ragchecker_source,
}


@pytest.mark.parametrize("fmt", IMPORTERS.names())
def test_import_is_deterministic(tmp_path: Path, fmt: str) -> None:
    src = _SOURCES[fmt](tmp_path / "src")
    a = import_dataset(fmt, src, tmp_path / "a")
    b = import_dataset(fmt, src, tmp_path / "b")
    for name in ("corpus.jsonl", "queries.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["corpus.jsonl", "queries.jsonl"]
    assert (a.skipped, a.notes, a.splits) == (b.skipped, b.notes, b.splits)


def test_unknown_format_and_bad_options(tmp_path: Path) -> None:
    src = _SOURCES["squad"](tmp_path / "src")
    with pytest.raises(UnknownNameError) as info:
        import_dataset("msmarco", src, tmp_path / "out")
    assert str(info.value) == "unknown importer 'msmarco'; valid: beir, clapnq, ragchecker-meta, squad"
    with pytest.raises(UnknownNameError):
        import_dataset("squad", src, tmp_path / "out", doc_unit="sentence")
    with pytest.raises(ConfigError):
        import_dataset("beir", src, tmp_path / "out", doc_unit="article")
    with pytest.raises(ConfigError):
        import_dataset("squad", src, tmp_path / "out", holdout_share=1.5)
    assert not (tmp_path / "out").exists()


def test_out_dir_rules(tmp_path: Path) -> None:
    src = _SOURCES["squad"](tmp_path / "src")
    out = tmp_path / "out"
    first = import_dataset("squad", src, out)
    with pytest.raises(DatasetError, match="not empty"):
        import_dataset("squad", src, out)
    second = import_dataset("squad", src, out, overwrite=True, holdout_share=0.5)
    assert second.splits != first.splits
    _valid(out, second)

    (tmp_path / "empty").mkdir()
    import_dataset("squad", src, tmp_path / "empty")  # an empty folder is fine
    load_dataset(tmp_path / "empty")

    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="does not look like a dataset"):
        import_dataset("squad", src, other, overwrite=True)
    assert (other / "todo.txt").read_text(encoding="utf-8") == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes", "out", "src"]


def test_failed_import_leaves_nothing(tmp_path: Path) -> None:
    bad = {
        "data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "1", "question": "?", "answers": []}]}]}]
    }
    src = _write_json(tmp_path / "bad.json", bad)
    with pytest.raises(DatasetError, match="no query"):
        import_dataset("squad", src, tmp_path / "out")
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetError, match="invalid JSON"):
        import_dataset("squad", tmp_path / "broken.json", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "broken.json"]  # no (hidden) leftovers


# --------------------------------------------------------------------------- real data


def test_real_covid_qa(tmp_path: Path) -> None:
    src = shared_path("data", "covid-qa", "200423_covidQA.json")
    raw = json.loads(src.read_text(encoding="utf-8"))
    paragraphs = [p for art in raw["data"] for p in art["paragraphs"]]
    qas = [qa for p in paragraphs for qa in p["qas"]]
    wrong = sum(
        1
        for p in paragraphs
        for qa in p["qas"]
        for a in qa["answers"]
        if p["context"][a["answer_start"] : a["answer_start"] + len(a["text"])] != a["text"]
    )
    out = tmp_path / "covid"
    report = import_dataset("squad", src, out)
    ds = _valid(out, report)

    # The paper counts 2,019 question-answer pairs; this file (the 2020-04-23 release, the
    # first batch) holds 98 papers with one paragraph each and 1,380 questions.
    assert report.documents == len(paragraphs) == len({p["document_id"] for p in paragraphs}) == 98
    assert report.queries == len(qas) - _question_skips(report) == 1380
    assert report.answerable == 1380 and report.unanswerable == 0
    assert report.relocated_spans == wrong == 234
    assert report.skipped == [] and report.mapped == {}
    for q in ds.queries:  # every evidence span holds one of its reference answers
        assert q.evidence
        for span in q.evidence:
            assert ds.documents[span.doc_id].text[span.start : span.end] in q.reference_answers


def test_real_clapnq_dev(tmp_path: Path) -> None:
    src = shared_path("data", "clapnq-dev")
    rows = {kind: _rows(src / f"clapnq_dev_{kind}.jsonl") for kind in ("answerable", "unanswerable")}
    passages = {
        (p["title"], p["text"]) for r in rows["answerable"] + rows["unanswerable"] for p in r["passages"]
    }
    out = tmp_path / "clapnq"
    report = import_dataset("clapnq", src, out)
    ds = _valid(out, report)
    assert (report.answerable, report.unanswerable) == (300, 300)
    assert report.documents == len(passages) == 597
    assert report.skipped == []
    # one answerable question (4371964269871290494) has written answers but no selected sentences
    assert sum(1 for q in ds.queries if q.answerable and not q.evidence) == 1
    for q in ds.queries:
        if q.answerable:
            assert len(q.relevant) == 1 and q.reference_answers
        else:
            assert not q.relevant and "unanswerable" in q.tags
