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

#: The ranked view's column widths are fitted to their text so that every column ends within a
#: 1600 px window: MLflow 3.17 draws tag cells in a 13 px font (about 5.5 px a character in
#: Chromium) with 11 px of padding each side, and at 1600 px leaves :data:`TABLE_PX` for the run
#: name, created and tag columns beside its sidebar and the checkbox column. The created column
#: keeps only its status icon (:data:`CREATED_PX`); a header longer than its cells is cut at
#: :data:`HEADER_PX` (its tooltip has it whole); the other significant effects take what is left
#: (at least :data:`MIN_OTHER_PX`; the cell's tooltip has the whole text).
CHAR_PX = 5.6
PAD_PX = 24
TABLE_PX = 1270
CREATED_PX = 44
CREATED_COL = "runDateAndNestInfo"  # MLflow's id of the created column
NAME_PX = (110, 220)  # the run-name column (its colour dot and link), fitted within these bounds
HEADER_PX = 130
MIN_OTHER_PX = 150


def text_px(texts: Iterable[str], extra: int = PAD_PX) -> int:
    """The width a column needs to show the longest of ``texts`` whole."""
    return int(max((len(t) for t in texts), default=0) * CHAR_PX) + extra


def rank_columns(quality: str, cost: str) -> dict[str, str]:
    """The text columns of the ranked view, as tags of each variant run: name -> tag key.

    Per split the quality axis (level, effect, interval and verdict) and the cost axis (level and
    interval, as in report.html's quality-vs-cost table), then the other metrics whose effect is
    significant. Keys use only the characters MLflow allows on every platform."""
    kinds = (("quality", quality), ("cost", cost))
    cols = {f"{split} {kind}": f"{split} {name}" for split in SPLITS[::-1] for kind, name in kinds}
    return {**cols, "other": OTHER_EFFECTS}


def view_state(
    parent_run_id: str,
    quality: str,
    cost: str,
    cells: Mapping[str, Iterable[str]] | None = None,
    names: Iterable[str] = (),
) -> dict[str, Any]:
    """The runs-table view of one sweep: its variant runs, best holdout quality first, each with its
    verdict per split (:func:`rank_columns`) right after its name.

    ``cells``: each tag column's texts (tag key -> the runs' values) and ``names`` the run names, to
    fit the columns to them (:func:`column_widths`)."""
    order = f"metrics.`{HEADLINE}holdout_{quality}`"
    tags = rank_columns(quality, cost)
    columns = [f"tags.`{key}`" for key in tags.values()]
    return {
        "searchFilter": f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        "orderByKey": order,
        "orderByAsc": False,
        "selectedColumns": columns,
        # in this order, right after the run name, wide enough to read the verdicts
        "columnOrder": [RUN_NAME_COL, CREATED_COL, *columns],
        "columnWidths": column_widths(tags, cells or {}, names),
        # the charts view (its tab, or &compareRunsMode=CHART) shows the headline charts; clear to see all
        "chartsSearchFilter": HEADLINE,
    }


RUN_NAME_COL = "attributes.`Run Name`"


def column_widths(
    tags: Mapping[str, str], cells: Mapping[str, Iterable[str]], names: Iterable[str]
) -> dict[str, int]:
    """Pixel widths of the ranked view's columns (``tags``: :func:`rank_columns`): each fitted to its
    header and texts, the other significant effects given what is left of :data:`TABLE_PX` (at least
    :data:`MIN_OTHER_PX`), so that at 1600 px every column ends inside the window."""
    lo, hi = NAME_PX
    widths = {RUN_NAME_COL: min(hi, max(lo, text_px(names, 48))), CREATED_COL: CREATED_PX}
    for name, key in tags.items():
        if name != "other":
            widths[f"tags.`{key}`"] = max(text_px(cells.get(key, ())), min(HEADER_PX, text_px([key])))
    other = tags["other"]
    left = TABLE_PX - sum(widths.values())
    widths[f"tags.`{other}`"] = max(MIN_OTHER_PX, min(left, text_px([other, *cells.get(other, ())])))
    return widths


def view_key(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode("utf-8")).hexdigest()


DEFAULT_UI_PORT = 5000  # tracking.ui_port's default: where ``rag-ablate ui`` serves and links point

# MLflow 3.17's UI opens its assistant panel on a first visit whenever the page's hostname is
# exactly ``localhost``, ``127.0.0.1`` or ``::1`` (its bundle compares ``window.location.hostname``,
# which is ``[::1]``, brackets included, for the IPv6 loopback; no setting, URL parameter or server
# flag turns it off): the panel covers a quarter of the width. The links point at ``[::1]``, the same
# machine, which MLflow's host and origin checks accept as local, so the panel stays closed.
LINK_HOST = "[::1]"
FALLBACK_HOST = "127.0.0.1"  # where IPv6 is off: the links work, MLflow opens its panel once


def ipv6_loopback() -> bool:
    """True when this machine can listen on the IPv6 loopback ``::1``."""
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def link_host() -> str:
    """The host of the links to ``rag-ablate ui``: ``[::1]`` (see :data:`LINK_HOST`), else 127.0.0.1."""
    return LINK_HOST if ipv6_loopback() else FALLBACK_HOST


def ui_base(uri: str, port: int = DEFAULT_UI_PORT) -> str:
    """Where the UI of a store is served: the server itself, or ``rag-ablate ui`` on this machine."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return f"http://{link_host()}:{port}"


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


def serve(uri: str, port: int) -> None:
    """MLflow's UI and API for the store at ``uri`` on ``port`` of 127.0.0.1 and of ``::1`` (where the
    links point, :data:`LINK_HOST`), in this process, until a signal stops it.

    ``mlflow ui`` takes three processes to get there (its CLI, then uvicorn, then the app), each
    importing MLflow (about 3.5 s of CPU each); this sets the environment its CLI would set, opens
    the store once as the CLI does (creating or upgrading its tables) and runs MLflow's own FastAPI
    app under uvicorn with one worker, importing MLflow once."""
    import os
    import socket
    from pathlib import Path

    os.environ.update(server_env(uri))
    import uvicorn
    from mlflow.server import constants
    from mlflow.server.handlers import initialize_backend_stores

    initialize_backend_stores(uri, uri, "mlflow-artifacts:/")
    log_config = Path(constants.__file__).parent / "uvicorn_log_config.yaml"
    config = uvicorn.Config(UI_APP, host=FALLBACK_HOST, port=port, workers=1, log_config=str(log_config))
    sockets = []
    for family, host in ((socket.AF_INET, FALLBACK_HOST), (socket.AF_INET6, "::1")):
        if family == socket.AF_INET6 and not ipv6_loopback():
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sockets.append(sock)
    uvicorn.Server(config).run(sockets=sockets)
