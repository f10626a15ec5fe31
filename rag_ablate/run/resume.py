"""``resume=DIR``: finish an interrupted run or sweep where it stopped.

A job appends each record to ``records.jsonl`` as its query completes (before scoring) and writes
``run.json`` (its MLflow run id and its config) when it starts, so a run killed
midway leaves everything needed to finish it:

* :func:`rewrite_argv` runs before Hydra. ``resume=DIR`` names a run folder (it
  has ``.hydra/overrides.yaml``) or a sweep folder (it has ``plan.json``); the
  command line becomes the folder's own overrides plus ``hydra.run.dir=DIR`` (or
  ``-m`` and ``hydra.sweep.dir=DIR``), so the same config is composed and the same
  folder is written. Runtime settings (``progress``, ``tracking``, ...) may be
  added; any other override that differs from the folder's is refused.
* in each job, :func:`load_job` checks the composed config against ``run.json``
  and returns what is kept: the ok records (the last record of each query counts);
  queries with no record or a failed one run again, their records are appended,
  every record (the kept ones too) is scored, and the same MLflow run is reopened and
  finished. At the end the job rewrites ``records.jsonl`` with exactly one scored record
  per query, so the final metrics are those of an uninterrupted run.
* a run or sweep made with ``--config-dir DIR`` (named deployments, your own options) keeps a
  copy of DIR's YAML files in its folder (:func:`save_config_dir`, secrets withheld);
  :func:`rewrite_argv` composes from that copy, so DIR is not needed again;
* for a sweep, :func:`reopen_sweep` (called by the sweeper instead of creating a
  new sweep) checks the plan is the one in ``plan.json`` and reopens the parent
  run; jobs that finished with every query ok are skipped, the others resume, and
  the comparison runs over all of them.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from rag_ablate.config.keys import is_runtime_key, redact, redact_override
from rag_ablate.config.overrides import override_key
from rag_ablate.config.schema import RunConfig
from rag_ablate.core.errors import ConfigError
from rag_ablate.core.fsio import make_dirs, write_json_atomic, write_text_atomic
from rag_ablate.core.layout import (
    CONFIG_COPY_DIR,
    PLAN_FILE,
    RECORDS_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    SWEEP_FILE,
)
from rag_ablate.core.secrets import MASK
from rag_ablate.records.jsonl import final_records, read_records
from rag_ablate.records.trace import Record

RESUME_KEY = "resume"
_HYDRA_OVERRIDES = Path(".hydra") / "overrides.yaml"
_WITHHELD = "withheld.json"  # in the copy of --config-dir: its files whose secrets were not copied
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)", re.M)


def _quote(path: Path) -> str:
    text = str(path)
    return f'"{text}"' if "'" in text else f"'{text}'"


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def folder_kind(folder: Path) -> str:
    """``sweep`` (has plan.json), ``run`` (has .hydra/overrides.yaml); ConfigError otherwise."""
    if not folder.is_dir():
        raise ConfigError(f"resume={folder}: no such folder")
    if (folder / PLAN_FILE).is_file():
        return "sweep"
    if (folder / _HYDRA_OVERRIDES).is_file():
        return "run"
    raise ConfigError(
        f"resume={folder}: neither a run folder (no {_HYDRA_OVERRIDES}) nor a sweep folder (no {PLAN_FILE})"
    )


def _read_json(path: Path, parse: Callable[[str], Any] = json.loads) -> Any:
    """A file ``resume=`` reads from the folder (JSON, or Hydra's YAML with ``parse=yaml.safe_load``);
    ConfigError naming it when it is damaged (cut short, edited, unreadable), instead of a traceback."""
    import yaml

    try:
        return parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise _damaged(path, f"cannot be read ({reason})") from None


def _damaged(path: Path, why: str) -> ConfigError:
    return ConfigError(f"resume: {path} {why}: the folder cannot be resumed as it is")


def _read_yaml(path: Path) -> Any:
    import yaml

    return _read_json(path, yaml.safe_load)


def saved_overrides(folder: Path) -> list[str]:
    """The command-line overrides a run or sweep folder was made with (``resume=`` left out)."""
    if folder_kind(folder) == "sweep":
        info_path = folder / SWEEP_FILE
        if info_path.is_file():
            info = _read_json(info_path)
            found = info.get("overrides") if isinstance(info, dict) else None
        else:
            saved = _read_yaml(folder / "multirun.yaml")
            found = (((saved or {}).get("hydra") or {}).get("overrides") or {}).get("task")
    else:
        found = _read_yaml(folder / _HYDRA_OVERRIDES)
    if not isinstance(found, list):
        raise ConfigError(f"resume={folder}: its saved overrides are not a list")
    return [str(o) for o in found if override_key(str(o)) != RESUME_KEY]


def rewrite_argv(args: list[str]) -> list[str]:
    """The command line Hydra must see for ``resume=DIR`` (``args`` unchanged without it).

    Raises ConfigError when DIR is not a run or sweep folder, or when an override
    changes what the folder's run measured.
    """
    from rag_ablate.config.overrides import normalize_overrides

    given = [a for a in args if not a.startswith("-") and override_key(a) == RESUME_KEY]
    if not given:
        return args
    if len(given) > 1:
        raise ConfigError(f"resume= given {len(given)} times: {' '.join(given)}")
    value = _unquote(given[0].split("=", 1)[1])
    if value in ("", "null"):
        return [a for a in args if a != given[0]]
    folder = Path(value).expanduser().resolve()
    kind = folder_kind(folder)
    original = normalize_overrides(saved_overrides(folder))
    # secrets were stored as *** (header values, keys under secret names, URL passwords): given again
    withheld = {override_key(o): o for o in original if MASK in o.split("=", 1)[-1]}
    flags, extra = [], []
    for a in args:
        if a == given[0] or a in ("-m", "--multirun"):
            continue
        if a.startswith("-") or "=" not in a:
            flags.append(a)
            continue
        norm = normalize_overrides([a])[0]
        if override_key(norm) in ("hydra.run.dir", "hydra.sweep.dir"):
            raise ConfigError(f"resume={folder}: {a} would move the {kind}; it is resumed in its own folder")
        if override_key(norm) in withheld and redact_override(norm) == withheld[override_key(norm)]:
            original[original.index(withheld.pop(override_key(norm)))] = norm
            continue
        if is_runtime_key(override_key(norm)) or norm in original:
            if norm not in original:
                extra.append(norm)
            continue
        same_key = [o for o in original if override_key(o) == override_key(norm)]
        was = " ".join(same_key) if same_key else "not set"
        raise ConfigError(
            f"resume={folder}: {a} changes the config of the {kind} being resumed ({was}); "
            f"a resumed {kind} keeps its overrides ({' '.join(original) or 'none'}); "
            "only runtime settings (progress, tracking, paths, ...) may be added"
        )
    if withheld:
        raise ConfigError(
            f"resume={folder}: {' '.join(withheld.values())} was not stored (a secret); give "
            f"{'it' if len(withheld) == 1 else 'them'} again on the command line, as first given "
            "(or read secrets from the environment: ${oc.env:NAME})"
        )
    flags = _config_dir_flags(folder, flags)
    if kind == "sweep":
        head = ["-m", *original, f"hydra.sweep.dir={_quote(folder)}"]
    else:
        head = [*original, f"hydra.run.dir={_quote(folder)}"]
    print(f"rag_ablate: resuming {kind} {folder}", file=sys.stderr)
    return [*flags, *head, f"{RESUME_KEY}={_quote(folder)}", *extra]


def _config_dir_flags(folder: Path, flags: list[str]) -> list[str]:
    """``flags`` plus ``--config-dir`` of the folder's own copy of the config folder it was made
    with (:func:`save_config_dir`), unless the command line names one; ConfigError when the copy
    lacks secrets (literal header values) that only the original folder has."""
    copy = folder / CONFIG_COPY_DIR
    if not copy.is_dir() or any(f.startswith(("--config-dir", "-cd")) for f in flags):
        return flags
    listed = copy / _WITHHELD
    withheld = _read_json(listed) if listed.is_file() else {}
    if isinstance(withheld, dict) and withheld.get("files"):
        raise ConfigError(
            f"resume={folder}: {', '.join(withheld['files'])} of --config-dir {withheld['source']} set "
            "secrets (header values), which were not stored; give --config-dir again, or read them from "
            "the environment in the file: ${oc.env:NAME}"
        )
    return [f"--config-dir={copy}", *flags]


def user_config_dir(config_sources: Any) -> Path | None:
    """The folder given with ``--config-dir``: of Hydra's config sources (``hydra.runtime.config_sources``),
    the command line's, if any."""
    for source in config_sources:
        if source.provider == "command-line" and source.schema == "file":
            return Path(str(source.path))
    return None


def save_config_dir(config_sources: Any, folder: Path) -> None:
    """Copy the YAML files of ``--config-dir`` (named deployments, your own system or dataset
    options) into ``folder/config``, so ``resume=folder`` composes the same config without it.
    Secrets are not copied: a literal header value (or a key under a secret name) becomes ``***``
    and the file is listed in ``withheld.json`` (resume= then asks for ``--config-dir`` again);
    ``${oc.env:NAME}`` values are copied as written."""
    import yaml
    from omegaconf import OmegaConf

    source = user_config_dir(config_sources)
    if source is None or not source.is_dir():
        return
    copy = folder / CONFIG_COPY_DIR
    withheld: list[str] = []
    for path in sorted(source.rglob("*.yaml")):
        rel = path.relative_to(source)
        text = path.read_text(encoding="utf-8")
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError:
            values = None
        if isinstance(values, dict):
            found = _PACKAGE.search(text)
            package = found.group(1) if found else ".".join(rel.parent.parts)
            prefix = "" if package in ("_global_", "") else package + "."
            stored = _stored(values, prefix)
            if stored != values:
                header = f"# @package {found.group(1)}\n" if found else ""
                text = header + OmegaConf.to_yaml(OmegaConf.create(stored))
                withheld.append(str(rel))
        make_dirs((copy / rel).parent)
        write_text_atomic(copy / rel, text)
    if withheld:
        write_json_atomic(copy / _WITHHELD, {"source": str(source), "files": withheld})


def _stored(values: dict[Any, Any], prefix: str) -> dict[Any, Any]:
    """A config file's values as its copy may hold them: secrets as ``***`` (:func:`redact`),
    interpolations (``${oc.env:NAME}``) as written."""
    out: dict[Any, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out[k] = _stored(v, f"{prefix}{k}.")
        else:
            out[k] = v if isinstance(v, str) and "${" in v else redact({k: v}, prefix)[k]
    return out


def factor_config(s: RunConfig, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The settings that define what a run measures (runtime settings left out), flattened; a value
    read from the environment (``env``: :func:`rag_ablate.config.keys.env_interpolated`) as its
    ``${oc.env:NAME}`` text, secrets as :func:`rag_ablate.config.keys.redact` stores them."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        elif not is_runtime_key(prefix[:-1]):
            out[prefix[:-1]] = node

    walk(asdict(s), "")
    return cast(dict[str, Any], redact(out, env=env))  # no secrets: run.json is stored


@dataclass
class JobState:
    """What an earlier attempt of a job left in its folder."""

    run_id: str | None = None  # its MLflow run (None: not tracked, or killed before it was created)
    tracking_uri: str | None = None
    finished: bool = False  # it completed with every query ok: nothing to resume
    summary: dict[str, Any] = field(default_factory=dict)


def write_run_file(
    job_dir: Path,
    s: RunConfig,
    run_id: str | None,
    tracking_uri: str | None,
    env: Mapping[str, str] | None = None,
) -> None:
    """``run.json``: written when a job starts, read by ``resume=``."""
    data = {"run_id": run_id, "tracking_uri": tracking_uri, "config": factor_config(s, env)}
    write_json_atomic(job_dir / RUN_FILE, data, default=str)


def load_job(job_dir: Path, s: RunConfig, env: Mapping[str, str] | None = None) -> JobState:
    """The state of a job folder being resumed; ConfigError when its config differs from ``s``."""
    path = job_dir / RUN_FILE
    if not path.is_file():  # killed before it started (a sweep's later jobs): a fresh job
        return JobState()
    data = _read_json(path)
    if not isinstance(data, dict):
        raise _damaged(path, "is not a JSON object")
    saved = json.loads(json.dumps(data.get("config") or {}, default=str))
    now = json.loads(json.dumps(factor_config(s, env), default=str))
    changed = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:5])
        raise ConfigError(f"resume: the config of {job_dir} differs from the one it started with ({shown})")
    state = JobState(run_id=data.get("run_id"), tracking_uri=data.get("tracking_uri"))
    summary_path = job_dir / SUMMARY_FILE
    if summary_path.is_file():
        summary = _read_json(summary_path)
        state.summary = summary if isinstance(summary, dict) else {}
        state.finished = int(state.summary.get("n_failed", 1)) == 0
    return state


def kept_records(job_dir: Path, query_ids: set[str]) -> dict[str, Record]:
    """The ok records an earlier attempt left (the last record of each query of the dataset, or of
    each (query, repeat), by :func:`~rag_ablate.records.trace.record_key`)."""
    path = job_dir / RECORDS_FILE
    if not path.is_file():
        return {}
    latest = final_records(read_records(path))
    return {
        key: r for key, r in latest.items() if r["query_id"] in query_ids and r.get("status") == "ok"
    }


def _comparable(jobs: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [
        (str(j["label"]), [o for o in j["overrides"] if not is_runtime_key(override_key(o))]) for j in jobs
    ]


def reopen_sweep(sweep_dir: Path, plan: Any) -> dict[str, Any]:
    """Resume a sweep folder: check the plan is the saved one and reopen its parent run.

    ``plan`` is the :class:`rag_ablate.sweep.plan.Plan` built from the resumed command
    line; the folder's ``plan.json`` and ``sweep.json`` are kept as they are.
    """
    from rag_ablate.tracking import store as tracking

    saved = _read_json(sweep_dir / PLAN_FILE)
    jobs = saved.get("jobs") if isinstance(saved, dict) else None
    if not isinstance(jobs, list) or _comparable(jobs) != _comparable(plan.to_dict()["jobs"]):
        raise ConfigError(f"resume={sweep_dir}: the plan differs from the sweep's {PLAN_FILE}")
    info_path = sweep_dir / SWEEP_FILE
    info: dict[str, Any] = _read_json(info_path) if info_path.is_file() else {}
    if not isinstance(info, dict):
        raise _damaged(info_path, "is not a JSON object")
    if info.get("parent_run_id"):
        tracking.reopen_run(info["tracking_uri"], info["parent_run_id"])
    return info


def end_interrupted(job_dir: Path, status: str) -> None:
    """A job raised (``FAILED``) or was interrupted (``KILLED``) before finishing its run:
    end the run it started, so MLflow does not show it running (``resume=`` reopens it)."""
    path = job_dir / RUN_FILE
    if not path.is_file():
        return
    try:
        data = _read_json(path)
    except ConfigError:  # best effort, in a job's error path: its own error is what the user sees
        return
    uri, run_id = (data.get("tracking_uri"), data.get("run_id")) if isinstance(data, dict) else (None, None)
    if not uri or not run_id:
        return
    from rag_ablate.tracking import store as tracking

    with contextlib.suppress(Exception):  # best effort: the job's own error is what the user sees
        if tracking.run_status(uri, run_id) == "RUNNING":
            tracking.end_run(uri, run_id, status)
