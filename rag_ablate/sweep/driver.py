"""The sweep's own steps, run by the ablation sweeper in the driver process.

The sweeper (``hydra_plugins/rag_ablate_sweeper``) first validates every job of
the plan (:func:`rag_ablate.sweep.plan.check_plan`), then calls:

* :func:`start_sweep`, before any job: opens the MLflow store (an unusable one
  fails here, before anything is spent or created), creates the sweep folder with
  ``plan.json``, the sweep's parent run, and ``sweep.json`` with its id for the
  jobs (two jobs creating one sqlite store at once would crash);
* :func:`finish_sweep`, after the launcher returns: checks every job's outcome,
  reads what the jobs wrote to disk (they may have run in other processes or
  machines), prints the per-variant table, runs the comparison over the jobs
  that finished, logs to the parent run and ends it (``FAILED`` when anything
  failed), writes ``failures.json`` and returns the sweep's exit code; a file it cannot
  write (a full disk, a read-only folder) stops it with one line naming the path, the
  parent run ``FAILED``, ``failures.json`` complete or absent (``resume=`` finishes it);
* :func:`interrupt_sweep`, when Ctrl-C stops the sweep: ends its MLflow runs
  ``KILLED``, writes ``failures.json`` and says in one line how to resume.

Nothing is left to Hydra's callbacks: Hydra calls them before the sweeper has
validated the plan and turns their exceptions into warnings.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from rag_ablate.compare.run import ComparisonRun, print_gate_outcome, run_comparison
from rag_ablate.config.keys import env_interpolated, redact_override
from rag_ablate.config.schema import RunConfig
from rag_ablate.core import profiling
from rag_ablate.core.errors import EXIT_BLOCKED, EXIT_FAILED, TrackingError, WriteError, one_line
from rag_ablate.core.fsio import write_json_atomic, write_text_atomic
from rag_ablate.core.layout import (
    COMPARISON_MD,
    FAILURES_FILE,
    PROFILE_FILE,
    RECORDS_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    SWEEP_SUMMARY_MD,
    TIMING_FILE,
    VARIANT_FILE,
)
from rag_ablate.report.html import Report
from rag_ablate.run.resume import save_config_dir
from rag_ablate.run.runner import variant_label
from rag_ablate.run.summary import markdown_table, print_table, ui_hint
from rag_ablate.run.timing import TimingJob, timing_pass
from rag_ablate.settings import to_settings
from rag_ablate.sweep.plan import Plan, write_plan
from rag_ablate.sweep.publish import SweepEnd, publish_sweep
from rag_ablate.tracking import background
from rag_ablate.tracking import store as tracking

# exit codes of a sweep: those of every command (rag_ablate.core.errors, README "Exit codes"):
# EXIT_FAILED a job, the comparison or the MLflow logging failed; EXIT_INVALID nothing ran (the plan,
# a job's config or the MLflow store is unusable)
EXIT_INTERRUPTED = 130
WRITER = "MLflow (background writer)"  # a failure in tracking/background.py's process


def _sweep_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir))


def _cwd(config: DictConfig) -> Path:
    return Path(str(config.hydra.runtime.cwd))


_settings_memo: list[tuple[DictConfig, RunConfig]] = []


def _settings(config: DictConfig) -> RunConfig:
    """The sweep config's settings, computed once for the sweep's start and end (the same object)."""
    for known, settings in _settings_memo:
        if known is config:
            return settings
    settings = to_settings(config)
    _settings_memo[:] = [(config, settings)]
    return settings


def read_summaries(sweep_dir: Path) -> list[dict[str, Any]]:
    """The jobs' summaries in job order."""
    found = []
    for path in sweep_dir.glob(f"*/{SUMMARY_FILE}"):
        data = json.loads(path.read_text(encoding="utf-8"))
        variant = path.parent / VARIANT_FILE
        num = json.loads(variant.read_text(encoding="utf-8")).get("job_num", 0) if variant.is_file() else 0
        found.append((num, data))
    return [d for _, d in sorted(found, key=lambda t: t[0])]


@dataclass
class Failure:
    """One thing of a sweep that failed: a job, or a sweep-wide step."""

    step: str  # job | launch | timing | comparison | report | tracking | write
    what: str  # the job's label, or the step
    error: str  # one line: why
    job: int | None = None  # the job number, for a job
    detail: str = ""  # the traceback, kept in failures.json

    def line(self) -> str:
        where = f"job #{self.job} {self.what}" if self.job is not None else self.what
        return f"{where}: {self.error}"


def _failure(step: str, what: str, exc: BaseException, job: int | None = None) -> Failure:
    """``exc`` as a step's failure; a write the folder refuses (a full disk, a read-only folder) is
    raised again instead: it stops the sweep (:func:`finish_sweep`), every next step would fail so."""
    if isinstance(exc, WriteError) and exc.of_the_folder:
        raise exc
    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Failure(step, what, one_line(exc), job, detail)


def job_failures(plan: Plan, returns: Sequence[JobReturn]) -> list[Failure]:
    """The jobs that did not complete, from the launcher's JobReturns (in job order)."""
    out = []
    for i, job in enumerate(plan.jobs):
        ret = returns[i] if i < len(returns) else None
        if ret is None:
            out.append(Failure("job", job.label, "did not run (the launcher returned no result)", job.index))
        elif ret.status == JobStatus.FAILED:
            exc = getattr(ret, "_return_value", None)  # `return_value` would raise it
            if isinstance(exc, BaseException):
                out.append(_failure("job", job.label, exc, job.index))
            else:
                out.append(Failure("job", job.label, "failed", job.index))
        elif ret.status != JobStatus.COMPLETED:
            out.append(Failure("job", job.label, f"did not finish (status {ret.status.name})", job.index))
    return out


def start_sweep(config: DictConfig, plan: Plan, baseline: RunConfig | None = None) -> dict[str, Any]:
    """Open the MLflow store, create the sweep folder, plan and parent run; the sweep's handle.

    ``baseline``: the baseline job's settings (:func:`rag_ablate.sweep.plan.check_plan`), which the
    sweep's start and end use as the sweep's own: the sweep's config may leave unset what the
    baseline takes from its first level (``system.base_url=A,B``).

    An unusable store raises TrackingError before the sweep folder is created.
    With ``resume=`` the existing sweep folder and parent run are reused instead
    (:func:`rag_ablate.run.resume.reopen_sweep`).
    """
    if baseline is not None:
        _settings_memo[:] = [(config, baseline)]
    with profiling.sweep_profile().stage("store"):
        return _start_sweep(config, plan)


def _start_sweep(config: DictConfig, plan: Plan) -> dict[str, Any]:
    s = _settings(config)
    sweep_dir = _sweep_dir(config)
    tracking.set_budget(s.tracking.timeout_s)
    if s.resume:
        from rag_ablate.run.resume import reopen_sweep

        background.release()  # the runs are reopened and ended in this process, as before
        return reopen_sweep(sweep_dir, plan)
    output_root = (_cwd(config) / s.paths.output_root).resolve()
    # no header values (API keys), values read from the environment as their ${oc.env:NAME} text
    env = env_interpolated(OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"]))
    overrides = [redact_override(o, env) for o in config.hydra.overrides.task]
    info: dict[str, Any] = {"overrides": overrides, "jobs": len(plan.jobs)}
    if s.compare.baseline_run:  # compare.baseline_run: what `rag-ablate compare/report` pin again
        pinned = Path(s.compare.baseline_run).expanduser()
        info["baseline_run"] = str(pinned.resolve()) if pinned.is_dir() else s.compare.baseline_run
    experiment_id: background.Pending | None = None
    if s.tracking.enabled:
        if not _basic_launcher(config):  # its jobs run in other processes: everything logged here
            background.release()
        uri, artifacts = tracking.resolve(s.tracking, output_root)
        experiment_id = background.open_store(
            uri, s.tracking.experiment, artifacts, create_folder=s.tracking.uri is None
        )
    else:
        background.release()
    write_plan(plan, sweep_dir, config)
    # resume= finds the options of --config-dir (named deployments) in the sweep folder
    save_config_dir(config.hydra.runtime.config_sources, sweep_dir)
    if experiment_id is not None:
        name = "sweep " + variant_label(overrides)
        tags = tracking.base_tags(_cwd(config))
        tags["sweep.dir"] = str(sweep_dir.resolve())
        tags["ablation.mode"] = s.ablation.mode
        try:
            parent = background.call(
                "creating the sweep's run", "store", tracking.start_parent, uri, experiment_id, name, tags
            )
        except Exception as exc:
            why = one_line(exc)
            raise TrackingError(f"MLflow store {uri}: cannot create the sweep's run: {why}") from exc
        if not parent.done():  # sweep.json gets the ids once the writer has them
            background.preload(publish_sweep.__module__)  # what the sweep's end runs in the writer
            background.set_sweep_store(sweep_dir, uri, experiment_id, parent)
            write_json_atomic(sweep_dir / SWEEP_FILE, info)
            _sweep_started[sweep_dir] = parent
            exp = experiment_id

            def noted(pid: str) -> None:
                ids = {"parent_run_id": pid, "experiment_id": exp.result(), "tracking_uri": uri}
                write_json_atomic(sweep_dir / SWEEP_FILE, {**info, **ids})

            parent.then(noted)
            return info
        info.update(parent_run_id=parent.result(), experiment_id=experiment_id.result(), tracking_uri=uri)
    try:
        write_json_atomic(sweep_dir / SWEEP_FILE, info)
    except WriteError:
        if "parent_run_id" in info:  # nothing ran: the parent run is not left RUNNING
            with contextlib.suppress(Exception):
                tracking.end_run(uri, info["parent_run_id"], "FAILED")
        raise
    return info


# sweep folder -> its parent run, while the background writer creates it (sweep.json gets its id then)
_sweep_started: dict[Path, background.Pending] = {}


def _basic_launcher(config: DictConfig) -> bool:
    """True when Hydra's basic launcher runs the jobs (one after another, in this process)."""
    target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
    return target.endswith("BasicLauncher")


def _write_failures(sweep_dir: Path, failures: list[Failure]) -> Path:
    path = sweep_dir / FAILURES_FILE
    data = {"failed": bool(failures), "failures": [asdict(f) for f in failures]}
    write_json_atomic(path, data)
    return path


def finish_sweep(
    config: DictConfig,
    plan: Plan,
    returns: Sequence[JobReturn],
    launch_error: BaseException | None = None,
    job_settings: Sequence[RunConfig] = (),
) -> int:
    """:func:`_finish_sweep`; a file it cannot write (a full disk, a read-only folder) stops the sweep
    with one line naming the path and the error (:func:`_stop_on_write_error`), exit 1."""
    try:
        return _finish_sweep(config, plan, returns, launch_error, job_settings)
    except WriteError as exc:
        sweep_dir = _sweep_dir(config)
        with contextlib.suppress(Exception):  # best effort: the store may be on the same disk
            info = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
            if "parent_run_id" in info:  # FAILED, not left RUNNING: resume= finishes the sweep
                tracking.end_run(info["tracking_uri"], info["parent_run_id"], "FAILED")
        return _stop_on_write_error(sweep_dir, plan, exc)


def _stop_on_write_error(sweep_dir: Path, plan: Plan, exc: WriteError) -> int:
    """A write failed at the sweep's end: ``failures.json`` complete (it names the write) or absent,
    never an earlier attempt's; one line on stderr. Returns EXIT_FAILED."""
    failure = Failure("write", "sweep end", one_line(exc), detail=one_line(exc))
    try:
        _write_failures(sweep_dir, [failure])
    except WriteError:
        with contextlib.suppress(OSError):
            (sweep_dir / FAILURES_FILE).unlink(missing_ok=True)
    with contextlib.suppress(Exception):
        profiling.end_sweep_profile()
    finished = len(read_summaries(sweep_dir)) if sweep_dir.is_dir() else 0
    print(
        f"rag_ablate: error: {one_line(exc)}; the sweep stopped after {finished} of {len(plan.jobs)} "
        f"job(s) finished; free space or make the folder writable, then finish it with: "
        f"python -m rag_ablate resume={sweep_dir}",
        file=sys.stderr,
    )
    return EXIT_FAILED


def _finish_sweep(
    config: DictConfig,
    plan: Plan,
    returns: Sequence[JobReturn],
    launch_error: BaseException | None,
    job_settings: Sequence[RunConfig],
) -> int:
    """Everything after the jobs; returns the sweep's exit code: 0, EXIT_FAILED, or EXIT_BLOCKED when
    nothing failed but the regression gate blocked.

    ``job_settings``: every job's settings in job order (:func:`rag_ablate.sweep.plan.check_plan`
    returns them); with them, and ``timing.interleave``, the finished variants are timed again
    side by side before the comparison (:func:`_timing_pass`).

    Whatever failed, the table and the comparison of the jobs that finished are
    still written and logged; each failure is one line on stderr and one entry,
    with its traceback, in ``failures.json``.
    """
    prof = profiling.sweep_profile()
    prof.start("summary")
    s = _settings(config)
    sweep_dir = _sweep_dir(config)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    failures = job_failures(plan, returns)
    if launch_error is not None:
        failures.insert(0, _failure("launch", "launcher", launch_error))

    summaries = read_summaries(sweep_dir)
    print_table(summaries, s.metrics.summary)
    write_text_atomic(sweep_dir / SWEEP_SUMMARY_MD, markdown_table(summaries, s.metrics.summary))
    print(f"\nsweep folder: {sweep_dir}")
    started = _sweep_started.pop(sweep_dir, None)
    if started is not None:  # sweep.json has the parent run's id once the writer created it
        with contextlib.suppress(TrackingError):  # a failure: background.failures() lists it
            started.result()
    info_path = sweep_dir / SWEEP_FILE
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    prof.stop()

    gate_failures: list[str] = []
    done: ComparisonRun | None = None
    report: Report | None = None
    pinned = s.compare.baseline_run is not None  # every job is compared with that earlier run
    baseline_failed = (
        s.compare.baseline is None
        and not pinned
        and any(f.job == job.index for f in failures for job in plan.jobs if job.role == "baseline")
    )
    (sweep_dir / TIMING_FILE).unlink(missing_ok=True)  # a resumed sweep's pass is made again
    comparing = s.compare.enabled and len(plan.jobs) > 1 and not baseline_failed and len(summaries) > 1
    if comparing and s.timing.interleave and job_settings:
        try:
            with prof.stage("timing"):
                _timing_pass(config, plan, job_settings)
        except Exception as exc:  # the comparison still runs, on the jobs' own latencies
            failures.append(_failure("timing", "interleaved timing pass", exc))
    if s.compare.enabled and (len(plan.jobs) > 1 or pinned):
        if baseline_failed:
            failures.append(Failure("comparison", "comparison", "not run: the baseline job failed"))
        elif len(summaries) > (0 if pinned else 1):
            print()
            try:
                with prof.stage("compare"):
                    done = run_comparison(sweep_dir, s.compare, seed=s.seed)
                gate_failures = list(done.failures)
            except Exception as exc:
                failures.append(_failure("comparison", "comparison", exc))
            if done is not None:
                try:  # plots and report.html; a failure here loses nothing else
                    from rag_ablate.report.html import write_report

                    with prof.stage("report"):
                        report = write_report(
                            sweep_dir, done.comparison, done.source.variants, [f.line() for f in failures]
                        )
                    print(f"report: {report.html}")
                except Exception as exc:
                    failures.append(_failure("report", "HTML report", exc))
        else:
            n = len(summaries)
            failures.append(
                Failure("comparison", "comparison", f"not run: {n} of {len(plan.jobs)} job(s) finished")
            )

    if background.active():  # the jobs' logging done: their trace counts, what failed there
        background.drain()
        summaries = read_summaries(sweep_dir)
        failures += [Failure("tracking", WRITER, line) for line in background.failures()]
    n_writer_failures = len(background.failures())
    failures_path = _write_failures(sweep_dir, failures)
    prof.start("log")
    if "parent_run_id" in info:
        uri, run_id = info["tracking_uri"], info["parent_run_id"]
        report_paths = report.paths if report is not None else []
        timing_file = [p for p in [sweep_dir / TIMING_FILE] if p.is_file()]
        try:
            sweep_end = SweepEnd(
                s,
                sweep_dir,
                info,
                summaries,
                comparison=done.comparison if done is not None else None,
                comparison_files=done.paths if done is not None else [],
                variants=done.source.variants if done is not None else [],
                files=[sweep_dir / SWEEP_SUMMARY_MD, info_path, failures_path, *report_paths, *timing_file],
                failed=[f.line() for f in failures],
                n_failed_jobs=sum(1 for f in failures if f.step == "job"),
            )
            published = publish_sweep(
                sweep_end,
                write_profile=lambda: _stop_and_write_profile(prof, sweep_dir, plan),
                status="FAILED" if failures or gate_failures else "FINISHED",
            )
        except Exception as exc:
            failures.append(_failure("tracking", f"MLflow logging to {uri}", exc))
            _write_failures(sweep_dir, failures)
            with contextlib.suppress(Exception):  # the store is gone: the failure above says so
                tracking.end_run(uri, run_id, "FAILED")
        else:
            _wait_for_writer(prof, sweep_dir, plan)
            later = background.failures()[n_writer_failures:]
            failures += [Failure("tracking", WRITER, line) for line in later]
            if later:
                _write_failures(sweep_dir, failures)
                with contextlib.suppress(Exception):  # not left RUNNING or FINISHED
                    tracking.end_run(uri, run_id, "FAILED")
            if published.ok():
                links = published.result()
                print(ui_hint(uri, links.runs_link, s.tracking.ui_port))
                for line in links.trace_links:
                    print(line)
    background.finish()  # nothing left for it (a sweep that logged nothing)
    background.forget()
    if prof.open_stages():  # not logged (tracking off, or the logging failed): the profile still is
        prof.close()
        _write_profile(sweep_dir, plan)
    if done is not None:
        print(f"comparison: {sweep_dir / COMPARISON_MD}  (again: rag-ablate compare {sweep_dir})")

    if failures:
        print(
            f"\nsweep FAILED: {len(failures)} problem(s); details in {failures_path}",
            file=sys.stderr,
        )
        for f in failures:
            print(f"  {f.line()}", file=sys.stderr)
    if done is not None:
        print_gate_outcome(gate_failures, len(s.compare.fail_on))
    done_prof = profiling.read_profile(sweep_dir)
    if done_prof is not None:
        line = profiling.summary_line(
            done_prof["breakdown"],
            peak_mb=float(done_prof.get("peak_mb", 0.0)),
            background=done_prof.get("background"),
        )
        print(f"{line} ({sweep_dir / PROFILE_FILE})")
    profiling.end_sweep_profile()
    if failures:
        return EXIT_FAILED
    return EXIT_BLOCKED if gate_failures else 0


def _wait_for_writer(prof: profiling.Profile, sweep_dir: Path, plan: Plan) -> None:
    """The background writer finishes what it was handed (the sweep's end): the wait is the sweep's
    ``log`` stage's, the writer's own time the profile's ``background``; profile.json written again
    (MLflow has it as it was when handed over)."""
    if not background.active():
        return
    t0, cpu0 = time.perf_counter(), time.process_time()
    background.finish()
    prof.add("log", time.perf_counter() - t0, cpu_s=time.process_time() - cpu0)
    prof.background, prof.writer = background.times(), background.kind()
    _write_profile(sweep_dir, plan)


def _timing_pass(config: DictConfig, plan: Plan, job_settings: Sequence[RunConfig]) -> None:
    """The finished variants' queries timed again, interleaved (:mod:`rag_ablate.run.timing`)."""
    s = _settings(config)
    sweep_dir = _sweep_dir(config)
    jobs = [
        TimingJob(job.label, settings, sweep_dir / str(job.index) / RECORDS_FILE)
        for job, settings in zip(plan.jobs, job_settings, strict=True)
        if (sweep_dir / str(job.index) / RECORDS_FILE).is_file()
        and (sweep_dir / str(job.index) / VARIANT_FILE).is_file()
    ]
    print(f"\ntiming pass: {len(jobs)} variants side by side, {s.timing.repeats} repeat(s)")
    done = timing_pass(
        sweep_dir, jobs, (_cwd(config) / s.paths.output_root).resolve(), repeats=s.timing.repeats, seed=s.seed
    )
    if done.untimed:
        replays = ", ".join(done.untimed)
        print(f"timing pass: skipped: {replays} replay a log (no latency of their own to time)")
        return
    if not done.written:
        print("timing pass: no query was ok in every variant's job; nothing to time")
        return
    failed = f", {done.n_failed} call(s) failed" if done.n_failed else ""
    print(f"timing pass: {done.n_queries} queries interleaved in {done.seconds:.1f}s{failed} ({done.path})")


def _stop_and_write_profile(prof: profiling.Profile, sweep_dir: Path, plan: Plan) -> Path:
    prof.stop()  # the "log" stage: everything but the run's end is logged
    return _write_profile(sweep_dir, plan)


def _write_profile(sweep_dir: Path, plan: Plan) -> Path:
    """The sweep's ``profile.json``: its own stages, each job's, and the whole sweep's breakdown
    (the jobs' stages added up in place of ``jobs``; :func:`rag_ablate.core.profiling.breakdown`)."""
    prof = profiling.sweep_profile()
    prof.close()
    jobs: dict[str, dict[str, Any]] = {}
    for job in plan.jobs:
        found = profiling.read_profile(sweep_dir / str(job.index))
        if found is not None:
            jobs[job.label] = found
    data = prof.to_dict()
    data["jobs"] = jobs
    cpu = profiling.breakdown(data, jobs, key="cpu_s")
    data["breakdown"] = {
        k: {"seconds": v, "cpu_s": cpu.get(k, 0.0)} for k, v in profiling.breakdown(data, jobs).items()
    }
    data["peak_mb"] = max([float(data["peak_mb"]), *(float(j.get("peak_mb", 0.0)) for j in jobs.values())])
    path = sweep_dir / PROFILE_FILE
    write_json_atomic(path, data)
    return path


def interrupt_sweep(config: DictConfig, plan: Plan) -> str:
    """Ctrl-C stopped the sweep: end its parent run and every child still RUNNING as ``KILLED``,
    record the interruption in ``failures.json``; the one line to print.

    Jobs that finished keep their runs and records; ``resume=<sweep folder>`` runs the rest.
    """
    sweep_dir = _sweep_dir(config)
    background.finish()  # what it was handed is done; the runs are ended from here
    background.forget()
    finished = len(read_summaries(sweep_dir)) if sweep_dir.is_dir() else 0
    info_path = sweep_dir / SWEEP_FILE
    info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
    killed = 0
    if "parent_run_id" in info:
        uri, parent = info["tracking_uri"], info["parent_run_id"]
        with contextlib.suppress(Exception):  # best effort: the store may be what hung
            for run_id, _ in tracking.child_runs(uri, parent):
                status = tracking.run_status(uri, run_id)
                if status == "RUNNING":
                    tracking.end_run(uri, run_id, "KILLED")
                # the running job's own Ctrl-C handler has already ended its run KILLED: counted too
                killed += status in ("RUNNING", "KILLED")
            if tracking.run_status(uri, parent) == "RUNNING":
                tracking.end_run(uri, parent, "KILLED")
                killed += 1
    if sweep_dir.is_dir():
        what = f"interrupted (Ctrl-C) after {finished} of {len(plan.jobs)} job(s) finished"
        with contextlib.suppress(WriteError):  # a full disk: the line below still says how to resume
            _write_failures(sweep_dir, [Failure("interrupted", "sweep", what)])
    runs = f"; {killed} MLflow run(s) marked KILLED" if killed else ""
    return (
        f"rag_ablate: interrupted: {finished} of {len(plan.jobs)} job(s) finished{runs}; "
        f"resume with: python -m rag_ablate resume={sweep_dir}"
    )
