"""system=http speaks the shapes services speak (``system.shape``), against stubs on 127.0.0.1.

* Well-formed traffic of every shape (the reference wire format, OpenAI chat completions
  streamed and not, a plain JSON answer, one endpoint with answer and evidence) ends ``ok`` for
  every query: no ``bad_response``; each field a shape carries lands in the record, and a field it
  does not carry makes its metrics absent (no retrieval metrics without evidence, no intent
  metrics without intents), never a failure.
* Broken traffic gets its honest status: a stream without ``[DONE]`` is ``stream_cut``, a chunk
  or body that is not JSON or lacks the answer is ``bad_response``.
* A logged exchange mapped with :func:`map_logged` gives the trace a live call gives, and the
  same failures.
* End to end: ``python -m rag_ablate system=http system.shape=openai_chat_stream ...`` against
  the OpenAI-style stub, records and metrics read back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import HttpResponseConfig, RunConfig
from rag_ablate.config.shapes import SHAPES, check_shape, resolve_shape
from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.records.scoring import aggregate
from rag_ablate.settings import validate
from rag_ablate.systems.http import CallFailure, HttpSystem, map_logged, sse_data
from tests.conftest import DOCS, QUERIES, run_in_process
from tests.stub_rag_service import in_thread
from tests.test_http_system import _http_settings, _run

TEXT = {d["doc_id"]: d["text"] for d in DOCS}
BY_QUERY = {q["query"]: q for q in QUERIES}
MODEL = "stub-model"


def answer_of(query_id: str) -> str:
    return f"The answer to {query_id} is in the documents."


def evidence_of(query_id: str) -> list[dict[str, Any]]:
    """The query's relevant documents first (whole-document spans), as a service would rank them."""
    q = next((q for q in QUERIES if q["query_id"] == query_id), None)
    relevant = [] if q is None else list(q.get("relevant", {}))
    ranked = relevant + [d for d in TEXT if d not in relevant]
    return [
        {"doc_id": d, "chunk_id": f"{d}#0", "start": 0, "end": len(TEXT[d]), "score": 1.0 / r}
        for r, d in enumerate(ranked, start=1)
    ]


USAGE = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}


class ShapeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, faults: dict[str, str], intents: bool, chunk_ids_only: bool) -> None:
        super().__init__(("127.0.0.1", 0), ShapeHandler)
        self.faults = faults  # query id -> a way to break the response
        self.intents = intents  # the reference eval endpoint reports intents
        self.chunk_ids_only = chunk_ids_only  # retrieved items carry a chunk id and a score only
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class ShapeHandler(BaseHTTPRequestHandler):
    """Every shape's endpoint; what it answers is the query's answer and evidence, unless the
    server's ``faults`` break it for that query: ``no_done`` (a stream without its end),
    ``bad_chunk`` (an event that is not JSON), ``malformed`` (a body that is not JSON),
    ``no_answer`` (JSON without the answer)."""

    protocol_version = "HTTP/1.1"
    server: ShapeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, payload: Any, content_type: str = "application/json") -> None:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append((self.path, body))
        if "messages" in body:
            query = BY_QUERY.get(body["messages"][-1]["content"])
            qid = "warm-up" if query is None else query["query_id"]
        else:
            qid = body["query_id"]
        fault = self.server.faults.get(qid, "")
        answer = answer_of(qid)
        if fault == "malformed":
            self._send(b'{"answer": "cut sho')
        elif self.path == "/rag/eval":
            intents = {"intentLeafIds": ["K_returns"]} if self.server.intents else {}
            self._send({"retrieved": evidence_of(qid), **intents})
        elif self.path == "/rag/chat":
            events: list[Any] = [{"delta": p} for p in _pieces(answer)]
            self._stream([*events, {"done": True, "citations": [f"{qid}#0"], "usage": USAGE}], None)
        elif self.path == "/v1/chat/completions" and body.get("stream"):
            chunks: list[Any] = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
            chunks += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in _pieces(answer)]
            chunks += [{"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
            chunks += [{"choices": [], "usage": USAGE}]
            if fault == "bad_chunk":
                chunks.insert(2, "{not json")
            self._stream(chunks, None if fault == "no_done" else "[DONE]")
        elif self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": answer}
            choices = [] if fault == "no_answer" else [{"index": 0, "message": message}]
            self._send({"object": "chat.completion", "choices": choices, "usage": USAGE})
        elif self.path == "/answer":
            self._send({"answer": answer} if fault != "no_answer" else {"text": answer})
        elif self.path == "/rag/query":
            evidence = evidence_of(qid)
            cites = [{"doc_id": e["doc_id"], "chunk_id": e["chunk_id"]} for e in evidence[:1]]
            if self.server.chunk_ids_only:
                evidence = [{"chunk_id": e["chunk_id"], "score": e["score"]} for e in evidence]
                cites = [{"chunk_id": c["chunk_id"]} for c in cites]
            self._send({"answer": answer, "retrieved": evidence, "citations": cites, "usage": USAGE})
        else:
            self.send_error(404)

    def _stream(self, events: list[Any], end: str | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for e in events:
            data = e if isinstance(e, str) else json.dumps(e)
            self.wfile.write(f"data: {data}\n\n".encode())
        if end is not None:
            self.wfile.write(f"data: {end}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


def _pieces(text: str) -> list[str]:
    return [text[i : i + 5] for i in range(0, len(text), 5)]


@contextmanager
def shape_server(
    faults: dict[str, str] | None = None, *, intents: bool = True, chunk_ids_only: bool = False
) -> Iterator[ShapeServer]:
    with in_thread(ShapeServer(faults or {}, intents, chunk_ids_only)) as server:
        yield server


def _url(server: ShapeServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _settings(url: str, shape: str, **system: Any) -> RunConfig:
    return _http_settings(url, shape=shape, model=MODEL, timeout_s=5.0, retries=0, **system)


@pytest.fixture
def dataset(tiny_dataset: Path) -> Dataset:
    return load_dataset(tiny_dataset)


# --------------------------------------------------------------------------- presets


def test_an_unknown_shape_lists_the_shapes_and_openai_shapes_need_a_model() -> None:
    base = replace(RunConfig().system, name="http", base_url="http://127.0.0.1:1")
    with pytest.raises(
        UnknownNameError, match=r"unknown system\.shape 'openai'; valid: json_answer, openai_chat,"
    ):
        check_shape(replace(base, shape="openai"))
    with pytest.raises(
        UnknownNameError, match=r"unknown system\.shape 'openai'"
    ):  # when the config is composed
        validate(RunConfig(system=replace(base, shape="openai")))
    with pytest.raises(ConfigError, match=r"system\.shape=openai_chat_stream sends the model's name"):
        check_shape(replace(base, shape="openai_chat_stream"))
    # a body of one's own needs no model
    check_shape(
        replace(base, shape="openai_chat", body={"messages": [{"role": "user", "content": "{query}"}]})
    )
    assert set(SHAPES.names()) == {"reference", "openai_chat_stream", "openai_chat", "json_answer", "single"}


def test_each_preset_is_a_full_set_that_single_settings_override() -> None:
    base = replace(RunConfig().system, name="http", base_url="http://x", model=MODEL)
    for name in SHAPES.names():
        r = resolve_shape(replace(base, shape=name))
        assert "auto" not in (r.eval_path, r.chat_path), name
        assert "auto" not in vars(r.response).values(), name
        assert resolve_shape(r) == r  # idempotent
    stream = resolve_shape(replace(base, shape="openai_chat_stream"))
    assert (stream.eval_path, stream.chat_path) == (None, "/v1/chat/completions")
    assert stream.body["model"] == "{model}" and stream.body["stream"] is True
    assert stream.response.delta == "choices.0.delta.content" and stream.response.done_data == "[DONE]"
    # one path overridden, a field declared absent, an endpoint moved: the rest stays the preset's
    custom = resolve_shape(
        replace(
            base,
            shape="single",
            eval_path="/api/ask",
            response=HttpResponseConfig(answer="output.text", citations=None),
        )
    )
    assert custom.eval_path == "/api/ask" and custom.chat_path is None
    assert (custom.response.answer, custom.response.citations, custom.response.retrieved) == (
        "output.text",
        None,
        "retrieved",
    )


# --------------------------------------------------------------------------- live traffic


@pytest.mark.parametrize("shape", ["reference", "openai_chat_stream", "openai_chat", "json_answer", "single"])
def test_well_formed_traffic_of_every_shape_is_ok(shape: str, dataset: Dataset) -> None:
    with shape_server() as server:
        records, _ = _run(HttpSystem(_settings(_url(server), shape)), dataset)
    ids = [q.query_id for q in dataset.queries]
    assert [r["status"] for r in records] == ["ok"] * len(ids), [r["error"] for r in records]
    by = {r["query_id"]: r for r in records}
    for qid in ids:
        assert by[qid]["answer"] == answer_of(qid)
    m = aggregate(records)
    assert m["all/error_rate"] == 0.0
    evidence = shape in ("reference", "single")
    streams = shape in ("reference", "openai_chat_stream")
    # the shapes without evidence: retrieved None, no retrieval metric at all (never a miss)
    assert (by["q1"]["retrieved"] is None) is not evidence
    assert ("all/recall_at_1" in m) is evidence
    if evidence:
        assert m["all/recall_at_5"] == 1.0 and by["q1"]["retrieved"][0]["chunk_id"] == "RET#0"
    # time to first token from the first content piece of a stream only
    assert (by["q1"]["ttft_ms"] is not None) is streams
    if streams:
        assert 0 < by["q1"]["ttft_ms"] <= by["q1"]["timings_ms"]["total"]
    # usage is read from the final chunk (OpenAI) or the end event or the JSON body; json_answer has none
    assert by["q1"]["usage"] == (None if shape == "json_answer" else {**USAGE, "embedding_tokens": None})
    # intents and citations only where the service sends them (the stub's answers carry no [n] marker:
    # a service that reports citations has a coverage of 0, one that does not has no coverage at all)
    assert ("all/intent_top1" in m) is (shape == "reference")
    cites = shape in ("reference", "single")
    assert (by["q1"]["citations"] is None) is not cites
    assert ("all/citation_coverage" in m) is cites
    # the request the OpenAI shapes send: messages, the model, stream as the shape says
    if shape.startswith("openai"):
        path, body = next(b for b in server.bodies if b[1]["messages"][0]["content"] == QUERIES[0]["query"])
        assert path == "/v1/chat/completions" and body["model"] == MODEL
        assert body["messages"] == [{"role": "user", "content": QUERIES[0]["query"]}]
        assert body["stream"] is (shape == "openai_chat_stream")


def test_a_service_without_intents_is_ok_and_has_no_intent_metrics(dataset: Dataset) -> None:
    """Finding 2 of issue 24: the default does not assume a router."""
    with shape_server(intents=False) as server:
        system = HttpSystem(_settings(_url(server), "reference"))
        records, _ = _run(system, dataset)
    assert {r["status"] for r in records} == {"ok"}
    assert not system.routes_intents
    assert all("intent_top1" not in r["metrics"] for r in records)
    assert "all/intent_top1" not in aggregate(records) and "all/recall_at_1" in aggregate(records)


def test_evidence_named_by_chunk_ids_only_is_kept_without_document_metrics(dataset: Dataset) -> None:
    """Finding 3 of issue 24: a service that returns only chunk ids failed every query."""
    with shape_server(chunk_ids_only=True) as server:
        records, _ = _run(HttpSystem(_settings(_url(server), "single")), dataset)
    assert {r["status"] for r in records} == {"ok"}, [r["error"] for r in records]
    q1 = next(r for r in records if r["query_id"] == "q1")
    assert [(e["chunk_id"], e["doc_id"]) for e in q1["retrieved"][:2]] == [("RET#0", None), ("SHIP#0", None)]
    assert q1["citations"][0]["chunk_id"] == "RET#0"
    m = aggregate(records)
    # document-level retrieval metrics are absent, not misses; the answer is scored as usual
    assert not any("recall_at" in k or "context_tokens" in k for k in m)
    assert m["all/error_rate"] == 0.0 and "all/refusal" in m
    with pytest.raises(CallFailure, match=r"neither 'doc_id' \(system.response.doc_id\) nor 'chunk_id'"):
        map_logged(
            _settings("http://127.0.0.1:1", "single"),
            _query(dataset),
            {"answer": "", "retrieved": [{}]},
            None,
        )


BROKEN = {"q1": "no_done", "q2": "bad_chunk", "q3": "malformed", "q4": "no_answer"}


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("openai_chat_stream", {"q1": "stream_cut", "q2": "bad_response", "q3": "bad_response", "q4": "ok"}),
        ("openai_chat", {"q1": "ok", "q2": "ok", "q3": "bad_response", "q4": "bad_response"}),
        ("json_answer", {"q1": "ok", "q2": "ok", "q3": "bad_response", "q4": "bad_response"}),
    ],
)
def test_broken_traffic_gets_its_honest_status(
    shape: str, expected: dict[str, str], dataset: Dataset
) -> None:
    with shape_server(BROKEN) as server:
        records, _ = _run(HttpSystem(_settings(_url(server), shape)), dataset)
    by = {r["query_id"]: r for r in records}
    assert {qid: by[qid]["status"] for qid in expected} == expected
    assert all(by[q]["status"] == "ok" for q in by if q not in BROKEN)
    if shape == "openai_chat_stream":
        assert "without its end event (data '[DONE]')" in by["q1"]["error"]
        assert by["q1"]["answer"] == answer_of("q1")  # the partial answer is kept, not scored
        assert by["q1"]["metrics"].get("refusal") is None
        # a failed query of a service without evidence misses no retrieval metric: it has none
        metrics = by["q1"]["metrics"]
        assert "over_refusal" in metrics and not any("recall_at" in k for k in metrics)
        assert "not JSON" in by["q2"]["error"]
        assert "not an event stream" in by["q3"]["error"]  # a JSON body where events were due
    else:
        path = "choices.0.message.content" if shape == "openai_chat" else "answer"
        assert f"no '{path}' (system.response.answer)" in by["q4"]["error"]
        assert "not JSON" in by["q3"]["error"]


# --------------------------------------------------------------------------- logged exchanges


def _query(dataset: Dataset, qid: str = "q1") -> Any:
    return next(q for q in dataset.queries if q.query_id == qid)


def test_map_logged_maps_each_shape_like_a_live_call(dataset: Dataset) -> None:
    q = _query(dataset)
    docs = dataset.documents

    def settings(shape: str) -> RunConfig:
        return _settings("http://127.0.0.1:1", shape)

    answer = answer_of("q1")
    reference_chat = "".join(
        f"data: {json.dumps(e)}\n\n"
        for e in [
            {"delta": "The answer"},
            {"delta": answer[10:]},
            {"done": True, "citations": ["RET#0"], "usage": USAGE},
        ]
    )
    t = map_logged(settings("reference"), q, {"retrieved": evidence_of("q1")}, reference_chat, documents=docs)
    assert t.answer == answer and t.retrieved is not None and t.retrieved[0].doc_id == "RET"
    assert t.citations[0].chunk_id == "RET#0" and t.usage is not None and t.usage.total_tokens == 19
    assert t.intents == [] and t.status == "ok" and t.ttft_ms is None

    chunks = [{"choices": [{"delta": {"content": p}}]} for p in _pieces(answer)]
    stream = "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in [*chunks, {"choices": [], "usage": USAGE}])
    t = map_logged(settings("openai_chat_stream"), q, None, stream + "data: [DONE]")
    assert t.answer == answer and t.retrieved is None and t.usage is not None
    assert t.usage.completion_tokens == 7

    completion = {"choices": [{"message": {"content": answer}}], "usage": USAGE}
    for eval_data, chat in ((completion, None), (json.dumps(completion), None), (None, completion)):
        t = map_logged(settings("openai_chat"), q, eval_data, chat)
        assert (t.answer, t.retrieved) == (answer, None)

    single = {"answer": answer, "retrieved": [{"doc_id": "RET", "text": TEXT["RET"][10:40]}], "usage": USAGE}
    t = map_logged(settings("single"), q, single, None, documents=docs)
    assert t.answer == answer and t.retrieved is not None
    assert (t.retrieved[0].start, t.retrieved[0].end) == (10, 40)  # placed by its text

    # the failures a live call records
    with pytest.raises(CallFailure) as cut:
        map_logged(settings("openai_chat_stream"), q, None, stream)
    assert cut.value.status == "stream_cut" and "[DONE]" in cut.value.error
    with pytest.raises(CallFailure) as bad:
        map_logged(settings("openai_chat"), q, '{"choices": [', None)
    assert bad.value.status == "bad_response" and "not JSON" in bad.value.error
    with pytest.raises(CallFailure, match="no response was logged"):
        map_logged(settings("reference"), q, None, "data: {}\n\n")  # the eval response is needed
    # no chat logged: a trace without an answer (as with chat_path null), not a failure
    assert map_logged(settings("reference"), q, {"retrieved": []}, None).answer is None
    with pytest.raises(CallFailure, match="is not a document of dataset"):
        map_logged(settings("single"), q, {**single, "retrieved": [{"doc_id": "NOPE"}]}, None, documents=docs)


def test_sse_data_reads_multiline_data_comments_and_a_last_event_without_blank_line() -> None:
    text = ': a comment\n\ndata: {"a":\ndata: 1}\n\nevent: x\ndata:no-space\r\n\r\ndata: [DONE]'
    assert sse_data(text) == ['{"a":\n1}', "no-space", "[DONE]"]


# --------------------------------------------------------------------------- the command line


@pytest.mark.slow
def test_an_openai_stream_run_end_to_end(tiny_dataset: Path, tmp_path: Path, fake_llm: Any) -> None:
    fake_llm.respond = lambda body, call: "Returns are accepted within 30 days."
    root = fake_llm.url.removesuffix("/v1")
    proc = run_in_process(
        [
            "system=http",
            "system.shape=openai_chat_stream",
            f"system.base_url={root}",
            f"system.model={MODEL}",
            f"dataset.path={tiny_dataset}",
            "progress=false",
            "tracking=none",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(QUERIES) and {r["status"] for r in records} == {"ok"}
    assert all(
        r["answer"] == "Returns are accepted within 30 days." and r["retrieved"] is None for r in records
    )
    assert all(r["usage"]["completion_tokens"] > 0 and r["ttft_ms"] > 0 for r in records)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["all/error_rate"] == 0.0 and "all/ttft_ms_p50" in metrics
    assert not any("recall_at" in k or "intent_top1" in k for k in metrics)
    assert any(k.endswith("/over_refusal") for k in metrics)
    bodies = fake_llm.bodies()
    assert all(b["model"] == MODEL and b["stream"] is True for b in bodies)
    assert len(bodies) == len(QUERIES)  # no warm-up call to a model endpoint
