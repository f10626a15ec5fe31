"""Everything a sweep writes to MLflow after its jobs, in one place.

The comparison (:mod:`rag_ablate.compare.run`) and the report (:mod:`rag_ablate.report.html`)
return values and files; they log nothing. This module logs them:

* :func:`publish_comparison`: the comparison's files to the sweep's parent run and each variant's
  effects (``delta/<split>/<metric>``, ``p_adj/...``, pairwise win rates, judged effects corrected
  by human labels ``ppi/...``) to its child run. Used by the sweep's end and by
  ``rag-ablate compare RUN_ID``.
* :func:`publish_sweep`: the rest of a sweep's end: the summary files and counts, the report's
  files, what the MLflow UI shows without setup (descriptions, headline effects, the saved runs
  view; :mod:`rag_ablate.report.mlflow_ui`), the profile, and the parent run's end status.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_ablate.compare.analysis import delta_metrics
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.pairwise import delta_metrics as pairwise_metrics
from rag_ablate.compare.ppi import delta_metrics as ppi_metrics
from rag_ablate.config.schema import RunConfig
from rag_ablate.core import profiling
from rag_ablate.core.layout import PLAN_FILE
from rag_ablate.report import mlflow_ui
from rag_ablate.tracking import background
from rag_ablate.tracking import store as tracking
from rag_ablate.tracking import traces as mlflow_traces
from rag_ablate.tracking import ui as tracking_ui


def publish_comparison(
    uri: str, parent_run_id: str, variants: Sequence[VariantData], c: Comparison, paths: Sequence[Path]
) -> None:
    """The comparison's files to the parent run, each compared variant's effects to its own run."""
    tracking.log_artifacts(uri, parent_run_id, list(paths))
    for v in variants:
        if v.run_id and v.label in c.variants:
            tracking.log_metrics(uri, v.run_id, delta_metrics(c, v.label))
            if c.pairwise is not None:
                tracking.log_metrics(uri, v.run_id, pairwise_metrics(c.pairwise, v.label))
            if c.ppi is not None:  # judged effects corrected by human labels: ppi/<split>/<metric>/effect
                tracking.log_metrics(uri, v.run_id, ppi_metrics(c.ppi, v.label))


@dataclass
class Published:
    """What the MLflow UI offers after a sweep: the ranked runs view and the per-query compare views."""

    runs_link: str
    trace_links: list[str]


@dataclass(frozen=True)
class SweepEnd:
    """What a sweep's end logs to its parent run (``info`` is ``sweep.json``).

    ``comparison`` and ``comparison_files``: the comparison step's result and files (None and
    empty when it did not run); ``files``: every other file to keep with the run (the summary,
    ``sweep.json``, ``failures.json``, the report and its plots); ``failed``: one line per failed
    step (the sweep run's description lists them).
    """

    s: RunConfig
    sweep_dir: Path
    info: dict[str, Any]
    summaries: Sequence[dict[str, Any]]
    comparison: Comparison | None
    comparison_files: Sequence[Path]
    variants: Sequence[VariantData]
    files: Sequence[Path]
    failed: Sequence[str]
    n_failed_jobs: int


def publish_sweep(end: SweepEnd, *, write_profile: Callable[[], Path], status: str) -> background.Pending:
    """Log the end of a sweep to its parent run and end the run.

    ``write_profile``: called once everything else is logged, writes the sweep's ``profile.json``
    (this logging's time included), whose stages become the run's ``time/<stage>_s``; ``status``:
    how the run ends.

    Done by the background writer when there is one (:mod:`rag_ablate.tracking.background`);
    returns the :class:`Published` links as a :class:`~rag_ablate.tracking.background.Pending`.
    """
    uri, run_id = end.info["tracking_uri"], end.info["parent_run_id"]
    # the variants' labels and run ids are what is logged of them: their records stay here
    light = dataclasses.replace(
        end,
        summaries=list(end.summaries),
        comparison_files=list(end.comparison_files),
        variants=[dataclasses.replace(v, records=[]) for v in end.variants],
        files=list(end.files),
        failed=list(end.failed),
    )
    done = background.call("logging the sweep's end", "log", _publish, light)
    profile = write_profile()
    metrics = profiling.Profile.metrics_of(profiling.read_profile(end.sweep_dir) or {})
    finish = tracking.finish_run
    background.call("ending the sweep's run", "log", finish, uri, run_id, metrics, [profile], status)
    return done


def _publish(end: SweepEnd) -> Published:
    """What :func:`publish_sweep` logs before the profile, in one transaction."""
    info = end.info
    uri, run_id, experiment_id = info["tracking_uri"], info["parent_run_id"], info["experiment_id"]
    done: list[Published] = []

    def write() -> None:
        done.clear()
        if end.comparison is not None:
            publish_comparison(uri, run_id, end.variants, end.comparison, end.comparison_files)
        tracking.log_artifacts(uri, run_id, list(end.files))
        tracking.log_metrics(
            uri,
            run_id,
            {"sweep/n_variants": float(len(end.summaries)), "sweep/n_failed_jobs": float(end.n_failed_jobs)},
        )
        link = _publish_ui(end.s, end.sweep_dir, end.info, end.summaries, end.comparison, end.failed)
        baseline = end.comparison.baseline if end.comparison is not None else None
        trace_links = mlflow_traces.sweep_links(  # per-query compare views, when traces exist
            uri, experiment_id, end.summaries, baseline, tracking_ui.ui_base(uri, end.s.tracking.ui_port)
        )
        done.append(Published(link, trace_links))

    tracking.in_one_transaction(uri, write)  # a sqlite store: one commit, not one per call
    return done[0]


def _publish_ui(
    s: RunConfig,
    sweep_dir: Path,
    info: dict[str, Any],
    summaries: Sequence[dict[str, Any]],
    comparison: Comparison | None,
    failed: Sequence[str],
) -> str:
    """What the MLflow UI shows without setup (:mod:`rag_ablate.report.mlflow_ui`): the sweep run's
    verdict table and summary table, each variant's one-line verdict and headline effects,
    and a saved runs view; returns the link that opens that view."""
    uri, run_id, experiment_id = info["tracking_uri"], info["parent_run_id"], info["experiment_id"]
    quality, cost = mlflow_ui.axes(comparison, tracking_ui.quality_metric(s.metrics.summary))
    plan_path = sweep_dir / PLAN_FILE
    factors = json.loads(plan_path.read_text(encoding="utf-8")).get("factors") if plan_path.is_file() else []
    baseline_name = tracking_ui.baseline_run_name(factors or [])
    description = mlflow_ui.sweep_description(comparison, summaries, quality, baseline_name, failed=[*failed])
    tracking.set_description(uri, run_id, description)
    table = mlflow_ui.summary_table(comparison, summaries, quality, cost)
    tracking.log_table(uri, run_id, table, "verdict.json")
    cells: dict[str, list[str]] = {}  # the ranked view's texts per column, to fit its widths
    names = []
    for summ in summaries:
        child, label = summ.get("run_id"), str(summ["label"])
        if not child or comparison is None or label not in (comparison.baseline, *comparison.variants):
            continue
        ranked = mlflow_ui.ranked_tags(comparison, label, quality, cost)
        for key, text in ranked.items():
            cells.setdefault(key, []).append(text)
        names.append(baseline_name if label == comparison.baseline else label)
        tracking.set_tags(uri, child, ranked)
        tracking.log_metrics(uri, child, mlflow_ui.rank_metric(comparison, summ, quality))
        if label == comparison.baseline:
            tracking.set_description(uri, child, tracking_ui.BASELINE_DESCRIPTION)
        else:
            tracking.log_metrics(uri, child, mlflow_ui.headline_deltas(comparison, label, quality))
            tracking.set_description(uri, child, mlflow_ui.child_description(comparison, label, quality))
    port = s.tracking.ui_port
    state = tracking_ui.view_state(run_id, quality, cost, cells, names)
    key = tracking.save_view(uri, experiment_id, run_id, state, port)
    return tracking_ui.runs_link(tracking_ui.ui_base(uri, port), experiment_id, key)
