"""Where a run's time and memory go: wall seconds and peak resident memory per stage.

A job records its stages (``imports``, ``store``, ``load``, ``index``, ``query``,
``score``, ``judge``, ``write``, ``log``) and writes them to ``profile.json`` in its
folder (:data:`rag_ablate.core.layout.PROFILE_FILE`); the sweep does the same for its own
steps (``imports``, ``plan``, ``store``, ``jobs``, ``summary``, ``compare``, ``report``,
``log``). Each stage has ``seconds`` (wall clock) and ``peak_mb`` (the largest resident
set seen while it ran); the MLflow run gets them as ``time/<stage>_s`` and
``memory/peak_mb``. docs/architecture.md ("Where the time goes") describes the stages.

Memory on Linux: the process's high-water mark (``VmHWM`` in ``/proc/self/status``) is
read at each stage boundary, so a stage that sets a new peak reports it exactly; a
stage below the earlier peak reports the largest resident set sampled every
:data:`SAMPLE_S` seconds by a background thread while it ran. The high-water mark is
never reset, so tools that measure the whole process (``/usr/bin/time``) still see its
true peak. Elsewhere ``resource.getrusage`` gives the process's peak so far.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

SAMPLE_S = 0.05  # seconds between two samples of the resident set while a stage runs
_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int | None:
    """A ``/proc/self/status`` value in kB (VmRSS, VmHWM); None where there is no ``/proc``."""
    try:
        text = _STATUS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    return None


def _maxrss_mb() -> float:
    """The process's peak resident set so far (``getrusage``: kB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def rss_mb() -> float:
    """This process's resident set now, in MB (its peak so far where ``/proc`` is absent)."""
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else _maxrss_mb()


def hwm_mb() -> float:
    """This process's peak resident set so far, in MB."""
    kb = _status_kb("VmHWM")
    return kb / 1024 if kb is not None else _maxrss_mb()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``); None where unknown.

    The ``imports`` stage of a run: interpreter start-up and the imports before the run began.
    """
    try:
        stat = Path("/proc/self/stat").read_text(encoding="ascii", errors="replace")
        uptime = float(Path("/proc/uptime").read_text(encoding="ascii").split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) <= 19 or not fields[19].isdigit():
        return None
    return max(0.0, uptime - int(fields[19]) / ticks)


_startup_claimed = False
_startup_lock = threading.Lock()
_startup_gc_off = False  # startup_gc_off() turned the cyclic collector off; claim_startup() turns it on


def startup_gc_off() -> None:
    """The cyclic garbage collector off for the rest of this process's start-up, until its first
    profile claims it (:func:`claim_startup`): ``python -m rag_ablate`` calls this once the MLflow
    writer is forked (the writer does the same around its own imports: tracking/background.py).
    The imports, Hydra's composition and the config's checks make a few hundred thousand objects
    that stay (modules, classes, configs), which each of the collector's passes would walk again:
    about 180 passes, 0.04-0.06 s of CPU before a run's first job. Nothing happens when the
    collector is off already."""
    global _startup_gc_off
    if gc.isenabled():
        gc.disable()
        _startup_gc_off = True


def startup_gc_on(*, freeze: bool = False) -> None:
    """The collector back on after :func:`startup_gc_off` (nothing otherwise). ``freeze``: what the
    start-up made is moved out of the collector's sight first (``gc.freeze``), so no later full
    pass walks it either (a run's index stage: 0.03-0.05 s of CPU less on COVID-QA); the start-up's
    own cyclic garbage (about 15,000 objects, 2 MB, mostly Hydra's discarded configs) is kept then."""
    global _startup_gc_off
    if _startup_gc_off:
        _startup_gc_off = False
        if freeze:
            gc.freeze()
        gc.enable()


def claim_startup() -> tuple[float, float | None, float]:
    """(seconds from this process's start to now, its resident MB, its CPU seconds), the first time
    it is asked in a process; zeros after.

    The first profile of a process (a single run's job, a sweep's driver, a launcher worker's
    first job) counts the interpreter's start-up and imports as its ``imports`` stage; any later
    one in the same process has already paid for them. The start-up ends here: a collector that
    :func:`startup_gc_off` turned off is turned on, the start-up's objects frozen.
    """
    global _startup_claimed
    with _startup_lock:
        if _startup_claimed:
            return 0.0, None, 0.0
        _startup_claimed = True
    startup_gc_on(freeze=True)
    return process_age_s() or 0.0, rss_mb(), time.process_time()


class _Sampler:
    """A daemon thread keeping the largest resident set seen since :meth:`reset`."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if _status_kb("VmRSS") is None:
            return  # no /proc: the stage boundaries' getrusage is all there is
        self._thread = threading.Thread(target=self._run, name="rag_ablate-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            kb = _status_kb("VmRSS")
            if kb is not None and kb > self.peak_kb:
                self.peak_kb = kb

    def reset(self) -> None:
        self.peak_kb = 0

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class Profile:
    """Wall seconds and peak MB per stage of one job or sweep, in the order the stages ran.

    A stage entered twice (a resumed job's querying, say) adds up its seconds and keeps
    the larger peak. Use :meth:`stage` as a context manager, or :meth:`add` for a
    duration measured elsewhere (the ``imports`` before the run, the scoring time
    spread over the querying loop).
    """

    def __init__(self, kind: str, *, sample: bool = True) -> None:
        self.kind = kind  # job | sweep
        self.stages: dict[str, dict[str, float]] = {}
        self.started = time.perf_counter()
        # per open stage: [name, start time, VmHWM then, largest RSS seen, seconds of inner stages,
        # process CPU time then, CPU seconds of inner stages]
        self._open: list[list[Any]] = []
        self._sampler = _Sampler()
        # stage -> {seconds, cpu_s} spent alongside, in the background MLflow writer's process
        self.background: dict[str, dict[str, float]] = {}
        # which writer that was: "resident" (a child of the resident writer, not of this process:
        # its CPU time is not in this process tree's) or "forked" (this command's child)
        self.writer = ""
        if sample:
            self._sampler.start()

    def add(
        self, name: str, seconds: float, peak_mb: float | None = None, cpu_s: float | None = None
    ) -> None:
        """Record ``seconds`` (and a peak, and CPU seconds: as many as wall seconds unless given)
        for ``name``, added to what it has already."""
        entry = self.stages.setdefault(name, {"seconds": 0.0, "cpu_s": 0.0, "peak_mb": 0.0})
        entry["seconds"] = round(entry["seconds"] + max(0.0, seconds), 4)
        cpu = seconds if cpu_s is None else cpu_s
        entry["cpu_s"] = round(entry["cpu_s"] + max(0.0, cpu), 4)
        peak = rss_mb() if peak_mb is None else peak_mb
        entry["peak_mb"] = round(max(entry["peak_mb"], peak), 1)

    def move(self, source: str, target: str, seconds: float, cpu_s: float | None = None) -> None:
        """Take ``seconds`` (and ``cpu_s`` of CPU time) out of stage ``source`` and give them to
        ``target`` (same peak).

        The querying loop scores each query as it completes: the scoring time, measured
        inside the loop, moves from ``query`` to ``score``. Without ``cpu_s`` the CPU time moved
        is the wall time (on a busy machine that overstates it: waiting for a core is not CPU).
        """
        entry = self.stages.get(source)
        if entry is None:
            return
        seconds = min(max(0.0, seconds), entry["seconds"])
        cpu = min(seconds if cpu_s is None else max(0.0, cpu_s), entry["cpu_s"])
        entry["seconds"] = round(entry["seconds"] - seconds, 4)
        entry["cpu_s"] = round(entry["cpu_s"] - cpu, 4)
        self.add(target, seconds, entry["peak_mb"], cpu)

    def start(self, name: str) -> None:
        """Stage ``name`` begins (ended by :meth:`stop`). Stages may nest: an inner stage's
        seconds are its own, not the outer one's (the stages add up to the run's time), and
        its peak counts for the outer one too."""
        if self._open:  # the sampled peak so far belongs to the stage being interrupted
            self._open[-1][3] = max(self._open[-1][3], self._sampler.peak_kb / 1024)
        self._open.append([name, time.perf_counter(), hwm_mb(), rss_mb(), 0.0, time.process_time(), 0.0])
        self._sampler.reset()

    def stop(self) -> float:
        """The innermost open stage ends; its seconds."""
        name, t0, hwm_before, start_peak, inner, cpu0, inner_cpu = self._open.pop()
        elapsed = time.perf_counter() - float(t0)
        seconds = max(0.0, elapsed - float(inner))
        cpu_elapsed = time.process_time() - float(cpu0)
        cpu = max(0.0, cpu_elapsed - float(inner_cpu))
        hwm_after = hwm_mb()
        peak = max(float(start_peak), rss_mb(), self._sampler.peak_kb / 1024)
        if hwm_after > hwm_before:  # this stage set the process's peak: exact
            peak = max(peak, hwm_after)
        self.add(str(name), seconds, peak, cpu)
        if self._open:
            self._open[-1][3] = max(self._open[-1][3], peak)
            self._open[-1][4] += elapsed
            self._open[-1][6] += cpu_elapsed
        return seconds

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as stage ``name`` and keep its peak resident set."""
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def close(self) -> None:
        """End any stage still open and stop the memory sampler (the stages stay readable)."""
        while self._open:
            self.stop()
        self._sampler.stop()

    def seconds(self, name: str) -> float:
        return self.stages.get(name, {}).get("seconds", 0.0)

    @property
    def peak_mb(self) -> float:
        """The largest resident set of any stage (the process's peak while this ran)."""
        return max((e["peak_mb"] for e in self.stages.values()), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "stages": {k: dict(v) for k, v in self.stages.items()},
            "total_s": round(sum(e["seconds"] for e in self.stages.values()), 4),
            "cpu_s": round(sum(e["cpu_s"] for e in self.stages.values()), 4),
            "peak_mb": self.peak_mb,
            "pid": os.getpid(),
            **({"background": self.background} if self.background else {}),
            **({"writer": self.writer} if self.writer else {}),
        }

    def open_stages(self) -> list[str]:
        """The stages started and not yet stopped, outermost first."""
        return [str(entry[0]) for entry in self._open]

    def metrics(self) -> dict[str, float]:
        """``time/<stage>_s`` per stage, ``time/total_s`` and ``memory/peak_mb``, for MLflow."""
        return self.metrics_of(self.to_dict())

    @staticmethod
    def metrics_of(data: Mapping[str, Any]) -> dict[str, float]:
        """:meth:`metrics` of a profile read back from ``profile.json``."""
        stages = data.get("stages", {})
        out = {f"time/{k}_s": float(v.get("seconds", 0.0)) for k, v in stages.items()}
        out["time/total_s"] = float(data.get("total_s", sum(out.values())))
        out["memory/peak_mb"] = float(data.get("peak_mb", 0.0))
        return out

    def write(self, folder: Path) -> Path:
        """Write ``profile.json`` into ``folder``; its path."""
        from rag_ablate.core.fsio import write_json_atomic
        from rag_ablate.core.layout import PROFILE_FILE

        path = folder / PROFILE_FILE
        write_json_atomic(path, self.to_dict())
        return path

    def line(self) -> str:
        """One line: where the time went, largest stages first (``time 5.1s: index 2.0s, ...``)."""
        return summary_line(self.stages, background=self.background)


_sweep: Profile | None = None


def sweep_profile() -> Profile:
    """The profile of the sweep this process drives (created, with its ``imports``, on first use)."""
    global _sweep
    if _sweep is None:
        _sweep = Profile("sweep")
        _sweep.add("imports", *claim_startup())
    return _sweep


def end_sweep_profile() -> Profile | None:
    """The sweep's profile, closed and forgotten (the next sweep of this process starts anew)."""
    global _sweep
    prof, _sweep = _sweep, None
    if prof is not None:
        prof.close()
    return prof


# the stages of the breakdown, in order; a job's other stages (config, load, write,
# judge) and a sweep's (plan, summary, report) are listed after them
BREAKDOWN = ("imports", "store", "index", "query", "score", "log", "compare")


def breakdown(
    sweep: Mapping[str, Any], jobs: Mapping[str, Mapping[str, Any]], key: str = "seconds"
) -> dict[str, float]:
    """Seconds per stage of a whole sweep: its own stages with ``jobs`` replaced by the sum of
    the jobs' stages (a job's ``log`` and the sweep's add up, and so on), in :data:`BREAKDOWN`
    order then the rest. ``jobs`` maps a job's label to its profile; ``key="cpu_s"``: CPU seconds."""
    out: dict[str, float] = {}
    sweep_stages = dict(sweep.get("stages", {}))
    jobs_s = float(sweep_stages.pop("jobs", {}).get(key, 0.0))
    spent = 0.0
    for prof in jobs.values():
        for name, entry in prof.get("stages", {}).items():
            out[name] = out.get(name, 0.0) + float(entry.get(key, 0.0))
            spent += float(entry.get(key, 0.0))
    for name, entry in sweep_stages.items():
        out[name] = out.get(name, 0.0) + float(entry.get(key, 0.0))
    if jobs_s > spent:  # the launcher's own time (composing each job's config, its folders)
        out["launch"] = out.get("launch", 0.0) + jobs_s - spent
    order = [k for k in BREAKDOWN if k in out] + [k for k in out if k not in BREAKDOWN]
    return {k: round(out[k], 3) for k in order}


def summary_line(
    stages: Mapping[str, Mapping[str, float]],
    top: int = 6,
    peak_mb: float | None = None,
    background: Mapping[str, Mapping[str, float]] | None = None,
) -> str:
    """``time 5.1s: index 2.0s, query 1.1s, ...; peak 410 MB`` from a profile's stages (the
    ``top`` largest; the peak is the stages' largest unless given). ``background``: the seconds
    the background MLflow writer spent per stage, alongside these (not part of the total), shown
    as ``; MLflow alongside 3.0s: store 2.0s, log 1.0s``."""
    total = sum(float(e.get("seconds", 0.0)) for e in stages.values())
    order = sorted(stages.items(), key=lambda kv: -float(kv[1].get("seconds", 0.0)))
    parts = [f"{k} {float(v.get('seconds', 0.0)):.1f}s" for k, v in order[:top]]
    if peak_mb is None:
        peak_mb = max((float(e.get("peak_mb", 0.0)) for e in stages.values()), default=0.0)
    aside = ""
    if background:
        spent = sum(float(e.get("seconds", 0.0)) for e in background.values())
        each = ", ".join(f"{k} {float(v.get('seconds', 0.0)):.1f}s" for k, v in background.items())
        aside = f"; MLflow alongside {spent:.1f}s: {each}"
    return f"time {total:.1f}s: {', '.join(parts)}{aside}; peak {peak_mb:.0f} MB"


def read_profile(folder: Path) -> dict[str, Any] | None:
    """A folder's ``profile.json``, or None when it has none."""
    from rag_ablate.core.layout import PROFILE_FILE

    path = folder / PROFILE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
