"""Which config keys are runtime settings (how to run, never a factor) and which hold secrets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rag_ablate.config.overrides import override_key

# how system=http talks to the service (not what the service is): runtime settings
HTTP_RUNTIME_KEYS = (
    "system.headers",
    "system.concurrency",
    "system.timeout_s",
    "system.retries",
    "system.backoff_s",
    "system.backoff_max_s",
    "system.max_error_rate",
)


# how generator=openai reaches its endpoint (not what answers): runtime settings
GENERATOR_RUNTIME_KEYS = (
    "generator.api_key_env",
    "generator.timeout_s",
    "generator.retries",
    "generator.backoff_s",
    "generator.backoff_max_s",
)


# how judge=openai reaches its endpoint (not what it judges): runtime settings
JUDGE_RUNTIME_KEYS = (
    "judge.api_key_env",
    "judge.timeout_s",
    "judge.retries",
    "judge.backoff_s",
    "judge.backoff_max_s",
    "judge.concurrency",
)


# config keys whose values are secrets: never logged, stored or printed (see redact)
SECRET_KEYS = ("system.headers",)

REDACTED = "***"

# settings that say how to run, not what the system under test is: never a factor
# of an ablation, left out of run names and of the confounding guard
RUNTIME_KEYS = (
    "progress",
    "paths",
    "tracking",
    "hydra",
    "metrics.summary",
    "compare",
    "timing",  # how latency is measured for the comparison
    "ablation",
    "cache",
    "cost",
    "resume",
    "privacy",  # what a run stores of its text, not what the system does
    "dataset.slice_weights",  # how the evaluation is weighted, not what the system is
    "dataset.edge_tags",
    *HTTP_RUNTIME_KEYS,
    *GENERATOR_RUNTIME_KEYS,
    *JUDGE_RUNTIME_KEYS,
)


def is_under(key: str, prefixes: Iterable[str]) -> bool:
    """Whether the dotted config ``key`` is one of ``prefixes`` or lies below one: ``compare``
    covers ``compare`` and ``compare.B``, never ``compare_x``. A config group's path counts as
    its package (``hydra/launcher`` lies below ``hydra``)."""
    dotted = key.replace("/", ".")
    return any(dotted == p or dotted.startswith(p + ".") for p in prefixes)


def is_runtime_key(key: str) -> bool:
    """Whether ``key`` (``progress``, ``system.headers.X-Key``, ``hydra/launcher``) is a runtime
    setting (:data:`RUNTIME_KEYS`): how to run, never a factor. An override's key is
    :func:`rag_ablate.config.overrides.override_key`."""
    return is_under(key, RUNTIME_KEYS)


def is_secret_key(key: str) -> bool:
    """Whether ``key`` is one of :data:`SECRET_KEYS` (its whole value is secret) or below one."""
    return is_under(key, SECRET_KEYS)


def env_interpolated(cfg: Any) -> dict[str, str]:
    """Dotted keys of ``cfg`` (a DictConfig) whose value reads an environment variable
    (``${oc.env:NAME}``), with their unresolved text: what is stored instead of the value."""
    raw = OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig) else cfg
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{prefix}{i}.")
        elif isinstance(node, str) and "oc.env" in node:
            out[prefix[:-1]] = node

    walk(raw, "")
    return out


def redact(values: Any, prefix: str = "", env: Mapping[str, str] | None = None) -> Any:
    """``values`` (a config as plain containers, or flattened ``{dotted.key: value}``) with
    every value under :data:`SECRET_KEYS` replaced by ``***`` (header names stay visible) and
    every value read from an environment variable (``env``, from :func:`env_interpolated`)
    replaced by its unresolved ``${oc.env:NAME}`` text."""
    env = env or {}
    if isinstance(values, dict):
        out: dict[Any, Any] = {}
        for k, v in values.items():
            key = f"{prefix}{k}"
            # the mapping itself is walked, so header names stay visible
            secret = key not in SECRET_KEYS and is_secret_key(key)
            if secret and v is not None:
                out[k] = REDACTED
            elif key in env:
                out[k] = env[key]
            else:
                out[k] = redact(v, key + ".", env)
        return out
    if isinstance(values, list):
        return [env.get(f"{prefix}{i}", redact(v, f"{prefix}{i}.", env)) for i, v in enumerate(values)]
    return values


def redact_override(override: str, env: Mapping[str, str] | None = None) -> str:
    """A command-line override with its value replaced by ``***`` when it sets a secret
    (``+system.headers.Authorization=...``), or by its ``${oc.env:NAME}`` text when the config
    reads it from the environment (``env``: :func:`env_interpolated`; Hydra hands a job its
    overrides with ``${oc.env:...}`` resolved already)."""
    key = override_key(override)
    if "=" not in override:
        return override
    if is_secret_key(key):
        return f"{override.split('=', 1)[0]}={REDACTED}"
    if env and key in env:
        return f"{override.split('=', 1)[0]}={env[key]}"
    return override
