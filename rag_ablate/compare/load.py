"""Finding the variants: a sweep folder on disk, or a sweep's parent run in MLflow.

Each job leaves ``records.jsonl``, ``variant.json`` and ``config.yaml`` (names in
:mod:`rag_ablate.core.layout`) in its folder and as artifacts of its child run; the
comparison reads only these, never anything held in memory.
"""

from __future__ import annotations

import bisect
import gc
import itertools
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_ablate.compare.guard import FINGERPRINTS
from rag_ablate.compare.model import VariantData
from rag_ablate.compare.slim import NO_ENTRY as NO_ENTRY  # re-exported
from rag_ablate.compare.slim import Piece, SlimFile, line_boundary, read_slim, start_worker, worker_results
from rag_ablate.compare.slim import slim_record as slim_record  # re-exported
from rag_ablate.core.errors import ComparisonError
from rag_ablate.core.layout import CONFIG_FILE, RECORDS_FILE, SUMMARY_FILE, VARIANT_FILE
from rag_ablate.records.jsonl import gc_paused
from rag_ablate.records.trace import Record

#: a sweep's records files at least this large in all are read side by side, by this process and
#: worker processes (:func:`read_all`): parsing is the comparison's largest serial cost (about 35 us
#: a record)
PARALLEL_BYTES = 64 << 20
#: what a byte of records costs a worker process (parsing, packing, pickling it), against this
#: process reading it; measured at 100,000 queries (benchmarks/RESULTS.md, read30). A worker sends
#: its pieces once it has read them all, and this process takes them once it has read its own:
#: :func:`plan_pieces` has both reads end together
WORKER_COST = 1.5


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


def _variant(
    info: dict[str, Any],
    records_path: Path,
    config_path: Path | None,
    run_id: str | None,
    source: str,
    read: tuple[list[Record], str] | None = None,
) -> VariantData:
    config, problem = (None, f"{CONFIG_FILE} missing") if config_path is None else read_config(config_path)
    records, outputs = read_slim(records_path) if read is None else read
    return VariantData(
        label=str(info["label"]),
        records=records,
        outputs=outputs,
        config=config,
        overrides=[str(o) for o in info.get("overrides", [])],
        run_id=run_id,
        source=source,
        info=info,
        config_problem=problem,
    )


def read_all(paths: Sequence[Path]) -> list[tuple[list[Record], str]]:
    """:func:`~rag_ablate.compare.slim.read_slim` of each records file, in order: side by side when
    they hold :data:`PARALLEL_BYTES` or more and there are cores to spare, else one by one. Side by
    side, the files are cut into pieces at line boundaries (:func:`plan_pieces`): this process reads
    the first bytes, each worker process (a core but one, at most one a file) the next share, so
    that all end their reading together. The same records either way (errors naming the same file
    and line); what a worker could not read is read here.

    Records that large are kept out of the cyclic collector's sight once read (``gc.freeze``,
    after a collection before reading, so no garbage is frozen): they are acyclic, reference
    counting frees them, and each full collection of the comparison's later phases would walk
    them all (at 100,000 queries five of them, 6 s of CPU)."""
    if sum(p.stat().st_size for p in paths) < PARALLEL_BYTES:
        return [read_slim(p) for p in paths]
    gc.collect()
    with gc_paused():  # across the pieces too: each piece's end set off a full collection
        out = _read_side_by_side(paths)
        gc.freeze()
    return out


def plan_pieces(paths: Sequence[Path], n_workers: int) -> list[list[Piece]]:
    """The pieces of ``paths`` this process reads (first) and each of ``n_workers`` worker processes
    reads, so that all end their reading together: the files laid end to end, each worker the share
    ``1 / (n_workers + WORKER_COST)`` of the bytes at their end (one worker on 3 equal files: 1.2
    files), this process the rest at their start; each cut moved on to a line boundary."""
    sizes = [p.stat().st_size for p in paths]
    firsts = list(itertools.accumulate(sizes, initial=0))  # each file's first byte, laid end to end
    total = firsts[-1]
    share = 1 / (n_workers + WORKER_COST)
    cuts = [0]
    for j in range(n_workers, 0, -1):  # where each share starts, this process's end first
        cut = max(cuts[-1], round(total * (1 - j * share)))
        if cut < total:
            i = bisect.bisect_right(firsts, cut) - 1  # the file the cut falls in
            cut = firsts[i] + line_boundary(paths[i], cut - firsts[i])
        cuts.append(cut)
    cuts.append(total)
    return [
        [
            Piece(path, max(lo - first, 0), min(hi - first, size))
            for path, size, first in zip(paths, sizes, firsts, strict=False)
            if max(lo - first, 0) < min(hi - first, size)
        ]
        for lo, hi in itertools.pairwise(cuts)
    ]


def _read_side_by_side(paths: Sequence[Path]) -> list[tuple[list[Record], str]]:
    n_workers = min((os.cpu_count() or 1) - 1, len(paths))
    if n_workers < 1:
        return [read_slim(p) for p in paths]
    mine, *shares = plan_pieces(paths, n_workers)
    theirs = [pieces for pieces in shares if pieces]
    procs = [start_worker(pieces) for pieces in theirs]
    try:
        files = {p: SlimFile() for p in paths}
        for piece in mine:
            files[piece.path].read(piece)
        for proc, pieces in zip(procs, theirs, strict=True):
            for piece, got in zip(pieces, worker_results(proc, len(pieces)), strict=True):
                if got is None:
                    files[piece.path].read(piece)
                else:
                    files[piece.path].take(got)
        return [files[p].result() for p in paths]
    finally:
        for proc in procs:  # an error above: no worker left behind (wait() twice is harmless)
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _job_variant(job: Path, read: tuple[list[Record], str] | None = None) -> VariantData:
    """The variant a job folder (or a single run's folder) holds (``read``: its records, read)."""
    info = json.loads((job / VARIANT_FILE).read_text(encoding="utf-8"))
    summary_path = job / SUMMARY_FILE
    run_id = None
    if summary_path.is_file():
        run_id = json.loads(summary_path.read_text(encoding="utf-8")).get("run_id")
    return _variant(info, job / RECORDS_FILE, job / CONFIG_FILE, run_id, str(job), read)


def load_sweep_dir(sweep_dir: Path) -> list[VariantData]:
    """The variants of a sweep folder, in job order."""
    if not sweep_dir.is_dir():
        raise ComparisonError(f"not a folder: {sweep_dir}")
    if (sweep_dir / RECORDS_FILE).is_file():
        raise ComparisonError(
            f"{sweep_dir} is a single run's folder, not a sweep: a comparison needs a sweep folder "
            "(outputs/multirun/<time>_<id>, made by python -m rag_ablate -m ...) or its MLflow parent run id"
        )
    jobs = [
        p.parent
        for p in sorted(sweep_dir.glob(f"*/{RECORDS_FILE}"))
        if p.parent.name.isdigit() and (p.parent / VARIANT_FILE).is_file()  # a sweep's jobs: 0, 1, ...
    ]
    found = []
    for job, read in zip(jobs, read_all([job / RECORDS_FILE for job in jobs]), strict=True):
        v = _job_variant(job, read)
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
