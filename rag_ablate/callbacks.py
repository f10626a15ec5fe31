"""Sweep-wide steps, run by Hydra in the driver process of a multirun.

``on_multirun_start`` creates the MLflow store and the sweep's parent run before
any job starts (two jobs creating one sqlite store at once crash) and leaves its
id in ``<sweep dir>/sweep.json`` for the jobs. ``on_multirun_end`` reads what the
jobs wrote to disk (they may have run in other processes or machines), prints
the per-variant table and logs it to the parent run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rag_ablate import compare, tracking
from rag_ablate.config import RunConfig, to_settings
from rag_ablate.guard import confounded_variants
from rag_ablate.report import markdown_table, print_table, ui_hint
from rag_ablate.runner import SUMMARY_FILE, SWEEP_FILE, resolve_tracking, variant_label


def _sweep_dir(config: DictConfig) -> Path:
    return Path(str(config.hydra.sweep.dir))


def _cwd(config: DictConfig) -> Path:
    return Path(str(config.hydra.runtime.cwd))


def read_summaries(sweep_dir: Path) -> list[dict[str, Any]]:
    """The jobs' summaries in job order."""
    found = []
    for path in sweep_dir.glob(f"*/{SUMMARY_FILE}"):
        data = json.loads(path.read_text(encoding="utf-8"))
        variant = path.parent / "variant.json"
        num = json.loads(variant.read_text(encoding="utf-8")).get("job_num", 0) if variant.is_file() else 0
        found.append((num, data))
    return [d for _, d in sorted(found, key=lambda t: t[0])]


def run_comparison(s: RunConfig, sweep_dir: Path) -> compare.Comparison:
    """Compare the sweep's variants from what the jobs wrote, print it, write comparison.json/.md."""
    variants = compare.load_sweep_dir(sweep_dir)
    c = compare.compare(
        variants,
        baseline=s.compare.baseline,
        metrics=s.compare.metrics,
        splits=s.compare.splits,
        B=s.compare.B,
        seed=s.seed,
        alpha=s.compare.alpha,
        flip_threshold=s.compare.flip_threshold,
    )
    c.confounded = confounded_variants(variants, c.baseline)
    compare.write_outputs(c, sweep_dir)
    print()
    print(compare.format_terminal(c))
    return c


class SweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        s = to_settings(config)
        if s.ablation.dry_run:
            return
        sweep_dir = _sweep_dir(config)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        output_root = (_cwd(config) / s.paths.output_root).resolve()
        info: dict[str, Any] = {"overrides": list(config.hydra.overrides.task)}
        if s.tracking.enabled:
            uri, artifacts = resolve_tracking(s, output_root)
            experiment_id = tracking.ensure_experiment(uri, s.tracking.experiment, artifacts)
            name = "sweep " + variant_label(list(config.hydra.overrides.task))
            tags = tracking.base_tags(_cwd(config))
            tags["sweep.dir"] = str(sweep_dir.resolve())
            tags["ablation.mode"] = s.ablation.mode
            parent = tracking.start_parent(uri, experiment_id, name, tags)
            info.update(parent_run_id=parent, experiment_id=experiment_id, tracking_uri=uri)
        (sweep_dir / SWEEP_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        s = to_settings(config)
        if s.ablation.dry_run:
            return
        sweep_dir = _sweep_dir(config)
        summaries = read_summaries(sweep_dir)
        print_table(summaries, s.metrics.summary)
        (sweep_dir / "summary.md").write_text(markdown_table(summaries, s.metrics.summary), encoding="utf-8")
        print(f"\nsweep folder: {sweep_dir}")
        info_path = sweep_dir / SWEEP_FILE
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        failures: list[str] = []
        outputs = [sweep_dir / "summary.md", info_path]
        cmp = None
        if s.compare.enabled and len(summaries) > 1:
            cmp = run_comparison(s, sweep_dir)
            outputs += [sweep_dir / compare.COMPARISON_JSON, sweep_dir / compare.COMPARISON_MD]
            failures = compare.gate(cmp, s.compare.fail_on)
        if "parent_run_id" in info:
            uri, run_id = info["tracking_uri"], info["parent_run_id"]
            tracking.log_artifacts(uri, run_id, outputs)
            tracking.log_metrics(uri, run_id, {"sweep/n_variants": float(len(summaries))})
            if cmp is not None:
                for summary in summaries:
                    if summary.get("run_id") and summary["label"] in cmp.variants:
                        tracking.log_metrics(
                            uri, summary["run_id"], compare.delta_metrics(cmp, summary["label"])
                        )
            tracking.end_run(uri, run_id, "FAILED" if failures else "FINISHED")
            print(ui_hint(uri))
        if cmp is not None:
            print(f"comparison: {sweep_dir / compare.COMPARISON_MD}  (again: rag-ablate compare {sweep_dir})")
        if failures:
            print("\nregression gate FAILED:", file=sys.stderr)
            for f in failures:
                print(f"  {f}", file=sys.stderr)
            sys.exit(1)
