"""Entry point: ``python -m rag_ablate [overrides]`` (``-m`` for a sweep).

Before Hydra parses the command line, values of numeric config groups are quoted
and chunk sizes without a preset file are registered (:mod:`rag_ablate.config.overrides`),
so ``python -m rag_ablate -m chunk=300,600`` works exactly as typed; ``resume=DIR``
becomes the folder's own command line (:mod:`rag_ablate.run.resume`).
"""

from __future__ import annotations

import sys

from rag_ablate.config.overrides import check_override_keys, normalize_overrides
from rag_ablate.core.errors import EXIT_INVALID, ConfigError
from rag_ablate.run.resume import rewrite_argv


def main(argv: list[str]) -> None:
    """Run (or sweep) with the command line ``argv``; exits as the command does (``sys.exit``)."""
    try:
        args = normalize_overrides(rewrite_argv(argv))
        check_override_keys(args)
    except ConfigError as exc:
        print(f"rag_ablate: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    sys.argv[1:] = args  # Hydra reads its command line from sys.argv
    try:
        from rag_ablate.cli.hydra_app import main as hydra_main

        hydra_main()
    except SystemExit as exc:
        # Hydra reports an override it cannot parse or a config it cannot compose (retrieval=nope,
        # retrieval.top_k=abc) with exit 1; nothing ran then, so exit 2 as every config error does
        from hydra.errors import HydraException

        if exc.code == 1 and isinstance(exc.__context__, HydraException):
            sys.exit(EXIT_INVALID)
        raise
    except KeyboardInterrupt:  # before a run or sweep exists (they handle their own Ctrl-C)
        print("\nrag_ablate: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main(sys.argv[1:])
