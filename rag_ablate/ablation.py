"""One factor at a time: turn sweep overrides (and a study's factors) into a job plan.

``python -m rag_ablate -m chunk=256,512 retrieval=bm25,hybrid`` runs the baseline
(the composed default config) plus one variant per listed level that differs
from the baseline, each changing only that factor. A level equal to the
baseline's value *is* the baseline, not another job. ``ablation.mode=grid``
asks for Hydra's usual full factorial instead, labelled as such.

A study (``conf/experiment/<name>.yaml``, selected with ``experiment=<name>``)
lists its factors in ``ablation.factors`` in command-line syntax; factors given
on the command line are added, and replace a study factor on the same key.

The plan is written to ``<sweep dir>/plan.json``; each job finds its own entry
there by its job number, so run names and ``ablation.*`` tags never depend on
parsing override strings back.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, OmegaConf

from rag_ablate.errors import ConfigError

PLAN_FILE = "plan.json"
MODES = ("ofat", "grid")
_MISSING = object()


@dataclass
class Factor:
    key: str
    is_group: bool
    default: str  # the baseline's value (a group's choice, or a value as text)
    levels: list[str]  # as typed, quotes removed
    level_overrides: list[str]  # the override each level becomes, e.g. chunk='256'


@dataclass
class Job:
    index: int
    label: str
    role: str  # baseline | variant | grid
    factor: str | None
    level: str | None
    overrides: list[str]


@dataclass
class Plan:
    mode: str
    dry_run: bool
    common: list[str]
    factors: list[Factor]
    jobs: list[Job] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


def _unquote(s: str) -> str:
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _factor(ov: Override, config: DictConfig) -> Factor:
    key = ov.get_key_element()
    if ov.is_sweep_override():
        if not ov.is_discrete_sweep():
            raise ConfigError(f"'{ov.input_line}': only lists of levels (a,b,c) or range() can be ablated")
        strings = list(ov.sweep_string_iterator())
    else:
        strings = [ov.get_value_element_as_str()]
    choices = config.hydra.runtime.choices
    is_group = key in choices
    if is_group:
        default = _text(choices.get(key))
    else:
        found = OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False)
        if found is _MISSING:
            raise ConfigError(
                f"'{ov.input_line}': '{key}' is neither a config group nor a setting of the config"
            )
        default = _text(found)
    levels: list[str] = []
    level_overrides: list[str] = []
    for s in strings:
        lv = _unquote(s)
        if lv not in levels:
            levels.append(lv)
            level_overrides.append(f"{key}={s}")
    return Factor(key, is_group, default, levels, level_overrides)


def _normalized(items: list[str]) -> list[str]:
    from rag_ablate.app import normalize_overrides

    return normalize_overrides(items)


def build_plan(config: DictConfig, arguments: list[str], parser: OverridesParser) -> Plan:
    """The jobs of a sweep: baseline first, then one variant per non-default level (or the grid)."""
    ab = config.get("ablation") or {}
    mode = str(ab.get("mode", "ofat"))
    if mode not in MODES:
        raise ConfigError(f"ablation.mode must be one of {', '.join(MODES)}, got '{mode}'")
    study = [str(x) for x in (ab.get("factors") or [])]

    cli = parser.parse_overrides(_normalized(list(arguments)))
    common = [str(o.input_line) for o in cli if not o.is_sweep_override()]
    by_key: dict[str, Override] = {}
    for ov in parser.parse_overrides(_normalized(study)):
        by_key[ov.get_key_element()] = ov
    for ov in cli:
        if ov.is_sweep_override():
            by_key[ov.get_key_element()] = ov
    factors = [_factor(ov, config) for ov in by_key.values()]
    plan = Plan(mode=mode, dry_run=bool(ab.get("dry_run", False)), common=common, factors=factors)

    baseline = Job(0, "baseline", "baseline", None, None, list(common))
    jobs = [baseline]
    if mode == "ofat":
        for f in factors:
            for lv, lo in zip(f.levels, f.level_overrides, strict=True):
                if lv == f.default:
                    continue
                jobs.append(Job(len(jobs), f"{f.key}={lv}", "variant", f.key, lv, [*common, lo]))
    else:
        axes = [list(zip(f.levels, f.level_overrides, strict=True)) for f in factors]
        for combo in itertools.product(*axes):
            changed = [(f, lv) for f, (lv, _) in zip(factors, combo, strict=True) if lv != f.default]
            if not changed:
                continue  # the baseline, already first
            label = ",".join(f"{f.key}={lv}" for f, lv in changed)
            jobs.append(
                Job(
                    len(jobs),
                    label,
                    "grid",
                    ",".join(f.key for f, _ in changed),
                    ",".join(lv for _, lv in changed),
                    [*common, *(lo for _, lo in combo)],
                )
            )
    plan.jobs = jobs
    return plan


def format_plan(plan: Plan) -> str:
    kind = (
        "one factor at a time"
        if plan.mode == "ofat"
        else "full factorial grid (variants may change several factors)"
    )
    lines = [f"ablation plan ({kind}): {len(plan.jobs)} job(s)"]
    for f in plan.factors:
        kept = [lv for lv in f.levels if lv != f.default]
        same = " (one level equals the baseline)" if len(kept) < len(f.levels) else ""
        lines.append(f"  factor {f.key}: baseline {f.default}; levels {', '.join(f.levels)}{same}")
    width = max(len(j.label) for j in plan.jobs)
    for j in plan.jobs:
        change = "-" if j.factor is None else f"{j.factor} -> {j.level}"
        lines.append(f"  #{j.index:<3} {j.label.ljust(width)}  {j.role:<8}  {change}")
    if plan.common:
        lines.append(f"  every job also gets: {' '.join(plan.common)}")
    if plan.dry_run:
        lines.append(
            "dry run: nothing was run and no MLflow run was created (drop ablation.dry_run=true to run)"
        )
    return "\n".join(lines)


def write_plan(plan: Plan, sweep_dir: Path, config: DictConfig) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(config, sweep_dir / "multirun.yaml")
    tmp = sweep_dir / (PLAN_FILE + ".tmp")
    tmp.write_text(json.dumps(plan.to_dict(), ensure_ascii=False, indent=1), encoding="utf-8")
    tmp.replace(sweep_dir / PLAN_FILE)


def job_entry(sweep_dir: Path, job_num: int) -> dict[str, Any] | None:
    """This job's entry of the sweep's plan, or None when the sweep has no plan."""
    path = sweep_dir / PLAN_FILE
    if not path.is_file():
        return None
    jobs = json.loads(path.read_text(encoding="utf-8"))["jobs"]
    if not 0 <= job_num < len(jobs):
        return None
    entry = jobs[job_num]
    return entry if isinstance(entry, dict) else None
