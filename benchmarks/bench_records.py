"""What writing records as queries complete costs: flush each, fsync each, or fsync about once a second.

    python benchmarks/bench_records.py [--n 2000] [--dir FOLDER]

Writes ``n`` records of a realistic size (10 retrieved chunks with offsets and
scores, timings, metrics: about 2 kB each) to a file in FOLDER (default: a
temporary folder under ./outputs, i.e. the disk runs write to) four ways and
prints the microseconds per record of each:

* ``at end``: :func:`rag_ablate.records.jsonl.write_records` once (the old behaviour; one fsync);
* ``flush each``: :class:`~rag_ablate.records.jsonl.RecordWriter` with fsync only on close;
* ``writer (default)``: RecordWriter as runs use it (flush each, fsync at most every second);
* ``fsync each``: RecordWriter fsyncing after every record.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_ablate.records.jsonl import FSYNC_SECONDS, RecordWriter, write_records


def record(i: int) -> dict[str, Any]:
    return {
        "query_id": f"q{i:06d}",
        "query": "how many days do I have to return an item that I bought online " * 2,
        "split": "dev",
        "group": f"g{i // 3}",
        "kind": "answerable",
        "intent_gold": "K_returns",
        "intent_gold_l1": "KNOWLEDGE",
        "status": "ok",
        "retrieved": [
            {
                "rank": r,
                "chunk_id": f"doc{r:04d}#{r}",
                "doc_id": f"doc{r:04d}",
                "start": 100 * r,
                "end": 100 * r + 512,
                "score": 12.345678 / (r + 1),
            }
            for r in range(1, 11)
        ],
        "intent_pred": "K_returns",
        "timings_ms": {"route": 0.41, "bm25": 0.93, "rerank": 51.2, "total": 53.1},
        "metrics": {f"recall_at_{k}": 1.0 for k in (1, 3, 5, 10)}
        | {f"ndcg_at_{k}": 0.8 for k in (1, 3, 5, 10)}
        | {"latency_ms": 53.1},
    }


def bench(folder: Path, n: int) -> dict[str, float]:
    recs = [record(i) for i in range(n)]
    out: dict[str, float] = {}
    path = folder / "records.jsonl"

    t = time.perf_counter()
    write_records(path, recs)
    out["at end"] = time.perf_counter() - t

    modes = (("flush each", 1e9), (f"writer (default, fsync <= {FSYNC_SECONDS:g} s)", FSYNC_SECONDS))
    for name, every in (*modes, ("fsync each", 0.0)):
        path.unlink()
        t = time.perf_counter()
        with RecordWriter(path, fsync_every=every) as w:
            for r in recs:
                w.write(r)
        out[name] = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--dir", type=Path, default=Path("outputs"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench_records_", dir=args.dir))
    try:
        times = bench(folder, args.n)
        kb = (folder / "records.jsonl").stat().st_size / args.n / 1024
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{args.n} records of {kb:.1f} kB in {args.dir.resolve()}")
    for name, secs in times.items():
        print(f"  {name:<34} {secs * 1e6 / args.n:8.1f} us/record   {secs:7.3f} s total")


if __name__ == "__main__":
    main()
