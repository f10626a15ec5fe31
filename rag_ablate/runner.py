"""Run one variant: load data, run the target over every query, score, record, log.

Everything a job produces lands in its Hydra output folder first (records.jsonl,
summary.json, intents.md, variant.json, config.yaml); MLflow gets a copy. The
sweep-wide steps (summary table, comparison) read these files back, so they work
whatever launcher ran the jobs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
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
from rag_ablate.metrics import intent_report
from rag_ablate.records import RECORDS_FILE, Record, aggregate, make_record, score_record, write_records
from rag_ablate.report import print_table, ui_hint
from rag_ablate.target import Target, Trace
from rag_ablate.target.local import LocalTarget

SWEEP_FILE = "sweep.json"
SUMMARY_FILE = "summary.json"
VARIANT_FILE = "variant.json"


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
    target: Target, dataset: Dataset, ks: list[int], *, progress: bool = False, label: str = ""
) -> list[Record]:
    """Run every query through the target and score it. A query that raises is
    recorded with status ``failed`` and its error, never dropped or scored as a miss."""
    records = []
    bar = tqdm(dataset.queries, desc=f"querying [{label}]", unit="q", disable=not progress, leave=False)
    for q in bar:
        try:
            trace = target.run(q)
        except Exception as exc:
            trace = Trace(q.query_id, status="failed", error=f"{type(exc).__name__}: {exc}")
        rec = make_record(q, trace)
        rec["metrics"] = score_record(rec, q, dataset.documents, ks, routed=target.routes_intents)
        records.append(rec)
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

    t_start = time.perf_counter()
    dataset = get_dataset(s)
    cache = Cache(Path(s.cache.dir) if s.cache.dir else output_root / "cache", enabled=s.cache.enabled)
    target = LocalTarget(s, cache)
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
    metrics["run/index_build_seconds"] = float(build_info["index.build_seconds"])
    metrics["run/index_chunks"] = float(build_info["index.chunks"])
    metrics["run/index_bytes"] = float(build_info["index.bytes"])
    metrics.update(cache.metrics())

    if target.routes_intents:
        by_id = {q.query_id: q for q in dataset.queries}
        report = intent_report(
            [
                (by_id[r["query_id"]].intent_l1, r["intent_gold"], r["intent_pred"])
                for r in records
                if r["intent_gold"] is not None and r["status"] == "ok"
            ]
        )
        (job_dir / "intents.md").write_text(report.to_markdown(), encoding="utf-8")
        (job_dir / "intents.json").write_text(
            json.dumps(report.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8"
        )

    (job_dir / "metrics.json").write_text(json.dumps(metrics, indent=1, sort_keys=True), encoding="utf-8")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    (job_dir / "config.yaml").write_text(OmegaConf.to_yaml(resolved), encoding="utf-8")
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
    if s.tracking.enabled:
        run_id = _log_to_mlflow(
            ablation,
            s,
            cwd,
            output_root,
            job_dir,
            label,
            choices,
            dataset,
            build_info,
            metrics,
            Path(hc.sweep.dir) if multirun else None,
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
        if s.tracking.enabled:
            print(ui_hint(resolve_tracking(s, output_root)[0]))
    return metrics.get("holdout/recall_at_5")


def resolve_tracking(s: RunConfig, output_root: Path) -> tuple[str, Path]:
    uri = s.tracking.uri or tracking.default_uri(output_root)
    artifacts = Path(s.tracking.artifact_root) if s.tracking.artifact_root else output_root / "mlartifacts"
    return uri, artifacts


def _log_to_mlflow(
    ablation: dict[str, Any],
    s: RunConfig,
    cwd: Path,
    output_root: Path,
    job_dir: Path,
    label: str,
    choices: dict[str, str],
    dataset: Dataset,
    build_info: dict[str, Any],
    metrics: dict[str, float],
    sweep_dir: Path | None,
) -> str:
    uri, artifacts = resolve_tracking(s, output_root)
    parent = None
    experiment_id = None
    if sweep_dir is not None and (sweep_dir / SWEEP_FILE).is_file():
        info = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
        parent, experiment_id, uri = info["parent_run_id"], info["experiment_id"], info["tracking_uri"]
    if experiment_id is None:
        experiment_id = tracking.ensure_experiment(uri, s.tracking.experiment, artifacts)
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
        uri,
        experiment_id,
        label,
        params=params,
        metrics=metrics,
        tags=tags,
        artifacts_dir=job_dir,
        parent_run_id=parent,
    )
