"""The Hydra application: compose the config, run one variant."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rag_ablate.config import register_configs
from rag_ablate.errors import RagAblateError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

_NUMERIC = r"[0-9]+(?:\.[0-9]+)?"
_OVERRIDE = re.compile(rf"^(?P<key>[A-Za-z_][\w/]*)=(?P<vals>{_NUMERIC}(?:,{_NUMERIC})*)$")


@cache
def numeric_groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """Config groups with at least one option whose name is a number (e.g. ``chunk``)."""
    found = set()
    if conf_dir.is_dir():
        for sub in conf_dir.iterdir():
            if sub.is_dir() and any(p.stem.replace(".", "", 1).isdigit() for p in sub.glob("*.yaml")):
                found.add(sub.name)
    return frozenset(found)


def normalize_overrides(args: list[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """Quote bare numbers given to numeric config groups: ``chunk=256,512`` -> ``chunk='256','512'``."""
    groups = numeric_groups(conf_dir)
    out = []
    for arg in args:
        m = _OVERRIDE.match(arg)
        if m and m.group("key") in groups:
            arg = m.group("key") + "=" + ",".join(f"'{v}'" for v in m.group("vals").split(","))
        out.append(arg)
    return out


register_configs()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    from rag_ablate.runner import run_variant

    try:
        result = run_variant(cfg)
    except RagAblateError as exc:
        print(f"rag_ablate: error: {exc}", file=sys.stderr)
        sys.exit(2)
    return result
