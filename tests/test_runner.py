"""The query loop: failures are recorded, never dropped; aggregation by split."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.scoring import aggregate, rescore, scored
from rag_ablate.records.trace import Trace
from rag_ablate.run.runner import evaluate, variant_label
from rag_ablate.systems.local import LocalSystem
from tests.conftest import QUERIES, run_module, write_dataset
from tests.rerank_server import RerankServer


class FlakyTarget:
    """The local pipeline, except that the ``bad`` queries raise (after ``delay`` seconds)."""

    def __init__(self, inner: LocalSystem, bad: str | set[str], delay: float = 0.0) -> None:
        self.inner, self.delay = inner, delay
        self.bad = {bad} if isinstance(bad, str) else bad

    @property
    def routes_intents(self) -> bool:
        return True

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        return self.inner.prepare(dataset)

    def close(self) -> None:
        self.inner.close()

    def run(self, query: Query) -> Trace:
        if query.query_id in self.bad:
            time.sleep(self.delay)
            raise TimeoutError("simulated timeout")
        return self.inner.run(query)


def _settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 40, 5
    return s


def test_failed_query_is_recorded_not_dropped(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = FlakyTarget(LocalSystem(_settings()), bad="q1")
    target.prepare(ds)
    records = evaluate(target, ds, [1, 3, 5, 10])
    assert len(records) == len(ds.queries)
    bad = next(r for r in records if r["query_id"] == "q1")
    assert bad["status"] == "failed" and "simulated timeout" in bad["error"]
    # no quality value, only its time until it failed and the metrics that applied, with None
    assert bad["metrics"]["latency_ms"] > 0 and bad["metrics"]["recall_at_5"] is None
    assert all(v is None for k, v in bad["metrics"].items() if k != "latency_ms")
    agg = aggregate(records)
    assert agg["all/n_failed"] == 1 and agg["all/error_rate"] == pytest.approx(1 / 8)
    # recall_at_5 is failure-aware (the failed answerable query counts as a miss, over all 6); the
    # ok-only mean over the 5 other answerable queries is beside it
    ok = [r["metrics"]["recall_at_5"] for r in records if r["status"] == "ok" and r["kind"] == "answerable"]
    assert len(ok) == 5 and agg["all/ok/recall_at_5"] == pytest.approx(sum(ok) / 5)
    assert agg["all/recall_at_5"] == pytest.approx(sum(ok) / 6)


def test_unanswerable_and_no_rag_stay_out_of_retrieval_means(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = LocalSystem(_settings())
    target.prepare(ds)
    records = {r["query_id"]: r for r in evaluate(target, ds, [1, 5])}
    assert "recall_at_5" not in records["q5"]["metrics"]  # unanswerable
    assert "context_tokens_at_5" in records["q5"]["metrics"]
    assert set(records["q6"]["metrics"]) <= {"intent_top1", "latency_ms"}  # chit-chat: intent only
    assert records["q1"]["metrics"]["recall_at_5"] == 1.0
    assert records["q6"]["metrics"]["intent_top1"] == 1.0


def test_variant_label() -> None:
    assert variant_label([]) == "baseline"
    assert variant_label(["chunk='256'"]) == "chunk=256"
    assert variant_label(["chunk='256'", "retrieval.top_k=20"]) == "chunk=256,retrieval.top_k=20"
    assert (
        variant_label(["chunk='256'", "progress=false", "tracking=none", "paths.output_root=/x"])
        == "chunk=256"
    )


def test_a_failed_query_keeps_its_time_so_a_timeout_cannot_improve_p95(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = FlakyTarget(LocalSystem(_settings()), bad="q2", delay=0.2)
    target.prepare(ds)
    records = {r["query_id"]: r for r in evaluate(target, ds, [1, 5])}
    slow = records["q2"]
    assert slow["status"] == "failed"
    assert slow["timings_ms"]["total"] >= 200 and slow["metrics"]["latency_ms"] == slow["timings_ms"]["total"]
    ok = [r["metrics"]["latency_ms"] for r in records.values() if r["status"] == "ok"]
    assert len(ok) == 7 and max(ok) < 200
    agg = aggregate(list(records.values()))
    # p95 over all 8 queries lies between the slowest ok query and the failure; without it, it would drop
    assert max(ok) < agg["all/latency_ms_p95"] <= slow["metrics"]["latency_ms"]
    assert agg["all/latency_ms"] == pytest.approx((sum(ok) + slow["metrics"]["latency_ms"]) / 8)


class BadTraceTarget(FlakyTarget):
    """Returns, for the ``bad`` queries, a trace citing a document the corpus does not have."""

    def run(self, query: Query) -> Trace:
        trace = self.inner.run(query)
        if query.query_id in self.bad:
            trace.retrieved[0] = replace(trace.retrieved[0], doc_id="NO_SUCH_DOC")
        return trace


def test_a_crash_while_scoring_fails_that_query_not_the_run(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = BadTraceTarget(LocalSystem(_settings()), bad="q3")
    target.prepare(ds)
    records = {r["query_id"]: r for r in evaluate(target, ds, [1, 5])}
    bad = records["q3"]
    assert bad["status"] == "failed" and bad["error"].startswith("scoring failed: KeyError")
    assert "NO_SUCH_DOC" in bad["error"] and set(bad["metrics"]) == {"latency_ms"}
    assert bad["retrieved"][0]["doc_id"] == "NO_SUCH_DOC"  # the trace is kept for inspection
    assert all(r["status"] == "ok" for q, r in records.items() if q != "q3")
    assert aggregate(list(records.values()))["all/n_failed"] == 1
    # rescoring from disk treats the bad record the same way
    again = {
        r["query_id"]: r for r in rescore([{**r, "status": "ok"} for r in records.values()], ds, [1, 5], True)
    }
    assert again["q3"]["status"] == "failed" and again["q1"]["metrics"] == records["q1"]["metrics"]


def test_records_are_handed_on_before_scoring_and_returned_scored_as_each_alone(tiny_dataset: Path) -> None:
    """What a job appends as each query completes is its record before scoring (``resume=`` scores it);
    what evaluate returns is every record scored, each as scoring that record alone gives it, the
    failed ones included (q1 raises, q3's trace names a document the corpus lacks)."""
    ds = load_dataset(tiny_dataset)
    target = BadTraceTarget(LocalSystem(_settings()), bad="q3")
    target.prepare(ds)
    flaky = FlakyTarget(target, bad="q1")
    handed: list[dict[str, Any]] = []
    records = evaluate(flaky, ds, [1, 5], on_record=handed.append)
    assert [r["query_id"] for r in handed] == [q.query_id for q in ds.queries]  # one each, as completed
    assert all(r["metrics"] == {} and r["failure_stage"] is None for r in handed)
    by_id = {q.query_id: q for q in ds.queries}
    alone = [scored(r, by_id[r["query_id"]], ds.documents, [1, 5], routed=True) for r in handed]
    assert records == alone
    assert [r["status"] for r in records if r["query_id"] in ("q1", "q3")] == ["failed", "failed"]
    assert records[0]["metrics"] and records[0]["query_id"] == ds.queries[0].query_id


def test_with_progress_the_scoring_after_the_queries_shows_a_bar_of_its_own(
    tiny_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every record is scored after the queries: with progress=true that pass has its own bar (a run of
    100,000 queries scores for seconds after the querying bar is full), and the records are the same."""
    ds = load_dataset(tiny_dataset)
    target = LocalSystem(_settings())
    target.prepare(ds)
    quiet = evaluate(target, ds, [1, 5])
    capsys.readouterr()
    shown = evaluate(target, ds, [1, 5], progress=True, label="base")
    err = capsys.readouterr().err
    n = len(ds.queries)
    assert f"querying [base]:   0%|          | 0/{n} [" in err
    assert f"scoring [base]:   0%|          | 0/{n} [" in err and "rec/s]" in err
    assert err.index("querying [base]") < err.index("scoring [base]")
    assert [(r["query_id"], r["metrics"]) for r in shown] == [
        (r["query_id"], {**r["metrics"], "latency_ms": m["metrics"]["latency_ms"]})
        for r, m in zip(quiet, shown, strict=True)
    ]


def test_records_kept_from_an_earlier_attempt_are_scored_with_the_new_ones(tiny_dataset: Path) -> None:
    """``kept`` (resume=): the earlier attempt's records, unscored on disk, are not run again but scored
    with the rest; the result equals one uninterrupted evaluate."""
    ds = load_dataset(tiny_dataset)
    target = LocalSystem(_settings())
    target.prepare(ds)
    whole = evaluate(target, ds, [1, 3, 5])
    handed: list[dict[str, Any]] = []
    evaluate(target, ds, [1, 3, 5], queries=ds.queries[:3], on_record=handed.append)
    assert all(r["metrics"] == {} for r in handed)
    resumed = evaluate(target, ds, [1, 3, 5], queries=ds.queries[3:], kept=handed)
    assert [r["query_id"] for r in resumed] == [q.query_id for q in ds.queries]  # the kept ones first

    def quality(recs: list[dict[str, Any]]) -> list[tuple[str, str | None, dict[str, Any]]]:
        return [
            (r["query_id"], r["failure_stage"], {k: v for k, v in r["metrics"].items() if k != "latency_ms"})
            for r in recs
        ]

    assert quality(resumed) == quality(whole)
    assert all("latency_ms" in r["metrics"] for r in resumed)


def test_every_routed_query_failed_scores_misses_and_has_no_ok_only_mean(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = FlakyTarget(LocalSystem(_settings()), bad={q.query_id for q in ds.queries})
    target.prepare(ds)
    agg = aggregate(evaluate(target, ds, [1, 5]))
    assert agg["all/error_rate"] == 1.0 and agg["all/n_failed"] == 8
    # failure-aware: every query the metric applied to is a miss; no query succeeded, so no ok-only
    # mean (absent, never 0)
    assert agg["all/intent_top1"] == 0.0 and agg["all/recall_at_5"] == 0.0
    assert not any("/ok/" in k for k in agg)
    assert "all/latency_ms_p95" in agg


@pytest.mark.slow
def test_a_sweep_whose_variant_fails_every_query(tmp_path: Path) -> None:
    """A rerank service that rejects every request (HTTP 400), with an error budget that allows it:
    the run finishes, the comparison says what failed. (One that refuses connections stops the run:
    tests/test_failures.py.)"""
    answerable = [q for q in QUERIES if q.get("answerable", True) and "relevant" in q]
    dataset = write_dataset(tmp_path / "data", queries=answerable)  # every query retrieves, so reranks
    with RerankServer() as server:
        server.state.reject_status = 400
        proc = run_module(
            "rag_ablate",
            [
                "-m",
                "rerank=none,http",
                f"rerank.url={server.url}",
                f"dataset.path={dataset}",
                "system.max_error_rate=1.0",
                "tracking=none",
                "progress=false",
                "compare.B=1000",
            ],
            tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
    job = next(
        p.parent
        for p in sweep_dir.glob("*/variant.json")
        if json.loads(p.read_text())["label"] == "rerank=http"
    )
    records = [json.loads(line) for line in (job / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(answerable)
    assert all(r["status"] == "failed" and "RerankError" in r["error"] for r in records)
    assert all(r["metrics"]["latency_ms"] > 0 for r in records)  # timed until the failure
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["all/error_rate"] == 1.0 and metrics["all/n_failed"] == len(answerable)
    # failure-aware: every query a miss; no query succeeded, so no ok-only mean and no intent report
    assert metrics["all/intent_top1"] == 0.0 and not [k for k in metrics if "/ok/" in k]
    assert not (job / "intents.md").exists()

    data = json.loads((sweep_dir / "comparison.json").read_text())
    for split in ("dev", "holdout"):
        n = sum(1 for r in records if r["split"] == split)
        rows = {r["metric"]: r for r in data["rows"] if r["split"] == split}
        err = rows["error_rate"]
        assert (err["baseline_mean"], err["variant_mean"], err["n_queries"]) == (0.0, 1.0, n)
        for metric in ("recall_at_5", "ndcg_at_10", "intent_top1"):  # failure-aware: every query a miss
            row = rows[metric]
            assert row["variant_mean"] == 0.0 and row["n_ok_queries"] == 0 and row["ok_effect"] is None
            assert row["effect"] == pytest.approx(-row["baseline_mean"]) and row["verdict"] != "better"
        pair = next(p for p in data["pairs"] if p["split"] == split)
        assert (pair["n_failed_variant"], pair["left_failed_variant"], pair["n_ok_both"]) == (n, n, 0)
    assert "all" in proc.stdout and "failed in variant" in proc.stdout and "left out" in proc.stdout


def test_the_progress_bar_ends_with_the_final_counts_however_fast_queries_finish() -> None:
    """The live counts are formatted at most every 0.1 s; the last query's counts are always shown."""
    from rag_ablate.run.runner import RunProgress

    on = RunProgress(object(), 5, "x", enabled=True)  # type: ignore[arg-type]
    for status in ["ok", "failed", "ok", "ok", "failed"]:
        on.update(status)
    assert on.bar.postfix is not None and on.bar.postfix.startswith("ok=3, failed=2, req/s=")
    on.close()
    off = RunProgress(object(), 2, "x", enabled=False)  # type: ignore[arg-type]
    off.update("ok")
    off.update("failed")
    assert (off.ok, off.failed) == (1, 1) and not getattr(off.bar, "postfix", None)
    off.close()
