"""system=http throughput: 1,000 queries against a local service that answers in 50 ms (issues 11, 28).

Starts a small Starlette service on uvicorn in a separate process (so it does not
share the client's interpreter) that answers ``POST /rag/eval`` after a fixed delay
with a wire-format response, then times the evaluation phase of rag_ablate's runner
(``runner.evaluate``: every request, the mapping and the scoring) with
``system=http``, ``system.concurrency=64``, ``system.chat_path=null``. The same run
against a 0 ms service shows the client's own overhead: its CPU per query (``CPU ms /
query``, the client process's user + system time over the phase). The targets (issue 28):
about 0.5 ms of client CPU per query, and at most 1.5x the ideal ``n x delay / concurrency``
(1,000 x 50 ms / 64 = 0.78 s).

    python benchmarks/bench_http.py [--queries 1000] [--delay-ms 50] [--concurrency 64] [--repeat 3]

The dataset is synthetic (written to a temporary folder): 200 short documents and
``--queries`` queries, each relevant to one document; the service returns the
relevant document first and four others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
N_DOCS = 200


def write_dataset(folder: Path, n_queries: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i in range(N_DOCS):
            text = f"Document {i} explains topic {i}. It has a second sentence about item {i * 7 % 101}."
            f.write(json.dumps({"doc_id": f"D{i}", "title": f"Topic {i}", "text": text}) + "\n")
    with (folder / "queries.jsonl").open("w", encoding="utf-8") as f:
        for j in range(n_queries):
            f.write(
                json.dumps(
                    {
                        "query_id": f"q{j}",
                        "query": f"what about topic {j % N_DOCS} ({j})",
                        "relevant": {f"D{j % N_DOCS}": 1},
                    }
                )
                + "\n"
            )


# --------------------------------------------------------------------------- the service (child process)


def serve(port: int, delay_ms: float) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    texts = {
        f"D{i}": f"Document {i} explains topic {i}. It has a second sentence about item {i * 7 % 101}."
        for i in range(N_DOCS)
    }

    async def rag_eval(request: Request) -> JSONResponse:
        body = await request.json()
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        qid = str(body["query_id"])
        j = int(qid[1:]) if qid[1:].isdigit() else 0  # the untimed warm-up requests have their own id
        ids = [f"D{(j + k) % N_DOCS}" for k in range(5)]
        retrieved = [
            {
                "doc_id": d,
                "chunk_id": f"{d}#0",
                "start": 0,
                "end": len(texts[d]),
                "score": 5.0 - k,
                "text": texts[d],
            }
            for k, d in enumerate(ids)
        ]
        return JSONResponse(
            {"intentLeafIds": [], "retrieved": retrieved, "timings_ms": {"service": delay_ms}}
        )

    app = Starlette(routes=[Route("/rag/eval", rag_eval, methods=["POST"])])
    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off", ws="none"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(delay_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--delay-ms", str(delay_ms)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("the benchmark service did not start")


# --------------------------------------------------------------------------- the client (this process)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_run(
    base_url: str, data: Path, concurrency: int, server_pid: int, code: Path = REPO
) -> dict[str, Any]:
    sys.path.insert(0, str(code))
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.records.scoring import aggregate
    from rag_ablate.run.runner import evaluate
    from rag_ablate.systems.http import HttpSystem

    s = RunConfig(progress=False)
    s.system = replace(s.system, name="http", base_url=base_url, chat_path=None, concurrency=concurrency)
    ds = load_dataset(data)
    system = HttpSystem(s)
    system.prepare(ds)
    t0, c0, s0 = time.perf_counter(), time.process_time(), cpu_seconds(server_pid)
    records = evaluate(system, ds, [1, 3, 5, 10])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    server_cpu = cpu_seconds(server_pid) - s0
    m = aggregate(records)
    return {
        "wall": wall,
        "cpu": cpu,
        "server_cpu": server_cpu,
        "n": len(records),
        "ok": sum(r["status"] == "ok" for r in records),
        "recall_at_1": m["all/recall_at_1"],
        "p50": m["all/latency_ms_p50"],
        "p95": m["all/latency_ms_p95"],
        "requests": system.requests_sent,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument(
        "--repeat", type=int, default=3, help="runs per service; the fastest and the median shown"
    )
    ap.add_argument(
        "--code",
        type=Path,
        default=REPO,
        help="the checkout whose rag_ablate is timed (another worktree: the code before a change)",
    )
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.delay_ms)
        return

    ideal = args.queries * args.delay_ms / 1000 / args.concurrency
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "bench"
        write_dataset(data, args.queries)
        results: dict[float, list[dict[str, Any]]] = {}
        for delay in (0.0, args.delay_ms):
            proc, url = start_service(delay)
            try:
                timed_run(url, data, args.concurrency, proc.pid, args.code)  # warm-up: imports, connections
                results[delay] = [
                    timed_run(url, data, args.concurrency, proc.pid, args.code) for _ in range(args.repeat)
                ]
            finally:
                proc.terminate()
                proc.wait(10)

    load = os.getloadavg()[0]
    print(
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {load:.1f} at the end"
    )
    print(
        f"- command: `python benchmarks/bench_http.py --queries {args.queries} --delay-ms {args.delay_ms:g} "
        f"--concurrency {args.concurrency} --repeat {args.repeat}"
        + ("" if args.code == REPO else f" --code {args.code}")
        + "`"
    )
    print(
        f"- ideal: {args.queries} x {args.delay_ms:g} ms / {args.concurrency} = {ideal:.2f} s; "
        f"target at most 1.5x = {1.5 * ideal:.2f} s\n"
    )
    print(
        "| service delay | evaluation phase, fastest (s) | median (s) | ratio to ideal (fastest / median) "
        "| CPU client / service (s) | client CPU ms / query | queries ok | requests | p50 ms | p95 ms | recall@1 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for delay, runs in results.items():
        walls = sorted(r["wall"] for r in runs)
        best = min(runs, key=lambda r: r["wall"])
        median = walls[len(walls) // 2]
        ratio = f"{walls[0] / ideal:.2f}x / {median / ideal:.2f}x" if delay else "-"
        print(
            f"| {delay:g} ms | {walls[0]:.2f} | {median:.2f} | {ratio} | {best['cpu']:.2f} / {best['server_cpu']:.2f} "
            f"| {1000 * min(r['cpu'] for r in runs) / best['n']:.2f} | {best['ok']}/{best['n']} "
            f"| {best['requests']} "
            f"| {best['p50']:.1f} | {best['p95']:.1f} | {best['recall_at_1']:.3f} |"
        )
    slow = sorted(r["wall"] for r in results[args.delay_ms])[len(results[args.delay_ms]) // 2]
    verdict = "meets" if slow <= 1.5 * ideal else "MISSES"
    print(f"\nmedian {slow:.2f} s = {slow / ideal:.2f}x the ideal: {verdict} the 1.5x target")


if __name__ == "__main__":
    main()
