"""rag_ablate.llm.client.ChatClient against the deterministic OpenAI-compatible server of tests/fake_llm.py
(real HTTP on 127.0.0.1, the real wire format, streamed and not)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.cache import STORE_FILE, Cache, content_key
from rag_ablate.core.errors import ConfigError, GenerationError
from rag_ablate.llm.client import CACHE_KIND, ChatClient
from rag_ablate.text.count import count_tokens
from tests.fake_llm import FakeLLM

CANARY = "sk-canary-llm-91c3e07d5a"  # a fake key: must never reach a file
MESSAGES = [
    {"role": "system", "content": "You grade answers."},
    {"role": "user", "content": "Is the sky blue? Reply with JSON."},
]
_OPEN: list[ChatClient] = []


def _client(url: str, cache: Cache | None = None, **overrides: Any) -> ChatClient:
    kwargs: dict[str, Any] = {
        "owner": "judge",
        "base_url": url,
        "model": "test-model",
        "api_key_env": None,
        "timeout_s": 10.0,
        "retries": 2,
        "backoff_s": 0.01,
        "backoff_max_s": 5.0,
        "cache": cache,
    }
    kwargs.update(overrides)
    client = ChatClient(**kwargs)
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def test_non_streamed_call_reads_the_message_and_usage(fake_llm: FakeLLM) -> None:
    fake_llm.respond = lambda body, call: '{"verdict": true}'
    client = _client(fake_llm.url)
    r = client.complete(
        MESSAGES, temperature=0.0, max_tokens=50, stream=False, response_format={"type": "json_object"}
    )
    assert r.text == '{"verdict": true}' and r.ttft_ms is None and not r.cached and r.retries == 0
    (req,) = fake_llm.requests
    body = req["body"]
    assert req["path"] == "/v1/chat/completions"
    assert body == {
        "model": "test-model",
        "messages": MESSAGES,
        "temperature": 0.0,
        "max_tokens": 50,
        "stream": False,
        "response_format": {"type": "json_object"},
    }
    # the fake server counts whitespace-separated words of every message, and of the reply
    prompt_words = 10  # "You grade answers." + "Is the sky blue? Reply with JSON."
    assert r.usage == {
        "prompt_tokens": prompt_words,
        "completion_tokens": 2,
        "total_tokens": prompt_words + 2,
    }
    assert r.usage_count is None and client.calls == 1 and r.latency_ms > 0


def test_streamed_call_measures_time_to_first_token(fake_llm: FakeLLM) -> None:
    fake_llm.first_delay_s, fake_llm.piece_delay_s = 0.05, 0.03
    fake_llm.respond = lambda body, call: "one two three four"
    t0 = time.perf_counter()
    r = _client(fake_llm.url).complete(MESSAGES, temperature=0.3, max_tokens=20)
    total_ms = (time.perf_counter() - t0) * 1000
    assert r.text == "one two three four"
    assert r.ttft_ms is not None and 50 <= r.ttft_ms < total_ms - 2 * 30  # three more pieces after it
    body = fake_llm.requests[0]["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "response_format" not in body
    assert r.usage is not None and r.usage["completion_tokens"] == 4


@pytest.mark.parametrize("stream", [True, False])
def test_local_token_count_when_the_api_sends_no_usage(fake_llm: FakeLLM, stream: bool) -> None:
    fake_llm.usage = False
    fake_llm.respond = lambda body, call: "退货期限是三十天。"
    r = _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=stream)
    prompt = count_tokens("You grade answers.") + count_tokens("Is the sky blue? Reply with JSON.")
    completion = count_tokens("退货期限是三十天。")
    assert r.usage_count == "local"
    assert r.usage == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    assert completion >= 8  # one per Chinese character, not one per whitespace word


@pytest.mark.parametrize("stream", [True, False])
def test_retry_after_is_honoured(fake_llm: FakeLLM, stream: bool) -> None:
    fake_llm.failures = [(429, {"Retry-After": "1"})]
    client = _client(fake_llm.url, backoff_s=0.0)
    r = client.complete(MESSAGES, temperature=0.0, max_tokens=20, stream=stream)
    assert r.retries == 1 and client.calls == 2 and len(fake_llm.requests) == 2
    waited = fake_llm.requests[1]["t"] - fake_llm.requests[0]["t"]
    assert 1.0 <= waited < 2.0 and r.latency_ms >= 1000  # the wait is part of the call's time
    assert r.text.endswith("(call 2).")


def test_server_errors_are_retried_then_reported_with_the_owner(fake_llm: FakeLLM) -> None:
    fake_llm.failures = [(500, {}), (503, {})]
    r = _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=False)
    assert r.retries == 2 and r.text.endswith("(call 3).")

    fake_llm.failures = [(502, {})] * 3
    with pytest.raises(
        GenerationError, match=r"^judge endpoint http://127\.0\.0\.1:\d+/v1/chat/completions: HTTP 502"
    ):
        _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=False)
    assert len(fake_llm.requests) == 6

    fake_llm.failures = [(401, {})]
    with pytest.raises(GenerationError, match="HTTP 401") as exc:  # not retried
        _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=False)
    assert (
        exc.value.status == "access_denied" and exc.value.http_status == 401 and len(fake_llm.requests) == 7
    )


def test_a_stream_with_no_content_is_retried_then_a_bad_response(fake_llm: FakeLLM) -> None:
    """llama_cpp.server ends a request it cancelled with [DONE] and no content: never an empty answer."""
    replies = iter(["", "Yes [1]."])
    fake_llm.respond = lambda body, call: next(replies)
    r = _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=True)
    assert r.text == "Yes [1]." and r.retries == 1

    fake_llm.respond = lambda body, call: ""
    with pytest.raises(GenerationError, match="the stream ended before any content") as exc:
        _client(fake_llm.url).complete(MESSAGES, temperature=0.0, max_tokens=20, stream=True)
    assert exc.value.status == "bad_response"
    assert len(fake_llm.requests) == 2 + 3  # the first call's two tries, then three tries in vain


def test_no_server_is_an_http_error_after_the_retries() -> None:
    client = _client("http://127.0.0.1:9/v1", retries=1)  # the discard port: nothing listens
    with pytest.raises(GenerationError, match="ConnectError") as exc:
        client.complete(MESSAGES, temperature=0.0, max_tokens=20, stream=False)
    assert exc.value.status == "http_error" and client.calls == 2


def test_cache_key_parts_by_hand(fake_llm: FakeLLM, tmp_path: Path) -> None:
    client = _client(fake_llm.url)
    digest = hashlib.sha256(json.dumps(MESSAGES, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
    expected = {
        "endpoint": f"{fake_llm.url}/chat/completions",
        "model": "test-model",
        "prompt_sha256": digest,
        "sampling": {"temperature": 0.0, "max_tokens": 20},
        "repeat": 0,
    }
    # without response_format the key is the one generator=openai has always used (old entries still hit)
    assert client.cache_parts(MESSAGES, temperature=0.0, max_tokens=20) == expected
    with_format = client.cache_parts(
        MESSAGES, temperature=0.0, max_tokens=20, response_format={"type": "json_object"}, repeat=2
    )
    assert (
        with_format["sampling"]["response_format"] == {"type": "json_object"} and with_format["repeat"] == 2
    )

    cache = Cache(tmp_path / "cache")
    _client(fake_llm.url, cache).complete(MESSAGES, temperature=0.0, max_tokens=20)
    with contextlib.closing(sqlite3.connect(tmp_path / "cache" / STORE_FILE)) as db:
        rows = db.execute("SELECT key, kind, parts FROM entries").fetchall()
    assert rows == [(content_key(CACHE_KIND, expected), CACHE_KIND, json.dumps(expected, sort_keys=True))]


def test_cache_hit_miss_and_repeats(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fmt = {"type": "json_object"}

    def call(cache: Cache, messages: list[dict[str, str]] = MESSAGES, **kw: Any) -> Any:
        args: dict[str, Any] = {"temperature": 0.0, "max_tokens": 20, "stream": False, "response_format": fmt}
        args.update(kw)
        return _client(fake_llm.url, cache).complete(messages, **args)

    first = call(Cache(tmp_path / "c"))
    cache = Cache(tmp_path / "c")  # a rerun: a new process starts with fresh counts
    again = call(cache)
    assert len(fake_llm.requests) == 1 and again.cached and not first.cached
    assert (again.text, again.usage, again.latency_ms) == (first.text, first.usage, first.latency_ms)
    assert cache.metrics()["run/cache_llm_calls_hits"] == 1.0

    # a changed prompt, sampling parameter or response format never hits; each repeat is its own sample
    changed = [{"role": "user", "content": MESSAGES[1]["content"] + " "}]
    texts = [
        call(cache, changed).text,
        call(cache, max_tokens=21).text,
        call(cache, response_format=None).text,
        call(cache, repeat=1).text,
        call(cache, repeat=2).text,
    ]
    assert [t[-9:] for t in texts] == [f"(call {i})." for i in range(2, 7)]  # five new server calls
    assert call(cache, repeat=2).text == texts[-1] and len(fake_llm.requests) == 6
    assert cache.metrics()["run/cache_llm_calls_misses"] == 5.0


def test_key_read_at_send_time_and_never_stored(
    fake_llm: FakeLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAG_ABLATE_LLM_TEST_KEY", "old-value")
    client = _client(fake_llm.url, Cache(tmp_path / "cache"), api_key_env="RAG_ABLATE_LLM_TEST_KEY")
    monkeypatch.setenv("RAG_ABLATE_LLM_TEST_KEY", CANARY)  # rotated after the client was built
    client.complete(MESSAGES, temperature=0.0, max_tokens=20)
    client.complete(MESSAGES, temperature=0.0, max_tokens=20, stream=False, repeat=1)
    assert [r["auth"] for r in fake_llm.requests] == [f"Bearer {CANARY}"] * 2
    assert CANARY not in json.dumps(vars(client), default=str)
    files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == sorted(STORE_FILE + end for end in ("", "-shm", "-wal"))
    with contextlib.closing(sqlite3.connect(tmp_path / "cache" / STORE_FILE)) as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone() == (2,)  # two entries
    for p in files:
        assert CANARY.encode() not in p.read_bytes() and b"old-value" not in p.read_bytes(), p

    monkeypatch.delenv("RAG_ABLATE_NO_SUCH_KEY", raising=False)
    with pytest.raises(
        ConfigError, match=r"judge\.api_key_env names .*'RAG_ABLATE_NO_SUCH_KEY', which is not set"
    ):
        _client(fake_llm.url, api_key_env="RAG_ABLATE_NO_SUCH_KEY")


def test_one_client_shared_by_threads(fake_llm: FakeLLM) -> None:
    client = _client(fake_llm.url)
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(
                lambda i: client.complete(
                    [{"role": "user", "content": f"question {i}"}],
                    temperature=0.0,
                    max_tokens=20,
                    stream=i % 2 == 0,
                ),
                range(16),
            )
        )
    assert client.calls == 16 == len(fake_llm.requests)
    calls = sorted(int(r.text.rsplit("(call ", 1)[1].rstrip(").")) for r in results)
    assert calls == list(range(1, 17))  # every reply is its own request's
