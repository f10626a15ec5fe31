"""The confounding guard: which factors does a variant change against the baseline?

An ablation teaches something only when each variant differs from the baseline
in exactly one factor. The guard diffs each variant's resolved config against
the baseline's, ignoring settings that say how to run rather than what is run
(output paths, progress bars, tracking, the comparison's own settings, Hydra
internals), and names the changed factors: a config group whose choice changed
counts once (``retrieval``), any other changed value counts under its key
(``chunk.overlap``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rag_ablate.config import RUNTIME_KEYS

if TYPE_CHECKING:
    from rag_ablate.compare import VariantData

IGNORED = (*RUNTIME_KEYS, "experiment")


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in IGNORED)


def changed_factors(
    base_config: Mapping[str, Any],
    config: Mapping[str, Any],
    base_choices: Mapping[str, str] | None = None,
    choices: Mapping[str, str] | None = None,
) -> list[str]:
    """The factors in which ``config`` differs from ``base_config``, sorted."""
    a, b = _flat(base_config), _flat(config)
    keys = sorted(k for k in set(a) | set(b) if not _ignored(k) and a.get(k) != b.get(k))
    groups = {
        g
        for g in set(base_choices or {}) | set(choices or {})
        if not _ignored(g) and (base_choices or {}).get(g) != (choices or {}).get(g)
    }
    factors = set(groups)
    for k in keys:
        top = k.split(".", 1)[0]
        if top not in groups:
            factors.add(k)
    return sorted(factors)


def confounded_variants(variants: Sequence[VariantData], baseline: str) -> dict[str, list[str]]:
    """Variants that change more than one factor, with the factors."""
    base = next(v for v in variants if v.label == baseline)
    out = {}
    for v in variants:
        if v is base or not v.config or not base.config:
            continue
        factors = changed_factors(base.config, v.config, base.info.get("choices"), v.info.get("choices"))
        if len(factors) > 1:
            out[v.label] = factors
    return out
