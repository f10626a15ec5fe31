"""BM25 scored from the cached token ids equals bm25s over the same token lists, bit for bit.

The reference is a ``bm25s.BM25`` index built the way the earlier code built it: each chunk's
analysed tokens (``analyzer(text) or [""]``), then ``get_scores`` with the query's known tokens.
Checked for every BM25 variant bm25s has, on the embedded sample's chunks in English and
Chinese and on random token lists (hypothesis), and through a save and a memory-mapped load.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

import bm25s
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.pipeline.bm25 import BM25Retriever, ScoreMatrix
from rag_ablate.pipeline.chunking import Chunks, IndexTexts, chunk_spans, tiebreak_ranks
from rag_ablate.pipeline.tokens import TokenMatrix
from rag_ablate.text.analyzers import Analyzer, get_analyzer

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


@cache
def sample() -> Dataset:
    return load_dataset(None)


def _reference(token_lists: list[list[str]], *, k1: float, b: float, method: str) -> bm25s.BM25:
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    index = bm25s.BM25(k1=k1, b=b, method=method)
    index.index([t or [""] for t in token_lists], show_progress=False)
    return index


def _reference_scores(index: bm25s.BM25, query_tokens: list[str], n: int) -> np.ndarray:
    # bm25s lists "" in vocab_dict even when no chunk is empty, and then fails on it: such a token
    # scores nothing (nor does it in the index under test)
    n_tokens = len(index.scores["indptr"]) - 1
    known = [t for t in query_tokens if index.vocab_dict.get(t, n_tokens) < n_tokens]
    if not known:
        return np.zeros(n, dtype=np.float32)
    return np.asarray(index.get_scores(known))


def _texts(size: int, overlap: int) -> list[str]:
    docs = list(sample().documents.values())
    spans = chunk_spans(docs, size, overlap, "char")
    return list(IndexTexts(Chunks(docs, spans), True))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("analyzer_name", ["zh", "en"])
def test_scores_equal_bm25s_on_the_sample(method: str, analyzer_name: str) -> None:
    analyzer: Analyzer = get_analyzer(analyzer_name)
    texts = _texts(256, 32)
    k1, b = (1.2, 0.6) if method == "robertson" else (1.5, 0.75)
    ref = _reference([analyzer(t) for t in texts], k1=k1, b=b, method=method)
    ours = BM25Retriever(texts, [(str(i), 0) for i in range(len(texts))], analyzer, k1=k1, b=b, method=method)
    queries = [q.query for q in sample().queries]
    for q in queries:
        want = _reference_scores(ref, analyzer(q), len(texts))
        got = ours.scores(q)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want, err_msg=q)


def test_a_saved_index_loads_memory_mapped_and_scores_the_same(tmp_path: Path) -> None:
    docs = list(sample().documents.values())
    spans = chunk_spans(docs, 128, 16, "char")
    texts = IndexTexts(Chunks(docs, spans), True)
    analyzer = get_analyzer("zh")
    tokens = TokenMatrix.build(texts, analyzer)
    tokens.save(tmp_path / "tokens")
    matrix = ScoreMatrix.from_tokens(TokenMatrix.load(tmp_path / "tokens"), k1=1.5, b=0.75, method="lucene")
    matrix.save(tmp_path)
    ties = tiebreak_ranks(docs, spans)
    built = BM25Retriever.from_tokens(tokens, ties, analyzer)
    loaded = BM25Retriever.load(tmp_path, ties, analyzer)
    assert isinstance(loaded.matrix.data, np.memmap)
    for q in sample().queries:
        np.testing.assert_array_equal(loaded.scores(q.query), built.scores(q.query))
        assert loaded.search(q.query, 10) == built.search(q.query, 10)


WORDS = st.sampled_from(["a", "b", "c", "dd", "ee", "f", "", "退款", "到账"])


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(WORDS, max_size=12), min_size=1, max_size=25),
    query=st.lists(WORDS, min_size=1, max_size=6),
    method=st.sampled_from(METHODS),
    k1=st.floats(0.1, 3.0),
    b=st.floats(0.0, 1.0),
)
def test_scores_equal_bm25s_on_random_token_lists(
    docs: list[list[str]], query: list[str], method: str, k1: float, b: float
) -> None:
    """Empty chunks, the empty token, repeats and unknown query tokens included."""
    table = {f"<{i}>": d for i, d in enumerate(docs)}

    def analyzer(text: str) -> list[str]:
        return list(table[text]) if text in table else text.split(" ")

    texts = list(table)
    ref = _reference(docs, k1=k1, b=b, method=method)
    ours = BM25Retriever(texts, [(t, 0) for t in texts], analyzer, k1=k1, b=b, method=method)
    q = " ".join(query)
    np.testing.assert_array_equal(ours.scores(q), _reference_scores(ref, analyzer(q), len(texts)))


@pytest.mark.parametrize("analyzer_name", ["zh", "en"])
def test_tokens_built_by_worker_processes_equal_those_built_here(
    analyzer_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_ablate.pipeline import tokens as tokens_mod

    monkeypatch.setattr(tokens_mod, "PARALLEL_MIN", 10)
    monkeypatch.setattr(tokens_mod, "_SUB", 7)  # many small tasks: their order must not matter
    texts = _texts(128, 16)
    analyzer = get_analyzer(analyzer_name)
    here = TokenMatrix.build(texts, analyzer, workers=1, batch=100)
    forked = TokenMatrix.build(texts, analyzer, workers=2, batch=100)
    assert forked.vocab == here.vocab
    for name in ("doc_len", "indptr", "docs", "tf"):
        np.testing.assert_array_equal(getattr(forked, name), getattr(here, name))
    assert here.n_chunks == len(texts)
