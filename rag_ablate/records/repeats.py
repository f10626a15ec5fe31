"""Repeated runs of each query (``system.repeats`` = k > 1): each query's spread, and the run's.

A run with repeats has one record per (query, repeat), each with its ``repeat`` index
(0..k-1; :func:`~rag_ablate.records.trace.record_key`). From them:

* per query (:func:`query_spreads`): the mean and SD (ddof=1) over its repeats of every metric
  value the repeats have (a failed repeat has none: it counts in ``n_failed``); for a binary
  metric (``MetricSpec.binary``) its verdicts in repeat order, whether all k passed (pass^k) and
  whether they all agree (consistent; a query with both verdicts is *flaky*);
* per run and split (:func:`repeat_metrics`), for each metric: ``within_share``, the share of the
  variance of a query's single run that is within-query noise (one-way random effects:
  ``W / (W + max(0, V - W / k))`` with ``W`` the mean within-query variance and ``V`` the variance
  of the query means), ``sd`` the mean within-query SD, and for binary metrics ``pass_k`` (the
  share of queries whose every repeat passed) and ``consistency`` (the share whose repeats agree).
  Only queries whose every repeat has a value count.

The comparison uses the per-query means (:func:`mean_record`): its groups are resampled and each
carries its queries' repeat means, which is the nested resampling that counts each source of
noise once (docs/statistics.md "Repeated runs").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

from rag_ablate.core.errors import ConfigError, UnknownNameError
from rag_ablate.metrics.registry import spec_of
from rag_ablate.records.trace import Record

__all__ = [
    "QuerySpread",
    "first_runs",
    "has_repeats",
    "mean_record",
    "query_spreads",
    "repeat_metrics",
    "runs_by_query",
    "spreads_json",
]


def has_repeats(records: Iterable[Record]) -> bool:
    """True when the records are of a run with ``system.repeats`` > 1."""
    return any(r.get("repeat") is not None for r in records)


def first_runs(records: Sequence[Record]) -> list[Record]:
    """Each query's first run (all records when the run has no repeats): what is ranked once (the
    TREC run) or shown once (the per-query MLflow traces)."""
    return [r for r in records if not r.get("repeat")]


def runs_by_query(records: Iterable[Record]) -> dict[str, list[Record]]:
    """The records of each query id, in the order met (a query's repeats in file order)."""
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(r["query_id"], []).append(r)
    return out


ERROR_RATE = "error_rate"  # a mean record's share of failed repeats (the comparison's error_rate)


def _known(metric: str) -> bool:
    try:
        spec_of(metric)
    except (UnknownNameError, ConfigError):  # a value the registry does not name: no facts
        return False
    return True


def _binary(metric: str) -> bool:
    return _known(metric) and spec_of(metric).binary


@dataclass
class QuerySpread:
    """One query's repeats: see the module docstring."""

    query_id: str
    split: str
    query: str | None  # its text (None: not stored)
    n: int  # runs recorded
    n_failed: int
    mean: dict[str, float] = field(default_factory=dict)
    sd: dict[str, float] = field(default_factory=dict)  # NaN with one value
    n_values: dict[str, int] = field(default_factory=dict)  # repeats with a value of the metric
    verdicts: dict[str, list[float | None]] = field(default_factory=dict)  # binary metrics, per repeat

    def flaky(self, metric: str) -> bool:
        """The repeats gave both verdicts of a binary metric."""
        return len({v for v in self.verdicts.get(metric, []) if v is not None}) > 1

    def complete(self, metric: str) -> bool:
        """Two or more repeats, and every one has a value of ``metric``."""
        return self.n >= 2 and self.n_values.get(metric, 0) == self.n


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def _values(runs: Sequence[Record], metric: str) -> list[float | None]:
    out: list[float | None] = []
    for r in runs:
        v = None if r.get("status", "ok") != "ok" else (r.get("metrics") or {}).get(metric)
        out.append(float(v) if v is not None and math.isfinite(float(v)) else None)
    return out


def query_spreads(records: Iterable[Record]) -> list[QuerySpread]:
    """Every query's :class:`QuerySpread`, in the order the records name them."""
    out = []
    for qid, runs in runs_by_query(records).items():
        first = runs[0]
        qs = QuerySpread(
            qid,
            first["split"],
            first.get("query"),
            len(runs),
            sum(1 for r in runs if r.get("status", "ok") != "ok"),
        )
        names = dict.fromkeys(m for r in runs for m in r.get("metrics") or {})
        for m in names:
            values = _values(runs, m)
            known = [v for v in values if v is not None]
            if known:
                qs.mean[m], qs.sd[m] = _mean_sd(known)
                qs.n_values[m] = len(known)
            if _binary(m):
                qs.verdicts[m] = values
        out.append(qs)
    return out


def _within_share(means: Sequence[float], variances: Sequence[float], k: float) -> float:
    """The within-query share of one run's variance (module docstring); NaN when it has none."""
    w = math.fsum(variances) / len(variances)
    v = _mean_sd(means)[1] ** 2 if len(means) > 1 else 0.0
    total = w + max(0.0, v - w / k)
    return w / total if total > 0 else math.nan


def repeat_metrics(records: Sequence[Record], keep: Callable[[str], bool] = _known) -> dict[str, float]:
    """Per split (``dev``, ``holdout``, ``all``) and metric: ``<split>/repeats/<metric>/within_share``
    and ``/sd``, and for binary metrics ``/pass_k`` and ``/consistency``; ``<split>/repeats/
    flaky_queries``, the queries with both verdicts of some binary metric; ``run/repeats``, the
    most runs of a query. Empty for a run without repeats. ``keep`` selects the metrics."""
    if not has_repeats(records):
        return {}
    spreads = query_spreads(records)
    out: dict[str, float] = {"run/repeats": float(max(s.n for s in spreads))}
    for split in ("dev", "holdout", "all"):
        mine = [s for s in spreads if split in ("all", s.split)]
        if not mine:
            continue
        p = f"{split}/repeats/"
        out[p + "flaky_queries"] = float(sum(1 for s in mine if any(s.flaky(m) for m in s.verdicts)))
        for m in dict.fromkeys(m for s in mine for m in s.mean):
            full = [s for s in mine if s.complete(m)]
            if not full or not keep(m):
                continue
            k = math.fsum(s.n for s in full) / len(full)
            out[f"{p}{m}/sd"] = math.fsum(s.sd[m] for s in full) / len(full)
            share = _within_share([s.mean[m] for s in full], [s.sd[m] ** 2 for s in full], k)
            if math.isfinite(share):  # no variance at all: no share
                out[f"{p}{m}/within_share"] = share
            if m in full[0].verdicts:
                out[f"{p}{m}/pass_k"] = sum(1 for s in full if s.mean[m] == 1.0) / len(full)
                out[f"{p}{m}/consistency"] = sum(1 for s in full if not s.flaky(m)) / len(full)
    return out


def mean_record(runs: Sequence[Record], value: Callable[[Record, str], float | None]) -> Record:
    """One record standing for a query's repeats in the comparison: the first run's fields, every
    metric the mean over the repeats of ``value(run, metric)`` (the comparison's failure-aware
    value: a failed repeat scores its metric's miss), ``error_rate`` the share of repeats that
    failed, and ``status`` failed only when every repeat failed. A single run is returned as is."""
    if len(runs) == 1:
        return runs[0]
    names = dict.fromkeys(m for r in runs for m in r.get("metrics") or {})
    metrics: dict[str, float | None] = {}
    for m in names:
        known = [v for r in runs if (v := value(r, m)) is not None]
        metrics[m] = math.fsum(known) / len(known) if known else None
    metrics[ERROR_RATE] = sum(1 for r in runs if r.get("status", "ok") != "ok") / len(runs)
    ok = next((r for r in runs if r.get("status", "ok") == "ok"), runs[0])
    rec = dict(runs[0])
    rec.update(status=ok["status"], error=ok["error"], metrics=metrics)
    return cast(Record, rec)


def spreads_json(records: Sequence[Record]) -> list[dict[str, object]]:
    """``repeats.json``: each query's runs, failed runs, and mean and SD per metric (binary metrics:
    the verdicts per repeat too); NaN (one value) as null."""
    out: list[dict[str, object]] = []
    for s in query_spreads(records):
        out.append(
            {
                "query_id": s.query_id,
                "split": s.split,
                "runs": s.n,
                "failed": s.n_failed,
                "mean": s.mean,
                "sd": {m: (v if math.isfinite(v) else None) for m, v in s.sd.items()},
                "verdicts": s.verdicts,
                "flaky": sorted(m for m in s.verdicts if s.flaky(m)),
            }
        )
    return out
