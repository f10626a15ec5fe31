"""Finding the variants: a sweep folder on disk, or a sweep's parent run in MLflow.

Each job leaves ``records.jsonl``, ``variant.json`` and ``config.yaml`` (names in
:mod:`rag_ablate.core.layout`) in its folder and as artifacts of its child run; the
comparison reads only these, never anything held in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from rag_ablate.compare.guard import FINGERPRINTS
from rag_ablate.compare.model import VariantData
from rag_ablate.core.errors import ComparisonError
from rag_ablate.core.layout import CONFIG_FILE, RECORDS_FILE, SUMMARY_FILE, VARIANT_FILE
from rag_ablate.records.jsonl import dumps_sorted, read_records
from rag_ablate.records.trace import Record


def read_config(path: Path) -> tuple[dict[str, Any] | None, str]:
    """A job's resolved config, or None and why it could not be read."""
    if not path.is_file():
        return None, f"{CONFIG_FILE} missing"
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"{CONFIG_FILE} unreadable ({first})"
    if not isinstance(data, dict):
        return None, f"{CONFIG_FILE} is not a mapping"
    return data, ""


#: what a record's retrieved entries become once read for the comparison (see :func:`slim_record`)
NO_ENTRY: Mapping[str, Any] = MappingProxyType({})


def _outputs(rec: Record) -> bytes:
    """A digest of what the system returned for one query: its status, retrieved chunk ids,
    answer, intents and citations (timings, scores and metrics left out)."""
    retrieved = [(e.get("doc_id"), e.get("chunk_id")) for e in rec.get("retrieved") or []]
    kept = [rec.get("status"), retrieved, rec.get("answer"), rec.get("intent_pred"), rec.get("intents")]
    return hashlib.blake2b(dumps_sorted([*kept, rec.get("citations")]), digest_size=16).digest()


#: record fields whose values (strings, or lists of strings) repeat from query to query
REPEATED_FIELDS = (
    "split",
    "status",
    "kind",
    "intent_gold",
    "intent_gold_l1",
    "intent_pred",
    "tags",
    "intents",
)
#: record fields holding a mapping of names to numbers (shared names, shared float objects)
NUMBER_FIELDS = ("metrics", "timings_ms")
#: how many distinct floats a load shares at most (the discrete values of ranked-list metrics come
#: first; continuous ones, latencies, fill the table and are then kept as they come)
SHARED_FLOATS = 1 << 16
_ZERO, _ONE = 0.0, 1.0


@dataclass(frozen=True)
class _Plan:
    """How to slim a record with one key order: its shared key names and the positions of the
    fields :meth:`_Slimmer.__call__` rewrites."""

    keys: tuple[str, ...]
    repeated: tuple[int, ...]
    numbers: tuple[int, ...]
    retrieved: int  # -1: none


class _Slimmer:
    """:func:`slim_record` with one table of interned names and floats shared by every record of a
    load; it also keeps a digest of each query's outputs (:meth:`outputs`), read before they are
    slimmed."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.key_sets: dict[tuple[str, ...], tuple[str, ...]] = {}  # a dict's keys -> the shared names
        self.plans: dict[tuple[str, ...], _Plan] = {}
        self.floats: dict[float, float] = {_ONE: _ONE}  # 0.0 apart: it equals -0.0 (see _numbers)
        self.digests: dict[str, bytes] = {}

    def outputs(self) -> str:
        """One fingerprint of every query's outputs (the last record of each query counts)."""
        h = hashlib.blake2b(digest_size=16)
        for query_id, digest in sorted(self.digests.items()):
            h.update(query_id.encode("utf-8") + b"\0" + digest)
        return h.hexdigest()

    def _names_of(self, keys: tuple[str, ...]) -> tuple[str, ...]:
        """``keys`` as the shared names (records repeat the same key sets: each set is looked up
        once as a tuple)."""
        shared = self.key_sets.get(keys)
        if shared is None:
            shared = self.key_sets[keys] = tuple(self.names.setdefault(k, k) for k in keys)
        return shared

    def _plan(self, keys: tuple[str, ...]) -> _Plan:
        plan = self.plans[keys] = _Plan(
            self._names_of(keys),
            tuple(i for i, k in enumerate(keys) if k in REPEATED_FIELDS),
            tuple(i for i, k in enumerate(keys) if k in NUMBER_FIELDS),
            keys.index("retrieved") if "retrieved" in keys else -1,
        )
        return plan

    def _numbers(self, d: dict[str, Any]) -> dict[str, Any]:
        """A mapping of names to numbers with shared names and one float object per distinct value
        (0.0 and 1.0, most values of 0/1 metrics, and the first :data:`SHARED_FLOATS` others): a
        new dict, built from the items (the parser's dicts hold spare room, a third of their size).
        The values are equal, only shared; -0.0 keeps its sign (it equals 0.0, so zeros are never
        looked up in the table)."""
        floats = self.floats
        share = floats.setdefault if len(floats) < SHARED_FLOATS else floats.get
        values = [
            (share(x, x) if x else _ZERO if math.copysign(1.0, x) > 0 else x) if type(x) is float else x
            for x in d.values()
        ]
        return dict(zip(self._names_of(tuple(d)), values, strict=True))

    def __call__(self, rec: Record) -> Record:
        self.digests[str(rec.get("query_id"))] = _outputs(rec)
        keys = tuple(rec)
        plan = self.plans.get(keys) or self._plan(keys)
        values = list(rec.values())
        names = self.names
        for i in plan.repeated:  # one string per distinct value of the fields that repeat
            v = values[i]
            if type(v) is str:
                values[i] = names.setdefault(v, v)
            elif type(v) is list:
                values[i] = [names.setdefault(x, x) if type(x) is str else x for x in v]
        for i in plan.numbers:
            v = values[i]
            if type(v) is dict:
                values[i] = self._numbers(v)
        retrieved = values[plan.retrieved] if plan.retrieved >= 0 else None
        if isinstance(retrieved, list):
            values[plan.retrieved] = (NO_ENTRY,) * len(retrieved)
        # a new dict, even where the parser shared the names already (orjson does): see _numbers.
        # Typed as a Record although ``retrieved`` now holds empty entries: the comparison reads
        # its length only (see slim_record)
        return cast(Record, dict(zip(plan.keys, values, strict=True)))


def slim_record(rec: Record) -> Record:
    """A record as the comparison keeps it: every field, but ``retrieved`` keeps only its length
    (each entry an empty read-only mapping; the comparison, the trade-off and the report read
    the list's length, never its entries), and field and metric names are shared between
    records. At 100,000 queries this halves what a variant's records take in memory."""
    return _Slimmer()(rec)


def _variant(
    info: dict[str, Any], records_path: Path, config_path: Path | None, run_id: str | None, source: str
) -> VariantData:
    config, problem = (None, f"{CONFIG_FILE} missing") if config_path is None else read_config(config_path)
    slimmer = _Slimmer()
    records = read_records(records_path, slimmer)
    return VariantData(
        label=str(info["label"]),
        records=records,
        outputs=slimmer.outputs(),
        config=config,
        overrides=[str(o) for o in info.get("overrides", [])],
        run_id=run_id,
        source=source,
        info=info,
        config_problem=problem,
    )


def _job_variant(job: Path) -> VariantData:
    """The variant a job folder (or a single run's folder) holds."""
    info = json.loads((job / VARIANT_FILE).read_text(encoding="utf-8"))
    summary_path = job / SUMMARY_FILE
    run_id = None
    if summary_path.is_file():
        run_id = json.loads(summary_path.read_text(encoding="utf-8")).get("run_id")
    return _variant(info, job / RECORDS_FILE, job / CONFIG_FILE, run_id, str(job))


def load_sweep_dir(sweep_dir: Path) -> list[VariantData]:
    """The variants of a sweep folder, in job order."""
    if not sweep_dir.is_dir():
        raise ComparisonError(f"not a folder: {sweep_dir}")
    if (sweep_dir / RECORDS_FILE).is_file():
        raise ComparisonError(
            f"{sweep_dir} is a single run's folder, not a sweep: a comparison needs a sweep folder "
            "(outputs/multirun/<time>_<id>, made by python -m rag_ablate -m ...) or its MLflow parent run id"
        )
    found = []
    for rec_path in sorted(sweep_dir.glob(f"*/{RECORDS_FILE}")):
        job = rec_path.parent
        if not job.name.isdigit() or not (job / VARIANT_FILE).is_file():  # a sweep's jobs: 0, 1, ...
            continue
        v = _job_variant(job)
        found.append((int(v.info.get("job_num", 0)), v))
    if not found:
        raise ComparisonError(
            f"{sweep_dir} is not a sweep folder with finished jobs: no job folders 0, 1, ... holding "
            f"{RECORDS_FILE} and {VARIANT_FILE} (a sweep folder is outputs/multirun/<time>_<id>)"
        )
    return [v for _, v in sorted(found, key=lambda t: t[0])]


def _mlflow_variant(uri: str, run_id: str, name: str) -> VariantData:
    """The variant an MLflow run holds, from its artifacts."""
    from rag_ablate.tracking import store as tracking

    tmp = Path(tempfile.mkdtemp(prefix="rag_ablate_cmp_"))
    files = tracking.download(uri, run_id, [RECORDS_FILE, VARIANT_FILE, CONFIG_FILE], tmp)
    if RECORDS_FILE not in files:
        raise ComparisonError(f"run {run_id} ({name}) has no {RECORDS_FILE} artifact")
    info = json.loads(files[VARIANT_FILE].read_text(encoding="utf-8")) if VARIANT_FILE in files else {}
    info.setdefault("label", name)
    return _variant(info, files[RECORDS_FILE], files.get(CONFIG_FILE), run_id, f"mlflow run {run_id}")


def load_mlflow_parent(uri: str, parent_run_id: str) -> list[VariantData]:
    """The variants of a sweep's parent run, from its child runs' artifacts."""
    from rag_ablate.tracking import store as tracking

    children = tracking.child_runs(uri, parent_run_id)
    if not children:
        raise ComparisonError(f"run {parent_run_id} has no child runs in {uri}")
    out = [_mlflow_variant(uri, run_id, name) for run_id, name in children]
    return sorted(out, key=lambda v: int(v.info.get("job_num", 0)))


#: the label of a baseline pinned from an earlier run (``rag-ablate compare --baseline-run``)
PINNED_PREFIX = "pinned:"


def load_pinned(ref: str, uri: str) -> VariantData:
    """An earlier run to compare a sweep's variants against, labelled ``pinned:<name>``: a single
    run's folder (``outputs/runs/<time>_<id>``) or a sweep's job folder, a sweep folder (its
    baseline), or an MLflow run id (a run, or a sweep's parent run: its baseline) in ``uri``."""
    path = Path(ref).expanduser()
    if path.is_dir():
        if (path / RECORDS_FILE).is_file() and (path / VARIANT_FILE).is_file():
            v = _job_variant(path)
            name = f"{path.resolve().parent.name}/{path.name}" if path.name.isdigit() else path.name
        else:
            v, name = pick_baseline(load_sweep_dir(path), None)[0], path.resolve().name
    else:
        from rag_ablate.tracking import store as tracking

        children = tracking.child_runs(uri, ref)  # TrackingError names a run id the store lacks
        if children:
            v = pick_baseline(load_mlflow_parent(uri, ref), None)[0]
        else:
            v = _mlflow_variant(uri, ref, ref)
        name = ref
    return replace(v, label=PINNED_PREFIX + name)


def check_same_data(pinned: VariantData, variants: Sequence[VariantData]) -> None:
    """ComparisonError, one line, when a variant ran on another corpus or query set than the pinned
    baseline (their ``variant.json`` fingerprints differ, or one has none)."""
    for v in variants:
        for key, what in FINGERPRINTS:
            mine, theirs = pinned.info.get(key), v.info.get(key)
            if mine is None or mine != theirs:
                raise ComparisonError(
                    f"the pinned baseline {pinned.label} ({pinned.source}) ran on another {what} than "
                    f"{v.label} ({key} {mine} vs {theirs}, dataset {pinned.info.get('dataset')} vs "
                    f"{v.info.get('dataset')}): their queries cannot be paired; pin a run on this dataset"
                )


def pick_baseline(variants: Sequence[VariantData], baseline: str | None) -> tuple[VariantData, list[str]]:
    """The baseline: named, else the variant labelled or tagged baseline, else the first job."""
    labels = [v.label for v in variants]
    notes: list[str] = []
    if baseline is not None:
        for v in variants:
            if v.label == baseline:
                return v, notes
        raise ComparisonError(
            f"baseline '{baseline}' is not a variant of this sweep; variants: {', '.join(labels)}"
        )
    for v in variants:
        if v.label == "baseline" or v.info.get("role") == "baseline":
            return v, notes
    notes.append(
        f"no variant is marked baseline; using the first job, '{variants[0].label}' (see --baseline)"
    )
    return variants[0], notes
