"""Entry point: ``python -m rag_ablate [overrides]`` (``-m`` for a sweep).

Run as a program, it first reaches MLflow's background writer (:mod:`rag_ablate.tracking.background`):
it connects to the resident writer, which has MLflow imported already (started now if there is
none: :mod:`rag_ablate.tracking.resident`), or forks a writer of its own, before Hydra, OmegaConf
and the rest of the command are imported (0.15-0.2 s of imports a writer still importing MLflow,
the longest chain of a short run, need not wait for). Then the command
itself (:func:`rag_ablate.cli.command.main`) checks the overrides and runs Hydra; the writer's start
was decided from the command line as typed (``tracking=none``, ``resume=``, a launcher: no writer),
and a command that ends without using it (a bad override, ``--help``) stops it. The start-up after
the fork (imports, Hydra's composition, the config's checks) runs without the cyclic garbage
collector, which the first job or the sweep turns on again (:mod:`rag_ablate.core.profiling`).
"""

from __future__ import annotations

import gc
import sys

from rag_ablate.core import profiling
from rag_ablate.tracking import background


def main(argv: list[str], *, writer: bool = False, startup: bool = False) -> None:
    """Run (or sweep) with the command line ``argv``; exits as the command does (``sys.exit``).

    ``writer``: MLflow is imported and written by a second process while the command runs
    (``python -m rag_ablate`` itself; a call from Python logs in its own process), started here,
    before the command's imports. ``startup``: this process was started for the command (``python
    -m rag_ablate``): the cyclic garbage collector is off from here (after the writer's fork) until
    the first job or the sweep starts (:func:`rag_ablate.core.profiling.startup_gc_off`), and on
    again however the command ends."""
    if writer:
        background.start(argv)
    if startup:
        profiling.startup_gc_off()
    try:
        from rag_ablate.cli.command import main as command  # Hydra and everything a run needs

        command(argv)
    finally:
        profiling.startup_gc_on()  # a command that ended before any job (a bad override, --help)


if __name__ == "__main__":
    # a run allocates many objects and keeps most of them (the dataset, the index, the records):
    # the youngest generation collected every 50,000 allocations rather than every 700 (the writer
    # inherits it) saves 0.02-0.04 s of a COVID-QA run's 1.4 s of CPU after the start-up
    gc.set_threshold(50_000, 10, 10)
    main(sys.argv[1:], writer=True, startup=True)
