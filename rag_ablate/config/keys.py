"""Which config keys are runtime settings (how to run, never a factor), which hold secrets, and
which a configuration never reads (:data:`USED_ONLY_WHEN`)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from rag_ablate.config.overrides import override_key
from rag_ablate.core.fsio import write_text_atomic
from rag_ablate.core.secrets import MASK, hide_credentials, is_secret_name

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
    "generator.concurrency",
)


# how judge=openai reaches its endpoint (not what it judges): runtime settings
JUDGE_RUNTIME_KEYS = (
    "judge.api_key_env",
    "judge.timeout_s",
    "judge.retries",
    "judge.backoff_s",
    "judge.backoff_max_s",
    "judge.concurrency",
    "judge.max_error_rate",
)


# config groups whose options set another package than the group's path: a named deployment
# (system/deployment/<name>.yaml, `# @package system`) sets the system's own settings
GROUP_PACKAGES = {"system/deployment": "system"}


# config keys whose values are secrets: never logged, stored or printed (see redact)
SECRET_KEYS = ("system.headers",)

REDACTED = MASK

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
    """Whether ``key``'s value is a secret: one of :data:`SECRET_KEYS` or below one (every header
    value, whatever its name), or a key whose name says so (``system.body.api_key``, a misspelt
    ``system.header.X-Token``: :func:`rag_ablate.core.secrets.is_secret_name`)."""
    return is_under(key, SECRET_KEYS) or is_secret_name(key)


@dataclass(frozen=True)
class UsedOnlyWhen:
    """Settings the built-in pipeline (and system=http) read only under some values of another
    setting: under any other value they change nothing a run does, so a sweep level that changes
    only them repeats another job (:func:`unused_settings`; refused when the plan is checked)."""

    keys: tuple[str, ...]  # settings, or whole sections (every setting below them; `setting` excepted)
    setting: str  # the setting that decides
    values: tuple[str, ...] = ()  # read only when `setting` is one of these ...
    unless: tuple[str, ...] = ()  # ... or only when it is none of these
    hint: str = ""  # what to change instead

    def unused(self, value: Any) -> bool:
        text = _text(value)
        return (bool(self.values) and text not in self.values) or text in self.unless

    def why(self, key: str, value: Any) -> str:
        when = f"{self.setting}={_text(value)}"
        return f"{key} is not used when {when}" + (f" ({self.hint})" if self.hint else "")


def _keys(section: str, names: str) -> tuple[str, ...]:
    """``section.name`` for each space-separated name."""
    return tuple(f"{section}.{name}" for name in names.split())


_CLIENT = "timeout_s retries backoff_s backoff_max_s"  # an HTTP client's settings
_PROMPTED = f"base_url model api_key_env temperature max_tokens prompt_zh prompt_en {_CLIENT}"  # openai

#: every "ignored under this configuration" case, in one place (README "Levels that change nothing")
USED_ONLY_WHEN: tuple[UsedOnlyWhen, ...] = (
    UsedOnlyWhen(("retrieval.bm25",), "retrieval.method", values=("bm25", "hybrid")),
    UsedOnlyWhen(
        _keys("retrieval.dense", "encoder index approximate_above build_threads"),
        "retrieval.method",
        values=("dense", "hybrid"),
    ),
    UsedOnlyWhen(("retrieval.hybrid",), "retrieval.method", values=("hybrid",)),
    UsedOnlyWhen(("retrieval.hybrid.rrf_k",), "retrieval.hybrid.fusion", values=("rrf",)),
    UsedOnlyWhen(("retrieval.hybrid.weight",), "retrieval.hybrid.fusion", values=("weighted",)),
    UsedOnlyWhen(
        ("retrieval.top_k",),
        "rerank.method",
        values=("none",),
        hint="with a reranker, rerank.candidates sets how many chunks are retrieved and rerank.top_k "
        "how many are kept",
    ),
    UsedOnlyWhen(("rerank",), "rerank.method", unless=("none",)),
    UsedOnlyWhen(("rerank.encoder",), "rerank.method", values=("biencoder",)),
    UsedOnlyWhen(("rerank.model_path",), "rerank.method", values=("cross_encoder",)),
    UsedOnlyWhen(_keys("rerank", "url model timeout api_key_env"), "rerank.method", values=("http",)),
    UsedOnlyWhen(("router.ngram",), "router.method", unless=("none",)),
    UsedOnlyWhen(("generator",), "generator.name", unless=("none",)),
    UsedOnlyWhen(
        _keys("generator", "max_chunks max_sentences min_support refusal_zh refusal_en max_sentence_tokens"),
        "generator.name",
        values=("extractive",),
    ),
    UsedOnlyWhen(
        _keys("generator", f"{_PROMPTED} concurrency"),
        "generator.name",
        values=("openai",),
    ),
    UsedOnlyWhen(("judge",), "judge.name", unless=("none",)),
    UsedOnlyWhen(
        _keys(
            "system", f"base_url shape model eval_path chat_path headers body response concurrency {_CLIENT}"
        ),
        "system.name",
        values=("http",),
    ),
    UsedOnlyWhen(("system.response",), "system.name", values=("http", "replay")),
    UsedOnlyWhen(_keys("system", "path format join run_id experiment"), "system.name", values=("replay",)),
)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def unused_settings(flat: Mapping[str, Any]) -> dict[str, str]:
    """The keys of ``flat`` (a run's settings as ``{dotted.key: value}``) that its configuration never
    reads (:data:`USED_ONLY_WHEN`), each with one line saying why (the first rule that holds, in
    the table's order)."""
    unused = {
        i for i, rule in enumerate(USED_ONLY_WHEN) if rule.setting in flat and rule.unused(flat[rule.setting])
    }
    out: dict[str, str] = {}
    for key in flat:
        first = next((i for i in _rules_covering(key) if i in unused), None)
        if first is not None:
            rule = USED_ONLY_WHEN[first]
            out[key] = rule.why(key, flat[rule.setting])
    return out


@functools.lru_cache(maxsize=4096)
def _rules_covering(key: str) -> tuple[int, ...]:
    """The indices of the :data:`USED_ONLY_WHEN` rules whose keys hold ``key`` (its own deciding
    setting excepted). Computed once per key: a plan of thousands of jobs asks for the same keys
    once per job (:func:`rag_ablate.sweep.plan.refuse_repeats`)."""
    return tuple(
        i for i, rule in enumerate(USED_ONLY_WHEN) if key != rule.setting and is_under(key, rule.keys)
    )


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
    """``values`` (a config as plain containers, or flattened ``{dotted.key: value}``) as it may be
    stored: every header value (:data:`SECRET_KEYS`; header names stay visible) replaced by ``***``;
    every value read from an environment variable (``env``, from :func:`env_interpolated`) by its
    unresolved ``${oc.env:NAME}`` text; every other value whose key names a secret
    (:func:`is_secret_key`) by ``***``; in every other text, the user and password of a URL and the
    token after ``Bearer`` by ``***`` (:func:`rag_ablate.core.secrets.hide_credentials`)."""
    env = env or {}
    if isinstance(values, dict):
        out: dict[Any, Any] = {}
        for k, v in values.items():
            key = f"{prefix}{k}"
            # the headers mapping itself is walked, so header names stay visible
            header = key not in SECRET_KEYS and is_under(key, SECRET_KEYS)
            if header and v is not None:
                out[k] = REDACTED
            elif key in env:
                out[k] = env[key]
            elif key not in SECRET_KEYS and is_secret_name(key) and v is not None:
                out[k] = REDACTED
            else:
                out[k] = redact(v, key + ".", env)
        return out
    if isinstance(values, list):
        return [env.get(f"{prefix}{i}", redact(v, f"{prefix}{i}.", env)) for i, v in enumerate(values)]
    if isinstance(values, str):
        return hide_credentials(values)
    return values


def redact_override(override: str, env: Mapping[str, str] | None = None) -> str:
    """A command-line override as it may be stored or printed: its value replaced by ``***`` when
    it sets a secret (``+system.headers.Authorization=...``, ``+system.body.api_key=...``), by its
    ``${oc.env:NAME}`` text when the config reads it from the environment (``env``:
    :func:`env_interpolated`; Hydra hands a job its overrides with ``${oc.env:...}`` resolved
    already), else with the user and password of a URL (``http://u:KEY@host``) and a ``Bearer``
    token replaced by ``***``."""
    key = override_key(override)
    if "=" not in override:
        return override
    if is_secret_key(key):
        return f"{override.split('=', 1)[0]}={REDACTED}"
    if env and key in env:
        return f"{override.split('=', 1)[0]}={env[key]}"
    return hide_credentials(override)


def redact_hydra(config: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A composed config with its ``hydra`` node (plain containers, unresolved) as it may be stored:
    the settings as :func:`redact` stores them; in ``hydra``, every override (``overrides.task``,
    ``overrides.hydra``) as :func:`redact_override` stores it, wherever it appears (``override_dirname``
    is made of them), and no URL user and password or ``Bearer`` token in any text. What
    ``multirun.yaml`` and Hydra's ``.hydra/`` files hold."""
    out = redact({k: v for k, v in config.items() if k != "hydra"}, env=env)
    if "hydra" not in config:
        return cast(dict[str, Any], out)
    given = config["hydra"].get("overrides") or {}
    every = [str(o) for part in ("task", "hydra") for o in (given.get(part) or [])]
    swaps = {o: r for o in every if (r := redact_override(o, env)) != o}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, str):
            return node
        for original, redacted in sorted(swaps.items(), key=lambda kv: -len(kv[0])):
            node = node.replace(original, redacted)  # an override, or override_dirname made of them
        return hide_credentials(node)

    out["hydra"] = walk(config["hydra"])
    return cast(dict[str, Any], out)


def redact_hydra_output(folder: Path, env: Mapping[str, str] | None = None) -> None:
    """Rewrite the files Hydra wrote in a job's ``.hydra/`` folder (``config.yaml``, ``hydra.yaml``,
    ``overrides.yaml``) as :func:`redact_hydra` stores them: Hydra writes them before the job starts,
    with header values, keys under secret names and URL passwords as given. A file with something
    to hide is written to a temporary name and renamed; one with nothing to hide is left as Hydra
    wrote it, and one that is absent is left absent. The files are read with libyaml's parser
    when PyYAML has it (the same data as the pure-Python one; a file it cannot read is read again
    with the pure-Python one)."""
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        path = folder / name
        if not path.is_file():
            continue
        data = _load_yaml(path.read_text(encoding="utf-8"))
        stored: Any
        if isinstance(data, list):
            stored = [redact_override(str(o), env) for o in data]
        elif isinstance(data, dict):
            stored = redact_hydra(data, env)
        else:
            continue
        if stored != data:
            write_text_atomic(path, OmegaConf.to_yaml(OmegaConf.create(stored)))


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, by libyaml's parser when PyYAML was built with it."""
    import yaml

    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return yaml.load(text, Loader=fast)
        except yaml.YAMLError:
            pass  # read by the pure-Python parser below, which says what is wrong
    return yaml.safe_load(text)


def hydra_error_line(exc: BaseException) -> str:
    """A composition error as one line (Hydra's and OmegaConf's messages span several): its first
    line, the first line of its cause for a merge error, the valid options for a missing one."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    first = lines[0] if lines else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and first.startswith(("Error merging", "Could not override", "Error loading")):
        cause_lines = [ln.strip() for ln in str(cause).strip().splitlines() if ln.strip()]
        if cause_lines:
            first = f"{first}: {cause_lines[0]}"
    elif first.endswith("raised while composing config:") and len(lines) > 1:
        first = f"{first} {lines[1]}"  # In 'group/option': ...: Key 'x' not in 'SystemConfig'
    for group, package in GROUP_PACKAGES.items():  # an option written without its package line
        if f"In '{group}/" in first and f"Key '{group.rsplit('/', 1)[-1]}' not in" in first:
            first += f" (a file of {group} starts with the line '# @package {package}')"
    at = next((i for i, ln in enumerate(lines) if ln.startswith("Available options in")), None)
    if at is not None:
        options = itertools.takewhile(lambda ln: not ln.startswith("Config search path"), lines[at + 1 :])
        first = f"{first}; valid: {', '.join(options)}"
    return first
