"""The Hydra application: compose the config, run one variant.

A single run (``python -m rag_ablate ...``) that fails on an error rag_ablate raises on purpose
prints one line and exits with the error's code (:func:`rag_ablate.core.errors.exit_code_of`:
2 when nothing ran, a bad config or dataset or an unusable MLflow store; 1 when something failed,
a stage over its error budget or an endpoint that is down); anything else exits 1 with Hydra's
report. A refused config (its dataset folder included) also removes the run folder Hydra made for
it and the folders above it the run created, and starts no MLflow run; an outputs folder that
cannot be written (read-only, full) is refused before Hydra writes into it (:class:`OutputsCheck`).
Ctrl-C prints one line with the resume command and exits 130 (the run is marked KILLED). Inside a
sweep the error is raised instead, so Hydra records the job as failed and the sweeper lists it at
the end.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from rag_ablate.config.keys import env_interpolated, redact_hydra_output
from rag_ablate.config.overrides import CONF_DIR, normalize_overrides, numeric_groups, register_resolvers
from rag_ablate.config.schema import register_configs
from rag_ablate.core.errors import RagAblateError, WriteError, exit_code_of, one_line
from rag_ablate.core.fmt import visible
from rag_ablate.core.fsio import check_writable
from rag_ablate.core.secrets import hide_credentials
from rag_ablate.sweep.plan import check_names

__all__ = ["CONF_DIR", "main", "normalize_overrides", "numeric_groups"]

register_configs()
register_resolvers()


# a single run's folder -> its nearest ancestor that existed before the run (OutputsCheck notes it)
_EXISTED: dict[Path, Path] = {}


def _remove_refused_run(run_dir: Path, job_name: str) -> None:
    """Delete the folder Hydra made for a run whose config was refused, when it holds only what
    Hydra wrote into it (``.hydra/`` and the log): a folder with anything else (``resume=``) stays.
    So do the folders above it that this run created (``outputs/``, ``runs/``), when empty."""
    own = {".hydra", f"{job_name}.log"}
    if not run_dir.is_dir() or not {p.name for p in run_dir.iterdir()} <= own:
        return
    hydra_files = {"config.yaml", "hydra.yaml", "overrides.yaml"}
    if (run_dir / ".hydra").is_dir() and not {p.name for p in (run_dir / ".hydra").iterdir()} <= hydra_files:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir = run_dir.resolve()
    existed = _EXISTED.get(run_dir, run_dir.parent.parent)  # else runs/ at most
    with contextlib.suppress(OSError):  # stops at the first folder that is not empty
        for folder in run_dir.parents:
            if folder == existed or existed not in folder.parents:
                break
            folder.rmdir()


class OutputsCheck(Callback):
    """Hydra callback (``hydra.callbacks.outputs`` in conf/config.yaml): before Hydra creates a single
    run's folder and writes its ``.hydra/`` files, the folder must be writable; a read-only or full
    outputs folder stops the run with one line naming it, exit 2, instead of Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        _EXISTED[run_dir.resolve()] = next(p for p in run_dir.resolve().parents if p.exists())
        try:
            check_writable(run_dir)
        except WriteError as exc:
            print(f"rag_ablate: error: {visible(str(exc))}", file=sys.stderr)
            sys.exit(exit_code_of(exc))


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    from rag_ablate.run.runner import run_variant
    from rag_ablate.settings import to_settings

    hc = HydraConfig.get()
    if hc.output_subdir is not None:  # Hydra wrote the job's .hydra/ files with secrets as given
        redact_hydra_output(Path(hc.runtime.output_dir) / str(hc.output_subdir), env_interpolated(cfg))
    try:
        try:
            settings = to_settings(cfg)
            if hc.mode != RunMode.MULTIRUN:  # a sweep checked its jobs before any ran
                check_names(settings)  # the dataset folder, before a folder or MLflow run is made for it
        except RagAblateError:
            if hc.mode != RunMode.MULTIRUN:  # a refused run leaves no folder behind
                _remove_refused_run(Path(hc.runtime.output_dir), hc.job.name)
            raise
        return run_variant(cfg, settings)
    except KeyboardInterrupt:
        if hc.mode == RunMode.MULTIRUN:
            raise  # the sweeper ends the sweep's runs and says how to resume
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(
            "\nrag_ablate: interrupted (Ctrl-C); the MLflow run is marked KILLED; resume with: "
            f"python -m rag_ablate resume={hc.runtime.output_dir}",
            file=sys.stderr,
        )
        sys.exit(130)
    except Exception as exc:
        if hc.mode == RunMode.MULTIRUN:
            print(f"rag_ablate: job #{hc.job.num} failed: {hide_credentials(one_line(exc))}", file=sys.stderr)
            raise  # recorded by Hydra as a failed job; the sweeper reports it
        if isinstance(exc, RagAblateError):
            print(f"rag_ablate: error: {visible(hide_credentials(str(exc)))}", file=sys.stderr)
            sys.exit(exit_code_of(exc))
        raise
