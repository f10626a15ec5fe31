"""The interleaved timing pass: latency measured so that drift cannot pass for an effect.

A sweep's jobs run one after another (or on other machines), so whatever changes between
them (the machine's load, a cache, the service under test) lands on one variant's latency
and not on the other's. After the jobs, the sweep's driver calls :func:`timing_pass`: every
finished variant's system is built side by side in one process (the local pipeline's
indexes come from the cache; system=http variants of one service share one warm
connection) and warmed up, then the queries are timed in randomised blocks: a block is
one query answered
by every variant, one call at a time, in a random order; the queries come in a random
order, ``timing.repeats`` times. Two variants' times of one query are taken moments apart,
and which of them goes first is a coin flip, so drift and order effects fall on both sides
alike: an A/A sweep (one configuration run twice) shows a significant latency effect in
about alpha of sweeps (benchmarks/bench_aa_timing.py).

Each call is one line of ``timing.jsonl`` in the sweep folder (:func:`read_timing` reads it
back): variant, query id, repeat, the variant's position in its block, ``latency_ms`` (the
trace's ``timings_ms.total``, as in a job's records) and the status. A failed call keeps
its status, so the comparison never counts a failure as a fast answer. The comparison's
latency rows use these paired times when the file is there
(:func:`rag_ablate.compare.timing.apply_timing`); each job's own latencies (what its run
experienced, under ``system.concurrency``) stay in its records and tables.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.core.layout import TIMING_FILE
from rag_ablate.dataset.model import Query
from rag_ablate.records.jsonl import final_records, read_records
from rag_ablate.records.trace import Trace
from rag_ablate.run.runner import get_dataset
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.base import System


@dataclass
class TimedCall:
    """One query answered by one variant in the timing pass (a line of ``timing.jsonl``)."""

    variant: str
    query_id: str
    repeat: int
    position: int  # the variant's turn within its block (0 = first)
    latency_ms: float
    status: str


def interleave(
    systems: Mapping[str, System],
    queries: Sequence[Query],
    *,
    repeats: int,
    seed: int,
    on_trace: Callable[[str, Query, Trace], None] | None = None,
) -> list[TimedCall]:
    """Time every query on every system in randomised blocks (see the module docstring).

    ``systems`` are prepared; each call's time is the trace's ``timings_ms["total"]``, else
    the call's wall time; a call that raises is a failed call, timed until it raised.
    ``on_trace(label, query, trace)`` gets every call's trace (benchmarks score them).
    """
    rng = random.Random(seed)
    labels = list(systems)
    calls: list[TimedCall] = []
    for repeat in range(repeats):
        order = list(queries)
        rng.shuffle(order)
        for query in order:
            turns = labels[:]
            rng.shuffle(turns)
            for position, label in enumerate(turns):
                t0 = time.perf_counter()
                try:
                    trace = systems[label].run(query)
                except Exception as exc:  # recorded as failed, like a job's query
                    trace = Trace(query.query_id, status="failed", error=f"{type(exc).__name__}: {exc}")
                elapsed = (time.perf_counter() - t0) * 1000
                latency = float(trace.timings_ms.get("total", elapsed))
                if on_trace is not None:
                    on_trace(label, query, trace)
                calls.append(TimedCall(label, query.query_id, repeat, position, latency, trace.status))
    return calls


@dataclass
class TimingPass:
    """What :func:`timing_pass` did."""

    path: Path
    variants: list[str]
    n_queries: int
    repeats: int
    n_failed: int  # calls that failed
    seconds: float
    written: bool = True  # False: no query was ok in every job, nothing timed
    untimed: list[str] = field(default_factory=list)  # variants with no latency of their own (replay)


@dataclass
class TimingJob:
    """A finished variant to time: its label, settings and the records its job wrote."""

    label: str
    settings: RunConfig
    records: Path


def timing_pass(
    sweep_dir: Path,
    jobs: Sequence[TimingJob],
    output_root: Path,
    *,
    repeats: int,
    seed: int,
) -> TimingPass:
    """Build the jobs' systems side by side, time their queries interleaved, write
    ``timing.jsonl`` in ``sweep_dir``.

    The queries timed are those ok in every job: a query that failed in a job is left out
    of latency anyway, and a dead endpoint is not called again for nothing. With none, or
    a job short of a query, nothing is timed and no file is written; nor when a job's system has
    no latency of its own to time (``timed = False``: system=replay replays its log's times),
    since the comparison uses the pass only when it timed every variant.
    """
    t0 = time.perf_counter()
    path = sweep_dir / TIMING_FILE
    untimed = [job.label for job in jobs if not getattr(SYSTEMS.get(job.settings.system.name), "timed", True)]
    if untimed:
        return TimingPass(
            path, [job.label for job in jobs], 0, repeats, 0, 0.0, written=False, untimed=untimed
        )
    datasets = {job.label: get_dataset(job.settings) for job in jobs}
    finals = [final_records(read_records(job.records)) for job in jobs]
    ok = [{r["query_id"] for r in recs.values() if r["status"] == "ok"} for recs in finals]  # any repeat
    common = set.intersection(*ok, *({q.query_id for q in ds.queries} for ds in datasets.values()))
    queries = [q for q in datasets[jobs[0].label].queries if q.query_id in common]
    if not queries:
        return TimingPass(path, [job.label for job in jobs], 0, repeats, 0, 0.0, written=False)
    systems: dict[str, System] = {}
    try:
        for job in jobs:
            label, s = job.label, job.settings
            cache_dir = Path(s.cache.dir) if s.cache.dir else output_root / "cache"
            system = SYSTEMS.get(s.system.name)(s, Cache(cache_dir, enabled=s.cache.enabled))
            systems[label] = system
            system.prepare(datasets[label])  # warms every stage up (systems/local.py, systems/http.py)
        calls = interleave(systems, queries, repeats=repeats, seed=seed)
    finally:
        for system in systems.values():
            system.close()
    write_text_atomic(path, "".join(json.dumps(asdict(call), ensure_ascii=False) + "\n" for call in calls))
    return TimingPass(
        path,
        [job.label for job in jobs],
        len(queries),
        repeats,
        sum(1 for c in calls if c.status != "ok"),
        time.perf_counter() - t0,
    )


def read_timing(path: Path) -> list[TimedCall]:
    """The calls of a ``timing.jsonl``."""
    calls = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            calls.append(TimedCall(**{k: d[k] for k in TimedCall.__dataclass_fields__}))
    return calls
