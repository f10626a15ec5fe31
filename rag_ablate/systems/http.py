"""Your own RAG service as the system under test (``system=http``).

Each query is sent to up to two endpoints of the service, together, and both answers
merge into one :class:`~rag_ablate.records.trace.Trace`:

* ``POST {base_url}{eval_path}`` returns JSON: the retrieved evidence, the intent
  codes and the service's own stage timings (and, for shapes without a stream, the
  answer with its citations and usage);
* ``POST {base_url}{chat_path}`` streams the answer as server-sent events: content
  events carrying a piece of text, then an end event (a flag such as ``done: true``, or
  a literal data line such as ``[DONE]``); citations and token usage are read from
  whichever event carries them.

``system.shape`` picks the endpoints, request body and response paths of a shape services
speak (:mod:`rag_ablate.config.shapes`: the reference wire format of ``rag-ablate serve``,
OpenAI chat completions streamed or not, a plain JSON answer, a single endpoint with answer
and evidence); ``system.body`` (a template, see :func:`render_body`) and ``system.response``
(dotted paths, :class:`~rag_ablate.config.schema.HttpResponseConfig`) override any part.
:class:`ResponseMap` turns responses into a trace, for live calls and for logged exchanges
(:func:`map_logged`) alike. Intents, citations and usage may be absent from a response: their
metrics are then absent, never a failure. README "Evaluate your own RAG service over HTTP"
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

Concurrency. ``system.concurrency`` workers, each with its own ``httpx.AsyncClient`` (a pool of
one query's connections, all sharing one TLS context), each taking the next query when its last
is done: at most ``system.concurrency`` queries are in flight, and no pool is scanned for a free
connection among many (httpcore's cost per request grows with its pool). The runner gets each
trace through ``run_many``'s callback as soon as it is complete.

Client CPU. The eval call's request is built on headers prepared once and handed to the client's
transport (:meth:`HttpSystem._post_json`), its JSON written and read with orjson, and httpcore's
socket I/O runs on asyncio's streams rather than anyio (:mod:`rag_ablate.systems.http_streams`):
about 40% less CPU a query than ``client.post`` over anyio, with httpx's pool, timeouts, exceptions,
TLS settings, redirects, basic auth and cookies as they were.

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

import orjson

from rag_ablate.config.schema import HttpResponseConfig, RunConfig, SystemConfig, validate_system
from rag_ablate.config.shapes import check_shape
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import EndpointDownError, RunStopError
from rag_ablate.core.retry import Breaker, Status, backoff_wait, excerpt, retry_after_seconds, status_meaning
from rag_ablate.core.secrets import split_userinfo
from rag_ablate.dataset.model import Dataset, Document, Query
from rag_ablate.records.jsonl import may_hold_big_int
from rag_ablate.records.trace import Citation, ContextChunk, RetrievedChunk, TokenUsage, Trace
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import OnDone

if TYPE_CHECKING:  # httpx and asyncio are imported when a run talks HTTP, not when the registry lists
    import asyncio  # this system (every run's name check does: asyncio alone is 0.01 s of imports)

    import httpx

PLACEHOLDERS = ("query", "query_id", "top_k", "user_groups", "model", "repeat")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_MISSING: Any = object()
WARMUP_ID = "rag-ablate-warm-up"  # the query id of the untimed requests that open the connections
T = TypeVar("T")


# ---------------------------------------------------------------------- request bodies and mappings


def request_values(query: Query, top_k: int, model: str | None = None) -> dict[str, Any]:
    """What a body template can insert: ``{query}``, ``{query_id}``, ``{top_k}``, ``{user_groups}``,
    ``{model}`` (``system.model``), ``{repeat}`` (0..system.repeats-1: a service that caches answers
    can key on it)."""
    groups = None if query.user_groups is None else list(query.user_groups)
    return {
        "query": query.query,
        "query_id": query.query_id,
        "top_k": top_k,
        "user_groups": groups,
        "model": model,
        "repeat": query.repeat or 0,
    }


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


def _text(item: Any, path: str | None) -> str | None:
    """An item's text at ``path`` (None: no path, or not a string)."""
    value = None if path is None else get_path(item, path)
    return value if isinstance(value, str) else None


def get_path(obj: Any, path: str) -> Any:
    """The value at a dotted path (``data.hits``, ``choices.0.delta``), or ``_MISSING``."""
    if type(obj) is dict and "." not in path:  # one key of a JSON object: most paths, on every item
        return obj.get(path, _MISSING)
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


CallFailure = _Failure  # public: what map_logged raises (its status and error are the record's)


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


# ---------------------------------------------------------------------- response mappings


class ResponseMap:
    """The response paths of one ``system=http`` configuration (its shape resolved): turns a
    service's JSON responses and stream events into a trace's fields, raising ``bad_response``
    failures (:class:`CallFailure`) that name the path that did not match.

    ``documents`` (the dataset's) check each retrieved item's document id and place items without
    offsets; without them ids are taken as they are and such items get the span [0, 0).
    ``intents_seen`` turns true at the first response that carries the intents path.
    """

    def __init__(
        self, system: SystemConfig, documents: Mapping[str, Document] | None = None, dataset: str = ""
    ) -> None:
        self.cfg = check_shape(system)
        self.m: HttpResponseConfig = self.cfg.response
        self.documents = documents
        self.dataset = dataset
        self.intents_seen = False

    @property
    def has_evidence(self) -> bool:
        """The service reports retrieved evidence (else traces keep ``retrieved=None``)."""
        return self.cfg.eval_path is not None and self.m.retrieved is not None

    @property
    def answers_in_json(self) -> bool:
        """The answer comes in the JSON response (a shape without a stream)."""
        return self.cfg.chat_path is None and self.cfg.eval_path is not None and self.m.answer is not None

    @property
    def generates_answers(self) -> bool:
        return self.cfg.chat_path is not None or self.answers_in_json

    def new_trace(self, query_id: str) -> Trace:
        """A trace whose evidence and citations are absent until a response reports them."""
        return Trace(query_id, retrieved=[] if self.has_evidence else None, citations=None)

    # ------------------------------------------------------------------ the JSON response

    def map_json(self, data: Any, raw: str | bytes, trace: Trace) -> None:
        """Evidence, intents and timings of the JSON endpoint's response; its answer, citations
        and usage too when there is no stream."""
        m = self.m
        where = f"eval {self.cfg.eval_path}"
        if self.has_evidence:
            assert m.retrieved is not None
            items = get_path(data, m.retrieved)
            if items is _MISSING:
                raise _bad(where, f"no '{m.retrieved}' (system.response.retrieved) in the response", raw)
            if not isinstance(items, list):
                raise _bad(where, f"'{m.retrieved}' (system.response.retrieved) is not a list", raw)
            trace.retrieved = [self._chunk(rank, item, raw) for rank, item in enumerate(items, start=1)]
        if m.intents is not None:
            intents = get_path(data, m.intents)
            if intents is not _MISSING:  # absent: the service does not route (no intent metrics)
                self.intents_seen = True
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
        self.map_stages(data, raw, trace, where)
        if self.cfg.chat_path is None:
            self.map_answer(data, raw, trace, where)

    def map_stages(self, data: Any, raw: str | bytes, trace: Trace, where: str) -> None:
        """The optional stage fields (system.response.rewritten_query .. versions): a null path or a
        missing/null value leaves the field absent; a value of the wrong shape is a bad response."""
        m = self.m

        def found(key: str, path: str | None, kind: type | None = None) -> Any:
            value = None if path is None else get_path(data, path)
            if value is _MISSING or value is None:
                return None
            if kind is not None and not isinstance(value, kind):
                raise _bad(where, f"'{path}' (system.response.{key}) is not a {kind.__name__}", raw)
            return value

        rewritten = found("rewritten_query", m.rewritten_query)
        trace.rewritten_query = None if rewritten is None else str(rewritten)
        filters = found("filters", m.filters, dict)
        trace.filters = None if filters is None else dict(filters)
        candidates = found("candidates", m.candidates, list)
        if candidates is not None:
            trace.candidates = [self._chunk(rank, item, raw) for rank, item in enumerate(candidates, start=1)]
        context = found("context", m.context, list)
        if context is not None:
            trace.context = [
                ContextChunk.of(self._chunk(rank, item, raw), _text(item, m.text))
                for rank, item in enumerate(context, start=1)
            ]
        versions = found("versions", m.versions, dict)
        if versions is not None:
            trace.versions = {str(k): str(v) for k, v in versions.items() if v is not None}

    def map_answer(self, data: Any, raw: str | bytes, trace: Trace, where: str) -> None:
        """The answer (``system.response.answer``), citations and usage of a JSON response."""
        m = self.m
        if m.answer is not None:
            answer = get_path(data, m.answer)
            if answer is _MISSING:
                raise _bad(where, f"no '{m.answer}' (system.response.answer) in the response", raw)
            if answer is not None and not isinstance(answer, str):
                raise _bad(where, f"'{m.answer}' (system.response.answer) is not a string", raw)
            trace.answer = answer or ""
        self.map_extras(data, raw, trace, where)

    def map_extras(self, data: Any, raw: str | bytes, trace: Trace, where: str) -> None:
        """Citations and token usage, each when the response carries it (absent: not reported)."""
        m = self.m
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

    def _chunk(self, rank: int, item: Any, raw: str | bytes) -> RetrievedChunk:
        """One retrieved item as a chunk of a dataset document (see HttpResponseConfig for the rules)."""
        m = self.m
        where = f"eval {self.cfg.eval_path}: {m.retrieved}[{rank - 1}]"

        def field(path: str | None) -> Any:
            return _MISSING if path is None else get_path(item, path)

        value = field(m.score)
        try:
            score = 0.0 if value in (_MISSING, None) else float(value)
        except (TypeError, ValueError) as exc:
            raise _bad(where, f"the score is not a number ({exc})", raw) from exc
        doc, chunk = field(m.doc_id), field(m.chunk_id)
        if doc in (_MISSING, None):
            if chunk in (_MISSING, None):
                paths = f"'{m.doc_id}' (system.response.doc_id) nor '{m.chunk_id}' (system.response.chunk_id)"
                raise _bad(where, f"neither {paths}", raw)
            return RetrievedChunk(rank, str(chunk), None, 0, 0, score)  # a chunk named by its id only
        doc_id = str(doc)
        document = None if self.documents is None else self.documents.get(doc_id)
        if self.documents is not None and document is None:
            raise _bad(where, f"doc_id '{doc_id}' is not a document of dataset '{self.dataset}'", raw)
        size = 0 if document is None else len(document.text)
        chunk_id = f"{doc_id}#{rank - 1}" if chunk is _MISSING or chunk is None else str(chunk)
        start, end, text = field(m.start), field(m.end), field(m.text)
        try:
            if start not in (_MISSING, None) and end not in (_MISSING, None):
                lo, hi = int(start), int(end)
                if not 0 <= lo <= hi or (document is not None and hi > size):
                    raise _bad(
                        where,
                        f"[{m.start}, {m.end}) = [{lo}, {hi}) is not a span of document '{doc_id}' "
                        f"({size} characters)",
                        raw,
                    )
            elif (
                document is not None
                and isinstance(text, str)
                and text
                and (found := document.text.find(text)) >= 0
            ):
                lo, hi = found, found + len(text)
            else:
                lo, hi = 0, size
        except (TypeError, ValueError) as exc:
            raise _bad(where, f"a number was expected ({exc})", raw) from exc
        return RetrievedChunk(rank, chunk_id, doc_id, lo, hi, score)

    def _citation(self, item: Any, where: str, raw: str | bytes) -> Citation:
        """A citation: a chunk id string, or a mapping read with the retrieved items' paths."""
        if isinstance(item, str | int) and not isinstance(item, bool):
            return Citation(chunk_id=str(item))
        if isinstance(item, Mapping):
            m = self.m

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

    # ------------------------------------------------------------------ the stream

    def stream(self, trace: Trace, on_first_text: Callable[[], None] | None = None) -> StreamReader:
        return StreamReader(self, trace, on_first_text)


class StreamReader:
    """Reads one answer stream event by event (:meth:`feed` each event's data) into a trace.

    The end is an event whose data is ``system.response.done_data`` (``[DONE]``) or whose
    ``system.response.done`` path is true; citations and usage are taken from any event that
    carries them (the reference's end event, OpenAI's last chunk). Events without answer text
    (heartbeats, role or finish chunks) are skipped. ``on_first_text`` is called at the first
    non-empty piece (time to first token)."""

    def __init__(self, rmap: ResponseMap, trace: Trace, on_first_text: Callable[[], None] | None) -> None:
        self.rmap = rmap
        self.trace = trace
        self.on_first_text = on_first_text
        self.pieces: list[str] = []
        self.ended = False
        self.where = f"chat {rmap.cfg.chat_path}"

    def feed(self, data: str) -> bool:
        """One event's data; True when it ends the stream."""
        m = self.rmap.m
        text = data.strip()
        if not text:
            return False
        if m.done_data is not None and text == m.done_data:
            self.ended = True
            return True
        try:
            event = json.loads(data)
        except json.JSONDecodeError as exc:
            raise _bad(self.where, f"an event's data is not JSON ({exc.msg})", data) from exc
        self.rmap.map_extras(event, data, self.trace, f"{self.where}: an event")
        if m.done is not None and get_path(event, m.done) is True:
            self.ended = True
            return True
        delta = _MISSING if m.delta is None else get_path(event, m.delta)
        if delta is _MISSING or delta is None:
            return False  # an event that carries no text (a heartbeat, a status, a usage chunk)
        if not isinstance(delta, str):
            raise _bad(self.where, f"'{m.delta}' (system.response.delta) is not a string", data)
        if delta and not any(self.pieces) and self.on_first_text is not None:
            self.on_first_text()
        self.pieces.append(delta)
        return False

    def cut(self) -> CallFailure:
        """The failure of a stream that ended before its end event."""
        m = self.rmap.m
        end = f"data '{m.done_data}'" if m.done_data is not None else f"'{m.done}': true"
        return _Failure(
            "stream_cut",
            f"{self.where}: the stream ended without its end event ({end}) "
            f"after {sum(1 for p in self.pieces if p)} content events",
        )


def sse_data(text: str) -> list[str]:
    """The data of each event of a server-sent-events text, in order (the event stream format:
    ``data:`` lines joined by newlines, an event ends at a blank line; comments and other fields
    ignored; a last event without its blank line is kept, as a logged stream may end so)."""
    events: list[str] = []
    data: list[str] | None = None
    for line in [*re.split(r"\r\n|\r|\n", text), ""]:
        if not line:
            if data is not None:
                events.append("\n".join(data))
            data = None
        elif line.startswith("data"):
            name, _, value = line.partition(":")
            if name == "data":
                data = [*(data or []), value[1:] if value.startswith(" ") else value]
    return events


def map_logged(
    settings: RunConfig,
    query: Query,
    eval_data: Any,
    chat: str | Any | None,
    *,
    documents: Mapping[str, Document] | None = None,
) -> Trace:
    """The trace of one logged exchange, mapped with ``settings.system``'s shape as a live call is.

    ``eval_data``: the JSON endpoint's response (parsed, or its text); ``chat``: the stream as
    server-sent-events text (or its events' data as a list), or a JSON body carrying the answer
    (mapped with ``answer``, ``citations``, ``usage``), or None (no answer logged: the trace has
    none). An eval response the shape needs that is missing, or one that does not match, raises
    :class:`CallFailure` (``bad_response``; ``stream_cut`` for a stream without its end event), as
    the live call would record. ``documents`` as in :class:`ResponseMap`. No timings: a logged
    exchange has none."""
    rmap = ResponseMap(settings.system, documents)
    cfg = rmap.cfg
    trace = rmap.new_trace(query.query_id)
    if cfg.chat_path is None and eval_data is None and not _is_stream(chat):
        eval_data, chat = chat, None  # a shape's one JSON response, logged as the chat
    if cfg.eval_path is not None or eval_data is not None:
        where = f"eval {cfg.eval_path}"
        if eval_data is None:
            raise _bad(where, "no response was logged", "")
        raw = eval_data if isinstance(eval_data, str | bytes) else json.dumps(eval_data, ensure_ascii=False)
        rmap.map_json(_parsed(eval_data, where), raw, trace)
    if chat is not None:  # None: no answer was logged (retrieval only), as with chat_path null live
        where = f"chat {cfg.chat_path}"
        if _is_stream(chat):
            reader = rmap.stream(trace)
            events = sse_data(chat) if isinstance(chat, str) else [_event_text(e) for e in chat]
            for data in events:
                if reader.feed(data):
                    break
            trace.answer = "".join(reader.pieces)
            if not reader.ended:
                raise reader.cut()
        else:
            raw = chat if isinstance(chat, str | bytes) else json.dumps(chat, ensure_ascii=False)
            rmap.map_answer(_parsed(chat, where), raw, trace, where)
    return trace


def _is_stream(chat: Any) -> bool:
    """A logged chat response that is a stream: event-stream text (not a JSON body), or its events'
    data as a list."""
    return isinstance(chat, list) or (isinstance(chat, str) and not chat.lstrip().startswith(("{", "[")))


def _event_text(event: Any) -> str:
    """One logged event's data as the stream sent it: text as it is, an object as its JSON."""
    return event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)


def _json_body(body: Any) -> bytes:
    """A request body as JSON bytes, as httpx's ``json=`` writes it (UTF-8, compact), with orjson's
    encoder (what it refuses, such as an int beyond 64 bits, with the json module's). orjson
    writes NaN and infinity as ``null``; a body with a ``null`` is checked by the json module, so a
    non-finite number raises as httpx's ``json=`` did instead of reaching the service as null."""
    try:
        raw = orjson.dumps(body)
    except TypeError:
        raw = b""
    if not raw or b"null" in raw:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return raw


def _json_loads(raw: bytes) -> Any:
    """A JSON response: orjson's parser (a third of the json module's CPU), else the json module's,
    which also reads what orjson refuses (NaN, UTF-16) and names the error."""
    if may_hold_big_int(raw):  # orjson would read an integer beyond 64 bits as a float
        return json.loads(raw)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _parsed(data: Any, where: str) -> Any:
    """A logged body: JSON text parsed, anything else as it is."""
    if not isinstance(data, str | bytes):
        return data
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(where, f"the response is not JSON ({exc})", data) from exc


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
    import asyncio

    if not _RUN_LOOP:
        _RUN_LOOP.append(asyncio.new_event_loop())
    return _RUN_LOOP[0]


_SSL: dict[tuple[str | None, ...], Any] = {}  # the TLS context of every client, per certificate settings


def _ssl_context() -> Any:
    """One TLS context (certifi's CAs, or SSL_CERT_FILE / SSL_CERT_DIR) shared by every client:
    building one reads the CA bundle, about 30 ms of CPU, which a client per connection would pay
    ``system.concurrency`` times."""
    import os

    import httpx

    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if key not in _SSL:
        _SSL[key] = httpx.create_ssl_context()
    return _SSL[key]


@SYSTEMS.register("http")
class HttpSystem:
    """A RAG service behind HTTP: the :class:`~rag_ablate.systems.base.BatchSystem` contract."""

    def __init__(self, settings: RunConfig, cache: Cache | None = None) -> None:
        validate_system(settings.system)
        self.s = settings
        self.rmap = ResponseMap(settings.system)
        self.cfg = self.rmap.cfg  # the shape's presets applied
        assert self.cfg.base_url is not None  # validate_system checked it
        # a user and password in the URL are sent as basic auth, never named with the URL
        self.base_url, self._userinfo = split_userinfo(self.cfg.base_url.rstrip("/"))
        rerank = settings.rerank
        self.top_k = rerank.top_k if rerank.method != "none" else settings.retrieval.top_k
        self.requests_sent = 0  # every HTTP request, retries included (the progress bar's req/s)
        self._rng = random.Random(settings.seed)  # backoff jitter only
        # a service that is down or hung stops the run
        self.breaker = Breaker("system", self.base_url, ("system.timeout_s", self.cfg.timeout_s))
        self._kept: tuple[Any, ...] | None = None  # run()'s shared client, by its key (_RUN_CLIENTS)
        self._urls: dict[str, httpx.URL] = {}  # per endpoint path (_url)
        self._json_headers: httpx.Headers | None = None  # every JSON request's (_post_json)
        self._timeout: dict[str, float | None] = {}  # the clients' timeouts, as a request carries them
        # httpx logs every request at INFO, which Hydra's log setup shows: one line per request would
        # bury the run's output (each query's outcome is in its record instead)
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)

    @property
    def routes_intents(self) -> bool:
        """Intents are mapped and the service has reported them (a service that never does has no
        intent metrics; each query's own response is mapped before it is scored)."""
        return self.rmap.intents_seen

    @property
    def generates_answers(self) -> bool:
        """The service answers (a failed query then misses the answer metrics)."""
        return self.rmap.generates_answers

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        """Keep the documents (to place retrieved text); report where requests go (never headers' values)."""
        self.rmap.documents = dataset.documents
        self.rmap.dataset = dataset.name
        return {
            "http.shape": self.s.system.shape,
            "http.eval_url": "none" if self.cfg.eval_path is None else self.base_url + self.cfg.eval_path,
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
        return loop.run_until_complete(self._one(client, query))

    def _client_key(self) -> tuple[Any, ...]:
        c = self.cfg
        return (self.base_url, tuple(sorted(c.headers.items())), c.timeout_s)

    def run_many(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """Send every query, ``system.concurrency`` at a time; ``on_done`` as each completes."""
        import asyncio

        asyncio.run(self._run_all(queries, on_done))

    # ------------------------------------------------------------------ one run

    def _client(self, in_flight: int | None = None) -> httpx.AsyncClient:
        """A client whose pool holds the connections ``in_flight`` queries use (all of
        ``system.concurrency`` by default): an eval and (with ``chat_path``) a chat connection each."""
        import httpx

        from rag_ablate.systems.http_streams import asyncio_transport

        n = (self.cfg.concurrency if in_flight is None else in_flight) * (
            (self.cfg.eval_path is not None) + (self.cfg.chat_path is not None)
        )
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        return httpx.AsyncClient(
            base_url=self.base_url,
            auth=self._userinfo,
            headers=dict(self.cfg.headers),
            timeout=httpx.Timeout(self.cfg.timeout_s, pool=None),
            limits=limits,
            follow_redirects=True,
            verify=_ssl_context(),  # for a proxy the environment names; the transport has its own
            transport=asyncio_transport(_ssl_context(), limits),
        )

    def _url(self, path: str) -> httpx.URL:
        """The URL of an endpoint, parsed once (a path given to the client is parsed and merged with
        its base URL on every request)."""
        url = self._urls.get(path)
        if url is None:
            import httpx

            url = self._urls[path] = httpx.URL(f"{self.base_url}/{path.lstrip('/')}")
        return url

    async def _post_json(
        self, client: httpx.AsyncClient, url: httpx.URL, content: bytes
    ) -> tuple[httpx.Response, bytes]:
        """POST a JSON body and read the whole response, as ``client.post`` does, at about two
        thirds of its CPU: the request is built on headers the client prepared once (its own and
        the configured ones, basic auth from the URL, the JSON content type) and handed straight to
        the client's transport (the same connection pool, TLS context, timeouts and exceptions),
        without the client's per-request auth flow, cookie merge, event hooks and log line. A
        redirect is followed by the client itself, and once the service has set a cookie every
        request goes through the client (which sends the cookie back)."""
        import httpx

        if client.cookies:
            response = await client.post(url, content=content, headers={"Content-Type": "application/json"})
            return response, response.content
        if self._json_headers is None:
            template = client.build_request("POST", url, json={})
            del template.headers["Content-Length"]
            if self._userinfo is not None:  # what the client's auth would add to each request
                next(httpx.BasicAuth(*self._userinfo).auth_flow(template))
            self._json_headers = template.headers
            self._timeout = client.timeout.as_dict()
        request = httpx.Request(
            "POST", url, headers=self._json_headers, content=content, extensions={"timeout": self._timeout}
        )
        response = await client._transport_for_url(url).handle_async_request(request)  # httpx pinned
        response.request = request
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        if "set-cookie" in response.headers:
            client.cookies.extract_cookies(response)
        if response.has_redirect_location:  # the client follows it (auth kept on the same origin only)
            redirect = client._build_redirect_request(request, response)
            response = await client.send(redirect, auth=None)
            raw = response.content
        return response, raw

    async def _run_all(self, queries: Sequence[Query], on_done: OnDone) -> None:
        """``system.concurrency`` workers, each with a client of its own (one query's connections)
        taking the next query when it is done with one. One pool for all of them would cost more
        CPU than the rest of the query together: httpcore scans every pooled connection for every
        queued request, so its cost per query grows with the concurrency (3.5 ms a query at 64)."""
        import asyncio

        workers = max(1, min(self.cfg.concurrency, len(queries)))
        clients = [self._client(in_flight=1) for _ in range(workers)]
        pending = iter(queries)  # shared: each query is taken by one worker

        async def work(client: httpx.AsyncClient) -> None:
            for query in pending:
                on_done(query, await self._one(client, query))

        try:
            await asyncio.gather(*(self._warm(c, queries[i : i + 1]) for i, c in enumerate(clients)))
            tasks = [asyncio.create_task(work(c)) for c in clients]
            try:
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    async def _warm(self, client: httpx.AsyncClient, queries: Sequence[Query]) -> None:
        """One untimed eval request per query given, sent together, under the id ``WARMUP_ID``,
        their answers and failures ignored: the connections (TCP, TLS) the timed queries reuse
        are opened here, and whatever the service loads on first use is loaded. The chat
        endpoint is not called (it may run a paid model), nor an eval endpoint that answers (the same);
        nor are these counted or retried."""
        import asyncio

        path = self.cfg.eval_path
        if path is None or self.rmap.answers_in_json:
            return

        async def one(query: Query) -> None:
            warm_up = dataclasses.replace(query, query_id=WARMUP_ID)
            values = request_values(warm_up, self.top_k, self.cfg.model)
            with contextlib.suppress(Exception):  # the timed queries record what goes wrong
                await client.post(self._url(path), json=render_body(self.cfg.body, values))

        await asyncio.gather(*(one(q) for q in queries))

    async def _one(self, client: httpx.AsyncClient, query: Query) -> Trace:
        import asyncio

        trace = self.rmap.new_trace(query.query_id)
        t0 = time.perf_counter()
        try:
            body = render_body(self.cfg.body, request_values(query, self.top_k, self.cfg.model))
            calls = []
            if self.cfg.eval_path is not None:
                calls.append(self._eval(client, body, trace, t0))
            if self.cfg.chat_path is not None:
                calls.append(self._chat(client, body, trace, t0))
            # one call is awaited as it is (gather would wrap it in a task of its own)
            results = [await calls[0]] if len(calls) == 1 else list(await asyncio.gather(*calls))
        except RunStopError:
            raise  # the service is down: the run stops
        except Exception as exc:  # a bug or an unforeseen error fails this query only
            trace.status, trace.error = "failed", f"{type(exc).__name__}: {exc}"
            trace.timings_ms["total"] = (time.perf_counter() - t0) * 1000
            return trace
        trace.timings_ms["total"] = (time.perf_counter() - t0) * 1000
        trace.retries = sum(c.retries for c in results)
        # the eval call's failure wins over the chat call's: it is the one that decides scoring
        failed = next((c.failure for c in results if c.failure is not None), None)
        if failed is not None:
            trace.status, trace.error, trace.http_status = failed.status, failed.error, failed.http_status
        else:
            trace.http_status = results[0].http_status
        return trace

    async def _retrying(self, call: _Call, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` until it returns, or raises _Failure, or retries run out; EndpointDownError
        once ``BREAKER_LIMIT`` tries in a row (any queries') got no response: could not connect, or
        connected and got nothing within ``timeout_s``."""
        import asyncio

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
        assert path is not None
        url = self._url(path)

        content = _json_body(body)

        async def attempt() -> bytes:
            self.requests_sent += 1
            try:
                response, raw = await self._post_json(client, url, content)
            except httpx.TransportError as exc:
                raise _transport_failure(f"eval {path}", exc) from exc
            call.http_status = response.status_code
            failure = _status_failure(f"eval {path}", response, raw)
            if failure is not None:
                raise failure
            return raw

        try:
            raw = await self._retrying(call, attempt)
            try:
                data = _json_loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _bad(f"eval {path}", f"the response is not JSON ({exc})", raw) from exc
            self.rmap.map_json(data, raw, trace)
        except _Failure as f:
            call.failure = f
        call.elapsed_ms = (time.perf_counter() - t0) * 1000
        trace.timings_ms["eval"] = call.elapsed_ms
        return call

    # ------------------------------------------------------------------ chat (server-sent events)

    async def _chat(self, client: httpx.AsyncClient, body: dict[str, Any], trace: Trace, t0: float) -> _Call:
        call = _Call()
        path = self.cfg.chat_path
        assert path is not None

        def first_text() -> None:
            trace.ttft_ms = (time.perf_counter() - t0) * 1000

        reader = self.rmap.stream(trace, first_text)
        try:
            await self._retrying(call, lambda: self._stream(client, path, body, call, reader))
        except _Failure as f:
            call.failure = f
        if reader.pieces:
            trace.answer = "".join(reader.pieces)
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
        call: _Call,
        reader: StreamReader,
    ) -> None:
        """One try of the chat call. Only failures before the first event may be retried."""
        import httpx
        from httpx_sse import SSEError, aconnect_sse

        where = f"chat {path}"
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
                        if reader.feed(event.data):
                            return
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
        raise reader.cut()
