"""The query loop: failures are recorded, never dropped; aggregation by split."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config import RunConfig
from rag_ablate.dataset import Dataset, Query, load_dataset
from rag_ablate.records import aggregate
from rag_ablate.runner import evaluate, variant_label
from rag_ablate.target import Trace
from rag_ablate.target.local import LocalTarget


class FlakyTarget:
    """The local pipeline, except that one query raises."""

    def __init__(self, inner: LocalTarget, bad: str) -> None:
        self.inner, self.bad = inner, bad

    @property
    def routes_intents(self) -> bool:
        return True

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        return self.inner.prepare(dataset)

    def run(self, query: Query) -> Trace:
        if query.query_id == self.bad:
            raise TimeoutError("simulated timeout")
        return self.inner.run(query)


def _settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 40, 5
    return s


def test_failed_query_is_recorded_not_dropped(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = FlakyTarget(LocalTarget(_settings()), bad="q1")
    target.prepare(ds)
    records = evaluate(target, ds, [1, 3, 5, 10])
    assert len(records) == len(ds.queries)
    bad = next(r for r in records if r["query_id"] == "q1")
    assert bad["status"] == "failed" and "simulated timeout" in bad["error"] and bad["metrics"] == {}
    agg = aggregate(records)
    assert agg["all/n_failed"] == 1 and agg["all/error_rate"] == pytest.approx(1 / 8)
    # the failure is not averaged in as a miss: the mean runs over the 5 other answerable queries
    ok = [r["metrics"]["recall_at_5"] for r in records if r["status"] == "ok" and r["kind"] == "answerable"]
    assert len(ok) == 5 and agg["all/recall_at_5"] == pytest.approx(sum(ok) / 5)


def test_unanswerable_and_no_rag_stay_out_of_retrieval_means(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    target = LocalTarget(_settings())
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
