"""Timing that favours no side: warm stages before the first timed query, and the interleaved
timing pass (rag_ablate.run.timing) that drift between jobs cannot bias."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.run import run_comparison
from rag_ablate.compare.timing import apply_timing
from rag_ablate.config.schema import CompareConfig, RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.core.layout import COMPARISON_JSON, COMPARISON_MD, RECORDS_FILE, TIMING_FILE
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.trace import Trace
from rag_ablate.run.runner import evaluate
from rag_ablate.run.timing import TimedCall, TimingJob, interleave, read_timing, timing_pass
from rag_ablate.systems.http import WARMUP_ID, HttpSystem
from rag_ablate.systems.local import LocalSystem
from rag_ablate.text import analyzers
from tests.conftest import run_module
from tests.stub_rag_service import stub_service


def _settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    return s


@pytest.mark.slow  # builds the sample's index
def test_the_first_query_of_a_warm_cached_run_is_no_outlier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embedded Chinese sample's BM25 analyses each query with jieba, whose dictionary loads on
    first use (about a second, against well under a millisecond per query). With the index cached,
    nothing in prepare() segments text, so without a warm-up the first timed query paid for it."""
    ds = load_dataset(None)
    cache = Cache(tmp_path / "cache")
    first = LocalSystem(_settings(), cache)
    first.prepare(ds)  # builds the cached tokens and index (and loads jieba in this process)
    first.close()
    monkeypatch.setattr(analyzers, "_SEGMENTERS", {})  # a fresh process: jieba's dictionary not loaded
    system = LocalSystem(_settings(), cache)
    info = system.prepare(ds)
    records = evaluate(system, ds, [5], queries=ds.queries[:40])
    system.close()
    latency = np.array([r["metrics"]["latency_ms"] for r in records])
    assert info["index.warmup_seconds"] > 0
    # jieba's load took ~600 ms against a median under 1 ms; the margin leaves room for a busy machine
    assert latency.max() < 20 * float(np.median(latency)) + 100.0, latency[:5]


def test_the_first_http_query_is_not_charged_for_the_service_warming_up(tiny_dataset: Path) -> None:
    """A service that loads something on its first request (0.5 s here): the untimed warm-up
    requests absorb it, and the job's first timed queries are as fast as the rest."""
    ds = load_dataset(tiny_dataset)
    with stub_service(ds, first_delay_s=0.5) as service:
        s = _settings()
        s.system.name, s.system.base_url, s.system.chat_path = "http", service.url, None
        system = HttpSystem(s)
        system.prepare(ds)
        records = evaluate(system, ds, [5])
        system.close()
        assert service.requests[WARMUP_ID] == min(s.system.concurrency, len(ds.queries))
    assert {r["status"] for r in records} == {"ok"}
    assert max(r["metrics"]["latency_ms"] for r in records) < 250


def test_run_keeps_one_warm_client_between_calls(tiny_dataset: Path) -> None:
    """system=http's run() (one query per call, as the timing pass calls it) warms up once and
    reuses its connection, so no call pays for a new connection or the first-use delay; two
    variants of one service share that connection (two connections differ by themselves)."""
    ds = load_dataset(tiny_dataset)
    with stub_service(ds, first_delay_s=0.5) as service:
        s = _settings()
        s.system.name, s.system.base_url, s.system.chat_path = "http", service.url, None
        a, b = HttpSystem(s), HttpSystem(s)
        a.prepare(ds)
        b.prepare(ds)
        traces = [system.run(q) for q in ds.queries for system in (a, b)]
        a.close()
        assert b.run(ds.queries[0]).status == "ok"  # still open for its other user
        b.close()
        assert service.requests[WARMUP_ID] == 1
        assert service.connections == 1
    assert {t.status for t in traces} == {"ok"}
    assert max(t.timings_ms["total"] for t in traces) < 250


# --------------------------------------------------------------------------- drift and the timing pass


class Drifting:
    """A system on a machine that slows down: every call, by any system sharing ``clock``, takes
    ``step_ms`` longer than the one before; a query's own cost is fixed by its id."""

    routes_intents = False

    def __init__(self, clock: list[int], step_ms: float) -> None:
        self.clock, self.step_ms = clock, step_ms

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        return {}

    def run(self, query: Query) -> Trace:
        self.clock[0] += 1
        own = 1.0 + (zlib.crc32(query.query_id.encode()) % 100) / 100
        return Trace(query.query_id, timings_ms={"total": own + self.step_ms * self.clock[0]})

    def close(self) -> None:
        pass


TIMING_METRICS = ["latency_ms", "latency_p50_ms", "latency_p95_ms"]


def _latency_verdicts(variants: list[VariantData]) -> dict[tuple[str, str], str]:
    c = compare(variants, metrics=TIMING_METRICS, B=999, seed=0)
    return {(r.split, r.metric): r.verdict for r in c.rows}


def test_drift_between_jobs_makes_an_aa_significant_and_the_interleaved_pass_does_not() -> None:
    """One configuration run twice (A/A) while the machine slows down by 1 microsecond per call.
    Jobs one after another: the second job is slower by ~0.4 ms on every query, and the old
    comparison calls that a significant effect. The interleaved pass times both on each query
    moments apart, in a random order, so the drift falls on both sides alike: no verdict."""
    ds = load_dataset(None)
    clock = [0]
    first, second = Drifting(clock, 0.001), Drifting(clock, 0.001)
    jobs = [
        VariantData("baseline", evaluate(first, ds, [5])),
        VariantData("again", evaluate(second, ds, [5])),  # the same system, run second
    ]
    old = _latency_verdicts(jobs)
    assert old[("holdout", "latency_ms")] == old[("dev", "latency_ms")] == "worse"

    calls = interleave({"baseline": first, "again": second}, ds.queries, repeats=1, seed=0)
    method = apply_timing(jobs, calls)
    assert "interleaved timing pass" in method
    new = _latency_verdicts(jobs)
    assert set(new.values()) == {""}, new
    # each query's two times are adjacent calls, each variant first in about half of the blocks
    firsts = sum(1 for c in calls if c.variant == "baseline" and c.position == 0)
    assert 0.4 * len(ds.queries) < firsts < 0.6 * len(ds.queries)


def test_a_call_that_failed_in_the_pass_is_left_out_never_fast(tiny_dataset: Path) -> None:
    """A failure that returns quickly is not a fast answer: its query leaves the latency rows."""
    ds = load_dataset(tiny_dataset)
    clock = [0]
    variants = [
        VariantData("baseline", evaluate(Drifting(clock, 0.0), ds, [5])),
        VariantData("b", evaluate(Drifting(clock, 0.0), ds, [5])),
    ]
    q0, q1 = ds.queries[0].query_id, ds.queries[1].query_id
    calls = [TimedCall(v.label, q.query_id, 0, 0, 5.0, "ok") for v in variants for q in ds.queries]
    calls = [
        c if (c.variant, c.query_id) != ("b", q0) else TimedCall("b", q0, 0, 1, 0.1, "http_error")
        for c in calls
    ]
    variants[0].records[1]["status"] = "failed"  # failed in its job: also left out
    apply_timing(variants, calls)
    latency = {(v.label, r["query_id"]): r["metrics"]["latency_ms"] for v in variants for r in v.records}
    assert math.isnan(latency[("b", q0)]) and math.isnan(latency[("baseline", q1)])
    assert latency[("baseline", q0)] == 5.0


def test_without_a_pass_for_every_variant_the_jobs_latencies_stay_and_say_so(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    variants = [VariantData(label, evaluate(Drifting([0], 0.0), ds, [5])) for label in ("baseline", "b")]
    before = [r["metrics"]["latency_ms"] for r in variants[1].records]
    calls = [TimedCall("baseline", q.query_id, 0, 0, 5.0, "ok") for q in ds.queries]
    assert "no times for b" in apply_timing(variants, calls)
    assert "No interleaved timing pass" in apply_timing(variants, [])
    assert [r["metrics"]["latency_ms"] for r in variants[1].records] == before


@pytest.mark.slow
def test_a_sweep_times_its_variants_interleaved_and_every_view_says_so(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    args = ["-m", "chunk=512,256", f"dataset.path={tiny_dataset}", "progress=false", "tracking=none"]
    args += ["compare.B=500", "timing.repeats=2", f"paths.output_root={tmp_path / 'out'}"]
    done = run_module("rag_ablate", args, tmp_path)
    assert done.returncode == 0, done.stderr
    sweep = next((tmp_path / "out" / "multirun").iterdir())
    calls = read_timing(sweep / TIMING_FILE)
    n = len(load_dataset(tiny_dataset).queries)
    assert len(calls) == 2 * 2 * n and {c.variant for c in calls} == {"baseline", "chunk=256"}
    assert {c.status for c in calls} == {"ok"}
    comparison = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))
    assert "interleaved timing pass" in comparison["latency_method"]
    assert "## How latency was measured" in (sweep / COMPARISON_MD).read_text(encoding="utf-8")
    assert "How latency was measured" in (sweep / "report.html").read_text(encoding="utf-8")
    assert "how latency was measured: Latency compares the interleaved timing pass" in done.stdout
    # rag-ablate compare on the folder later uses the same times
    again = run_comparison(sweep, CompareConfig(B=200), echo=lambda _line: None)
    assert again.comparison.latency_method == comparison["latency_method"]
    assert Comparison.from_dict(comparison).latency_method == comparison["latency_method"]
    # the job's own latency stays in its records
    lines = (sweep / "0" / RECORDS_FILE).read_text(encoding="utf-8").splitlines()
    job_latency = [json.loads(line)["metrics"]["latency_ms"] for line in lines]
    assert len(job_latency) == n


def test_the_pass_times_only_queries_ok_in_every_job(tiny_dataset: Path, tmp_path: Path) -> None:
    """A query that failed in a job is left out of latency anyway: the pass does not call a
    (perhaps dead) endpoint for it again, and times nothing when no query is ok everywhere."""
    ids = [q.query_id for q in load_dataset(tiny_dataset).queries]
    s = _settings()
    s.dataset.path, s.cache.dir = str(tiny_dataset), str(tmp_path / "cache")

    def records(name: str, failed: set[str]) -> Path:
        path = tmp_path / name / RECORDS_FILE
        path.parent.mkdir()
        lines = [json.dumps({"query_id": q, "status": "failed" if q in failed else "ok"}) for q in ids]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    jobs = [TimingJob("baseline", s, records("a", {ids[0]})), TimingJob("b", s, records("b", {ids[1]}))]
    done = timing_pass(tmp_path, jobs, tmp_path, repeats=2, seed=0)
    calls = read_timing(done.path)
    assert {c.query_id for c in calls} == set(ids[2:]) and len(calls) == 2 * 2 * (len(ids) - 2)
    assert {c.status for c in calls} == {"ok"} and all(c.latency_ms > 0 for c in calls)
    done.path.unlink()
    jobs[1] = TimingJob("b", s, records("c", set(ids)))
    assert not timing_pass(tmp_path, jobs, tmp_path, repeats=1, seed=0).written
    assert not (tmp_path / TIMING_FILE).exists()
