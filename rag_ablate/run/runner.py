"""Run one variant: load data, run the target over every query, score, record, log.

Everything a job produces lands in its Hydra output folder first (records.jsonl,
summary.json, intents.md, slices.json/.md, variant.json, config.yaml); MLflow gets a copy. The
sweep-wide steps (summary table, comparison) read these files back, so they work
whatever launcher ran the jobs.

A job creates its MLflow run when it starts (RUNNING; its id in ``run.json``) and
appends each record to records.jsonl as its query completes (before scoring: every record is
scored once the queries are done), so ``resume=`` can finish an interrupted job in the same folder
and run (:mod:`rag_ablate.run.resume`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rag_ablate.config.keys import env_interpolated, is_runtime_key, redact, redact_override
from rag_ablate.config.overrides import override_key
from rag_ablate.config.schema import RunConfig
from rag_ablate.core import privacy, profiling
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import (
    ConfigError,
    ErrorRateError,
    JudgeCalibrationError,
    RunStopError,
    TrackingError,
    WriterError,
)
from rag_ablate.core.fsio import make_dirs, write_json_atomic, write_text_atomic
from rag_ablate.core.layout import (
    CONFIG_FILE,
    INTENTS_JSON,
    INTENTS_MD,
    METRICS_FILE,
    PLAN_FILE,
    PROFILE_FILE,
    RECORDS_FILE,
    REPEATS_JSON,
    SUMMARY_FILE,
    SWEEP_FILE,
    VARIANT_FILE,
)
from rag_ablate.dataset.labels import label_params
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import SPLITS, Dataset, Query
from rag_ablate.dataset.weights import TagWeights
from rag_ablate.dataset.weights import validate as validate_weights
from rag_ablate.judges import JUDGES, Judge
from rag_ablate.judges.calibration import run_calibration
from rag_ablate.metrics.answers import AnswerScoring
from rag_ablate.metrics.intent import intent_report
from rag_ablate.metrics.registry import human_metrics, judged_metrics
from rag_ablate.records.jsonl import RecordWriter, gc_paused, write_records
from rag_ablate.records.repeats import first_runs, has_repeats, repeat_metrics, spreads_json
from rag_ablate.records.scoring import (
    TokenCounts,
    aggregate_counted,
    make_record,
    metric_items,
    score_all,
    weighted_metrics,
)
from rag_ablate.records.trace import Record, Trace, record_key, repeat_key
from rag_ablate.run import cost, resume, slices
from rag_ablate.run.budget import SpendMeter
from rag_ablate.run.export import write_trec
from rag_ablate.run.judging import judge_errors, judge_records, judge_run_metrics
from rag_ablate.run.summary import print_table, ui_hint
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import System, batch_runner
from rag_ablate.tracking import background
from rag_ablate.tracking import store as tracking
from rag_ablate.tracking import traces as mlflow_traces
from rag_ablate.tracking import ui as tracking_ui


@lru_cache(maxsize=4)
def _cached_dataset(
    path: str | None, name: str, holdout_share: float, threshold: float, seed: int
) -> Dataset:
    ds = load_dataset(
        path,
        name=name,
        holdout_share=holdout_share,
        group_threshold=threshold,
        seed=seed,
        human_metrics=human_metrics(),
    )
    if ds.labels.issues:  # quoted evidence that did not match the corpus: say so once per load
        lab = ds.labels
        print(
            f"dataset {ds.name}: evidence labels whose quote moved: {lab.relocated} relocated, "
            f"{lab.stale} stale and {lab.ambiguous} ambiguous (left out); `rag-ablate validate {ds.path}` "
            "lists them and --fix repairs the relocated ones",
            file=sys.stderr,
        )
    return ds


def get_dataset(s: RunConfig) -> Dataset:
    d = s.dataset
    return _cached_dataset(d.path, d.name, d.holdout_share, d.group_threshold, s.seed)


def _strip_quotes(override: str) -> str:
    return override.replace("'", "").replace('"', "")


def variant_label(overrides: list[str]) -> str:
    """A run's name: what it changes (``chunk=256``), or ``baseline``."""
    factors = [_strip_quotes(o) for o in overrides if not is_runtime_key(override_key(o))]
    return ",".join(factors) or "baseline"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def evaluate(
    target: System,
    dataset: Dataset,
    ks: list[int],
    *,
    progress: bool = False,
    label: str = "",
    queries: Sequence[Query] | None = None,
    on_record: Callable[[Record], None] | None = None,
    answers: AnswerScoring | None = None,
    timings: dict[str, float] | None = None,
    meter: SpendMeter | None = None,
    kept: Sequence[Record] = (),
) -> list[Record]:
    """Run every query (or only ``queries``) through the target, then score every record (answers with
    ``answers``): the records of ``kept`` first, in their order, then the new ones in query order.

    A query that raises is recorded with status ``failed`` and its error, never
    dropped or scored as a miss; so is a query whose scoring raises. An endpoint that is down
    (:class:`~rag_ablate.core.errors.EndpointDownError`), or the next query passing ``cost.max_usd``
    (:class:`~rag_ablate.run.budget.SpendLimitError`), stops the whole run instead. Every query
    keeps its elapsed time (``timings_ms["total"]``, the record's ``latency_ms``):
    a failure is timed until it failed, so a timeout cannot improve p95. A
    system's own ``total`` is kept when it reports one.

    ``on_record`` gets each query's record as soon as the query completes, before scoring (its
    ``metrics`` empty, its ``failure_stage`` None): the job's
    :class:`~rag_ablate.records.jsonl.RecordWriter` appends it to ``records.jsonl``, so a killed run
    keeps every finished query (``resume=`` scores them again; the file is rewritten with the scored
    records when the job ends). Every record is scored once the queries are done, one after another:
    scoring each as its query completed, between two retrievals, took a third more CPU (each record's
    labels, token counts and metric code cold again; 0.50 against 0.36 s for 6,000 queries).
    ``kept``: records of an earlier attempt (``resume=``), whose queries are not run again: scored
    again with the rest (records on disk suffice to score them; an earlier attempt's are unscored).
    ``timings["score"]`` (when given) gets the seconds spent making, handing on and scoring the
    records, ``timings["score_cpu"]`` the CPU seconds of that (the thread's own).
    ``meter`` (``cost.max_usd``) is charged with each record's spend and checked before each query.
    """
    todo = dataset.queries if queries is None else queries
    done: dict[str, Record] = {}  # by record key: the query id, with its repeat (system.repeats > 1)
    bar = RunProgress(target, len(todo), label, enabled=progress)
    spent = [0.0, 0.0]  # seconds and CPU seconds of making and handing on the records

    def finish(q: Query, trace: Trace) -> None:
        """One query is final: its record made, handed on, counted (a repeat report is ignored)."""
        key = query_key(q)
        if key in done:
            return
        t_made, cpu_made = time.perf_counter(), time.thread_time()
        rec = done[key] = make_record(q, trace)
        if on_record is not None:
            on_record(rec)
        spent[0] += time.perf_counter() - t_made
        spent[1] += time.thread_time() - cpu_made
        bar.update(rec["status"])
        if meter is not None:  # a system that runs its queries itself stops starting new ones
            meter.charge_record(rec)
            meter.check()

    run_many = batch_runner(target)
    try:
        if run_many is not None:
            # the system runs the queries itself (system=http: concurrently) and reports each when done
            t_batch = time.perf_counter()
            try:
                run_many(todo, finish)
            except RunStopError:
                raise  # the service is down: the run stops (the records so far are on disk)
            except Exception as exc:  # queries it never reported are failed, never dropped
                error = f"{type(exc).__name__}: {exc}"
                total = {"total": (time.perf_counter() - t_batch) * 1000}
                for q in todo:
                    if query_key(q) not in done:
                        finish(q, Trace(q.query_id, status="failed", error=error, timings_ms=dict(total)))
        else:
            for q in todo:
                if meter is not None:
                    meter.check()
                t0 = time.perf_counter()
                try:
                    trace = target.run(q)
                except RunStopError:
                    raise  # an endpoint is down (generator, reranker): the run stops
                except Exception as exc:
                    trace = Trace(q.query_id, status="failed", error=f"{type(exc).__name__}: {exc}")
                elapsed_ms = (time.perf_counter() - t0) * 1000
                trace.timings_ms.setdefault("total", elapsed_ms)
                finish(q, trace)
    finally:
        bar.close()
    t_score, cpu_score = time.perf_counter(), time.thread_time()
    pairs: Iterable[tuple[Record, Query]] = [(done[k], q) for q in todo if (k := query_key(q)) in done]
    if kept:  # the earlier attempt's records first, each with its query
        by_id = {q.query_id: q for q in dataset.queries}
        pairs = [*((r, by_id[r["query_id"]]) for r in kept), *pairs]
    if progress:  # the scoring after the queries has a bar of its own (100,000 records: about 6 s)
        pairs = tqdm(pairs, desc=f"scoring [{label}]", unit="rec", leave=False)
    out = score_all(
        pairs,
        dataset.documents,
        ks,
        # each retrieved chunk is tokenised once per run (context_tokens_at_k); a local system's counts
        # cached with its chunks are used as they are
        tokens=TokenCounts(getattr(target, "chunk_token_counts", None)),
        routed=target.routes_intents,
        answers=answers,
        # a system that generates answers: its failed queries miss the answer metrics too
        answered=bool(getattr(target, "generates_answers", False)),
    )
    if timings is not None:
        timings["score"] = timings.get("score", 0.0) + spent[0] + time.perf_counter() - t_score
        timings["score_cpu"] = timings.get("score_cpu", 0.0) + spent[1] + time.thread_time() - cpu_score
    return out


def repeated(queries: Sequence[Query], repeats: int) -> list[Query]:
    """The runs of a job: each query once, or ``repeats`` times in a row (``system.repeats`` > 1),
    each run carrying its repeat index (its record's ``repeat``, its own model-call cache key)."""
    if repeats <= 1:
        return list(queries)
    return [dataclasses.replace(q, repeat=r) for q in queries for r in range(repeats)]


def query_key(q: Query) -> str:
    """A run's record key (:func:`~rag_ablate.records.trace.record_key` of the record it makes)."""
    return repeat_key(q.query_id, q.repeat)


class RunProgress:
    """The querying progress bar: queries done, live ok and failed counts, requests per second.

    Requests come from the system's ``requests_sent`` counter when it has one
    (system=http counts retries too); otherwise the rate is queries per second.
    """

    def __init__(self, target: System, total: int, label: str, *, enabled: bool) -> None:
        self.target = target
        self.ok = 0
        self.failed = 0
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total, desc=f"querying [{label}]", unit="q", disable=not enabled, leave=False)

    def update(self, status: str) -> None:
        if status == "ok":
            self.ok += 1
        else:
            self.failed += 1
        if self.bar.disable:  # progress=false: the counts only (formatting them cost 10 us a query)
            return
        # the counts formatted only when the bar may redraw (tqdm's own test, on its clock: its
        # minimum interval since the last redraw), so the line it draws shows this query's counts
        due = time.time() - self.bar.last_print_t >= self.bar.mininterval
        if due or self.ok + self.failed == self.bar.total:
            sent = getattr(self.target, "requests_sent", None)
            count = sent if isinstance(sent, int) else self.ok + self.failed
            rate = count / max(time.perf_counter() - self.t0, 1e-9)
            counts = {"ok": self.ok, "failed": self.failed, "req/s": f"{rate:.1f}"}
            self.bar.set_postfix(counts, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _ends_run_on_error(
    fn: Callable[[DictConfig, RunConfig, profiling.Profile], float | None],
) -> Callable[[DictConfig, RunConfig], float | None]:
    """A job that raises ends the MLflow run it started (FAILED, or KILLED on Ctrl-C).

    The job's stage profile (:mod:`rag_ablate.core.profiling`) is created here and its memory
    sampler stopped however the job ends.
    """

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig, s: RunConfig) -> float | None:
        prof = profiling.Profile("job")
        # the interpreter's start-up and imports, for the first job of a process (a sweep's
        # driver counts them in the sweep's own profile instead)
        prof.add("imports", *profiling.claim_startup())
        try:
            return fn(cfg, s, prof)
        except BaseException as exc:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            background.drain()  # the run the writer was creating is in run.json then
            resume.end_interrupted(Path(HydraConfig.get().runtime.output_dir), status)
            raise
        finally:
            prof.close()

    return wrapper


@dataclass
class _Job:
    """Who this job is: its folder, label, overrides and place in the sweep's plan."""

    label: str
    job_dir: Path
    cwd: Path
    output_root: Path
    overrides: list[str]  # as typed, values read from the environment as ${oc.env:NAME}
    choices: dict[str, str]
    multirun: bool
    num: int
    sweep_dir: Path | None
    ablation: dict[str, Any]  # role, factor, level, mode
    env_values: dict[str, str]  # values read from the environment: never stored
    followed: bool = False  # another job of the sweep's plan comes after this one


@dataclass
class _Inputs:
    """What the queries run over, built before any query runs (a bad setting costs nothing)."""

    dataset: Dataset
    tag_weights: TagWeights
    kept: dict[str, Record]  # resume=: the ok records of the attempt being resumed
    cache: Cache
    answers: AnswerScoring
    guard: privacy.Privacy
    judge: Judge | None
    meter: SpendMeter | None  # cost.max_usd, charged with what the kept records spent


@dataclass
class _Outcome:
    """What the queries (and the judge) produced."""

    records: list[Record]  # one final record per query, in dataset order, with the full text
    stored: list[Record]  # the stored form (privacy.store_text / redact)
    build_info: dict[str, Any]
    routes_intents: bool
    wall: float = 0.0  # seconds from loading the dataset to the last record


@_ends_run_on_error
@privacy.scoped  # privacy.store_text=false: error messages quote no response bodies
def run_variant(cfg: DictConfig, s: RunConfig, prof: profiling.Profile) -> float | None:
    """One job: the variant's records, metrics and files in its folder, logged to MLflow.

    ``s`` is ``cfg`` checked (:func:`rag_ablate.settings.to_settings`, done by the caller, which knows
    every registry); ``prof`` gets the wall seconds and peak memory of each stage (``profile.json``).
    The stages below run in order; MLflow is written three times: the run is created (RUNNING) when the
    job starts (by the background writer, if there is one, while the job goes on; ``run.json``
    names it at once), so ``resume=`` and the orphan check can find it; the per-query traces are
    handed over once the records are final (:func:`_log_traces`), and everything else is logged by
    :func:`_log_job` at the end.
    """
    t_setup = time.perf_counter()
    job = _identify(cfg, s)
    prof.add("config", time.perf_counter() - t_setup)

    with prof.stage("store"):
        # the MLflow store is opened before anything is spent: an unusable one fails at once
        store = _open_store(s, job.output_root, job.sweep_dir)
        # resume=: what an earlier attempt left (its run, its ok records); a changed config is refused
        prior = resume.load_job(job.job_dir, s, job.env_values) if s.resume else resume.JobState()
        if prior.finished:
            print(f"{job.label}: finished earlier with every query ok, nothing to resume ({job.job_dir})")
            earlier = prior.summary.get("metrics", {}).get("holdout/recall_at_5")
            return None if earlier is None else float(earlier)
        run_id = _start_run(store, s, job.job_dir, job.label, prior, job.env_values)
        if not job.multirun and not s.resume:  # a sweep keeps one copy, in its own folder
            resume.save_config_dir(HydraConfig.get().runtime.config_sources, job.job_dir)

    t_start = time.perf_counter()
    started_ns = time.time_ns()  # wall clock: the per-query traces replay their timings from here
    with prof.stage("load"):
        inputs = _load_inputs(s, job)
    out = _run_queries(s, job, inputs, prof, ready=lambda: _run_created(job, run_id))
    out.wall = time.perf_counter() - t_start  # loading, querying and judging
    n_traces = background.Pending.known(0)
    if store is not None and run_id is not None:
        # the records are final: the background writer logs their traces while this process writes
        # and scores the run
        with prof.stage("log"):
            first = first_runs(out.stored)
            n_traces = _log_traces(store, run_id, s, job, first, inputs.dataset, started_ns, _hand(job))
    with prof.stage("write"):
        _write_records(job, inputs.dataset, out)
    with prof.stage("score"), gc_paused():  # the aggregate metrics, cost, slices
        metrics, slice_logged, calibration_error = _score_run(s, job, inputs, out, prof)
    with prof.stage("write"):
        _write_job_files(cfg, job, inputs.dataset, metrics)

    # a stage over its error budget: everything is still written and logged, then the run is FAILED
    over_budget = budget_breaches(s, metrics, out.records)
    final_status = "FAILED" if over_budget or calibration_error else "FINISHED"
    if store is not None:
        _log_job(store, run_id, s, job, inputs, out, metrics, slice_logged, prof, final_status)
    else:
        prof.write(job.job_dir)
    n_failed = sum(1 for r in out.records if r["status"] != "ok")
    summary = {
        "label": job.label,
        "run_id": run_id.value_or_none() if run_id is not None else None,
        "traces": n_traces.result() if n_traces.ok() else 0,  # per-query MLflow traces logged
        "metrics": metrics,
        "n_failed": n_failed,
        "build": out.build_info,
        "job_dir": str(job.job_dir),
    }
    write_json_atomic(job.job_dir / SUMMARY_FILE, summary)
    if not n_traces.done():  # the background writer logs them: the count once it has
        n_traces.then(lambda n: write_json_atomic(job.job_dir / SUMMARY_FILE, {**summary, "traces": n}))

    if not job.multirun:
        _finish_writer(job, prof)
        print_table([summary], s.metrics.summary)
        print(f"\nrecords: {job.job_dir / RECORDS_FILE}")
        print(f"{prof.line()} ({job.job_dir / PROFILE_FILE})")
        if store is not None:
            print(ui_hint(store.uri, port=s.tracking.ui_port))
    if calibration_error is not None:
        raise JudgeCalibrationError(
            f"{job.label}: the judge calibration against the dataset's human_judgements failed "
            f"({calibration_error}); everything else is written and logged, the run is marked FAILED "
            f"({job.job_dir})"
        )
    if over_budget:
        raise ErrorRateError(
            f"{job.label}: {'; '.join(over_budget)} "
            f"(run marked FAILED; records: {job.job_dir / RECORDS_FILE})"
        )
    return metrics.get("holdout/recall_at_5")


def _finish_writer(job: _Job, prof: profiling.Profile) -> None:
    """A single run waits for the background writer (:mod:`rag_ablate.tracking.background`) to log
    everything: the wait is its ``log`` stage's, the writer's own time the profile's ``background``;
    a call that failed there fails the run (TrackingError naming it)."""
    if not background.active():
        return
    t0, cpu0 = time.perf_counter(), time.process_time()
    failed = background.finish()
    prof.add("log", time.perf_counter() - t0, cpu_s=time.process_time() - cpu0)
    prof.background, prof.writer = background.times(), background.kind()
    background.forget()
    prof.write(job.job_dir)  # MLflow has the profile as it was when handed over
    if failed:
        why = "; ".join(failed)
        raise WriterError(f"{job.label}: MLflow logging failed in the background writer: {why}")


def _most_common(errors: Sequence[str]) -> str:
    """The most frequent error text, as ``most common error (n x): <its first 200 characters>``."""
    if not errors:
        return ""
    text, n = Counter(errors).most_common(1)[0]
    first = " ".join(text.split())
    return f"; most common error ({n}x): {first[:200]}{'...' if len(first) > 200 else ''}"


def budget_breaches(s: RunConfig, metrics: Mapping[str, float], records: Sequence[Record]) -> list[str]:
    """One line per stage over its error budget (empty: every stage within it).

    The system's: the share of failed queries (``all/error_rate``; a generator's or reranker's failure
    fails its query) against ``system.max_error_rate``. The judge's: the largest share of failed
    judgements of a judged metric (``judge/<metric>/error_rate``) against ``judge.max_error_rate``.
    Each line names the stage, the counts, the budget and the most common error (which names the
    endpoint when a call failed).
    """
    lines = []
    error_rate = metrics.get("all/error_rate", 0.0)
    if error_rate > s.system.max_error_rate:
        failed = [r for r in records if r["status"] != "ok"]
        statuses = ", ".join(
            f"{k.removeprefix('all/n_status_')} {int(v)}"
            for k, v in sorted(metrics.items())
            if k.startswith("all/n_status_")
        )
        lines.append(
            f"{len(failed)} of {len(records)} queries failed ({statuses}); error rate {error_rate:.3f} > "
            f"system.max_error_rate={s.system.max_error_rate}"
            + _most_common([str(r.get("error")) for r in failed])
        )
    judge_rates = {m: v for m in judged_metrics() if (v := metrics.get(f"judge/{m}/error_rate")) is not None}
    if judge_rates:
        worst = max(judge_rates, key=lambda m: judge_rates[m])
        if judge_rates[worst] > s.judge.max_error_rate:
            errors = judge_errors(records, worst)
            n = int(metrics.get(f"judge/{worst}/n_queries", 0))
            lines.append(
                f"judge ({s.judge.name}, {s.judge.base_url}): {judge_rates[worst]:.3f} of the {worst} "
                f"judgements of {n} answers failed > judge.max_error_rate={s.judge.max_error_rate}"
                f"{_most_common(errors)}"
            )
    return lines


def _identify(cfg: DictConfig, s: RunConfig) -> _Job:
    """The job's folder, label and place in the sweep, from Hydra's runtime config."""
    hc = HydraConfig.get()
    cwd = Path(hc.runtime.cwd)
    # values read from the environment (Hydra hands overrides over resolved) and header values are
    # never stored: not in labels, variant.json, run.json, config.yaml or MLflow
    env_values = env_interpolated(cfg)
    overrides = [redact_override(o, env_values) for o in hc.overrides.task]
    choices = {
        k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and v is not None
    }
    multirun = hc.mode == RunMode.MULTIRUN
    entry = job_entry(Path(hc.sweep.dir), int(hc.job.num)) if multirun else None
    followed = entry is not None and job_entry(Path(hc.sweep.dir), int(hc.job.num) + 1) is not None
    return _Job(
        label=entry["label"] if entry else variant_label(overrides),
        job_dir=Path(hc.runtime.output_dir),
        cwd=cwd,
        output_root=(cwd / s.paths.output_root).resolve(),
        overrides=overrides,
        choices=choices,
        multirun=multirun,
        num=int(hc.job.num) if multirun else 0,
        sweep_dir=Path(hc.sweep.dir) if multirun else None,
        ablation={
            "role": entry["role"] if entry else ("variant" if multirun else "single"),
            "factor": entry.get("factor") if entry else None,
            "level": entry.get("level") if entry else None,
            "mode": s.ablation.mode if entry else "none",
        },
        env_values=env_values,
        followed=followed,
    )


def _load_inputs(s: RunConfig, job: _Job) -> _Inputs:
    """The dataset (checked against the production mix's tags), the cache, scoring, privacy, judge."""
    dataset = get_dataset(s)
    # the production mix: its tags must exist in the data (checked before anything is spent)
    tag_weights = TagWeights.from_config(s.dataset)
    tag_lists = [q.tags for q in dataset.queries]
    for warning in validate_weights(tag_weights, tag_lists, f"dataset {dataset.path}"):
        print(f"warning: {warning}", file=sys.stderr)
    kept = resume.kept_records(job.job_dir, {q.query_id for q in dataset.queries}) if s.resume else {}
    if not s.resume:
        (job.job_dir / RECORDS_FILE).unlink(missing_ok=True)
    cache_dir = Path(s.cache.dir) if s.cache.dir else job.output_root / "cache"
    cache = Cache(cache_dir, enabled=s.cache.enabled)
    return _Inputs(
        dataset=dataset,
        tag_weights=tag_weights,
        kept=kept,
        cache=cache,
        answers=AnswerScoring.from_config(s.metrics, s.generator),
        # what of the text is stored (privacy.store_text, privacy.redact): every record passes it on its
        # way to disk; metrics are computed from the full record first (README "Confidential corpora")
        guard=privacy.Privacy.from_config(s.privacy),
        # the LLM judge (None: judge=none) is built before any query runs, so a bad setting costs nothing
        judge=JUDGES.get(s.judge.name)(s, cache),
        meter=SpendMeter.from_settings(s, kept.values()),
    )


def _run_created(job: _Job, run_id: background.Pending | None) -> None:
    """Before the first query, without waiting for the background writer: a store that has already
    turned out unusable stops the job here, before anything is spent (TrackingError naming it).

    The run is not waited for: ``run.json`` already names the id it gets and its store
    (:func:`_start_run`), so a job killed before the writer has created it is still found by
    ``resume=``, which creates it under that id; a creation that fails later fails the job at its
    end (:func:`_finish_writer`; a sweep's end lists it), the records kept for ``resume=``."""
    if run_id is not None and run_id.done() and not run_id.ok():
        raise TrackingError(f"{job.label}: MLflow: {'; '.join(background.failures())}")


def _run_queries(
    s: RunConfig, job: _Job, inputs: _Inputs, prof: profiling.Profile, ready: Callable[[], None]
) -> _Outcome:
    """Build and prepare the system, run every query not kept by resume=, then the pointwise judge.

    Each record is appended to records.jsonl as its query completes, before scoring (resume= keeps
    them); every record, the kept ones too, is scored once the queries are done (:func:`evaluate`).
    ``ready()`` is called once the system is prepared, before the first query."""
    dataset, guard, judge = inputs.dataset, inputs.guard, inputs.judge
    timings: dict[str, float] = {}
    try:
        with prof.stage("index"):  # the system is built and prepared (chunks, indexes, models)
            target = SYSTEMS.get(s.system.name)(s, inputs.cache)
        try:
            with prof.stage("index"):
                build_info = target.prepare(dataset)
            write_files = getattr(target, "write_files", None)  # a system's own files (system=replay)
            if write_files is not None:
                make_dirs(job.job_dir)
                write_files(job.job_dir)
            ready()
            with prof.stage("query"), RecordWriter(job.job_dir / RECORDS_FILE) as writer:
                runs = repeated(dataset.queries, s.system.repeats)
                todo = [q for q in runs if query_key(q) not in inputs.kept]
                new = evaluate(
                    target,
                    dataset,
                    s.metrics.ks,
                    progress=s.progress,
                    label=job.label,
                    queries=todo,
                    on_record=lambda rec: writer.write(guard.record(rec)),
                    answers=inputs.answers,
                    timings=timings,
                    meter=inputs.meter,
                    kept=list(inputs.kept.values()),
                )
        finally:
            target.close()
        # the records made and scored within the query stage: that time is scoring's, not querying's
        prof.move("query", "score", timings.get("score", 0.0), timings.get("score_cpu"))
        # one final record per query, in dataset order (the write stage rewrites the file so)
        latest = {record_key(r): r for r in new}
        records = [latest[query_key(q)] for q in runs]
        if judge is not None and judge.mode == "pointwise":
            # the judge phase: every answer without a judgement (resume= kept the earlier ones) is
            # judged and scored again, appended as it completes (rag_ablate.run.judging)
            with prof.stage("judge"), RecordWriter(job.job_dir / RECORDS_FILE) as writer:
                records = judge_records(
                    records,
                    judge,
                    dataset,
                    ks=s.metrics.ks,
                    routed=target.routes_intents,
                    answers=inputs.answers,
                    max_contexts=s.judge.max_contexts,
                    concurrency=s.judge.concurrency,
                    progress=s.progress,
                    label=job.label,
                    on_record=lambda rec: writer.write(guard.record(rec)),
                    meter=inputs.meter,
                )
    finally:
        if judge is not None:
            judge.close()
    # the stored form of every record (without text, or redacted); the metrics that need the text
    # (the judge's length bias) still read the full records
    stored = [guard.record(r) for r in records]
    return _Outcome(records, stored, build_info, target.routes_intents)


def _write_records(job: _Job, dataset: Dataset, out: _Outcome) -> None:
    """records.jsonl rewritten with exactly one record per query, and the TREC run and qrels."""
    make_dirs(job.job_dir)
    write_records(job.job_dir / RECORDS_FILE, out.stored)
    write_trec(first_runs(out.stored), dataset, job.job_dir, job.label)  # a TREC run ranks each query once


def _score_run(
    s: RunConfig, job: _Job, inputs: _Inputs, out: _Outcome, prof: profiling.Profile
) -> tuple[dict[str, float], dict[str, float], str | None]:
    """The run's metrics (per split, cost, judge, privacy, headline), the intent report and the slices.

    Returns the metrics, the bounded slice metrics MLflow gets, and why the judge calibration failed
    (None when it did not): everything else is still written and logged, then the run fails."""
    records, dataset = out.records, inputs.dataset
    items = [metric_items(r) for r in records]  # each record's values, read once for the run and its slices
    whole = aggregate_counted(records, items=items)  # also a slice of every record's (a dataset's one tag)
    metrics = {**whole[0], **weighted_metrics(records, inputs.tag_weights)}  # <split>/prod/, <split>/edge/
    metrics["run/wall_seconds"] = out.wall
    # whatever numeric facts the system reported (index size, build time, ...) as run/<key>
    metrics.update(
        {
            "run/" + key.replace(".", "_"): float(value)
            for key, value in out.build_info.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
    )
    metrics.update(inputs.cache.metrics())
    metrics.update(cost.cache_hit_rates(metrics))
    # cost from per-query values (percentiles of end-to-end and stage times, tokens, money)
    price = s.cost.prices.get(s.cost.model) if s.cost.model else None
    metrics.update(cost.run_cost_metrics(records, SPLITS, price=price))
    # the judge's agreement, spread, length bias, errors, calls, tokens and money: evaluation cost,
    # kept under judge/ apart from the system's cost/
    judge_model = inputs.judge.model if inputs.judge is not None else s.judge.model
    metrics.update(judge_run_metrics(records, price=s.cost.prices.get(judge_model) if judge_model else None))
    # the judge against people: the dataset's human_judgements, judged and compared (pointwise judge
    # only); judge_calibration.json/.md in the job folder, judge/<metric>/human_* metrics
    calibration_error: str | None = None
    try:
        with prof.stage("judge"):
            metrics.update(run_calibration(s, dataset, inputs.cache, metrics, job.job_dir))
    except Exception as exc:  # everything else is still written and logged; then the run fails
        calibration_error = f"{type(exc).__name__}: {exc}"
    metrics.update(inputs.guard.run_metrics(out.stored))  # privacy/redacted_<kind>: what redaction hid
    quality = tracking_ui.quality_metric(s.metrics.summary)
    metrics.update(tracking_ui.headline_metrics(metrics, quality))
    # system.repeats > 1: the spread over each query's repeats (repeats.json) and the run's (repeats/)
    metrics.update(repeat_metrics(records))
    if has_repeats(records):
        write_json_atomic(job.job_dir / REPEATS_JSON, spreads_json(records))
    _write_intents(job, dataset, out)
    # every metric per tag and per gold intent (slices.json/.md); MLflow gets a bounded few of them
    slice_table = slices.slice_metrics(records, items, whole)
    slices.write_slices(slice_table, job.job_dir, s.metrics.summary)
    return metrics, slices.mlflow_slice_metrics(slice_table, quality), calibration_error


def _write_intents(job: _Job, dataset: Dataset, out: _Outcome) -> None:
    """intents.md / intents.json; intent accuracy needs a routed query that did not fail (else absent)."""
    by_id = {q.query_id: q for q in dataset.queries}
    cases = [
        (by_id[r["query_id"]].intent_l1, gold, r["intent_pred"])
        for r in out.records
        if (gold := r["intent_gold"]) is not None and r["status"] == "ok"
    ]
    if not (out.routes_intents and cases):
        return
    report = intent_report(cases)
    write_text_atomic(job.job_dir / INTENTS_MD, report.to_markdown())
    write_json_atomic(job.job_dir / INTENTS_JSON, report.to_dict())


def _write_job_files(cfg: DictConfig, job: _Job, dataset: Dataset, metrics: Mapping[str, float]) -> None:
    """metrics.json, config.yaml (secrets redacted) and variant.json."""
    write_json_atomic(job.job_dir / METRICS_FILE, metrics, sort_keys=True)
    # header values never stored; values read from the environment stored as ${oc.env:NAME}
    resolved = redact(OmegaConf.to_container(cfg, resolve=True), env=job.env_values)
    write_text_atomic(job.job_dir / CONFIG_FILE, OmegaConf.to_yaml(resolved))
    variant = {
        "label": job.label,
        "overrides": job.overrides,
        "choices": job.choices,
        "job_num": job.num,
        **job.ablation,
        "dataset": dataset.name,
        "corpus_fingerprint": dataset.corpus_fingerprint,
        "queries_fingerprint": dataset.queries_fingerprint,
    }
    write_json_atomic(job.job_dir / VARIANT_FILE, variant)


def _log_job(
    store: _Store,
    run_id: background.Pending | None,
    s: RunConfig,
    job: _Job,
    inputs: _Inputs,
    out: _Outcome,
    metrics: dict[str, float],
    slice_logged: Mapping[str, float],
    prof: profiling.Profile,
    final_status: str,
) -> None:
    """Everything a job logs to MLflow at its end, in one place: params, tags, metrics and the job
    folder as artifacts, then the profile (this logging's time included) and the run's end status;
    done by the background writer when there is one (the per-query traces were handed to it
    before: :func:`_log_traces`)."""
    hand = _hand(job)
    with prof.stage("log"):
        logged = _log_to_mlflow(
            store,
            job.ablation,
            s,
            job.cwd,
            job.job_dir,
            job.label,
            job.choices,
            inputs.dataset,
            out.build_info,
            metrics,
            run_id=run_id,
            final_status=None,  # ended below, once the profile (with this logging's time) is logged
            extra_metrics=slice_logged,
            judge_prompt_hash=inputs.judge.prompt_hash if inputs.judge is not None else None,
            env_values=job.env_values,
            hand=hand,
        )
    prof.write(job.job_dir)
    # time/<stage>_s and memory/peak_mb, profile.json; then the run ends
    hand(
        f"ending the run of {job.label}",
        "log",
        tracking.finish_run,
        store.uri,
        logged,
        prof.metrics(),
        [job.job_dir / PROFILE_FILE],
        status=final_status,
    )


def _hand(job: _Job) -> Callable[..., background.Pending]:
    """How a job hands its logging to the background writer when there is one: a job another job
    follows hands it over after that job's start, so the next run is created first rather than
    after this logging."""
    return background.call_later if job.followed else background.call


def _start_run(
    store: _Store | None,
    s: RunConfig,
    job_dir: Path,
    label: str,
    prior: resume.JobState,
    env_values: Mapping[str, str] | None = None,
) -> background.Pending | None:
    """Create the job's MLflow run (RUNNING) when it starts, or reopen the run of the
    attempt being resumed; the run id (and the config) go to the job's ``run.json`` (once the
    background writer has created the run, when it creates it)."""
    run_id: background.Pending | None = None
    chosen: str | None = None
    if store is not None:
        if prior.run_id and prior.tracking_uri not in (None, store.uri):
            raise ConfigError(
                f"resume: the run of {job_dir} ({prior.run_id}) is tracked in {prior.tracking_uri}, "
                f"not in {store.uri}; resume it with the same tracking settings"
            )
        if prior.run_id:
            # a run the store lacks (killed before the background writer created it) is created first
            parent = background.value(store.parent_run_id)
            created_as = (background.value(store.experiment_id), label, parent)
            tracking.reopen_run(store.uri, prior.run_id, create_as=created_as)
            run_id = background.Pending.known(prior.run_id)
        else:
            # the background writer creates it as named here, so run.json has its id before any query
            chosen = uuid.uuid4().hex if background.active() else None
            run_id = background.call(
                f"creating the run of {label}",
                "store",
                tracking.start_run,
                store.uri,
                store.experiment_id,
                label,
                store.parent_run_id,
                run_id=chosen,
            )
    uri = store.uri if store is not None else prior.tracking_uri
    known = run_id.result() if run_id is not None and run_id.done() else chosen
    resume.write_run_file(job_dir, s, known or prior.run_id, uri, env_values)
    if run_id is not None and not run_id.done():
        run_id.then(lambda rid: resume.write_run_file(job_dir, s, rid, uri, env_values))
    return run_id


def resolve_tracking(s: RunConfig, output_root: Path) -> tuple[str, Path | None]:
    """The tracking URI and artifact root of a run (see :func:`rag_ablate.tracking.store.resolve`)."""
    return tracking.resolve(s.tracking, output_root)


@dataclass(frozen=True)
class _Store:
    uri: str
    experiment_id: str | background.Pending  # Pending: the background writer opens the store
    parent_run_id: str | background.Pending | None


def _open_store(s: RunConfig, output_root: Path, sweep_dir: Path | None) -> _Store | None:
    """Where this run logs: the sweep's parent run (opened by the sweep driver), or a
    store opened here; None without tracking. Raises TrackingError for an unusable store."""
    if not s.tracking.enabled:
        return None
    tracking.set_budget(s.tracking.timeout_s)
    noted = background.sweep_store(sweep_dir) if sweep_dir is not None else None
    if noted is not None:  # the sweep's store and run, as the background writer makes them
        return _Store(*noted)
    if sweep_dir is not None and (sweep_dir / SWEEP_FILE).is_file():
        info = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
        if info.get("parent_run_id"):
            return _Store(info["tracking_uri"], info["experiment_id"], info["parent_run_id"])
    if s.resume or sweep_dir is not None:  # runs reopened here; a sweep's job of another launcher
        background.release()
    uri, artifacts = resolve_tracking(s, output_root)
    experiment_id = background.open_store(
        uri, s.tracking.experiment, artifacts, create_folder=s.tracking.uri is None
    )
    return _Store(uri, experiment_id if not experiment_id.done() else experiment_id.result(), None)


def _log_traces(
    store: _Store,
    run_id: background.Pending,
    s: RunConfig,
    job: _Job,
    records: list[Record],
    dataset: Dataset,
    started_ns: int,
    hand: Callable[..., background.Pending] = background.call,
) -> background.Pending:
    """Per-query traces under the run (rag_ablate.tracking.traces), one per query (its first run:
    with system.repeats > 1 repeats.json has the spread), once the records are final. The traced
    queries are picked here, so only they (not every record and the corpus) go to
    the background writer.

    Traces are a view of records.jsonl: a failure here is reported, the run is kept.
    """
    per_split = mlflow_traces.parse_setting(s.tracking.traces)
    if per_split == 0:
        return background.Pending.known(0)
    try:
        traced = mlflow_traces.trace_set(
            records,
            dataset,
            per_split=per_split,
            start_ns=started_ns,
            seed=s.seed,
            privacy=privacy.Privacy.from_config(s.privacy),  # ids only, or redacted passages
        )
    except Exception as exc:
        mlflow_traces.warn_not_logged(exc)
        return background.Pending.known(0)
    price = s.cost.prices.get(s.cost.model) if s.cost.model else None
    return hand(
        "logging the per-query traces",
        "log",
        mlflow_traces.log_traces_or_warn,
        store.uri,
        store.experiment_id,
        run_id,
        traced,
        variant=_run_name(job.ablation, job.job_dir, job.label),
        metrics=s.compare.metrics,
        seed=s.seed,
        usd=None if price is None else functools.partial(cost.query_usd_parts, price=price),
        model=s.cost.model,
        per_split_runs=store.parent_run_id is not None,  # a sweep's job: compared with its baseline
        first=mlflow_traces.shown_first(s.compare.quality_metric),  # the quality axis first in MLflow
    )


def _run_name(ablation: Mapping[str, Any], job_dir: Path, label: str) -> str:
    """The name of a job's MLflow run: its label, and for a sweep's baseline what the baseline is
    ("baseline (chunk=512)")."""
    if ablation["role"] == "baseline":
        plan_path = job_dir.parent / PLAN_FILE
        if plan_path.is_file():
            factors = json.loads(plan_path.read_text(encoding="utf-8")).get("factors") or []
            return tracking_ui.baseline_run_name(factors)
    return label


def _log_to_mlflow(
    store: _Store,
    ablation: dict[str, Any],
    s: RunConfig,
    cwd: Path,
    job_dir: Path,
    label: str,
    choices: dict[str, str],
    dataset: Dataset,
    build_info: dict[str, Any],
    metrics: dict[str, float],
    run_id: background.Pending | None = None,
    final_status: str | None = "FINISHED",
    judge_prompt_hash: str | None = None,
    extra_metrics: Mapping[str, float] | None = None,
    env_values: Mapping[str, str] | None = None,
    hand: Callable[..., background.Pending] = background.call,
) -> background.Pending:
    # header values (API keys) and values read from the environment never reach MLflow
    params = redact(flatten(asdict(s)), env=env_values)
    params.pop("resume", None)  # how this attempt was started, not what the run is
    params["dataset.resolved_path"] = str(dataset.path)
    # how far the quoted evidence labels had to be repaired at load (docs/dataset-format.md, "Quotes")
    params.update(label_params(dataset.labels))
    if s.generator.name == "openai":  # the prompt's version: a hash of its templates
        from rag_ablate.generators.openai import prompt_hash

        params["generator.prompt_hash"] = prompt_hash(s.generator)
    if judge_prompt_hash is not None:  # the judge's version: a hash of its templates and rubric
        params["judge.prompt_hash"] = judge_prompt_hash
    tags = tracking.base_tags(cwd)
    # params are inputs only: what the system reported (index size, build time, ...) is an output,
    # numbers as run/ metrics (run_variant), the rest (resolved unit, language) as build.* tags
    tags.update(
        {
            f"build.{k}": str(v)
            for k, v in build_info.items()
            if not (isinstance(v, int | float) and not isinstance(v, bool))
        }
    )
    name = _run_name(ablation, job_dir, label)
    if name != label:
        tags["mlflow.runName"] = name
    tags.update({f"choice.{k}": v for k, v in choices.items()})
    tags["dataset.name"] = dataset.name
    tags["dataset.corpus_fingerprint"] = dataset.corpus_fingerprint
    tags["dataset.queries_fingerprint"] = dataset.queries_fingerprint
    tags["variant"] = label
    tags["ablation.role"] = str(ablation["role"])
    tags["ablation.mode"] = str(ablation["mode"])
    tags["ablation.factor"] = (
        "baseline" if ablation["role"] == "baseline" else str(ablation["factor"] or label)
    )
    tags["ablation.level"] = "baseline" if ablation["role"] == "baseline" else str(ablation["level"] or label)
    return hand(
        f"logging the run of {label}",
        "log",
        tracking.log_run,
        store.uri,
        store.experiment_id,
        label,
        params=params,
        # per split only the metrics the tables and the comparison use; the full grid is in metrics.json
        # plus ``extra_metrics``: the bounded slice metrics (rag_ablate.run.slices.mlflow_slice_metrics)
        metrics={
            **tracking_ui.mlflow_metrics(metrics, [*s.metrics.summary, *s.compare.metrics]),
            **(extra_metrics or {}),
        },
        tags=tags,
        artifacts_dir=job_dir,
        parent_run_id=store.parent_run_id,
        run_id=run_id,
        final_status=final_status,
    )


def job_entry(sweep_dir: Path, job_num: int) -> dict[str, Any] | None:
    """This job's entry of the sweep's plan, or None when the sweep has no plan."""
    path = sweep_dir / PLAN_FILE
    if not path.is_file():
        return None
    jobs = json.loads(path.read_text(encoding="utf-8"))["jobs"]
    if not 0 <= job_num < len(jobs):
        return None
    entry = jobs[job_num]
    return entry if isinstance(entry, dict) else None
