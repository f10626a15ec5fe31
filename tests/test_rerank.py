"""Rerankers: the HTTP client against a real loopback server, and the cross-encoder
against a tiny BERT model built and saved inside the test (none ships offline)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from rerank_server import RerankServer, overlap_score

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.core.retry import EXCERPT_CHARS
from rag_ablate.pipeline import rerank
from rag_ablate.pipeline.rerank import (
    CROSS_ENCODER_HINT,
    CrossEncoderReranker,
    HttpReranker,
    Reranker,
    RerankError,
    make_reranker,
)
from rag_ablate.pipeline.stages import RERANKERS

# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def server() -> Iterator[RerankServer]:
    with RerankServer() as srv:
        yield srv
    assert srv.errors == [], "the test server raised inside a handler"


@pytest.fixture
def make_http(server: RerankServer) -> Iterator[Callable[..., HttpReranker]]:
    """Build HttpRerankers against ``server``; all are closed before the server stops."""
    made: list[HttpReranker] = []

    def make(**kwargs: Any) -> HttpReranker:
        reranker = HttpReranker(server.url, **kwargs)
        made.append(reranker)
        return reranker

    yield make
    for reranker in made:
        reranker.close()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the waits between retries instead of sleeping through them."""
    recorded: list[float] = []
    monkeypatch.setattr(rerank, "_sleep", recorded.append)
    return recorded


def assert_backoff(waits: list[float], first: float = 0.25) -> None:
    """Exponential backoff with jitter: wait n is 50-100% of ``first * 2**n`` (at most 5 s)."""
    for n, wait in enumerate(waits):
        full = min(first * 2**n, rerank.MAX_WAIT_SECONDS)
        assert full / 2 <= wait <= full, (n, wait)


EN_QUERY = "when does express shipping arrive"
EN_DOCS = [
    "You can return most items within 30 days of delivery.",
    "Express shipping arrives the next day when ordered before noon.",
    "Electronics carry a one year warranty against defects.",
    "Standard shipping takes 3 to 5 business days.",
]
ZH_QUERY = "退货运费由谁承担"
ZH_DOCS = [
    "快递一般三到五天送达。",
    "商品签收后七天内可以申请退货。",
    "如果商品有质量问题，退货运费由我们承担。",
]


# --------------------------------------------------------------------------- HTTP: ranking


def test_http_ranks_english(server: RerankServer, make_http: Callable[..., HttpReranker]) -> None:
    reranker = make_http()
    out = reranker.rerank(EN_QUERY, EN_DOCS, top_k=10)
    assert [i for i, _ in out] == [1, 3, 0, 2]  # express > standard shipping > returns > warranty
    for i, score in out:
        assert score == pytest.approx(overlap_score(EN_QUERY, EN_DOCS[i]))
    assert server.state.requests == 1
    assert server.state.last_body == {"query": EN_QUERY, "documents": EN_DOCS, "top_n": 4}
    assert server.state.last_headers["content-type"] == "application/json"
    assert "authorization" not in server.state.last_headers


def test_http_ranks_chinese(server: RerankServer, make_http: Callable[..., HttpReranker]) -> None:
    out = make_http().rerank(ZH_QUERY, ZH_DOCS, top_k=3)
    assert [i for i, _ in out] == [2, 1, 0]
    assert out[0][1] > out[1][1] > out[2][1] == 0.0
    assert server.state.last_body["documents"] == ZH_DOCS  # sent as UTF-8 JSON, not mangled


def test_http_top_n_honoured(server: RerankServer, make_http: Callable[..., HttpReranker]) -> None:
    reranker = make_http()
    out = reranker.rerank(EN_QUERY, EN_DOCS, top_k=2)
    assert [i for i, _ in out] == [1, 3]
    assert server.state.last_body["top_n"] == 2
    assert [i for i, _ in reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)] == [1]


def test_http_sends_model_and_reuses_one_connection(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    reranker = make_http(model="tiny-rerank-v1")
    for _ in range(3):
        reranker.rerank(EN_QUERY, EN_DOCS, top_k=2)
    assert server.state.last_body["model"] == "tiny-rerank-v1"
    assert server.state.requests == 3
    assert server.state.connections == 1  # keep-alive: one client, one connection


def test_http_empty_passages_make_no_request(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    assert make_http().rerank(EN_QUERY, [], top_k=5) == []
    assert server.state.requests == 0


def test_http_accepts_data_and_score_keys(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    server.state.results_key, server.state.score_key = "data", "score"
    out = make_http().rerank(EN_QUERY, EN_DOCS, top_k=2)
    assert [i for i, _ in out] == [1, 3]
    assert out[0][1] == pytest.approx(overlap_score(EN_QUERY, EN_DOCS[1]))


# --------------------------------------------------------------------------- HTTP: retries and errors


def test_http_retries_500s_then_succeeds(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    server.state.fail_first = 2
    out = make_http(max_retries=2).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert out[0][0] == 1
    assert server.state.requests == 3  # two failures, then the answer
    assert len(waits) == 2
    assert_backoff(waits)


def test_http_backoff_jitter_is_reproducible_from_the_seed(server: RerankServer, waits: list[float]) -> None:
    runs = []
    for seed in (7, 7, 8):
        server.state.requests, server.state.fail_first = 0, 2
        with HttpReranker(server.url, max_retries=2, seed=seed) as reranker:
            reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)
        runs.append(waits[-2:])
    assert runs[0] == runs[1] != runs[2]


def test_http_500s_exhaust_retries(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    server.state.fail_first = 10
    with pytest.raises(RerankError) as info:
        make_http(max_retries=2).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert info.value.status == 500
    assert server.state.requests == 3
    assert "HTTP 500 after 3 attempts" in str(info.value)
    assert "induced failure 3" in str(info.value)  # the last body, quoted
    assert len(waits) == 2


def test_http_no_retries_when_max_retries_is_zero(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    server.state.fail_first = 1
    with pytest.raises(RerankError) as info:
        make_http(max_retries=0).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert info.value.status == 500
    assert server.state.requests == 1
    assert waits == []


def test_http_429_retried_honouring_retry_after(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    # Real sleeps here: Retry-After: 0 must win over a (deliberately long) backoff.
    server.state.fail_first, server.state.fail_status, server.state.fail_retry_after = 1, 429, "0"
    reranker = make_http(max_retries=2)
    reranker.backoff_seconds = 4.0
    t0 = time.perf_counter()
    out = reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert time.perf_counter() - t0 < 2.0
    assert out[0][0] == 1
    assert server.state.requests == 2


@pytest.mark.parametrize(
    ("header", "expected"), [("120", 5.0), ("2", 2.0), ("0", 0.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)]
)
def test_http_retry_after_honoured_and_capped(
    server: RerankServer,
    make_http: Callable[..., HttpReranker],
    waits: list[float],
    header: str,
    expected: float,
) -> None:
    server.state.fail_first, server.state.fail_status, server.state.fail_retry_after = 1, 503, header
    make_http().rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert waits == [expected]  # seconds capped at 5; an HTTP date in the past: at once


def test_http_retry_after_as_an_http_date_is_waited_for(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    # the server dates its Retry-After 3 s after the failure, to the second (RFC 9110's IMF-fixdate)
    server.state.fail_first, server.state.fail_status, server.state.fail_retry_at = 2, 429, 3.0
    out = make_http(max_retries=2).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert out[0][0] == 1
    assert server.state.requests == 3
    assert len(waits) == 2
    assert all(1.5 < w <= 3.0 for w in waits), waits  # not the 0.25 s / 0.5 s backoff


@pytest.mark.parametrize("header", ["1.5", "soon", "-3", ""])
def test_http_retry_after_that_is_neither_seconds_nor_a_date_falls_back_to_the_backoff(
    server: RerankServer,
    make_http: Callable[..., HttpReranker],
    waits: list[float],
    header: str,
) -> None:
    server.state.fail_first, server.state.fail_status, server.state.fail_retry_after = 1, 503, header
    make_http().rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert len(waits) == 1
    assert_backoff(waits)


def test_http_400_fails_at_once_with_body(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    server.state.reject_status = 400
    with pytest.raises(RerankError) as info:
        make_http(max_retries=3).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert info.value.status == 400
    assert server.state.requests == 1
    assert waits == []
    msg = str(info.value)
    assert "HTTP 400 after 1 attempt" in msg
    assert "query is too long" in msg
    assert server.url in msg


def test_http_error_body_excerpt_is_the_shared_one(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    server.state.reject_status = 422
    server.state.reject_body = {"detail": "x" * 1000}
    with pytest.raises(RerankError) as info:
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=1)
    msg = str(info.value)
    excerpt = json.dumps(server.state.reject_body)[:EXCERPT_CHARS]
    assert excerpt + "..." in msg
    assert "x" * EXCERPT_CHARS not in msg  # the excerpt starts with '{"detail": "'


def test_http_empty_body_is_named_as_such(
    server: RerankServer, make_http: Callable[..., HttpReranker]
) -> None:
    server.state.raw_body = ""
    with pytest.raises(RerankError, match=r"the body is not JSON; body: <empty body>$"):
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=1)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("<html>Bad Gateway</html>", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"results": "nope"}', "no 'results' (or 'data') list"),
        ('{"output": []}', "no 'results' (or 'data') list"),
        ('{"results": [7]}', "results[0] is not an object"),
        ('{"results": [{"index": "0", "relevance_score": 1.0}]}', "results[0] has no integer 'index'"),
        ('{"results": [{"index": 0}]}', "results[0] has no finite number"),
        ('{"results": [{"index": 0, "relevance_score": "high"}]}', "results[0] has no finite number"),
        ('{"results": [{"index": 0, "relevance_score": NaN}]}', "results[0] has no finite number"),
        (
            '{"results": [{"index": 1, "relevance_score": 0.5}, {"index": 1, "score": 0.4}]}',
            "results[1] repeats index 1",
        ),
    ],
)
def test_http_malformed_body(
    server: RerankServer, make_http: Callable[..., HttpReranker], body: str, problem: str
) -> None:
    server.state.raw_body = body
    with pytest.raises(RerankError) as info:
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=2)
    assert info.value.status == 200
    assert problem in str(info.value)
    assert body[:40] in str(info.value)  # the body excerpt
    assert server.state.requests == 1  # a malformed answer is not retried


def test_http_index_out_of_range(server: RerankServer, make_http: Callable[..., HttpReranker]) -> None:
    server.state.index_offset = 3  # the service numbers documents wrongly
    with pytest.raises(RerankError, match=r"index \d+ is out of range for 4 documents"):
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=4)


def test_http_timeout(
    server: RerankServer, make_http: Callable[..., HttpReranker], waits: list[float]
) -> None:
    server.state.delay = 3.0  # longer than the client's timeout; interrupted when the server stops
    t0 = time.perf_counter()
    with pytest.raises(RerankError) as info:
        make_http(timeout=0.2, max_retries=1).rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert time.perf_counter() - t0 < 2.0
    assert info.value.status is None
    assert "Timeout" in str(info.value)
    assert "after 2 attempts" in str(info.value)
    assert server.state.requests == 2  # timeouts are retried
    assert len(waits) == 1
    assert_backoff(waits)


def test_http_connection_refused(waits: list[float]) -> None:
    with RerankServer() as srv:
        url = srv.url
    with HttpReranker(url, max_retries=1) as reranker, pytest.raises(RerankError) as info:
        reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert info.value.status is None
    assert "ConnectError" in str(info.value)
    assert len(waits) == 1
    assert_backoff(waits)


def test_http_bearer_token_from_env(
    server: RerankServer, make_http: Callable[..., HttpReranker], monkeypatch: pytest.MonkeyPatch
) -> None:
    server.state.token = "s3cret-token"
    monkeypatch.setenv("RAG_ABLATE_TEST_RERANK_KEY", "s3cret-token")
    out = make_http(api_key_env="RAG_ABLATE_TEST_RERANK_KEY").rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert out[0][0] == 1
    assert server.state.last_headers["authorization"] == "Bearer s3cret-token"

    with pytest.raises(RerankError) as info:  # no token: 401, not retried
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert info.value.status == 401
    assert server.state.requests == 2


def test_http_missing_api_key_env_is_config_error(
    server: RerankServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAG_ABLATE_TEST_RERANK_KEY", raising=False)
    with pytest.raises(ConfigError, match="RAG_ABLATE_TEST_RERANK_KEY"):
        HttpReranker(server.url, api_key_env="RAG_ABLATE_TEST_RERANK_KEY")
    monkeypatch.setenv("RAG_ABLATE_TEST_RERANK_KEY", "  ")
    with pytest.raises(ConfigError, match="is empty"):
        HttpReranker(server.url, api_key_env="RAG_ABLATE_TEST_RERANK_KEY")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "ftp://127.0.0.1/rerank"},
        {"url": ""},
        {"url": "http://127.0.0.1:1/rerank", "timeout": 0},
        {"url": "http://127.0.0.1:1/rerank", "max_retries": -1},
    ],
)
def test_http_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        HttpReranker(**kwargs)


def test_http_bad_top_k(server: RerankServer, make_http: Callable[..., HttpReranker]) -> None:
    with pytest.raises(ConfigError, match="top_k"):
        make_http().rerank(EN_QUERY, EN_DOCS, top_k=0)
    assert server.state.requests == 0


def test_http_context_manager_and_owned_client(server: RerankServer) -> None:
    with HttpReranker(server.url) as reranker:
        assert isinstance(reranker, Reranker)
        reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)
    assert reranker._client.is_closed
    reranker.close()  # idempotent
    with pytest.raises(RerankError, match="was closed"):
        reranker.rerank(EN_QUERY, EN_DOCS, top_k=1)

    with httpx.Client() as shared:
        borrowed = HttpReranker(server.url, client=shared, timeout=5.0)
        borrowed.rerank(EN_QUERY, EN_DOCS, top_k=1)
        borrowed.close()
        assert not shared.is_closed  # a client passed in belongs to the caller


# MockTransport only for parsing variants a plain server would not produce.


def _mock(payload: Any, seen: list[dict[str, Any]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=payload)

    return httpx.Client(transport=httpx.MockTransport(handler))


def test_http_resorts_ties_by_index_and_truncates_to_top_k() -> None:
    seen: list[dict[str, Any]] = []
    payload = {  # unsorted, ties, more results than asked for
        "data": [
            {"index": 3, "score": 0.5},
            {"index": 0, "score": 0.2},
            {"index": 2, "score": 0.9},
            {"index": 1, "score": 0.5},
            {"index": 4, "score": -1},
        ]
    }
    with _mock(payload, seen) as client:
        out = HttpReranker("http://rerank.invalid/v1/rerank", client=client).rerank(
            "q", list("abcde"), top_k=3
        )
    assert out == [(2, 0.9), (1, 0.5), (3, 0.5)]
    assert seen == [{"query": "q", "documents": list("abcde"), "top_n": 3}]


def test_http_prefers_relevance_score_and_results() -> None:
    payload = {
        "results": [{"index": 0, "relevance_score": 0.1, "score": 99}, {"index": 1, "relevance_score": 0.7}],
        "data": [{"index": 0, "score": 5}],
    }
    with _mock(payload, []) as client:
        out = HttpReranker("http://rerank.invalid/rerank", client=client).rerank("q", ["a", "b"], top_k=5)
    assert out == [(1, 0.7), (0, 0.1)]


# --------------------------------------------------------------------------- cross-encoder

VOCAB_WORDS = [
    *("how", "long", "does", "express", "shipping", "take", "return", "refund", "item", "items", "days"),
    *("warranty", "water", "damage", "covered", "the", "a", "is", "by", "next", "day", "standard"),
    *("business", "fee", "faulty", "who", "pays"),
]


def _build_tiny_cross_encoder(folder: Path, *, num_labels: int = 1, seed: int = 0) -> Path:
    """A 1-layer BERT sequence classifier with a WordPiece tokenizer written from scratch."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *VOCAB_WORDS, *"退货运费多久保修", "##s"]
    # In transformers 5 BertTokenizer is tokenizers-backed and takes the WordPiece vocabulary as a
    # mapping; a ``vocab_file=`` keyword is silently ignored (every word would become [UNK]).
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
        initializer_range=0.2,  # spread the untrained model's scores apart
    )
    config.num_labels = num_labels
    model = BertForSequenceClassification(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.mark.slow
def test_tiny_model_tokenizes_known_words(tiny_ce: CrossEncoderReranker) -> None:
    tokens = tiny_ce.model.tokenizer.tokenize("Express shipping items 退货")
    assert tokens == ["express", "shipping", "items", "退", "货"]  # no [UNK]: the vocabulary was loaded


@pytest.fixture(scope="module")
def tiny_ce_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny_ce"))


@pytest.fixture(scope="module")
def tiny_ce(tiny_ce_dir: Path) -> CrossEncoderReranker:
    return CrossEncoderReranker(str(tiny_ce_dir))


CE_QUERY = "how long does express shipping take"
CE_DOCS = [
    "return the item within 30 days",
    "express shipping takes the next day",
    "warranty is covered by the fee",
    "standard shipping takes 5 business days",
    "water damage is not covered",
    "退货运费",
]


@pytest.mark.slow
def test_cross_encoder_scores_match_predict(tiny_ce_dir: Path, tiny_ce: CrossEncoderReranker) -> None:
    import torch
    from sentence_transformers import CrossEncoder

    out = tiny_ce.rerank(CE_QUERY, CE_DOCS, top_k=4)
    assert len(out) == 4
    assert len({i for i, _ in out}) == 4
    assert all(0 <= i < len(CE_DOCS) for i, _ in out)
    assert tiny_ce.rerank(CE_QUERY, CE_DOCS, top_k=4) == out  # deterministic

    reference = CrossEncoder(str(tiny_ce_dir), device="cpu", local_files_only=True)
    pairs = [(CE_QUERY, d) for d in CE_DOCS]
    logits = np.asarray(reference.predict(pairs, activation_fn=torch.nn.Identity(), show_progress_bar=False))
    assert logits.shape == (len(CE_DOCS),)
    assert len(set(logits.tolist())) == len(CE_DOCS)  # the tiny model separates every passage
    expected = sorted(range(len(CE_DOCS)), key=lambda i: (-float(logits[i]), i))[:4]
    assert [i for i, _ in out] == expected
    assert [s for _, s in out] == [float(logits[i]) for i in expected]  # raw logits, exactly

    # not the default sigmoid-squashed scores
    probs = np.asarray(reference.predict(pairs, show_progress_bar=False))
    assert [float(probs[i]) for i in expected] == pytest.approx([1 / (1 + math.exp(-s)) for _, s in out])


@pytest.mark.slow
def test_cross_encoder_top_k_beyond_passages_and_empty(tiny_ce: CrossEncoderReranker) -> None:
    out = tiny_ce.rerank(CE_QUERY, CE_DOCS[:3], top_k=10)
    assert sorted(i for i, _ in out) == [0, 1, 2]
    assert tiny_ce.rerank(CE_QUERY, [], top_k=3) == []
    with pytest.raises(ConfigError, match="top_k"):
        tiny_ce.rerank(CE_QUERY, CE_DOCS, top_k=0)


@pytest.mark.slow
def test_cross_encoder_truncates_long_passages(tiny_ce_dir: Path) -> None:
    short = CrossEncoderReranker(str(tiny_ce_dir), max_length=16, batch_size=2)
    long_passage = " ".join(["express shipping takes the next day"] * 200)  # ~1200 tokens
    out = short.rerank(CE_QUERY, [long_passage, CE_DOCS[0], CE_DOCS[2]], top_k=3)
    assert sorted(i for i, _ in out) == [0, 1, 2]


@pytest.mark.slow
def test_cross_encoder_orders_by_score_with_ties(
    tiny_ce: CrossEncoderReranker, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[tuple[str, str]]] = []
    known = np.array([0.1, 0.9, 0.5, 0.9, -2.0], dtype=np.float32)

    def fake_predict(pairs: Sequence[tuple[str, str]], **kwargs: Any) -> np.ndarray:
        calls.append(list(pairs))
        return known

    monkeypatch.setattr(tiny_ce.model, "predict", fake_predict)
    passages = ["p0", "p1", "p2", "p3", "p4"]
    out = tiny_ce.rerank("q", passages, top_k=4)
    assert [i for i, _ in out] == [1, 3, 2, 0]  # 0.9 tie: lower index first
    assert [s for _, s in out] == [float(known[i]) for i in (1, 3, 2, 0)]
    assert calls == [[("q", p) for p in passages]]  # one predict call with every pair

    known[:] = [3.0, 2.0, 1.0, 0.0, np.nan]
    with pytest.raises(RerankError, match=r"non-finite scores for passages \[4\]"):
        tiny_ce.rerank("q", passages, top_k=2)


@pytest.mark.slow
def test_cross_encoder_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError) as info:
        CrossEncoderReranker(str(missing))
    assert str(missing) in str(info.value)
    assert CROSS_ENCODER_HINT in str(info.value)


@pytest.mark.slow
def test_cross_encoder_folder_that_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.json") as info:
        CrossEncoderReranker(str(tmp_path))
    assert CROSS_ENCODER_HINT in str(info.value)

    (tmp_path / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot load a cross-encoder") as info:
        CrossEncoderReranker(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert CROSS_ENCODER_HINT in str(info.value)


@pytest.mark.slow
def test_cross_encoder_bad_settings(tiny_ce_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        CrossEncoderReranker(str(tiny_ce_dir), batch_size=0)
    with pytest.raises(ConfigError, match="exceeds the 512 positions"):
        CrossEncoderReranker(str(tiny_ce_dir), max_length=4096)
    two_labels = _build_tiny_cross_encoder(tmp_path / "two", num_labels=2)
    with pytest.raises(ConfigError, match="num_labels=1"):
        CrossEncoderReranker(str(two_labels))


# --------------------------------------------------------------------------- make_reranker


def test_make_reranker_none_and_unknown() -> None:
    assert make_reranker("none") is None
    assert make_reranker("none", url="ignored") is None
    with pytest.raises(UnknownNameError) as info:
        make_reranker("colbert")
    assert info.value.valid == sorted(RERANKERS)
    assert "biencoder, cross_encoder, http, none" in str(info.value)
    with pytest.raises(ConfigError, match="built by the pipeline"):
        make_reranker("biencoder")


@pytest.mark.slow
def test_make_reranker_builds_http_and_cross_encoder(server: RerankServer, tiny_ce_dir: Path) -> None:
    http = make_reranker("http", url=server.url, timeout=5.0)
    assert isinstance(http, HttpReranker)
    try:
        assert http.rerank(EN_QUERY, EN_DOCS, top_k=1)[0][0] == 1
    finally:
        http.close()
    ce = make_reranker("cross_encoder", model_path=str(tiny_ce_dir), batch_size=4)
    assert isinstance(ce, CrossEncoderReranker)
    assert ce.name == "cross_encoder"
    with pytest.raises(ConfigError, match="rerank=http"):
        make_reranker("http", url=server.url, candidates=50)  # not an HttpReranker option
    with pytest.raises(ConfigError, match="rerank=cross_encoder"):
        make_reranker("cross_encoder")  # model_path missing
