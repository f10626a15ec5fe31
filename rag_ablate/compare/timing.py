"""Which latency the verdict compares: the interleaved timing pass's, when the sweep has one.

:func:`apply_timing` puts each query's time from ``timing.jsonl`` (:mod:`rag_ablate.run.timing`)
into its record's ``latency_ms`` before the comparison, so ``latency_ms``, ``latency_p50_ms``
and ``latency_p95_ms`` (the ``timing`` family) are computed from paired, interleaved times;
the records on disk keep the jobs' own times. It returns the sentence that says how latency
was measured (``Comparison.latency_method``), which every view shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rag_ablate.compare.analysis import LATENCY, failed
from rag_ablate.compare.model import VariantData
from rag_ablate.core.layout import TIMING_FILE
from rag_ablate.run.timing import TimedCall

JOBS_METHOD = (
    "Latency compares the jobs' own per-query times: each job timed its queries in its own run, one "
    "job after another, so whatever drifted between the runs (load, caches, the service) is mixed "
    "into the effect. No interleaved timing pass"
)


def apply_timing(variants: Sequence[VariantData], calls: Sequence[TimedCall]) -> str:
    """Each record's ``latency_ms`` from the timing pass (the median of the query's times in it);
    NaN (left out) when the query failed in the pass or in its job. Returns how latency was
    measured; the records are left as they are when the pass did not time every variant."""
    if not calls:
        return (
            f"{JOBS_METHOD} (timing.interleave=false, system=replay variants, whose times are their "
            "logs', or runs not compared at their sweep's end)."
        )
    by: dict[str, dict[str, list[TimedCall]]] = {}
    for c in calls:
        by.setdefault(c.variant, {}).setdefault(c.query_id, []).append(c)
    untimed = [v.label for v in variants if v.label not in by]
    if untimed:
        return f"{JOBS_METHOD}: {TIMING_FILE} has no times for {', '.join(untimed)}."
    left_out = 0
    for v in variants:
        times = by[v.label]
        for rec in v.records:
            got = times.get(rec["query_id"], [])
            ok = bool(got) and all(c.status == "ok" for c in got) and not failed(rec)
            left_out += not ok
            latency = float(np.median([c.latency_ms for c in got])) if ok else math.nan
            rec["metrics"] = {**(rec.get("metrics") or {}), LATENCY: latency}
    repeats = max(c.repeat for c in calls) + 1
    n_failed = sum(1 for c in calls if c.status != "ok")
    return (
        f"Latency compares the interleaved timing pass ({TIMING_FILE}): after the jobs, the {len(by)} "
        "variants' systems were built side by side in one process and warmed up, then every query was "
        f"answered by every variant, one call at a time, in a random order per query, {repeats} time(s); "
        "a query's latency is the median of its times, so drift falls on both sides alike. "
        f"{n_failed} call(s) failed in the pass; {left_out} record(s) failed in the pass or in their job "
        "and are left out of latency. Each job's own times (what its run measured) stay in its records "
        "and tables."
    )
