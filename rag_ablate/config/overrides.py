"""The command line before Hydra sees it: numeric config groups and unique folder names.

Hydra parses ``chunk=256`` as the integer 256 and refuses it as a config-group
choice ("Config group override must be a string"). Config groups whose options
are named by numbers (found in ``conf/``) therefore get their bare numeric values
quoted: ``chunk=256,512`` becomes ``chunk='256','512'``.

The ``chunk`` group takes any positive whole size, not only its preset files
(128, 256, 512, 1024): a size without a file (``chunk=300``) is registered in
Hydra's ConfigStore as the option ``chunk/300`` before Hydra composes, with
``size: 300`` and the presets' overlap rule, one eighth of the size rounded down
(300 -> 37; always smaller than the size). ``chunk=300 chunk.overlap=50`` still
sets the overlap by hand. A size of zero, a negative or fractional size, or a
word that is no option fails with one line naming the value and the presets.

:func:`normalize_overrides` does both (quoting and registering); it runs on the
command line (``python -m rag_ablate``) and on a study's factors
(``ablation.factors``), so a size works the same typed, swept or listed in a study.

:func:`register_resolvers` adds ``${rag_ablate.uid:}``, a short random suffix that
``conf/config.yaml`` appends to run and sweep folder names, so two sweeps started
in the same second never share a folder. Hydra copies resolved values from the
sweep's config to its jobs' configs, so every job of a sweep sees the same suffix.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rag_ablate.core.errors import ConfigError
from rag_ablate.core.secrets import hide_credentials, is_secret_name, looks_like_key

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
UID_RESOLVER = "rag_ablate.uid"

# a value that is a plain list of (optionally quoted) tokens; anything else (range(),
# choice(), interpolations, lists in brackets) is left to Hydra
_PLAIN_VALUES = re.compile(r"^[^()\[\]{}$]+$")
_TOKEN = re.compile(r"""^(?P<q>['"]?)(?P<v>[^'",]*)(?P=q)$""")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def override_key(override: str) -> str:
    """The config key or config group a command-line override names, as Hydra reads it
    (``Override.key_or_group``): ``chunk=256`` -> ``chunk``, ``+chunk.chunk_sise=3`` ->
    ``chunk.chunk_sise``, ``++dataset.slice_weights={numeric: -1}`` -> ``dataset.slice_weights``,
    ``~rerank`` -> ``rerank``, ``hydra/launcher=joblib`` -> ``hydra/launcher``,
    ``db@backup=mysql`` -> ``db`` (the ``@package`` is not part of it).

    A key never holds ``=``, so the value (``system.base_url='http://a?b=1'``) is never read.
    A flag (``-m``) comes back as it is.
    """
    head = override.split("=", 1)[0]
    for prefix in ("~", "++", "+"):  # Hydra takes exactly one of them
        if head.startswith(prefix):
            head = head[len(prefix) :]
            break
    return head.split("@", 1)[0]


def chunk_option(size: int) -> dict[str, Any]:
    """The ``chunk`` option for a size without a preset file: the presets' overlap rule."""
    return {"size": size, "overlap": size // 8}


# numeric groups that accept any positive whole number, and how to build its option
SIZED_GROUPS: dict[str, Callable[[int], dict[str, Any]]] = {"chunk": chunk_option}


def _is_number(stem: str) -> bool:
    return stem.replace(".", "", 1).isdigit()


@cache
def numeric_groups(conf_dir: Path = CONF_DIR) -> frozenset[str]:
    """Config groups with at least one option whose name is a number (e.g. ``chunk``)."""
    found = set()
    if conf_dir.is_dir():
        for sub in conf_dir.iterdir():
            if sub.is_dir() and any(_is_number(p.stem) for p in sub.glob("*.yaml")):
                found.add(sub.name)
    return frozenset(found)


def preset_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """A group's options that are YAML files, numbers in numeric order first."""
    stems = [p.stem for p in (conf_dir / group).glob("*.yaml")]
    return sorted(stems, key=lambda s: (0, float(s), s) if _is_number(s) else (1, 0.0, s))


def _stored_options(group: str) -> set[str]:
    try:
        names = ConfigStore.instance().list(group)
    except OSError:  # the group has no ConfigStore entries
        return set()
    return {n.removesuffix(".yaml") for n in names}


def _bad_value(group: str, value: str, conf_dir: Path) -> ConfigError:
    presets = ", ".join(preset_options(group, conf_dir))
    if group in SIZED_GROUPS:
        return ConfigError(
            f"{group}={value}: a {group} size must be a whole number >= 1 "
            f"(presets: {presets}; any other size such as {group}=300 works too)"
        )
    return ConfigError(f"{group}={value}: no such option; valid: {presets}")


def _level(group: str, token: str, conf_dir: Path) -> str:
    """One value of a numeric group, as Hydra must see it (quoted); registers new sizes."""
    m = _TOKEN.match(token.strip())
    if m is None:
        raise _bad_value(group, token, conf_dir)
    value = m.group("v").strip()
    known = preset_options(group, conf_dir)
    if value in known or (not _is_number(value) and value in _stored_options(group)):
        return f"'{value}'"
    builder = SIZED_GROUPS.get(group)
    if builder is None or not _INTEGER.match(value) or int(value) < 1:
        raise _bad_value(group, value, conf_dir)
    size = int(value)
    if str(size) in preset_options(group, conf_dir):  # e.g. 0256
        return f"'{size}'"
    ConfigStore.instance().store(group=group, name=str(size), node=builder(size), provider="rag_ablate")
    return f"'{size}'"


def normalize_overrides(args: list[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """Quote numeric group values (``chunk=256,512`` -> ``chunk='256','512'``) and register
    sizes without a preset file (``chunk=300``); raises ConfigError for an invalid size."""
    groups = numeric_groups(conf_dir)
    out = []
    for arg in args:
        key = override_key(arg)
        values = arg[len(key) + 1 :]
        if key in groups and arg.startswith(key + "=") and _PLAIN_VALUES.match(values):
            levels = [_level(key, tok, conf_dir) for tok in values.split(",")]
            arg = key + "=" + ",".join(levels)
        out.append(arg)
    return out


_SCHEMA_KEY = re.compile(r"[A-Za-z_][\w.]*")


def _fields(cls: type) -> dict[str, Any]:
    """A config dataclass's fields and their resolved types."""
    import typing

    return dict(typing.get_type_hints(cls))


def check_override_keys(args: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Refuse an override whose key the config does not have, naming the valid ones.

    ``retreival=bm25`` or ``retrieval.top_kk=3`` would otherwise reach Hydra, whose error
    names the key but not what it should be. Keys under a mapping field (``cost.prices.*``,
    ``system.headers.*``), additions (``+key=``), deletions (``~key``), ``hydra.*`` and
    ``hydra/...`` choices, and flags are left to Hydra. Config groups are the folders of
    ``conf/`` (``experiment=...``) and the fields of the schema.
    """
    import dataclasses
    import difflib

    from rag_ablate.config.schema import RunConfig

    groups = {p.name for p in conf_dir.iterdir() if p.is_dir()}
    for arg in args:
        if arg.startswith(("+", "~", "-")) or "=" not in arg:
            continue
        key = override_key(arg)
        if not _SCHEMA_KEY.fullmatch(key) or key.startswith("hydra"):
            continue
        parts = key.split(".")
        node: Any = RunConfig
        for depth, part in enumerate(parts):
            fields = _fields(node)
            where = ".".join(parts[:depth])
            if part not in fields and not (depth == 0 and part in groups):
                valid = sorted(fields) if depth else sorted(set(fields) | groups)
                close = difflib.get_close_matches(part, valid, n=1, cutoff=0.6)
                hint = f"did you mean '{'.'.join([*parts[:depth], close[0]])}'? " if close else ""
                scope = f"under '{where}'" if where else "at the top level"
                names = ", ".join(valid)
                # the value is not echoed when it may be a key (a misspelt api_key, a key-like value)
                secret = is_secret_name(key) or looks_like_key(arg.split("=", 1)[-1])
                shown = f"{arg.split('=', 1)[0]}=***" if secret else hide_credentials(arg)
                raise ConfigError(f"unknown config key '{key}' in '{shown}': {hint}valid {scope}: {names}")
            kind = fields.get(part)
            if kind is None or not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
                break  # a value, a mapping or a conf/ group outside the schema: Hydra checks the rest
            node = kind


def register_resolvers() -> None:
    """``${rag_ablate.uid:}``: six hex digits, fixed once per composed config (idempotent)."""
    if not OmegaConf.has_resolver(UID_RESOLVER):
        OmegaConf.register_new_resolver(UID_RESOLVER, lambda: secrets.token_hex(3), use_cache=True)


register_resolvers()
