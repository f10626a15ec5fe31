"""system=http against real servers on 127.0.0.1.

* Parity: the reference service (rag_ablate.cli.serve on uvicorn) wraps the local pipeline;
  evaluating through it gives the local system's retrieval and intent metrics.
* Faults: a stdlib HTTP server that misbehaves on purpose per query (timeouts, 5xx
  bursts, 429 with Retry-After, malformed JSON, a mapping that does not match, a cut
  stream, 403, a refused connection); each query ends with its honest status and
  exactly one final record, and the retries happen as configured.
* The command line: a run above system.max_error_rate is logged, marked FAILED in
  MLflow and exits non-zero; the API key sent in a header is stored nowhere.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.keys import redact, redact_override
from rag_ablate.config.schema import RunConfig
from rag_ablate.config.shapes import check_shape, resolve_shape
from rag_ablate.core.errors import ConfigError, EndpointDownError
from rag_ablate.core.retry import BREAKER_LIMIT, excerpt, retry_after_seconds
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.records.scoring import aggregate
from rag_ablate.records.trace import Record, Trace
from rag_ablate.run.runner import evaluate
from rag_ablate.settings import validate_system
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.http import WARMUP_ID, HttpSystem, get_path, render_body, request_values
from rag_ablate.systems.local import LocalSystem
from tests.conftest import DOCS, QUERIES, run_module, write_dataset

KS = [1, 3, 5, 10]


# --------------------------------------------------------------------------- settings


def _local_settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 40, 5
    return s


def _http_settings(base_url: str, **system: Any) -> RunConfig:
    s = _local_settings()
    s.system = replace(s.system, name="http", base_url=base_url, **system)
    return s


# --------------------------------------------------------------------------- unit checks


def test_body_template_inserts_query_values_with_their_types() -> None:
    q = replace(load_dataset(None).queries[0], user_groups=("staff", "eu"))
    values = request_values(q, 7)
    assert render_body({}, values) == {
        "query": q.query,
        "query_id": q.query_id,
        "top_k": 7,
        "user_groups": ["staff", "eu"],
    }
    # a query without groups sends none (the wire format's user_groups is optional)
    assert "user_groups" not in render_body({}, request_values(replace(q, user_groups=None), 7))
    template = {
        "question": "{query}",
        "k": "{top_k}",
        "acl": "{user_groups}",
        "trace": "id={query_id} k={top_k} groups={user_groups}",
        "params": {"chunk_size": 256, "list": ["{top_k}", "x"]},
    }
    assert render_body(template, values) == {
        "question": q.query,
        "k": 7,
        "acl": ["staff", "eu"],
        "trace": f"id={q.query_id} k=7 groups=staff,eu",
        "params": {"chunk_size": 256, "list": [7, "x"]},
    }


def test_dotted_paths_read_mappings_and_lists() -> None:
    data = {"data": {"hits": [{"id": "D1"}, {"id": "D2"}]}, "flag": False}
    assert get_path(data, "data.hits.1.id") == "D2"
    assert get_path(data, "data.hits.-1.id") == "D2"
    assert get_path(data, "flag") is False
    missing = get_path(data, "data.hits.2.id")
    assert missing is get_path(data, "nope") and missing is not None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    # an HTTP date 90 s after "now"
    assert retry_after_seconds("Wed, 21 Oct 2015 07:29:30 GMT", now=1445412480.0) == pytest.approx(90.0)
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0) == 0.0


def test_excerpt_is_short_and_on_one_line() -> None:
    text = "line one\nline two " + "x" * 500
    out = excerpt(text)
    assert "\n" not in out and out.startswith("line one line two") and len(out) <= 203


def test_http_settings_are_checked_with_clear_messages() -> None:
    with pytest.raises(ConfigError, match=r"system=http needs system.base_url"):
        validate_system(replace(RunConfig().system, name="http"))
    with pytest.raises(ConfigError, match=r"system.concurrency must be >= 1"):
        validate_system(replace(RunConfig().system, name="http", base_url="http://x", concurrency=0))
    with pytest.raises(ConfigError, match=r"system.eval_path must start with '/'"):
        check_shape(replace(RunConfig().system, name="http", base_url="http://x", eval_path="rag"))
    with pytest.raises(ConfigError, match=r"max_error_rate must be in \[0, 1\]"):
        validate_system(replace(RunConfig().system, max_error_rate=1.5))
    assert "http" in SYSTEMS.names()


def test_system_http_composes_from_conf_and_needs_its_base_url() -> None:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigError, match=r"system=http needs system\.base_url"):
            to_settings(compose("config", overrides=["system=http"]))
        cfg = compose(
            "config",
            overrides=[
                "system=http",
                "system.base_url=http://127.0.0.1:8000",
                "+system.body.size='${chunk.size}'",
            ],
        )
    s = resolve_shape(to_settings(cfg).system)  # the reference shape's presets
    assert (s.eval_path, s.chat_path, s.concurrency, s.response.intents) == (
        "/rag/eval",
        "/rag/chat",
        8,
        "intentLeafIds",
    )
    assert s.body == {"size": 512}  # an interpolation sends a config value


def test_header_values_are_redacted_nested_and_flat() -> None:
    nested = {"system": {"name": "http", "headers": {"Authorization": "Bearer s3cret", "X-Team": "a"}}}
    assert redact(nested) == {
        "system": {"name": "http", "headers": {"Authorization": "***", "X-Team": "***"}}
    }
    flat = {"system.headers.Authorization": "Bearer s3cret", "system.base_url": "http://x"}
    assert redact(flat) == {"system.headers.Authorization": "***", "system.base_url": "http://x"}
    assert (
        redact_override("+system.headers.Authorization='Bearer s3cret'")
        == "+system.headers.Authorization=***"
    )
    assert redact_override("system.headers={X-Key: s3cret}") == "system.headers=***"
    assert redact_override("system.base_url=http://x") == "system.base_url=http://x"


def test_end_table_shows_statuses_and_time_percentiles() -> None:
    from rag_ablate.run.summary import summary_rows

    local = {
        "label": "local",
        "metrics": {"all/latency_ms_p50": 2.0, "all/latency_ms_p95": 9.5, "all/n_failed": 0},
    }
    remote = {
        "label": "http",
        "metrics": {
            "all/latency_ms_p50": 120.0,
            "all/latency_ms_p95": 480.0,
            "all/ttft_ms_p50": 40.0,
            "all/ttft_ms_p95": 95.0,
            "all/n_failed": 3.0,
            "all/n_status_timeout": 2.0,
            "all/n_status_http_error": 1.0,
        },
    }
    headers, rows = summary_rows([local, remote], [])
    assert headers == ["variant", "ms p50 / p95", "ttft ms p50 / p95", "failed"]
    assert rows == [
        ["local", "2.000 / 9.500", "- / -", "0"],
        ["http", "120.0 / 480.0", "40.000 / 95.000", "3 (http_error 1, timeout 2)"],
    ]
    # without a streaming variant there is no first-token column
    assert summary_rows([local], [])[0] == ["variant", "ms p50 / p95", "failed"]


# --------------------------------------------------------------------------- servers


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def uvicorn_app(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread on a free port; yields its base URL."""
    import uvicorn

    sock = _listening_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


RET_TEXT = next(d["text"] for d in DOCS if d["doc_id"] == "RET")
OK_EVAL = {
    "intentLeafIds": ["", "K_returns"],
    "retrieved": [
        {"doc_id": "RET", "chunk_id": "RET#0", "start": 0, "end": 54, "score": 2.5, "text": RET_TEXT[:54]},
        # no offsets: placed by its text
        {"doc_id": "RET", "chunk_id": "RET#1", "score": 1.0, "text": RET_TEXT[55:100]},
    ],
    "timings_ms": {"retrieve": 1.5, "route": 0.5},
}
DONE = {
    "done": True,
    "citations": [{"n": 1, "doc_id": "RET", "chunk_id": "RET#0", "start": 0, "end": 54}, "RET#1"],
    "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43},
}
SLOW_S = 2.5  # the "slow" scenario's delay; the fault tests' timeout is well below it


class Plan:
    """Which scenario each query id gets, and every request the fault server saw."""

    def __init__(self, scenarios: dict[str, str]) -> None:
        self.scenarios = scenarios
        self.seen: dict[tuple[str, str], list[float]] = defaultdict(list)  # (path, query id) -> times
        self.headers: list[dict[str, str]] = []
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0

    def hit(self, path: str, query_id: str, headers: dict[str, str]) -> int:
        with self.lock:
            self.seen[(path, query_id)].append(time.monotonic())
            self.headers.append(headers)
            return len(self.seen[(path, query_id)])

    def count(self, path: str, query_id: str) -> int:
        return len(self.seen[(path, query_id)])


class FaultHandler(BaseHTTPRequestHandler):
    """Speaks the wire format, and misbehaves as the plan says for each query id.

    Scenarios: ok, empty (no retrieved items), slow (eval answers after SLOW_S), burst
    (eval 503 twice, then ok), throttled (eval 429 with Retry-After: 1 once), down (eval
    500 always), malformed (eval 200 with broken JSON), mismatch (eval JSON without
    ``retrieved``), forbidden (403 on both), cut (the chat stream breaks off mid-chunk),
    ended (the chat stream closes cleanly without its end event).
    """

    protocol_version = "HTTP/1.1"
    server: PlanServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _json(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        qid = body["query_id"]
        plan = self.server.plan
        attempt = plan.hit(self.path, qid, dict(self.headers))
        plan.bodies.append(body)
        scenario = plan.scenarios.get(qid, "ok")
        if scenario == "forbidden":
            self._json(403, {"error": "forbidden"})
        elif self.path == "/rag/eval":
            self._eval(scenario, attempt)
        elif self.path == "/rag/chat":
            self._chat(scenario)
        else:
            self._json(404, {"error": "no such path"})

    def _eval(self, scenario: str, attempt: int) -> None:
        if scenario == "busy":  # 0.3 s of work; counts the requests handled at once
            plan = self.server.plan
            with plan.lock:
                plan.in_flight += 1
                plan.max_in_flight = max(plan.max_in_flight, plan.in_flight)
            time.sleep(0.3)
            with plan.lock:
                plan.in_flight -= 1
            self._json(200, OK_EVAL)
        elif scenario == "slow":
            time.sleep(SLOW_S)
            self._json(200, OK_EVAL)
        elif scenario == "burst" and attempt <= 2:
            self._json(503, {"error": "overloaded"})
        elif scenario == "throttled" and attempt == 1:
            self._json(429, {"error": "slow down"}, {"Retry-After": "1"})
        elif scenario == "down":
            self._json(500, {"error": "internal"})
        elif scenario == "malformed":
            self._json(200, b'{not json "retrieved": [')
        elif scenario == "mismatch":
            self._json(200, {"hits": [{"id": "RET"}], "intents": []})
        elif scenario == "empty":
            self._json(200, {**OK_EVAL, "retrieved": []})
        else:
            self._json(200, OK_EVAL)

    def _chat(self, scenario: str) -> None:
        events = [{"delta": "Thirty "}, {"delta": "days"}, {"delta": "."}]
        chunks = [f"data: {json.dumps(e)}\n\n".encode() for e in events]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if scenario == "cut":  # chunked transfer that stops in the middle of a chunk
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            first = chunks[0]
            self.wfile.write(f"{len(first):x}\r\n".encode() + first + b"\r\n")
            second = chunks[1]  # announced whole, sent in part
            self.wfile.write(f"{len(second):x}\r\n".encode() + second[:12])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send_header("Connection", "close")  # the body ends when the connection closes
        self.end_headers()
        if scenario == "ended":
            self.wfile.write(chunks[0])
        else:
            self.wfile.write(b": a comment line, ignored\n\n")
            self.wfile.write(b"".join(chunks))
            self.wfile.write(f"data: {json.dumps(DONE)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


class PlanServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 drops connects of a concurrent client (a 1 s SYN retry)

    def __init__(self, plan: Plan) -> None:
        super().__init__(("127.0.0.1", 0), FaultHandler)
        self.plan = plan

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out closes its end: the late write fails, as intended


@contextmanager
def handler_server(
    handler: type[FaultHandler], plan: Plan, tls: ssl.SSLContext | None = None
) -> Iterator[str]:
    """A PlanServer with ``handler`` on 127.0.0.1 (over TLS with ``tls``), its base URL."""
    server = PlanServer(plan)
    server.RequestHandlerClass = handler
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def fault_server(plan: Plan) -> Iterator[str]:
    with handler_server(FaultHandler, plan) as url:
        yield url


# --------------------------------------------------------------------------- parity with the local system


def _run(system: Any, ds: Dataset, progress: bool = False) -> tuple[list[Record], list[Record]]:
    """evaluate() with the records handed on as they complete (what the job writes to disk)."""
    handed: list[Record] = []
    system.prepare(ds)
    try:
        return evaluate(system, ds, KS, on_record=handed.append, progress=progress), handed
    finally:
        system.close()


QUALITY_SKIP = ("latency_ms", "ttft_ms")


def _quality(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not any(s in k for s in QUALITY_SKIP)}


@pytest.mark.parametrize("dataset", ["tiny", pytest.param("sample", marks=pytest.mark.slow)])
def test_metrics_through_the_reference_service_equal_the_local_system(
    dataset: str, tiny_dataset: Path
) -> None:
    from rag_ablate.cli.serve import ReferenceService, create_app

    ds = load_dataset(tiny_dataset if dataset == "tiny" else None)
    settings = _local_settings() if dataset == "tiny" else RunConfig(progress=False)
    # both answer with the extractive generator, so the answer metrics must agree too
    settings = replace(settings, generator=replace(settings.generator, name="extractive"))
    local_records, _ = _run(LocalSystem(settings), ds)

    served = LocalSystem(settings)
    served.prepare(ds)
    service = ReferenceService(served, ds, settings, "baseline")
    with uvicorn_app(create_app(service, piece_delay_s=0.0)) as url:
        # the service reports its stages under their own names: mapped, so the diagnoses agree too
        stages = {k: k for k in ("rewritten_query", "filters", "candidates", "context", "versions")}
        response = replace(settings.system.response, **stages)
        http_settings = replace(
            settings, system=replace(settings.system, name="http", base_url=url, response=response)
        )
        http_records, handed = _run(SYSTEMS.get("http")(http_settings, None), ds)

    assert [r["status"] for r in http_records] == ["ok"] * len(ds.queries)
    assert sorted(r["query_id"] for r in handed) == sorted(q.query_id for q in ds.queries)
    local_m, http_m = _quality(aggregate(local_records)), _quality(aggregate(http_records))
    assert http_m == pytest.approx(local_m, rel=1e-9, abs=1e-12)
    assert any(k.endswith("intent_top1") for k in http_m) and any(k.endswith("recall_at_5") for k in http_m)
    for loc, rem in zip(local_records, http_records, strict=True):
        assert rem["query_id"] == loc["query_id"]
        assert [(r["doc_id"], r["chunk_id"], r["start"], r["end"]) for r in rem["retrieved"]] == [
            (r["doc_id"], r["chunk_id"], r["start"], r["end"]) for r in loc["retrieved"]
        ]
        assert rem["intent_pred"] == loc["intent_pred"]
        assert rem["failure_stage"] == loc["failure_stage"]
        for key in ("rewritten_query", "filters", "versions"):
            assert rem.get(key) == loc.get(key), key
        for key in ("candidates", "context"):  # the same chunks (no text: the ids locate them)
            assert [c["chunk_id"] for c in rem.get(key) or []] == [c["chunk_id"] for c in loc.get(key) or []]
        # the streamed answer, its citations, usage and timings are kept per query
        assert isinstance(rem["answer"], str) and rem["answer"] == loc["answer"]
        assert (
            rem["usage"]["total_tokens"] == rem["usage"]["prompt_tokens"] + rem["usage"]["completion_tokens"]
        )
        assert rem["timings_ms"]["total"] >= rem["timings_ms"]["eval"] > 0
        if rem["answer"] and rem["citations"]:
            assert 0 < rem["ttft_ms"] <= rem["timings_ms"]["chat"] <= rem["timings_ms"]["total"]
    agg = aggregate(http_records)
    assert agg["all/ttft_ms_p50"] <= agg["all/ttft_ms_p95"] and agg["all/error_rate"] == 0.0


# --------------------------------------------------------------------------- faults


SCENARIOS = {
    "q1": "ok",
    "q2": "slow",
    "q3": "burst",
    "q4": "throttled",
    "q5": "malformed",
    "q6": "mismatch",
    "q7": "cut",
    "q8": "forbidden",
    "q9": "down",
    "q10": "ended",
    "q11": "empty",
}


@pytest.fixture
def fault_dataset(tmp_path: Path) -> Dataset:
    extra = [
        {**QUERIES[0], "query_id": f"q{i}", "query": f"{QUERIES[0]['query']} ({i})"} for i in (9, 10, 11)
    ]
    return load_dataset(write_dataset(tmp_path / "faults", queries=[*QUERIES, *extra]))


def test_each_fault_ends_with_its_honest_status_and_one_record(
    fault_dataset: Dataset, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = Plan(SCENARIOS)
    with fault_server(plan) as url:
        settings = _http_settings(url, timeout_s=1.0, retries=2, backoff_s=0.05, concurrency=4)
        records, handed = _run(HttpSystem(settings), fault_dataset, progress=True)
    # the progress bar showed live ok / failed counts and the request rate
    bar = capsys.readouterr().err
    assert re.search(r"ok=\d+, failed=\d+, req/s=\d+\.\d", bar), bar[-500:]

    # exactly one final record per query, each handed on once
    ids = [q.query_id for q in fault_dataset.queries]
    assert [r["query_id"] for r in records] == ids
    assert sorted(r["query_id"] for r in handed) == sorted(ids)
    by = {r["query_id"]: r for r in records}
    status = {qid: by[qid]["status"] for qid in ids}
    assert status == {
        "q1": "ok",
        "q2": "timeout",
        "q3": "ok",
        "q4": "ok",
        "q5": "bad_response",
        "q6": "bad_response",
        "q7": "stream_cut",
        "q8": "access_denied",
        "q9": "http_error",
        "q10": "stream_cut",
        "q11": "ok",
    }

    ok = by["q1"]
    assert ok["intents"] == ["", "K_returns"] and ok["intent_pred"] == "K_returns"
    assert [(r["chunk_id"], r["start"], r["end"]) for r in ok["retrieved"]] == [
        ("RET#0", 0, 54),
        ("RET#1", 55, 100),
    ]
    assert ok["answer"] == "Thirty days." and ok["retries"] == 0 and ok["http_status"] == 200
    assert ok["citations"][0] == {"doc_id": "RET", "chunk_id": "RET#0", "start": 0, "end": 54}
    assert ok["citations"][1]["chunk_id"] == "RET#1"
    assert ok["usage"]["total_tokens"] == 43
    assert ok["timings_ms"]["service.retrieve"] == 1.5
    assert 0 < ok["ttft_ms"] <= ok["timings_ms"]["total"]
    assert ok["metrics"]["recall_at_1"] == 1.0  # scored like any ok record

    # a read timeout is not retried; the query is timed until it failed
    assert by["q2"]["retries"] == 0 and plan.count("/rag/eval", "q2") == 1
    assert 1000 <= by["q2"]["timings_ms"]["total"] < SLOW_S * 1000
    # a 5xx burst is retried, then ok
    assert by["q3"]["retries"] == 2 and plan.count("/rag/eval", "q3") == 3 and by["q3"]["metrics"]
    # 429 with Retry-After: 1 is honoured (measured at the server)
    first, second = plan.seen[("/rag/eval", "q4")]
    assert 1.0 <= second - first < 2.5
    assert by["q4"]["retries"] == 1 and by["q4"]["timings_ms"]["total"] >= 1000
    # malformed JSON and a mapping that does not match: which path, and what the body looked like
    assert "not JSON" in by["q5"]["error"] and "{not json" in by["q5"]["error"]
    assert "'retrieved' (system.response.retrieved)" in by["q6"]["error"] and '"hits"' in by["q6"]["error"]
    # a stream cut mid-answer: the partial answer is kept, the query is not scored
    assert (
        by["q7"]["answer"] == "Thirty "
        and by["q7"]["retrieved"]
        and all(v is None for k, v in by["q7"]["metrics"].items() if k != "latency_ms")
    )
    assert "end event" in by["q10"]["error"] and by["q10"]["answer"] == "Thirty "
    # 403: access denied at once, never retried
    assert by["q8"]["http_status"] == 403 and by["q8"]["retries"] == 0
    assert plan.count("/rag/eval", "q8") == 1
    # 500 for good: every retry spent, then http_error with the code
    assert by["q9"]["http_status"] == 500 and by["q9"]["retries"] == 2 and plan.count("/rag/eval", "q9") == 3
    # an empty retrieval list is a real miss, not an error
    assert by["q11"]["metrics"]["recall_at_5"] == 0.0

    # failed queries are excluded from quality means and counted per status
    m = aggregate(records)
    n = len(ids)
    assert m["all/error_rate"] == pytest.approx(7 / n)
    assert m["all/error_rate_bad_response"] == pytest.approx(2 / n)
    assert m["all/error_rate_stream_cut"] == pytest.approx(2 / n)
    assert m["all/n_status_timeout"] == 1 and m["all/n_status_access_denied"] == 1
    assert m["all/n_status_http_error"] == 1 and "all/error_rate_failed" not in m


def test_concurrency_is_bounded_and_used(tmp_path: Path) -> None:
    """16 queries that take 0.3 s each at concurrency 4: 4 at a time at the server, ~1.2 s in all."""
    queries = [{**QUERIES[0], "query_id": f"b{i}", "query": f"question {i}"} for i in range(16)]
    ds = load_dataset(write_dataset(tmp_path / "busy", queries=queries))
    plan = Plan({q["query_id"]: "busy" for q in queries})
    with fault_server(plan) as url:
        t0 = time.perf_counter()
        records, _ = _run(HttpSystem(_http_settings(url, concurrency=4, chat_path=None)), ds)
        wall = time.perf_counter() - t0
    assert [r["status"] for r in records] == ["ok"] * 16
    assert plan.max_in_flight == 4
    assert 16 * 0.3 / 4 <= wall < 16 * 0.3 / 2  # one at a time would take 4.8 s


def test_a_service_that_is_not_there_stops_the_run_after_a_few_refused_tries(tiny_dataset: Path) -> None:
    sock = _listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there now: connections are refused
    ds = load_dataset(tiny_dataset)
    settings = _http_settings(url, retries=2, backoff_s=0.01, chat_path=None, concurrency=1)
    system = HttpSystem(settings)
    with pytest.raises(EndpointDownError, match=f"system endpoint {url} is unreachable: 3 connection"):
        _run(system, ds)
    # the breaker opened after BREAKER_LIMIT refused tries, not after retrying every query
    assert system.requests_sent == BREAKER_LIMIT < 3 * len(ds.queries)


def test_a_failing_batch_leaves_no_query_without_a_record(tiny_dataset: Path) -> None:
    """If run_many itself breaks, the queries it never reported get a failed record."""
    ds = load_dataset(tiny_dataset)

    class Breaks(HttpSystem):
        def run_many(self, queries: Any, on_done: Any) -> None:
            on_done(queries[0], Trace(queries[0].query_id, timings_ms={"total": 1.0}))
            on_done(queries[0], Trace(queries[0].query_id, status="timeout"))  # a repeat is ignored
            raise RuntimeError("event loop died")

    system = Breaks(_http_settings("http://127.0.0.1:9"))
    records, handed = _run(system, ds)
    assert [r["query_id"] for r in records] == [q.query_id for q in ds.queries]
    assert len(handed) == len(ds.queries) and records[0]["status"] == "ok"
    assert all(r["status"] == "failed" and "event loop died" in r["error"] for r in records[1:])


# --------------------------------------------------------------------------- the command line


@pytest.mark.slow
def test_run_above_max_error_rate_is_logged_failed_and_keeps_the_key_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_dataset(tmp_path / "data")
    key = "sk-test-4f1c9a7e2b"
    body_token = "tok-test-9b3e0d5a"
    plan = Plan({"q2": "forbidden", "q3": "malformed"})
    with fault_server(plan) as url:
        monkeypatch.setenv("RAG_API_KEY", key)
        monkeypatch.setenv("RAG_BODY_TOKEN", body_token)
        proc = run_module(
            "rag_ablate",
            [
                "system=http",
                f"system.base_url={url}",
                "+system.headers.Authorization='Bearer ${oc.env:RAG_API_KEY}'",
                "+system.body.query='{query}'",
                "+system.body.query_id='{query_id}'",
                "+system.body.params.chunk_size='${chunk.size}'",
                "+system.body.params.token='${oc.env:RAG_BODY_TOKEN}'",  # stored as its interpolation
                "system.max_error_rate=0.2",
                "system.backoff_s=0.01",
                f"dataset.path={data}",
                "progress=false",
                f"hydra.run.dir={tmp_path / 'run'}",
            ],
            cwd=tmp_path,
            timeout=600,
        )
    assert proc.returncode == 1, proc.stderr
    assert "system.max_error_rate=0.2" in proc.stderr and "2 of 8 queries failed" in proc.stderr
    assert "access_denied 1" in proc.stderr and "bad_response 1" in proc.stderr
    # the end table: failures per status, end-to-end and first-token percentiles
    assert "2 (access_denied 1, bad_response 1)" in proc.stdout
    assert "ms p50 / p95" in proc.stdout and "ttft ms p50 / p95" in proc.stdout
    # the key was sent, and the body template reached the service with a config value
    assert all(h.get("Authorization") == f"Bearer {key}" for h in plan.headers)
    assert plan.count("/rag/chat", "q1") == 1

    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert sorted(r["query_id"] for r in records) == sorted(q["query_id"] for q in QUERIES)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["metrics"]["all/error_rate_access_denied"] == pytest.approx(1 / 8)

    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "rag_ablate"]
    (mrun,) = client.search_runs([exp.experiment_id])
    assert mrun.info.status == "FAILED"
    assert summary["metrics"]["all/error_rate"] == pytest.approx(2 / 8)
    logged = mrun.data.metrics
    assert any(k.endswith("/error_rate_access_denied") and v > 0 for k, v in logged.items()), logged
    assert any(k.endswith("/ttft_ms_p95") for k in logged)
    assert mrun.data.params["system.headers.Authorization"] == "***"
    assert mrun.data.params["system.body.params.chunk_size"] == "512"
    # the key is stored nowhere: not in the run folder, the artifacts or the MLflow database
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert leaks == []
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and body_token.encode() in p.read_bytes()]
    assert leaks == []
    assert mrun.data.params["system.body.params.token"] == "${oc.env:RAG_BODY_TOKEN}"


def test_the_body_template_reaches_the_service(tmp_path: Path) -> None:
    """What the service receives for one query: placeholders and config values in place."""
    received: list[dict[str, Any]] = []

    class Capture(FaultHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(raw))
            self._json(200, {"intentLeafIds": [], "retrieved": []})

    ds = load_dataset(write_dataset(tmp_path / "d", queries=[QUERIES[0]]))
    server = PlanServer(Plan({}))
    server.RequestHandlerClass = Capture
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        template = {"q": "{query}", "k": "{top_k}", "params": {"chunk": 40, "tag": "run-{query_id}"}}
        records, _ = _run(HttpSystem(_http_settings(url, chat_path=None, body=template)), ds)
    finally:
        server.shutdown()
        server.server_close()
    # the untimed warm-up request first (its own query id), then the query
    body = {"q": QUERIES[0]["query"], "k": 10, "params": {"chunk": 40, "tag": "run-q1"}}
    warm_up = {**body, "params": {"chunk": 40, "tag": f"run-{WARMUP_ID}"}}
    assert received == [warm_up, body]
    assert records[0]["status"] == "ok" and records[0]["answer"] is None


@pytest.mark.slow
@pytest.mark.parametrize("quoted", [False, True], ids=["unquoted", "quoted"])
def test_url_levels_each_call_their_own_service(tiny_dataset: Path, tmp_path: Path, quoted: bool) -> None:
    """`-m system.base_url=A,B` with the baseline at A: the baseline calls A, one variant calls B
    (never A again under another label), and two services that answer alike make it a no-op.
    (Without the interleaved timing pass, which calls each service again: tests/test_timing.py.)"""
    plans = Plan({}), Plan({})
    with fault_server(plans[0]) as a, fault_server(plans[1]) as b:
        levels = f'"{a}","{b}"' if quoted else f"{a},{b}"
        args = ["-m", "system=http", f"system.base_url={a}", f"system.base_url={levels}"]
        args += [f"dataset.path={tiny_dataset}", "tracking=none", "progress=false", "compare.B=200"]
        proc = run_module("rag_ablate", [*args, "timing.interleave=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 job(s)" in proc.stdout and f"system.base_url={b}" in proc.stdout and "\\:" not in proc.stdout
    n_queries = len(load_dataset(tiny_dataset).queries)
    for plan in plans:  # each service saw every query once: one job each
        asked = [qid for (path, qid) in plan.seen if path == "/rag/eval" and qid != WARMUP_ID]
        assert len(asked) == n_queries and all(plan.count("/rag/eval", q) == 1 for q in asked)
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
    data = json.loads((sweep_dir / "comparison.json").read_text())
    assert data["variants"] == [f"system.base_url={b}"] and data["no_op"] == [f"system.base_url={b}"]
    assert f"NO-OP: system.base_url={b} returned the same retrieved chunks" in proc.stdout


# --------------------------------------------------------------------------- what the eval request carries


class Redirecting(FaultHandler):
    """``/old/eval`` answers query q1 with a 307 to ``/rag/eval``, the others itself; the answer to
    query q3 sets a cookie."""

    def do_POST(self) -> None:
        qid = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["query_id"]
        if self.path == "/old/eval" and qid == "q1":
            self.send_response(307)
            self.send_header("Location", "/rag/eval")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.plan.hit(self.path, qid, dict(self.headers))
        self._json(200, OK_EVAL, {"Set-Cookie": "sticky=a1; Path=/"} if qid == "q3" else None)


def test_the_eval_request_keeps_basic_auth_follows_redirects_and_returns_cookies(tiny_dataset: Path) -> None:
    """The eval call sends its JSON without going through httpx's per-request client steps, and
    still does what the client does: the URL's user and password as basic auth, a 307 followed with
    its body (auth kept: same origin), a cookie the service set sent back on later requests."""
    ds = load_dataset(tiny_dataset)
    plan = Plan({})
    with handler_server(Redirecting, plan) as url:
        authed = url.replace("http://", "http://alice:s%40me@")
        settings = _http_settings(authed, eval_path="/old/eval", chat_path=None, concurrency=1)
        records, _ = _run(HttpSystem(settings), ds)
    assert [r["status"] for r in records] == ["ok"] * len(ds.queries)
    assert all(r["retrieved"][0]["doc_id"] == "RET" for r in records)
    sent = {qid: headers for (_path, qid), headers in zip(plan.seen, plan.headers, strict=True)}
    assert ("/rag/eval", "q1") in plan.seen and ("/old/eval", "q2") in plan.seen
    basic = "Basic " + base64.b64encode(b"alice:s@me").decode()
    assert all(h.get("Authorization") == basic for h in sent.values())
    assert all(h.get("Content-Type") == "application/json" for h in sent.values())
    order = [q.query_id for q in ds.queries]
    after = order[order.index("q3") + 1 :]
    assert after and all(sent[q].get("Cookie") == "sticky=a1" for q in after)
    assert all("Cookie" not in sent[q] for q in order[: order.index("q3") + 1])


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files), made with cryptography (an mlflow dependency)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    here = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(here, False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


def test_https_uses_the_trusted_certificates_and_refuses_others(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service over TLS: trusted through SSL_CERT_FILE, every query is ok; a certificate nobody
    trusts is a connection error on every try, which stops the run."""
    ds = load_dataset(tiny_dataset)
    cert, key = _self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with handler_server(FaultHandler, Plan({}), tls) as url:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        records, _ = _run(HttpSystem(_http_settings(url, chat_path=None, concurrency=2)), ds)
        assert [r["status"] for r in records] == ["ok"] * len(ds.queries)
        monkeypatch.delenv("SSL_CERT_FILE")  # certifi's authorities only
        settings = _http_settings(url, chat_path=None, concurrency=1, retries=0)
        with pytest.raises(EndpointDownError, match="CERTIFICATE_VERIFY_FAILED"):
            _run(HttpSystem(settings), ds)


def test_a_request_body_with_a_non_finite_number_is_refused_not_sent_as_null() -> None:
    """orjson writes NaN as null; the service must never receive a null the user did not write."""
    import math

    from rag_ablate.systems.http import _json_body

    body = {"q": "税率", "filter": None, "k": 5}
    assert json.loads(_json_body(body)) == body
    with pytest.raises(ValueError, match="not JSON compliant"):
        _json_body({"q": "x", "threshold": math.nan})


def test_a_response_with_an_integer_beyond_64_bits_keeps_it_exact() -> None:
    """orjson reads 2**64 as a float; a service's numeric document id must not change."""
    from rag_ablate.systems.http import _json_loads

    assert _json_loads(b'{"doc_id": 18446744073709551616, "n": 3}') == {"doc_id": 2**64, "n": 3}
    assert _json_loads(b'{"doc_id": -9223372036854775809}') == {"doc_id": -(2**63) - 1}
