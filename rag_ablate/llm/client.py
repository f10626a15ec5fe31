"""One client for "an OpenAI-compatible chat-completions endpoint", shared by
``generator=openai`` and ``judge=openai``.

:meth:`ChatClient.complete` sends ``POST {base_url}/chat/completions`` with httpx (no
``openai`` package: the wire format is small and httpx is already a dependency):

* ``stream=True``: ``stream: true`` and ``stream_options: {"include_usage": true}``, read as
  server-sent events. ``ttft_ms`` is taken at the first chunk whose
  ``choices[0].delta.content`` is non-empty, counted from when the first try was sent
  (retries and their waits count); the text is the concatenation of those pieces; usage
  comes from the final chunk's ``usage``. A stream that ends without ``data: [DONE]`` is
  ``stream_cut``; one that ends with it but sent no content at all is ``bad_response`` and is
  tried again (llama_cpp.server ends a request it cancelled so).
* ``stream=False``: one JSON ``chat.completion``; the text is ``choices[0].message.content``
  and usage its ``usage`` field (no time to first token).

Usage. ``prompt_tokens``, ``completion_tokens`` and ``total_tokens`` from the API. A server
that sends none gets a local count (:func:`rag_ablate.text.count.count_tokens` of every
message's content and of the reply), marked ``usage_count="local"`` so nobody mistakes it
for the model's tokenizer.

Key. ``api_key_env`` is the NAME of the environment variable holding the key; the key is
read from the environment when a request is sent (``Authorization: Bearer ...``) and is
never stored, logged or part of a cache key. ``None`` sends no key.

Retries. 429, 5xx and connect errors are sent again (``retries`` times), after the
response's ``Retry-After`` or an exponential backoff with jitter
(:func:`rag_ablate.core.retry.backoff_wait`, shared with ``system=http``). Read timeouts,
4xx and broken bodies are not retried. An endpoint that cannot be connected to, or that takes
the connection and sends no response within ``timeout_s``, ``BREAKER_LIMIT`` tries in a row
(refused, unreachable, silent; :class:`rag_ablate.core.retry.Breaker`) raises
:class:`~rag_ablate.core.errors.EndpointDownError` at once, and so does every later call: the run
stops instead of retrying every query. A streamed call is only retried before any content
arrived. Every failure raises :class:`~rag_ablate.core.errors.GenerationError` whose
message names the owner ("generator" or "judge") and the endpoint.

Cache. Every successful call is stored in ``<cache dir>/json.sqlite`` (kind ``llm_calls``),
keyed by the endpoint, the model, the sha256 of the full messages, the sampling parameters
(temperature, max_tokens and, when set, response_format) and a repeat index
(:meth:`ChatClient.cache_parts`). A rerun replays it (``cached=True``, with the original
call's latency, time to first token, tokens and retries), a changed prompt or setting
misses, and ``repeat=1, 2, ...`` are independent samples. Hits are counted as
``run/cache_llm_calls_hits``. See docs/architecture.md ("Modules").

The client is safe to share between threads (one httpx connection pool).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rag_ablate.core.errors import ConfigError, EndpointDownError, GenerationError
from rag_ablate.core.retry import Breaker, backoff_wait, excerpt, retry_after_seconds, status_meaning
from rag_ablate.core.secrets import split_userinfo
from rag_ablate.text.count import count_tokens

if TYPE_CHECKING:  # httpx is imported when a call is made, not when a registry lists the generators
    import httpx

    from rag_ablate.config.schema import GeneratorConfig, JudgeConfig
    from rag_ablate.core.cache import Cache

CACHE_KIND = "llm_calls"
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass
class ChatResult:
    """One chat completion (a fresh call or a replay from the cache)."""

    text: str
    usage: dict[str, int | None] | None  # prompt_tokens, completion_tokens, total_tokens
    usage_count: str | None  # "local": usage is rag_ablate's own count, not the API's
    ttft_ms: float | None  # streamed calls only
    latency_ms: float  # the call's own time, retries and waits included; cached: the original's
    cached: bool
    retries: int  # tries after the first one (a cached call reports the original's)


class _NoAnswer(GenerationError):
    """A ``timeout``: the endpoint took the connection and sent no response within ``timeout_s``
    (the breaker counts it with the tries that could not connect)."""


class _Retry(Exception):
    def __init__(
        self, error: GenerationError, retry_after: float | None = None, *, unreachable: bool = False
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        self.unreachable = unreachable  # the try could not connect (the breaker counts it)


def messages_sha256(messages: list[dict[str, str]]) -> str:
    """sha256 (hex) of the full messages, roles included (key order does not matter)."""
    payload = json.dumps(messages, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class ChatClient:
    """Chat completions from one endpoint and model; see the module docstring."""

    def __init__(
        self,
        *,
        owner: str,
        base_url: str,
        model: str,
        api_key_env: str | None,
        timeout_s: float,
        retries: int,
        backoff_s: float,
        backoff_max_s: float,
        cache: Cache | None,
        seed: int = 0,
    ) -> None:
        self.owner = owner  # "generator" / "judge": the config group named in errors
        # a user and password in the URL are sent as basic auth, never named with the URL (cache, errors)
        url, self._userinfo = split_userinfo(base_url.rstrip("/"))
        self.url = url + "/chat/completions"
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.cache = cache
        self.calls = 0  # requests sent to the endpoint, retries included
        # an endpoint that is down or hung stops the run
        self.breaker = Breaker(owner, self.url, (f"{owner}.timeout_s", timeout_s))
        self._lock = threading.Lock()
        self._rng = random.Random(seed)  # backoff jitter only
        self._client: httpx.Client | None = None
        if api_key_env and api_key_env not in os.environ:
            raise ConfigError(
                f"{owner}.api_key_env names the environment variable '{api_key_env}', which is not set; "
                f"export it, or set {owner}.api_key_env=null for an endpoint without a key"
            )
        for name in ("httpx", "httpcore"):  # one INFO line per request would bury the run's output
            logging.getLogger(name).setLevel(logging.WARNING)

    @classmethod
    def from_config(
        cls, owner: str, cfg: GeneratorConfig | JudgeConfig, cache: Cache | None, seed: int = 0
    ) -> ChatClient:
        """The client of the ``generator`` or ``judge`` group (``owner``), with its endpoint settings."""
        assert cfg.base_url is not None and cfg.model is not None  # checked by the group's validation
        return cls(
            owner=owner,
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
            backoff_max_s=cfg.backoff_max_s,
            cache=cache,
            seed=seed,
        )

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        client = getattr(self, "_client", None)  # absent when __init__ raised
        if client is not None:
            client.close()
            self._client = None

    def __del__(self) -> None:  # a caller that never calls close() must not leak open sockets
        self.close()

    def _http(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                t = self.timeout_s
                self._client = httpx.Client(timeout=httpx.Timeout(t, connect=t), auth=self._userinfo)
            return self._client

    # ------------------------------------------------------------------ requests and keys

    def request_body(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        stream: bool = True,
        response_format: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The JSON body sent to the endpoint."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if response_format is not None:
            body["response_format"] = response_format
        return body

    def cache_parts(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        response_format: dict[str, Any] | None = None,
        repeat: int = 0,
    ) -> dict[str, Any]:
        """The model-call cache key: endpoint, model, full prompt hash, sampling parameters, repeat index."""
        sampling: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None:  # absent (not null) keeps the keys of calls without one
            sampling["response_format"] = response_format
        return {
            "endpoint": self.url,
            "model": self.model,
            "prompt_sha256": messages_sha256(messages),
            "sampling": sampling,
            "repeat": repeat,
        }

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        repeat: int = 0,
        stream: bool = True,
        response_format: dict[str, Any] | None = None,
    ) -> ChatResult:
        """One completion; ``repeat`` selects an independent sample (its own cache entry).

        Raises :class:`~rag_ablate.core.errors.GenerationError` when the call fails after
        its retries (nothing is cached then).
        """
        body = self.request_body(
            messages,
            temperature=temperature,
            max_tokens=max_tokens,
            stream=stream,
            response_format=response_format,
        )
        built: list[bool] = []

        def build() -> dict[str, Any]:
            built.append(True)
            return self._call(body, messages)

        if self.cache is None:
            value = build()
        else:
            parts = self.cache_parts(
                messages,
                temperature=temperature,
                max_tokens=max_tokens,
                response_format=response_format,
                repeat=repeat,
            )
            value = self.cache.json(CACHE_KIND, parts, build)
        usage = value.get("usage")
        return ChatResult(
            text=str(value.get("text", value.get("answer", ""))),  # "answer": entries of the first version
            usage=None if usage is None else _usage(usage),
            usage_count=value.get("usage_count"),
            ttft_ms=value.get("ttft_ms"),
            latency_ms=float(value.get("total_ms", 0.0)),
            cached=not built,
            retries=int(value.get("retries", 0)),
        )

    # ------------------------------------------------------------------ one call, with retries

    def _headers(self, stream: bool) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if self.api_key_env:
            headers["Authorization"] = f"Bearer {os.environ.get(self.api_key_env, '')}"
        return headers

    def _call(self, body: dict[str, Any], messages: list[dict[str, str]]) -> dict[str, Any]:
        """The call as a JSON-able value (what the cache stores); raises GenerationError."""
        t0 = time.perf_counter()
        retries = 0
        while True:
            if self.breaker.open:
                raise EndpointDownError(self.breaker.message())
            try:
                value = self._stream(body, t0) if body["stream"] else self._once(body)
                self.breaker.succeeded()
                break
            except _NoAnswer as e:
                if self.breaker.failed(str(e), silent=True):
                    raise EndpointDownError(self.breaker.message()) from None
                raise
            except GenerationError:
                self.breaker.succeeded()  # it answered, if not well
                raise
            except _Retry as r:
                if not r.unreachable:
                    self.breaker.succeeded()
                elif self.breaker.failed(str(r.error)):
                    raise EndpointDownError(self.breaker.message()) from None
                if retries >= self.retries:
                    raise r.error from None
                with self._lock:
                    wait = backoff_wait(retries, r.retry_after, self.backoff_s, self.backoff_max_s, self._rng)
                retries += 1
                time.sleep(wait)
        value["retries"] = retries
        value["total_ms"] = (time.perf_counter() - t0) * 1000
        if value.get("usage") is None:
            prompt_tokens = sum(count_tokens(str(m.get("content", ""))) for m in messages)
            completion = count_tokens(value["text"])
            value["usage"] = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
            value["usage_count"] = "local"
        return value

    def _count_call(self) -> None:
        with self._lock:
            self.calls += 1

    def _where(self) -> str:
        return f"{self.owner} endpoint {self.url}"

    def _transport_error(
        self, exc: httpx.TransportError, started: bool, answered: bool = False
    ) -> GenerationError | _Retry:
        """What a failed try means; ``started``: content had arrived, ``answered``: a response had."""
        import httpx

        detail = f"{self._where()}: {type(exc).__name__}: {exc}".rstrip(": ")
        if isinstance(exc, httpx.ConnectTimeout):
            return _Retry(GenerationError("timeout", detail), unreachable=True)
        if not answered and isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout):
            return _NoAnswer("timeout", detail)
        if isinstance(exc, httpx.TimeoutException):
            return GenerationError("timeout", detail)
        if not started and isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError):
            refused = isinstance(exc, httpx.ConnectError)
            return _Retry(GenerationError("http_error", detail), unreachable=refused)
        return GenerationError("http_error", detail)

    def _status_error(self, response: httpx.Response, body: bytes) -> GenerationError | _Retry:
        code = response.status_code
        status, retryable = status_meaning(code) or ("http_error", False)
        error = GenerationError(status, f"{self._where()}: HTTP {code}; body: {excerpt(body)}", code)
        if retryable:
            return _Retry(error, retry_after_seconds(response.headers.get("retry-after")))
        return error

    def _once(self, body: dict[str, Any]) -> dict[str, Any]:
        """One non-streamed try."""
        import httpx

        self._count_call()
        try:
            response = self._http().post(self.url, json=body, headers=self._headers(False))
        except httpx.TransportError as exc:
            raise self._transport_error(exc, False) from None
        if not 200 <= response.status_code < 300:
            raise self._status_error(response, response.content)
        payload = _json_object(response.content, f"{self._where()}: the response")
        choices = payload.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise GenerationError(
                "bad_response",
                f"{self._where()}: no choices[0].message.content in {excerpt(response.text)}",
            )
        usage = payload.get("usage")
        return {
            "text": content,
            "ttft_ms": None,
            "usage": _usage(usage) if isinstance(usage, dict) else None,
            "usage_count": None,
        }

    def _stream(self, body: dict[str, Any], t0: float) -> dict[str, Any]:
        """One streamed try. Only failures before any content arrived may be retried."""
        import httpx
        from httpx_sse import SSEError, connect_sse

        self._count_call()
        pieces: list[str] = []
        ttft_ms: float | None = None
        usage: dict[str, Any] | None = None
        done = False
        where = self._where()
        response: httpx.Response | None = None
        try:
            headers = self._headers(True)
            with connect_sse(self._http(), "POST", self.url, json=body, headers=headers) as source:
                response = source.response
                if not 200 <= response.status_code < 300:
                    raise self._status_error(response, response.read())
                for event in source.iter_sse():
                    if event.data.strip() == "[DONE]":
                        done = True
                        break
                    chunk = _json_object(event.data, f"{where}: a stream event")
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
            raise GenerationError("bad_response", f"{where}: not an event stream: {exc}") from None
        except httpx.TransportError as exc:
            raise self._transport_error(exc, bool(pieces), response is not None) from None
        if not done:
            raise GenerationError("stream_cut", f"{where}: the stream ended without data: [DONE]")
        if not pieces:  # an empty answer is no answer (llama_cpp.server ends a cancelled request so)
            raise _Retry(GenerationError("bad_response", f"{where}: the stream ended before any content"))
        return {
            "text": "".join(pieces),
            "ttft_ms": ttft_ms,
            "usage": None if usage is None else _usage(usage),
            "usage_count": None,
        }


def _json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    """``raw`` as a JSON object; ``bad_response`` when it is not one, ``http_error`` when it is the
    API's error object. ``what`` opens the message (the endpoint and what was read)."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise GenerationError("bad_response", f"{what} is not JSON: {excerpt(raw)}") from None
    if not isinstance(value, dict):
        raise GenerationError("bad_response", f"{what} is not a JSON object: {excerpt(raw)}")
    if value.get("error") is not None:
        raise GenerationError("http_error", f"{what} is an error: {excerpt(raw)}")
    return value


def _usage(raw: dict[str, Any]) -> dict[str, int | None]:
    def num(key: str) -> int | None:
        v = raw.get(key)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return {k: num(k) for k in USAGE_KEYS}
