"""What a job's MLflow run shows without setup: headline metrics, the runs view and its link."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rag_ablate.metrics.stages import PREFIX as STAGE_PREFIX
from rag_ablate.tracking.tags import PARENT_TAG

P95 = "latency_p95_ms"
SPLITS = ("dev", "holdout")

HEADLINE = "headline/"

COUNTS = ("n_queries", "n_failed", "error_rate", "n_answerable", "n_unanswerable", "n_no_rag")

COLUMN_WIDTH = 180  # pixels per headline column in the saved runs view

HEADLINE_DIGITS = 4  # headline values are rounded for reading; exact ones are under dev/, holdout/, cost/

LATENCY_NOTE = "measured per query end to end; for the local system in-process with warm caches"


def quality_metric(summary_columns: Sequence[str]) -> str:
    """The headline quality metric: the first column of the end table (``metrics.summary``)."""
    return summary_columns[0] if summary_columns else "recall_at_5"


def headline_metrics(metrics: Mapping[str, float], quality: str) -> dict[str, float]:
    """A variant's headline numbers from its full metrics (absent ones stay absent)."""
    pick = {
        f"dev_{quality}": f"dev/{quality}",
        f"holdout_{quality}": f"holdout/{quality}",
        "cost_p95_ms": f"cost/{P95}",
        "context_tokens": "cost/context_tokens",
        "usd_per_1k": "cost/usd_per_1k",
        "error_rate": "all/error_rate",
    }
    return {
        HEADLINE + name: round(float(metrics[src]), HEADLINE_DIGITS)
        for name, src in pick.items()
        if src in metrics
    }


def mlflow_metrics(metrics: Mapping[str, float], keep: Iterable[str]) -> dict[str, float]:
    """The metrics a variant run logs: per split only ``keep`` (and counts), no ``all/`` split
    (its error rate is ``headline/error_rate``), everything under ``cost/``, ``run/``, ``headline/``,
    ``privacy/`` (what redaction replaced) and ``judge/`` (the LLM judge's run metrics,
    rag_ablate.run.judging); per split the failure stages' shares and counts (``stage_<stage>``,
    ``n_stage_<stage>``: rag_ablate.metrics.stages); ``<split>/prod/`` and
    ``<split>/edge/`` (rag_ablate.dataset.weights) of the ``keep`` metrics."""
    names = {*keep, *COUNTS}
    out = {}
    for key, v in metrics.items():
        prefix, _, rest = key.partition("/")
        if prefix in ("cost", "run", "headline", "judge", "privacy") or (
            # error rates per failure status and of the judge, first-token percentiles are kept too
            prefix in SPLITS
            and (
                rest in names
                or rest.startswith(("cost/", "error_rate_", "n_status_", "ttft_ms_", "judge_error_"))
                or rest.startswith((STAGE_PREFIX, "n_" + STAGE_PREFIX))  # the failure stages
                # the production mix: weighted means and edge cases' means of the same metrics
                or (rest.startswith(("prod/", "edge/")) and rest.partition("/")[2] in names)
            )
        ):
            out[key] = v
    return out


def baseline_run_name(factors: Sequence[Mapping[str, Any]]) -> str:
    """``baseline (chunk=512)``: the baseline's value of every factor the sweep varies
    (runtime settings such as ``cache.dir`` are not what the system is: left out)."""
    from rag_ablate.config.keys import is_runtime_key

    parts = [
        f"{f['key']}={f['default']}" for f in factors if f.get("key") and not is_runtime_key(str(f["key"]))
    ]
    return f"baseline ({', '.join(parts)})" if parts else "baseline"


BASELINE_DESCRIPTION = "The baseline: every other variant of this sweep is compared with this run."


def view_state(parent_run_id: str, quality: str) -> dict[str, Any]:
    """The runs-table view of one sweep: its variant runs, best headline quality first."""
    order = f"metrics.`{HEADLINE}holdout_{quality}`"
    columns = [
        f"metrics.`{HEADLINE}{name}`"
        for name in (
            f"holdout_{quality}",
            f"delta_holdout_{quality}",
            f"dev_{quality}",
            "cost_p95_ms",
            "context_tokens",
            "usd_per_1k",
        )
    ]
    return {
        "searchFilter": f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        "orderByKey": order,
        "orderByAsc": False,
        "selectedColumns": columns,
        # in this order, right after the run name, wide enough to read the metric names
        "columnOrder": ["attributes.`Run Name`", *columns],
        "columnWidths": dict.fromkeys(columns, COLUMN_WIDTH),
        # the charts view (its tab, or &compareRunsMode=CHART) shows the headline charts; clear to see all
        "chartsSearchFilter": HEADLINE,
    }


def view_key(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode("utf-8")).hexdigest()


def ui_base(uri: str, port: int = 5000) -> str:
    """Where the UI of a store is served: the server itself, or ``rag-ablate ui`` on 127.0.0.1."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return f"http://127.0.0.1:{port}"


def runs_link(base: str, experiment_id: str, key: str | None) -> str:
    """The runs view of an experiment, with a saved view when ``key`` is given."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{url}?viewStateShareKey={key}" if key else url
