"""Timing that favours no side: warm stages before the first timed query, and the interleaved
timing pass (rag_ablate.run.timing) that drift between jobs cannot bias."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.dataset.load import load_dataset
from rag_ablate.run.runner import evaluate
from rag_ablate.systems.http import WARMUP_ID, HttpSystem
from rag_ablate.systems.local import LocalSystem
from rag_ablate.text import analyzers
from tests.stub_rag_service import stub_service


def _settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    return s


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
    assert latency[0] < 20 * float(np.median(latency)) + 5.0, latency[:5]
    assert latency.max() < 20 * float(np.median(latency)) + 5.0


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
    reuses its connection, so no call pays for a new connection or the first-use delay."""
    ds = load_dataset(tiny_dataset)
    with stub_service(ds, first_delay_s=0.5) as service:
        s = _settings()
        s.system.name, s.system.base_url, s.system.chat_path = "http", service.url, None
        system = HttpSystem(s)
        system.prepare(ds)
        traces = [system.run(q) for q in ds.queries]
        system.close()
        assert service.requests[WARMUP_ID] == 1
    assert {t.status for t in traces} == {"ok"}
    assert max(t.timings_ms["total"] for t in traces) < 250
