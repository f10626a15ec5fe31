"""A small RAG service for tests and benchmarks (standard library only): ``POST /rag/eval``
in the wire format of ``rag-ablate serve`` (README "Evaluate your own RAG service over HTTP").

It knows the dataset's answers: each query's relevant documents (whole-document spans), then
other documents, ten in all. Switches:

* ``rank_noise``: the share of calls in which the relevant documents are put at a random
  rank of the ten instead of first, drawn afresh per call, so two runs of one query differ
  the way two runs of a nondeterministic service do (an A/A test of quality needs it);
* ``first_delay_s``: the first request the service ever handles sleeps this long (a model or
  an index loaded on first use).

A query id the dataset does not have (the client's warm-up requests) gets an empty list.
``requests`` counts the requests handled, per query id; ``connections`` the connections.

As a process of its own (a deployment apart from the client, as benchmarks want it)::

    python tests/stub_rag_service.py [--dataset FOLDER] [--rank-noise 0.3] [--seed 0]

prints its URL on one line and serves until its standard input closes.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from rag_ablate.dataset.model import Dataset

DEPTH = 10


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, dataset: Dataset, rank_noise: float, first_delay_s: float, seed: int) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.queries = {q.query_id: q for q in dataset.queries}
        self.docs = dataset.documents
        self.doc_ids = sorted(dataset.documents)
        self.rank_noise = rank_noise
        self.first_delay_s = first_delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.connections = 0  # TCP connections accepted
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def answer(self, query_id: str) -> dict[str, Any]:
        query = self.queries.get(query_id)
        if query is None:
            return {"retrieved": [], "intentLeafIds": []}
        relevant = [d for d in query.relevant if d in self.docs]
        others = [d for d in self.doc_ids if d not in query.relevant][: DEPTH - len(relevant)]
        ranked = relevant + others
        with self.lock:
            if relevant and self.rng.random() < self.rank_noise:
                at = self.rng.randrange(len(ranked) - len(relevant) + 1)
                ranked = others[:at] + relevant + others[at:]
        retrieved = [
            {"doc_id": d, "chunk_id": f"{d}#0", "start": 0, "end": len(self.docs[d].text), "score": 1.0 / r}
            for r, d in enumerate(ranked[:DEPTH], start=1)
        ]
        return {"retrieved": retrieved, "intentLeafIds": [query.intent_l2 or ""]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK wait

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1
    server: StubServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        qid = str(body.get("query_id"))
        server = self.server
        with server.lock:
            first = not server.requests
            server.requests[qid] += 1
        if first and server.first_delay_s:
            threading.Event().wait(server.first_delay_s)
        raw = json.dumps(server.answer(qid)).encode()
        self.send_response(200 if self.path == "/rag/eval" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


S = TypeVar("S", bound=ThreadingHTTPServer)


@contextmanager
def in_thread(server: S) -> Iterator[S]:
    """``server`` serving from a thread of its own until the block ends, then closed."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def stub_service(
    dataset: Dataset, *, rank_noise: float = 0.0, first_delay_s: float = 0.0, seed: int = 0
) -> Iterator[StubServer]:
    """The service, listening on 127.0.0.1 (``server.url``) until the block ends."""
    with in_thread(StubServer(dataset, rank_noise, first_delay_s, seed)) as server:
        yield server


def main() -> None:
    from rag_ablate.dataset.load import load_dataset

    ap = argparse.ArgumentParser(description="the stub RAG service; serves until stdin closes")
    ap.add_argument("--dataset", default=None, help="dataset folder (default: the embedded sample)")
    ap.add_argument("--rank-noise", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with stub_service(load_dataset(args.dataset), rank_noise=args.rank_noise, seed=args.seed) as server:
        print(server.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
