"""Entry point: ``python -m rag_ablate [overrides]`` (``-m`` for a sweep).

Hydra parses ``chunk=256`` as the integer 256 and refuses it as a config-group
choice. Config groups whose options are named by numbers are therefore found in
``conf/`` and their bare numeric values quoted before Hydra sees the command
line, so ``python -m rag_ablate -m chunk=256,512`` works exactly as typed.
"""

from __future__ import annotations

import sys

from rag_ablate.app import main, normalize_overrides

if __name__ == "__main__":
    sys.argv[1:] = normalize_overrides(sys.argv[1:])
    main()
