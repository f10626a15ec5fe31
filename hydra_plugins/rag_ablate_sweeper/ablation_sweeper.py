"""The ablation sweeper: Hydra's thin plugin class over :mod:`rag_ablate.sweep.plan`.

No ``from __future__ import annotations`` here: Hydra imports plugins in a way that
breaks dataclasses with string annotations.

Hydra finds this module through the ``hydra_plugins`` namespace package and the
ConfigStore entry ``hydra/sweeper: ablation``, which ``conf/config.yaml`` selects.

A sweep, in order: plan the jobs; compose and validate every job's config as the
launcher will (a bad factor or level stops here with one line and exit 2, before
any folder or MLflow run exists); print the plan; open the MLflow store, create
the sweep folder and parent run (an unusable store stops here, exit 2); launch
the jobs; check every job's outcome and finish (table, comparison, logging);
exit 1 when a job or step failed, listing each failure on one line, or when a file cannot be
written (a full disk, a read-only folder: one line naming the path; exit 2 before anything ran). Ctrl-C ends
the sweep's MLflow runs KILLED and prints one line with the resume command (exit 130).
"""

import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class AblationSweeperConf:
    _target_: str = "hydra_plugins.rag_ablate_sweeper.ablation_sweeper.AblationSweeper"


ConfigStore.instance().store(
    group="hydra/sweeper", name="ablation", node=AblationSweeperConf, provider="rag_ablate"
)


class _Composed:
    """Each job's config as the plan check composed it, handed to the launcher as a copy instead of
    composed again (a composition takes 0.2-0.3 s a job; the copy, milliseconds). Installed on the
    sweep's config loader as ``load_sweep_config`` while the jobs launch: a launcher asks the loader
    for each job's config, and one composed with other overrides (or another master config) is
    composed by Hydra as before. An object, not a closure, so a launcher that pickles itself (and
    the loader) to its workers takes it along. At most :attr:`KEEP` configs are kept (a plan of
    thousands of config-group levels composes the rest again rather than holding them all), and
    each is let go once the launcher has taken it."""

    KEEP = 256

    def __init__(self, loader: Any, master: DictConfig) -> None:
        self.loader, self.master = loader, master
        self.configs: dict[tuple[str, ...], DictConfig] = {}

    def compose(self, overrides: list[str]) -> DictConfig:
        """The job's config, composed by Hydra; a copy is kept for the launcher."""
        import copy

        cfg = type(self.loader).load_sweep_config(self.loader, self.master, list(overrides))
        if len(self.configs) < self.KEEP:
            self.configs[tuple(overrides)] = copy.deepcopy(cfg)
        return cfg  # type: ignore[no-any-return]

    def __call__(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self.configs.pop(tuple(sweep_overrides), None) if master_config is self.master else None
        if kept is not None:
            return kept
        return type(self.loader).load_sweep_config(self.loader, master_config, sweep_overrides)  # type: ignore[no-any-return]


def _stop(exc: BaseException, code: int) -> NoReturn:
    from rag_ablate.core.errors import one_line

    print(f"rag_ablate: error: {one_line(exc)}", file=sys.stderr)
    sys.exit(code)


class AblationSweeper(Sweeper):
    """Baseline plus one variant per level that differs from it (or a labelled grid)."""

    def __init__(self) -> None:
        super().__init__()
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context = hydra_context
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _interrupted(self, plan: Any) -> NoReturn:
        from rag_ablate.sweep.driver import EXIT_INTERRUPTED, interrupt_sweep

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break the cleanup
        assert self.config is not None
        print(f"\n{interrupt_sweep(self.config, plan)}", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except KeyboardInterrupt:  # before the plan exists: nothing was created
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print("\nrag_ablate: interrupted (Ctrl-C) before any job started", file=sys.stderr)
            sys.exit(130)

    def _sweep(self, arguments: list[str]) -> Any:
        from rag_ablate.core.errors import EXIT_INVALID, RagAblateError
        from rag_ablate.core.profiling import sweep_profile
        from rag_ablate.core.secrets import hidden_in_logs
        from rag_ablate.sweep.driver import finish_sweep, start_sweep
        from rag_ablate.sweep.plan import build_plan, check_plan, format_plan, spend_lines

        prof = sweep_profile()  # where the sweep's time goes: <sweep dir>/profile.json
        if self.config is None or self.launcher is None or self.hydra_context is None:
            raise RuntimeError("setup() must run before sweep()")
        config = self.config
        # resolve the sweep folder's name (time, random suffix) once, before any job's
        # config is composed: Hydra copies resolved values from this config to the jobs'
        str(config.hydra.sweep.dir)
        loader = self.hydra_context.config_loader
        parser = OverridesParser.create(config_loader=loader)
        try:
            prof.start("plan")
            plan = build_plan(config, arguments, parser)
            composed = _Composed(loader, config)
            options = lambda group: list(loader.get_group_options(group))  # noqa: E731
            job_settings = check_plan(plan, composed.compose, options)
            spend = spend_lines(plan, job_settings)  # model calls, tokens and money, before any is spent
        except (RagAblateError, HydraException) as exc:
            _stop(exc, EXIT_INVALID)
        prof.stop()
        print(format_plan(plan, spend))
        if plan.dry_run:
            return []
        returns: Sequence[JobReturn] = []
        launch_error: BaseException | None = None
        try:
            start_sweep(config, plan, job_settings[0])
        except RagAblateError as exc:
            _stop(exc, EXIT_INVALID)
        except KeyboardInterrupt:
            self._interrupted(plan)
        try:
            try:
                # the launcher logs each job's overrides: secrets are shown as plan.json stores them
                loader.load_sweep_config = composed  # type: ignore[method-assign]
                with prof.stage("jobs"), hidden_in_logs(plan.secret_swaps()):
                    returns = self.launcher.launch([job.overrides for job in plan.jobs], initial_job_idx=0)
            except Exception as exc:  # a launcher's own failure: still finish what ran
                launch_error = exc
            finally:
                vars(loader).pop("load_sweep_config", None)
            code = finish_sweep(config, plan, returns, launch_error, job_settings)
        except KeyboardInterrupt:
            self._interrupted(plan)
        if code:
            sys.exit(code)
        return [returns]
