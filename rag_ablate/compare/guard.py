"""The confounding guard: which factors does a variant change against the baseline?

An ablation teaches something only when each variant differs from the baseline
in exactly one factor, on the same data. The guard diffs each variant's resolved
config against the baseline's, ignoring settings that say how to run rather than
what is run (output paths, progress bars, tracking, the comparison's own
settings, Hydra internals), and names the changed factors:

* a config group whose choice changed counts once (``retrieval``), with the values of its
  package (``system/deployment=after`` sets ``system.*``: :data:`rag_ablate.config.keys.GROUP_PACKAGES`);
* a key set explicitly inside a changed group counts on its own
  (``retrieval=hybrid`` with ``retrieval.top_k=20`` is two factors: the group
  and ``retrieval.top_k``), since the group's own values cannot explain it;
* any other changed value counts under its key (``chunk.overlap``).

The data are compared by fingerprint (``corpus_fingerprint`` and
``queries_fingerprint`` in each job's ``variant.json``): another corpus or query
set is a confound by itself, named as such, whatever the config says (the
dataset's path and name are then not factors: the fingerprints decide). A
variant whose config (or the baseline's) cannot be read is reported as
unchecked, never passed silently.

After the run, :func:`no_ops` names the variants whose records equal the baseline's (every
query's status, retrieved chunk ids, answer, intents and citations; timings aside): whatever
their label says they change, it changed nothing the metrics can see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rag_ablate.config.keys import GROUP_PACKAGES, RUNTIME_KEYS, is_under
from rag_ablate.config.overrides import override_key

if TYPE_CHECKING:
    from rag_ablate.compare.model import VariantData

IGNORED = (*RUNTIME_KEYS, "experiment")
#: config keys and groups that only name the data; the fingerprints judge the data instead
DATASET_IDENTITY = ("dataset", "dataset.path", "dataset.name")
FINGERPRINTS = (("corpus_fingerprint", "corpus"), ("queries_fingerprint", "query set"))


@dataclass
class GuardFinding:
    """What the guard found for one variant."""

    label: str
    factors: list[str] = field(default_factory=list)  # config factors that differ from the baseline
    dataset: list[str] = field(default_factory=list)  # the data differ: "corpus (fingerprint ... vs ...)"
    unchecked: str = ""  # why the config could not be compared ('' when it was)

    @property
    def confounded(self) -> bool:
        return bool(self.dataset) or len(self.factors) > 1

    @property
    def differences(self) -> list[str]:
        return [*self.dataset, *self.factors]


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _override_keys(overrides: Sequence[str], groups: Sequence[str]) -> set[str]:
    """Config keys set by ``key=value`` overrides (group choices excluded)."""
    keys = set()
    for o in overrides:
        key = override_key(o)
        if key and key.replace("/", ".") not in groups and key not in groups:
            keys.add(key)
    return keys


def changed_factors(
    base_config: Mapping[str, Any],
    config: Mapping[str, Any],
    base_choices: Mapping[str, str] | None = None,
    choices: Mapping[str, str] | None = None,
    base_overrides: Sequence[str] = (),
    overrides: Sequence[str] = (),
    ignore: Sequence[str] = (),
) -> list[str]:
    """The factors in which ``config`` differs from ``base_config``, sorted (see the module docstring).

    ``ignore``: more keys (and groups) to leave out, besides the runtime settings.
    """
    skip = (*IGNORED, *ignore)
    bc, vc = base_choices or {}, choices or {}
    a, b = _flat(base_config), _flat(config)
    keys = sorted(k for k in set(a) | set(b) if not is_under(k, skip) and a.get(k) != b.get(k))
    all_groups = sorted(set(bc) | set(vc))
    changed_groups = [g for g in all_groups if not is_under(g, skip) and bc.get(g) != vc.get(g)]
    packages = [GROUP_PACKAGES.get(g, g.replace("/", ".")) for g in changed_groups]
    explicit = _override_keys([*base_overrides, *overrides], all_groups)
    factors = set(changed_groups)
    for k in keys:
        if not is_under(k, packages):
            factors.add(k)
            continue
        # inside a changed group: a factor of its own only when an override set it
        for o in explicit:
            if is_under(k, (o,)):
                factors.add(o)
    return sorted(factors)


def _short(fp: object) -> str:
    return str(fp)[:12]


def check_variant(base: VariantData, variant: VariantData) -> GuardFinding:
    """The guard's finding for one variant against the baseline."""
    finding = GuardFinding(variant.label)
    ignore: tuple[str, ...] = ()
    have_fingerprints = all(base.info.get(key) and variant.info.get(key) for key, _ in FINGERPRINTS)
    if have_fingerprints:
        ignore = DATASET_IDENTITY
        for key, what in FINGERPRINTS:
            if base.info[key] != variant.info[key]:
                finding.dataset.append(
                    f"{what} (fingerprint {_short(base.info[key])} vs {_short(variant.info[key])})"
                )
    if base.config is None:
        finding.unchecked = f"the baseline's {base.config_problem or 'config is missing'}"
    elif variant.config is None:
        finding.unchecked = variant.config_problem or "config is missing"
    else:
        finding.factors = changed_factors(
            base.config,
            variant.config,
            base.info.get("choices"),
            variant.info.get("choices"),
            base.overrides,
            variant.overrides,
            ignore=ignore,
        )
    return finding


def check(variants: Sequence[VariantData], baseline: str) -> dict[str, GuardFinding]:
    """Every variant but the baseline, with what the guard found."""
    base = next(v for v in variants if v.label == baseline)
    return {v.label: check_variant(base, v) for v in variants if v is not base}


def confounded_variants(variants: Sequence[VariantData], baseline: str) -> dict[str, list[str]]:
    """Variants that change more than one factor or the data, with what they change."""
    return {label: f.differences for label, f in check(variants, baseline).items() if f.confounded}


def unchecked_variants(variants: Sequence[VariantData], baseline: str) -> dict[str, str]:
    """Variants whose config could not be compared, with why."""
    return {label: f.unchecked for label, f in check(variants, baseline).items() if f.unchecked}


def no_ops(variants: Sequence[VariantData], baseline: str) -> list[str]:
    """The variants whose records equal the baseline's, timings aside (``VariantData.outputs``)."""
    base = next((v for v in variants if v.label == baseline), None)
    if base is None or base.outputs is None:
        return []
    return [v.label for v in variants if v.label != baseline and v.outputs == base.outputs]
