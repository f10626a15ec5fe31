"""The ablation sweeper: Hydra's thin plugin class over :mod:`rag_ablate.ablation`.

No ``from __future__ import annotations`` here: Hydra imports plugins in a way that
breaks dataclasses with string annotations.

Hydra finds this module through the ``hydra_plugins`` namespace package and the
ConfigStore entry ``hydra/sweeper: ablation``, which ``conf/config.yaml`` selects.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
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

    def sweep(self, arguments: list[str]) -> Any:
        from rag_ablate.ablation import build_plan, format_plan, write_plan

        if self.config is None or self.launcher is None or self.hydra_context is None:
            raise RuntimeError("setup() must run before sweep()")
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        plan = build_plan(self.config, arguments, parser)
        print(format_plan(plan))
        if plan.dry_run:
            return []
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        write_plan(plan, sweep_dir, self.config)
        return [self.launcher.launch([job.overrides for job in plan.jobs], initial_job_idx=0)]
