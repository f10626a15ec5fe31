"""The tool's overhead against bare bm25s, and the default sweep's wall time (issue 16).

Side by side in one run, on a Chinese dataset of about 1,000 documents and 6,000 queries
(``benchmarks/gen_corpus.py zh``, generated into ``--data`` when missing):

(a) bare bm25s: a fresh ``python`` process that reads the dataset's two files (``json.loads``
    per line, no validation), chunks it with rag_ablate.pipeline.chunking at the default
    settings (512 / 64, unit auto, titles prefixed as the pipeline indexes them), analyses every chunk with the same analyzer the
    pipeline resolves for it (``rag_ablate.text.analyzers.get_analyzer("zh")``), builds a
    ``bm25s.BM25`` index (k1 1.5, b 0.75, lucene, as conf/retrieval/bm25.yaml) and answers every
    query (analysed the same way) with top-k = retrieval.top_k (10);
(b) ``python -m rag_ablate dataset.path=<zh>`` (one variant, the default config), cold (a fresh
    output folder: empty cache, no MLflow database) and warm (the same command again in that
    folder).

Every time is a subprocess's wall time, interpreter start included; each is the median of
``--repeat`` runs (default 3). Goal: (b) cold <= 1.5x (a), warm <= 1.2x (a).

Then the default sweep ``python -m rag_ablate -m chunk=256,512`` (embedded sample) cold in a
fresh folder (goal <= 10 s), with its breakdown (imports, store, index, query, score, log,
compare) from the jobs' profile.json, or from py-spy (``--spy``) when the code writes none.

    python benchmarks/bench_overhead.py [--data /tmp/rag_bench_data] [--out /tmp/rag_bench_overhead]
        [--repeat 3] [--spy]
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import REPO, JobResult, fmt_stages, load_avg, machine_line, run_job

TOP_K = 10  # conf/retrieval/bm25.yaml top_k


def bare(dataset: Path) -> dict[str, Any]:
    """(a), inside its own process: read, chunk, analyse, index, answer. Returns the stage times."""
    t = {"start": time.perf_counter()}
    import bm25s

    from rag_ablate.dataset.model import Document
    from rag_ablate.pipeline.chunking import chunk_corpus
    from rag_ablate.text.analyzers import get_analyzer

    analyzer = get_analyzer("zh")
    t["imports"] = time.perf_counter()
    with (dataset / "corpus.jsonl").open(encoding="utf-8") as f:
        docs = [Document(d["doc_id"], d["text"], d.get("title")) for d in map(json.loads, f)]
    with (dataset / "queries.jsonl").open(encoding="utf-8") as f:
        queries = [json.loads(line)["query"] for line in f]
    chunks, unit = chunk_corpus(docs, 512, 64)
    texts = [c.index_text(True) for c in chunks]
    t["load_chunk"] = time.perf_counter()
    corpus_tokens = [analyzer(x) or [""] for x in texts]
    t["tokenise"] = time.perf_counter()
    index = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    index.index(corpus_tokens, show_progress=False)
    t["index"] = time.perf_counter()
    vocab = index.vocab_dict
    query_tokens = [[w for w in analyzer(q) if w in vocab] for q in queries]
    answered = [qt for qt in query_tokens if qt]
    docs, _scores = index.retrieve(answered, k=TOP_K, show_progress=False, n_threads=0)
    t["query"] = time.perf_counter()
    keys = list(t)
    out: dict[str, Any] = {k: t[k] - t[p] for p, k in itertools.pairwise(keys)}
    out.update(chunks=len(chunks), unit=unit, queries=len(queries), answered=int(docs.shape[0]))
    return out


def run_bare(dataset: Path) -> tuple[float, float, dict[str, Any]]:
    """(a) in a fresh process: its wall time, CPU time (user + sys) and stage times."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bare", str(dataset)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"bare bm25s failed:\n{proc.stderr[-3000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, json.loads(proc.stdout.strip().splitlines()[-1])


def ensure_zh(data: Path) -> Path:
    folder = data / "zh"
    if not (folder / "queries.jsonl").is_file():
        from gen_corpus import generate_zh

        folder.mkdir(parents=True, exist_ok=True)
        generate_zh(folder, 1_000, 6_000, seed=0)
    return folder


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _check(res: JobResult, what: str) -> JobResult:
    if res.returncode != 0:
        sys.exit(f"{what} failed (exit {res.returncode}):\n{res.stderr_tail}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/tmp/rag_bench_data"))
    ap.add_argument(
        "--out", type=Path, default=Path("/tmp/rag_bench_overhead"), help="output roots (emptied)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--spy", action="store_true", help="also a py-spy run of each for the stage breakdown")
    ap.add_argument("--bare", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.bare:
        print(json.dumps(bare(a.bare)))
        return
    zh = ensure_zh(a.data)
    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    loads: list[float] = [load_avg()]
    bare_walls: list[float] = []
    bare_cpus: list[float] = []
    bare_info: dict[str, Any] = {}
    cold: list[JobResult] = []
    warm: list[JobResult] = []
    sweeps: list[JobResult] = []
    one = [f"dataset.path={zh}"]
    for i in range(a.repeat):
        w, c, bare_info = run_bare(zh)
        bare_walls.append(w)
        bare_cpus.append(c)
        root = a.out / f"one_{i}"
        cold.append(_check(run_job(one, root), "cold run"))
        warm.append(_check(run_job(one, root), "warm run"))
        sweeps.append(_check(run_job(["-m", "chunk=256,512"], a.out / f"sweep_{i}"), "default sweep"))
        loads.append(load_avg())
        print(
            f"round {i}: bare {w:.1f} s, cold {cold[-1].wall:.1f} s, warm {warm[-1].wall:.1f} s, "
            f"sweep {sweeps[-1].wall:.1f} s, load {loads[-1]:.1f}",
            file=sys.stderr,
        )
    spied: dict[str, JobResult] = {}
    if a.spy:
        root = a.out / "spy_one"
        spied["cold"] = run_job(one, root, spy=a.out / "cold.speedscope.json")
        spied["warm"] = run_job(one, root, spy=a.out / "warm.speedscope.json")
        spied["sweep"] = run_job(
            ["-m", "chunk=256,512"], a.out / "spy_sweep", spy=a.out / "sweep.speedscope.json"
        )
    a_wall = _median(bare_walls)

    print(f"- machine: {machine_line()}; 1-min load {min(loads):.1f}-{max(loads):.1f} during the runs")
    print(f"- command: `python benchmarks/bench_overhead.py --repeat {a.repeat}` (dataset {zh}: ", end="")
    print(f"{bare_info['chunks']:,} chunks of unit {bare_info['unit']}, {bare_info['queries']:,} queries)")
    print(f"- wall times are medians of {a.repeat} subprocess runs (min-max in brackets)\n")
    print("| what | wall s | wall ratio to (a) | CPU s | CPU ratio to (a) | peak MB | goal (on wall) |")
    print("|---|---:|---:|---:|---:|---:|---|")

    def rng(xs: list[float]) -> str:
        return f"{_median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    a_cpu = _median(bare_cpus)
    print(
        f"| (a) bare bm25s, same analyzer and chunks, top-{TOP_K} | {rng(bare_walls)} | 1.00x | {a_cpu:.2f} | 1.00x | | |"
    )
    work = ", ".join(
        f"{k} {bare_info[k]:.2f}" for k in ("imports", "load_chunk", "tokenise", "index", "query")
    )
    print(f"| &nbsp;&nbsp;(a) stages, last run, s: {work} | | | | | | |")
    rows = [
        ("(b) `python -m rag_ablate dataset.path=...` cold", cold, 1.5),
        ("(b) the same command again, warm", warm, 1.2),
        ("default sweep `python -m rag_ablate -m chunk=256,512`, cold, fresh folder", sweeps, None),
    ]
    for label, rs, goal in rows:
        walls = [r.wall for r in rs]
        cpu = _median([r.cpu for r in rs])
        peak = _median([r.peak_mb for r in rs])
        if goal is None:
            ratio, cpu_ratio = "", ""
            verdict = f"<= 10 s: {'met' if _median(walls) <= 10 else 'NOT met'}"
        else:
            ratio, cpu_ratio = f"{_median(walls) / a_wall:.2f}x", f"{cpu / a_cpu:.2f}x"
            verdict = f"<= {goal}x: {'met' if _median(walls) <= goal * a_wall else 'NOT met'}"
        print(f"| {label} | {rng(walls)} | {ratio} | {cpu:.2f} | {cpu_ratio} | {peak:,.0f} | {verdict} |")
    print()
    breakdowns = {"cold": cold[-1], "warm": warm[-1], "sweep": sweeps[-1]}
    for name, r in spied.items():
        if not breakdowns[name].stages:
            breakdowns[name] = r
    print(
        "Breakdown (s / peak MB per stage; source in brackets; a py-spy run is slower than an unprofiled one):\n"
    )
    for name, r in breakdowns.items():
        src = r.stage_source or "none"
        print(f"- {name} ({src}, wall {r.wall:.1f} s): {fmt_stages(r) or '-'}")
    (a.out / "results.json").write_text(
        json.dumps(
            {
                "bare_walls": bare_walls,
                "bare_cpus": bare_cpus,
                "bare": bare_info,
                "cold": [r.wall for r in cold],
                "warm": [r.wall for r in warm],
                "sweep": [r.wall for r in sweeps],
                "loads": loads,
                "breakdowns": {
                    k: {s: [v.seconds, v.peak_mb] for s, v in r.stages.items()} for k, r in breakdowns.items()
                },
            },
            indent=1,
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
