"""Benchmark: our MinHash-LSH join against datasketch's MinHash and MinHashLSH, side by side.

    python benchmarks/bench_grouping_datasketch.py [--n 100000] [--seed 0] [--repeat 1] [--no-exact]

Needs ``pip install datasketch`` (not a dependency of rag_ablate). Same 100,000
synthetic queries as ``benchmarks/bench_grouping.py``. Every variant shares the
parts that are not MinHash or LSH: :func:`normalize_many`, de-duplication of
equal normalised texts, the exact Jaccard verification of candidate pairs and
union-find; they differ only in how candidate pairs are found:

* ``ours``: ``group_near_duplicates`` as shipped (vectorised MinHash, 32 bands
  x 4 rows, b-bit estimate and prefix prefilters).
* ``datasketch, defaults``: grams as UTF-8 bytes hashed with datasketch's
  default SHA-1 hash, ``MinHash.generator``, ``MinHashLSH(params=(32, 4))``
  filled in an insertion session, candidates from ``lsh.query`` of every
  text (the documented way).
* ``datasketch, tuned``: our integer gram ids with ``hashfunc=int`` (no SHA-1),
  and candidates read bucket by bucket from the LSH hash tables (no second
  pass of queries): the most favourable use of datasketch found.

Both datasketch variants pass their candidates through our prefilters (on
datasketch's signatures) before the exact check, as ``ours`` does.

Then the partition of each is compared with the exact all-pairs partition
(``exact_limit`` above the number of texts; about 30-40 s), unless
``--no-exact``. Prints a markdown table; ratios are to ``ours``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import rag_ablate  # noqa: F401
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_grouping import make_queries

from rag_ablate.dataset.grouping.groups import group_near_duplicates
from rag_ablate.dataset.grouping.join import (
    _connect_buckets,
    _lsh_params,
    _lsh_prefilter,
    _prefixes,
    _Stats,
    shingle,
)
from rag_ablate.dataset.grouping.normalize import normalize_many

THRESHOLD, N, NUM_PERM = 0.7, 4, 128


@dataclass(frozen=True)
class Run:
    wall: float  # seconds, whole grouping
    cpu: float  # process CPU seconds, whole grouping (less sensitive to other processes' load)
    join: float  # wall seconds after normalisation
    detail: str
    partition: set[frozenset[int]]


def partition(labels: list[Any]) -> set[frozenset[int]]:
    by: dict[Any, list[int]] = {}
    for i, g in enumerate(labels):
        by.setdefault(g, []).append(i)
    return {frozenset(v) for v in by.values()}


def compare(p: set[frozenset[int]], exact: set[frozenset[int]]) -> str:
    """'same' or how many exact groups are cut and how many items are in them."""
    if p == exact:
        return "same as exact"
    cut = [g for g in exact if g not in p]
    return f"DIFFERENT: {len(cut)} exact groups ({sum(len(g) for g in cut)} items) not reproduced"


def datasketch_join(texts: list[str], *, tuned: bool, seed: int) -> tuple[list[int], dict[str, float]]:
    """Component label per text with datasketch's MinHash + MinHashLSH for the candidates."""
    from datasketch import MinHash, MinHashLSH

    tm: dict[str, float] = {}
    t0 = time.perf_counter()
    norm = normalize_many(texts)
    tm["normalise"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    first: dict[str, int] = {}
    text_of = [first.setdefault(t, len(first)) for t in norm]
    distinct = list(first)
    m = len(distinct)
    sh = shingle(distinct, N)  # the exact verification needs the gram ids in both variants
    grams: list[Any]
    if tuned:
        grams = [sh.indices[sh.indptr[i] : sh.indptr[i + 1]].tolist() for i in range(m)]
        kwargs: dict[str, Any] = {"num_perm": NUM_PERM, "seed": seed, "hashfunc": int}
    else:
        grams = [
            [t[i : i + N].encode() for i in range(len(t) - N + 1)] if len(t) >= N else [t.encode()]
            for t in distinct
        ]
        kwargs = {"num_perm": NUM_PERM, "seed": seed}
    tm["shingle"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sketches = list(MinHash.generator(grams, **kwargs))
    tm["minhash"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bands, rows = _lsh_params(THRESHOLD, NUM_PERM)
    lsh = MinHashLSH(num_perm=NUM_PERM, params=(bands, rows))
    with lsh.insertion_session() as session:
        for i, mh in enumerate(sketches):
            session.insert(i, mh, check_duplication=False)
    tm["lsh_insert"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    buckets: list[tuple[Any, Any, Any]] = []
    if tuned:
        for table in lsh.hashtables:
            shared = [table.get(key) for key, size in table.itemcounts().items() if size >= 2]
            if shared:
                sizes = np.fromiter(map(len, shared), dtype=np.int64, count=len(shared))
                members = np.fromiter(chain.from_iterable(shared), dtype=np.int64, count=int(sizes.sum()))
                buckets.append((members, np.cumsum(sizes) - sizes, sizes))
    else:
        a_list: list[int] = []
        b_list: list[int] = []
        for i, mh in enumerate(sketches):
            for j in lsh.query(mh):
                if j > i:
                    a_list.append(i)
                    b_list.append(j)
        if a_list:
            members = np.column_stack((a_list, b_list)).astype(np.int64).ravel()
            k = len(a_list)
            buckets.append((members, np.arange(k, dtype=np.int64) * 2, np.full(k, 2, dtype=np.int64)))
    tm["lsh_candidates"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sig = np.stack([mh.hashvalues for mh in sketches], axis=1).astype(np.uint32)
    prefilter: Callable[[Any, Any], Any] = _lsh_prefilter(sig, _prefixes(sh, THRESHOLD), THRESHOLD)
    parent = np.arange(m, dtype=np.int64)
    stats = _Stats()
    _connect_buckets(buckets, sh, parent, THRESHOLD, stats, prefilter)
    tm["verify_union"] = time.perf_counter() - t0
    tm["pairs_verified"] = float(stats.verified)
    labels = parent.tolist()
    return [labels[i] for i in text_of], tm


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="interleaved runs per variant; the fastest (wall) is reported"
    )
    parser.add_argument("--no-exact", action="store_true", help="skip the exact all-pairs partition")
    args = parser.parse_args()

    try:
        import datasketch
    except ImportError:
        sys.exit(
            "this benchmark needs datasketch, which rag_ablate does not depend on: pip install datasketch"
        )

    texts = make_queries(args.n, seed=args.seed)
    group_near_duplicates(texts[:500], exact_limit=0)  # warm-up: compiles the regexes once for all variants
    runs: dict[str, Run] = {}

    def keep(name: str, run: Run) -> None:
        if name not in runs or run.wall < runs[name].wall:
            runs[name] = run

    # interleaved, so that a burst of load from other processes hits every variant alike
    for _ in range(args.repeat):
        cpu0, t0 = time.process_time(), time.perf_counter()
        r = group_near_duplicates(texts, seed=args.seed, exact_limit=0)  # MinHash-LSH at any --n
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        tm = r.timings
        assert r.method == "minhash"
        detail = (
            f"normalise {tm['normalise']:.2f}, shingle {tm['shingle']:.2f}, MinHash {tm['minhash']:.2f}, "
            f"LSH + verify + union {tm['candidates_verify'] + tm['union_find']:.2f}; "
            f"{int(tm['pairs_verified']):,} pairs verified"
        )
        keep("ours", Run(wall, cpu, wall - tm["normalise"], detail, partition(r.group_of)))
        for name, tuned in (("datasketch, defaults", False), ("datasketch, tuned", True)):
            cpu0, t0 = time.process_time(), time.perf_counter()
            labels, tm = datasketch_join(texts, tuned=tuned, seed=args.seed)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
            detail = (
                f"normalise {tm['normalise']:.2f}, shingle {tm['shingle']:.2f}, MinHash {tm['minhash']:.2f}, "
                f"LSH insert {tm['lsh_insert']:.2f}, LSH candidates {tm['lsh_candidates']:.2f}, "
                f"verify + union {tm['verify_union']:.2f}; {int(tm['pairs_verified']):,} pairs verified"
            )
            keep(name, Run(wall, cpu, wall - tm["normalise"], detail, partition(labels)))

    exact_part: set[frozenset[int]] | None = None
    exact_note = "not computed (--no-exact)"
    if not args.no_exact:
        ex = group_near_duplicates(texts, exact_limit=len(texts))
        assert ex.method == "exact"
        exact_part = partition(ex.group_of)
        exact_note = f"{len(exact_part):,} groups, {ex.timings['total']:.1f} s"

    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    print(f"- machine: {platform.platform()}, {os.cpu_count()} CPUs; python {platform.python_version()}, "
          f"numpy {np.__version__}, datasketch {datasketch.__version__}")  # fmt: skip
    print(f"- command: `{command}`; {len(texts):,} queries; load average {os.getloadavg()[0]:.2f}")
    print(f"- exact all-pairs partition: {exact_note}\n")
    print("| variant | wall (s) | ratio | CPU (s) | ratio | join wall, after normalise (s) | ratio "
          "| stages, wall (s) | groups | partition |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    base = runs["ours"]
    for name, run in runs.items():
        verdict = "n/a" if exact_part is None else compare(run.partition, exact_part)
        print(f"| {name} | {run.wall:.2f} | {run.wall / base.wall:.2f}x | {run.cpu:.2f} | {run.cpu / base.cpu:.2f}x "
              f"| {run.join:.2f} | {run.join / base.join:.2f}x | {run.detail} | {len(run.partition):,} "
              f"| {verdict} |")  # fmt: skip


if __name__ == "__main__":
    main()
