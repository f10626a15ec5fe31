"""``generator=openai``: answers from any OpenAI-compatible chat-completions endpoint.

One request per query, ``POST {base_url}/chat/completions`` with ``stream: true`` and
``stream_options: {"include_usage": true}``, read as server-sent events with httpx
(no ``openai`` package: the wire format is small and httpx is already a dependency):

* ``ttft_ms`` is taken at the first chunk whose ``choices[0].delta.content`` is
  non-empty, counted from when the first try was sent (retries and their waits count);
* the answer is the concatenation of those pieces; its ``[n]`` markers become
  citations of the n-th context (:func:`citations_from_markers`);
* usage comes from the final chunk's ``usage`` (``prompt_tokens``,
  ``completion_tokens``, ``total_tokens``). A server that sends none gets a local
  count (:func:`rag_ablate.metrics.text.count_tokens` of the prompt and the answer),
  marked ``usage_count="local"`` so nobody mistakes it for the model's tokenizer.

The prompt template is config (``generator.prompt_en`` / ``prompt_zh``, chosen by
the query's language); :func:`prompt_hash` of both is the prompt version, reported
as ``generator.prompt_hash``. The key is read from the environment variable that
``generator.api_key_env`` names when a request is sent; it is never stored.

Retries: 429, 5xx and connect errors are sent again (``generator.retries`` times),
after the response's ``Retry-After`` or an exponential backoff with jitter
(:func:`rag_ablate.systems.http.backoff_wait`, shared with ``system=http``).

Cache: every successful call is stored under ``<cache dir>/llm_calls/``, keyed by the
endpoint, the model, the sha256 of the full request messages, the sampling parameters
and a repeat index. A rerun replays it (``cached=True``, with the original call's
latency, time to first token and tokens), a changed prompt or setting misses, and
``repeat=1, 2, ...`` are independent samples. Hits are counted as
``run/cache_llm_calls_hits``. See docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx
from httpx_sse import SSEError, connect_sse

from rag_ablate.errors import ConfigError
from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context, Generation, GenerationError
from rag_ablate.metrics.text import count_tokens, is_cjk_text
from rag_ablate.systems.base import Citation, TokenUsage
from rag_ablate.systems.http import backoff_wait, excerpt, retry_after_seconds, status_meaning

if TYPE_CHECKING:
    from rag_ablate.cache import Cache
    from rag_ablate.config import GeneratorConfig, RunConfig

CACHE_KIND = "llm_calls"
PLACEHOLDERS = ("{question}", "{contexts}")
_MARKER = re.compile(r"\[(\d+(?:\s*[,，]\s*\d+)*)\]")


class _Retry(Exception):
    def __init__(self, error: GenerationError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


# ---------------------------------------------------------------------- prompts and citations


def prompt_hash(cfg: GeneratorConfig) -> str:
    """The prompt version: sha256 (hex, 16 characters) of both templates."""
    payload = json.dumps({"en": cfg.prompt_en, "zh": cfg.prompt_zh}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def format_contexts(contexts: Sequence[Context]) -> str:
    """The contexts as the prompt shows them: ``[n] text``, one blank line between two."""
    return "\n\n".join(f"[{c.n}] {' '.join(c.text.split())}" for c in contexts)


def build_prompt(cfg: GeneratorConfig, query_text: str, contexts: Sequence[Context]) -> str:
    """The user message: the template of the query's language with its placeholders filled in."""
    template = cfg.prompt_zh if is_cjk_text(query_text) else cfg.prompt_en
    # one pass, so a question that contains "{contexts}" is not expanded again
    values = {"{question}": query_text, "{contexts}": format_contexts(contexts)}
    return re.sub(r"\{question\}|\{contexts\}", lambda m: values[m.group(0)], template)


def citations_from_markers(answer: str, contexts: Sequence[Context]) -> list[Citation]:
    """The contexts an answer cites with ``[n]`` (also ``[1, 3]``), in order of first mention.

    A number that names no context is ignored (a model may invent one).
    """
    by_n = {c.n: c for c in contexts}
    out: list[Citation] = []
    seen: set[int] = set()
    for m in _MARKER.finditer(answer):
        for part in re.split(r"[,，]", m.group(1)):
            n = int(part)
            if n in by_n and n not in seen:
                seen.add(n)
                out.append(by_n[n].citation())
    return out


def validate_openai(cfg: GeneratorConfig) -> None:
    """generator=openai needs an http(s) base_url, a model, both prompts with their placeholders."""
    if not cfg.base_url or not cfg.base_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"generator=openai needs generator.base_url starting with http:// or https://, got "
            f"'{cfg.base_url}', e.g. generator.base_url=http://127.0.0.1:8080/v1"
        )
    if not cfg.model:
        raise ConfigError("generator=openai needs generator.model, the model name the endpoint serves")
    for key in ("prompt_en", "prompt_zh"):
        template = getattr(cfg, key)
        missing = [p for p in PLACEHOLDERS if p not in template]
        if missing:
            raise ConfigError(f"generator.{key} must contain {' and '.join(missing)}")
    if cfg.max_tokens < 1 or cfg.timeout_s <= 0 or cfg.retries < 0 or cfg.temperature < 0:
        raise ConfigError(
            "generator.max_tokens must be >= 1, timeout_s > 0, retries >= 0 and temperature >= 0; got "
            f"{cfg.max_tokens}, {cfg.timeout_s}, {cfg.retries}, {cfg.temperature}"
        )
    if cfg.backoff_s < 0 or cfg.backoff_max_s < 0:
        raise ConfigError("generator.backoff_s and generator.backoff_max_s must be >= 0")


# ---------------------------------------------------------------------- the generator


class OpenAIGenerator:
    """A :class:`~rag_ablate.generators.base.Generator` over an OpenAI-compatible endpoint."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        self.cfg = settings.generator
        validate_openai(self.cfg)
        assert self.cfg.base_url is not None and self.cfg.model is not None
        self.url = self.cfg.base_url.rstrip("/") + "/chat/completions"
        self.model = self.cfg.model
        self.cache = cache
        self.prompt_hash = prompt_hash(self.cfg)
        self.calls = 0  # requests sent to the endpoint, retries included
        self._rng = random.Random(settings.seed)  # backoff jitter only
        self._client: httpx.Client | None = None
        if self.cfg.api_key_env and self.cfg.api_key_env not in os.environ:
            raise ConfigError(
                f"generator.api_key_env names the environment variable '{self.cfg.api_key_env}', "
                "which is not set; export it, or set generator.api_key_env=null for an endpoint without a key"
            )
        for name in ("httpx", "httpcore"):  # one INFO line per request would bury the run's output
            logging.getLogger(name).setLevel(logging.WARNING)

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        client = getattr(self, "_client", None)  # absent when __init__ raised
        if client is not None:
            client.close()
            self._client = None

    def __del__(self) -> None:  # a caller that never calls close() must not leak open sockets
        self.close()

    def _http(self) -> httpx.Client:
        if self._client is None:
            t = self.cfg.timeout_s
            self._client = httpx.Client(timeout=httpx.Timeout(t, connect=t))
        return self._client

    def request_body(self, prompt: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.cfg.temperature,
            "max_tokens": self.cfg.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def cache_parts(self, body: dict[str, Any], repeat: int) -> dict[str, Any]:
        """The model-call cache key: endpoint, model, full prompt hash, sampling parameters, repeat index."""
        messages = json.dumps(body["messages"], sort_keys=True, ensure_ascii=False)
        return {
            "endpoint": self.url,
            "model": self.model,
            "prompt_sha256": hashlib.sha256(messages.encode("utf-8")).hexdigest(),
            "sampling": {"temperature": body["temperature"], "max_tokens": body["max_tokens"]},
            "repeat": repeat,
        }

    def generate(self, query_text: str, contexts: list[Context], *, repeat: int = 0) -> Generation:
        """Answer one query; ``repeat`` selects an independent sample (its own cache entry)."""
        prompt = build_prompt(self.cfg, query_text, contexts)
        body = self.request_body(prompt)
        t0 = time.perf_counter()
        if self.cache is None:
            value, cached = self._call(body, prompt), False
        else:
            st = self.cache.stats.get(CACHE_KIND)
            hits_before = st.hits if st is not None else 0
            value = self.cache.json(
                CACHE_KIND, self.cache_parts(body, repeat), lambda: self._call(body, prompt)
            )
            cached = self.cache.stats[CACHE_KIND].hits > hits_before
        answer = str(value["answer"])
        usage = value.get("usage")
        return Generation(
            answer=answer,
            citations=citations_from_markers(answer, contexts),
            usage=None if usage is None else TokenUsage.from_dict(usage),
            ttft_ms=value.get("ttft_ms"),
            cached=cached,
            usage_count=value.get("usage_count"),
            latency_ms=value.get("total_ms") if cached else (time.perf_counter() - t0) * 1000,
        )

    # ------------------------------------------------------------------ one call, with retries

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.cfg.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(self.cfg.api_key_env, '')}"
        return headers

    def _call(self, body: dict[str, Any], prompt: str) -> dict[str, Any]:
        """The streamed call as a JSON-able value (what the cache stores); raises GenerationError."""
        t0 = time.perf_counter()
        retries = 0
        while True:
            try:
                value = self._stream(body, t0)
                break
            except _Retry as r:
                if retries >= self.cfg.retries:
                    raise r.error from None
                wait = backoff_wait(
                    retries, r.retry_after, self.cfg.backoff_s, self.cfg.backoff_max_s, self._rng
                )
                retries += 1
                time.sleep(wait)
        value["retries"] = retries
        value["total_ms"] = (time.perf_counter() - t0) * 1000
        if value.get("usage") is None:
            completion = count_tokens(value["answer"])
            prompt_tokens = count_tokens(prompt)
            value["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
            value["usage_count"] = "local"
        return value

    def _stream(self, body: dict[str, Any], t0: float) -> dict[str, Any]:
        """One try. Only failures before any content arrived may be retried."""
        self.calls += 1
        pieces: list[str] = []
        ttft_ms: float | None = None
        usage: dict[str, Any] | None = None
        done = False
        try:
            with connect_sse(self._http(), "POST", self.url, json=body, headers=self._headers()) as source:
                response = source.response
                if not 200 <= response.status_code < 300:
                    raise _status_error(self.url, response, response.read())
                for event in source.iter_sse():
                    if event.data.strip() == "[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(event.data)
                    except ValueError:
                        raise GenerationError(
                            "bad_response", f"{self.url}: a stream event is not JSON: {excerpt(event.data)}"
                        ) from None
                    if not isinstance(chunk, dict):
                        raise GenerationError("bad_response", f"{self.url}: event {excerpt(event.data)}")
                    if chunk.get("error") is not None:
                        raise GenerationError("http_error", f"{self.url}: error event: {excerpt(event.data)}")
                    for choice in chunk.get("choices") or []:
                        content = (
                            (choice.get("delta") or {}).get("content") if isinstance(choice, dict) else None
                        )
                        if content:
                            if ttft_ms is None:
                                ttft_ms = (time.perf_counter() - t0) * 1000
                            pieces.append(str(content))
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
        except SSEError as exc:
            raise GenerationError("bad_response", f"{self.url}: not an event stream: {exc}") from None
        except httpx.TransportError as exc:
            detail = f"{self.url}: {type(exc).__name__}: {exc}".rstrip(": ")
            if isinstance(exc, httpx.ConnectTimeout):
                raise _Retry(GenerationError("timeout", detail)) from None
            if isinstance(exc, httpx.TimeoutException):
                raise GenerationError("timeout", detail) from None
            if not pieces and isinstance(
                exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError
            ):
                raise _Retry(GenerationError("http_error", detail)) from None
            raise GenerationError("http_error", detail) from None
        if not done:
            raise GenerationError("stream_cut", f"{self.url}: the stream ended without data: [DONE]")
        return {
            "answer": "".join(pieces),
            "ttft_ms": ttft_ms,
            "usage": None if usage is None else _usage(usage),
            "usage_count": None,
        }


def _usage(raw: dict[str, Any]) -> dict[str, int | None]:
    def num(key: str) -> int | None:
        v = raw.get(key)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return {k: num(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _status_error(url: str, response: httpx.Response, body: bytes) -> GenerationError | _Retry:
    code = response.status_code
    status, retryable = status_meaning(code) or ("http_error", False)
    error = GenerationError(status, f"{url}: HTTP {code}; body: {excerpt(body)}", code)
    if retryable:
        return _Retry(error, retry_after_seconds(response.headers.get("retry-after")))
    return error


@GENERATORS.register("openai")
def openai_generator(settings: RunConfig, cache: Cache | None = None) -> OpenAIGenerator:
    """generator=openai: see the module docstring."""
    return OpenAIGenerator(settings, cache)
