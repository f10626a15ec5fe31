"""Nothing failed passes: error budgets, an endpoint that is down, and the exit codes.

* every stage with outside calls has an error budget that fails the run by default: the system's
  queries (``system.max_error_rate``, local and http alike: a generator's failure fails its query)
  and the judge's judgements (``judge.max_error_rate``); a run over one exits 1 and names the stage;
* an endpoint that refuses connections (a real closed port on 127.0.0.1) stops the run within
  seconds with one line naming its URL (the circuit breaker, :class:`rag_ablate.core.retry.Breaker`),
  for ``system=http``, ``generator=openai`` and ``judge=openai``;
* exit codes: 0 ok, 1 something failed, 2 nothing ran (usage or config error).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.errors import (
    EXIT_FAILED,
    EXIT_INVALID,
    ConfigError,
    EndpointDownError,
    ErrorRateError,
    exit_code_of,
)
from rag_ablate.core.layout import FAILURES_FILE, RECORDS_FILE
from rag_ablate.core.retry import BREAKER_LIMIT, Breaker
from rag_ablate.llm.client import ChatClient
from rag_ablate.run.runner import budget_breaches
from tests.conftest import free_port, run_in_process, run_module
from tests.fake_llm import FakeLLM

FAST = ["progress=false", "tracking=none"]


def _closed_url(path: str = "") -> str:
    """A URL on 127.0.0.1 where nothing listens: every connection is refused at once."""
    return f"http://127.0.0.1:{free_port()}{path}"


# --------------------------------------------------------------------------- the breaker


def test_the_breaker_opens_after_tries_in_a_row_that_could_not_connect_and_a_response_resets_it() -> None:
    b = Breaker("judge", "http://127.0.0.1:1/v1/chat/completions", limit=3)
    assert not b.failed("ConnectError") and not b.failed("ConnectError")
    b.succeeded()  # an answer in between: the count starts again
    assert not b.failed("ConnectError") and not b.failed("ConnectError") and not b.open
    assert b.failed("ConnectError: refused") and b.open
    assert "judge endpoint http://127.0.0.1:1/v1/chat/completions is unreachable" in b.message()
    assert "ConnectError: refused" in b.message() and "\n" not in b.message()


def test_a_chat_client_at_a_closed_port_gives_up_within_seconds_and_names_the_url() -> None:
    url = _closed_url("/v1")
    client = ChatClient(
        owner="generator", base_url=url, model="m", api_key_env=None, timeout_s=5.0, retries=10,
        backoff_s=0.05, backoff_max_s=0.2, cache=None,
    )  # fmt: skip
    t0 = time.perf_counter()
    with pytest.raises(EndpointDownError, match=f"generator endpoint {url}/chat/completions is unreachable"):
        client.complete([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=8)
    assert client.calls == BREAKER_LIMIT  # not retries + 1 = 11 tries
    with pytest.raises(EndpointDownError):  # later calls fail at once, without a request
        client.complete([{"role": "user", "content": "again"}], temperature=0.0, max_tokens=8)
    assert client.calls == BREAKER_LIMIT and time.perf_counter() - t0 < 5
    client.close()


# --------------------------------------------------------------------------- exit codes


def test_exit_codes_of_errors_nothing_ran_is_2_something_failed_is_1() -> None:
    assert exit_code_of(ConfigError("bad")) == EXIT_INVALID == 2
    assert exit_code_of(ErrorRateError("too many")) == EXIT_FAILED == 1
    assert exit_code_of(EndpointDownError("down")) == 1
    assert exit_code_of(RuntimeError("a bug")) == 1
    # every class says nothing ran (2) or something failed (1); bad input is 2 wherever it is met
    import rag_ablate.core.errors as errors
    from rag_ablate.pipeline.rerank import RerankError
    from rag_ablate.records.jsonl import RecordsError

    failed = {errors.ErrorRateError, errors.EndpointDownError, errors.JudgeCalibrationError, RerankError}
    for cls in (
        errors.DatasetError,
        errors.ConfigError,
        errors.TrackingError,
        errors.ComparisonError,
        RecordsError,
    ):
        assert cls.exit_code == 2, cls
    for cls in (*failed, errors.GenerationError):
        assert cls.exit_code == 1, cls


def test_a_config_error_exits_2(tmp_path: Path, tiny_dataset: Path) -> None:
    proc = run_in_process([f"dataset.path={tiny_dataset}", "system.max_error_rate=1.5", *FAST], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "max_error_rate must be in [0, 1]" in proc.stderr


@pytest.mark.parametrize("override", ["retrieval=nope", "retrieval.top_k=abc", "chunk.size=[1,2"])
def test_an_override_hydra_cannot_parse_or_compose_exits_2(override: str, tmp_path: Path) -> None:
    proc = run_in_process([override, *FAST], tmp_path)  # Hydra itself would exit 1
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "outputs").exists()  # nothing ran


def test_an_ok_run_exits_0(tmp_path: Path, tiny_dataset: Path) -> None:
    proc = run_in_process([f"dataset.path={tiny_dataset}", *FAST], tmp_path)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- error budgets


def _records(n_ok: int, n_failed: int, error: str = "generate: generator endpoint X: HTTP 500") -> list[Any]:
    ok = [{"query_id": f"ok{i}", "status": "ok", "error": None} for i in range(n_ok)]
    return ok + [{"query_id": f"f{i}", "status": "http_error", "error": error} for i in range(n_failed)]


def test_the_default_budgets_fail_a_run_whose_queries_or_judgements_fail() -> None:
    s = RunConfig()
    assert s.system.max_error_rate == s.judge.max_error_rate == 0.05  # the local system too, not 1.0
    # 1 of 20 failed queries is within the budget; 3 of 20 is not, and the line names the error
    assert budget_breaches(s, {"all/error_rate": 0.05}, _records(19, 1)) == []
    (line,) = budget_breaches(s, {"all/error_rate": 0.15, "all/n_status_http_error": 3.0}, _records(17, 3))
    assert "3 of 20 queries failed (http_error 3)" in line and "system.max_error_rate=0.05" in line
    assert "most common error (3x): generate: generator endpoint X: HTTP 500" in line
    # a judge whose every judgement failed: its own line, the metric and the budget named
    judged = [
        {
            "query_id": "q",
            "status": "ok",
            "judge": {"repeats": [{"errors": {"relevance": "bad_response: x"}}]},
        }
    ]
    metrics = {"judge/relevance/error_rate": 1.0, "judge/relevance/n_queries": 1.0}
    (line,) = budget_breaches(s, metrics, judged)
    assert line.startswith("judge (none, None): 1.000 of the relevance judgements of 1 answers failed")
    assert "judge.max_error_rate=0.05" in line and "bad_response: x" in line


# --------------------------------------------------------------------------- endpoints that are down


def _assert_stopped(proc: Any, url: str, elapsed: float) -> None:
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 30, elapsed  # the whole run, imports and the dataset included
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rag_ablate: error:")]
    assert len(errors) == 1 and url in errors[0] and "is unreachable" in errors[0], proc.stderr


def test_a_generator_at_a_closed_port_stops_the_run_in_seconds_exit_1(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    url = _closed_url("/v1")
    args = [
        f"dataset.path={tiny_dataset}",
        "generator=openai",
        f"generator.base_url={url}",
        "generator.model=m",
    ]
    t0 = time.perf_counter()
    proc = run_in_process([*args, "generator.backoff_s=0.05", *FAST], tmp_path)
    _assert_stopped(proc, url, time.perf_counter() - t0)
    assert "generator endpoint" in proc.stderr


def test_a_judge_at_a_closed_port_stops_the_run_in_seconds_exit_1(tmp_path: Path, tiny_dataset: Path) -> None:
    url = _closed_url("/v1")
    args = [f"dataset.path={tiny_dataset}", "generator=extractive", "judge=openai", f"judge.base_url={url}"]
    t0 = time.perf_counter()
    proc = run_in_process([*args, "judge.model=m", "judge.backoff_s=0.05", *FAST], tmp_path)
    _assert_stopped(proc, url, time.perf_counter() - t0)
    assert "judge endpoint" in proc.stderr


def test_an_http_system_at_a_closed_port_stops_the_run_in_seconds_exit_1(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    url = _closed_url()
    args = [f"dataset.path={tiny_dataset}", "system=http", f"system.base_url={url}", "system.backoff_s=0.05"]
    t0 = time.perf_counter()
    proc = run_in_process([*args, *FAST], tmp_path)
    _assert_stopped(proc, url, time.perf_counter() - t0)
    assert "system endpoint" in proc.stderr


def test_a_rerank_service_at_a_closed_port_stops_the_run_in_seconds_exit_1(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    url = _closed_url("/rerank")
    t0 = time.perf_counter()
    proc = run_in_process(
        [f"dataset.path={tiny_dataset}", "rerank=http", f"rerank.url={url}", *FAST], tmp_path
    )
    _assert_stopped(proc, url, time.perf_counter() - t0)
    assert "rerank endpoint" in proc.stderr


def test_a_local_run_whose_generator_fails_every_query_fails_by_default_exit_1(
    fake_llm: FakeLLM, tmp_path: Path, tiny_dataset: Path
) -> None:
    """The endpoint answers, with an error (400, not retried): every query fails; the local
    system's default budget (0.05, not 1.0) fails the run, and the line names the generator."""
    fake_llm.failures = [(400, {})] * 100
    args = [f"dataset.path={tiny_dataset}", "generator=openai", f"generator.base_url={fake_llm.url}"]
    proc = run_in_process([*args, "generator.model=m", *FAST], tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("rag_ablate: error:")]
    assert "queries failed" in line and "system.max_error_rate=0.05" in line
    assert f"generate: generator endpoint {fake_llm.url}/chat/completions: HTTP 400" in line


# --------------------------------------------------------------------------- a judge that fails


@pytest.mark.slow
def test_a_judge_whose_every_reply_is_unusable_fails_the_run_exit_1(
    fake_llm: FakeLLM, tmp_path: Path, tiny_dataset: Path
) -> None:
    fake_llm.respond = lambda body, call: "no JSON here"  # every reply, the repair's too, unparsable
    args = [
        f"dataset.path={tiny_dataset}",
        "generator=extractive",
        "judge=openai",
        f"judge.base_url={fake_llm.url}",
    ]
    proc = run_in_process([*args, "judge.model=m", *FAST, "hydra.run.dir=run"], tmp_path)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("rag_ablate: error:")]
    assert len(errors) == 1 and "judge (openai, " + fake_llm.url in errors[0]
    assert "judge.max_error_rate=0.05" in errors[0], errors
    records = (tmp_path / "run" / RECORDS_FILE).read_text(encoding="utf-8").splitlines()
    assert records and all(json.loads(r)["status"] == "ok" for r in records)  # the queries themselves are ok


@pytest.mark.slow
def test_a_sweep_whose_judge_fails_names_it_in_failures_json_the_terminal_and_the_report(
    fake_llm: FakeLLM, tmp_path: Path, tiny_dataset: Path
) -> None:
    # the baseline has no answers (generator=none), so only the variant's answers meet the judge
    fake_llm.respond = lambda body, call: "no JSON here"
    proc = run_module(
        "rag_ablate",
        [
            "-m",
            "generator=none,extractive",
            f"dataset.path={tiny_dataset}",
            "judge=openai",
            f"judge.base_url={fake_llm.url}",
            "judge.model=m",
            "compare.B=200",
            "progress=false",
            "hydra.sweep.dir=sweep",
        ],
        tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "judge.max_error_rate=0.05" in proc.stderr and "sweep FAILED" in proc.stderr
    failures = json.loads((tmp_path / "sweep" / FAILURES_FILE).read_text(encoding="utf-8"))
    assert failures["failed"] is True
    (failure,) = failures["failures"]
    assert failure["what"] == "generator=extractive" and "judge (openai, " + fake_llm.url in failure["error"]
    report = (tmp_path / "sweep" / "report.html").read_text(encoding="utf-8")
    assert "This sweep FAILED: 1 problem(s)" in report and "judge.max_error_rate=0.05" in report


# --------------------------------------------------------------------------- failure-aware verdicts


def _rec(i: int, split: str, *, ok: bool, recall: float, ms: float) -> dict[str, Any]:
    """A record of query ``q<i>`` (its own group); a failed one names recall_at_5 with None (it applied)."""
    metrics: dict[str, float | None] = {"latency_ms": ms, "recall_at_5": recall if ok else None}
    return {
        "query_id": f"q{i}",
        "split": split,
        "group": f"g{i}",
        "kind": "answerable",
        "status": "ok" if ok else "http_error",
        "error": None if ok else "eval /rag/eval: HTTP 500",
        "timings_ms": {"total": ms},
        "metrics": metrics,
    }


def _fails_more(n: int = 120, share: float = 0.3) -> tuple[Any, Any]:
    """A baseline, and a variant that fails ``share`` of the queries fast (45 ms, against about
    400 ms) and is slightly better on the rest (recall +0.05)."""
    import random

    from rag_ablate.compare.model import VariantData

    rng = random.Random(7)
    base, var = [], []
    for i in range(n):
        split = "holdout" if i % 2 else "dev"
        recall = rng.choice([0.0, 0.5, 1.0])
        ms = 400 + rng.gauss(0, 40)
        base.append(_rec(i, split, ok=True, recall=recall, ms=ms))
        fails = rng.random() < share
        var.append(
            _rec(
                i,
                split,
                ok=not fails,
                recall=min(1.0, recall + 0.05),
                ms=45.0 if fails else ms + rng.gauss(0, 5),
            )
        )
    return VariantData("baseline", base), VariantData("fails", var)


def test_a_variant_that_fails_more_never_leads_the_headline_and_never_passes_the_gate() -> None:
    from rag_ablate.compare.analysis import compare
    from rag_ablate.compare.gate import gate

    base, var = _fails_more()
    c = compare([base, var], metrics=["recall_at_5", "error_rate"], B=500, seed=1)
    for split in ("dev", "holdout"):
        row = c.row(split, "fails", "recall_at_5")
        assert row is not None and row.tested
        # failure-aware under the plain name: every failed query scored 0, over every query
        assert row.n_queries == 60 and row.effect < -0.1 and row.verdict != "better"
        # the ok-only figures beside it: slightly better over the queries ok on both sides
        assert 0.02 < row.ok_effect <= 0.05 and 30 < row.n_ok_queries < 60
    assert c.row("holdout", "fails", "recall_at_5").verdict == "worse"  # type: ignore[union-attr]
    assert gate(c, ["holdout/recall_at_5:-0.02"])  # blocked
    # the records' own aggregate (the end table, MLflow): failure-aware, ok-only beside it
    from rag_ablate.records.scoring import aggregate

    agg = aggregate(var.records)
    assert agg["holdout/recall_at_5"] < agg["holdout/ok/recall_at_5"]
    assert aggregate(base.records)["holdout/recall_at_5"] > agg["holdout/recall_at_5"]
    assert "holdout/ok/recall_at_5" not in aggregate(base.records)  # nothing failed: one form
    # the MLflow headline and the trade-off's quality axis read the same failure-aware values
    from rag_ablate.compare.tradeoff import quality_measure
    from rag_ablate.tracking.ui import headline_metrics

    head = headline_metrics(agg, "recall_at_5")
    assert head["headline/holdout_recall_at_5"] == pytest.approx(agg["holdout/recall_at_5"], abs=1e-4)
    failed = next(r for r in var.records if r["status"] != "ok")
    assert quality_measure("recall_at_5").extract(failed) == 0.0


def test_errors_that_return_fast_do_not_read_as_faster() -> None:
    from rag_ablate.compare.analysis import compare

    base, var = _fails_more()
    c = compare([base, var], metrics=["latency_ms", "latency_p50_ms", "latency_p95_ms"], B=500, seed=1)
    for row in c.rows:
        assert row.tested and row.verdict != "better", row  # over the queries ok on both sides
    pair = c.pair("holdout", "fails")
    assert pair is not None and pair.failed_latency_ms_variant == 45.0  # reported apart
    assert pair.failed_latency_ms_baseline is None
    assert c.row("holdout", "fails", "latency_ms").n_queries == pair.n_ok_both  # type: ignore[union-attr]


def test_a_failed_query_records_which_failure_aware_metrics_it_misses(tiny_dataset: Path) -> None:
    """The record of a failed query names the metrics that applied with None, never a 0."""
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.records.scoring import score_record

    ds = load_dataset(str(tiny_dataset))
    answerable = next(q for q in ds.queries if q.kind == "answerable")
    rec = {"status": "timeout", "timings_ms": {"total": 12.0}, "retrieved": [], "answer": None}
    out = score_record(rec, answerable, ds.documents, [5], routed=True, answered=True)  # type: ignore[arg-type]
    assert out["latency_ms"] == 12.0
    assert out["recall_at_5"] is None and out["token_f1"] is None  # applied, no value
    assert "context_tokens_at_5" not in out and "latency_ms_p95" not in out  # no failure-aware form
    assert all(v is None for k, v in out.items() if k != "latency_ms")
    no_answers = score_record(rec, answerable, ds.documents, [5], routed=False, answered=False)  # type: ignore[arg-type]
    assert "token_f1" not in no_answers and "intent_top1" not in no_answers


def test_a_failed_query_of_a_judged_run_misses_the_judged_metrics_it_would_have_been_asked(
    tiny_dataset: Path,
) -> None:
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.records.scoring import aggregate
    from rag_ablate.run.judging import judge_records

    ds = load_dataset(str(tiny_dataset))
    with_refs = next(q for q in ds.queries if q.reference_answers)
    without = next(q for q in ds.queries if not q.reference_answers and q.query_id != with_refs.query_id)
    ok = {"query_id": with_refs.query_id, "split": "dev", "status": "ok", "answer": "x", "judge": {},
          "metrics": {"faithfulness": 4.0, "relevance": 5.0, "completeness": 3.0}}  # fmt: skip
    failed = [{"query_id": q.query_id, "split": "dev", "status": "timeout", "answer": None, "metrics": {}}
              for q in (with_refs, without)]  # fmt: skip
    out = judge_records([ok, *failed], judge=None, dataset=ds, ks=[5], routed=False)  # type: ignore[arg-type]
    assert out[0] is ok  # judged already: left as it is
    assert out[1]["metrics"] == {"faithfulness": None, "relevance": None, "completeness": None}
    assert out[2]["metrics"] == {"faithfulness": None, "relevance": None}  # no references: not asked
    agg = aggregate([{**r, "kind": "answerable"} for r in out])
    assert agg["dev/faithfulness"] == pytest.approx(4.0 / 3) and agg["dev/ok/faithfulness"] == 4.0
