"""The tool's overhead against bare bm25s, and the default sweep's wall time (issues 16 and 28).

Side by side in one run, on a dataset in rag_ablate's format: by default a generated Chinese set
of about 1,000 documents and 6,000 queries (``benchmarks/gen_corpus.py zh``, generated into
``--data`` when missing); with ``--dataset PATH`` any real set in the dataset format (a COVID-QA
or ClapNQ import: ``rag-ablate import squad .../200423_covidQA.json DIR``):

(a) bare bm25s: a fresh ``python`` process that reads the dataset's two files (``json.loads``
    per line, no validation), chunks it with rag_ablate.pipeline.chunking at the default
    settings (512 / 64, unit auto, titles prefixed as the pipeline indexes them), analyses every
    chunk with the analyzer the pipeline resolves for it (``zh`` for CJK text, else ``en``:
    ``rag_ablate.text.analyzers.get_analyzer``), builds a ``bm25s.BM25`` index (k1 1.5, b 0.75,
    lucene, as conf/retrieval/bm25.yaml) and answers every query (analysed the same way) with
    top-k = retrieval.top_k (10);
(b) ``python -m rag_ablate dataset.path=<set>`` (one variant, the default config), cold (a fresh
    output folder: empty cache, no MLflow database, and no resident MLflow writer: each round has
    a runtime folder of its own, ``RAG_ABLATE_RUNTIME_DIR``), warm (the same command again in that
    folder, the resident writer the cold run started still there), and in a fresh folder with the
    resident writer there (a new experiment on a day of runs).

Every time is a subprocess's wall time, interpreter start included, and its CPU time (user +
sys of the process tree); each is the median of ``--repeat`` rounds, the rows of a round run one
after another. Goals (issue 28): (b) cold <= 1.5x (a), warm <= 1.0x (a) (1.2x on the generated set).

Then the default sweep ``python -m rag_ablate -m chunk=256,512`` (embedded sample) cold in a
fresh folder (goal <= 6 s on a 2-core machine), with its breakdown (imports, store, index, query,
score, log, compare: wall and CPU seconds) from the jobs' profile.json, or from py-spy (``--spy``)
when the code writes none. The output is a Markdown block ready to paste into RESULTS.md.

    python benchmarks/bench_overhead.py [--dataset DIR | --data /tmp/rag_bench_data]
        [--out /tmp/rag_bench_overhead] [--repeat 3] [--spy]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import REPO, JobResult, load_avg, machine_line, run_job

TOP_K = 10  # conf/retrieval/bm25.yaml top_k
SWEEP_GOAL_S = 6.0  # the default sweep, cold, on a 2-core machine (issue 28)


def bare(dataset: Path) -> dict[str, Any]:
    """(a), inside its own process: read, chunk, analyse, index, answer. Returns the stage times."""
    t = {"start": time.perf_counter()}
    import bm25s

    from rag_ablate.dataset.model import Document
    from rag_ablate.pipeline.chunking import chunk_corpus
    from rag_ablate.text.analyzers import get_analyzer
    from rag_ablate.text.count import is_cjk_text

    t["imports"] = time.perf_counter()
    with (dataset / "corpus.jsonl").open(encoding="utf-8") as f:
        docs = [Document(d["doc_id"], d["text"], d.get("title")) for d in map(json.loads, f)]
    with (dataset / "queries.jsonl").open(encoding="utf-8") as f:
        queries = [json.loads(line)["query"] for line in f]
    chunks, unit = chunk_corpus(docs, 512, 64)
    # the analyzer retrieval.bm25.analyzer=auto resolves to (rag_ablate.systems.local: LocalSystem.prepare)
    language = "zh" if unit == "char" or is_cjk_text(docs[0].text[:2000]) else "en"
    analyzer = get_analyzer(language)
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
    out.update(
        chunks=len(chunks), unit=unit, language=language, queries=len(queries), answered=int(docs.shape[0])
    )
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


def _stop_writers(env: dict[str, str]) -> None:
    """Stop the resident MLflow writers of the runtime folder ``env`` names, and remove it."""
    subprocess.run(
        [sys.executable, "-m", "rag_ablate.cli.main", "writer", "stop"],
        env={**os.environ, **env},
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    shutil.rmtree(env["RAG_ABLATE_RUNTIME_DIR"], ignore_errors=True)


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _check(res: JobResult, what: str) -> JobResult:
    if res.returncode != 0:
        sys.exit(f"{what} failed (exit {res.returncode}):\n{res.stderr_tail}")
    return res


def _stages_line(r: JobResult) -> str:
    """``stage wall/CPU`` for the stages of 0.05 s or more, longest first."""
    parts = [
        f"{k} {v.seconds:.2f}/{v.cpu_s:.2f}"
        for k, v in sorted(r.stages.items(), key=lambda kv: -kv[1].seconds)
        if v.seconds >= 0.05
    ]
    return ", ".join(parts) or "-"


def _time_line(r: JobResult) -> tuple[float, float, float]:
    """(the total its time line printed, the main process's CPU seconds in it, the seconds the
    background MLflow writer spent alongside) from the run's or sweep's profile.json."""
    folder = Path(r.job_dirs[0]) if r.job_dirs else None
    if (
        folder is not None and (folder.parent / "profile.json").is_file() and "-m" in r.command.split()[3:]
    ):  # after "python -m rag_ablate"
        folder = folder.parent  # a sweep's own profile
    if folder is None or not (folder / "profile.json").is_file():
        return float("nan"), float("nan"), 0.0
    data = json.loads((folder / "profile.json").read_text(encoding="utf-8"))
    aside = sum(float(v.get("seconds", 0.0)) for v in (data.get("background") or {}).values())
    stages = data.get("breakdown") or data.get("stages") or {}
    cpu = sum(float(v.get("cpu_s", 0.0)) for v in stages.values())
    return float(data.get("total_s", float("nan"))), cpu, aside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--dataset", type=Path, help="a real set in the dataset format (corpus.jsonl, queries.jsonl)"
    )
    ap.add_argument(
        "--data", type=Path, default=Path("/tmp/rag_bench_data"), help="where the generated set lives"
    )
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
    if a.dataset is not None:
        data = a.dataset.resolve()
        if not (data / "queries.jsonl").is_file() or not (data / "corpus.jsonl").is_file():
            sys.exit(f"--dataset {data}: no corpus.jsonl and queries.jsonl (rag-ablate import writes them)")
        goals = {"cold": 1.5, "warm": 1.0}
    else:
        data = ensure_zh(a.data)
        goals = {"cold": 1.5, "warm": 1.2}
    shutil.rmtree(a.out, ignore_errors=True)
    a.out.mkdir(parents=True)
    loads: list[float] = [load_avg()]
    bare_walls: list[float] = []
    bare_cpus: list[float] = []
    bare_info: dict[str, Any] = {}
    cold: list[JobResult] = []
    warm: list[JobResult] = []
    fresh: list[JobResult] = []  # a fresh folder, the resident writer already running
    sweeps: list[JobResult] = []
    # the same two cold commands with MLflow imported and written in the main process (the
    # background writer off), side by side in each round
    in_process = {"RAG_ABLATE_MLFLOW_WRITER": "0"}
    cold_off: list[JobResult] = []
    cold_none: list[JobResult] = []  # tracking=none: no MLflow at all (what MLflow costs, by difference)
    sweeps_off: list[JobResult] = []
    one = [f"dataset.path={data}"]
    for i in range(a.repeat):
        w, c, bare_info = run_bare(data)
        bare_walls.append(w)
        bare_cpus.append(c)
        root = a.out / f"one_{i}"
        # no resident MLflow writer before a cold command: a runtime folder of its own per cold start
        writers = {"RAG_ABLATE_RUNTIME_DIR": tempfile.mkdtemp(prefix="rar-bench-")}
        cold.append(_check(run_job(one, root, env=writers), "cold run"))
        warm.append(_check(run_job(one, root, env=writers), "warm run"))
        fresh.append(_check(run_job(one, a.out / f"fresh_{i}", env=writers), "fresh folder, writer running"))
        _stop_writers(writers)
        writers = {"RAG_ABLATE_RUNTIME_DIR": tempfile.mkdtemp(prefix="rar-bench-")}
        sweeps.append(
            _check(run_job(["-m", "chunk=256,512"], a.out / f"sweep_{i}", env=writers), "default sweep")
        )
        _stop_writers(writers)
        cold_off.append(_check(run_job(one, a.out / f"one_off_{i}", env=in_process), "cold run, in-process"))
        cold_none.append(
            _check(run_job([*one, "tracking=none"], a.out / f"one_none_{i}"), "cold run, no MLflow")
        )
        sweeps_off.append(
            _check(
                run_job(["-m", "chunk=256,512"], a.out / f"sweep_off_{i}", env=in_process),
                "sweep, in-process",
            )
        )
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
    a_cpu = _median(bare_cpus)
    flag = f" --dataset {a.dataset}" if a.dataset is not None else ""

    print(f"- machine: {machine_line()}; 1-min load {min(loads):.1f}-{max(loads):.1f} during the runs")
    print(
        f"- command: `python benchmarks/bench_overhead.py{flag} --repeat {a.repeat}` (dataset {data}: ",
        end="",
    )
    print(
        f"{bare_info['chunks']:,} chunks of unit {bare_info['unit']}, analyzer {bare_info['language']}, "
        f"{bare_info['queries']:,} queries)"
    )
    print(
        f"- wall and CPU (user + sys) times are medians of {a.repeat} rounds (wall min-max in brackets); "
        "on a busy machine wall time includes waiting for a core, CPU time does not\n"
    )
    print(
        "| what | wall s | wall ratio to (a) | CPU s | CPU ratio to (a) | peak MB | time line s "
        "(main process CPU s; MLflow writer alongside, wall s) | goal (on wall) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")

    def rng(xs: list[float]) -> str:
        return f"{_median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"

    print(
        f"| (a) bare bm25s, same analyzer and chunks, top-{TOP_K} | {rng(bare_walls)} | 1.00x | {a_cpu:.2f} | 1.00x | | | |"
    )
    work = ", ".join(
        f"{k} {bare_info[k]:.2f}" for k in ("imports", "load_chunk", "tokenise", "index", "query")
    )
    print(f"| &nbsp;&nbsp;(a) stages, last round, s: {work} | | | | | | | |")
    rows = [
        ("(b) `python -m rag_ablate dataset.path=...` cold", cold, goals["cold"]),
        ("(b) the same, MLflow in-process (`RAG_ABLATE_MLFLOW_WRITER=0`)", cold_off, goals["cold"]),
        ("(b) the same, without MLflow (`tracking=none`)", cold_none, goals["cold"]),
        ("(b) the same command again, warm", warm, goals["warm"]),
        ("(b) a fresh folder, the resident MLflow writer running", fresh, goals["cold"]),
        ("default sweep `python -m rag_ablate -m chunk=256,512`, cold, fresh folder", sweeps, None),
        ("default sweep, MLflow in-process (`RAG_ABLATE_MLFLOW_WRITER=0`)", sweeps_off, None),
    ]
    for label, rs, goal in rows:
        walls = [r.wall for r in rs]
        cpu = _median([r.cpu for r in rs])
        peak = _median([r.peak_mb for r in rs])
        if goal is None:
            ratio, cpu_ratio = "", ""
            verdict = f"<= {SWEEP_GOAL_S:g} s: {'met' if _median(walls) <= SWEEP_GOAL_S else 'NOT met'}"
        else:
            ratio, cpu_ratio = f"{_median(walls) / a_wall:.2f}x", f"{cpu / a_cpu:.2f}x"
            verdict = f"<= {goal}x: {'met' if _median(walls) <= goal * a_wall else 'NOT met'}"
        line = _median([_time_line(r)[0] for r in rs])
        main_cpu = _median([_time_line(r)[1] for r in rs])
        aside = _median([_time_line(r)[2] for r in rs])
        shown = f"{line:.2f} ({main_cpu:.2f}; {aside:.2f})" if aside else f"{line:.2f} ({main_cpu:.2f}; -)"
        print(
            f"| {label} | {rng(walls)} | {ratio} | {cpu:.2f} | {cpu_ratio} | {peak:,.0f} | {shown} | {verdict} |"
        )
    print()
    breakdowns = {"cold": cold[-1], "warm": warm[-1], "sweep": sweeps[-1]}
    for name, r in spied.items():
        if not breakdowns[name].stages:
            breakdowns[name] = r
    print("Where the time goes, last round (stage wall/CPU s, longest first; source in brackets):\n")
    for name, r in breakdowns.items():
        src = r.stage_source or "none"
        print(f"- {name} ({src}, wall {r.wall:.1f} s, CPU {r.cpu:.1f} s): {_stages_line(r)}")
    (a.out / "results.json").write_text(
        json.dumps(
            {
                "dataset": str(data),
                "bare_walls": bare_walls,
                "bare_cpus": bare_cpus,
                "bare": bare_info,
                "cold": [r.wall for r in cold],
                "warm": [r.wall for r in warm],
                "sweep": [r.wall for r in sweeps],
                "cold_cpu": [r.cpu for r in cold],
                "warm_cpu": [r.cpu for r in warm],
                "sweep_cpu": [r.cpu for r in sweeps],
                "loads": loads,
                "breakdowns": {
                    k: {s: [v.seconds, v.cpu_s, v.peak_mb] for s, v in r.stages.items()}
                    for k, r in breakdowns.items()
                },
            },
            indent=1,
        ),
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
