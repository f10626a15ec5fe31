"""Scale: BM25 over 10k, 100k and 1M chunks with 10,000 queries through the real pipeline (issue 15).

For each size, a generated English corpus (``benchmarks/gen_corpus.py en``: one document is
one chunk under the default chunking) is run as a user would, one variant, cold cache, local
tracking, in a fresh output folder:

    python -m rag_ablate dataset.path=<data>/en_<size> retrieval=bm25 paths.output_root=<fresh>

and the script records the job's wall time, CPU time and peak memory (RSS of the process,
sampled from /proc every 0.2 s, and the kernel's high-water mark), and where both went per
stage. The stage breakdown comes from the job's ``profile.json`` (rag_ablate/core/profiling.py)
when the code writes one; otherwise, and with ``--spy``, from a py-spy sampling profile of
the job (each sample of the main thread is put in a stage by the outermost-to-innermost
pipeline function it is in: imports, hydra, store, load, chunk, index, query, score, write,
aggregate, log; the stage's peak memory is the highest RSS sample inside its samples' times).

The 1-minute load average is printed with every figure: the machine has 2 cores and is
shared, so wall times move with others' work; CPU seconds move much less.

    python benchmarks/bench_scale.py [--sizes 10k,100k,1m] [--data /tmp/rag_bench_data]
        [--out /tmp/rag_bench_scale] [--spy] [--queries 10000]

The comparison step on 100,000 queries is measured by ``benchmarks/bench_compare_scale.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench_stats import cpu_model  # benchmarks/ is on sys.path when a script here runs

REPO = Path(__file__).resolve().parent.parent
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
GOAL_SECONDS = 600.0
GOAL_MB = 8 * 1024.0


# --------------------------------------------------------------------------- machine


def load_avg() -> float:
    return os.getloadavg()[0]


def machine_line() -> str:
    mem = ""
    try:
        kb = int(re.findall(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[0])
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, IndexError):
        pass
    return (
        f"{platform.system()} {platform.machine()}, nproc {os.cpu_count()} ({cpu_model()}){mem}, "
        f"Python {platform.python_version()}"
    )


# --------------------------------------------------------------------------- /proc sampling


def _proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])  # kB
    except (OSError, ValueError):
        pass
    return out


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            kids += [int(x) for x in (task / "children").read_text().split()]
    except OSError:
        pass
    return kids


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class RssSampler(threading.Thread):
    """Samples the RSS of a process tree (the python processes in it) every ``interval`` seconds."""

    def __init__(
        self, root: int, interval: float = 0.2, skip_root: bool = False, max_mb: float | None = None
    ) -> None:
        super().__init__(daemon=True)
        self.max_mb = max_mb  # kill the tree (the processes this script started) above this RSS
        self.killed_at: tuple[float, float] | None = None
        self.root = root
        self.interval = interval
        self.skip_root = skip_root
        self.t0 = time.perf_counter()
        self.timeline: list[tuple[float, float]] = []  # (seconds since start, MB)
        self.hwm_mb = 0.0
        self.cpu_s: dict[int, float] = {}
        self.first_seen: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = [self.root]
            i = 0
            while i < len(pids):
                pids += _children(pids[i])
                i += 1
            if self.skip_root:
                pids = pids[1:]
            rss = 0.0
            for pid in pids:
                st = _proc_status(pid)
                rss += st.get("VmRSS", 0) / 1024
                self.hwm_mb = max(self.hwm_mb, st.get("VmHWM", 0) / 1024)
                self.cpu_s[pid] = max(self.cpu_s.get(pid, 0.0), _cpu_seconds(pid))
            t = time.perf_counter() - self.t0
            if pids and rss > 0:
                if self.first_seen is None:
                    self.first_seen = t
                self.timeline.append((t, rss))
            if self.max_mb is not None and rss > self.max_mb and self.killed_at is None:
                self.killed_at = (t, rss)
                for pid in reversed(pids if not self.skip_root else [self.root, *pids]):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            self.stop.wait(self.interval)


# --------------------------------------------------------------------------- stages

STAGES = (
    "imports",
    "hydra",
    "plan",
    "store",
    "load",
    "chunk",
    "index",
    "query",
    "score",
    "write",
    "aggregate",
    "log",
    "compare",
    "report",
    "summary",
    "launch",
    "config",
    "judge",
    "other",
    "interpreter",
)
# (stage, frame-name pattern): walking a sample's stack from the outermost frame inwards, every
# frame that matches sets the stage, so the innermost pipeline function decides; any import wins
_STAGE_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("hydra", re.compile(r"^(_run_hydra|Hydra\.|run_and_report)")),
    ("other", re.compile(r"(^|\.)run_variant$|^task_function|^main$")),
    ("plan", re.compile(r"^(build_plan|check_plan|format_plan)$")),
    (
        "store",
        re.compile(r"^(_open_store|_start_run|open_store|start_sweep|ensure_experiment|start_parent)$"),
    ),
    ("load", re.compile(r"^(get_dataset|_cached_dataset|load_dataset)$")),
    ("index", re.compile(r"^LocalSystem\.prepare$")),
    ("chunk", re.compile(r"^(LocalSystem\._chunk|chunk_corpus)$")),
    ("query", re.compile(r"^(evaluate|LocalSystem\.run)$")),
    ("score", re.compile(r"(^|\.)(finish|scored|make_record)$")),
    ("write", re.compile(r"^(RecordWriter\.|write_records|write_trec)")),
    (
        "aggregate",
        re.compile(
            r"^(aggregate|run_cost_metrics|slice_metrics|write_slices|judge_run_metrics|intent_report)$"
        ),
    ),
    ("log", re.compile(r"^(_log_to_mlflow|_log_traces|log_run)$")),
    ("compare", re.compile(r"^(finish_sweep|compare_sweep|run_comparison)$")),
]
_IMPORT_FRAMES = frozenset({"_find_and_load", "_call_with_frames_removed"})
Frame = tuple[str, str]  # (qualified function name, file)


@dataclass
class Stage:
    seconds: float = 0.0
    peak_mb: float = 0.0
    cpu_s: float = 0.0  # profile.json's CPU time (user + sys) of the stage, when it has one


def _rule_stage(frames: Sequence[Frame]) -> str:
    stage = "other" if frames else "interpreter"  # no Python frame: interpreter start-up or exit
    for name, _ in frames:
        for st, pat in _STAGE_RULES:
            if pat.search(name):
                stage = st
                break
    return stage


def stage_of(frames: Sequence[Frame]) -> tuple[str, str | None]:
    """The stage of one sampled stack (frames outermost first), and for an import the stage it is in.

    Running a database migration (alembic loads its scripts through the import system)
    counts as the stage that opens the store, not as an import.
    """
    for k, (name, _) in enumerate(frames):
        if name in _IMPORT_FRAMES:
            if any("alembic" in f or "db_migrations" in f for _, f in frames[k:]):
                break
            return "imports", _rule_stage(frames[:k])
    return _rule_stage(frames), None


@dataclass
class SpyProfile:
    stages: dict[str, Stage]
    imports_in: dict[str, float]  # import seconds by the stage that triggered them


def spy_stages(
    path: Path, timeline: Sequence[tuple[float, float]], wall: float, started: float
) -> SpyProfile:
    """Per-stage seconds and peak RSS from a py-spy speedscope profile (``--idle``, main thread).

    Sample times are the cumulative sample weights, scaled to the job's measured wall time
    (py-spy falls behind under load), from ``started`` (when the sampler first saw the process).
    """
    data = json.loads(path.read_text())
    frames: list[Frame] = [(f["name"], f.get("file") or "") for f in data["shared"]["frames"]]
    main = None
    for prof in data["profiles"]:
        if any(any(frames[i][0] == "_run_module_as_main" for i in s[:3]) for s in prof["samples"][:200]):
            main = prof
            break
    if main is None:
        return SpyProfile({}, {})
    weights = main["weights"]
    total = sum(weights) or 1.0
    scale = wall / total
    out: dict[str, Stage] = {}
    imports_in: dict[str, float] = {}
    t = 0.0
    j = 0
    for sample, w in zip(main["samples"], weights, strict=True):
        name, within = stage_of([frames[i] for i in sample])
        if within is not None:
            imports_in[within] = imports_in.get(within, 0.0) + w * scale
        st = out.setdefault(name, Stage())
        st.seconds += w * scale
        t0, t1 = started + t * scale, started + (t + w) * scale
        t += w
        while j < len(timeline) and timeline[j][0] < t0:
            j += 1
        k = j
        peak = timeline[max(j - 1, 0)][1] if timeline else 0.0  # the last RSS seen before this sample
        while k < len(timeline) and timeline[k][0] <= t1:
            peak = max(peak, timeline[k][1])
            k += 1
        st.peak_mb = max(st.peak_mb, peak)
    return SpyProfile(out, imports_in)


def _profile_name() -> str:
    """The name of a job's profile file in the code measured (older code may not define it)."""
    try:
        from rag_ablate.core import layout

        return str(getattr(layout, "PROFILE_FILE", "profile.json"))
    except ImportError:
        return "profile.json"


def profile_stages(job_dirs: Sequence[Path], multirun: bool = False) -> dict[str, Stage]:
    """The stage breakdown the code wrote (rag_ablate/core/profiling.py: each job's profile.json, and
    the sweep's), summed over jobs; the sweep's ``jobs`` stage is replaced by the jobs' stages and
    what is left of it (the launcher's own time) is ``launch``. {} when there is none."""
    name = _profile_name()
    out: dict[str, Stage] = {}

    def add(stage: str, v: dict[str, Any]) -> None:
        st = out.setdefault(stage, Stage())
        st.seconds += float(v.get("seconds", 0.0))
        st.cpu_s += float(v.get("cpu_s", 0.0))
        st.peak_mb = max(st.peak_mb, float(v.get("peak_mb", 0.0)))

    spent = 0.0
    for d in job_dirs:
        p = d / name
        if p.is_file():
            for stage, v in json.loads(p.read_text()).get("stages", {}).items():
                add(stage, v)
                spent += float(v.get("seconds", 0.0))
    if multirun and job_dirs and (job_dirs[0].parent / name).is_file():
        stages = json.loads((job_dirs[0].parent / name).read_text()).get("stages", {})
        jobs = stages.pop("jobs", None)
        for stage, v in stages.items():
            add(stage, v)
        if jobs is not None and float(jobs.get("seconds", 0.0)) > spent:
            add("launch", {"seconds": float(jobs["seconds"]) - spent, "peak_mb": jobs.get("peak_mb", 0.0)})
    return out


# --------------------------------------------------------------------------- one job


@dataclass
class JobResult:
    command: str
    wall: float
    cpu: float
    peak_mb: float
    load_before: float
    load_after: float
    returncode: int
    job_dirs: list[str] = field(default_factory=list)
    stages: dict[str, Stage] = field(default_factory=dict)
    stage_source: str = ""
    imports_in: dict[str, float] = field(default_factory=dict)  # py-spy: import seconds by stage
    killed_at: tuple[float, float] | None = None  # (seconds, MB) when the memory guard stopped it
    build: dict[str, Any] = field(default_factory=dict)
    run_metrics: dict[str, float] = field(default_factory=dict)
    timeline: list[tuple[float, float]] = field(default_factory=list)
    stderr_tail: str = ""


def resident_writer_cpu(job_dirs: Sequence[Path], multirun: bool) -> float:
    """The CPU seconds of the MLflow writer when it was the resident writer's child (profile.json
    ``writer: resident``): not this command's descendant, so not in its process tree's CPU time,
    and added to it here (its import of MLflow too, for the command that started it)."""
    if not job_dirs:
        return 0.0
    where = [job_dirs[0].parent] if multirun else list(job_dirs)
    total = 0.0
    for d in where:
        p = d / _profile_name()
        if not p.is_file():
            continue
        prof = json.loads(p.read_text())
        if prof.get("writer") == "resident":
            total += sum(float(v.get("cpu_s", 0.0)) for v in prof.get("background", {}).values())
    return total


def _job_dirs(out: Path, multirun: bool) -> list[Path]:
    base = out / ("multirun" if multirun else "runs")
    if not base.is_dir():
        return []
    newest = max(base.iterdir(), key=lambda p: p.stat().st_mtime)
    return sorted(p.parent for p in newest.glob("*/summary.json")) if multirun else [newest]


def run_job(
    args: Sequence[str],
    out: Path,
    *,
    spy: Path | None = None,
    env: dict[str, str] | None = None,
    max_mb: float | None = None,
) -> JobResult:
    """``python -m rag_ablate <args> paths.output_root=<out> progress=false``, measured."""
    py = [sys.executable, "-m", "rag_ablate", *args, f"paths.output_root={out}", "progress=false"]
    cmd = py
    if spy is not None:
        cmd = ["py-spy", "record", "--format", "speedscope", "--idle", "-r", "25", "-o", str(spy), "--", *py]
    run_env = {**os.environ, **(env or {})}
    load_before = load_avg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env=run_env
    )
    sampler = RssSampler(proc.pid, skip_root=spy is not None, max_mb=max_mb)
    sampler.start()
    err_lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        err_lines.append(line)
        del err_lines[:-60]
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.stop.set()
    sampler.join()
    cpu = usage.ru_utime + usage.ru_stime
    peak = max(usage.ru_maxrss / 1024, sampler.hwm_mb, max((m for _, m in sampler.timeline), default=0.0))
    if spy is not None:
        cpu = sum(sampler.cpu_s.values()) - sampler.cpu_s.get(proc.pid, 0.0)
    multirun = "-m" in args or "--multirun" in args
    dirs = _job_dirs(out, multirun)
    cpu += resident_writer_cpu(dirs, multirun)
    res = JobResult(
        command=" ".join(["python", "-m", "rag_ablate", *args]),
        wall=wall,
        cpu=cpu,
        peak_mb=peak,
        load_before=load_before,
        load_after=load_avg(),
        returncode=proc.returncode,
        job_dirs=[str(d) for d in dirs],
        timeline=sampler.timeline,
        stderr_tail="".join(err_lines[-30:]),
        killed_at=sampler.killed_at,
    )
    for d in dirs:
        summary = d / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            res.build = s.get("build", {})
            res.run_metrics = {
                k: v for k, v in s.get("metrics", {}).items() if k.startswith(("run/", "time/"))
            }
            res.run_metrics.update({k: v for k, v in s.get("metrics", {}).items() if k.startswith("memory/")})
    stages = profile_stages(dirs, multirun)
    if stages:
        res.stages, res.stage_source = stages, "profile.json"
    if spy is not None and spy.is_file():
        started = sampler.first_seen or 0.0
        spied = spy_stages(spy, sampler.timeline, wall - started, started)
        if spied.stages:
            res.stages, res.stage_source = spied.stages, "py-spy"
            res.imports_in = spied.imports_in
    return res


def fmt_stages(res: JobResult) -> str:
    parts = [
        f"{k} {v.seconds:.1f}s/{v.peak_mb:.0f}MB"
        for k, v in sorted(res.stages.items(), key=lambda kv: -kv[1].seconds)
        if v.seconds >= 0.05
    ]
    if res.imports_in:
        within = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(res.imports_in.items(), key=lambda kv: -kv[1]))
        parts.append(f"(imports by stage: {within})")
    return ", ".join(parts)


# --------------------------------------------------------------------------- the benchmark


def ensure_dataset(data: Path, size: str, n_queries: int) -> Path:
    folder = data / f"en_{size}" if n_queries == 10_000 else data / f"en_{size}_q{n_queries}"
    if not (folder / "queries.jsonl").is_file():
        sys.path.insert(0, str(Path(__file__).parent))
        from gen_corpus import generate_en

        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        generate_en(folder, SIZES[size], n_queries, seed=0)
        print(f"generated {folder} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return folder


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.1f}x" if a > 0 else "-"


def print_table(results: dict[str, JobResult]) -> None:
    sizes = list(results)
    print(f"- machine: {machine_line()}")
    print(
        "- command per size: `python -m rag_ablate dataset.path=<en_SIZE> retrieval=bm25` (cold, fresh folder)"
    )
    print(
        f"- stage breakdown from: {', '.join(sorted({r.stage_source or 'none' for r in results.values()}))}\n"
    )
    head = " | ".join(f"{s}: s / peak MB" for s in sizes)
    growth = [f"{a}->{b} (s, MB)" for a, b in itertools.pairwise(sizes)]
    print(f"| stage | {' | '.join([head, *growth])} |")
    print("|---|" + "---:|" * (len(sizes) + len(growth)))
    names = [st for st in STAGES if any(st in r.stages for r in results.values())]
    names += sorted({k for r in results.values() for k in r.stages} - set(names))
    rows: list[tuple[str, list[tuple[float, float]]]] = [
        (
            st,
            [
                (results[s].stages.get(st, Stage()).seconds, results[s].stages.get(st, Stage()).peak_mb)
                for s in sizes
            ],
        )
        for st in names
    ]
    # the cache stages the index is built from (their build seconds, logged as run/cache_<kind>_build_seconds)
    kinds = sorted(
        {
            k.removeprefix("run/cache_").removesuffix("_build_seconds")
            for r in results.values()
            for k in r.run_metrics
            if k.startswith("run/cache_") and k.endswith("_build_seconds")
        }
    )
    for kind in kinds:
        key = f"run/cache_{kind}_build_seconds"
        rows.append(
            (
                f"&nbsp;&nbsp;of which cache build `{kind}`",
                [(results[s].run_metrics.get(key, 0.0), 0.0) for s in sizes],
            )
        )
    rows.append(("**whole job**", [(results[s].wall, results[s].peak_mb) for s in sizes]))
    rows.append(("CPU seconds (user+sys)", [(results[s].cpu, 0.0) for s in sizes]))
    for name, vals in rows:
        cells = [f"{w:.1f} / {m:,.0f}" if m else f"{w:.1f}" for w, m in vals]
        grow = [
            f"{_ratio(a[0], b[0])}, {_ratio(a[1], b[1])}" if a[1] else _ratio(a[0], b[0])
            for a, b in itertools.pairwise(vals)
        ]
        print(f"| {name} | {' | '.join([*cells, *grow])} |")
    print()
    for s in sizes:
        r = results[s]
        ok = r.wall < GOAL_SECONDS and r.peak_mb < GOAL_MB
        goal = f"goal (<600 s, <8 GB) {'met' if ok else 'NOT met'}" if s == "1m" else ""
        if r.killed_at is not None:
            goal += f" STOPPED by the memory guard at {r.killed_at[0]:.0f} s, {r.killed_at[1]:,.0f} MB"
        print(
            f"- {s}: wall {r.wall:.0f} s, CPU {r.cpu:.0f} s, peak {r.peak_mb:,.0f} MB, load {r.load_before:.1f}"
            f"->{r.load_after:.1f}, index.build_seconds {r.build.get('index.build_seconds', '-')}, "
            f"exit {r.returncode} {goal}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10k,100k,1m", help="comma list of 10k, 100k, 1m")
    ap.add_argument("--data", type=Path, default=Path("/tmp/rag_bench_data"), help="generated datasets")
    ap.add_argument("--out", type=Path, default=Path("/tmp/rag_bench_scale"), help="output roots (emptied)")
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument(
        "--spy", action="store_true", help="stage breakdown from py-spy (always when no profile.json)"
    )
    ap.add_argument(
        "--max-mb", type=float, default=12_000, help="stop a job whose RSS passes this (protects the machine)"
    )
    ap.add_argument(
        "--compare-queries",
        type=int,
        default=0,
        help="also a 2-variant sweep over this many queries at 10k chunks",
    )
    ap.add_argument("--extra", default="", help="more overrides for every job, space separated")
    a = ap.parse_args()
    sizes = [s.strip().lower() for s in a.sizes.split(",") if s.strip()]
    results: dict[str, JobResult] = {}
    a.out.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        folder = ensure_dataset(a.data, size, a.queries)
        out = a.out / size
        shutil.rmtree(out, ignore_errors=True)
        args = [f"dataset.path={folder}", "retrieval=bm25", *a.extra.split()]
        spy = a.out / f"{size}.speedscope.json" if a.spy else None
        res = run_job(args, out, spy=spy, max_mb=a.max_mb)
        if res.killed_at is not None:
            t, mb = res.killed_at
            print(
                f"{size}: stopped by the memory guard at {t:.0f} s, {mb:,.0f} MB > --max-mb", file=sys.stderr
            )
        if not res.stages and spy is None:  # no profile.json: where the time went, from py-spy
            print(f"{size}: no profile.json; rerun with --spy for the stage breakdown", file=sys.stderr)
        if res.returncode != 0:
            print(f"{size}: FAILED (exit {res.returncode})\n{res.stderr_tail}", file=sys.stderr)
        results[size] = res
        print(f"{size}: {res.wall:.1f} s, peak {res.peak_mb:,.0f} MB; {fmt_stages(res)}", file=sys.stderr)
        (a.out / "results.json").write_text(
            json.dumps({k: asdict(v) for k, v in results.items()}, indent=1), encoding="utf-8"
        )
    if results:
        print_table(results)
    if a.compare_queries:
        compare_sweep(a.data, a.out, a.compare_queries, a.max_mb)


def compare_sweep(data: Path, out_root: Path, n_queries: int, max_mb: float | None) -> None:
    """A real two-variant sweep over ``n_queries`` queries at 10k chunks: the jobs and the comparison."""
    folder = ensure_dataset(data, "10k", n_queries)
    out = out_root / f"compare_q{n_queries}"
    shutil.rmtree(out, ignore_errors=True)
    args = ["-m", f"dataset.path={folder}", "retrieval=bm25", "retrieval.bm25.k1=1.2,1.5"]
    res = run_job(args, out, max_mb=max_mb)
    print(f"\n- command: `python -m rag_ablate {' '.join(args)}` (cold, fresh folder)")
    print(
        f"- wall {res.wall:.0f} s, CPU {res.cpu:.0f} s, peak {res.peak_mb:,.0f} MB, load {res.load_before:.1f}"
        f"->{res.load_after:.1f}, exit {res.returncode}\n"
    )
    if res.returncode != 0:
        print(res.stderr_tail)
    dirs = [Path(d) for d in res.job_dirs]
    sweep = dirs[0].parent / "profile.json" if dirs else None
    print("| step | s | peak MB |")
    print("|---|---:|---:|")
    if sweep is not None and sweep.is_file():
        for name, v in json.loads(sweep.read_text()).get("stages", {}).items():
            print(f"| sweep: {name} | {v.get('seconds', 0.0):.1f} | {v.get('peak_mb', 0.0):,.0f} |")
    for d in dirs:
        p = d / "profile.json"
        if p.is_file():
            stages = json.loads(p.read_text()).get("stages", {})
            top = ", ".join(
                f"{k} {v['seconds']:.1f}"
                for k, v in sorted(stages.items(), key=lambda kv: -kv[1]["seconds"])[:5]
            )
            total = sum(v["seconds"] for v in stages.values())
            peak = max((v["peak_mb"] for v in stages.values()), default=0.0)
            print(f"| job {d.name} ({top}) | {total:.1f} | {peak:,.0f} |")
    print(f"| **whole sweep** | {res.wall:.1f} | {res.peak_mb:,.0f} |")


if __name__ == "__main__":
    main()
