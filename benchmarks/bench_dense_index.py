"""Exact vs approximate (usearch HNSW) dense index: build time, query time, recall@10 agreement.

Random unit vectors (no model needed). Queries are either random unit vectors ("random": no
structure, the hardest case for a graph index) or a chunk's vector plus Gaussian noise,
renormalised ("near": a query with a clear nearest neighbourhood, as real embeddings have).
Recall@10 agreement = mean over queries of |approximate top 10 ∩ exact top 10| / 10.

    python benchmarks/bench_dense_index.py --sizes 100000 1000000 --queries 10000

Prints one JSON line per (size, query set). The chosen default of
``retrieval.dense.approximate_above`` and the figures are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from rag_ablate.pipeline.dense import DenseIndex


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    for s in range(0, n, step):  # in blocks: no float64 copy of the whole matrix
        block = rng.standard_normal((min(step, n - s), dim))
        out[s : s + step] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def near_queries(rng: np.random.Generator, matrix: np.ndarray, m: int, noise: float) -> np.ndarray:
    rows = matrix[rng.integers(0, matrix.shape[0], size=m)].astype(np.float64)
    rows += rng.standard_normal(rows.shape) * noise / np.sqrt(matrix.shape[1])
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _num(x: float, digits: int) -> float | None:
    """``x`` rounded, or None (JSON null) when it was not measured."""
    return None if np.isnan(x) else round(x, digits)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="usearch build threads")
    ap.add_argument("--sets", nargs="+", default=["random", "near"])
    ap.add_argument("--exact-only", action="store_true", help="time the exact index alone (no graph)")
    args = ap.parse_args()
    for n in args.sizes:
        rng = np.random.default_rng(0)
        matrix = unit_rows(rng, n, args.dim)
        tiebreak = np.arange(n, dtype=np.int64)
        t0 = time.perf_counter()
        exact = DenseIndex(matrix, tiebreak, kind="exact")
        exact_build = time.perf_counter() - t0
        approx, approx_build = None, float("nan")
        if not args.exact_only:
            t0 = time.perf_counter()
            approx = DenseIndex(matrix, tiebreak, kind="usearch", threads=args.threads)
            approx_build = time.perf_counter() - t0
        for name in args.sets:
            q = (
                unit_rows(rng, args.queries, args.dim)
                if name == "random"
                else near_queries(rng, matrix, args.queries, 0.5)
            )
            t0 = time.perf_counter()
            e_hits = exact.search_many(q, args.k)
            e_s = time.perf_counter() - t0
            a_s, agree = float("nan"), float("nan")
            if approx is not None:
                t0 = time.perf_counter()
                a_hits = approx.search_many(q, args.k)
                a_s = time.perf_counter() - t0
                agree = float(
                    np.mean(
                        [
                            len({i for i, _ in a} & {i for i, _ in e}) / args.k
                            for a, e in zip(a_hits, e_hits, strict=True)
                        ]
                    )
                )
            print(
                json.dumps(
                    {
                        "chunks": n,
                        "queries": args.queries,
                        "query_set": name,
                        "exact_build_s": round(exact_build, 2),
                        "usearch_build_s": _num(approx_build, 2),
                        "usearch_threads": args.threads,
                        "exact_query_s": round(e_s, 2),
                        "usearch_query_s": _num(a_s, 2),
                        "recall_at_10_agreement": _num(agree, 4),
                        "peak_rss_mb": round(peak_mb()),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
