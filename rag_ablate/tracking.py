"""The only module that talks to MLflow.

Uses :class:`mlflow.tracking.MlflowClient` with explicit run ids (never the
fluent API's global "active run"), so several variants can be logged from one
process and children from worker processes can attach to a parent created by
the sweep driver.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rag_ablate import __version__
from rag_ablate.errors import TrackingError

PARENT_TAG = "mlflow.parentRunId"
_BATCH = 100  # MLflow accepts at most 100 params (and 100 tags) per log_batch


def default_uri(output_root: Path) -> str:
    return f"sqlite:///{(output_root / 'mlflow.db').resolve()}"


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_experiment(uri: str, name: str, artifact_root: Path) -> str:
    """Create the store (first use of a sqlite file builds its tables) and the experiment."""
    from mlflow.exceptions import MlflowException

    try:
        client = _client(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        artifact_root.mkdir(parents=True, exist_ok=True)
        try:
            return str(client.create_experiment(name, artifact_location=artifact_root.resolve().as_uri()))
        except MlflowException:  # created meanwhile by another process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)
    except MlflowException as exc:
        raise TrackingError(f"MLflow store {uri} is not usable: {exc.message}") from exc


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def base_tags(cwd: Path) -> dict[str, str]:
    tags = {"rag_ablate.version": __version__}
    commit = git_commit(cwd)
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git.commit"] = commit
    return tags


def start_parent(uri: str, experiment_id: str, name: str, tags: Mapping[str, str]) -> str:
    run = _client(uri).create_run(experiment_id, run_name=name, tags={"rag_ablate.kind": "sweep", **tags})
    return str(run.info.run_id)


def log_run(
    uri: str,
    experiment_id: str,
    name: str,
    *,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    artifacts_dir: Path | None,
    parent_run_id: str | None = None,
) -> str:
    """One finished variant as one run: params, metrics (one batch call), tags, artifacts."""
    from mlflow.entities import Metric, Param

    client = _client(uri)
    all_tags = {"rag_ablate.kind": "variant", **tags}
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = client.create_run(experiment_id, run_name=name, tags=all_tags)
    run_id = str(run.info.run_id)
    try:
        plist = [Param(k, _param_value(v)) for k, v in sorted(params.items())]
        for i in range(0, len(plist), _BATCH):
            client.log_batch(run_id, params=plist[i : i + _BATCH])
        ts = _now_ms()
        mlist = [Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items())]
        for i in range(0, len(mlist), 1000):
            client.log_batch(run_id, metrics=mlist[i : i + 1000])
        if artifacts_dir is not None:
            client.log_artifacts(run_id, str(artifacts_dir))
    except Exception:
        client.set_terminated(run_id, status="FAILED")
        raise
    client.set_terminated(run_id, status="FINISHED")
    return run_id


def log_artifacts(uri: str, run_id: str, paths: list[Path]) -> None:
    client = _client(uri)
    for p in paths:
        if p.is_dir():
            client.log_artifacts(run_id, str(p))
        elif p.is_file():
            client.log_artifact(run_id, str(p))


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, float]) -> None:
    from mlflow.entities import Metric

    ts = _now_ms()
    mlist = [Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items())]
    client = _client(uri)
    for i in range(0, len(mlist), 1000):
        client.log_batch(run_id, metrics=mlist[i : i + 1000])


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    _client(uri).set_terminated(run_id, status=status)


def child_runs(uri: str, parent_run_id: str) -> list[tuple[str, str]]:
    """(run id, run name) of a parent run's children, oldest first."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as exc:
        raise TrackingError(f"no run {parent_run_id} in {uri}: {exc.message}") from exc
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    return [(str(r.info.run_id), str(r.info.run_name)) for r in runs]


def download(uri: str, run_id: str, names: list[str], dest: Path) -> dict[str, Path]:
    """Download the named top-level artifacts that exist; returns name -> local path."""
    client = _client(uri)
    present = {a.path for a in client.list_artifacts(run_id)}
    out = {}
    for name in names:
        if name in present:
            out[name] = Path(client.download_artifacts(run_id, name, str(dest)))
    return out


def _param_value(v: Any) -> str:
    s = "null" if v is None else str(v)
    return s if len(s) <= 6000 else s[:5997] + "..."


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
