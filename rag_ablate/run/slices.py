"""Slices of one run: every metric per tag and per intent.

A *slice* is the set of queries that share one tag (``tag=multi_doc``), one parent
intent (``intent_l1=KNOWLEDGE``), one leaf intent (``intent_l2=K_product``), one
``expected_behavior`` (``expected_behavior=clarify``), one ``applicable_version``
(``applicable_version=v2``) or one value of a metadata key (``metadata.product=phone``:
a top-level key whose value is a string, an integer, a boolean or a list of them; each
list item is a slice, like tags; a key with more than :data:`MAX_METADATA_VALUES` values
among the records, such as a per-query id, is not sliced). A query
is in the slice of each of its tags and of its two gold intents, so tag slices overlap
and do not add up to the whole. Records carry everything a slice needs (``tags``,
``intent_gold_l1``, ``intent_gold``, ``expected_behavior``, ``applicable_version``,
``metadata``; see :func:`rag_ablate.records.scoring.make_record`), so
:func:`slice_metrics` works from ``records.jsonl`` alone. A record written before tags
were recorded has no ``tags`` key: it is in its intent slices only, and the table
counts such records (``n_without_tags``).

Each slice gets exactly what :func:`rag_ablate.records.scoring.aggregate` gives a whole run
(split-prefixed means, ``n_queries``, ``n_failed``, ``error_rate``, latency
percentiles; failed queries count in ``n_failed`` and never in quality means), plus
the number of queries behind each mean (``n_values``). A job writes the table as
``slices.json`` and ``slices.md`` and logs a bounded set of MLflow metrics
(:func:`mlflow_slice_metrics`). The comparison tests each slice on its own
(:mod:`rag_ablate.compare.slices`; docs/statistics.md, "Slices").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_ablate.core.fsio import write_json_atomic, write_text_atomic
from rag_ablate.core.layout import SLICES_JSON, SLICES_MD
from rag_ablate.dataset.model import SPLITS
from rag_ablate.metrics.registry import direction_of, display_name
from rag_ablate.records.scoring import MetricItems, aggregate_counted, metric_items
from rag_ablate.records.trace import Record

#: the kinds of slice, in the order tables list them (then ``metadata.<key>``, by key)
KINDS = ("tag", "intent_l1", "intent_l2", "expected_behavior", "applicable_version")
METADATA_KIND = "metadata."
#: a metadata key with more distinct values than this among the records is not sliced (an id, a date)
MAX_METADATA_VALUES = 50
#: MLflow metrics per run: only slices with at least this many queries with a value in every split ...
MLFLOW_MIN_QUERIES = 20
#: ... and at most this many slices (the largest first), one metric each: at most 2 x 12 = 24 keys
MLFLOW_MAX_SLICES = 12
MLFLOW_PREFIX = "slice/"


@dataclass(frozen=True, order=True)
class SliceKey:
    """One slice: its kind (``tag``, ``intent_l1``, ``intent_l2``) and value."""

    kind: str
    value: str

    @property
    def name(self) -> str:
        """``tag=multi_doc``."""
        return f"{self.kind}={self.value}"

    def sort_key(self) -> tuple[int, str, str]:
        return (KINDS.index(self.kind) if self.kind in KINDS else len(KINDS), self.kind, self.value)


def record_tags(rec: Record) -> tuple[str, ...] | None:
    """A record's tags; None for a record written before tags were recorded (no ``tags`` key)."""
    tags = rec.get("tags")
    if tags is None:
        return None
    if not tags:  # (most imported sets' records)
        return ()
    return tuple(dict.fromkeys(str(t) for t in tags))  # a tag listed twice is one slice


def _metadata_values(value: object) -> list[str]:
    """The slice values of one metadata value: a string, integer or boolean (``true``/``false``), or
    each such item of a list; nothing for other values (floats, objects, null)."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, bool):
            out.append("true" if item else "false")
        elif isinstance(item, str | int):
            out.append(str(item))
    return list(dict.fromkeys(out))


def slice_keys(rec: Record) -> list[SliceKey]:
    """The slices a record belongs to: one per tag, its parent and its leaf gold intent, its expected
    behaviour and applicable version, and one per value of each metadata key (see the module docstring)."""
    return [SliceKey(kind, value) for kind, value in _slice_pairs(rec)]


def _slice_pairs(rec: Record) -> list[tuple[str, str]]:
    """:func:`slice_keys` as (kind, value) pairs (a pair is hashed in C; a SliceKey is made per slice)."""
    tags = record_tags(rec)
    pairs = [("tag", t) for t in tags] if tags else []
    get = rec.get
    if (l1 := get("intent_gold_l1")) is not None:
        pairs.append(("intent_l1", str(l1)))
    if (l2 := get("intent_gold")) is not None:
        pairs.append(("intent_l2", str(l2)))
    if (behavior := get("expected_behavior")) is not None:
        pairs.append(("expected_behavior", str(behavior)))
    if (version := get("applicable_version")) is not None:
        pairs.append(("applicable_version", str(version)))
    for name, value in (rec.get("metadata") or {}).items():
        pairs.extend((METADATA_KIND + str(name), v) for v in _metadata_values(value))
    return pairs


def sliced(out: dict[SliceKey, list[Any]]) -> dict[SliceKey, list[Any]]:
    """``out`` (slice -> members) by kind then value, without the metadata keys that have more than
    :data:`MAX_METADATA_VALUES` values."""
    widths: dict[str, int] = {}
    for key in out:
        widths[key.kind] = widths.get(key.kind, 0) + 1
    return {
        k: out[k]
        for k in sorted(out, key=SliceKey.sort_key)
        if not (k.kind.startswith(METADATA_KIND) and widths[k.kind] > MAX_METADATA_VALUES)
    }


def members(records: Iterable[Record]) -> dict[SliceKey, list[Record]]:
    """Each slice's records (in the given order), slices by kind then value."""
    return _members_counted(records)[0]


def _members_counted(records: Iterable[Record]) -> tuple[dict[SliceKey, list[Record]], int]:
    """:func:`members`, and how many records have no tags recorded (:func:`record_tags` is None), from
    the same pass over the records."""
    by_pair: dict[tuple[str, str], list[Record]] = {}
    n_without = 0
    for rec in records:
        if rec.get("tags") is None:  # record_tags(rec) is None
            n_without += 1
        for pair in _slice_pairs(rec):
            by_pair.setdefault(pair, []).append(rec)
    return sliced({SliceKey(kind, value): rows for (kind, value), rows in by_pair.items()}), n_without


@dataclass
class Slice:
    """One slice of a run: ``metrics`` as :func:`aggregate` gives them, ``n_values`` behind each mean."""

    key: SliceKey
    metrics: dict[str, float]
    n_values: dict[str, dict[str, int]]

    def mean(self, split: str, metric: str) -> float | None:
        return self.metrics.get(f"{split}/{metric}")

    def n(self, split: str, metric: str) -> int:
        return self.n_values.get(split, {}).get(metric, 0)


@dataclass
class SliceTable:
    """Every slice of one run (see the module docstring)."""

    slices: list[Slice]
    n_records: int
    n_without_tags: int = 0
    kinds: list[str] = field(default_factory=lambda: list(KINDS))

    def get(self, kind: str, value: str) -> Slice | None:
        for s in self.slices:
            if s.key == SliceKey(kind, value):
                return s
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kinds": self.kinds,
            "n_records": self.n_records,
            "n_without_tags": self.n_without_tags,
            "slices": [
                {
                    "kind": s.key.kind,
                    "value": s.key.value,
                    "name": s.key.name,
                    "metrics": s.metrics,
                    "n_values": s.n_values,
                }
                for s in self.slices
            ],
        }

    def to_markdown(self, metrics: Sequence[str], splits: Sequence[str] = SPLITS) -> str:
        """One table per split: each slice's queries, failures and ``metrics`` (queries behind each
        mean in brackets); within each kind the worst slice on the first metric comes first."""
        out = [
            "# Slices",
            "",
            "Every metric per tag, gold intent, expected behaviour, applicable version and metadata value "
            "(all of them: slices.json). A query is in the slice of each of its tags and intents, so slices "
            "overlap. Means run over the queries with a value (failed queries count in `failed` only); `(n)` "
            "is how many.",
            "",
        ]
        if self.n_without_tags:
            out += [
                f"{self.n_without_tags} of {self.n_records} records carry no tags (written before tags "
                "were recorded): they are in their intent slices only.",
                "",
            ]
        first = metrics[0] if metrics else None
        for split in splits:
            headers = ["slice", "queries", "failed", *(display_name(m) for m in metrics)]
            rows: list[list[str]] = []
            for kind in self.kinds:
                of_kind = [
                    s for s in self.slices if s.key.kind == kind and s.metrics.get(f"{split}/n_queries")
                ]
                of_kind.sort(key=lambda s: _worst_first(s, split, first))
                for s in of_kind:
                    cells = [
                        s.key.name,
                        str(int(s.metrics[f"{split}/n_queries"])),
                        str(int(s.metrics.get(f"{split}/n_failed", 0))),
                    ]
                    for m in metrics:
                        v = s.mean(split, m)
                        cells.append("-" if v is None else f"{_fmt(v)} ({s.n(split, m)})")
                    rows.append(cells)
            out += [f"## {split}", ""]
            if not rows:
                out += ["No queries.", ""]
                continue
            out += [
                "| " + " | ".join(headers) + " |",
                "|---|" + "---:|" * (len(headers) - 1),
                *("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows),
                "",
            ]
        return "\n".join(out)


def _fmt(v: float) -> str:
    return f"{v:.1f}" if abs(v) >= 100 else f"{v:.3f}"


def _worst_first(s: Slice, split: str, metric: str | None) -> tuple[int, float, str]:
    """Sort key: slices with a value before those without; the worst value first (by direction)."""
    v = None if metric is None else s.mean(split, metric)
    if v is None or metric is None:
        return (1, 0.0, s.key.value)
    sign = 1.0 if direction_of(metric) == "higher" else -1.0
    return (0, sign * v, s.key.value)


def slice_metrics(
    records: Sequence[Record],
    items: Sequence[MetricItems] | None = None,
    whole: tuple[dict[str, float], dict[str, dict[str, int]]] | None = None,
) -> SliceTable:
    """Every slice of a run's final records, with :func:`aggregate`'s metrics for each (``items``: the
    records' :func:`~rag_ablate.records.scoring.metric_items`, when the caller has them already;
    ``whole``: ``aggregate_counted(records)`` when the caller has it, which a slice of every record
    (a dataset's one tag) then shares instead of computing it again)."""
    # each record's values, read once for all its slices (when some slice needs them)
    items_of: dict[int, MetricItems] = {}

    def counted(rows: list[Record]) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
        if whole is not None and len(rows) == len(records):  # a slice's rows keep the records' order
            return dict(whole[0]), {split: dict(n) for split, n in whole[1].items()}
        if not items_of:
            items_of.update(zip(map(id, records), items or [metric_items(r) for r in records], strict=True))
        return aggregate_counted(rows, items=[items_of[id(r)] for r in rows])

    by_key, n_without = _members_counted(records)
    slices = [Slice(key, *counted(rows)) for key, rows in by_key.items()]
    kinds = [*KINDS, *dict.fromkeys(s.key.kind for s in slices if s.key.kind not in KINDS)]
    return SliceTable(slices, len(records), n_without, kinds)


_BAD_KEY_CHARS = re.compile(r"[^\w.\- ]")


def _key_part(text: str) -> str:
    part = _BAD_KEY_CHARS.sub("_", text).strip(" .") or "_"
    return re.sub(r"\.{2,}", "_", part)  # never a path step such as ".."


def mlflow_key(key: SliceKey, split: str, metric: str) -> str:
    """``slice/tag.multi_doc/holdout/recall_at_5``: MLflow allows letters, digits, ``_ - . /`` and
    spaces in a metric name (no ``=``), so kind and value are joined by a dot and any other character
    of the value or of a metadata key (and a ``/``) becomes ``_``."""
    kind, value = (_key_part(t) for t in (key.kind, key.value))
    return f"{MLFLOW_PREFIX}{kind}.{value}/{split}/{metric}"


def mlflow_slice_metrics(
    table: SliceTable,
    metric: str,
    *,
    splits: Sequence[str] = SPLITS,
    min_queries: int = MLFLOW_MIN_QUERIES,
    max_slices: int = MLFLOW_MAX_SLICES,
) -> dict[str, float]:
    """The slice metrics a run logs to MLflow, bounded: one metric (the headline quality metric),
    only slices with at least ``min_queries`` values of it in every split, at most ``max_slices``
    of them (most queries first, then by kind and value), so at most ``max_slices x len(splits)``
    keys. Everything else stays in the run's ``slices.json``."""
    eligible = [s for s in table.slices if all(s.n(sp, metric) >= min_queries for sp in splits)]
    eligible.sort(key=lambda s: (-sum(s.n(sp, metric) for sp in splits), s.key.sort_key()))
    out: dict[str, float] = {}
    for s in eligible[:max_slices]:
        for sp in splits:
            v = s.mean(sp, metric)
            name = mlflow_key(s.key, sp, metric)
            if v is not None and math.isfinite(v) and name not in out:
                out[name] = float(v)
    return out


def write_slices(table: SliceTable, job_dir: Path, metrics: Sequence[str]) -> list[Path]:
    """``slices.json`` and ``slices.md`` (``metrics`` as the table's columns) in ``job_dir``."""
    j, md = job_dir / SLICES_JSON, job_dir / SLICES_MD
    write_json_atomic(j, table.to_dict())
    write_text_atomic(md, table.to_markdown(metrics))
    return [j, md]
