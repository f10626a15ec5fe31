"""What a variant costs, from its per-query records.

Every number here comes from per-query values (a percentile of the queries'
end-to-end times, never a sum of stage means), so it can be recomputed from
``records.jsonl`` alone. Names are un-prefixed; the runner logs them to MLflow
as ``cost/<name>`` (all queries) and ``<split>/cost/<name>``.

- ``latency_p50_ms``, ``latency_p95_ms``: end-to-end time per query
  (``timings_ms["total"]``). Failed queries count with their time until they
  failed, so a timeout cannot make p95 look better.
- ``<stage>_p50_ms``, ``<stage>_p95_ms``: for every other stage any record
  timed (``route``, ``retrieve``, ``rerank``, ``encode``, ...), over the queries
  that timed it.
- ``ttft_p50_ms``, ``ttft_p95_ms``: time to the first answer token, over the
  queries whose trace carries ``ttft_ms`` (streaming systems only).
- ``context_tokens``: mean tokens of the final retrieved list handed to a
  generator (see :func:`final_context_tokens`).
- ``prompt_tokens``, ``completion_tokens``, ``embedding_tokens``: mean tokens per
  query over the queries whose trace reports that count.
- ``usd_per_query``, ``usd_per_1k``: money, only when a price is given
  (:class:`rag_ablate.config.schema.ModelPrice`); the spend of every query in the split
  (failed ones bill what they reported) divided by the number of queries. Without
  a price, or without any token usage, they are absent rather than 0: the
  offline local pipeline calls no paid model, so it has no money cost to report.

Percentiles are numpy's default (linear interpolation between order statistics).
See docs/metrics.md.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING, Any

import numpy as np

from rag_ablate.records.trace import Record

if TYPE_CHECKING:
    from rag_ablate.config.schema import ModelPrice

PERCENTILES = (50, 95)
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "embedding_tokens")
TOTAL = "total"  # the stage key holding a query's end-to-end time
_CONTEXT_RE = re.compile(r"^context_tokens_at_(\d+)$")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile of ``values`` (numpy's linear interpolation); NaN when empty."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def query_latency_ms(rec: Record) -> float | None:
    """A query's end-to-end time: ``timings_ms.total``, else its ``latency_ms`` metric."""
    total = (rec.get("timings_ms") or {}).get(TOTAL)
    if total is not None:
        return float(total)
    lat = (rec.get("metrics") or {}).get("latency_ms")
    return None if lat is None else float(lat)


def final_context_tokens(rec: Record) -> float | None:
    """Tokens of the query's whole final retrieved list, read from its ``context_tokens_at_k``.

    The value at the smallest cutoff k that covers the list (k >= number of
    retrieved chunks) is the list's total; when the list is longer than every
    configured cutoff, the largest cutoff's value is used (an undercount, as no
    larger cutoff was scored). None for queries without retrieval (failed, no_rag).
    """
    return _final_context(rec, _context_names([rec]))


def _context_names(records: Sequence[Record]) -> list[tuple[int, str]]:
    """(k, name) of every ``context_tokens_at_k`` metric some record has (the names collected in C),
    by k ascending."""
    names: set[str] = set().union(*((r.get("metrics") or {}) for r in records))
    return sorted((int(m.group(1)), name) for name in names if (m := _CONTEXT_RE.match(name)))


def _final_context(rec: Record, names: Sequence[tuple[int, str]]) -> float | None:
    """:func:`final_context_tokens`, looking up only ``names`` (:func:`_context_names` of the run, k
    ascending), in :func:`_context_order`."""
    return _first_value(rec.get("metrics") or {}, _context_order(names, len(rec.get("retrieved") or [])))


def _context_order(names: Sequence[tuple[int, str]], n: int) -> list[str]:
    """The names to look up for a list of ``n`` retrieved chunks, in turn: from the first k that covers
    the list on, then those before it backwards (the value at the first covering k with one, else at
    the last k with a value; one lookup, as a rule)."""
    first = bisect_left(names, (n, ""))  # the first name whose k covers the list
    return [name for _, name in (*names[first:], *reversed(names[:first]))]


def _first_value(metrics: Mapping[str, float | None], order: Sequence[str]) -> float | None:
    """The first of ``order``'s metrics that has a value, as a float; None when none has."""
    for name in order:
        v = metrics.get(name)
        if v is not None:
            return float(v)
    return None


def query_tokens(rec: Record, name: str) -> float | None:
    """One token count the query's system reported (``usage[name]``; None: not reported)."""
    usage: Mapping[str, Any] = rec.get("usage") or {}  # looked up by a name known at run time
    v = usage.get(name)
    return None if v is None else float(v)


def query_usd(rec: Record, price: ModelPrice) -> float:
    """Money one query spent: its reported tokens times USD per 1M tokens (missing counts = 0)."""
    return sum(query_usd_parts(rec, price))


def query_usd_parts(rec: Record, price: ModelPrice) -> tuple[float, float]:
    """:func:`query_usd` as (input, output): prompt and embedding tokens, completion tokens."""
    usage = rec.get("usage")
    if not usage:
        return 0.0, 0.0
    spent_in = (
        float(usage.get("prompt_tokens") or 0) * price.prompt
        + float(usage.get("embedding_tokens") or 0) * price.embedding
    )
    return spent_in / 1_000_000, float(usage.get("completion_tokens") or 0) * price.completion / 1_000_000


def _quantiles(out: dict[str, float], name: str, values: list[float]) -> None:
    """Every one of :data:`PERCENTILES` of ``values`` from one numpy call (each what :func:`percentile`
    gives alone: the same order statistics, interpolated alike)."""
    if values:
        found = np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES).tolist()
        out.update({f"{name}_p{q}_ms": v for q, v in zip(PERCENTILES, found, strict=True)})


def cost_metrics(
    records: Sequence[Record], split: str | None = None, *, price: ModelPrice | None = None
) -> dict[str, float]:
    """Cost of one variant over the records of ``split`` (None = all records); names un-prefixed.

    See the module docstring for every name. A metric no query has a value for
    is absent, not 0.
    """
    return _QueryCosts(records, price).metrics(split)


def run_cost_metrics(
    records: Sequence[Record], splits: Sequence[str], *, price: ModelPrice | None = None
) -> dict[str, float]:
    """:func:`cost_metrics` of all records as ``cost/<name>`` and of each split as ``<split>/cost/<name>``
    (each record read once for all of them)."""
    costs = _QueryCosts(records, price)
    out = {f"cost/{k}": v for k, v in costs.metrics(None).items()}
    for split in splits:
        out.update({f"{split}/cost/{k}": v for k, v in costs.metrics(split).items()})
    return out


class _QueryCosts:
    """Every record's cost values, read once: the run's and each split's :func:`cost_metrics` then
    gather them in record order (the values, and so every percentile and mean, those of a pass over
    the split's own records), a split's by a mask of its records (in C)."""

    def __init__(self, records: Sequence[Record], price: ModelPrice | None) -> None:
        names = _context_names(records)  # a name no record of a split has is None in each of them
        self.price = price
        # one pass over the records (each read once: a large run's records do not stay in the caches)
        self.splits: list[str | None] = []
        self.latency: list[float | None] = []
        # stage -> the positions of the records that timed it and their times, in record order
        self.stages: dict[str, tuple[list[int], list[float]]] = {}
        self.ttft: list[float | None] = []
        self.context: list[float | None] = []
        usages: list[Mapping[str, Any] | None] = []
        orders: dict[int, list[str]] = {}  # the context names' lookup order by the length of a list
        for i, r in enumerate(records):
            self.splits.append(r.get("split"))
            timings = r.get("timings_ms") or {}
            total = timings.get(TOTAL)
            self.latency.append(query_latency_ms(r) if total is None else float(total))
            for s, ms in timings.items():
                if s != TOTAL and ms is not None:
                    column = self.stages.get(s)
                    if column is None:
                        column = self.stages.setdefault(str(s), ([], []))
                    column[0].append(i)
                    column[1].append(float(ms))
            ttft = r.get("ttft_ms")
            self.ttft.append(None if ttft is None else float(ttft))
            n = len(r.get("retrieved") or [])
            order = orders.get(n)
            if order is None:
                order = orders[n] = _context_order(names, n)
            self.context.append(_first_value(r.get("metrics") or {}, order))
            usages.append(r.get("usage"))
        tokens = {  # a record without usage has no count (the local pipeline's every record)
            name: [None if not u or (v := u.get(name)) is None else float(v) for u in usages]
            for name in USAGE_FIELDS
        }
        # a count no record reports is left out (no split has a value of it)
        self.tokens = {name: values for name, values in tokens.items() if values.count(None) < len(values)}
        self.usd = None if price is None else [query_usd(r, price) for r in records]

    def metrics(self, split: str | None) -> dict[str, float]:
        """:func:`cost_metrics` of the records of ``split`` (None: all)."""
        mask = None if split is None else [s == split for s in self.splits]  # the split's records

        def present(values: list[float | None]) -> list[float]:
            """The split's values that are not None, in record order."""
            chosen: Iterable[float | None] = values if mask is None else compress(values, mask)
            return [v for v in chosen if v is not None]

        out: dict[str, float] = {}
        _quantiles(out, "latency", present(self.latency))
        for stage in sorted(self.stages):
            rows, times = self.stages[stage]
            in_split = times if mask is None else list(compress(times, map(mask.__getitem__, rows)))
            _quantiles(out, stage, in_split)
        _quantiles(out, "ttft", present(self.ttft))
        ctx = present(self.context)
        if ctx:
            out["context_tokens"] = float(np.mean(ctx))
        any_usage = False
        for name, values in self.tokens.items():
            counts = present(values)
            if counts:
                any_usage = True
                out[name] = float(np.mean(counts))
        n_picked = len(self.splits) if mask is None else sum(mask)
        if self.usd is not None and any_usage and n_picked:
            per_query = sum(self.usd if mask is None else compress(self.usd, mask)) / n_picked
            out["usd_per_query"] = per_query
            out["usd_per_1k"] = per_query * 1000
        return out


def cache_hit_rates(cache_metrics: Mapping[str, float]) -> dict[str, float]:
    """``run/cache_<kind>_hit_rate`` (hits / lookups) per cache kind and ``run/cache_hit_rate`` overall,
    from the ``run/cache_<kind>_hits`` and ``_misses`` counts; kinds never looked up are left out."""
    out: dict[str, float] = {}
    total_hits = total = 0.0
    for key, hits in cache_metrics.items():
        m = re.fullmatch(r"run/cache_(.+)_hits", key)
        if not m:
            continue
        misses = float(cache_metrics.get(f"run/cache_{m.group(1)}_misses", 0.0))
        lookups = float(hits) + misses
        if lookups > 0:
            out[f"run/cache_{m.group(1)}_hit_rate"] = float(hits) / lookups
            total_hits += float(hits)
            total += lookups
    if total > 0:
        out["run/cache_hit_rate"] = total_hits / total
    return out
