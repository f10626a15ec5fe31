"""``rag-ablate serve``: the reference service, started as a real process on 127.0.0.1.

Every service test talks HTTP to ``rag-ablate serve`` in a subprocess (the dense, chunk=256 and pacing
ones to the same application served in this process); what it returns is checked against the local
system run in this process on the same configuration (same chunks, offsets and scores), against
counts worked out from the retrieved texts, and against a run of ``system=http`` pointed at it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from rag_ablate.cli.serve import (
    ANSWER_CHUNKS,
    PIECE_CHARS,
    RequestError,
    compose_settings,
    extractive_answer,
    parse_request,
    pieces,
)
from rag_ablate.metrics.answers import sentences
from rag_ablate.pipeline.chunking import Chunk
from rag_ablate.records.trace import Trace
from rag_ablate.text.count import count_tokens
from tests.conftest import DOCS, QUERIES, REPO, free_port, rag_ablate_cli, run_module, write_dataset

TOPICS = ["billing", "login", "search", "upload", "export", "payment", "profile", "report"]
# a long document, so chunk=256 and chunk=512 cut it differently
GUIDE = {
    "doc_id": "GUIDE",
    "title": "Setup guide",
    "text": " ".join(
        f"Step {i} of the setup guide: the {TOPICS[i % 8]} module handles {TOPICS[(3 * i) % 8]} "
        f"requests for team {i}."
        for i in range(150)
    ),
}
ARBITRARY = "refund to my original payment method"  # in no dataset
PACE = 1500.0  # the base service's --chars-per-s: a piece of 6 characters every 4 ms


# --------------------------------------------------------------------------- a service process


@dataclass
class Service:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_lines(self, marker: str) -> list[str]:
        return [line for line in self.log.read_text(encoding="utf-8").splitlines() if marker in line]


@contextlib.contextmanager
def service(overrides: list[str], cwd: Path, name: str, ready_s: float = 240.0) -> Iterator[Service]:
    """``rag-ablate serve --port <free> overrides...`` in ``cwd``, until /health answers; stopped after."""
    port = free_port()
    log = cwd / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "rag_ablate.cli.main", "serve", "--port", str(port), *overrides]
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=err, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"rag-ablate serve exited with {proc.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"rag-ablate serve not ready after {ready_s}s:\n{log.read_text()}")
            time.sleep(0.3)
        yield Service(url, proc, log)
        proc.terminate()  # SIGTERM: a graceful stop, exit status 0
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert log.read_text(encoding="utf-8").rstrip().endswith("rag-ablate serve: stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    write_dataset(root / "data", docs=[*DOCS, GUIDE])
    return root


@pytest.fixture(scope="module")
def base(workdir: Path) -> Iterator[Service]:
    with service(["--chars-per-s", str(PACE), f"dataset.path={workdir / 'data'}"], workdir, "base") as svc:
        yield svc


@contextlib.contextmanager
def app_service(overrides: list[str], cwd: Path) -> Iterator[Service]:
    """The application ``rag-ablate serve overrides...`` serves, built as it builds it
    (``ReferenceService.start``) and served in this process: no interpreter start-up and imports,
    and a model already loaded here is reused. ``base`` is the command as a process."""
    from rag_ablate.cli.serve import ReferenceService, create_app
    from tests.test_http_system import uvicorn_app

    started = ReferenceService.start(overrides, cwd=cwd)
    try:
        with uvicorn_app(create_app(started)) as url:
            yield Service(url, None, Path())
    finally:
        started.system.close()


def local_traces(overrides: list[str], queries: list[tuple[str, str]]) -> tuple[list[Trace], list[Chunk]]:
    """What the local system in this process returns for (query_id, text) pairs under ``overrides``."""
    from rag_ablate.dataset.model import Query
    from rag_ablate.run.runner import get_dataset
    from rag_ablate.systems.local import LocalSystem

    settings = compose_settings(overrides)
    dataset = get_dataset(settings)
    by_id = {q.query_id: q for q in dataset.queries}
    system = LocalSystem(settings)
    system.prepare(dataset)
    traces = []
    for qid, text in queries:
        q = by_id.get(qid) or Query(qid, text, {}, (), True, True, (), None, None, "dev", qid)
        assert q.query == text
        traces.append(system.run(q))
    system.close()
    return traces, system.chunks


def post(svc: Service, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{svc.url}{path}", content=content, timeout=60)


def chat(svc: Service, body: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    """The events of one /rag/chat stream, each with the seconds since the request was sent."""
    events = []
    with httpx.Client(timeout=60) as client:
        t0 = time.perf_counter()
        with connect_sse(client, "POST", f"{svc.url}/rag/chat", json=body) as source:
            assert source.response.status_code == 200
            assert source.response.headers["content-type"].startswith("text/event-stream")
            for sse in source.iter_sse():
                events.append((time.perf_counter() - t0, json.loads(sse.data)))
    return events


# --------------------------------------------------------------------------- /rag/eval


@pytest.mark.slow
def test_eval_returns_the_local_systems_chunks_offsets_and_scores(base: Service, workdir: Path) -> None:
    asked = [(q["query_id"], q["query"]) for q in QUERIES] + [("mine-1", ARBITRARY)]
    traces, chunks = local_traces([f"dataset.path={workdir / 'data'}"], asked)
    texts = {c.chunk_id: c.text for c in chunks}
    assert sum(bool(t.retrieved) for t in traces) >= 7  # "do you ship to Mars" may find nothing
    for (qid, text), trace in zip(asked, traces, strict=True):
        r = post(base, "/rag/eval", {"query": text, "query_id": qid, "top_k": 10})
        assert r.status_code == 200, r.text
        body = r.json()
        stages = {"rewritten_query", "filters", "candidates", "versions"}  # no generator: no context
        assert set(body) == {"intentLeafIds", "retrieved", "timings_ms", *stages}
        assert body["rewritten_query"] == text and body["filters"] == {}
        assert [x["chunk_id"] for x in body["candidates"]] == [c.chunk_id for c in trace.candidates or []]
        got = [(x["doc_id"], x["chunk_id"], x["start"], x["end"], x["score"]) for x in body["retrieved"]]
        want = [(c.doc_id, c.chunk_id, c.start, c.end, c.score) for c in trace.retrieved]
        assert got == want, qid  # scores too: JSON floats round-trip exactly
        assert [x["text"] for x in body["retrieved"]] == [texts[c.chunk_id] for c in trace.retrieved]
        assert body["intentLeafIds"] == trace.intents and len(trace.intents) == 1
        assert {"route", "bm25", "total", "service"} <= set(body["timings_ms"])


@pytest.mark.slow
def test_eval_cuts_the_list_at_top_k_and_takes_optional_fields(base: Service) -> None:
    q = QUERIES[1]
    full = post(base, "/rag/eval", {"query": q["query"], "query_id": q["query_id"], "top_k": 10}).json()
    body = {
        "query": q["query"],
        "query_id": q["query_id"],
        "top_k": 2,
        "user_groups": ["staff"],
        "params": {"chunk_size": 512},
    }
    cut = post(base, "/rag/eval", body).json()
    assert len(full["retrieved"]) > 2
    assert cut["retrieved"] == full["retrieved"][:2]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/rag/eval", "/rag/chat"])
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 400, "body"),
        (b"\xff\xfe", 400, "body"),
        ([1, 2], 400, "body"),
        ({"query_id": "a", "top_k": 3}, 422, "query"),
        ({"query": "  ", "query_id": "a", "top_k": 3}, 422, "query"),
        ({"query": "refunds", "top_k": 3}, 422, "query_id"),
        ({"query": "refunds", "query_id": 7, "top_k": 3}, 422, "query_id"),
        ({"query": "refunds", "query_id": "a"}, 422, "top_k"),
        ({"query": "refunds", "query_id": "a", "top_k": "3"}, 422, "top_k"),
        ({"query": "refunds", "query_id": "a", "top_k": 0}, 422, "top_k"),
        ({"query": "refunds", "query_id": "a", "top_k": True}, 422, "top_k"),
        ({"query": "refunds", "query_id": "a", "top_k": 3, "user_groups": "staff"}, 422, "user_groups"),
        ({"query": "refunds", "query_id": "a", "top_k": 3, "user_groups": [1]}, 422, "user_groups"),
        ({"query": "refunds", "query_id": "a", "top_k": 3, "params": [1]}, 422, "params"),
    ],
)
def test_a_bad_request_gets_a_json_error_naming_the_field(
    base: Service, path: str, body: Any, status: int, field: str
) -> None:
    r = post(base, path, body)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.json()["field"] == field
    assert field in r.json()["error"]


@pytest.mark.slow
def test_unknown_routes_and_methods_get_json_errors(base: Service) -> None:
    assert httpx.get(f"{base.url}/rag/eval").status_code == 405
    r = httpx.get(f"{base.url}/nowhere")
    assert r.status_code == 404 and r.json()["error"] == "Not Found"


@pytest.mark.slow
def test_one_log_line_per_request(base: Service) -> None:
    marker = "query_id=log-probe-"
    for i in range(3):
        post(base, "/rag/eval", {"query": "express shipping", "query_id": f"log-probe-{i}", "top_k": 3})
    chat(base, {"query": "express shipping", "query_id": "log-probe-chat", "top_k": 3})
    post(base, "/rag/eval", {"query": "express shipping", "query_id": "log-probe-bad", "top_k": -1})
    lines = base.log_lines(marker)
    assert len(lines) == 4, lines
    assert sum("POST /rag/eval 200 " in line for line in lines) == 3
    assert sum("POST /rag/chat 200 " in line for line in lines) == 1
    assert len(base.log_lines("POST /rag/eval 422 ")) >= 1  # the bad one: before its id was read


# --------------------------------------------------------------------------- /rag/chat


@pytest.mark.slow
def test_chat_streams_deltas_then_done_with_citations_and_usage(base: Service) -> None:
    q = QUERIES[0]  # how many days do I have to return an item
    body = {"query": q["query"], "query_id": q["query_id"], "top_k": 10}
    retrieved = post(base, "/rag/eval", body).json()["retrieved"]
    events = chat(base, body)

    *deltas, (t_done, done) = events
    assert done["done"] is True
    assert len(deltas) >= 5 and all(set(e) == {"delta"} for _, e in deltas)
    answer = "".join(e["delta"] for _, e in deltas)
    # the stream is paced (--chars-per-s: 4 ms between pieces) and its first piece arrives well
    # before its end, so time to first token is real (a quarter of the pacing: slack for a busy machine)
    t_first = deltas[0][0]
    delay = PIECE_CHARS / PACE
    assert t_done >= delay * (len(deltas) - 1)
    assert t_done - t_first >= 0.25 * delay * (len(deltas) - 1)

    # the answer quotes the RET sentence that holds the asked terms (return, item, day) first
    assert answer.startswith("You can return most items within 30 days of delivery. [1]")
    top = {r["chunk_id"]: r for r in retrieved[:ANSWER_CHUNKS]}
    cites = done["citations"]
    assert [c["n"] for c in cites] == list(range(1, len(cites) + 1))
    for c in cites:
        assert f"[{c['n']}]" in answer
        r = top[c["chunk_id"]]  # only chunks the answer read are cited
        assert (c["doc_id"], c["start"], c["end"]) == (r["doc_id"], r["start"], r["end"])
    assert cites[0]["doc_id"] == "RET"

    usage = done["usage"]
    prompt = count_tokens(q["query"]) + sum(count_tokens(r["text"]) for r in retrieved[:ANSWER_CHUNKS])
    assert usage == {
        "prompt_tokens": prompt,
        "completion_tokens": count_tokens(answer),
        "total_tokens": prompt + count_tokens(answer),
        "count": "local",
    }


@pytest.mark.slow
def test_chat_declines_without_overlap_and_cites_nothing(base: Service) -> None:
    events = chat(base, {"query": "zebra xylophone", "query_id": "none", "top_k": 5})
    answer = "".join(e["delta"] for _, e in events[:-1])
    assert answer == "The documents do not answer this question."
    assert events[-1][1]["citations"] == []


# --------------------------------------------------------------------------- configuration


@pytest.mark.slow
def test_overrides_reach_the_pipeline(base: Service, workdir: Path) -> None:
    data = f"dataset.path={workdir / 'data'}"
    ask = {"query": "which module handles billing requests for team 97", "query_id": "g1", "top_k": 5}
    with app_service([data, "chunk=256"], workdir) as small:  # base: the overrides of the command line
        got_small = post(small, "/rag/eval", ask).json()["retrieved"]
        health_small = httpx.get(f"{small.url}/health").json()
    got_base = post(base, "/rag/eval", ask).json()["retrieved"]
    health_base = httpx.get(f"{base.url}/health").json()
    (want_small,), chunks_small = local_traces([data, "chunk=256"], [("g1", ask["query"])])
    (want_base,), chunks_base = local_traces([data], [("g1", ask["query"])])

    assert health_small["chunks"] == len(chunks_small) > health_base["chunks"] == len(chunks_base)
    assert [(r["chunk_id"], r["start"], r["end"], r["score"]) for r in got_small] == [
        (c.chunk_id, c.start, c.end, c.score) for c in want_small.retrieved[:5]
    ]
    assert [(r["chunk_id"], r["start"], r["end"], r["score"]) for r in got_base] == [
        (c.chunk_id, c.start, c.end, c.score) for c in want_base.retrieved[:5]
    ]
    guide = lambda rows: {(r["chunk_id"], r["start"], r["end"]) for r in rows if r["doc_id"] == "GUIDE"}  # noqa: E731
    assert guide(got_small) and guide(got_base) and guide(got_small) != guide(got_base)


def test_a_bad_override_fails_at_start_with_one_line(workdir: Path) -> None:
    from rag_ablate.cli.serve import log

    handlers, level, propagate = log.handlers[:], log.level, log.propagate  # serve sets up its log
    try:
        for overrides, expected in (
            (["chunk=0"], "chunk=0"),
            (["chunk=256,512"], "one value per setting"),
            (["retrieval=bm52"], "bm52"),
        ):
            done = rag_ablate_cli(["serve", "--port", str(free_port()), *overrides], workdir)
            assert done.returncode == 2, done.stderr
            assert expected in done.stderr and "Traceback" not in done.stderr
    finally:
        log.handlers[:], log.propagate = handlers, propagate
        log.setLevel(level)


@pytest.mark.slow
def test_serving_imports_no_web_framework_until_serve_runs() -> None:
    code = (
        "import sys, rag_ablate.cli.main, rag_ablate.cli.serve, rag_ablate.run.runner, "
        "rag_ablate.systems.local;"
        "print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------- arbitrary texts, dense


@pytest.mark.slow
def test_dense_encodes_texts_outside_the_dataset_on_demand(workdir: Path) -> None:
    """A dataset query sent under another id is encoded by the service on its own; it finds the
    chunks the run finds with the batch-encoded vector (scores equal to float precision). The
    service's application runs in this process (``rag-ablate serve`` as a process: ``base``), so
    the encoder is loaded once."""
    data = f"dataset.path={workdir / 'data'}"
    asked = [(q["query_id"], q["query"]) for q in QUERIES[:4]]
    traces, _ = local_traces([data, "retrieval=dense"], asked)
    with app_service([data, "retrieval=dense"], workdir) as svc:
        for (qid, text), trace in zip(asked, traces, strict=True):
            known = post(svc, "/rag/eval", {"query": text, "query_id": qid, "top_k": 10}).json()
            other = post(svc, "/rag/eval", {"query": text, "query_id": f"new-{qid}", "top_k": 10}).json()
            assert [r["chunk_id"] for r in known["retrieved"]] == [c.chunk_id for c in trace.retrieved]
            assert [r["score"] for r in known["retrieved"]] == [c.score for c in trace.retrieved]
            assert "encode_on_demand" not in known["timings_ms"]
            assert [r["chunk_id"] for r in other["retrieved"]] == [c.chunk_id for c in trace.retrieved]
            assert [r["score"] for r in other["retrieved"]] == pytest.approx(
                [c.score for c in trace.retrieved], abs=1e-5
            )
            assert other["timings_ms"]["encode_on_demand"] > 0
        free = post(svc, "/rag/eval", {"query": ARBITRARY, "query_id": "x", "top_k": 3}).json()
        assert free["retrieved"][0]["doc_id"] == "RET"  # "original payment method" is in RET's text


# --------------------------------------------------------------------------- system=http end to end


RETRIEVAL_AND_INTENT = (
    "recall",
    "ndcg",
    "mrr",
    "hit",
    "precision",
    "evidence_recall",
    "full_recall",
    "intent_top1",
    "context_tokens",
    "n_queries",
    "n_answerable",
    "n_unanswerable",
    "n_no_rag",
    "n_failed",
    "error_rate",
)


def _metrics(out: Path) -> dict[str, float]:
    (path,) = out.glob("runs/*/metrics.json")
    metrics: dict[str, float] = json.loads(path.read_text(encoding="utf-8"))
    return {
        k: v for k, v in metrics.items() if k.split("/", 1)[-1].rsplit("_at_", 1)[0] in RETRIEVAL_AND_INTENT
    }


@pytest.mark.slow
def test_system_http_against_the_service_equals_the_local_system(base: Service, workdir: Path) -> None:
    if not (REPO / "rag_ablate" / "systems" / "http.py").is_file():
        pytest.skip("system=http is not in this checkout")
    common = [f"dataset.path={workdir / 'data'}", "tracking=none", "progress=false"]
    local = run_module("rag_ablate", [*common, f"paths.output_root={workdir / 'out_local'}"], workdir)
    assert local.returncode == 0, local.stderr
    remote = run_module(
        "rag_ablate",
        [*common, "system=http", f"system.base_url={base.url}", f"paths.output_root={workdir / 'out_http'}"],
        workdir,
    )
    assert remote.returncode == 0, remote.stderr
    want, got = _metrics(workdir / "out_local"), _metrics(workdir / "out_http")
    assert "all/recall_at_5" in want and "all/intent_top1" in want and "all/context_tokens_at_5" in want
    assert got == want


# --------------------------------------------------------------------------- pieces, in process


def test_parse_request_reads_the_wire_format() -> None:
    req = parse_request(b'{"query": "q", "query_id": "1", "top_k": 4, "user_groups": ["a"], "params": {}}')
    assert (req.query, req.query_id, req.top_k, req.user_groups, req.params) == ("q", "1", 4, ("a",), {})
    with pytest.raises(RequestError) as err:
        parse_request(b'{"query": "q", "query_id": "1", "top_k": 2.5}')
    assert (err.value.status, err.value.field) == (422, "top_k")


def test_sentences_keep_decimals_and_split_chinese_stops() -> None:
    assert sentences("Version 3.5 is out. It works!  Really?") == [
        "Version 3.5 is out.",
        "It works!",
        "Really?",
    ]
    assert sentences("退款需要五个工作日。运费由我们承担！") == ["退款需要五个工作日。", "运费由我们承担！"]
    assert pieces("abcdefg", 3) == ["abc", "def", "g"]


def test_extractive_answer_in_chinese_counts_characters() -> None:
    chunks = [
        Chunk("A#0", "A", 0, 19, "快递通常三天送达。偏远地区需要两周。", "配送"),
        Chunk("B#0", "B", 0, 18, "退款会在五个工作日内退回原支付方式。", "退款"),
    ]
    ans = extractive_answer("退款需要几个工作日？", chunks)
    # the query's characters without stopwords (个) are 退 款 需 要 几 工 作 日; B's sentence has
    # 退 款 工 作 日 (5 of 8), A's second 需 要 (2 of 8), A's first none: B then A, no space before [n]
    assert ans.text == "退款会在五个工作日内退回原支付方式。[1]偏远地区需要两周。[2]"
    assert [c.chunk_id for c in ans.citations] == ["B#0", "A#0"]


def test_a_sentence_shared_by_overlapping_chunks_is_quoted_once() -> None:
    text = "Refunds take five days. Refunds of gift cards take ten days. Shipping is free."
    first = Chunk("D#1", "D", 24, len(text), text[24:])  # the higher-ranked chunk
    second = Chunk("D#0", "D", 0, 61, text[:61])  # overlaps it by one sentence
    ans = extractive_answer("how many days do refunds of gift cards take", [first, second])
    assert ans.text == "Refunds of gift cards take ten days. [1] Refunds take five days. [2]"
    assert [c.chunk_id for c in ans.citations] == ["D#1", "D#0"]


# --------------------------------------------------------------------------- hostile requests

DEEP = b"[" * 100_000 + b"]" * 100_000
LONG_NUMBER = b'{"query": "refunds", "query_id": "n", "top_k": ' + b"7" * 100_000 + b"}"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (DEEP, "deeper than 16"),
        (
            b'{"query": "q", "query_id": "a", "top_k": 1, "params": ' + b'{"a": ' * 17 + b"1" + b"}" * 18,
            "deeper",
        ),
        (LONG_NUMBER, "100000 characters"),
        (b'{"query": "q", "query_id": "a", "top_k": 1.' + b"5" * 70 + b"}", "72 characters"),
        (b'{"query": "q", "query_id": "a", "top_k": NaN}', "NaN is not a JSON value"),
    ],
    ids=["deep-array", "deep-params", "long-int", "long-float", "nan"],
)
def test_parse_request_refuses_deep_nesting_and_long_numbers_with_400(raw: bytes, words: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(raw)
    assert caught.value.status == 400 and caught.value.field == "body" and words in caught.value.message


def _raw(
    svc: Service, head: str, parts: list[bytes], *, close_early: bool = False
) -> tuple[int, dict[str, Any]]:
    """Send a request over a plain socket (headers ``head``, then ``parts``); its status and JSON body.
    ``close_early``: leave after sending, without reading (status 0)."""
    import socket

    host, port = svc.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /rag/eval HTTP/1.1\r\nHost: {host}\r\n{head}\r\n".encode())
        with contextlib.suppress(OSError):  # the server may answer, and stop reading, before the end
            for part in parts:
                sock.sendall(part)
        if close_early:
            return 0, {}
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1] or b"{}")


def _length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].decode().lower()
    return next(
        (int(line.split(":")[1]) for line in head.splitlines() if line.startswith("content-length:")), 0
    )


@pytest.mark.slow
def test_oversized_deep_and_long_number_bodies_get_json_errors_at_once(base: Service) -> None:
    t0 = time.perf_counter()
    # a 60 MB body announced by its Content-Length: refused before any of it is read
    status, body = _raw(base, "Content-Type: application/json\r\nContent-Length: 60000000\r\n", [b"{"])
    assert status == 413 and body["field"] == "body" and "limit is 1000000" in body["error"]
    # no Content-Length (chunked): refused once 1 MB has arrived
    chunk = b"x" * 65536
    parts = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"] * 32 + [b"0\r\n\r\n"]
    status, body = _raw(base, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", parts)
    assert status == 413 and "limit is 1000000" in body["error"]
    for raw, words in ((DEEP, "deeper than"), (LONG_NUMBER, "characters; the limit")):
        r = post(base, "/rag/eval", raw)
        assert r.status_code == 400 and words in r.json()["error"], r.text
    assert time.perf_counter() - t0 < 10
    assert not base.log_lines("Traceback") and not base.log_lines(" 500 ")


@pytest.mark.slow
def test_a_client_that_leaves_mid_body_costs_no_work_and_no_traceback(base: Service) -> None:
    head = "Content-Type: application/json\r\nContent-Length: 500000\r\n"
    _raw(
        base,
        head,
        [b'{"query": "refunds", "query_id": "gone-1", "top_k": 3, "pad": "' + b"x" * 1000],
        close_early=True,
    )
    deadline = time.monotonic() + 10
    while not base.log_lines("POST /rag/eval 499") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert base.log_lines("POST /rag/eval 499"), base.log.read_text()[-2000:]
    assert not base.log_lines("Traceback")
    assert httpx.get(f"{base.url}/health", timeout=5).status_code == 200


def test_the_stream_is_unpaced_by_default_and_keeps_its_pace_when_set(tiny_dataset: Path) -> None:
    """Issue 24: a stream paced at 6 characters per 4 ms made a 1,000-query run take 105 s; the
    default is now as fast as the answer is written, and a set pace is kept (a schedule)."""
    from rag_ablate.cli.serve import CHARS_PER_S, ReferenceService, create_app
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.systems.local import LocalSystem
    from tests.test_http_system import uvicorn_app

    assert CHARS_PER_S == 0.0  # rag-ablate serve's default: unpaced
    ds = load_dataset(tiny_dataset)
    settings = RunConfig(progress=False)
    system = LocalSystem(settings)
    system.prepare(ds)
    service = ReferenceService(system, ds, settings, "baseline")
    body = {"query": QUERIES[0]["query"], "query_id": QUERIES[0]["query_id"], "top_k": 5}
    took = {}
    for delay in (0.0, 0.02):
        with uvicorn_app(create_app(service, piece_delay_s=delay)) as url:
            chat(Service(url, None, Path()), body)  # the connection and the first query warm up
            events = chat(Service(url, None, Path()), body)
        took[delay] = events[-1][0]
    system.close()
    n = len(events) - 1  # content pieces (the last event ends the stream)
    assert n >= 5
    assert took[0.02] >= 0.02 * (n - 1)
    assert took[0.0] < 0.5 * 0.02 * (n - 1)
