"""The model-call cache at 10,000 entries (issue 28): writes, warm reads, concurrent writers.

Each entry is what ``ChatClient`` stores for one call (``llm_calls``: a 600-character answer,
usage, latencies), keyed by parts like :meth:`ChatClient.cache_parts` (endpoint, model, the
messages' sha256, sampling, repeat). Timed, each in a fresh cache folder:

* **writes**: ``--entries`` misses, each built and stored (``Cache.json``);
* **warm reads**: the same entries read back through a new ``Cache`` on the same folder (a rerun);
* **4 threads**: four threads of one ``Cache`` storing ``--entries`` entries between them (a judge's pool);
* **2 processes**: two processes storing ``--entries`` entries between them, half of them the
  same keys (two jobs of a sweep), then every entry checked.

    python benchmarks/bench_cache.py [--entries 10000] [--ref GIT_REV]

``--ref`` also times ``rag_ablate/core/cache.py`` as of a git revision (e.g. ``main`` before the
SQLite store), loaded from ``git show`` into this process, after the current code.
Targets: 10,000 writes in at most 5 s, 10,000 warm reads in at most 0.5 s.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import platform
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_stats import module_at  # noqa: E402  (benchmarks/ is on sys.path when a script here runs)

from rag_ablate.core import cache as current  # noqa: E402

ANSWER = "Returns are accepted within 30 days of delivery when the item is unused [1]. " * 8


def parts(i: int) -> dict[str, Any]:
    return {
        "endpoint": "http://127.0.0.1:8093/v1/chat/completions",
        "model": "qwen2.5-0.5b-instruct",
        "messages_sha256": hashlib.sha256(f"prompt {i}".encode()).hexdigest(),
        "sampling": {"temperature": 0.0, "max_tokens": 256},
        "repeat": 0,
    }


def value(i: int) -> dict[str, Any]:
    return {
        "text": f"({i}) {ANSWER}",
        "usage": {"prompt_tokens": 812, "completion_tokens": 143, "total_tokens": 955},
        "usage_count": None,
        "ttft_ms": 41.5,
        "total_ms": 912.25,
        "retries": 0,
    }


def load_ref(rev: str) -> ModuleType:
    """``rag_ablate/core/cache.py`` as of git revision ``rev``, as a stand-alone module."""
    return module_at(rev, "rag_ablate/core/cache.py")


def write(mod: ModuleType, root: Path, indices: range) -> None:
    cache = mod.Cache(root)
    for i in indices:
        cache.json("llm_calls", parts(i), lambda i=i: value(i))


def read(mod: ModuleType, root: Path, n: int) -> int:
    cache = mod.Cache(root)
    for i in range(n):
        got = cache.json("llm_calls", parts(i), lambda: None)
        assert got == value(i), i
    return int(cache.stats["llm_calls"].hits)


def _process(rev: str | None, root: str, start: int, n: int, barrier: Any) -> None:
    mod = current if rev is None else load_ref(rev)
    barrier.wait(timeout=120)
    write(mod, Path(root), range(start, start + n))


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()`` (this process: on a busy machine the CPU is the fairer figure)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def bench(mod: ModuleType, rev: str | None, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "writes"
        out["writes"], out["writes_cpu"] = timed(lambda: write(mod, root, range(n)))
        hits: list[int] = []
        out["reads"], out["reads_cpu"] = timed(lambda: hits.append(read(mod, root, n)))
        assert hits == [n], hits

        root = Path(tmp) / "threads"
        cache = mod.Cache(root)
        quarter = n // 4

        def worker(k: int) -> None:
            for i in range(k * quarter, (k + 1) * quarter):
                cache.json("llm_calls", parts(i), lambda i=i: value(i))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["threads"] = time.perf_counter() - t0
        assert read(mod, root, 4 * quarter) == 4 * quarter

        root = Path(tmp) / "processes"
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(3)
        half = n // 2
        # the two processes' ranges overlap by half: the same keys written by both, at about the same time
        procs = [
            ctx.Process(target=_process, args=(rev, str(root), start, half, barrier))
            for start in (0, half // 2)
        ]
        for p in procs:
            p.start()
        barrier.wait(timeout=120)
        t0 = time.perf_counter()
        for p in procs:
            p.join()
            assert p.exitcode == 0
        out["processes"] = time.perf_counter() - t0
        assert read(mod, root, half + half // 2) == half + half // 2
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--ref", default=None, help="also time core/cache.py as of this git revision")
    args = ap.parse_args()
    n = args.entries
    rows = [("current", bench(current, None, n))]
    if args.ref:
        rows.append((args.ref, bench(load_ref(args.ref), args.ref, n)))
    load = os.getloadavg()
    print(
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) at the end"
    )
    print(f"- command: `python {shlex.join(['benchmarks/bench_cache.py', *sys.argv[1:]])}`\n")
    print(
        f"| code | {n:,} writes, wall / CPU (s) | {n:,} warm reads, wall / CPU (s) "
        f"| 4 threads, {n:,} writes (s) | 2 processes, {n // 2:,} writes each, half shared (s) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(
            f"| {name} | {r['writes']:.2f} / {r['writes_cpu']:.2f} | {r['reads']:.2f} / {r['reads_cpu']:.2f} "
            f"| {r['threads']:.2f} | {r['processes']:.2f} |"
        )
    w, r = rows[0][1]["writes"] * 10_000 / n, rows[0][1]["reads"] * 10_000 / n
    print(
        f"\nper 10,000 (wall): writes {w:.2f} s (target 5 s: {'met' if w <= 5 else 'MISSED'}), "
        f"warm reads {r:.2f} s (target 0.5 s: {'met' if r <= 0.5 else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
