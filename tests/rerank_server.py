"""A small, real rerank HTTP server for tests (standard library only).

``POST /rerank`` speaks the request/response shape that common rerank services
share::

    {"query": str, "documents": [str, ...], "top_n": int?, "model": str?}
    -> {"results": [{"index": int, "relevance_score": float}, ...]}

Scoring is a documented lexical overlap, so expected rankings can be worked out
by hand and it works for Chinese as well as English:

* normalise each text with NFKC and casefold, then split it into tokens at every
  run of whitespace, punctuation or symbols;
* a token contributes its character bigrams (a one-character token contributes
  itself), giving a *set* of grams per text;
* ``score = |Q ∩ D| / |Q ∪ D|`` (Jaccard of the query's and the document's sets;
  0.0 when both are empty).

Results are sorted by score descending, index ascending, and cut to ``top_n``.

Switches on :class:`ServerState` (set them from a test before the request) drive
the error paths: fail the first N requests with a status (500, 429 with a
Retry-After in seconds or as an HTTP date some seconds ahead...), reject every
request with a fixed status and JSON error body, return a raw (malformed) body,
shift the returned indices out of range, rename the response keys ("data" /
"score"), sleep longer than the client's timeout, require a bearer token.
Counters record every request and TCP connection.

Use it as a context manager::

    with RerankServer() as server:
        url = server.url  # http://127.0.0.1:<free port>/rerank
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import re
import socket
import sys
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

_SPLIT = re.compile(r"[\s\W_]+", re.UNICODE)


def grams(text: str) -> set[str]:
    """The character-bigram set of ``text`` (see the module docstring)."""
    out: set[str] = set()
    for token in _SPLIT.split(unicodedata.normalize("NFKC", text).casefold()):
        if len(token) == 1:
            out.add(token)
        out.update(token[i : i + 2] for i in range(len(token) - 1))
    return out


def overlap_score(query: str, document: str) -> float:
    """Jaccard similarity of the two texts' character-bigram sets."""
    q, d = grams(query), grams(document)
    union = q | d
    return len(q & d) / len(union) if union else 0.0


def rank(query: str, documents: list[str], top_n: int | None = None) -> list[tuple[int, float]]:
    """``(index, score)`` pairs as the server returns them: score desc, index asc."""
    scored = [(i, overlap_score(query, d)) for i, d in enumerate(documents)]
    scored.sort(key=lambda p: (-p[1], p[0]))
    return scored if top_n is None else scored[:top_n]


@dataclass
class ServerState:
    """Switches a test flips, and what the server saw. Guarded by ``lock``."""

    # error paths
    fail_first: int = 0  # the first N requests get ``fail_status`` instead of an answer
    fail_status: int = 500
    fail_retry_after: str | None = None  # Retry-After header sent with those failures
    fail_retry_at: float | None = None  # or a Retry-After HTTP date this many seconds after each failure
    reject_status: int | None = None  # every request gets this status and ``reject_body``
    reject_body: dict[str, Any] = field(
        default_factory=lambda: {"error": {"type": "invalid_request", "message": "query is too long"}}
    )
    raw_body: str | None = None  # answer 200 with exactly this body (malformed responses)
    index_offset: int = 0  # added to every returned index (an out-of-range index when > 0)
    delay: float = 0.0  # seconds to wait before answering (interrupted when the server stops)
    token: str | None = None  # when set, require "Authorization: Bearer <token>" (else 401)
    # response key names
    results_key: str = "results"  # or "data"
    score_key: str = "relevance_score"  # or "score"
    # what the server saw
    requests: int = 0  # POST /rerank requests received (every attempt, failed or not)
    connections: int = 0  # TCP connections accepted
    last_body: Any = None  # the last request's parsed JSON
    last_headers: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.stopping = threading.Event()
        self.errors: list[BaseException] = []  # exceptions raised inside handlers
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.state.lock:
            self.state.connections += 1
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, ConnectionError):
            self.errors.append(exc)

    def wake_connections(self) -> None:
        """Unblock handler threads waiting on idle keep-alive connections."""
        with self._open_lock:
            conns = list(self._open)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so a client can reuse its connection
    server: _Server
    timeout = 10  # an idle connection never holds a handler thread for long

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, json.dumps(payload, ensure_ascii=False), headers)

    def _send_raw(self, status: int, body: str, headers: dict[str, str] | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send_json(404, {"error": "only POST /rerank"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.rstrip("/") != "/rerank":
            self._send_json(404, {"error": f"no route {self.path}"})
            return
        st = self.server.state
        with st.lock:
            st.requests += 1
            n = st.requests
            st.last_headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                st.last_body = json.loads(raw)
            except ValueError:
                st.last_body = None
            fail = n <= st.fail_first
            fail_status, retry_after, retry_at = st.fail_status, st.fail_retry_after, st.fail_retry_at
            reject_status, reject_body = st.reject_status, st.reject_body
            raw_body, delay, token = st.raw_body, st.delay, st.token
            offset, results_key, score_key = st.index_offset, st.results_key, st.score_key
            body = st.last_body

        if delay > 0 and self.server.stopping.wait(delay):
            self.close_connection = True  # the server is stopping: answer nothing
            return
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            self._send_json(401, {"error": "missing or wrong bearer token"})
            return
        if fail:
            if retry_at is not None:
                retry_after = email.utils.formatdate(time.time() + retry_at, usegmt=True)
            headers = {} if retry_after is None else {"Retry-After": retry_after}
            self._send_json(fail_status, {"error": f"induced failure {n}"}, headers)
            return
        if reject_status is not None:
            self._send_json(reject_status, reject_body)
            return
        if raw_body is not None:
            self._send_raw(200, raw_body)
            return

        problem = _check_request(body)
        if problem:
            self._send_json(400, {"error": problem})
            return
        ranked = rank(body["query"], body["documents"], body.get("top_n"))
        results = [{"index": i + offset, score_key: s} for i, s in ranked]
        payload: dict[str, Any] = {results_key: results}
        if "model" in body:
            payload["model"] = body["model"]
        self._send_json(200, payload)


def _check_request(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    if not isinstance(body.get("query"), str):
        return "'query' must be a string"
    docs = body.get("documents")
    if not isinstance(docs, list) or not all(isinstance(d, str) for d in docs):
        return "'documents' must be a list of strings"
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
        return "'top_n' must be a positive integer"
    return None


class RerankServer:
    """Runs the server on a free loopback port in a background thread."""

    def __init__(self) -> None:
        self.state = ServerState()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/rerank"

    @property
    def errors(self) -> list[BaseException]:
        return [] if self._server is None else list(self._server.errors)

    def start(self) -> RerankServer:
        self._server = _Server(self.state)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="rerank-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.stopping.set()  # interrupt delayed answers
        server.shutdown()  # stop serve_forever
        server.wake_connections()  # end idle keep-alive connections
        server.server_close()  # close the listening socket, join handler threads
        thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> RerankServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
