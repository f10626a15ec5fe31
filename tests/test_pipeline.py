"""Chunking, analyzers, BM25 retrieval and the intent router."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import UnknownNameError
from rag_ablate.dataset.model import Document, Intent
from rag_ablate.pipeline.bm25 import BM25Retriever, top_k_indices
from rag_ablate.pipeline.chunking import chunk_corpus, chunk_document, detect_unit
from rag_ablate.pipeline.router import IntentRouter
from rag_ablate.text.analyzers import analyze_en, analyze_zh, get_analyzer

ZH = (
    "七天无理由退货适用于大部分商品。商品需保持完好，配件齐全。"
    "质量问题退货的运费由商家承担！非质量问题退货需要顾客自付运费；生鲜商品不支持无理由退货。"
) * 5


@pytest.mark.parametrize("size,overlap", [(50, 0), (50, 10), (64, 32), (7, 3), (1000, 100)])
@pytest.mark.parametrize("snap", [True, False])
def test_char_chunks_cover_text_with_offsets(size: int, overlap: int, snap: bool) -> None:
    doc = Document("D", ZH, "标题")
    chunks = chunk_document(doc, size, overlap, "char", snap)
    assert chunks[0].start == 0 and chunks[-1].end == len(ZH)
    for c in chunks:
        assert c.text == ZH[c.start : c.end] and c.doc_id == "D"
        assert 0 < c.end - c.start <= size
    for a, b in itertools.pairwise(chunks):
        assert a.start < b.start <= a.end  # progress, no gaps
        assert a.end - b.start <= overlap
    assert [c.chunk_id for c in chunks] == [f"D#{i}" for i in range(len(chunks))]


def test_snapping_prefers_sentence_ends() -> None:
    chunks = chunk_document(Document("D", ZH), 60, 0, "char", snap=True)
    assert sum(c.text[-1] in "。！？；" for c in chunks[:-1]) >= len(chunks[:-1]) - 1


@given(st.text(alphabet="ab cd.\n", min_size=1, max_size=400), st.integers(1, 30), st.integers(0, 29))
@settings(max_examples=150, deadline=None)
def test_token_chunks_property(text: str, size: int, overlap: int) -> None:
    overlap = min(overlap, size - 1)
    chunks = chunk_document(Document("D", text), size, overlap, "token", snap=True)
    words = text.split()
    if not words:
        assert all(c.text == text for c in chunks)
        return
    covered = " ".join(c.text for c in chunks).split()
    assert set(covered) <= set(words)
    assert chunks[0].start == text.index(words[0]) and chunks[-1].end == len(text.rstrip())
    for c in chunks:
        assert len(c.text.split()) <= size and c.text == text[c.start : c.end]


def test_unit_detection() -> None:
    assert detect_unit([ZH]) == "char"
    assert detect_unit(["The quick brown fox jumps over the lazy dog."]) == "token"
    chunks, unit = chunk_corpus([Document("A", ZH), Document("B", ZH[:30])], 100, 10)
    assert unit == "char" and {c.doc_id for c in chunks} == {"A", "B"}


def test_analyzers() -> None:
    assert analyze_en("The Return-policy of 30 days!") == ["return", "policy", "30", "days"]
    toks = analyze_zh("质量问题退货的运费由谁承担？")
    assert "运费" in toks and "的" not in toks and "？" not in toks
    with pytest.raises(UnknownNameError, match="valid: auto, en, zh"):
        get_analyzer("fr")


def test_top_k_ties_broken_by_key_and_zero_scores_dropped() -> None:
    scores = np.array([1.0, 2.0, 2.0, 0.0, 2.0, 0.5])
    tiebreak = np.array([5, 4, 0, 1, 2, 3])
    assert top_k_indices(scores, tiebreak, 2) == [2, 4]
    assert top_k_indices(scores, tiebreak, 10) == [2, 4, 1, 0, 5]
    assert top_k_indices(np.zeros(3), tiebreak[:3], 2) == []


def test_bm25_finds_the_right_chunk_and_is_deterministic() -> None:
    texts = ["return within 30 days", "express shipping next day", "warranty one year", "shipping fees"]
    keys = [("a", 0), ("b", 0), ("c", 0), ("d", 0)]
    r = BM25Retriever(texts, keys, analyze_en)
    hits = r.search("how fast is express shipping", 3)
    assert hits[0][0] == 1 and hits[1][0] == 3
    assert r.search("how fast is express shipping", 3) == hits
    assert r.search("zzz unknown words", 3) == []


def test_bm25_chinese() -> None:
    texts = ["七天无理由退货，商品需完好", "耳机续航三十小时，支持快充", "偏远地区配送需要五到七天"]
    r = BM25Retriever(texts, [("a", 0), ("b", 0), ("c", 0)], analyze_zh)
    assert r.search("耳机续航多久", 2)[0][0] == 1
    assert r.search("新疆配送要几天", 2)[0][0] == 2


@pytest.mark.parametrize("profile", ["centroid", "nearest"])
def test_router_routes_by_examples(profile: str) -> None:
    intents = [
        Intent("K_returns", "KNOWLEDGE", "退货 退款 退换", ("买了不想要能退吗", "退款多久到账")),
        Intent("K_shipping", "KNOWLEDGE", "配送 物流 快递", ("快递几天到", "能送到新疆吗")),
        Intent("C_greeting", "CHITCHAT", "问候 打招呼", ("你好", "在吗"), requires_rag=False),
    ]
    router = IntentRouter(intents, profile=profile)
    assert router.route("你好呀")[0] == "C_greeting"
    assert router.route("我的快递到哪了")[0] == "K_shipping"
    assert router.route("退款什么时候到")[0] == "K_returns"
    assert router.route("###") == (None, 0.0)


def test_router_unknown_profile() -> None:
    with pytest.raises(UnknownNameError, match="centroid, nearest"):
        IntentRouter([], profile="knn")


def test_top_k_keeps_non_positive_scores_when_asked() -> None:
    scores = np.array([-0.5, 0.0, 0.3, 0.3])
    assert top_k_indices(scores, np.array([3, 2, 1, 0]), 3, positive_only=False) == [3, 2, 1]
