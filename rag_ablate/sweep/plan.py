"""One factor at a time: turn sweep overrides (and a study's factors) into a job plan.

``python -m rag_ablate -m chunk=256,512 retrieval=bm25,hybrid`` runs the baseline
(the composed default config) plus one variant per listed level that differs
from the baseline, each changing only that factor. A level equal to the
baseline's value *is* the baseline, not another job. ``ablation.mode=grid``
asks for Hydra's usual full factorial instead, labelled as such.

A study (``conf/experiment/<name>.yaml``, selected with ``experiment=<name>``)
lists its factors in ``ablation.factors`` in command-line syntax; factors given
on the command line are added, and replace a study factor on the same key.

Before anything runs, :func:`check_plan` composes every job's config the way the
launcher will and validates it (schema, ranges, registry names), so a misspelt
factor, an unknown option or an invalid level fails with one line naming it and
the valid choices, before a folder or an MLflow run exists. A job whose settings,
once those its configuration never reads are left out
(:data:`rag_ablate.config.keys.USED_ONLY_WHEN`), equal an earlier job's would measure
the same system again: the plan is refused, naming the setting and why it is unused
(``retrieval.top_k`` under a reranker).

A level is compared with the baseline's value as Hydra reads it: an unquoted URL
(``system.base_url=http://127.0.0.1:8001,...``, whose colons Hydra's sweep parser
escapes) equals the same URL quoted or in the baseline.

The plan is written to ``<sweep dir>/plan.json``; each job finds its own entry
there by its job number, so run names and ``ablation.*`` tags never depend on
parsing override strings back.
"""

from __future__ import annotations

import difflib
import itertools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rag_ablate.config.keys import (
    env_interpolated,
    hydra_error_line,
    is_secret_key,
    redact_hydra,
    redact_override,
    unused_settings,
)
from rag_ablate.config.overrides import normalize_overrides, override_key
from rag_ablate.config.schema import RunConfig
from rag_ablate.core.errors import ConfigError, RagAblateError
from rag_ablate.core.fmt import display_width, pad
from rag_ablate.core.fsio import make_dirs, write_json_atomic, write_text_atomic
from rag_ablate.core.layout import PLAN_FILE
from rag_ablate.core.secrets import MASK, hide_credentials
from rag_ablate.run.runner import flatten, job_entry
from rag_ablate.settings import to_settings

__all__ = [
    "MODES",
    "PLAN_FILE",
    "Factor",
    "Job",
    "Plan",
    "build_plan",
    "check_names",
    "check_plan",
    "format_plan",
    "job_entry",
    "refuse_repeats",
    "spend_lines",
    "write_plan",
]

MODES = ("ofat", "grid")
_MISSING = object()


@dataclass
class Factor:
    key: str
    is_group: bool
    default: str  # the baseline's value (a group's choice, or a value as text)
    levels: list[str]  # as typed, quotes removed
    level_overrides: list[str]  # the override each level becomes, e.g. chunk='256'
    first_is_baseline: bool = False  # the baseline config leaves it unset: its first level is the baseline's


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
        """The plan as ``plan.json`` stores it (:meth:`stored`)."""
        return asdict(self.stored())

    def stored(self) -> Plan:
        """The plan as it may be stored or printed: every override as
        :func:`rag_ablate.config.keys.redact_override` stores it (header values, keys under secret
        names, URL passwords as ``***``), labels and levels without URL passwords. The launcher
        gets the real overrides."""
        # the levels of a secret setting (+system.body.api_key=K1,K2) become ***1, ***2: labels stay distinct
        masks = {
            lv: f"{MASK}{i}" for f in self.factors if is_secret_key(f.key) for i, lv in enumerate(f.levels, 1)
        }

        def hide(text: str) -> str:
            for secret, mask in sorted(masks.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(secret, mask)
            return hide_credentials(text)

        def factor(f: Factor) -> Factor:
            levels = [hide(lv) for lv in f.levels]
            level_overrides = [redact_override(o) for o in f.level_overrides]
            default = MASK if is_secret_key(f.key) else hide(f.default)
            return Factor(f.key, f.is_group, default, levels, level_overrides, f.first_is_baseline)

        def job(j: Job) -> Job:
            level = None if j.level is None else hide(j.level)
            overrides = [redact_override(o) for o in j.overrides]
            return Job(j.index, hide(j.label), j.role, j.factor, level, overrides)

        common = [redact_override(o) for o in self.common]
        factors = [factor(f) for f in self.factors]
        return Plan(self.mode, self.dry_run, common, factors, [job(j) for j in self.jobs])

    def secret_swaps(self) -> dict[str, str]:
        """Each override of a job that is stored otherwise (:meth:`stored`), with its stored form:
        what a log line naming a job's overrides must show instead."""
        every = {o for j in self.jobs for o in j.overrides}
        return {o: r for o in every if (r := redact_override(o)) != o}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


_ESCAPED = re.compile(r"\\(.)")


def _unquote(s: str) -> str:
    """A level as its value reads: quotes removed, or Hydra's escapes of an unquoted value
    (``http\\://a\\:8001`` -> ``http://a:8001``) undone."""
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return _ESCAPED.sub(r"\1", s)


def _same(level: str, default: str) -> bool:
    """Whether a level is the baseline's value: the same text, or the same number (``60`` is ``60.0``)."""
    if level == default:
        return True
    try:
        return float(level) == float(default)
    except ValueError:
        return False


def _factor(ov: Override, config: DictConfig) -> Factor:
    key = ov.get_key_element()
    if ov.is_sweep_override():
        if not ov.is_discrete_sweep():
            raise ConfigError(f"'{ov.input_line}': only lists of levels (a,b,c) or range() can be ablated")
        strings = list(ov.sweep_string_iterator())
    else:
        strings = [ov.get_value_element_as_str()]
    # Hydra reads booleans back as Python's True/False: spell them as typed and as the baseline
    # is shown (false), so retrieval.acl_filter=false,true has one level equal to the baseline
    strings = [s.lower() if s in ("True", "False") else s for s in strings]
    choices = config.hydra.runtime.choices
    is_group = key in choices
    if is_group:
        default = _text(choices.get(key))
    else:
        found = OmegaConf.select(config, key, default=_MISSING, throw_on_missing=False)
        if found is _MISSING or key.split(".", 1)[0] == "hydra":
            raise ConfigError(_unknown_key(str(ov.input_line), key, config))
        default = _text(found)
    levels: list[str] = []
    level_overrides: list[str] = []
    for s in strings:
        # a numeric group's levels are quoted (and new sizes registered) however they
        # were given, e.g. by range(256,1025,256)
        lo = normalize_overrides([f"{key}={s}"])[0] if is_group else f"{key}={s}"
        lv = _unquote(lo.split("=", 1)[1])
        if _ESCAPED.search(s) and "'" not in lv:  # Hydra's escapes (a URL's colons): quoted instead
            lo = f"{key}='{lv}'"
        if lv not in levels:
            levels.append(lv)
            level_overrides.append(lo)
    return Factor(key, is_group, default, levels, level_overrides)


def _setting_names(node: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + str(k))
            out.extend(_setting_names(v, f"{prefix}{k}."))
    return out


def _unknown_key(line: str, key: str, config: DictConfig) -> str:
    """One line: the factor is neither a group nor a setting; the nearest names, or the groups."""
    groups = sorted(str(g) for g in config.hydra.runtime.choices if not str(g).startswith("hydra"))
    keys = [str(k) for k in config if k != "hydra"]
    plain = OmegaConf.to_container(OmegaConf.masked_copy(config, keys), resolve=False)
    names = sorted(set(groups) | set(_setting_names(plain)))
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(near)}?"
        if near
        else f"config groups: {', '.join(groups)}; settings are group.key (python -m rag_ablate --cfg job)"
    )
    return f"unknown factor '{key}' in {line}: not a config group or setting; {hint}"


def build_plan(config: DictConfig, arguments: list[str], parser: OverridesParser) -> Plan:
    """The jobs of a sweep: baseline first, then one variant per non-default level (or the grid)."""
    ab = config.get("ablation") or {}
    mode = str(ab.get("mode", "ofat"))
    if mode not in MODES:
        raise ConfigError(f"ablation.mode must be one of {', '.join(MODES)}, got '{mode}'")
    study = [str(x) for x in (ab.get("factors") or [])]

    cli = parser.parse_overrides(normalize_overrides(list(arguments)))
    common = [str(o.input_line) for o in cli if not o.is_sweep_override()]
    by_key: dict[str, Override] = {}
    for ov in parser.parse_overrides(normalize_overrides(study)):
        by_key[ov.get_key_element()] = ov
    for ov in cli:
        if ov.is_sweep_override():
            by_key[ov.get_key_element()] = ov
    factors = [_factor(ov, config) for ov in by_key.values()]
    plan = Plan(mode=mode, dry_run=bool(ab.get("dry_run", False)), common=common, factors=factors)
    # a factor the baseline leaves unset (system.base_url, a group chosen as null): its first level
    # is the baseline's, so every job that does not vary it gets that level
    pinned: dict[str, str] = {}
    for f in factors:
        if f.default == "null" and f.levels and f.levels[0] != "null":
            f.default, f.first_is_baseline = f.levels[0], True
            pinned[f.key] = f.level_overrides[0]

    baseline = Job(0, "baseline", "baseline", None, None, [*common, *pinned.values()])
    jobs = [baseline]
    if mode == "ofat":
        for f in factors:
            others = [o for k, o in pinned.items() if k != f.key]
            for lv, lo in zip(f.levels, f.level_overrides, strict=True):
                if _same(lv, f.default):
                    continue
                jobs.append(Job(len(jobs), f"{f.key}={lv}", "variant", f.key, lv, [*common, *others, lo]))
    else:
        axes = [list(zip(f.levels, f.level_overrides, strict=True)) for f in factors]
        for combo in itertools.product(*axes):
            changed = [(f, lv) for f, (lv, _) in zip(factors, combo, strict=True) if not _same(lv, f.default)]
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


def check_names(s: RunConfig) -> None:
    """What a job needs that composing its config cannot check: names a registry must
    know (the system under test) and the dataset folder."""
    from rag_ablate.systems import SYSTEMS

    SYSTEMS.check(s.system.name)
    if s.dataset.path is not None and not Path(s.dataset.path).expanduser().is_dir():
        raise ConfigError(f"dataset folder not found: {Path(s.dataset.path).expanduser()}")
    from rag_ablate.dataset.weights import check_folder

    check_folder(s.dataset)  # dataset.slice_weights names tags the queries have


def with_values(base: DictConfig, overrides: list[str]) -> DictConfig:
    """A copy of the composed config ``base`` with plain-value ``overrides`` (no config group)
    applied as Hydra applies them after composing the defaults (its own
    ``_apply_overrides_to_config``, the same errors): what composing ``base``'s overrides plus
    these gives, in a few milliseconds instead of a whole composition (~0.2-0.3 s)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    cfg = copy.deepcopy(base)
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides(overrides), cfg)
    return cfg


def check_plan(
    plan: Plan,
    compose: Callable[[list[str]], DictConfig],
    group_options: Callable[[str], list[str]],
) -> list[RunConfig]:
    """Validate every job before any runs; raises ConfigError naming the bad factor or level.

    ``compose`` builds a job's config from its overrides as the launcher will
    (Hydra's ``config_loader.load_sweep_config``); ``group_options`` lists a config
    group's options. A job whose overrides are the common ones plus plain values (no config
    group) is the common ones' config with those values applied (:func:`with_values`): the
    common config is composed once, so a plan of thousands of plain levels is checked in
    seconds. Returns the jobs' settings in job order.
    """
    for f in plan.factors:
        if not f.is_group:
            continue
        valid = group_options(f.key)
        for lv in f.levels:
            if lv not in valid:
                shown = ", ".join(valid)
                raise ConfigError(f"unknown level '{lv}' of factor {f.key} ({f.key}={lv}); valid: {shown}")
    groups = {f.key for f in plan.factors if f.is_group}
    common: list[DictConfig] = []  # the common overrides' config, composed at the first plain job
    settings = []
    for job in plan.jobs:
        n = len(plan.common)
        extra = job.overrides[n:] if job.overrides[:n] == plan.common else None
        # a group is named with slashes (system/deployment), a setting with dots: either form of a
        # factor's group, or any key with a slash, is composed by Hydra
        plain = extra is not None and not any(
            "/" in (k := override_key(o)) or k in groups or k.replace(".", "/") in groups for o in extra
        )
        if len(plan.jobs) > 100 and job.index % 100 == 0:  # 0.1-0.3 s a job: say how far
            print(f"checking the plan: job {job.index} of {len(plan.jobs)}", file=sys.stderr, flush=True)
        if job.role == "baseline":
            what = "the baseline (the config every job starts from)"
        elif job.role == "variant":
            what = f"level {job.label} of factor {job.factor}"
        else:
            what = f"grid job {job.label}"
        try:
            if plain and extra is not None:
                if not common:
                    common.append(compose(list(plan.common)))
                s = to_settings(with_values(common[0], extra))
            else:
                s = to_settings(compose(list(job.overrides)))
            check_names(s)
        except RagAblateError as exc:
            raise ConfigError(f"invalid {what}: {exc}") from exc
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            raise ConfigError(f"invalid {what}: {hydra_error_line(exc)}") from exc
        settings.append(s)
    refuse_repeats(plan, settings)
    return settings


def _what(job: Job) -> str:
    if job.role == "baseline":
        return "the baseline"
    return f"level {job.label} of factor {job.factor}" if job.role == "variant" else f"grid job {job.label}"


def refuse_repeats(plan: Plan, settings: list[RunConfig]) -> None:
    """Raise ConfigError when a job's effective settings (its settings without those its
    configuration never reads) equal an earlier job's: it would measure the same system again
    under another label. The line names the job, the one it repeats and why the settings that
    differ change nothing."""
    # each earlier job by its effective settings, hashable: one look-up per job, so a plan of
    # thousands of levels is checked in seconds (comparing every pair took minutes)
    seen: dict[Any, tuple[Job, dict[str, Any]]] = {}
    for job, s in zip(plan.jobs, settings, strict=True):
        flat = flatten(asdict(s))
        unused = unused_settings(flat)
        key = _frozen({k: v for k, v in flat.items() if k not in unused})
        if key not in seen:
            seen[key] = (job, flat)
            continue
        other, other_flat = seen[key]
        differ = sorted(k for k in flat.keys() | other_flat.keys() if flat.get(k) != other_flat.get(k))
        why = "; ".join(dict.fromkeys(unused[k] for k in differ if k in unused))
        if not why:
            why = f"{job.level} is the value {_what(other)} already has, written another way"
        raise ConfigError(
            f"{_what(job)} would run the same settings as {_what(other)} (#{other.index}): {why}; "
            "drop the level, or change a setting this configuration uses"
        )


def _frozen(value: Any) -> Any:
    """``value`` as a hashable value equal to another exactly when the two values are equal
    (dicts and lists as sorted items and tuples; 1 and 1.0 stay equal, as ``==`` has them)."""
    if isinstance(value, dict):
        return frozenset((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(_frozen(v) for v in value)
    return value


def format_plan(plan: Plan, spend: Sequence[str] = ()) -> str:
    """The plan as printed before a sweep; ``spend``: :func:`spend_lines`."""
    plan = plan.stored()
    kind = (
        "one factor at a time"
        if plan.mode == "ofat"
        else "full factorial grid (variants may change several factors)"
    )
    lines = [f"ablation plan ({kind}): {len(plan.jobs)} job(s)"]
    for f in plan.factors:
        kept = [lv for lv in f.levels if not _same(lv, f.default)]
        same = " (one level equals the baseline)" if len(kept) < len(f.levels) else ""
        first = " (the first level: the config sets none)" if f.first_is_baseline else ""
        lines.append(f"  factor {f.key}: baseline {f.default}{first}; levels {', '.join(f.levels)}{same}")
    width = max(display_width(j.label) for j in plan.jobs)
    for j in plan.jobs:
        change = "-" if j.factor is None else f"{j.factor} -> {j.level}"
        lines.append(f"  #{j.index:<3} {pad(j.label, width)}  {j.role:<8}  {change}")
    if plan.common:
        lines.append(f"  every job also gets: {' '.join(plan.common)}")
    lines += spend
    if plan.dry_run:
        lines.append(
            "dry run: nothing was run and no MLflow run was created (drop ablation.dry_run=true to run)"
        )
    return "\n".join(lines)


def spend_lines(plan: Plan, settings: Sequence[RunConfig]) -> list[str]:
    """The plan's lines on the model calls, tokens and money its jobs will spend at most
    (:mod:`rag_ablate.run.budget`); none when no job calls a model."""
    from rag_ablate.run.budget import calls_a_model, estimate_calls, format_estimates

    if not any(calls_a_model(s) for s in settings):
        return []
    from rag_ablate.run.runner import get_dataset  # the jobs load it again from this cache

    estimates = []
    for job, s in zip(plan.jobs, settings, strict=True):
        texts = [q.query for q in get_dataset(s).queries]
        estimates += estimate_calls(s, texts, job.label, baseline=job.role == "baseline")
    return format_estimates(estimates, settings[0].cost.max_usd if settings else None)


def write_plan(plan: Plan, sweep_dir: Path, config: DictConfig) -> None:
    make_dirs(sweep_dir)
    # as Hydra's own sweeper writes it, without secrets (header values, URL passwords, ...)
    env = env_interpolated(OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"]))
    stored = redact_hydra(cast(dict[str, Any], OmegaConf.to_container(config, resolve=False)), env)
    write_text_atomic(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(OmegaConf.create(stored)))
    write_json_atomic(sweep_dir / PLAN_FILE, plan.to_dict())
