"""The dense/hybrid/rerank stages inside runs: caches shared across a sweep, stage timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.dataset.load import load_dataset
from rag_ablate.run.runner import evaluate
from rag_ablate.systems.local import LocalSystem
from tests.conftest import run_module


def _settings(**retrieval: Any) -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 20, 4
    for k, v in retrieval.items():
        setattr(s.retrieval, k, v)
    return s


@pytest.mark.slow  # loads the real embedding model
@pytest.mark.parametrize("method", ["dense", "hybrid"])
def test_dense_and_hybrid_runs_record_stage_timings(tiny_dataset: Path, tmp_path: Path, method: str) -> None:
    ds = load_dataset(tiny_dataset)
    s = _settings(method=method)
    target = LocalSystem(s, Cache(tmp_path / "cache"))
    info = target.prepare(ds)
    assert info["retrieval.dense.encoder_resolved"] == "minilm"  # English corpus
    records = evaluate(target, ds, [1, 5])
    q1 = next(r for r in records if r["query_id"] == "q1")
    assert {"encode", "dense", "total"} <= set(q1["timings_ms"])
    if method == "hybrid":
        assert {"bm25", "fuse"} <= set(q1["timings_ms"])
    assert q1["metrics"]["recall_at_5"] == 1.0
    assert info["index.bytes"] > 0


def test_biencoder_rerank_keeps_top_k_of_candidates(tiny_dataset: Path, tmp_path: Path) -> None:
    ds = load_dataset(tiny_dataset)
    s = _settings(method="bm25")
    s.rerank.method, s.rerank.candidates, s.rerank.top_k = "biencoder", 8, 2
    target = LocalSystem(s, Cache(tmp_path / "cache"))
    target.prepare(ds)
    records = evaluate(target, ds, [1, 2])
    for r in records:
        if r["kind"] != "no_rag":
            assert len(r["retrieved"]) <= 2
            scores = [x["score"] for x in r["retrieved"]]
            assert scores == sorted(scores, reverse=True)
    q1 = next(r for r in records if r["query_id"] == "q1")
    assert "rerank" in q1["timings_ms"] and "encode" in q1["timings_ms"]


def test_an_encoder_shared_by_two_stages_is_charged_once(tiny_dataset: Path, tmp_path: Path) -> None:
    ds = load_dataset(tiny_dataset)
    s = _settings(method="dense")
    s.rerank.method, s.rerank.candidates, s.rerank.top_k = "biencoder", 8, 2
    s.rerank.encoder = "minilm"  # what dense's "auto" resolves to on an English corpus
    cache = Cache(tmp_path / "cache")
    target = LocalSystem(s, cache)
    info = target.prepare(ds)
    assert info["retrieval.dense.encoder_resolved"] == info["rerank.encoder_resolved"] == "minilm"
    assert cache.stats["embeddings"].misses == 1 and cache.stats["embeddings"].hits == 0
    share = target.embeddings("minilm").queries.encode_ms
    assert share > 0
    q1 = evaluate(target, ds, [1, 2])[0]
    assert q1["timings_ms"]["encode"] == pytest.approx(share)  # not twice
    t = q1["timings_ms"]
    stages = t["route"] + t["dense"] + t["rerank"] + t["encode"]
    assert stages <= t["total"] + 1e-6


def test_cold_and_warm_report_the_same_encode_cost(tiny_dataset: Path, tmp_path: Path) -> None:
    ds = load_dataset(tiny_dataset)
    encode = []
    for _ in range(2):
        cache = Cache(tmp_path / "cache")
        target = LocalSystem(_settings(method="dense"), cache)
        target.prepare(ds)
        encode.append(evaluate(target, ds, [1])[0]["timings_ms"]["encode"])
    assert cache.stats["embeddings"].hits == 1 and cache.stats["query_embeddings"].hits == 1
    assert encode[0] == pytest.approx(encode[1])


def _sweep(args: list[str], cwd: Path) -> list[dict[str, Any]]:
    # the cache counts are the jobs' own: the timing pass after them (which builds every variant again) is off
    args = [*args, "progress=false", "tracking=none", "compare.B=500", "timing.interleave=false"]
    proc = run_module("rag_ablate", ["-m", *args], cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = next((cwd / "outputs" / "multirun").iterdir())
    return [json.loads(p.read_text())["metrics"] for p in sorted(sweep_dir.glob("*/summary.json"))]


@pytest.mark.slow
def test_rerank_top_k_sweep_encodes_once(tiny_dataset: Path, tmp_path: Path) -> None:
    runs = _sweep([f"dataset.path={tiny_dataset}", "rerank=biencoder", "rerank.top_k=2,3,5"], tmp_path)
    assert len(runs) == 4  # baseline (top_k 10) + 3 variants
    misses = [m["run/cache_embeddings_misses"] for m in runs]
    hits = [m["run/cache_embeddings_hits"] for m in runs]
    assert sum(misses) == 1 and sum(hits) == 3
    assert sum(m["run/cache_chunks_misses"] for m in runs) == 1


@pytest.mark.slow
def test_chunk_sweep_encodes_once_per_chunking(tiny_dataset: Path, tmp_path: Path) -> None:
    runs = _sweep(
        [
            f"dataset.path={tiny_dataset}",
            "retrieval=hybrid",
            "chunk=128,256,512",
            "retrieval.hybrid.fusion=rrf,weighted",
        ],
        tmp_path,
    )
    assert len(runs) == 4  # baseline (512, rrf), 128, 256, weighted
    assert sum(m["run/cache_embeddings_misses"] for m in runs) == 3
    assert sum(m["run/cache_bm25_misses"] for m in runs) == 3
    assert sum(m["run/cache_embeddings_hits"] + m["run/cache_bm25_hits"] for m in runs) == 2


def test_studies_plan(tmp_path: Path) -> None:
    from tests.test_ablation import labels, plan_for

    assert labels(plan_for(["experiment=retrieval_study"])) == [
        "baseline",
        "retrieval=dense",
        "retrieval=hybrid",
    ]
    p = plan_for(["experiment=rerank_study"])
    assert labels(p) == ["baseline", "rerank.top_k=5", "rerank.top_k=20"]
