"""Pairwise judging in the comparison step (judge.mode=pairwise): outcomes, counts, net win rate.

Fake judges answer both orders the way a real one would be asked (``Answer 1`` is the answer shown
first): one prefers the longer answer (both orders agree), one always picks position 1 (pure
position bias: every query inconsistent, so no wins and no losses), one fails on some queries
(judge errors, counted apart, never ties). The end-to-end test runs the real OpenAI judge against
the fake server of tests/fake_llm.py through ``run_comparison``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rag_ablate.compare import stats
from rag_ablate.compare.model import Comparison, PairwiseQuery, VariantData
from rag_ablate.compare.pairwise import outcome_of, pairwise_section, run_pairwise, summarise
from rag_ablate.compare.render import format_markdown, format_terminal, write_outputs
from rag_ablate.compare.run import Source, run_comparison
from rag_ablate.config.overrides import CONF_DIR
from rag_ablate.config.schema import CompareConfig, register_configs
from rag_ablate.core.errors import GenerationError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.judges import JudgeInput
from tests.conftest import run_module, write_dataset
from tests.fake_llm import FakeLLM

B = 2000
register_configs()


def config(*overrides: str) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


class FakeJudge:
    """Asks ``pick(answer_1, answer_2)`` -> "1" | "2" | "tie" | None in both orders, as the contract
    describes (A = the baseline's answer, B = the variant's)."""

    model = "fake-judge"
    prompt_hash = "0123456789abcdef"
    repeats = 1
    mode = "pairwise"

    def __init__(self, pick: Callable[[str, str, str], str | None]) -> None:
        self.pick = pick
        self.calls: list[tuple[str, str, str]] = []
        self.closed = False

    def judge(self, inp: JudgeInput) -> dict[str, Any]:
        raise AssertionError("pairwise mode never asks for pointwise scores")

    def pairwise(self, inp_a: JudgeInput, answer_b: str) -> dict[str, Any]:
        orders = []
        for first in ("a", "b"):
            one, two = (inp_a.answer, answer_b) if first == "a" else (answer_b, inp_a.answer)
            self.calls.append((inp_a.query_id, one, two))
            got = self.pick(inp_a.query_id, one, two)
            second = "b" if first == "a" else "a"
            verdict = {"1": first, "2": second, "tie": "tie"}.get(got or "")
            orders.append({"first": first, "verdict": verdict, "error": None if verdict else "HTTP 500"})
        vs = [o["verdict"] for o in orders]
        winner = None if None in vs else (vs[0] if vs[0] == vs[1] else "tie")
        return {"winner": winner, "orders": orders, "consistent": None if winner is None else vs[0] == vs[1]}

    def close(self) -> None:
        self.closed = True


def longer(_q: str, one: str, two: str) -> str:
    return "tie" if len(one) == len(two) else ("1" if len(one) > len(two) else "2")


def position_one(_q: str, _one: str, _two: str) -> str:
    return "1"


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return load_dataset(write_dataset(tmp_path / "tiny"))


def records(
    ds: Dataset, answers: dict[str, str | None], failed: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    out = []
    for q in ds.queries:
        rec: dict[str, Any] = {
            "query_id": q.query_id,
            "query": q.query,
            "split": q.split,
            "group": q.group,
            "status": "failed" if q.query_id in failed else "ok",
        }
        if q.query_id in answers:
            rec["answer"] = answers[q.query_id]
        out.append(rec)
    return out


BASE_ANSWERS: dict[str, str | None] = {
    "q1": "30 days.",
    "q2": "The shop pays when the item is faulty.",
    "q3": "Next day.",
    "q4": "No, water damage is not covered.",
    "q5": "We do not ship there.",
    "q6": "Hello!",
    "q7": "It is on its way.",
    "q8": "It should arrive soon.",
}
# longer than the baseline on q1, q3, q7, q8; shorter on q2, q4; as long on q5; no answer on q6
VAR_ANSWERS: dict[str, str | None] = {
    "q1": "You can return items within 30 days of delivery.",
    "q2": "We pay.",
    "q3": "Express shipping arrives the next day before noon.",
    "q4": "Not covered.",
    "q5": "We do not ship THERE.",
    "q6": None,
    "q7": "Standard shipping takes 3 to 5 business days.",
    "q8": "Standard shipping takes 3 to 5 business days, express the next day.",
}


def comparison(splits: list[str]) -> Comparison:
    return Comparison("baseline", ["longer"], [], splits, B, 7, 0.05, [], {})


def variants(ds: Dataset, *overrides: str) -> list[VariantData]:
    """The baseline and one variant; their config asks for the pairwise judge unless ``overrides``
    say otherwise (the judge itself is the test's fake, given to run_pairwise)."""
    cfg = config(*(overrides or ("judge=openai", "judge.mode=pairwise")))
    return [
        VariantData("baseline", records(ds, BASE_ANSWERS), config=cfg),
        VariantData("longer", records(ds, VAR_ANSWERS, failed=("q4",)), config=cfg),
    ]


def run(ds: Dataset, judge: FakeJudge, splits: list[str]) -> tuple[Comparison, list[Any]]:
    c = comparison(splits)
    report = run_pairwise(variants(ds), c, judge_factory=lambda s: judge, dataset_factory=lambda s: ds)
    assert report is not None
    return c, report.results


def expected_outcomes(ds: Dataset, split: str) -> dict[str, int]:
    """The longer answer wins; q4 failed in the variant and q6 has no variant answer: not pairs."""
    out = {}
    for q in ds.queries:
        if q.split != split or q.query_id in ("q4", "q6"):
            continue
        a, b = BASE_ANSWERS[q.query_id] or "", VAR_ANSWERS[q.query_id] or ""
        out[q.query_id] = (len(b) > len(a)) - (len(b) < len(a))
    return out


def test_longer_answer_judge_both_orders_agree(dataset: Dataset) -> None:
    judge = FakeJudge(longer)
    _, results = run(dataset, judge, ["dev", "holdout"])
    assert judge.closed
    for r in results:
        exp = expected_outcomes(dataset, r.split)
        assert {q.query_id: q.outcome for q in r.queries} == exp
        assert r.n_pairs == r.n == len(exp)
        assert (r.wins, r.losses) == (sum(v == 1 for v in exp.values()), sum(v == -1 for v in exp.values()))
        assert r.ties == sum(v == 0 for v in exp.values()) and r.inconsistent == 0 and r.errors == 0
        if r.n:
            assert r.net_win_rate == pytest.approx((r.wins - r.losses) / r.n)
            assert r.inconsistent_share == 0.0
            # a judge without position bias picks the first position in half of the decided orders
            if r.wins + r.losses:
                assert r.first_position_share == 0.5
            else:
                assert math.isnan(r.first_position_share)
            assert r.ci_low <= r.net_win_rate <= r.ci_high
    # every pair judged twice, positions swapped; the variant's answer hidden behind "Answer 1/2" order
    judged = {q for r in results for q in (x.query_id for x in r.queries)}
    assert len(judge.calls) == 2 * len(judged)
    assert judged == {"q1", "q2", "q3", "q5", "q7", "q8"}


def test_net_win_rate_interval_is_the_group_bootstrap_of_the_outcomes() -> None:
    # 6 queries, q7 and q8 one group: outcomes +1 +1 -1 0 +1 +1
    rows = [
        PairwiseQuery(q, g, o, ["b", "b"], ["a", "b"], True)
        for q, g, o in [("q1", "g1", 1), ("q2", "g2", 1), ("q3", "g3", -1), ("q5", "g5", 0), ("q7", "t", 1)]
    ]
    rows.append(PairwiseQuery("q8", "t", 1, ["b", "b"], ["a", "b"], True))
    r = summarise("dev", "v", rows, B=B, seed=3, alpha=0.05)
    assert (r.wins, r.losses, r.ties, r.n, r.n_groups) == (4, 1, 1, 6, 5)
    assert r.net_win_rate == pytest.approx(3 / 6)
    x = np.array([1.0, 1, -1, 0, 1, 1])
    ref = stats.paired_test(
        np.zeros(6),
        x,
        np.array(["g1", "g2", "g3", "g5", "t", "t"]),
        B=B,
        seed=stats.derive_seed(3, "pairwise", "dev", "v"),
    )
    assert (r.ci_low, r.ci_high) == (float(ref.boot_ci_low[0]), float(ref.boot_ci_high[0]))
    assert r.p_value == float(ref.p_value[0])
    # all wins: the net win rate is 1 with a degenerate interval
    wins = summarise(
        "dev",
        "v",
        [PairwiseQuery(f"q{i}", f"g{i}", 1, [], [], True) for i in range(5)],
        B=B,
        seed=0,
        alpha=0.05,
    )
    assert (wins.net_win_rate, wins.ci_low, wins.ci_high) == (1.0, 1.0, 1.0)


def test_position_one_judge_is_all_inconsistent_and_never_wins(dataset: Dataset) -> None:
    _, results = run(dataset, FakeJudge(position_one), ["dev", "holdout"])
    total = 0
    for r in results:
        total += r.n
        assert r.wins == r.losses == r.ties == r.errors == 0
        assert r.inconsistent == r.n == len(expected_outcomes(dataset, r.split))
        if r.n:
            assert r.net_win_rate == 0.0 and r.inconsistent_share == 1.0
            assert r.first_position_share == 1.0  # the bias, measured
            assert all(q.outcome == 0 and q.consistent is False for q in r.queries)
    assert total == 6


def test_judge_errors_are_counted_and_listed_never_ties(dataset: Dataset) -> None:
    def flaky(q: str, one: str, two: str) -> str | None:
        return None if q in ("q1", "q7") else longer(q, one, two)

    class Raising(FakeJudge):
        def pairwise(self, inp_a: JudgeInput, answer_b: str) -> dict[str, Any]:
            if inp_a.query_id == "q3":
                raise GenerationError("failed", "judge: HTTP 503 after 3 retries", 503)
            return super().pairwise(inp_a, answer_b)

    _, results = run(dataset, Raising(flaky), ["dev", "holdout"])
    errors = {e["query_id"]: e["error"] for r in results for e in r.error_queries}
    assert set(errors) == {"q1", "q7", "q3"}
    assert "HTTP 503" in errors["q3"] and "HTTP 500" in errors["q1"]
    for r in results:
        exp = {q: o for q, o in expected_outcomes(dataset, r.split).items() if q not in errors}
        assert r.errors == sum(1 for e in r.error_queries)
        assert r.n == len(exp) and r.n_pairs == r.n + r.errors
        assert r.ties == sum(v == 0 for v in exp.values())  # errors are not ties
        assert r.wins + r.losses + r.ties + r.inconsistent == r.n


def test_all_errors_give_a_note_and_no_numbers() -> None:
    rows = [PairwiseQuery("q1", "g", None, [None, None], ["a", "b"], None, "HTTP 500")]
    r = summarise("dev", "v", rows, B=B, seed=0, alpha=0.05)
    assert (r.n, r.errors, r.note) == (0, 1, "all 1 judgements failed")
    assert math.isnan(r.net_win_rate)
    empty = summarise("dev", "v", [], B=B, seed=0, alpha=0.05)
    assert empty.note == "no query ok with an answer on both sides"


def test_outcome_of_reads_the_orders() -> None:
    def v(x: str | None, y: str | None) -> dict[str, Any]:
        return {"orders": [{"first": "a", "verdict": x}, {"first": "b", "verdict": y}]}

    assert outcome_of(v("b", "b")).outcome == 1
    assert outcome_of(v("a", "a")).outcome == -1
    assert (outcome_of(v("tie", "tie")).outcome, outcome_of(v("tie", "tie")).consistent) == (0, True)
    assert (outcome_of(v("a", "tie")).outcome, outcome_of(v("a", "tie")).consistent) == (0, False)
    assert outcome_of(v("a", None)).outcome is None
    assert outcome_of({"orders": []}).error == "the judge returned no orders"


def test_pointwise_or_no_judge_runs_nothing(dataset: Dataset) -> None:
    def never(s: Any) -> FakeJudge:
        raise AssertionError("no judge should be built")

    for overrides in (["judge=openai"], ["judge=none"], ["judge=none", "judge.mode=pairwise"]):
        vs = variants(dataset, *overrides)
        assert run_pairwise(vs, comparison(["dev"]), judge_factory=never) is None


def test_a_pairwise_step_that_cannot_run_leaves_a_note(dataset: Dataset) -> None:
    vs = variants(dataset, "judge=openai", "judge.mode=pairwise", "judge.base_url=null")  # invalid
    c = comparison(["dev"])
    assert pairwise_section(vs, c) is None
    assert any(n.startswith("pairwise judge not run:") and "judge" in n for n in c.notes)


def test_rendered_in_comparison_json_md_and_terminal(dataset: Dataset, tmp_path: Path) -> None:
    c = comparison(["dev", "holdout"])
    c.pairwise = run_pairwise(
        variants(dataset), c, judge_factory=lambda s: FakeJudge(longer), dataset_factory=lambda s: dataset
    )
    write_outputs(c, tmp_path)
    data = json.loads((tmp_path / "comparison.json").read_text(encoding="utf-8"))
    pw = data["pairwise"]
    assert pw["model"] == "fake-judge" and [r["split"] for r in pw["results"]] == ["dev", "holdout"]
    assert sum(r["wins"] for r in pw["results"]) == 4 and sum(r["losses"] for r in pw["results"]) == 1
    md = (tmp_path / "comparison.md").read_text(encoding="utf-8")
    assert "## Pairwise judge" in md and "| dev | longer |" in md
    assert md == format_markdown(c)
    term = format_terminal(c)
    assert "pairwise judge fake-judge" in term and "net win rate" in term


# --------------------------------------------------------------------------- the real judge, end to end


def answers_in(prompt: str) -> tuple[str, str]:
    found = re.search(r"Answer 1:\n(.*?)\n\nAnswer 2:\n(.*?)\n\nReply", prompt, re.S)
    assert found, prompt
    return found.group(1).strip(), found.group(2).strip()


@pytest.mark.parametrize("bias", [False, True])
def test_run_comparison_with_the_openai_judge(
    fake_llm: FakeLLM, dataset: Dataset, tmp_path: Path, bias: bool
) -> None:
    def reply(body: dict[str, Any], call: int) -> str:
        prompt = body["messages"][0]["content"]
        one, two = answers_in(prompt)
        if "Next day." in (one, two):  # q3: an unusable reply, and again after the repair
            return "the first one, clearly"
        winner = "1" if bias else longer("", one, two)
        return json.dumps({"winner": winner})

    fake_llm.respond = reply
    cfg = config(
        "judge=openai",
        "judge.mode=pairwise",
        f"judge.base_url={fake_llm.url}",
        "judge.model=fake-judge",
        "judge.concurrency=3",
        f"dataset.path={dataset.path}",
        f"cache.dir={tmp_path / 'cache'}",
    )
    vs = [
        VariantData("baseline", records(dataset, BASE_ANSWERS), config=cfg, info={"role": "baseline"}),
        VariantData("longer", records(dataset, VAR_ANSWERS, failed=("q4",)), config=cfg),
    ]
    settings = CompareConfig(metrics=["error_rate"], B=B)
    lines: list[str] = []
    out = tmp_path / "cmp"
    res = run_comparison(Source(vs, out), settings, guard=False, echo=lines.append)
    report = res.comparison.pairwise
    assert report is not None and report.model == "fake-judge"
    results = {r.split: r for r in report.results}
    errors = [e["query_id"] for r in report.results for e in r.error_queries]
    assert errors == ["q3"]  # a judge error, never a tie
    for split, r in results.items():
        exp = {q: o for q, o in expected_outcomes(dataset, split).items() if q != "q3"}
        assert r.n == len(exp) and r.errors == (1 if dataset_split(dataset, "q3") == split else 0)
        if bias:  # position 1 always: every query inconsistent, no wins, no losses
            assert (r.wins, r.losses, r.ties, r.inconsistent) == (0, 0, 0, r.n)
        else:
            assert {q.query_id: q.outcome for q in r.queries if q.outcome is not None} == exp
            assert r.inconsistent == 0
    # two orders per pair and one repair per failed order (q3: both orders)
    n_pairs = sum(r.n_pairs for r in report.results)
    assert len(fake_llm.requests) == 2 * n_pairs + 2
    # the variant's name never reaches the judge
    assert not any("longer" in b["messages"][0]["content"] for b in fake_llm.bodies())
    data = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    assert [r["errors"] for r in data["pairwise"]["results"]] == [r.errors for r in report.results]
    # read back from comparison.json, the pairwise section is the same typed report
    back = Comparison.from_dict(data).pairwise
    assert back is not None and back.to_dict() == report.to_dict()
    assert "## Pairwise judge" in (out / "comparison.md").read_text(encoding="utf-8")
    assert any("pairwise judge fake-judge" in line for line in lines)
    # rerunning the comparison costs nothing: the judgements come from the model-call cache
    before = len(fake_llm.requests)
    again = run_comparison(Source(vs, out), settings, guard=False, echo=lines.append)
    assert len(fake_llm.requests) == before
    assert again.comparison.pairwise is not None
    assert [asdict(r) for r in again.comparison.pairwise.results] == [asdict(r) for r in report.results]


def dataset_split(ds: Dataset, qid: str) -> str:
    return next(q.split for q in ds.queries if q.query_id == qid)


@pytest.mark.slow
def test_a_pairwise_sweep_end_to_end(fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path) -> None:
    def reply(body: dict[str, Any], call: int) -> str:
        prompt = body["messages"][0]["content"]
        assert "Answer 1:" in prompt, "pairwise mode never asks for pointwise scores"
        return json.dumps({"winner": longer("", *answers_in(prompt))})

    fake_llm.respond = reply
    out = tmp_path / "outputs"
    args = [
        "-m",
        "generator.max_sentences=1,2",
        f"dataset.path={tiny_dataset}",
        "generator=extractive",
        "judge=openai",
        "judge.mode=pairwise",
        f"judge.base_url={fake_llm.url}",
        "judge.model=m",
        f"paths.output_root={out}",
        "progress=false",
    ]
    proc = run_module("rag_ablate", args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pairwise judge m" in proc.stdout
    (path,) = [p for p in out.rglob("comparison.json") if "mlartifacts" not in p.parts]
    pw = json.loads(path.read_text(encoding="utf-8"))["pairwise"]
    assert pw["model"] == "m" and {r["variant"] for r in pw["results"]} == {"generator.max_sentences=1"}
    judged = sum(r["n"] for r in pw["results"])
    assert judged > 0 and sum(r["errors"] for r in pw["results"]) == 0
    identical = sum(r["identical"] for r in pw["results"])
    # both orders of every pair whose answers differ; nothing else is asked of the judge
    assert len(fake_llm.requests) == 2 * (judged - identical)
    assert identical < judged  # one sentence instead of two changes some answers
    for r in pw["results"]:
        assert r["wins"] + r["losses"] + r["ties"] + r["inconsistent"] == r["n"]
        outcomes = [q["outcome"] for q in r["queries"]]
        assert r["net_win_rate"] == pytest.approx(sum(outcomes) / len(outcomes))
    assert "## Pairwise judge" in path.with_name("comparison.md").read_text(encoding="utf-8")


def test_identical_answers_are_ties_without_asking_the_judge(dataset: Dataset) -> None:
    judge = FakeJudge(position_one)  # would call every asked pair inconsistent
    c = comparison(["dev", "holdout"])
    same = {**VAR_ANSWERS, "q1": BASE_ANSWERS["q1"], "q2": " " + str(BASE_ANSWERS["q2"]) + "\n"}
    vs = variants(dataset)
    vs[1] = VariantData("longer", records(dataset, same, failed=("q4",)), config=vs[1].config)
    report = run_pairwise(vs, c, judge_factory=lambda s: judge, dataset_factory=lambda s: dataset)
    assert report is not None
    rows = {q.query_id: q for r in report.results for q in r.queries}
    assert rows["q1"].identical and rows["q2"].identical and rows["q1"].outcome == 0
    assert {q for q, _, _ in judge.calls} == {"q3", "q5", "q7", "q8"}
    assert sum(r.identical for r in report.results) == 2
    assert sum(r.ties for r in report.results) == 2 and sum(r.inconsistent for r in report.results) == 4
