"""A small deterministic OpenAI-compatible chat server on 127.0.0.1 for tests.

It speaks the real wire format of ``POST /v1/chat/completions``:

* ``stream: true``: ``text/event-stream`` chunks ``data: {"choices": [{"delta": {"content": ...}}]}``,
  then (with ``stream_options.include_usage``) a chunk with empty choices and ``usage``, then
  ``data: [DONE]``;
* ``stream: false`` (or absent): one ``chat.completion`` JSON object with ``choices[0].message``
  and ``usage``.

What it answers is up to the test: ``FakeLLM.respond(body, call)`` returns the answer text
(default: a fixed sentence citing [1] and [2]), streamed in pieces split at spaces, or a list
of pieces, streamed as given (usage then counts one completion token per piece). Scripted
failures (status code and headers, e.g. 429 with Retry-After) are served first when queued.
Every request is kept in ``requests`` (body, path, Authorization header).

Use the ``fake_llm`` fixture of tests/conftest.py, or :func:`serve` as a context manager.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any], int], "str | list[str]"]


def default_answer(body: dict[str, Any], call: int) -> str:
    return f"Returns are accepted within 30 days [1] with a receipt [2] (call {call})."


@dataclass
class FakeLLM:
    """The server's state: scripted failures, what it received, how it answers."""

    respond: Responder = default_answer
    failures: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    usage: bool = True  # send usage (the streamed usage chunk / the completion's usage field)
    first_delay_s: float = 0.0  # before the first chunk (the model "thinks")
    piece_delay_s: float = 0.0  # between two streamed chunks
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""  # http://127.0.0.1:<port>/v1 once serving

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r["body"] for r in self.requests]


def _usage(body: dict[str, Any], answer: str | list[str]) -> dict[str, int]:
    prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    completion = len(answer) if isinstance(answer, list) else max(1, len(answer.split()))
    usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": completion}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return usage


def _handler(state: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            return

        def _json(self, code: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            body = json.loads(raw)
            with state.lock:
                state.requests.append(
                    {
                        "t": time.perf_counter(),
                        "path": self.path,
                        "body": body,
                        "auth": self.headers.get("Authorization"),
                    }
                )
                call = len(state.requests)
                failure = state.failures.pop(0) if state.failures else None
            if failure is not None:
                code, headers = failure
                self._json(code, {"error": {"message": f"scripted {code}"}}, headers)
                return
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            answer = state.respond(body, call)
            time.sleep(state.first_delay_s)
            if not body.get("stream"):
                payload: dict[str, Any] = {
                    "id": f"c{call}",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(answer)},
                            "finish_reason": "stop",
                        }
                    ],
                }
                if state.usage:
                    payload["usage"] = _usage(body, answer)
                self._json(200, payload)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            pieces = answer if isinstance(answer, list) else re.findall(r"\S+\s*|\s+", answer) or [""]
            for piece in pieces:
                chunk = {
                    "id": f"c{call}",
                    "object": "chat.completion.chunk",
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(state.piece_delay_s)
            if state.usage and (body.get("stream_options") or {}).get("include_usage"):
                usage = _usage(body, answer)
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


@contextmanager
def serve(state: FakeLLM | None = None) -> Iterator[FakeLLM]:
    """Serve ``state`` (a new :class:`FakeLLM` by default) on a free port; ``state.url`` is the API root."""
    state = state or FakeLLM()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
