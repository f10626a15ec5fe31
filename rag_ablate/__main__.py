"""Entry point: ``python -m rag_ablate [overrides]`` (``-m`` for a sweep).

Run as a program, it first forks MLflow's background writer (:mod:`rag_ablate.tracking.background`),
before Hydra, OmegaConf and the rest of the command are imported (0.15-0.2 s of imports the writer
need not wait for: it imports MLflow meanwhile, the longest chain of a short run). Then the command
itself (:func:`rag_ablate.cli.command.main`) checks the overrides and runs Hydra; the writer's start
was decided from the command line as typed (``tracking=none``, ``resume=``, a launcher: no writer),
and a command that ends without using it (a bad override, ``--help``) stops it.
"""

from __future__ import annotations

import gc
import sys

from rag_ablate.tracking import background


def main(argv: list[str], *, writer: bool = False) -> None:
    """Run (or sweep) with the command line ``argv``; exits as the command does (``sys.exit``).

    ``writer``: MLflow is imported and written by a second process while the command runs
    (``python -m rag_ablate`` itself; a call from Python logs in its own process), started here,
    before the command's imports."""
    if writer:
        background.start(argv)
    from rag_ablate.cli.command import main as command  # Hydra and everything a run needs

    command(argv)


if __name__ == "__main__":
    # a run allocates many objects and keeps most of them (modules, configs, the dataset, the index,
    # the records): the youngest generation collected every 50,000 allocations rather than every
    # 700 saves 0.07-0.09 s of a COVID-QA run's 1.6 s of CPU for about 1 MB (the writer inherits it)
    gc.set_threshold(50_000, 10, 10)
    main(sys.argv[1:], writer=True)
