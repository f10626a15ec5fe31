"""Retrieval quality and sweep wall time on the embedded sample (issue 5).

Runs, into a fresh output folder (so the first sweep is cold):

1. ``python -m rag_ablate -m retrieval=bm25,dense,hybrid`` cold (empty cache), then
   the same command warm (every chunking, index and embedding from the cache);
2. ``python -m rag_ablate retrieval=hybrid rerank=biencoder`` (hybrid + rerank),

and prints a markdown table of dev/holdout recall@5 and nDCG@10 per variant, the
wall times, and where the time of each job went (cache build seconds).

    python benchmarks/bench_retrieval.py [--out /tmp/rag_ablate_bench]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run(args: list[str], out: Path) -> tuple[float, list[dict[str, Any]]]:
    cmd = [sys.executable, "-m", "rag_ablate", *args, f"paths.output_root={out}", "progress=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    newest = max((out / ("multirun" if "-m" in args else "runs")).iterdir(), key=lambda p: p.stat().st_mtime)
    paths = sorted(newest.glob("*/summary.json")) if "-m" in args else [newest / "summary.json"]
    return wall, [json.loads(p.read_text()) for p in paths]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="/tmp/rag_ablate_bench", help="output root (emptied first)")
    out = Path(ap.parse_args().out)
    shutil.rmtree(out, ignore_errors=True)
    sweep = ["-m", "retrieval=bm25,dense,hybrid", "compare.enabled=false"]
    cold, summaries = run(sweep, out)
    warm, warm_summaries = run(sweep, out)
    rr_wall, rr = run(["retrieval=hybrid", "rerank=biencoder"], out)
    rr[0]["label"] = "retrieval=hybrid,rerank=biencoder"

    print(f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"- command: `python benchmarks/bench_retrieval.py` (output root {out})\n")
    print("| variant | dev recall@5 | holdout recall@5 | dev nDCG@10 | holdout nDCG@10 | p50 ms | p95 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in [*warm_summaries, *rr]:
        m = s["metrics"]
        label = s["label"] if s["label"] != "baseline" else "baseline (retrieval=bm25)"
        print(
            f"| {label} | {m['dev/recall_at_5']:.3f} | {m['holdout/recall_at_5']:.3f} | {m['dev/ndcg_at_10']:.3f} "
            f"| {m['holdout/ndcg_at_10']:.3f} | {m['all/latency_ms_p50']:.2f} | {m['all/latency_ms_p95']:.2f} |"
        )
    print()
    print(
        "| sweep `-m retrieval=bm25,dense,hybrid` | wall time (s) | cache builds (s) | run wall (s), summed |"
    )
    print("|---|---:|---:|---:|")
    for name, wall, ss in (("cold (empty cache)", cold, summaries), ("warm", warm, warm_summaries)):
        builds = sum(
            v
            for s in ss
            for k, v in s["metrics"].items()
            if k.endswith("_build_seconds") and k.startswith("run/cache_")
        )
        runs = sum(s["metrics"]["run/wall_seconds"] for s in ss)
        print(f"| {name} | {wall:.1f} | {builds:.1f} | {runs:.1f} |")
    print(f"\nhybrid + biencoder rerank (embeddings from the cache): {rr_wall:.1f} s wall")


if __name__ == "__main__":
    main()
