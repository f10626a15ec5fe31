"""Fusion on hand-computed examples; cache keys and atomic, shared entries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_ablate.core.cache import Cache, content_key
from rag_ablate.core.errors import UnknownNameError
from rag_ablate.pipeline.fusion import fuse, rrf, weighted

TIE = np.arange(10)


def test_rrf_by_hand() -> None:
    bm25 = [(1, 9.0), (2, 5.0), (3, 1.0)]
    dense = [(3, 0.9), (1, 0.8), (4, 0.1)]
    got = rrf([bm25, dense], TIE, k=10, rrf_k=60)
    # 1: 1/61 + 1/62; 3: 1/63 + 1/61; 2: 1/62; 4: 1/63
    expect = {1: 1 / 61 + 1 / 62, 3: 1 / 63 + 1 / 61, 2: 1 / 62, 4: 1 / 63}
    assert [i for i, _ in got] == [1, 3, 2, 4]
    for i, s in got:
        assert s == pytest.approx(expect[i], abs=1e-15)


def test_rrf_ties_broken_by_tiebreak_and_cut_at_k() -> None:
    a, b = [(5, 1.0)], [(2, 1.0)]  # both rank 1 once: equal scores
    assert [i for i, _ in rrf([a, b], TIE, k=2)] == [2, 5]
    assert [i for i, _ in rrf([a, b], TIE[::-1].copy(), k=1)] == [5]


def test_weighted_by_hand() -> None:
    bm25 = [(1, 10.0), (2, 6.0), (3, 2.0)]  # normalised 1, 0.5, 0
    dense = [(3, 0.9), (1, 0.5), (4, 0.1)]  # normalised 1, 0.5, 0
    got = dict(weighted([bm25, dense], [0.3, 0.7], TIE, k=10))
    assert got == pytest.approx({1: 0.3 * 1 + 0.7 * 0.5, 2: 0.3 * 0.5, 3: 0.3 * 0 + 0.7 * 1, 4: 0.0})
    assert [i for i, _ in weighted([bm25, dense], [0.3, 0.7], TIE, k=2)] == [3, 1]
    # a run with equal scores maps them all to 1
    assert dict(weighted([[(1, 2.0), (2, 2.0)]], [1.0], TIE, k=5)) == {1: 1.0, 2: 1.0}


def test_fuse_dispatch() -> None:
    assert fuse("rrf", [[(1, 1.0)]], TIE, 3) == rrf([[(1, 1.0)]], TIE, 3)
    with pytest.raises(UnknownNameError, match="rrf, weighted"):
        fuse("borda", [], TIE, 3)


def test_content_key_changes_when_and_only_when_an_input_changes() -> None:
    parts = {"corpus": "abc", "size": 512, "overlap": 64}
    k = content_key("chunks", parts)
    assert content_key("chunks", dict(reversed(list(parts.items())))) == k  # order does not matter
    assert content_key("chunks", {**parts, "size": 256}) != k
    assert content_key("chunks", {**parts, "corpus": "abd"}) != k
    assert content_key("embeddings", parts) != k


def test_cache_hits_misses_and_atomic_files(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    calls = []

    def build() -> np.ndarray:
        calls.append(1)
        return np.arange(6, dtype=np.float32).reshape(2, 3)

    a = cache.array("emb", {"m": 1}, build)
    b = cache.array("emb", {"m": 1}, build)
    c = cache.array("emb", {"m": 2}, build)
    assert len(calls) == 2 and np.array_equal(a, b) and np.array_equal(a, c)
    assert cache.stats["emb"].hits == 1 and cache.stats["emb"].misses == 2
    # one folder per entry, named by its key, holding the data and its meta; no temporary leftovers
    entries = sorted(p.name for p in (tmp_path / "emb").iterdir())
    assert entries == sorted(content_key("emb", {"m": m}) for m in (1, 2))
    for name in entries:
        assert sorted(p.name for p in (tmp_path / "emb" / name).iterdir()) == ["data.npy", "meta.json"]
    # another process (a new Cache on the same folder) reuses the entry
    other = Cache(tmp_path)
    other.json("chunks", {"x": 1}, lambda: [1, 2])
    assert Cache(tmp_path).json("chunks", {"x": 1}, lambda: [9]) == [1, 2]
    m = cache.metrics()
    assert m["run/cache_emb_hits"] == 1 and m["run/cache_emb_misses"] == 2


def test_cache_folder_and_disabled(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    made = []

    def build(folder: Path) -> None:
        made.append(folder)
        (folder / "x.txt").write_text("hi")

    p1 = cache.folder("bm25", {"a": 1}, build)
    p2 = cache.folder("bm25", {"a": 1}, build)
    assert p1 == p2 and (p1 / "x.txt").read_text() == "hi" and len(made) == 1
    off = Cache(tmp_path / "off", enabled=False)
    off.array("emb", {"m": 1}, lambda: np.zeros(2))
    off.array("emb", {"m": 1}, lambda: np.zeros(2))
    assert off.stats["emb"].misses == 2 and not (tmp_path / "off" / "emb").exists()
