"""Each variant's records as columns, built once per comparison and shared by its planners.

The comparison (:func:`~rag_ablate.compare.analysis.plan_compare`), its slices
(:func:`~rag_ablate.compare.slices.plan_slices`) and its trade-off
(:func:`~rag_ablate.compare.tradeoff.plan`) read the same records: which split a query is in, its
id, group, status, tags and metric values. :class:`Columns` reads each of these once per variant,
on first use, into arrays and lists over the variant's records (in their order), and the planners
index them. The metric values come from one pass over the records' metric mappings: records whose
``metrics`` have the same names in the same order (nearly all of a run) are read as one table
(one C-level ``values()`` a record, converted by numpy), not name by name.

Every value is the one the record-at-a-time functions give
(:func:`~rag_ablate.compare.analysis.value`, :func:`~rag_ablate.compare.analysis.failed`,
``_by_id``): the columns change how often the records are read, never a number.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import chain, repeat
from operator import contains, eq, itemgetter, methodcaller, ne
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.compare.model import VariantData
from rag_ablate.metrics.registry import spec_of
from rag_ablate.records.trace import Record
from rag_ablate.run.slices import SliceKey, slice_keys

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]

ERROR_RATE = "error_rate"  # the record's status, not a stored value (as analysis.ERROR_RATE)
LATENCY = "latency_ms"  # falls back to timings_ms.total (as analysis.LATENCY)
_EMPTY: Mapping[str, Any] = {}


class VariantColumns:
    """One variant's records as columns (each computed on first use, then kept)."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = records
        statuses = map(methodcaller("get", "status", "ok"), records)
        self.failed = np.fromiter(map(ne, statuses, repeat("ok")), bool, len(records))
        self._splits: dict[Any, IndexArray] | None = None
        self._index: dict[str, dict[str, int]] = {}
        self._by_id: dict[str, dict[str, Record]] = {}
        self._dicts: list[Mapping[str, Any]] | None = None
        self._names: set[str] | None = None
        self._by_names: list[tuple[tuple[str, ...], list[int]]] | None = None
        self._plain: dict[str, FloatArray] = {}
        self._values: dict[str, FloatArray] = {}
        self._qids: list[str] | None = None
        self._group_or_id: list[str] | None = None

    def __len__(self) -> int:
        return len(self.records)

    def release(self) -> None:
        """Let the metric columns go (read again if asked for); the records by id stay."""
        self._dicts = None
        self._by_names = None
        self._plain.clear()
        self._values.clear()

    # ------------------------------------------------------------------ rows

    def positions(self, split: str) -> IndexArray:
        """The positions of the records of ``split`` (``record.get("split")``), in order."""
        if self._splits is None:
            splits = list(map(methodcaller("get", "split"), self.records))
            self._splits = {
                s: np.flatnonzero(np.fromiter(map(eq, splits, repeat(s)), bool, len(splits)))
                for s in dict.fromkeys(splits)
            }
        got = self._splits.get(split)
        return got if got is not None else np.zeros(0, dtype=np.intp)

    def query_ids(self) -> list[str]:
        """Each record's ``query_id``."""
        if self._qids is None:
            self._qids = list(map(itemgetter("query_id"), self.records))
        return self._qids

    def index(self, split: str) -> dict[str, int]:
        """Each query id of ``split`` -> the position of its last record, in the order the ids first
        occur (the keys and records of ``analysis._by_id``)."""
        got = self._index.get(split)
        if got is None:
            pos = self.positions(split).tolist()
            got = self._index[split] = dict(zip(map(self.query_ids().__getitem__, pos), pos, strict=True))
        return got

    def by_id(self, split: str) -> dict[str, Record]:
        """``analysis._by_id`` of the records of ``split`` (one dict, shared: read it, never change it)."""
        got = self._by_id.get(split)
        if got is None:
            index = self.index(split)
            got = self._by_id[split] = dict(
                zip(index, map(self.records.__getitem__, index.values()), strict=True)
            )
        return got

    def rows(self, split: str) -> IndexArray:
        """The positions of :meth:`index`'s records, in its order."""
        index = self.index(split)
        return np.fromiter(index.values(), np.intp, len(index))

    def aligned(self, ids: Sequence[str], split: str) -> IndexArray:
        """The position of the record of each of ``ids`` in ``split`` (its last one); -1: none."""
        index = self.index(split)
        return np.fromiter(map(index.get, ids, repeat(-1)), np.intp, len(ids))

    def own(self, split: str, other: Mapping[str, Any]) -> IndexArray:
        """The positions of :meth:`index`'s records whose query ids ``other`` lacks, in its order."""
        index = self.index(split)
        if not index.keys() - other.keys():
            return np.zeros(0, dtype=np.intp)
        return np.array([i for q, i in index.items() if q not in other], dtype=np.intp)

    def groups(self, rows: IndexArray) -> list[str]:
        """``str(record["group"])`` of the records at ``rows``."""
        return list(map(str, map(itemgetter("group"), map(self.records.__getitem__, rows.tolist()))))

    def group_or_id(self) -> list[str]:
        """Each record's group (its query id when it has none), as the trade-off groups it."""
        if self._group_or_id is None:
            self._group_or_id = [str(r.get("group", r.get("query_id"))) for r in self.records]
        return self._group_or_id

    def untagged(self) -> int:
        """How many records have no ``tags`` (:func:`~rag_ablate.run.slices.record_tags` None)."""
        return sum(1 for r in self.records if r.get("tags") is None)

    def members(self, rows: IndexArray) -> dict[SliceKey, list[int]]:
        """Each slice's positions among the records at ``rows`` (in their order; not yet
        :func:`~rag_ablate.run.slices.sliced`): the records with the same tags, intents, expected
        behaviour and version, all strings, are in the same slices, whose keys are made once."""
        recs = [self.records[i] for i in rows.tolist()]
        sigs = _slice_signatures(recs)
        alike: dict[object, list[int]] = {}
        for j, sig in enumerate(sigs):
            got = alike.get(j if sig is None else sig)
            if got is None:
                alike[j if sig is None else sig] = [j]
            else:
                got.append(j)
        parts: dict[SliceKey, list[list[int]]] = {}
        for positions in alike.values():
            for key in slice_keys(recs[positions[0]]):
                parts.setdefault(key, []).append(positions)
        return {k: p[0] if len(p) == 1 else sorted(j for part in p for j in part) for k, p in parts.items()}

    # ------------------------------------------------------------------ metrics

    def _metric_dicts(self) -> list[Mapping[str, Any]]:
        if self._dicts is None:
            self._dicts = [r.get("metrics") or _EMPTY for r in self.records]
        return self._dicts

    def names(self) -> set[str]:
        """Every metric name some record has (``analysis.metric_names`` of the records)."""
        if self._names is None:
            self._names = set().union(*(keys for keys, _ in self._layouts()))
        return self._names

    def has_metric(self, name: str) -> bool:
        """Whether some record has a value of ``name`` (stops at the first)."""
        if self._names is not None or self._by_names is not None:
            return name in self.names()
        return any(map(contains, self._metric_dicts(), repeat(name)))

    def _layouts(self) -> list[tuple[tuple[str, ...], list[int]]]:
        """The records grouped by the names of their ``metrics``, in order: (names, positions). One
        look at each record (their mappings lie all over memory: a pass a name would wait on each)."""
        if self._by_names is None:
            by: dict[tuple[str, ...], list[int]] = {}
            for i, keys in enumerate(map(tuple, self._metric_dicts())):
                got = by.get(keys)
                if got is None:
                    by[keys] = [i]
                else:
                    got.append(i)
            self._by_names = list(by.items())
        return self._by_names

    def plain(self, names: Sequence[str]) -> dict[str, FloatArray]:
        """Each metric's stored number in every record, whatever its status (NaN: no value, None, or
        not finite). The names not read yet are read together, the records with the same metric
        names (nearly all of a run) as one table: one C-level lookup of all the names a record."""
        todo = [m for m in dict.fromkeys(names) if m not in self._plain]
        if todo:
            dicts = self._metric_dicts()
            n = len(dicts)
            out = {m: np.full(n, math.nan) for m in todo}
            for keys, pos in self._layouts():
                held = set(keys)
                picked = [m for m in todo if m in held]
                if picked:
                    at = np.asarray(pos, dtype=np.intp)
                    table = _table(list(map(dicts.__getitem__, pos)), picked)
                    for c, m in enumerate(picked):
                        out[m][at] = table[:, c]
            for m, col in out.items():
                col[~np.isfinite(col)] = math.nan
                self._plain[m] = col
        return {m: self._plain[m] for m in names}

    def value(self, metric: str) -> FloatArray:
        """:func:`~rag_ablate.compare.analysis.value` of ``metric`` for every record (NaN: None)."""
        got = self._values.get(metric)
        if got is None:
            got = self._values[metric] = self._value(metric)
        return got

    def _value(self, metric: str) -> FloatArray:
        recs, failed = self.records, self.failed
        if metric == ERROR_RATE:  # a stored share (as stored: float() of it), else the status
            shares = [d.get(ERROR_RATE) for d in self._metric_dicts()]
            out = np.where(failed, 1.0, 0.0)
            for i, share in enumerate(shares):
                if share is not None:
                    out[i] = float(share)
            return out
        spec = spec_of(metric)
        if metric == LATENCY:  # the metric, else timings_ms.total
            stored = [d.get(LATENCY) for d in self._metric_dicts()]
            vals = [
                (r.get("timings_ms") or _EMPTY).get("total") if v is None else v
                for r, v in zip(recs, stored, strict=True)
            ]
            out = np.array(vals, dtype=np.float64).reshape(len(recs))
            out[~np.isfinite(out)] = math.nan
            if spec.uses_failed:
                return out
        else:
            out = self.plain([metric])[metric].copy()
        if not spec.uses_failed:  # a failed record: the miss where it names the metric, else none
            for i in np.flatnonzero(failed).tolist():
                named = metric in (recs[i].get("metrics") or _EMPTY)
                out[i] = spec.miss if spec.miss is not None and named else math.nan
        return out

    def spent_latency(self) -> FloatArray:
        """Each record's latency as the trade-off's cost (``tradeoff._latency``): its ``latency_ms``
        metric when it has the name (None: NaN), else ``timings_ms.total``; failed ones too."""
        got = self._values.get("\0spent")
        if got is None:
            vals = [
                m[LATENCY] if LATENCY in m else (r.get("timings_ms") or _EMPTY).get("total")
                for r, m in zip(self.records, self._metric_dicts(), strict=True)
            ]
            got = self._values["\0spent"] = np.array(vals, dtype=np.float64).reshape(len(vals))
        return got

    def ok_only(self, metrics: Sequence[str], rows: IndexArray) -> dict[str, FloatArray]:
        """``analysis._columns`` of ``metrics`` at ``rows`` (-1: no record, NaN): a plain metric's
        stored value over the records not failed, the others' :meth:`value`, finite."""
        uses_failed = {m for m in metrics if spec_of(m).uses_failed}
        stored = self.plain([m for m in metrics if m not in uses_failed])
        failed = take(self.failed, rows, False)
        out = {}
        for m in metrics:
            if m in uses_failed:
                col = take(self.value(m), rows, math.nan)
                col[~np.isfinite(col)] = math.nan
            else:
                col = take(stored[m], rows, math.nan)
                col[failed] = math.nan
            out[m] = col
        return out


def _slice_signatures(recs: Sequence[Record]) -> list[tuple[object, ...] | None]:
    """What decides each record's slices (:func:`~rag_ablate.run.slices.slice_keys`) when it is
    strings: its tags, intents, expected behaviour and version; None for a record with metadata or
    a value of another type (its slices are its own)."""
    read = [
        (
            r.get("intent_gold_l1"),
            r.get("intent_gold"),
            r.get("expected_behavior"),
            r.get("applicable_version"),
        )
        for r in recs
    ]
    tags = [None if t is None else tuple(t) for t in map(methodcaller("get", "tags"), recs)]
    odd = set(map(type, chain.from_iterable(filter(None, tags)))) - {str}
    odd |= set(map(type, chain.from_iterable(read))) - {str, type(None)}
    metadata = list(map(methodcaller("get", "metadata"), recs))
    sigs: list[tuple[object, ...] | None] = [(t, *f) for t, f in zip(tags, read, strict=True)]
    if odd or any(metadata):
        for j, (t, f) in enumerate(zip(tags, read, strict=True)):
            strings = all(type(x) is str for x in t or ()) and all(x is None or type(x) is str for x in f)
            if metadata[j] or not strings:
                sigs[j] = None
    return sigs


def _table(dicts: Sequence[Mapping[str, Any]], names: Sequence[str]) -> FloatArray:
    """``names`` of ``dicts`` (each has them all) as a table of floats, None NaN."""
    get = itemgetter(*names)
    n, width = len(dicts), len(names)
    got = map(get, dicts)
    try:
        flat = np.fromiter(chain.from_iterable(got) if width > 1 else got, np.float64, n * width)
        return flat.reshape(n, width)
    except (TypeError, ValueError):  # a None among them
        return np.array(list(map(get, dicts)), dtype=np.float64).reshape(n, width)


def take(col: npt.NDArray[Any], rows: IndexArray, missing: Any) -> npt.NDArray[Any]:
    """``col`` at ``rows``, ``missing`` where a row is -1 (no record)."""
    if not col.shape[0]:
        return np.full(rows.shape[0], missing, dtype=col.dtype)
    out = col[rows]
    out[rows < 0] = missing
    return out


class Columns:
    """:class:`VariantColumns` of each variant of one comparison, built on first use. Pass one to
    the planners of one comparison so that they read each record once
    (:func:`rag_ablate.compare.run.statistics`); without one, each planner builds its own."""

    def __init__(self) -> None:
        self._of: dict[int, tuple[Sequence[Record], VariantColumns]] = {}

    def of(self, variant: VariantData) -> VariantColumns:
        got = self._of.get(id(variant.records))
        if got is None or got[0] is not variant.records:
            got = self._of[id(variant.records)] = (variant.records, VariantColumns(variant.records))
        return got[1]

    def release(self) -> None:
        """:meth:`VariantColumns.release` of every variant: once planned, before the draws run."""
        for _, cols in self._of.values():
            cols.release()

    def present(self, variants: Sequence[VariantData]) -> Collection[str]:
        """The metric names some record of ``variants`` has, each looked for when asked."""
        return _Present([self.of(v) for v in variants])


class _Present(Collection[str]):
    """The metric names some record of some variant has: ``name in`` looks for it (stopping at the
    first record that has it); iterating reads every name."""

    def __init__(self, of: Sequence[VariantColumns]) -> None:
        self._of = of

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(c.has_metric(name) for c in self._of)

    def _all(self) -> set[str]:
        return set().union(*(c.names() for c in self._of))

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._all()))

    def __len__(self) -> int:
        return len(self._all())
