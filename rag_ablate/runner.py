"""Run one variant: load data, run the target over every query, score, record, log.

Everything a job produces lands in its Hydra output folder first (records.jsonl,
summary.json, intents.md, variant.json, config.yaml); MLflow gets a copy. The
sweep-wide steps (summary table, comparison) read these files back, so they work
whatever launcher ran the jobs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rag_ablate import tracking
from rag_ablate.ablation import job_entry
from rag_ablate.cache import Cache
from rag_ablate.config import RUNTIME_KEYS, RunConfig, to_settings
from rag_ablate.dataset import Dataset, load_dataset
from rag_ablate.export import write_trec
from rag_ablate.layout import (
    CONFIG_FILE,
    INTENTS_JSON,
    INTENTS_MD,
    METRICS_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
    VARIANT_FILE,
)
from rag_ablate.metrics import intent_report
from rag_ablate.records import RECORDS_FILE, Record, aggregate, make_record, scored, write_records
from rag_ablate.report import print_table, ui_hint
from rag_ablate.systems import SYSTEMS, System, Trace


@lru_cache(maxsize=4)
def _cached_dataset(
    path: str | None, name: str, holdout_share: float, threshold: float, seed: int
) -> Dataset:
    return load_dataset(path, name=name, holdout_share=holdout_share, group_threshold=threshold, seed=seed)


def get_dataset(s: RunConfig) -> Dataset:
    d = s.dataset
    return _cached_dataset(d.path, d.name, d.holdout_share, d.group_threshold, s.seed)


def _strip_quotes(override: str) -> str:
    return override.replace("'", "").replace('"', "")


def is_runtime_override(override: str) -> bool:
    key = override.lstrip("+~").split("=", 1)[0]
    return any(key == k or key.startswith(k + ".") for k in RUNTIME_KEYS)


def variant_label(overrides: list[str]) -> str:
    """A run's name: what it changes (``chunk=256``), or ``baseline``."""
    factors = [_strip_quotes(o) for o in overrides if not is_runtime_override(o)]
    return ",".join(factors) or "baseline"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def evaluate(
    target: System, dataset: Dataset, ks: list[int], *, progress: bool = False, label: str = ""
) -> list[Record]:
    """Run every query through the target and score it.

    A query that raises is recorded with status ``failed`` and its error, never
    dropped or scored as a miss; so is a query whose scoring raises. Every query
    keeps its elapsed time (``timings_ms["total"]``, the record's ``latency_ms``):
    a failure is timed until it failed, so a timeout cannot improve p95. A
    system's own ``total`` is kept when it reports one.
    """
    records = []
    bar = tqdm(dataset.queries, desc=f"querying [{label}]", unit="q", disable=not progress, leave=False)
    for q in bar:
        t0 = time.perf_counter()
        try:
            trace = target.run(q)
        except Exception as exc:
            trace = Trace(q.query_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        elapsed_ms = (time.perf_counter() - t0) * 1000
        trace.timings_ms.setdefault("total", elapsed_ms)
        rec = make_record(q, trace)
        records.append(scored(rec, q, dataset.documents, ks, routed=target.routes_intents))
    return records


def run_variant(cfg: DictConfig) -> float | None:
    s = to_settings(cfg)
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    cwd = Path(hc.runtime.cwd)
    output_root = (cwd / s.paths.output_root).resolve()
    overrides = list(hc.overrides.task)
    choices = {
        k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith("hydra") and v is not None
    }
    multirun = hc.mode == RunMode.MULTIRUN
    entry = job_entry(Path(hc.sweep.dir), int(hc.job.num)) if multirun else None
    label = entry["label"] if entry else variant_label(overrides)
    ablation = {
        "role": entry["role"] if entry else ("variant" if multirun else "single"),
        "factor": entry.get("factor") if entry else None,
        "level": entry.get("level") if entry else None,
        "mode": s.ablation.mode if entry else "none",
    }

    # the MLflow store is opened before anything is spent: an unusable one fails at once
    store = _open_store(s, output_root, Path(hc.sweep.dir) if multirun else None)

    t_start = time.perf_counter()
    dataset = get_dataset(s)
    cache = Cache(Path(s.cache.dir) if s.cache.dir else output_root / "cache", enabled=s.cache.enabled)
    target = SYSTEMS.get(s.system.name)(s, cache)
    try:
        build_info = target.prepare(dataset)
        records = evaluate(target, dataset, s.metrics.ks, progress=s.progress, label=label)
    finally:
        target.close()

    n_failed = sum(1 for r in records if r["status"] != "ok")
    wall = time.perf_counter() - t_start

    job_dir.mkdir(parents=True, exist_ok=True)
    write_records(job_dir / RECORDS_FILE, records)
    write_trec(records, dataset, job_dir, label)
    metrics = aggregate(records)
    metrics["run/wall_seconds"] = wall
    # whatever numeric facts the system reported (index size, build time, ...) as run/<key>
    metrics.update(
        {
            "run/" + key.replace(".", "_"): float(value)
            for key, value in build_info.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
    )
    metrics.update(cache.metrics())

    # intent accuracy needs a routed query that did not fail; without one it is absent, not an error
    if target.routes_intents and any(r["intent_gold"] is not None and r["status"] == "ok" for r in records):
        by_id = {q.query_id: q for q in dataset.queries}
        report = intent_report(
            [
                (by_id[r["query_id"]].intent_l1, r["intent_gold"], r["intent_pred"])
                for r in records
                if r["intent_gold"] is not None and r["status"] == "ok"
            ]
        )
        (job_dir / INTENTS_MD).write_text(report.to_markdown(), encoding="utf-8")
        (job_dir / INTENTS_JSON).write_text(
            json.dumps(report.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8"
        )

    (job_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=1, sort_keys=True), encoding="utf-8")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    (job_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(resolved), encoding="utf-8")
    variant = {
        "label": label,
        "overrides": overrides,
        "choices": choices,
        "job_num": hc.job.num if multirun else 0,
        **ablation,
        "dataset": dataset.name,
        "corpus_fingerprint": dataset.corpus_fingerprint,
        "queries_fingerprint": dataset.queries_fingerprint,
    }
    (job_dir / VARIANT_FILE).write_text(json.dumps(variant, ensure_ascii=False, indent=1), encoding="utf-8")

    run_id = None
    if store is not None:
        run_id = _log_to_mlflow(
            store, ablation, s, cwd, job_dir, label, choices, dataset, build_info, metrics
        )
    summary = {
        "label": label,
        "run_id": run_id,
        "metrics": metrics,
        "n_failed": n_failed,
        "build": build_info,
        "job_dir": str(job_dir),
    }
    (job_dir / SUMMARY_FILE).write_text(json.dumps(summary, ensure_ascii=False, indent=1), encoding="utf-8")

    if not multirun:
        print_table([summary], s.metrics.summary)
        print(f"\nrecords: {job_dir / RECORDS_FILE}")
        if store is not None:
            print(ui_hint(store.uri))
    return metrics.get("holdout/recall_at_5")


def resolve_tracking(s: RunConfig, output_root: Path) -> tuple[str, Path]:
    """The tracking URI and artifact root of a run (see :func:`rag_ablate.tracking.resolve`)."""
    return tracking.resolve(s.tracking, output_root)


@dataclass(frozen=True)
class _Store:
    uri: str
    experiment_id: str
    parent_run_id: str | None


def _open_store(s: RunConfig, output_root: Path, sweep_dir: Path | None) -> _Store | None:
    """Where this run logs: the sweep's parent run (opened by the sweep driver), or a
    store opened here; None without tracking. Raises TrackingError for an unusable store."""
    if not s.tracking.enabled:
        return None
    if sweep_dir is not None and (sweep_dir / SWEEP_FILE).is_file():
        info = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
        if info.get("parent_run_id"):
            return _Store(info["tracking_uri"], info["experiment_id"], info["parent_run_id"])
    uri, artifacts = resolve_tracking(s, output_root)
    experiment_id = tracking.open_store(
        uri, s.tracking.experiment, artifacts, create_folder=s.tracking.uri is None
    )
    return _Store(uri, experiment_id, None)


def _log_to_mlflow(
    store: _Store,
    ablation: dict[str, Any],
    s: RunConfig,
    cwd: Path,
    job_dir: Path,
    label: str,
    choices: dict[str, str],
    dataset: Dataset,
    build_info: dict[str, Any],
    metrics: dict[str, float],
) -> str:
    params = flatten(asdict(s))
    params.update(build_info)
    params["dataset.resolved_path"] = str(dataset.path)
    tags = tracking.base_tags(cwd)
    tags.update({f"choice.{k}": v for k, v in choices.items()})
    tags["dataset.name"] = dataset.name
    tags["dataset.corpus_fingerprint"] = dataset.corpus_fingerprint
    tags["dataset.queries_fingerprint"] = dataset.queries_fingerprint
    tags["variant"] = label
    tags["ablation.role"] = str(ablation["role"])
    tags["ablation.mode"] = str(ablation["mode"])
    tags["ablation.factor"] = (
        "baseline" if ablation["role"] == "baseline" else str(ablation["factor"] or label)
    )
    tags["ablation.level"] = "baseline" if ablation["role"] == "baseline" else str(ablation["level"] or label)
    return tracking.log_run(
        store.uri,
        store.experiment_id,
        label,
        params=params,
        metrics=metrics,
        tags=tags,
        artifacts_dir=job_dir,
        parent_run_id=store.parent_run_id,
    )
