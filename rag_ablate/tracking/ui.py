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
    ``<split>/edge/`` (rag_ablate.dataset.weights) and ``<split>/repeats/`` (rag_ablate.records.repeats)
    of the ``keep`` metrics."""
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
                # system.repeats > 1: the spread over repeats of the same metrics, and the flaky queries
                or (rest.startswith("repeats/") and rest.split("/")[1] in (*names, "flaky_queries"))
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


OTHER_EFFECTS = "other significant effects"

#: pixels per column of the ranked view (MLflow's 13 px font: about 5.5 px a character): a quality
#: cell (``0.839 Δ -0.032 [-0.070, +0.010] no evidence, MDE ±0.05``), a cost cell
#: (``22.9 [17.6, 29.5]``), the other effects. At 1600 px, beside MLflow's sidebar, run name and
#: start time, the holdout columns show whole even with MLflow's assistant panel open.
RANK_WIDTHS = {"quality": 340, "cost": 170, "other": 300}


def rank_columns(quality: str, cost: str) -> dict[str, str]:
    """The text columns of the ranked view, as tags of each variant run: name -> tag key.

    Per split the quality axis (level, effect, interval and verdict) and the cost axis (level and
    interval, as in report.html's quality-vs-cost table), then the other metrics whose effect is
    significant. Keys use only the characters MLflow allows on every platform."""
    kinds = (("quality", quality), ("cost", cost))
    cols = {f"{split} {kind}": f"{split} {name}" for split in SPLITS[::-1] for kind, name in kinds}
    return {**cols, "other": OTHER_EFFECTS}


def view_state(parent_run_id: str, quality: str, cost: str) -> dict[str, Any]:
    """The runs-table view of one sweep: its variant runs, best holdout quality first, each with its
    verdict per split (:func:`rank_columns`) right after its name."""
    order = f"metrics.`{HEADLINE}holdout_{quality}`"
    tags = rank_columns(quality, cost)
    columns = [f"tags.`{key}`" for key in tags.values()]
    widths = {f"tags.`{key}`": RANK_WIDTHS[name.rpartition(" ")[2]] for name, key in tags.items()}
    return {
        "searchFilter": f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        "orderByKey": order,
        "orderByAsc": False,
        "selectedColumns": columns,
        # in this order, right after the run name, wide enough to read the verdicts
        "columnOrder": ["attributes.`Run Name`", *columns],
        "columnWidths": widths,
        # the charts view (its tab, or &compareRunsMode=CHART) shows the headline charts; clear to see all
        "chartsSearchFilter": HEADLINE,
    }


def view_key(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode("utf-8")).hexdigest()


DEFAULT_UI_PORT = 5000  # tracking.ui_port's default: where ``rag-ablate ui`` serves and links point


def ui_base(uri: str, port: int = DEFAULT_UI_PORT) -> str:
    """Where the UI of a store is served: the server itself, or ``rag-ablate ui`` on 127.0.0.1."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return f"http://127.0.0.1:{port}"


def runs_link(base: str, experiment_id: str, key: str | None) -> str:
    """The runs view of an experiment, with a saved view when ``key`` is given."""
    url = f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
    return f"{url}?viewStateShareKey={key}" if key else url


# --------------------------------------------------------------------------- serving the UI

UI_APP = "mlflow.server.fastapi_app:app"


def server_env(uri: str) -> dict[str, str]:
    """What MLflow's ``mlflow ui`` hands its server process, for a store at ``uri``: the store,
    artifacts served from the folder beside a sqlite store (``mlartifacts``, where runs write them),
    and no GenAI job-execution workers (this tool submits no jobs)."""
    import uuid

    from mlflow.server import constants as c  # a module of constants: imports nothing heavy

    env = {
        c.BACKEND_STORE_URI_ENV_VAR: uri,
        c.REGISTRY_STORE_URI_ENV_VAR: uri,
        c.ARTIFACT_ROOT_ENV_VAR: "mlflow-artifacts:/",
        c.SERVE_ARTIFACTS_ENV_VAR: "true",
        "_MLFLOW_SGI_NAME": "uvicorn",
        "_MLFLOW_SERVER_BOOT_ID": uuid.uuid4().hex,
        "_MLFLOW_IN_JOB_EXECUTOR": "false",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    if uri.startswith("sqlite:///"):
        from pathlib import Path

        env[c.ARTIFACTS_DESTINATION_ENV_VAR] = str(Path(uri[len("sqlite:///") :]).parent / "mlartifacts")
    return env


def serve(uri: str, port: int, host: str = "127.0.0.1") -> None:
    """MLflow's UI and API for the store at ``uri`` on ``host:port``, in this process, until a signal
    stops it.

    ``mlflow ui`` takes three processes to get there (its CLI, then uvicorn, then the app), each
    importing MLflow (about 3.5 s of CPU each); this sets the environment its CLI would set, opens
    the store once as the CLI does (creating or upgrading its tables) and runs MLflow's own FastAPI
    app under uvicorn with one worker, importing MLflow once."""
    import os
    from pathlib import Path

    os.environ.update(server_env(uri))
    import uvicorn
    from mlflow.server import constants
    from mlflow.server.handlers import initialize_backend_stores

    initialize_backend_stores(uri, uri, "mlflow-artifacts:/")
    log_config = Path(constants.__file__).parent / "uvicorn_log_config.yaml"
    uvicorn.run(UI_APP, host=host, port=port, workers=1, log_config=str(log_config))
