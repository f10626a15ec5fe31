"""A local system's chunk token counts looked up as a run's score stage looks them up (issue 28).

The score stage asks the local system's :class:`~rag_ablate.pipeline.chunking.ChunkTokenCounts`
for each distinct retrieved chunk's count once (``TokenCounts._first``: ``seeded.get(key)``).
This script loads a dataset (default ``/tmp/h5/zh``; ``sample`` the embedded one), chunks it as
the default config does (``chunk_spans(docs, 512, 64, unit, True)``, the unit ``auto``
resolved), reads the distinct ``(doc_id, start, end)`` of every ``retrieved`` entry of a run's
``records.jsonl``, and times, in one process, a fresh ``ChunkTokenCounts`` of this checkout and
one of ``--code DIR`` (default ``/work/main``: the code before a change; its
``rag_ablate/pipeline/chunking.py`` loaded under another module name) answering ``get`` for each
key once, in the records' order: what a run pays, whatever the first lookups make included. A
second pass over the same keys is timed too. The two sides alternate; best CPU time
(``time.process_time``) of ``--rounds``. Every count is checked equal on both sides.

``--size S --overlap O --per-document K`` instead asks for K chunks of each document (evenly
spaced, every chunk when it has K or fewer) of the chunking ``S``/``O``: sparse lookups in long
documents, where anything made a document (a table of its chunks) serves few lookups.

    python benchmarks/bench_chunk_counts.py --records /tmp/bench_scoring_*/zh/run/records.jsonl
    python benchmarks/bench_chunk_counts.py --size 32 --overlap 4 --per-document 1
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from rag_ablate.dataset.load import load_dataset
from rag_ablate.pipeline import chunking
from rag_ablate.pipeline.chunking import chunk_spans, detect_unit


def load_old(code: Path) -> ModuleType:
    """``code``'s chunking module, under the name ``chunking_before``."""
    path = code / "rag_ablate" / "pipeline" / "chunking.py"
    spec = importlib.util.spec_from_file_location("chunking_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chunking_before"] = module
    spec.loader.exec_module(module)
    return module


def record_keys(path: Path) -> list[tuple[str, int, int]]:
    """The distinct chunk keys of the records' retrieved entries, in order of first appearance."""
    seen: dict[tuple[str, int, int], None] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            for e in json.loads(line)["retrieved"]:
                seen[(e["doc_id"], e["start"], e["end"])] = None
    return list(seen)


def sparse_keys(counts: Any, per_document: int) -> list[tuple[str, int, int]]:
    """``per_document`` evenly spaced chunk keys of each document, in corpus order."""
    by_doc: dict[str, list[tuple[str, int, int]]] = {}
    for key in counts:
        by_doc.setdefault(key[0], []).append(key)
    keys = []
    for doc_keys in by_doc.values():
        step = max(1, len(doc_keys) // per_document)
        keys += doc_keys[step // 2 :: step][:per_document]
    return keys


def timed(make: Callable[[], Any], keys: list[tuple[str, int, int]]) -> tuple[float, float, list[Any]]:
    """CPU seconds of a fresh mapping's first lookup of every key, then of a second pass."""
    gc.collect()
    t0 = time.process_time()
    counts = make()
    get = counts.get
    first = [get(k) for k in keys]
    t1 = time.process_time()
    again = [get(k) for k in keys]
    t2 = time.process_time()
    assert again == first
    return t1 - t0, t2 - t1, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--dataset", default="/tmp/h5/zh", help="a dataset folder, or sample (the embedded one)")
    ap.add_argument("--records", type=Path, help="a run's records.jsonl on --dataset (512/64 chunks)")
    ap.add_argument("--size", type=int, default=512, help="chunk size (with --per-document)")
    ap.add_argument("--overlap", type=int, default=64, help="chunk overlap (with --per-document)")
    ap.add_argument("--per-document", type=int, help="ask for this many chunks of each document")
    ap.add_argument("--code", type=Path, default=Path("/work/main"), help="the code before")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    if (args.records is None) == (args.per_document is None):
        ap.error("give --records or --per-document")

    old = load_old(args.code)
    dataset = load_dataset(None if args.dataset == "sample" else args.dataset)
    docs = list(dataset.documents.values())
    unit = detect_unit(d.text for d in docs)
    if args.per_document is None:
        spans = chunk_spans(docs, 512, 64, unit, True)
        keys = record_keys(args.records)
    else:
        spans = chunk_spans(docs, args.size, args.overlap, unit, True)
        keys = sparse_keys(chunking.ChunkTokenCounts(chunking.Chunks(docs, spans)), args.per_document)
    sides: dict[str, Callable[[], Any]] = {
        "before": lambda: old.ChunkTokenCounts(old.Chunks(docs, spans)),
        "now": lambda: chunking.ChunkTokenCounts(chunking.Chunks(docs, spans)),
    }
    best: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name in sides}
    answers: dict[str, list[Any]] = {}
    for _ in range(args.rounds):
        for name, make in sides.items():
            first, second, got = timed(make, keys)
            best[name] = [min(best[name][0], first), min(best[name][1], second)]
            answers[name] = got
    assert answers["before"] == answers["now"], "the two sides disagree"
    assert None not in answers["now"], "a retrieved chunk is not a chunk of this chunking"

    n = len(keys)
    print(
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"load {os.getloadavg()[0]:.2f}; {len(docs):,} documents, {len(spans):,} chunks ({unit}), "
        f"{n:,} distinct keys of {len({k[0] for k in keys}):,} documents; "
        f"best CPU of {args.rounds} rounds"
    )
    print("| side | first lookups, ms (us each) | second pass, ms (us each) |")
    print("|---|---:|---:|")
    for name, (first, second) in best.items():
        print(
            f"| {name} | {first * 1e3:.2f} ({first / n * 1e6:.2f}) | {second * 1e3:.2f} ({second / n * 1e6:.2f}) |"
        )
    print(f"first lookups: {best['before'][0] / best['now'][0]:.1f}x")


if __name__ == "__main__":
    main()
