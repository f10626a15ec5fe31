"""``rag-ablate serve``: the built-in pipeline as an HTTP service (the reference service).

It serves one configuration of the local system (``rag_ablate.systems.local``),
composed from ``conf/`` with Hydra exactly as a run composes it (``chunk=256
retrieval=hybrid`` and any other override, including sizes without a preset
file), on Starlette and uvicorn. Two endpoints, the wire format ``system=http``
reads by default (README "Evaluate your own RAG service over HTTP"):

``POST /rag/eval``
    body ``{"query": str, "query_id": str, "top_k": int, "user_groups": [str]?, "params": {}?}``;
    returns ``{"intentLeafIds": [str], "retrieved": [{"doc_id", "chunk_id", "start", "end",
    "score", "text"}], "timings_ms": {stage: ms}}`` and the pipeline's stages (docs/metrics.md "Stage
    diagnosis": ``rewritten_query``, ``filters``, ``candidates``, ``context``, ``versions``; ``system=http``
    reads them when ``system.response.<name>`` names them). ``top_k`` cuts the list; the served
    pipeline returns at most its own ``retrieval.top_k`` (``rerank.top_k`` with a reranker).
    ``user_groups`` are the asking user's groups (absent or null: an anonymous user): with
    ``retrieval.acl_filter=true`` the service returns only documents they may see (docs/metrics.md
    "Access control"); without it they are accepted and checked only. ``params`` are accepted and
    checked but do not change the answer (the pipeline is configured when the service starts).

``POST /rag/chat``
    the same body; streams ``text/event-stream`` events ``data: {"delta": str}`` and then
    ``data: {"done": true, "citations": [...], "usage": {...}}``. The answer is the configured
    generator's (``generator=...``; with the default ``none``, the extractive answer of
    :mod:`rag_ablate.generators.extractive`), streamed a few characters per event: as fast as it is
    written by default, or at a model's pace with ``--chars-per-s`` (``rag-ablate serve --chars-per-s
    200``: about 50 tokens a second), so that time to first token and total time measure a stream.

``GET /health``
    ``{"status": "ok", ...}`` once the index is built (the service listens only then).

A request the service cannot read gets 400 (not JSON, not an object, arrays or objects nested
deeper than ``MAX_DEPTH``, a number longer than ``MAX_NUMBER_CHARS`` characters), 413 (a body over
``--max-body-bytes``, 1 MB by default, refused from its Content-Length or as it arrives) or 422 (a
field is missing or has the wrong type) with ``{"error": message, "field": name}``. A client that
leaves before its query runs costs no pipeline work. Every request is logged as one line on stderr.

Starlette and uvicorn are imported inside :func:`create_app` and :func:`serve` only, so
runs and every other command never import them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_ablate.core.errors import ConfigError
from rag_ablate.metrics.answers import overlap_terms as overlap_terms  # re-exported
from rag_ablate.metrics.answers import sentences as sentences  # re-exported

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.model import Dataset, Query
    from rag_ablate.generators.base import Generation, Generator
    from rag_ablate.pipeline.chunking import Chunk
    from rag_ablate.records.trace import Trace
    from rag_ablate.systems.local import LocalSystem

EVAL_PATH = "/rag/eval"
CHAT_PATH = "/rag/chat"
HEALTH_PATH = "/health"

PIECE_CHARS = 6  # characters per streamed delta event
CHARS_PER_S = 0.0  # the stream's pace (rag-ablate serve --chars-per-s); 0 = unpaced, as fast as written
ANSWER_CHUNKS = 3  # generator=none: the extractive answer reads the sentences of this many top chunks
USAGE_COUNT = "local"  # usage["count"]: token counts are rag_ablate's own count, not a model tokenizer's
MAX_BODY_BYTES = 1_000_000  # a larger body gets 413 unread (rag-ablate serve --max-body-bytes)
MAX_DEPTH = 16  # JSON arrays and objects nested deeper: 400 (the wire format needs 2)
MAX_NUMBER_CHARS = 64  # a number written with more characters: 400 (before Python converts it)
CLIENT_GONE = 499  # logged for a request whose client left before its answer (nginx's code)

log = logging.getLogger("rag_ablate.cli.serve")


# --------------------------------------------------------------------------- configuration


def compose_settings(overrides: list[str]) -> RunConfig:
    """The run configuration ``python -m rag_ablate overrides...`` would use (one job, no sweep)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides, register_resolvers
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()
    register_resolvers()
    normalized = normalize_overrides(list(overrides))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=normalized)
    except HydraException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = (
            "; the service serves one configuration, so give one value per setting"
            if "Ambiguous value" in first
            else ""
        )
        raise ConfigError(f"overrides {' '.join(overrides) or '(none)'}: {first}{hint}") from exc
    finally:
        GlobalHydra.instance().clear()
    settings = to_settings(cfg)
    if settings.system.name != "local":
        raise ConfigError(
            f"rag-ablate serve serves the built-in pipeline (system=local), got system={settings.system.name}"
        )
    return settings


# --------------------------------------------------------------------------- requests


class RequestError(Exception):
    """A request body the service cannot use; ``status`` is 400 or 422, ``field`` names the culprit."""

    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field}


@dataclass(frozen=True)
class EvalRequest:
    """The body of ``POST /rag/eval`` and ``POST /rag/chat``."""

    query: str
    query_id: str
    top_k: int
    user_groups: tuple[str, ...] | None = None
    params: Mapping[str, Any] | None = None


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _number_text(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARS:
        raise RequestError(
            400, "body", f"a number in the body has {len(text)} characters; the limit is {MAX_NUMBER_CHARS}"
        )
    return text


def _int(text: str) -> int:
    return int(_number_text(text))


def _float(text: str) -> float:
    return float(_number_text(text))


def _no_constant(text: str) -> float:
    raise RequestError(400, "body", f"the body is not JSON: {text} is not a JSON value")


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed body (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            if level <= MAX_DEPTH:  # deeper is refused anyway: stop looking
                stack.extend((v, level + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def parse_request(raw: bytes) -> EvalRequest:
    """Read and check a request body; raises :class:`RequestError` naming the field."""
    try:
        body = json.loads(
            raw.decode("utf-8"), parse_int=_int, parse_float=_float, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(400, "body", f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "body", f"the body nests arrays or objects deeper than {MAX_DEPTH}") from None
    if _depth(body) > MAX_DEPTH:
        raise RequestError(400, "body", f"the body nests arrays or objects deeper than {MAX_DEPTH}")
    if not isinstance(body, dict):
        raise RequestError(400, "body", f"the body must be a JSON object, got {type(body).__name__}")
    for name in ("query", "query_id"):
        if name not in body:
            raise RequestError(422, name, f"'{name}' is required (a string)")
        value = body[name]
        if not isinstance(value, str) or not value.strip():
            raise RequestError(422, name, f"'{name}' must be a non-empty string, got {_describe(value)}")
    if "top_k" not in body:
        raise RequestError(422, "top_k", "'top_k' is required (a whole number >= 1)")
    top_k = body["top_k"]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise RequestError(422, "top_k", f"'top_k' must be a whole number >= 1, got {_describe(top_k)}")
    groups = body.get("user_groups")
    if groups is not None and (not isinstance(groups, list) or not all(isinstance(g, str) for g in groups)):
        raise RequestError(
            422, "user_groups", f"'user_groups' must be a list of strings or null, got {_describe(groups)}"
        )
    params = body.get("params")
    if params is not None and not isinstance(params, dict):
        raise RequestError(422, "params", f"'params' must be an object or null, got {_describe(params)}")
    return EvalRequest(
        query=body["query"],
        query_id=body["query_id"],
        top_k=top_k,
        user_groups=None if groups is None else tuple(groups),
        params=params,
    )


# --------------------------------------------------------------------------- the extractive answer


@dataclass(frozen=True)
class Answer:
    """An extractive answer and the chunks it cites (``citations[i]`` is marker ``[i + 1]``)."""

    text: str
    citations: list[Chunk]
    context: list[Chunk]  # the chunks read to build it


def extractive_answer(query: str, chunks: list[Chunk]) -> Answer:
    """``generator=extractive`` with its default settings (:mod:`rag_ablate.generators.extractive`)
    over ``chunks``: the best-supported sentences of the top chunks, each followed by ``[n]``."""
    from rag_ablate.generators.base import Context
    from rag_ablate.generators.extractive import ExtractiveGenerator

    gen = ExtractiveGenerator()
    contexts = [Context(n, c.chunk_id, c.doc_id, c.start, c.end, c.text) for n, c in enumerate(chunks, 1)]
    out = gen.generate(query, contexts)
    by_id = {c.chunk_id: c for c in chunks}
    cited = [by_id[c.chunk_id] for c in out.citations if c.chunk_id is not None]
    return Answer(out.answer, cited, chunks[: gen.max_chunks])


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into consecutive pieces of ``size`` characters (the last may be shorter)."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON in its data field."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


# --------------------------------------------------------------------------- the service


class ReferenceService:
    """The local system behind the two endpoints; framework-free, so it is usable without a server.

    The pipeline runs one query at a time (a lock), in a worker thread, so streams of other
    requests keep flowing while a query is retrieved.
    """

    def __init__(self, system: LocalSystem, dataset: Dataset, settings: RunConfig, label: str) -> None:
        self.system = system
        self.dataset = dataset
        self.settings = settings
        self.label = label
        self._by_chunk = {c.chunk_id: c for c in system.chunks}
        self._by_query = {q.query_id: q for q in dataset.queries}
        self._lock = threading.Lock()
        self.generator = answer_generator(settings)

    @classmethod
    def start(cls, overrides: list[str], *, cwd: Path | None = None) -> ReferenceService:
        """Compose the configuration, load the dataset and build the index (from the run cache)."""
        from rag_ablate.core.cache import Cache
        from rag_ablate.run.runner import get_dataset, variant_label
        from rag_ablate.systems.local import LocalSystem

        settings = compose_settings(overrides)
        root = ((cwd or Path.cwd()) / settings.paths.output_root).resolve()
        cache = Cache(
            Path(settings.cache.dir) if settings.cache.dir else root / "cache", enabled=settings.cache.enabled
        )
        dataset = get_dataset(settings)
        system = LocalSystem(settings, cache)
        system.prepare(dataset)
        return cls(system, dataset, settings, variant_label(overrides))

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "system": "local",
            "label": self.label,
            "dataset": self.dataset.name,
            "chunks": len(self.system.chunks),
            "routes_intents": self.system.routes_intents,
        }

    def _query(self, req: EvalRequest) -> tuple[Query, bool]:
        """The Query to run: the dataset's own when id and text match, else a new one (and True)."""
        from rag_ablate.dataset.model import Query

        known = self._by_query.get(req.query_id)
        if known is not None and known.query == req.query:
            # the request's user, not the dataset's, is who asks (retrieval.acl_filter honours it)
            return replace(known, user_groups=req.user_groups), False
        internal = f"serve:{uuid.uuid4().hex}"
        return (
            Query(
                query_id=internal,
                query=req.query,
                relevant={},
                evidence=(),
                answerable=True,
                requires_rag=True,
                reference_answers=(),
                intent_l1=None,
                intent_l2=None,
                split="dev",
                group=internal,
                user_groups=req.user_groups,
            ),
            True,
        )

    def _encode_on_demand(self, query: Query) -> tuple[list[dict[str, Any]], float]:
        """Put ``query``'s vector into every query-vector set the stages use (dataset queries were
        encoded ahead); returns the sets touched and the milliseconds spent."""
        from rag_ablate.pipeline.encoders import load_encoder

        touched: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        # the encoders the stages asked for during prepare() (LocalSystem keeps them per resolved name)
        for name in list(self.system._embeddings):
            vectors = self.system.embeddings(name).queries.vectors
            vec = load_encoder(name).encode_queries(
                [query.query], batch_size=self.settings.retrieval.dense.batch_size
            )
            vectors[query.query_id] = vec[0]
            touched.append(vectors)
        return touched, (time.perf_counter() - t0) * 1000

    def run(self, req: EvalRequest) -> Trace:
        """Run the pipeline on one request (blocking; call it from a worker thread)."""
        with self._lock:
            query, new = self._query(req)
            touched: list[dict[str, Any]] = []
            encode_ms = 0.0
            try:
                if new:
                    touched, encode_ms = self._encode_on_demand(query)
                trace = self.system.run(query)
            finally:
                for vectors in touched:
                    vectors.pop(query.query_id, None)
        if touched:
            trace.timings_ms["encode_on_demand"] = encode_ms
        trace.query_id = req.query_id
        trace.retrieved = (trace.retrieved or [])[: req.top_k]
        return trace

    def eval_response(self, trace: Trace, service_ms: float) -> dict[str, Any]:
        return {
            "intentLeafIds": list(trace.intents),
            "retrieved": [
                {
                    "doc_id": r.doc_id,
                    "chunk_id": r.chunk_id,
                    "start": r.start,
                    "end": r.end,
                    "score": r.score,
                    "text": self._by_chunk[r.chunk_id].text,
                }
                for r in trace.retrieved or []
            ],
            "timings_ms": {**trace.timings_ms, "service": service_ms},
            # the stages the pipeline reports (without chunk texts: the ids locate them)
            **{k: v for k, v in _stages(trace).items() if v is not None},
        }

    def answer(self, req: EvalRequest, trace: Trace) -> tuple[Generation, dict[str, Any]]:
        """The configured generator's answer to a traced request, and its done event."""
        from rag_ablate.generators.base import Context

        chunks = [self._by_chunk[r.chunk_id] for r in trace.retrieved or []]
        contexts = [Context(n, c.chunk_id, c.doc_id, c.start, c.end, c.text) for n, c in enumerate(chunks, 1)]
        gen = self.generator.generate(req.query, contexts)
        usage: dict[str, Any] = (
            {} if gen.usage is None else {k: v for k, v in asdict(gen.usage).items() if v is not None}
        )
        if gen.usage_count is not None:
            usage["count"] = gen.usage_count
        done = {
            "done": True,
            "citations": [
                {"n": n, "doc_id": c.doc_id, "chunk_id": c.chunk_id, "start": c.start, "end": c.end}
                for n, c in enumerate(gen.citations, start=1)
            ],
            "usage": usage,
        }
        return gen, done


def _stages(trace: Trace) -> dict[str, Any]:
    """A trace's stage fields as the eval response carries them (None: not reported)."""
    return {
        "rewritten_query": trace.rewritten_query,
        "filters": trace.filters,
        "candidates": None if trace.candidates is None else [c.to_entry() for c in trace.candidates],
        "context": None if trace.context is None else [c.to_entry() for c in trace.context],
        "versions": trace.versions or None,
    }


def answer_generator(settings: RunConfig) -> Generator:
    """The generator ``generator.name`` configures; ``none`` serves the extractive answer (the
    chat endpoint always answers), with the ``generator`` group's extractive settings."""
    from rag_ablate.generators import GENERATORS
    from rag_ablate.generators.extractive import ExtractiveGenerator

    gen = GENERATORS.get(settings.generator.name)(settings, None)
    return gen if gen is not None else ExtractiveGenerator.from_config(settings.generator)


# --------------------------------------------------------------------------- the ASGI app


def create_app(
    service: ReferenceService,
    *,
    piece_chars: int = PIECE_CHARS,
    piece_delay_s: float = 0.0,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The Starlette application of ``service``: the two endpoints, /health and the request log.

    The chat stream sends ``piece_chars`` characters per event, event ``i`` due ``i * piece_delay_s``
    after the first (a schedule, so the sleeps' overshoot does not add up; 0: unpaced).

    A body over ``max_body_bytes`` gets 413: at once when its Content-Length says so, else as soon
    as that much has arrived (the rest is never read). A client that leaves while its body arrives or
    while its query waits for the pipeline costs no pipeline work (logged as 499)."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    pipeline = asyncio.Lock()  # one query at a time; a waiting request whose client left is skipped

    def too_large(size: str) -> RequestError:
        return RequestError(
            413, "body", f"the body is {size} bytes; the limit is {max_body_bytes} (serve --max-body-bytes)"
        )

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise too_large(declared)
        parts, size = [], 0
        async for part in request.stream():
            size += len(part)
            if size > max_body_bytes:
                raise too_large(f"over {max_body_bytes}")
            parts.append(part)
        return b"".join(parts)

    async def traced(request: Request) -> tuple[EvalRequest, Trace, float]:
        req = parse_request(await read_body(request))
        request.state.query_id = req.query_id
        async with pipeline:
            if await request.is_disconnected():
                raise ClientDisconnect
            t0 = time.perf_counter()
            trace = await run_in_threadpool(service.run, req)
        return req, trace, (time.perf_counter() - t0) * 1000

    def refused(request: Request, exc: Exception) -> Response:
        if isinstance(exc, RequestError):
            return JSONResponse(exc.to_dict(), status_code=exc.status)
        request.state.detail = "client gone"  # nobody reads this answer
        return Response(status_code=CLIENT_GONE)

    async def rag_eval(request: Request) -> Response:
        try:
            _, trace, ms = await traced(request)
        except (RequestError, ClientDisconnect) as exc:
            return refused(request, exc)
        request.state.detail = f"retrieved={len(trace.retrieved or [])}"
        return JSONResponse(service.eval_response(trace, ms))

    async def rag_chat(request: Request) -> Response:
        try:
            req, trace, _ = await traced(request)
        except (RequestError, ClientDisconnect) as exc:
            return refused(request, exc)
        ans, done = service.answer(req, trace)
        request.state.detail = f"answer_chars={len(ans.answer)} citations={len(ans.citations)}"

        async def events() -> AsyncIterator[bytes]:
            start = time.perf_counter()
            for i, piece in enumerate(pieces(ans.answer, piece_chars)):
                due = start + i * piece_delay_s - time.perf_counter()
                if due > 0:
                    await asyncio.sleep(due)
                yield sse_event({"delta": piece})
            yield sse_event(done)

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def health(request: Request) -> Response:
        return JSONResponse(service.health())

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        return JSONResponse({"error": detail, "field": None}, status_code=status)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}", "field": None}, status_code=500)

    class RequestLog:
        """One line per request when its response is complete: method, path, status, time, query id."""

        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await self.app(scope, receive, send)
                return
            t0 = time.perf_counter()
            status = 500
            state: dict[str, Any] = scope.setdefault("state", {})

            async def send_logged(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await self.app(scope, receive, send_logged)
            finally:
                ms = (time.perf_counter() - t0) * 1000
                extra = " ".join(
                    f"{k}={state[k]}" if k == "query_id" else str(state[k])
                    for k in ("query_id", "detail")
                    if k in state
                )
                log.info(
                    "%s %s %d %.1fms%s",
                    scope["method"],
                    scope["path"],
                    status,
                    ms,
                    f" {extra}" if extra else "",
                )

    routes = [
        Route(EVAL_PATH, rag_eval, methods=["POST"]),
        Route(CHAT_PATH, rag_chat, methods=["POST"]),
        Route(HEALTH_PATH, health, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})
    app.add_middleware(RequestLog)
    return app


def serve(
    overrides: list[str],
    host: str = "127.0.0.1",
    port: int = 8000,
    max_body_bytes: int = MAX_BODY_BYTES,
    chars_per_s: float = CHARS_PER_S,
) -> int:
    """Build the index for ``overrides``, then serve it until interrupted (Ctrl-C, SIGTERM); the chat
    stream goes at ``chars_per_s`` characters a second (0: unpaced)."""
    import uvicorn

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    print(f"rag-ablate serve: building {' '.join(overrides) or 'the baseline'} ...", file=sys.stderr)
    service = ReferenceService.start(overrides)
    s = service.settings
    print(
        f"rag-ablate serve: {service.label} ({s.dataset.name}, {len(service.system.chunks)} chunks, "
        f"retrieval={s.retrieval.method}, rerank={s.rerank.method}) on http://{host}:{port}\n"
        f"  POST {EVAL_PATH}  POST {CHAT_PATH}  GET {HEALTH_PATH}   (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        create_app(
            service,
            piece_delay_s=PIECE_CHARS / chars_per_s if chars_per_s > 0 else 0.0,
            max_body_bytes=max_body_bytes,
        ),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = uvicorn.Server(config)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again with the handler
    # found before it started: SIGTERM gets this one, so both end here instead of in a traceback
    signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        service.system.close()
    # a port uvicorn could not bind makes it exit with its own status (3) after logging why
    print("rag-ablate serve: stopped", file=sys.stderr)
    return 0
