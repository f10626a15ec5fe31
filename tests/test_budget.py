"""cost.max_usd: a run stops before it spends more than its limit, keeps what it did, and resumes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import ModelPrice, RunConfig
from rag_ablate.core.errors import RunStopError
from rag_ablate.run.budget import SpendLimitError, SpendMeter
from rag_ablate.settings import validate
from tests.conftest import run_module
from tests.fake_llm import FakeLLM

PRICE = ModelPrice(prompt=10_000.0, completion=0.0)  # USD per 1M tokens: a cent a prompt token


def _rec(prompt_tokens: int, *, cached: bool = False, judge: list[dict[str, Any]] | None = None) -> Any:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 3}
    rec: dict[str, Any] = {"usage": usage, "cached": cached}
    if judge is not None:
        rec["judge"] = {"repeats": judge}
    return rec


def test_the_meter_stops_before_a_query_as_costly_as_the_costliest_could_pass_the_limit() -> None:
    meter = SpendMeter(1.0, PRICE, None)
    meter.check()  # nothing spent yet
    meter.charge_record(_rec(30))  # $0.30
    meter.charge_record(_rec(40))  # $0.40: 0.70 spent, the costliest 0.40 would make 1.10
    with pytest.raises(SpendLimitError, match=r"cost.max_usd=1 reached: this run spent \$0.7000") as err:
        meter.check()
    assert isinstance(err.value, RunStopError)  # every place that fails a query lets it through
    assert "resume" in str(err.value)


def test_replayed_calls_and_unpriced_tokens_cost_nothing_and_the_judge_is_charged_at_its_price() -> None:
    meter = SpendMeter(1.0, PRICE, ModelPrice(prompt=1_000_000.0, completion=0.0))
    meter.charge_record(_rec(90, cached=True))  # replayed from the cache: free
    assert meter.spent_usd == 0.0
    judged = _rec(
        0,
        cached=True,
        judge=[
            {"usage": {"prompt_tokens": 2, "completion_tokens": 1}, "cached": False},  # $2 at $1 a token
            {"usage": {"prompt_tokens": 5, "completion_tokens": 1}, "cached": True},  # replayed: free
        ],
    )
    meter.charge_judgement(judged)
    assert meter.spent_usd == pytest.approx(2.0)
    with pytest.raises(SpendLimitError):
        meter.check()
    unpriced = SpendMeter(1.0, None, None)
    unpriced.charge_record(_rec(10_000))
    unpriced.check()


def test_a_limit_with_no_price_to_count_is_refused() -> None:
    s = RunConfig()
    s.cost.max_usd = 1.0
    with pytest.raises(Exception, match=r"cost\.max_usd=1 has nothing to count"):
        validate(s)


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.slow
def test_a_run_stops_at_its_spend_limit_keeps_its_records_and_resume_finishes_it(
    fake_llm: FakeLLM, tiny_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "outputs"
    args = [
        f"dataset.path={tiny_dataset}",
        "generator=openai",
        f"generator.base_url={fake_llm.url}",
        "generator.model=m",
        "cost.model=m",
        "+cost.prices={m: {prompt: 10000.0, completion: 0.0}}",
        "cost.max_usd=4",
        f"paths.output_root={out}",
        "progress=false",
    ]
    proc = run_module("rag_ablate", args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cost.max_usd=4 reached" in proc.stdout + proc.stderr
    (run_dir,) = (out / "runs").iterdir()
    kept = _records(run_dir)
    n_queries = len((tiny_dataset / "queries.jsonl").read_text(encoding="utf-8").splitlines())
    # it stopped part way, after the queries it had paid for, and none of them is recorded as failed
    assert 1 <= len(kept) < n_queries
    assert all(r["status"] == "ok" for r in kept)
    spent = [r["usage"]["prompt_tokens"] * 0.01 for r in kept]  # completion tokens are free here
    assert sum(spent) <= 4.0 + max(spent)  # at most one query's worth past the limit
    assert sum(spent) + max(spent) > 4.0  # and it stopped because the next one could pass it
    assert len(fake_llm.requests) == len(kept)  # nothing was asked and thrown away
    with sqlite3.connect(out / "mlflow.db") as db:
        (status,) = db.execute("SELECT status FROM runs").fetchone()
    assert status == "FAILED"

    # a higher limit and resume= finish the same run: only the missing queries are asked
    resume = [f"resume={run_dir}", "cost.max_usd=1000", "progress=false"]
    again = run_module("rag_ablate", resume, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    done = _records(run_dir)
    assert len(done) == n_queries and all(r["status"] == "ok" for r in done)
    assert len(fake_llm.requests) == n_queries
    with sqlite3.connect(out / "mlflow.db") as db:
        assert db.execute("SELECT status FROM runs").fetchall() == [("FINISHED",)]


@pytest.mark.slow
def test_the_plan_says_how_many_model_calls_and_how_much_money_before_anything_runs(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    n = len((tiny_dataset / "queries.jsonl").read_text(encoding="utf-8").splitlines())
    args = [
        "-m",
        "chunk=128,256",
        f"dataset.path={tiny_dataset}",
        "generator=openai",
        "generator.base_url=http://127.0.0.1:9/v1",  # nothing listens: a dry run calls nothing
        "generator.model=g",
        "judge=openai",
        "judge.base_url=http://127.0.0.1:9/v1",
        "judge.model=j",
        "judge.repeats=2",
        "cost.model=g",
        "+cost.prices={g: {prompt: 1.0, completion: 2.0}}",  # the judge's model has no price
        "cost.max_usd=5",
        "ablation.dry_run=true",
        f"paths.output_root={tmp_path / 'outputs'}",
        "progress=false",
    ]
    proc = run_module("rag_ablate", args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    for label in ("baseline", "chunk=128"):
        (gen,) = [x for x in lines if x.startswith(f"  {label}: generator ")]
        assert f"generator {n} call(s)" in gen and "$" in gen
        (judge,) = [x for x in lines if x.startswith(f"  {label}: judge ")]
        assert f"judge {2 * n} call(s)" in judge and "unpriced" in judge
    (total,) = [x for x in lines if x.startswith("  sweep: ")]
    # 3 jobs (the baseline, 128, 256), each n generator and 2n judge calls
    assert f"sweep: {3 * 3 * n} model call(s), $" in total and "cost.max_usd=5" in total
    assert not (tmp_path / "outputs" / "mlflow.db").exists()
