"""Judge calibration: agreement statistics, the dataset's human_judgements field, a calibration run.

Kappa is checked against scikit-learn's ``cohen_kappa_score(weights="quadratic")`` on the fixed
categories 0-5 (scikit-learn comes with MLflow; only this test imports it) and against hand
computations; the run goes through the real OpenAI judge against the fake server of
tests/fake_llm.py.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.core.layout import JUDGE_CALIBRATION_JSON, JUDGE_CALIBRATION_MD, RECORDS_FILE, RUN_FILE
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import DatasetValidationError
from rag_ablate.judges import JUDGE_METRICS
from rag_ablate.judges.calibration import (
    agreement,
    confusion,
    judge_score,
    reference_contexts,
    run_calibration,
    weighted_kappa,
)
from rag_ablate.metrics.registry import human_metrics
from tests.conftest import DOCS, QUERIES, run_module, write_dataset
from tests.fake_llm import FakeLLM

LABELS = list(range(6))


def sk_kappa(a: list[int], b: list[int], labels: list[int] | None = LABELS) -> float:
    """scikit-learn's quadratic-weighted kappa (imported here: the import takes 2 s that collecting
    the file in every pytest worker would pay)."""
    from sklearn.metrics import cohen_kappa_score

    return float(cohen_kappa_score(a, b, labels=labels, weights="quadratic"))


# --------------------------------------------------------------------------- kappa and agreement


def test_kappa_worked_example() -> None:
    # human 0,1,2 vs judge 0,2,2: sum w*O = (1-2)^2 = 1; row sums 1,1,1 (scores 0,1,2), column sums
    # 1 (score 0), 2 (score 2); sum w*E = (1*(0+2*4) + 1*(1+2*1) + 1*(4+0)) / 3 = 15/3 = 5
    kappa, note = weighted_kappa([0, 1, 2], [0, 2, 2])
    assert note is None
    assert kappa == pytest.approx(1 - 1 / 5)
    a = agreement("faithfulness", [0, 1, 2], [0, 2, 2])
    assert (a.n, a.exact, a.within1) == (3, pytest.approx(2 / 3), 1.0)
    assert a.human_mean == 1.0 and a.judge_mean == pytest.approx(4 / 3)
    assert a.confusion[1][2] == 1 and a.confusion[0][0] == 1 and a.confusion[2][2] == 1


def test_kappa_full_disagreement_is_minus_one() -> None:
    # (0,5) and (5,0): sum w*O = 50; E puts 0.5 on each of the four corners: sum w*E = 25
    assert weighted_kappa([0, 5], [5, 0]) == (pytest.approx(-1.0), None)


def test_kappa_weights_are_the_score_distance_not_the_label_index() -> None:
    # only scores 0, 2, 5 occur: a kappa on label indices (0, 1, 2) would weigh 0 vs 5 as 4, not 25
    human, judge = [0, 2, 5, 5, 2], [2, 2, 5, 0, 5]
    assert weighted_kappa(human, judge)[0] == pytest.approx(sk_kappa(human, judge))
    assert weighted_kappa(human, judge)[0] != pytest.approx(sk_kappa(human, judge, labels=None))


def test_kappa_undefined_with_one_category_or_no_pairs() -> None:
    kappa, note = weighted_kappa([4, 4, 4], [4, 4, 4])
    assert kappa is None and note is not None and "one category" in note and "4" in note
    assert weighted_kappa([], []) == (None, "no pairs")
    a = agreement("relevance", [], [])
    assert (a.n, a.exact, a.within1, a.kappa, a.kappa_note) == (0, None, None, None, "no pairs")
    # one constant side against another constant: chance disagreement exists, kappa is 0 (as sklearn)
    assert weighted_kappa([3, 3], [4, 4]) == (pytest.approx(0.0), None)
    assert sk_kappa([3, 3], [4, 4]) == pytest.approx(0.0)


def test_scores_outside_the_scale_are_refused() -> None:
    with pytest.raises(ValueError, match="0-5"):
        confusion([6], [1])
    with pytest.raises(ValueError, match="not aligned"):
        confusion([1, 2], [1])


pairs = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=60)


@given(pairs)
@settings(max_examples=300, deadline=None)
def test_kappa_matches_sklearn(ps: list[tuple[int, int]]) -> None:
    a, b = [x for x, _ in ps], [y for _, y in ps]
    kappa, note = weighted_kappa(a, b)
    if len(set(a) | set(b)) == 1:
        assert kappa is None and note is not None  # sklearn divides 0 by 0 here
        return
    assert note is None and kappa is not None
    assert kappa == pytest.approx(sk_kappa(a, b), abs=1e-12)
    assert weighted_kappa(b, a)[0] == pytest.approx(kappa, abs=1e-12)  # symmetric
    assert kappa <= 1 + 1e-12


@given(st.lists(st.integers(0, 5), min_size=2, max_size=40).filter(lambda xs: len(set(xs)) > 1))
def test_identical_scores_agree_perfectly(xs: list[int]) -> None:
    a = agreement("completeness", xs, xs)
    assert a.kappa == pytest.approx(1.0) and a.exact == 1.0 and a.within1 == 1.0


@given(pairs)
def test_exact_and_within1_are_shares_of_pairs(ps: list[tuple[int, int]]) -> None:
    a_, b_ = [x for x, _ in ps], [y for _, y in ps]
    a = agreement("faithfulness", a_, b_)
    assert a.n == len(ps) == sum(map(sum, a.confusion))
    assert a.exact == pytest.approx(sum(x == y for x, y in ps) / len(ps))
    assert a.within1 == pytest.approx(sum(abs(x - y) <= 1 for x, y in ps) / len(ps))
    assert a.exact is not None and a.within1 is not None and a.exact <= a.within1


def test_judge_score_mean_of_valid_repeats_rounded_half_up() -> None:
    def rep(score: int | None, error: str | None = None) -> dict[str, Any]:
        return {"scores": {"faithfulness": score}, "errors": {"faithfulness": error} if error else {}}

    assert judge_score({"repeats": [rep(4), rep(5)]}, "faithfulness") == (5, None)  # 4.5 -> 5
    assert judge_score({"repeats": [rep(3), rep(4), rep(4)]}, "faithfulness") == (4, None)  # 3.67
    assert judge_score({"repeats": [rep(2), rep(None, "not an integer 0-5: 'x'")]}, "faithfulness") == (
        2,
        None,
    )
    assert judge_score({"repeats": [rep(None, "HTTP 500")]}, "faithfulness") == (None, "HTTP 500")
    assert judge_score({"repeats": [rep(4)]}, "completeness") == (None, None)  # not asked


# --------------------------------------------------------------------------- the dataset field

# answers a person scored on the tiny dataset of tests/conftest.py (q1-q5): 16 judgements
HUMAN: dict[str, list[dict[str, Any]]] = {
    "q1": [
        {
            "answer": "You have 30 days from delivery to return an item.",
            "rater": "ana",
            "scores": {"faithfulness": 5, "relevance": 5, "completeness": 5},
        },
        {
            "answer": "You have 30 days from delivery to return an item.",
            "rater": "ben",
            "scores": {"faithfulness": 5, "relevance": 5, "completeness": 4},
        },
        {
            "answer": "Returns are accepted within 14 days.",
            "rater": "ana",
            "scores": {"faithfulness": 1, "relevance": 4, "completeness": 1},
        },
        {
            "answer": "Refunds reach your card within 5 business days.",
            "rater": "ana",
            "scores": {"faithfulness": 5, "relevance": 2, "completeness": 0},
        },
        {
            "answer": "The documents do not answer this question.",
            "scores": {"faithfulness": 3, "relevance": 1, "completeness": 0},
        },
    ],
    "q2": [
        {
            "answer": "If the item is faulty, the shop pays the return shipping.",
            "rater": "ana",
            "scores": {"faithfulness": 5, "relevance": 5},
        },
        {
            "answer": "You always pay 6 dollars for return shipping.",
            "rater": "ana",
            "scores": {"faithfulness": 1, "relevance": 3},
        },
        {
            "answer": "Shipping takes 3 to 5 business days.",
            "rater": "ben",
            "scores": {"faithfulness": 4, "relevance": 0},
        },
    ],
    "q3": [
        {
            "answer": "Express shipping arrives the next day if you order before noon.",
            "rater": "ben",
            "scores": {"faithfulness": 5, "relevance": 5},
        },
        {
            "answer": "Express shipping takes two weeks.",
            "rater": "ben",
            "scores": {"faithfulness": 0, "relevance": 4},
        },
        {
            "answer": "Express delivery is fast.",
            "rater": "ana",
            "scores": {"faithfulness": 4, "relevance": 3},
        },
    ],
    "q4": [
        {
            "answer": "No, accidental damage such as water is not covered by the warranty.",
            "rater": "ana",
            "scores": {"faithfulness": 5, "relevance": 5},
        },
        {
            "answer": "Yes, water damage is covered for one year.",
            "rater": "ana",
            "scores": {"faithfulness": 0, "relevance": 4},
        },
        {
            "answer": "Electronics have a one year warranty.",
            "rater": "ben",
            "scores": {"faithfulness": 5, "relevance": 2},
        },
    ],
    "q5": [
        {
            "answer": "The documents do not answer this question.",
            "rater": "ana",
            "scores": {"faithfulness": 5, "relevance": 4},
        },
        {
            "answer": "Yes, we ship to Mars within two weeks.",
            "rater": "ben",
            "scores": {"faithfulness": 0, "relevance": 2},
        },
    ],
}
N_HUMAN = sum(len(v) for v in HUMAN.values())


def judged_queries() -> list[dict[str, Any]]:
    out = copy.deepcopy(QUERIES)
    for q in out:
        if q["query_id"] in HUMAN:
            q["human_judgements"] = copy.deepcopy(HUMAN[q["query_id"]])
    return out


def test_human_judgements_load(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "d", queries=judged_queries()))
    by_id = {q.query_id: q for q in ds.queries}
    assert sum(len(q.human_judgements) for q in ds.queries) == N_HUMAN == 16
    first = by_id["q1"].human_judgements[0]
    assert first.answer.startswith("You have 30 days") and first.rater == "ana"
    assert dict(first.scores) == {"faithfulness": 5, "relevance": 5, "completeness": 5}
    assert by_id["q1"].human_judgements[4].rater is None
    assert by_id["q6"].human_judgements == ()
    # the field is part of the queries' content: adding judgements changes the fingerprint
    plain = load_dataset(write_dataset(tmp_path / "p"))
    assert plain.queries_fingerprint != ds.queries_fingerprint


def test_validate_counts_the_human_judgements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rag_ablate.cli.main import main

    assert main(["validate", str(write_dataset(tmp_path / "d", queries=judged_queries()))]) == 0
    assert "human judgements  16 on 5 queries" in capsys.readouterr().out
    assert main(["validate", str(write_dataset(tmp_path / "plain"))]) == 0
    assert "human judgements" not in capsys.readouterr().out


BAD: list[tuple[Any, str, str]] = [
    ({"answer": "a", "scores": {"accuracy": 3}}, "human_judgements[0].scores.accuracy", "unknown metric"),
    ({"answer": "a", "scores": {"faithfulness": 4.5}}, "human_judgements[0].scores.faithfulness", "integer"),
    ({"answer": "a", "scores": {"relevance": "4"}}, "human_judgements[0].scores.relevance", "integer"),
    ({"answer": "a", "scores": {"relevance": True}}, "human_judgements[0].scores.relevance", "integer"),
    ({"answer": "a", "scores": {"completeness": 6}}, "human_judgements[0].scores.completeness", "0-5"),
    ({"answer": "a", "scores": {"completeness": -1}}, "human_judgements[0].scores.completeness", "0-5"),
    ({"answer": "a", "scores": {}}, "human_judgements[0].scores", "non-empty"),
    ({"answer": "", "scores": {"relevance": 3}}, "human_judgements[0].answer", "non-empty string"),
    ({"scores": {"relevance": 3}}, "human_judgements[0].answer", "missing"),
    ({"answer": "a", "scores": {"relevance": 3}, "who": "x"}, "human_judgements[0].who", "unknown field"),
    ({"answer": "a", "scores": {"relevance": 3}, "rater": 7}, "human_judgements[0].rater", "string"),
    ("just text", "human_judgements[0]", "must be an object"),
]


@pytest.mark.parametrize(("item", "field", "why"), BAD)
def test_bad_human_judgements_name_file_line_and_field(
    tmp_path: Path, item: Any, field: str, why: str
) -> None:
    queries = copy.deepcopy(QUERIES)
    queries[2]["human_judgements"] = [item]  # line 3 of queries.jsonl
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(write_dataset(tmp_path / "d", queries=queries), human_metrics=human_metrics())
    [err] = info.value.errors
    assert (err.file, err.line, err.field) == ("queries.jsonl", 3, field)
    assert why in err.reason
    assert f"queries.jsonl:3: field '{field}'" in str(info.value)


def test_unknown_metric_lists_the_valid_ones_and_every_problem_is_reported(tmp_path: Path) -> None:
    queries = copy.deepcopy(QUERIES)
    queries[0]["human_judgements"] = {"answer": "a"}
    queries[1]["human_judgements"] = [
        {"answer": "fine", "scores": {"relevance": 4}},
        {"answer": "b", "scores": {"fluency": 2, "faithfulness": 9}},
    ]
    folder = write_dataset(tmp_path / "d", queries=queries)
    with pytest.raises(DatasetValidationError) as info:  # as the runner and `rag-ablate validate` load it
        load_dataset(folder, human_metrics=human_metrics())
    got = [(e.line, e.field) for e in info.value.errors]
    assert got == [
        (1, "human_judgements"),
        (2, "human_judgements[1].scores.fluency"),
        (2, "human_judgements[1].scores.faithfulness"),
    ]
    assert info.value.errors[1].reason == "unknown metric; valid: faithfulness, relevance, completeness"
    # the dataset layer alone (below the metric registry) checks only that a name is metric-shaped
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(folder)
    assert [(e.line, e.field) for e in info.value.errors] == [
        (1, "human_judgements"),
        (2, "human_judgements[1].scores.faithfulness"),
    ]
    queries[1]["human_judgements"] = [{"answer": "b", "scores": {"Fluency!": 2}}]
    queries[0].pop("human_judgements")
    with pytest.raises(DatasetValidationError) as info:
        load_dataset(write_dataset(tmp_path / "e", queries=queries))
    assert [(e.field, e.reason) for e in info.value.errors] == [
        ("human_judgements[0].scores.Fluency!", "not a metric name (lower snake case)")
    ]


def test_reference_contexts_are_the_relevant_documents_highest_grade_first(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "d"))
    by_id = {q.query_id: q for q in ds.queries}
    ctx = reference_contexts(by_id["q2"], ds.documents)  # relevant {"FEES": 2, "RET": 1}
    assert [(c.n, c.doc_id) for c in ctx] == [(1, "FEES"), (2, "RET")]
    fees = next(d for d in DOCS if d["doc_id"] == "FEES")
    assert ctx[0].text == fees["text"] and (ctx[0].start, ctx[0].end) == (0, len(fees["text"]))
    assert reference_contexts(by_id["q5"], ds.documents) == []  # unanswerable: no gold passages


# --------------------------------------------------------------------------- a calibration run

QUESTION = {q["query_id"]: q["query"] for q in QUERIES}
# what the (fake) judge answers for each human-judged answer: faithfulness, relevance, completeness;
# "high" is not a score: that judgement fails, after its repair too (a judge error)
JUDGE: dict[tuple[str, str], tuple[Any, int, int]] = {
    ("q1", "You have 30 days from delivery to return an item."): (5, 5, 5),
    ("q1", "Returns are accepted within 14 days."): (2, 4, 1),
    ("q1", "Refunds reach your card within 5 business days."): (5, 3, 0),
    ("q1", "The documents do not answer this question."): (5, 1, 1),
    ("q2", "If the item is faulty, the shop pays the return shipping."): (5, 5, 0),
    ("q2", "You always pay 6 dollars for return shipping."): ("high", 2, 0),
    ("q2", "Shipping takes 3 to 5 business days."): (3, 0, 0),
    ("q3", "Express shipping arrives the next day if you order before noon."): (5, 5, 0),
    ("q3", "Express shipping takes two weeks."): (0, 4, 0),
    ("q3", "Express delivery is fast."): (2, 3, 0),
    ("q4", "No, accidental damage such as water is not covered by the warranty."): (5, 5, 0),
    ("q4", "Yes, water damage is covered for one year."): (0, 3, 0),
    ("q4", "Electronics have a one year warranty."): (5, 3, 0),
    ("q5", "The documents do not answer this question."): (5, 4, 0),
    ("q5", "Yes, we ship to Mars within two weeks."): (0, 1, 0),
}


def fake_judge_reply(body: dict[str, Any], call: int) -> str:
    """The judge's JSON for a pointwise prompt (the first user message; a repair repeats it)."""
    prompt = body["messages"][0]["content"]
    question = prompt.split("Question:\n", 1)[1].split("\n", 1)[0]
    found = re.search(r"Answer to grade[^\n]*\n(.*?)\n\nCited pairs", prompt, re.S)
    assert found, prompt
    qid = next((q for q, text in QUESTION.items() if text == question), "")
    f, r, c = JUDGE.get((qid, found.group(1).strip()), (4, 4, 4))  # the run's own answers: 4s
    return json.dumps({"faithfulness": f, "relevance": r, "completeness": c, "refusal": False})


def expected_pairs(metric: str) -> tuple[list[int], list[int], int, int]:
    """(human, judge) scores of every human judgement from the two tables; judge errors; not asked."""
    col = JUDGE_METRICS.index(metric)
    human: list[int] = []
    judge: list[int] = []
    errors = not_asked = 0
    for qid, items in HUMAN.items():
        for h in items:
            if metric not in h["scores"]:
                continue
            j = JUDGE[(qid, h["answer"])][col]
            if metric == "completeness" and qid != "q1":  # only q1 has a reference answer
                not_asked += 1
            elif not isinstance(j, int):
                errors += 1
            else:
                human.append(h["scores"][metric])
                judge.append(j)
    return human, judge, errors, not_asked


def composed(*overrides: str) -> RunConfig:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_settings(compose("config", overrides=normalize_overrides(list(overrides))))


def judged_dataset(tmp_path: Path) -> Path:
    queries = judged_queries()
    # a completeness score on a query without reference answers: the judge is not asked it
    queries[2]["human_judgements"][0]["scores"]["completeness"] = 5
    return write_dataset(tmp_path / "judged", queries=queries)


def test_hand_checked_agreement_numbers() -> None:
    human, judge, errors, _ = expected_pairs("faithfulness")
    # pairs: (5,5) (5,5) (1,2) (5,5) (3,5) (5,5) [error] (4,3) (5,5) (0,0) (4,2) (5,5) (0,0) (5,5) (5,5) (0,0)
    assert (len(human), errors) == (15, 1)
    a = agreement("faithfulness", human, judge)
    assert (a.exact, a.within1) == (pytest.approx(11 / 15), pytest.approx(13 / 15))


def test_calibration_run_against_the_fake_judge_server(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.respond = fake_judge_reply
    path = judged_dataset(tmp_path)
    s = composed(
        f"dataset.path={path}",
        "judge=openai",
        f"judge.base_url={fake_llm.url}",
        "judge.model=fake-judge",
        "judge.concurrency=3",
    )
    ds = load_dataset(path)
    cache = Cache(tmp_path / "cache")
    repeat = {"judge/faithfulness/agreement_exact": 0.9, "judge/faithfulness/agreement_within1": 1.0}
    job = tmp_path / "job"
    metrics = run_calibration(s, ds, cache, repeat, job, echo=False)

    # each distinct answer judged once: 15 answers (q1's first answer has two raters), one repair
    assert len(fake_llm.requests) == 15 + 1
    # the judge saw the query's gold passages and reference answers, no citation pairs
    q2_prompt = next(
        b["messages"][0]["content"]
        for b in fake_llm.bodies()
        if "shop pays the return" in b["messages"][0]["content"]
    )
    fees = next(d["text"] for d in DOCS if d["doc_id"] == "FEES")
    assert fees in q2_prompt and "Cited pairs" in q2_prompt

    data = json.loads((job / JUDGE_CALIBRATION_JSON).read_text(encoding="utf-8"))
    assert (data["model"], data["n_judgements"], data["n_answers"]) == ("fake-judge", N_HUMAN, 15)
    for metric in human_metrics():
        human, judge, errors, not_asked = expected_pairs(metric)
        if metric == "completeness":
            not_asked += 1  # the score added by judged_dataset
        got = data["metrics"][metric]
        assert (got["n"], got["judge_errors"], got["not_judged"]) == (len(human), errors, not_asked)
        assert got["exact"] == pytest.approx(
            sum(h == j for h, j in zip(human, judge, strict=True)) / len(human)
        )
        assert got["within1"] == pytest.approx(
            sum(abs(h - j) <= 1 for h, j in zip(human, judge, strict=True)) / len(human)
        )
        assert got["kappa"] == pytest.approx(sk_kappa(human, judge))
        assert metrics[f"judge/{metric}/human_kappa"] == pytest.approx(got["kappa"])
        assert metrics[f"judge/{metric}/human_exact"] == got["exact"]
        assert metrics[f"judge/{metric}/human_within1"] == got["within1"]
        assert metrics[f"judge/{metric}/human_n"] == len(human)
    # the judge's repeat agreement sits next to the human agreement
    assert data["metrics"]["faithfulness"]["repeat"] == {"agreement_exact": 0.9, "agreement_within1": 1.0}
    failed = [i for i in data["items"] if i["errors"]]
    assert [(i["query_id"], list(i["errors"])) for i in failed] == [("q2", ["faithfulness"])]
    assert "not an integer 0-5" in failed[0]["errors"]["faithfulness"]
    md = (job / JUDGE_CALIBRATION_MD).read_text(encoding="utf-8")
    assert "| faithfulness | 15 |" in md and "| completeness | 5 |" in md

    # a second calibration costs nothing: every judgement comes from the model-call cache
    before = len(fake_llm.requests)
    assert run_calibration(s, ds, cache, repeat, tmp_path / "again", echo=False) == metrics
    assert len(fake_llm.requests) == before


def test_no_calibration_without_a_pointwise_judge_or_human_judgements(
    fake_llm: FakeLLM, tmp_path: Path
) -> None:
    path = judged_dataset(tmp_path)
    ds = load_dataset(path)
    for overrides in (
        ["judge=none"],
        ["judge=openai", f"judge.base_url={fake_llm.url}", "judge.mode=pairwise"],
    ):
        assert run_calibration(composed(*overrides), ds, None, {}, tmp_path / "j", echo=False) == {}
    plain = load_dataset(write_dataset(tmp_path / "plain"))
    s = composed("judge=openai", f"judge.base_url={fake_llm.url}")
    assert run_calibration(s, plain, None, {}, tmp_path / "j", echo=False) == {}
    assert not (tmp_path / "j").exists() and fake_llm.requests == []


@pytest.mark.slow
def test_a_judged_run_writes_and_logs_the_calibration(fake_llm: FakeLLM, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    fake_llm.respond = fake_judge_reply
    out = tmp_path / "outputs"
    args = [
        f"dataset.path={judged_dataset(tmp_path)}",
        "generator=extractive",
        "judge=openai",
        f"judge.base_url={fake_llm.url}",
        "judge.model=m",
        "judge.repeats=2",
        f"paths.output_root={out}",
        "progress=false",
    ]
    proc = run_module("rag_ablate", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "judge vs human: faithfulness n=15" in proc.stdout
    (records,) = [p for p in out.rglob(RECORDS_FILE) if "mlartifacts" not in p.parts]
    job = records.parent
    data = json.loads((job / JUDGE_CALIBRATION_JSON).read_text(encoding="utf-8"))
    assert data["repeats"] == 2 and data["metrics"]["faithfulness"]["n"] == 15
    # the run's own repeat agreement (the fake judge is deterministic: its repeats always agree)
    assert data["metrics"]["faithfulness"]["repeat"]["agreement_exact"] == 1.0
    on_disk = json.loads((job / "metrics.json").read_text(encoding="utf-8"))
    run_id = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    logged = client.get_run(run_id).data.metrics
    for key in ("human_kappa", "human_exact", "human_within1", "human_n"):
        assert logged[f"judge/faithfulness/{key}"] == pytest.approx(on_disk[f"judge/faithfulness/{key}"])
    assert logged["judge/faithfulness/human_kappa"] == pytest.approx(data["metrics"]["faithfulness"]["kappa"])
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {JUDGE_CALIBRATION_JSON, JUDGE_CALIBRATION_MD} <= artifacts


@pytest.mark.slow
def test_a_calibration_that_fails_ends_the_run_non_zero_after_logging(
    fake_llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibration step itself breaking (not a judge error, which is recorded per item) must not
    pass silently: everything else is written and logged, the run is FAILED, the exit code 2."""
    from mlflow.tracking import MlflowClient

    import rag_ablate.judges.calibration as calibration
    from tests.conftest import run_in_process

    def boom(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("calibration exploded")

    monkeypatch.setattr(calibration, "calibrate", boom)
    fake_llm.respond = fake_judge_reply
    out = tmp_path / "outputs"
    args = [
        f"dataset.path={judged_dataset(tmp_path)}",
        "generator=extractive",
        "judge=openai",
        f"judge.base_url={fake_llm.url}",
        "judge.model=m",
        f"paths.output_root={out}",
        "progress=false",
    ]
    proc = run_in_process(args, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("rag_ablate: error:")]
    assert "judge calibration" in line and "RuntimeError: calibration exploded" in line
    (records,) = [p for p in out.rglob(RECORDS_FILE) if "mlartifacts" not in p.parts]
    job = records.parent
    assert (job / "metrics.json").is_file() and (job / "summary.json").is_file()
    run_id = json.loads((job / RUN_FILE).read_text(encoding="utf-8"))["run_id"]
    run = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}").get_run(run_id)
    assert run.info.status == "FAILED"
    assert "all/faithfulness" in run.data.metrics or any(
        k.endswith("/faithfulness") for k in run.data.metrics
    )
