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
(:func:`~rag_ablate.compare.analysis.value`, :func:`~rag_ablate.compare.analysis.failed`): the
columns change how often the records are read, never a number.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from itertools import chain, repeat
from operator import contains, eq, itemgetter, ne
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import numpy.typing as npt

from rag_ablate.compare.draws import release_freed
from rag_ablate.compare.model import VariantData
from rag_ablate.metrics.registry import spec_of
from rag_ablate.records.trace import Record
from rag_ablate.run.slices import SliceKey, slice_keys

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]

ERROR_RATE = "error_rate"  # the record's status, not a stored value (as analysis.ERROR_RATE)
LATENCY = "latency_ms"  # falls back to timings_ms.total (as analysis.LATENCY)
_EMPTY: Mapping[str, Any] = {}
_NONE = object()  # a field the record lacks
#: at most this many sets of metric names are told apart by one C-level pass each (more: one loop)
_FEW_LAYOUTS = 8
#: the fields every planner reads, in one look at each record
_FIELDS = ("status", "split", "query_id", "group", "tags", "metrics", "timings_ms", "usage")
T = TypeVar("T")


class ById(Mapping[str, Record]):
    """A split's records by query id (each id's last record, the ids in the order they first
    occur), read through the positions of :meth:`VariantColumns.index`."""

    __slots__ = ("_index", "_records")

    def __init__(self, index: Mapping[str, int], records: Sequence[Record]) -> None:
        self._index = index
        self._records = records

    def __getitem__(self, query_id: str) -> Record:
        return self._records[self._index[query_id]]

    def __contains__(self, query_id: object) -> bool:
        return query_id in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class _Fields(NamedTuple):
    """The fields of a variant's records every planner reads, one tuple (list) a field."""

    failed: npt.NDArray[np.bool_]
    split: tuple[Any, ...]
    query_id: tuple[Any, ...]  # _NONE: no query_id
    group: tuple[Any, ...]  # _NONE: no group
    tags: tuple[Any, ...]
    metrics: list[Mapping[str, Any]]
    timings: tuple[Any, ...]  # _NONE: no timings_ms
    usage: tuple[Any, ...]


def _read(records: Sequence[Record]) -> _Fields:
    """The fields of :class:`_Fields`, one look at each record (the records lie all over memory: a
    pass a field would wait on each record again): one C-level lookup of them all a record, record
    by record where one lacks a field."""
    try:
        read = list(map(itemgetter(*_FIELDS), records))
        lacking = False
    except KeyError:
        read = [tuple(r.get(f, _NONE) for f in _FIELDS) for r in records]
        lacking = True
    status, split, query_id, group, tags, metrics, timings, usage = (
        tuple(map(itemgetter(j), read)) for j in range(len(_FIELDS))
    )
    if lacking:  # a record.get's default where a record lacks the field
        status, split, tags, usage = (
            tuple(default if x is _NONE else x for x in column)
            for column, default in ((status, "ok"), (split, None), (tags, None), (usage, None))
        )
    dicts = [_EMPTY if m is _NONE else m or _EMPTY for m in metrics]
    failed = np.fromiter(map(ne, status, repeat("ok")), bool, len(records))
    return _Fields(failed, split, query_id, group, tags, dicts, timings, usage)


class VariantColumns:
    """One variant's records as columns (each computed on first use, then kept)."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.records = records
        self._fields: _Fields | None = _read(records)
        self.failed = self._fields.failed
        self._splits: dict[Any, IndexArray] | None = None
        self._index: dict[str, dict[str, int]] = {}
        self._by_id: dict[str, ById] = {}
        self._aligned: dict[tuple[str, int], tuple[VariantColumns, IndexArray]] = {}
        self._names: set[str] | None = None
        self._by_names: list[tuple[tuple[str, ...], list[int]]] | None = None
        self._plain: dict[str, FloatArray] = {}
        self._values: dict[str, FloatArray] = {}
        self._spent: FloatArray | None = None
        self._group_or_id: list[str] | None = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def _f(self) -> _Fields:
        """The records' fields (read again after :meth:`release`)."""
        if self._fields is None:
            self._fields = _read(self.records)
        return self._fields

    def release(self) -> None:
        """Let the columns go (read again if asked for); the records by id and the metric names
        stay."""
        self._fields = None
        self._splits = None
        self._by_names = None
        self._group_or_id = None
        self._plain.clear()
        self._values.clear()
        self._spent = None
        self._aligned.clear()

    # ------------------------------------------------------------------ rows

    def positions(self, split: str) -> IndexArray:
        """The positions of the records of ``split`` (``record.get("split")``), in order."""
        if self._splits is None:
            splits = self._f.split
            self._splits = {
                s: np.flatnonzero(np.fromiter(map(eq, splits, repeat(s)), bool, len(splits)))
                for s in dict.fromkeys(splits)
            }
        got = self._splits.get(split)
        return got if got is not None else np.zeros(0, dtype=np.intp)

    def index(self, split: str) -> dict[str, int]:
        """Each query id of ``split`` -> the position of its last record, in the order the ids first
        occur."""
        got = self._index.get(split)
        if got is None:
            pos = self.positions(split).tolist()
            qids = list(map(self._f.query_id.__getitem__, pos))
            if _NONE in qids:
                raise KeyError("query_id")
            got = self._index[split] = dict(zip(qids, pos, strict=True))
        return got

    def by_id(self, split: str) -> ById:
        """The records of ``split`` by query id (:class:`ById`), a view of :meth:`index`."""
        got = self._by_id.get(split)
        if got is None:
            got = self._by_id[split] = ById(self.index(split), self.records)
        return got

    def tags(self, rows: IndexArray) -> list[Any]:
        """``record.get("tags") or ()`` of the records at ``rows``."""
        return [t or () for t in map(self._f.tags.__getitem__, rows.tolist())]

    def rows(self, split: str) -> IndexArray:
        """The positions of :meth:`index`'s records, in its order."""
        index = self.index(split)
        return np.fromiter(index.values(), np.intp, len(index))

    def aligned(self, base: VariantColumns, split: str) -> IndexArray:
        """The position of the record of each of ``base``'s queries of ``split`` (its
        :meth:`index`'s order) among these records of ``split`` (their last one); -1: none."""
        got = self._aligned.get((split, id(base)))
        if got is None or got[0] is not base:
            index, ids = self.index(split), base.index(split)
            got = self._aligned[(split, id(base))] = (
                base,
                np.fromiter(map(index.get, ids, repeat(-1)), np.intp, len(ids)),
            )
        return got[1]

    def own(self, split: str, base: VariantColumns) -> IndexArray:
        """The positions of :meth:`index`'s records whose query ids ``base`` lacks in ``split``, in
        its order."""
        index, other = self.index(split), base.index(split)
        if len(index) == int((self.aligned(base, split) >= 0).sum()):  # every query is one of base's
            return np.zeros(0, dtype=np.intp)
        return np.array([i for q, i in index.items() if q not in other], dtype=np.intp)

    def groups(self, rows: IndexArray) -> list[str]:
        """``str(record["group"])`` of the records at ``rows``."""
        got = list(map(self._f.group.__getitem__, rows.tolist()))
        if _NONE in got:
            raise KeyError("group")
        return list(map(str, got))

    def group_or_id(self) -> list[str]:
        """Each record's group (its query id when it has none), as the trade-off groups it."""
        if self._group_or_id is None:
            self._group_or_id = list(map(str, self._f.group))
            if _NONE in self._f.group:
                for i, g in enumerate(self._f.group):
                    if g is _NONE:
                        q = self._f.query_id[i]
                        self._group_or_id[i] = str(None if q is _NONE else q)
        return self._group_or_id

    def untagged(self) -> int:
        """How many records have no ``tags`` (:func:`~rag_ablate.run.slices.record_tags` None)."""
        return self._f.tags.count(None)

    def members(self, rows: IndexArray) -> dict[SliceKey, list[int]]:
        """Each slice's positions among the records at ``rows`` (in their order; not yet
        :func:`~rag_ablate.run.slices.sliced`), as :func:`~rag_ablate.run.slices.slice_keys` puts
        them: the records with the same tags, intents, expected behaviour and version (strings) are
        in the same slices, whose keys are made once; a record with metadata (or a value of another
        type: 1, 1.0 and True are equal keys but other slices) has its own."""
        at = rows.tolist()
        recs = list(map(self.records.__getitem__, at))
        read = [
            (
                r.get("intent_gold_l1"),
                r.get("intent_gold"),
                r.get("expected_behavior"),
                r.get("applicable_version"),
                r.get("metadata"),
            )
            for r in recs
        ]
        tags = [None if t is None else tuple(t) for t in map(self._f.tags.__getitem__, at)]
        plain = not (
            set(map(type, chain.from_iterable(read))) - {str, type(None)}
            or set(map(type, chain.from_iterable(filter(None, tags)))) - {str}
        )
        alike: dict[object, list[int]] = {}
        for j, (fields, tag_set) in enumerate(zip(read, tags, strict=True)):
            if plain:
                key: object = (fields, tag_set)
            elif fields[4] or not all(
                type(x) is str for x in (*fields[:4], *(tag_set or ())) if x is not None
            ):
                key = j  # its own slices
            else:
                key = (fields[:4], tag_set)
            got = alike.get(key)
            if got is None:
                alike[key] = [j]
            else:
                got.append(j)
        parts: dict[SliceKey, list[list[int]]] = {}
        for positions in alike.values():
            for key in slice_keys(recs[positions[0]]):
                parts.setdefault(key, []).append(positions)
        return {k: p[0] if len(p) == 1 else sorted(chain.from_iterable(p)) for k, p in parts.items()}

    # ------------------------------------------------------------------ metrics

    def _metric_dicts(self) -> list[Mapping[str, Any]]:
        return self._f.metrics

    def names(self) -> set[str]:
        """Every metric name some record has."""
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
            keys = list(map(tuple, self._metric_dicts()))
            kinds = list(dict.fromkeys(keys))
            if len(kinds) <= _FEW_LAYOUTS:  # one C-level comparison a record and kind
                n = len(keys)
                self._by_names = [
                    (k, np.flatnonzero(np.fromiter(map(eq, keys, repeat(k)), bool, n)).tolist())
                    for k in kinds
                ]
            else:
                by: dict[tuple[str, ...], list[int]] = {k: [] for k in kinds}
                for i, k in enumerate(keys):
                    by[k].append(i)
                self._by_names = list(by.items())
        return self._by_names

    def stored(self, name: str) -> list[Any]:
        """Each record's stored ``metrics[name]`` as it is (None kept; ``_NONE``: no such name)."""
        out: list[Any] = [_NONE] * len(self.records)
        dicts = self._metric_dicts()
        for keys, pos in self._layouts():
            if name in keys:
                for i, v in zip(pos, map(itemgetter(name), map(dicts.__getitem__, pos)), strict=True):
                    out[i] = v
        return out

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
        failed = self.failed
        if metric == ERROR_RATE:  # a stored share (as stored: float() of it), else the status
            out = np.where(failed, 1.0, 0.0)
            if ERROR_RATE in self.names():
                for i, share in enumerate(self.stored(ERROR_RATE)):
                    if share is not None and share is not _NONE:
                        out[i] = float(share)
            return out
        spec = spec_of(metric)
        if metric == LATENCY:  # the metric, else (None, or no such name) timings_ms.total
            out = self.plain([LATENCY])[LATENCY].copy()
            for i in np.flatnonzero(np.isnan(out)).tolist():
                if self._f.metrics[i].get(LATENCY) is None:
                    total = self._total(i)
                    out[i] = math.nan if total is None else float(total)
            out[~np.isfinite(out)] = math.nan
            if spec.uses_failed:
                return out
        else:
            out = self.plain([metric])[metric].copy()
        if not spec.uses_failed:  # a failed record: the miss where it names the metric, else none
            for i in np.flatnonzero(failed).tolist():
                named = metric in self._f.metrics[i]
                out[i] = spec.miss if spec.miss is not None and named else math.nan
        return out

    def spent_latency(self) -> FloatArray:
        """Each record's latency as the trade-off's cost (``tradeoff._latency``): its ``latency_ms``
        metric when it has the name, else ``timings_ms.total``; failed ones too (NaN: None, or not
        finite, as the trade-off leaves them out)."""
        if self._spent is None:
            spent = self.plain([LATENCY])[LATENCY].copy()
            for keys, pos in self._layouts():
                if LATENCY not in keys:
                    for i in pos:
                        total = self._total(i)
                        spent[i] = math.nan if total is None else float(total)
            self._spent = spent
        return self._spent

    def has_usage(self, rows: IndexArray) -> bool:
        """Whether one of the records at ``rows`` reports token usage (``record.get("usage")``)."""
        return any(map(self._f.usage.__getitem__, rows.tolist()))

    def _total(self, i: int) -> Any:
        """Record ``i``'s ``timings_ms.total`` (None: none)."""
        t = self._f.timings[i]
        return (t if t is not _NONE and t else _EMPTY).get("total")

    def ok_only(self, metrics: Sequence[str], rows: IndexArray) -> dict[str, FloatArray]:
        """Each metric of ``metrics`` at ``rows`` (-1: no record, NaN), counting ok queries only: a
        plain metric's stored value over the records not failed, the others' :meth:`value`, finite."""
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
        self._memo: dict[Hashable, Any] = {}

    def memo(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, made once per ``key`` (what several planners derive alike: a split's draw)."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(T, self._memo[key])

    def of(self, variant: VariantData) -> VariantColumns:
        got = self._of.get(id(variant.records))
        if got is None or got[0] is not variant.records:
            got = self._of[id(variant.records)] = (variant.records, VariantColumns(variant.records))
        return got[1]

    def release(self) -> None:
        """:meth:`VariantColumns.release` of every variant: once planned, before the draws run."""
        for _, cols in self._of.values():
            cols.release()
        release_freed()

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
