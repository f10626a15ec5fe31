"""The production mix: per-query weights from tags, weighted means, and their paired intervals.

An evaluation set over-collects hard edge cases on purpose, so its plain mean is
not what production traffic sees. ``dataset.slice_weights`` (``{tag: weight}``)
and ``dataset.edge_tags`` (default ``[edge]``) give every query a weight:

* each tag named in ``slice_weights`` contributes its weight;
* an edge tag that ``slice_weights`` does not name contributes 0 (edge cases are
  out of the production headline unless weighted in, e.g. ``{edge: 0.05}``);
* every other tag contributes 1; a query's weight is the **product** of its tags'
  contributions (an untagged query weighs 1; a query that is both ``numeric`` at
  0.5 and ``edge`` at 0.1 weighs 0.05).

The production-weighted mean of a metric is ``sum_i w_i x_i / sum_i w_i`` over the
queries that have a value (only the ratios of the weights matter). Edge-case
queries (any tag in ``edge_tags``) are also reported on their own, as a plain mean.

In the comparison, the weighted effect is the same ratio over the paired
differences ``d_i = variant_i - baseline_i``; its interval comes from the group
bootstrap with the weights carried along: each resample draws the split's groups
with replacement (the draw the plain rows use) and computes
``theta* = sum_g c_g SW_g / sum_g c_g W_g`` with ``SW_g = sum_{i in g} w_i d_i`` and
``W_g = sum_{i in g} w_i`` (a ratio estimator). See docs/statistics.md, "The
production mix".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.core.errors import ComparisonError, ConfigError

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntpArray = npt.NDArray[np.intp]
Counts = Sequence[npt.NDArray[np.integer[Any]]]

DEFAULT_EDGE_TAGS = ("edge",)
#: a split's metric keys for the weighted means and the edge-case means
PROD, EDGE = "prod", "edge"


@dataclass(frozen=True)
class TagWeights:
    """How a query's tags give its production weight (see the module docstring)."""

    weights: Mapping[str, float] = field(default_factory=dict)  # dataset.slice_weights
    edge_tags: tuple[str, ...] = DEFAULT_EDGE_TAGS  # dataset.edge_tags

    def __post_init__(self) -> None:
        check_weights(self.weights)

    @classmethod
    def from_config(cls, dataset: Any) -> TagWeights:
        """From a :class:`~rag_ablate.config.schema.DatasetConfig` or a config.yaml's ``dataset`` mapping."""
        if isinstance(dataset, Mapping):
            raw_w, raw_e = dataset.get("slice_weights"), dataset.get("edge_tags")
        else:
            raw_w, raw_e = getattr(dataset, "slice_weights", None), getattr(dataset, "edge_tags", None)
        if raw_w is not None and not isinstance(raw_w, Mapping):
            raise ConfigError(f"dataset.slice_weights must map tags to weights, got {raw_w!r}")
        weights = {str(k): _number(k, v) for k, v in (raw_w or {}).items()}
        edge = DEFAULT_EDGE_TAGS if raw_e is None else tuple(str(t) for t in raw_e)
        return cls(weights, edge)

    @property
    def effective(self) -> dict[str, float]:
        """Tag -> contribution for every tag that does not weigh 1 by default (edge tags 0)."""
        return {**{t: 0.0 for t in self.edge_tags}, **self.weights}

    def weight(self, tags: Iterable[str]) -> float:
        """A query's weight: the product of its tags' contributions (1 when none is named)."""
        eff = self.effective
        w = 1.0
        for t in set(tags):
            w *= eff.get(t, 1.0)
        return w

    def is_edge(self, tags: Iterable[str]) -> bool:
        return any(t in self.edge_tags for t in tags)

    def describe(self) -> str:
        """``edge 0 (edge case), numeric 0.5; weight = product over a query's tags, others 1``."""
        eff = self.effective
        parts = [
            f"{t} {_fmt(w)}" + (" (edge case)" if t in self.edge_tags and t not in self.weights else "")
            for t, w in sorted(eff.items())
        ]
        return f"{', '.join(parts) or 'none'}; a query weighs the product over its tags, other tags 1"


def _number(tag: object, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"dataset.slice_weights.{tag} must be a number, got {v!r}")
    return float(v)


def _fmt(w: float) -> str:
    return f"{w:g}"


def check_weights(weights: Mapping[str, float]) -> None:
    """Every weight a finite number >= 0 (ConfigError naming the tag otherwise)."""
    for tag, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            raise ConfigError(f"dataset.slice_weights.{tag} must be a finite number >= 0, got {w!r}")


def check_settings(dataset: Any) -> None:
    """Composition-time checks of ``dataset.slice_weights`` and ``dataset.edge_tags``."""
    tw = TagWeights.from_config(dataset)
    for t in tw.edge_tags:
        if not t:
            raise ConfigError("dataset.edge_tags: an empty tag name")


def problems(tw: TagWeights, tag_lists: Sequence[Sequence[str]]) -> tuple[list[str], list[str]]:
    """(errors, warnings) of ``tw`` against the tags a query set has.

    Errors: a ``slice_weights`` tag no query carries (the message lists the set's
    tags with their counts); every query weighing 0. Warning: an edge tag no query
    carries, when it was configured beyond the default ``edge``.
    """
    counts = Counter(t for tags in tag_lists for t in set(tags))
    known = ", ".join(f"{t} ({n})" for t, n in sorted(counts.items())) or "none (no query has tags)"
    errors = [
        f"dataset.slice_weights names tag '{t}', which no query has; the dataset's tags: {known}"
        for t in sorted(tw.weights)
        if t not in counts
    ]
    warnings = [
        f"dataset.edge_tags names tag '{t}', which no query has; the dataset's tags: {known}"
        for t in tw.edge_tags
        if t not in counts and t not in DEFAULT_EDGE_TAGS
    ]
    if tag_lists and not errors and all(tw.weight(tags) == 0 for tags in tag_lists):
        errors.append(f"every query weighs 0 under dataset.slice_weights ({tw.describe()})")
    return errors, warnings


def validate(tw: TagWeights, tag_lists: Sequence[Sequence[str]], source: str) -> list[str]:
    """Raise ConfigError (naming ``source``) on :func:`problems`' errors; return its warnings."""
    errors, warnings = problems(tw, tag_lists)
    if errors:
        raise ConfigError(f"{source}: " + "; ".join(errors))
    return warnings


def trivial(tw: TagWeights, tag_lists: Iterable[Sequence[str]]) -> bool:
    """Every query weighs 1 and none is an edge case: the weighted mean is the plain mean."""
    return all(tw.weight(tags) == 1.0 and not tw.is_edge(tags) for tags in tag_lists)


def normalised(weights: npt.ArrayLike) -> FloatArray:
    """``w / sum(w)``; ComparisonError when a weight is negative or they sum to 0."""
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ComparisonError("weights must be finite and >= 0")
    total = float(w.sum())
    if total <= 0:
        raise ComparisonError("every weight is 0: no weighted mean")
    return np.asarray(w / total, dtype=np.float64)


def weighted_mean(x: npt.ArrayLike, weights: npt.ArrayLike) -> float:
    """``sum w_i x_i / sum w_i``."""
    return float(np.dot(normalised(weights), np.asarray(x, dtype=np.float64)))


def effective_n(weights: npt.ArrayLike) -> float:
    """Kish's effective number of queries, ``(sum w)^2 / sum w^2`` (n when every weight is equal)."""
    w = np.asarray(weights, dtype=np.float64)
    sq = float(np.dot(w, w))
    return float(w.sum()) ** 2 / sq if sq > 0 else 0.0


# --------------------------------------------------------------------------- per run


def _tags(rec: Mapping[str, Any], tags_of: Mapping[str, Sequence[str]] | None) -> Sequence[str]:
    if tags_of is not None and rec["query_id"] in tags_of:
        return tags_of[rec["query_id"]]
    tags = rec.get("tags")
    return [str(t) for t in tags] if tags else []


def run_metrics(
    records: Sequence[Mapping[str, Any]],
    tw: TagWeights,
    splits: Sequence[str],
    tags_of: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, float]:
    """``<split>/prod/<metric>`` (weighted means) and ``<split>/edge/<metric>`` (edge cases' means).

    Per split (``all`` = every record) and per-query metric, over the queries with a
    value, as the plain means. ``<split>/prod/n_queries`` counts the queries with a
    weight > 0 and ``<split>/prod/n_eff`` is their effective number
    (:func:`effective_n`); ``<split>/edge/n_queries`` counts the edge cases. Nothing
    is returned when the weighting is trivial (every query weighs 1, no edge case):
    the plain means are then the production means. A metric whose queries all weigh
    0 in a split has no ``prod`` value there. Tags come from ``tags_of`` (query id ->
    tags) when given, else from each record's ``tags``.
    """
    tag_lists = [tuple(_tags(r, tags_of)) for r in records]
    distinct = dict.fromkeys(tag_lists)  # each distinct list of tags weighed once (most runs have a few)
    if trivial(tw, distinct):
        return {}
    out: dict[str, float] = {}
    weight_of = {tags: tw.weight(tags) for tags in distinct}
    edge_of = {tags: tw.is_edge(tags) for tags in distinct}
    w_all = np.array([weight_of[t] for t in tag_lists])
    edge_all = np.array([edge_of[t] for t in tag_lists], dtype=bool)
    arrays = _finite_columns(records)
    for split in splits:
        in_split = np.array([split == "all" or r["split"] == split for r in records], dtype=bool)
        idx = np.flatnonzero(in_split)
        w, edge = w_all[idx], edge_all[idx]
        out[f"{split}/{PROD}/n_queries"] = float(np.count_nonzero(w > 0))
        out[f"{split}/{PROD}/n_eff"] = effective_n(w)
        out[f"{split}/{EDGE}/n_queries"] = float(np.count_nonzero(edge))
        # what a metric's records give (which of its values are the split's, their normalised weights
        # when they sum above 0, which are edge cases when some are), made once for all the metrics
        # whose values come from the same records (most of a run's metrics)
        of_rows: dict[bytes, tuple[BoolArray, FloatArray | None, BoolArray | None]] = {}
        for name in sorted(arrays):
            values, at = arrays[name]
            found = of_rows.get(at_key := at.tobytes())
            if found is None:
                keep = in_split[at]
                rows = at[keep]
                wn, en = w_all[rows].astype(np.float64), edge_all[rows]
                found = of_rows[at_key] = (
                    keep,
                    normalised(wn) if wn.sum() > 0 else None,
                    en if en.any() else None,
                )
            keep, norm, en = found
            if not keep.any():  # no record of this split has a value
                continue
            x = values[keep]
            if norm is not None:  # weighted_mean(x, wn)
                out[f"{split}/{PROD}/{name}"] = float(np.dot(norm, np.asarray(x, dtype=np.float64)))
            if en is not None:
                out[f"{split}/{EDGE}/{name}"] = float(x[en].mean())
    return out


_FLOAT = {float}


def _finite_columns(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[FloatArray, IntpArray]]:
    """Every metric's finite values (as floats) and the positions of their records, in record order:
    read once for all splits (a split takes the values of its records, in the same order).

    A record whose values are all floats with a finite sum (so each is finite) keeps all of them:
    the records with the same names in the same order are transposed together in C. The others'
    values are tested one by one. A metric found in several such groups has its values put back in
    record order by their positions (each position once: the order is the records')."""
    shapes: dict[tuple[str, ...], list[int]] = {}  # names -> positions of the records kept whole
    loose: dict[str, tuple[list[float], list[int]]] = {}  # the other records' finite values, positions
    for i, r in enumerate(records):
        metrics: Mapping[str, Any] = r.get("metrics") or {}
        values = metrics.values()
        if set(map(type, values)) == _FLOAT and math.isfinite(sum(values)):
            shapes.setdefault(tuple(metrics), []).append(i)
            continue
        for name, v in metrics.items():
            if v is not None and math.isfinite(float(v)):
                column = loose.get(name)
                if column is None:
                    column = loose[name] = ([], [])
                column[0].append(float(v))
                column[1].append(i)
    parts: dict[str, list[tuple[FloatArray, IntpArray]]] = {  # metric -> its (values, positions)
        name: [(np.array(v, dtype=np.float64), np.array(pos, dtype=np.intp))]
        for name, (v, pos) in loose.items()
    }
    for names, positions in shapes.items():
        rows = [records[i]["metrics"].values() for i in positions]
        at = np.array(positions, dtype=np.intp)  # one array for all the group's metrics (never changed)
        for name, column in zip(names, zip(*rows, strict=True), strict=True):
            parts.setdefault(name, []).append((np.array(column, dtype=np.float64), at))
    out: dict[str, tuple[FloatArray, IntpArray]] = {}
    for name, found in parts.items():
        if len(found) == 1:
            out[name] = found[0]
            continue
        values_of = np.concatenate([v for v, _ in found])
        at = np.concatenate([p for _, p in found])
        order = np.argsort(at, kind="stable")
        out[name] = (values_of[order], at[order])
    return out


# --------------------------------------------------------------------------- paired comparison


# --------------------------------------------------------------------------- rendering


def check_folder(dataset: Any) -> None:
    """Before a sweep spends anything: every ``dataset.slice_weights`` tag is a tag of the
    dataset folder's queries (read from ``queries.jsonl`` without loading the dataset).

    Nothing to check without ``slice_weights``; a folder that cannot be read is left to
    the dataset loader, which names file and line.
    """
    import json
    from pathlib import Path

    from rag_ablate.dataset.model import QUERIES_FILE, sample_dataset_path

    tw = TagWeights.from_config(dataset)
    if not tw.weights:
        return
    path = getattr(dataset, "path", None)
    queries = (sample_dataset_path() if path is None else Path(path).expanduser()) / QUERIES_FILE
    try:
        lines = queries.read_text(encoding="utf-8").splitlines()
        objs = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError):
        return
    tags = [o.get("tags") if isinstance(o, dict) else None for o in objs]
    tag_lists = [[str(t) for t in ts] if isinstance(ts, list) else [] for ts in tags]
    validate(tw, tag_lists, str(queries))
