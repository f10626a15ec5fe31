"""Analyzer output and token counts on the embedded sample equal those of the code before
tokenisation was cached and sped up (tests/data/sample_tokens.json, computed once with the
old code: jieba's ``lcut_for_search`` path and ``count_tokens``; never regenerated).

Per text the fixture holds [count_tokens, number of zh tokens, sha256[:16] of the zh tokens
joined by U+001F, number of en tokens, the same hash of the en tokens]; the texts are every
chunk's indexed text (title and text) under chunk=128/16, 256/32 and 512/64, and every query.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.pipeline.tokens import TokenMatrix
from rag_ablate.systems.local import LocalSystem
from rag_ablate.text.analyzers import analyze_en, analyze_zh
from rag_ablate.text.count import count_tokens
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "data" / "sample_tokens.json"
CHUNKINGS = ("128/16", "256/32", "512/64")


@cache
def fixture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def sample() -> Dataset:
    return load_dataset(None)


def digest(tokens: list[str]) -> str:
    return hashlib.sha256("\x1f".join(tokens).encode("utf-8")).hexdigest()[:16]


def row(text: str) -> list[Any]:
    zh, en = analyze_zh(text), analyze_en(text)
    return [count_tokens(text), len(zh), digest(zh), len(en), digest(en)]


def test_the_fixture_covers_the_three_chunkings_and_every_query(sample: Dataset) -> None:
    assert sorted(fixture()["chunkings"]) == sorted(CHUNKINGS)
    assert set(fixture()["queries"]) == {q.query_id for q in sample.queries}
    assert len(sample.queries) == 364


@pytest.mark.parametrize("chunking", CHUNKINGS)
def test_every_chunk_analyses_and_counts_as_before(chunking: str, sample: Dataset, tmp_path: Path) -> None:
    expected = fixture()["chunkings"][chunking]
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = (int(x) for x in chunking.split("/"))
    s.retrieval.method = "bm25"
    system = LocalSystem(s, Cache(tmp_path))
    info = system.prepare(sample)
    assert info["chunk.unit_resolved"] == expected["unit"] == "char"
    assert sorted(c.chunk_id for c in system.chunks) == sorted(expected["chunks"])
    got = {c.chunk_id: row(c.index_text(True)) for c in system.chunks}
    wrong = [cid for cid, want in expected["chunks"].items() if got[cid] != want]
    assert not wrong, f"{len(wrong)} chunks differ, e.g. {wrong[:3]}"
    # the cached token ids hold the same analysis: each chunk's number of zh tokens
    (entry,) = (tmp_path / "tokens").iterdir()
    tokens = TokenMatrix.load(entry / "data")
    assert tokens.doc_len.tolist() == [expected["chunks"][c.chunk_id][1] for c in system.chunks]


def test_every_query_analyses_and_counts_as_before(sample: Dataset) -> None:
    expected = fixture()["queries"]
    wrong = [q.query_id for q in sample.queries if row(q.query) != expected[q.query_id]]
    assert not wrong, f"{len(wrong)} queries differ, e.g. {wrong[:3]}"
