"""Your own RAG service as the system under test (``system=http``).

Each query is sent to two endpoints of the service, together, and both answers
merge into one :class:`~rag_ablate.records.trace.Trace`:

* ``POST {base_url}{eval_path}`` returns JSON: the retrieved evidence, the intent
  codes and the service's own stage timings;
* ``POST {base_url}{chat_path}`` streams the answer as server-sent events: content
  events carrying a piece of text, then an end event with citations and token usage
  (``chat_path: null`` skips it).

The default request body and response mappings are the wire format of
``rag-ablate serve``; ``system.body`` (a template, see :func:`render_body`) and
``system.response`` (dotted paths, :class:`~rag_ablate.config.schema.HttpResponseConfig`)
adapt them to another service. README "Evaluate your own RAG service over HTTP"
describes every setting.

Honest statuses. A query ends ``ok``, or with what went wrong: ``timeout``,
``http_error`` (the code in ``http_status``; also no connection at all),
``access_denied`` (401/403), ``bad_response`` (which mapping path did not match,
with a short excerpt of the body) or ``stream_cut`` (the stream ended without its
end event; the partial answer is kept, the query is not scored). An empty
retrieval list and an answer that declines are ``ok``.

Timing. A query's clock starts when it is sent (retries and their waits count):
``ttft_ms`` at the first content event, ``timings_ms["total"]`` when both calls are
done (the end event of the stream), ``timings_ms["eval"]``/``["chat"]`` per call,
and the service's own timings as ``service.<stage>``.

Warm-up. Before the first timed query, one untimed eval request per connection the run
will use (``system.concurrency`` of them, query id ``rag-ablate-warm-up``, answers
ignored) opens the connections and lets the service load what it loads on first use, so
the first queries are not charged for it (:meth:`HttpSystem._warm`).

Concurrency. One ``httpx.AsyncClient`` (one connection pool) per run; at most
``system.concurrency`` queries are in flight. The runner gets each trace through
``run_many``'s callback as soon as it is complete.

Retries. Connect errors, 5xx and 429 are sent again, ``system.retries`` times at
most, after ``backoff_s * 2**n`` seconds with jitter (a random 50-100% of it),
or after the response's ``Retry-After`` when it has one; both capped at
``backoff_max_s``. Read timeouts, 4xx and broken bodies are not retried: the
service saw the request, and a second one would only add load. The loop is written
here rather than taken from tenacity or stamina: it is twenty lines, it must read
``Retry-After`` from the failed response and count the retries into the record,
which with either library means a custom wait strategy and hooks around its
decorators, and it saves a dependency for the one place that retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rag_ablate.config.schema import RunConfig, validate_system
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import EndpointDownError
from rag_ablate.core.retry import Breaker, Status, backoff_wait, excerpt, retry_after_seconds, status_meaning
from rag_ablate.core.secrets import split_userinfo
from rag_ablate.dataset.model import Dataset, Document, Query
from rag_ablate.records.trace import Citation, RetrievedChunk, TokenUsage, Trace
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import OnDone

if TYPE_CHECKING:  # httpx is imported when a run talks HTTP, not when the registry lists this system
    import httpx

PLACEHOLDERS = ("query", "query_id", "top_k", "user_groups")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_MISSING: Any = object()
WARMUP_ID = "rag-ablate-warm-up"  # the query id of the untimed requests that open the connections
T = TypeVar("T")


# ---------------------------------------------------------------------- request bodies and mappings


def request_values(query: Query, top_k: int) -> dict[str, Any]:
    """What a body template can insert: ``{query}``, ``{query_id}``, ``{top_k}``, ``{user_groups}``."""
    groups = None if query.user_groups is None else list(query.user_groups)
    return {"query": query.query, "query_id": query.query_id, "top_k": top_k, "user_groups": groups}


def render_body(template: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The request body for one query.

    An empty template gives the wire format ``{"query", "query_id", "top_k",
    "user_groups"?}`` (``user_groups`` only for a query that has them). Otherwise
    the template is copied with every string that is exactly one placeholder
    replaced by the value itself (``"{top_k}"`` becomes the number 10,
    ``"{user_groups}"`` a list or null), and placeholders inside longer strings
    replaced by their text (user groups joined by commas). Config values reach the
    template through OmegaConf interpolations (``"${chunk.size}"``), resolved when
    the config is composed.
    """
    if not template:
        body = {k: values[k] for k in ("query", "query_id", "top_k")}
        if values.get("user_groups") is not None:
            body["user_groups"] = values["user_groups"]
        return body
    rendered = _render(template, values)
    assert isinstance(rendered, dict)
    return rendered


def _render(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, Mapping):
        return {str(k): _render(v, values) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_render(v, values) for v in node]
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole.group(1)]

        def text(m: re.Match[str]) -> str:
            v = values[m.group(1)]
            return ",".join(v) if isinstance(v, list) else "" if v is None else str(v)

        return _PLACEHOLDER.sub(text, node)
    return node


def get_path(obj: Any, path: str) -> Any:
    """The value at a dotted path (``data.hits``, ``choices.0.delta``), or ``_MISSING``."""
    for part in path.split("."):
        if isinstance(obj, Mapping) and part in obj:
            obj = obj[part]
        elif isinstance(obj, list) and part.lstrip("-").isdigit() and -len(obj) <= int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return _MISSING
    return obj


# ---------------------------------------------------------------------- failures


class _Failure(Exception):
    """A query's call ended with a failure status (not an exception the runner sees)."""

    def __init__(
        self, status: Status, error: str, http_status: int | None = None, *, silent: bool = False
    ) -> None:
        super().__init__(error)
        self.status: Status = status
        self.error = error
        self.http_status = http_status
        self.silent = silent  # connected, then no response within the timeout (the breaker counts it)


class _Retry(Exception):
    """A failure that may go away when the request is sent again (after ``retry_after`` if given)."""

    def __init__(
        self, failure: _Failure, retry_after: float | None = None, *, unreachable: bool = False
    ) -> None:
        super().__init__(failure.error)
        self.failure = failure
        self.retry_after = retry_after
        self.unreachable = unreachable  # the try could not connect (the breaker counts it)


def _bad(where: str, problem: str, body: str | bytes) -> _Failure:
    return _Failure("bad_response", f"{where}: {problem}; body: {excerpt(body)}")


def _transport_failure(what: str, exc: httpx.TransportError) -> _Failure | _Retry:
    """A request that got no response: connect errors are retried, read timeouts are not."""
    import httpx

    detail = f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(exc, httpx.ConnectTimeout):
        return _Retry(_Failure("timeout", detail), unreachable=True)
    if isinstance(exc, httpx.TimeoutException):
        return _Failure("timeout", detail, silent=isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout))
    if isinstance(exc, httpx.ConnectError | httpx.RemoteProtocolError | httpx.ReadError):
        return _Retry(_Failure("http_error", detail), unreachable=isinstance(exc, httpx.ConnectError))
    return _Failure("http_error", detail)


def _status_failure(what: str, response: httpx.Response, body: bytes) -> _Failure | _Retry | None:
    """None for a 2xx response, else what its status means."""
    code = response.status_code
    meaning = status_meaning(code)
    if meaning is None:
        return None
    status, retryable = meaning
    failure = _Failure(status, f"{what}: HTTP {code}; body: {excerpt(body)}", code)
    if retryable:
        return _Retry(failure, retry_after_seconds(response.headers.get("retry-after")))
    return failure


# ---------------------------------------------------------------------- the system


@dataclass
class _Call:
    """What one call (eval or chat) of one query produced."""

    failure: _Failure | None = None
    retries: int = 0
    http_status: int | None = None
    elapsed_ms: float = 0.0


@dataclass
class _Kept:
    """A client that :meth:`HttpSystem.run` keeps open, and how many systems use it."""

    key: tuple[Any, ...]
    client: httpx.AsyncClient
    users: int = 0


_RUN_CLIENTS: dict[tuple[Any, ...], _Kept] = {}  # run()'s clients, per service and headers
_RUN_LOOP: list[asyncio.AbstractEventLoop] = []  # the event loop they live on


def _run_loop() -> asyncio.AbstractEventLoop:
    if not _RUN_LOOP:
        _RUN_LOOP.append(asyncio.new_event_loop())
    return _RUN_LOOP[0]


@SYSTEMS.register("http")
class HttpSystem:
    """A RAG service behind HTTP: the :class:`~rag_ablate.systems.base.BatchSystem` contract."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        validate_system(settings.system)
        self.s = settings
        self.cfg = settings.system
        self.map = settings.system.response
        assert self.cfg.base_url is not None  # validate_system checked it
        # a user and password in the URL are sent as basic auth, never named with the URL
        self.base_url, self._userinfo = split_userinfo(self.cfg.base_url.rstrip("/"))
        rerank = settings.rerank
        self.top_k = rerank.top_k if rerank.method != "none" else settings.retrieval.top_k
        self.requests_sent = 0  # every HTTP request, retries included (the progress bar's req/s)
        self._docs: Mapping[str, Document] = {}
        self._dataset_name = ""
        self._rng = random.Random(settings.seed)  # backoff jitter only
        # a service that is down or hung stops the run
        self.breaker = Breaker("system", self.base_url, ("system.timeout_s", self.cfg.timeout_s))
        self._kept: tuple[Any, ...] | None = None  # run()'s shared client, by its key (_RUN_CLIENTS)
        # httpx logs every request at INFO, which Hydra's log setup shows: one line per request would
        # bury the run's output (each query's outcome is in its record instead)
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)

    @property
    def routes_intents(self) -> bool:
        return self.map.intents is not None

    @property
    def generates_answers(self) -> bool:
        """The service streams answers (a failed query then misses the answer metrics)."""
        return self.cfg.chat_path is not None

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        """Keep the documents (to place retrieved text); report where requests go (never headers' values)."""
        self._docs = dataset.documents
        self._dataset_name = dataset.name
        return {
            "http.eval_url": self.base_url + self.cfg.eval_path,
            "http.chat_url": "none" if self.cfg.chat_path is None else self.base_url + self.cfg.chat_path,
            "http.header_names": ",".join(sorted(self.cfg.headers)) or "none",
        }

    def close(self) -> None:
        """Let go of the client :meth:`run` uses (closed with its last user); each ``run_many``
        closes its own."""
        if self._kept is None:
            return
        entry = _RUN_CLIENTS[self._kept]
        self._kept = None
        entry.users -= 1
        if entry.users == 0:
            del _RUN_CLIENTS[entry.key]
            loop = _run_loop()
            loop.run_until_complete(entry.client.aclose())
            if not _RUN_CLIENTS:
                loop.close()
                _RUN_LOOP.clear()

    def run(self, query: Query) -> Trace:
        """One query, on a client kept open (and warmed by its first call) until :meth:`close`,
        shared by every HttpSystem of this thread that calls the same service with the same
        headers: called once per query (the sweep's timing pass does), it times the query, not
        a new connection, and two variants of one service are timed over the same connection
        (two connections to one service differ by themselves, which an A/A test shows)."""
        loop = _run_loop()
        if self._kept is None:
            key = self._client_key()
            entry = _RUN_CLIENTS.get(key)
            if entry is None:
                entry = _RUN_CLIENTS[key] = _Kept(key, self._client())
                loop.run_until_complete(self._warm(entry.client, [query]))
            entry.users += 1
            self._kept = key
        client = _RUN_CLIENTS[self._kept].client
        _, trace = loop.run_until_complete(self._one(client, asyncio.Semaphore(1), query))
        return trace

    def _client_key(self) -> tuple[Any, ...]:
        c = self.cfg
        return (self.base_url, tuple(sorted(c.headers.items())), c.timeout_s)

    def run_many(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """Send every query, ``system.concurrency`` at a time; ``on_done`` as each completes."""
        asyncio.run(self._run_all(queries, on_done))

    # ------------------------------------------------------------------ one run

    def _client(self) -> httpx.AsyncClient:
        import httpx

        # each query in flight holds an eval and (with chat_path) a chat connection; no more, since
        # httpcore checks every pooled connection on each request
        n = self.cfg.concurrency * (1 if self.cfg.chat_path is None else 2)
        return httpx.AsyncClient(
            base_url=self.base_url,
            auth=self._userinfo,
            headers=dict(self.cfg.headers),
            timeout=httpx.Timeout(self.cfg.timeout_s, pool=None),
            limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
            follow_redirects=True,
        )

    async def _run_all(self, queries: Sequence[Query], on_done: OnDone) -> None:
        sem = asyncio.Semaphore(self.cfg.concurrency)
        async with self._client() as client:
            await self._warm(client, queries[: self.cfg.concurrency])
            tasks = [asyncio.create_task(self._one(client, sem, q)) for q in queries]
            try:
                for next_done in asyncio.as_completed(tasks):
                    query, trace = await next_done
                    on_done(query, trace)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _warm(self, client: httpx.AsyncClient, queries: Sequence[Query]) -> None:
        """One untimed eval request per query given, sent together, under the id ``WARMUP_ID``,
        their answers and failures ignored: the connections (TCP, TLS) the timed queries reuse
        are opened here, and whatever the service loads on first use is loaded. The chat
        endpoint is not called (it may run a paid model); nor are these counted or retried."""

        async def one(query: Query) -> None:
            values = request_values(dataclasses.replace(query, query_id=WARMUP_ID), self.top_k)
            with contextlib.suppress(Exception):  # the timed queries record what goes wrong
                await client.post(self.cfg.eval_path, json=render_body(self.cfg.body, values))

        await asyncio.gather(*(one(q) for q in queries))

    async def _one(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, query: Query
    ) -> tuple[Query, Trace]:
        async with sem:
            trace = Trace(query.query_id)
            t0 = time.perf_counter()
            try:
                body = render_body(self.cfg.body, request_values(query, self.top_k))
                if self.cfg.chat_path is None:
                    results = [await self._eval(client, body, trace, t0)]
                else:
                    results = list(
                        await asyncio.gather(
                            self._eval(client, body, trace, t0), self._chat(client, body, trace, t0)
                        )
                    )
            except EndpointDownError:
                raise  # the service is down: the run stops
            except Exception as exc:  # a bug or an unforeseen error fails this query only
                trace.status, trace.error = "failed", f"{type(exc).__name__}: {exc}"
                trace.timings_ms["total"] = (time.perf_counter() - t0) * 1000
                return query, trace
            trace.timings_ms["total"] = (time.perf_counter() - t0) * 1000
            trace.retries = sum(c.retries for c in results)
            # the eval call's failure wins over the chat call's: it is the one that decides scoring
            failed = next((c.failure for c in results if c.failure is not None), None)
            if failed is not None:
                trace.status, trace.error, trace.http_status = failed.status, failed.error, failed.http_status
            else:
                trace.http_status = results[0].http_status
            return query, trace

    async def _retrying(self, call: _Call, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it returns, or raises _Failure, or retries run out; EndpointDownError
        once ``BREAKER_LIMIT`` tries in a row (any queries') got no response: could not connect, or
        connected and got nothing within ``timeout_s``."""
        while True:
            if self.breaker.open:
                raise EndpointDownError(self.breaker.message())
            try:
                result = await attempt()
            except _Failure as f:
                if not f.silent:
                    self.breaker.succeeded()  # it answered, if not well
                elif self.breaker.failed(f.error, silent=True):
                    raise EndpointDownError(self.breaker.message()) from None
                raise
            except _Retry as r:
                if not r.unreachable:
                    self.breaker.succeeded()
                elif self.breaker.failed(r.failure.error):
                    raise EndpointDownError(self.breaker.message()) from None
                if call.retries >= self.cfg.retries:
                    raise r.failure from None
                wait = backoff_wait(
                    call.retries, r.retry_after, self.cfg.backoff_s, self.cfg.backoff_max_s, self._rng
                )
                call.retries += 1
                await asyncio.sleep(wait)
            else:
                self.breaker.succeeded()
                return result

    # ------------------------------------------------------------------ eval (JSON)

    async def _eval(self, client: httpx.AsyncClient, body: dict[str, Any], trace: Trace, t0: float) -> _Call:
        import httpx

        call = _Call()
        path = self.cfg.eval_path

        async def attempt() -> tuple[httpx.Response, bytes]:
            self.requests_sent += 1
            try:
                response = await client.post(path, json=body)
            except httpx.TransportError as exc:
                raise _transport_failure(f"eval {path}", exc) from exc
            call.http_status = response.status_code
            failure = _status_failure(f"eval {path}", response, response.content)
            if failure is not None:
                raise failure
            return response, response.content

        try:
            _response, raw = await self._retrying(call, attempt)
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _bad(f"eval {path}", f"the response is not JSON ({exc})", raw) from exc
            self._map_eval(data, raw, trace)
        except _Failure as f:
            call.failure = f
        call.elapsed_ms = (time.perf_counter() - t0) * 1000
        trace.timings_ms["eval"] = call.elapsed_ms
        return call

    def _map_eval(self, data: Any, raw: bytes, trace: Trace) -> None:
        m = self.map
        where = f"eval {self.cfg.eval_path}"
        items = get_path(data, m.retrieved)
        if items is _MISSING:
            raise _bad(where, f"no '{m.retrieved}' (system.response.retrieved) in the response", raw)
        if not isinstance(items, list):
            raise _bad(where, f"'{m.retrieved}' (system.response.retrieved) is not a list", raw)
        trace.retrieved = [self._chunk(rank, item, raw) for rank, item in enumerate(items, start=1)]
        if m.intents is not None:
            intents = get_path(data, m.intents)
            if intents is _MISSING:
                raise _bad(where, f"no '{m.intents}' (system.response.intents) in the response", raw)
            if intents is None:
                intents = []
            elif not isinstance(intents, list):
                intents = [intents]
            trace.intents = ["" if code is None else str(code) for code in intents]
        if m.timings is not None:
            timings = get_path(data, m.timings)
            if isinstance(timings, Mapping):
                for k, v in timings.items():
                    if isinstance(v, int | float) and not isinstance(v, bool):
                        trace.timings_ms[f"service.{k}"] = float(v)

    def _chunk(self, rank: int, item: Any, raw: bytes) -> RetrievedChunk:
        """One retrieved item as a chunk of a dataset document (see HttpResponseConfig for the rules)."""
        m = self.map
        where = f"eval {self.cfg.eval_path}: {m.retrieved}[{rank - 1}]"

        def field(path: str | None) -> Any:
            return _MISSING if path is None else get_path(item, path)

        doc = field(m.doc_id)
        if doc is _MISSING or doc is None:
            raise _bad(where, f"no '{m.doc_id}' (system.response.doc_id)", raw)
        doc_id = str(doc)
        document = self._docs.get(doc_id)
        if document is None:
            raise _bad(where, f"doc_id '{doc_id}' is not a document of dataset '{self._dataset_name}'", raw)
        chunk = field(m.chunk_id)
        chunk_id = f"{doc_id}#{rank - 1}" if chunk is _MISSING or chunk is None else str(chunk)
        start, end, text = field(m.start), field(m.end), field(m.text)
        try:
            if start not in (_MISSING, None) and end not in (_MISSING, None):
                lo, hi = int(start), int(end)
                if not 0 <= lo <= hi <= len(document.text):
                    raise _bad(
                        where,
                        f"[{m.start}, {m.end}) = [{lo}, {hi}) is not a span of document '{doc_id}' "
                        f"({len(document.text)} characters)",
                        raw,
                    )
            elif isinstance(text, str) and text and (found := document.text.find(text)) >= 0:
                lo, hi = found, found + len(text)
            else:
                lo, hi = 0, len(document.text)
            value = field(m.score)
            score = 0.0 if value in (_MISSING, None) else float(value)
        except (TypeError, ValueError) as exc:
            raise _bad(where, f"a number was expected ({exc})", raw) from exc
        return RetrievedChunk(rank, chunk_id, doc_id, lo, hi, score)

    # ------------------------------------------------------------------ chat (server-sent events)

    async def _chat(self, client: httpx.AsyncClient, body: dict[str, Any], trace: Trace, t0: float) -> _Call:
        call = _Call()
        path = self.cfg.chat_path
        assert path is not None
        pieces: list[str] = []
        try:
            await self._retrying(call, lambda: self._stream(client, path, body, trace, t0, call, pieces))
        except _Failure as f:
            call.failure = f
        if pieces:
            trace.answer = "".join(pieces)
        call.elapsed_ms = (time.perf_counter() - t0) * 1000
        trace.timings_ms["chat"] = call.elapsed_ms
        if call.failure is None and trace.answer is None:
            trace.answer = ""
        return call

    async def _stream(
        self,
        client: httpx.AsyncClient,
        path: str,
        body: dict[str, Any],
        trace: Trace,
        t0: float,
        call: _Call,
        pieces: list[str],
    ) -> None:
        """One try of the chat call. Only failures before the first event may be retried."""
        import httpx
        from httpx_sse import SSEError, aconnect_sse

        where = f"chat {path}"
        m = self.map
        self.requests_sent += 1
        try:
            async with aconnect_sse(client, "POST", path, json=body) as source:
                response = source.response
                call.http_status = response.status_code
                if not 200 <= response.status_code < 300:
                    raw = await response.aread()
                    failure = _status_failure(where, response, raw)
                    assert failure is not None
                    raise failure
                try:
                    async for event in source.aiter_sse():
                        if not event.data.strip():
                            continue
                        try:
                            data = json.loads(event.data)
                        except json.JSONDecodeError as exc:
                            raise _bad(where, f"an event's data is not JSON ({exc.msg})", event.data) from exc
                        if get_path(data, m.done) is True:
                            self._map_end(data, event.data, trace)
                            return
                        delta = get_path(data, m.delta)
                        if delta is _MISSING or delta is None:
                            continue  # an event that carries no text (a heartbeat, a status)
                        if not isinstance(delta, str):
                            raise _bad(
                                where, f"'{m.delta}' (system.response.delta) is not a string", event.data
                            )
                        if delta and trace.ttft_ms is None:
                            trace.ttft_ms = (time.perf_counter() - t0) * 1000
                        pieces.append(delta)
                except SSEError as exc:
                    raise _bad(where, f"not an event stream ({exc})", b"") from exc
                except httpx.TimeoutException as exc:
                    raise _Failure("timeout", f"{where}: {type(exc).__name__} while streaming") from exc
                except httpx.TransportError as exc:
                    raise _Failure(
                        "stream_cut", f"{where}: the stream broke off ({type(exc).__name__}: {exc})"
                    ) from exc
        except httpx.TransportError as exc:  # before the first event: connect errors may be retried
            raise _transport_failure(where, exc) from exc
        raise _Failure(
            "stream_cut",
            f"{where}: the stream ended without its end event ('{m.done}': true) "
            f"after {len(pieces)} content events",
        )

    def _map_end(self, data: Any, raw: str, trace: Trace) -> None:
        m = self.map
        where = f"chat {self.cfg.chat_path}: end event"
        if m.citations is not None:
            cites = get_path(data, m.citations)
            if cites not in (_MISSING, None):
                if not isinstance(cites, list):
                    raise _bad(where, f"'{m.citations}' (system.response.citations) is not a list", raw)
                trace.citations = [self._citation(c, where, raw) for c in cites]
        if m.usage is not None:
            usage = get_path(data, m.usage)
            if isinstance(usage, Mapping):
                aliases = {"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens"}
                known = {aliases.get(str(k), str(k)): v for k, v in usage.items()}
                try:
                    trace.usage = TokenUsage.from_dict(known)
                except (TypeError, ValueError) as exc:
                    raise _bad(where, f"token usage is not a set of counts ({exc})", raw) from exc

    def _citation(self, item: Any, where: str, raw: str) -> Citation:
        """A citation: a chunk id string, or a mapping read with the retrieved items' paths."""
        if isinstance(item, str | int) and not isinstance(item, bool):
            return Citation(chunk_id=str(item))
        if isinstance(item, Mapping):
            m = self.map

            def opt(path: str | None) -> Any:
                v = _MISSING if path is None else get_path(item, path)
                return None if v is _MISSING else v

            doc, chunk, start, end = opt(m.doc_id), opt(m.chunk_id), opt(m.start), opt(m.end)
            try:
                return Citation(
                    None if doc is None else str(doc),
                    None if chunk is None else str(chunk),
                    None if start is None else int(start),
                    None if end is None else int(end),
                )
            except (TypeError, ValueError) as exc:
                raise _bad(where, f"a citation is not usable ({exc})", raw) from exc
        raise _bad(where, f"a citation is neither an id nor a mapping: {item!r}", raw)
