"""The command ``python -m rag_ablate [overrides]`` (``-m`` for a sweep), behind its entry point
(``rag_ablate/__main__.py``, which starts MLflow's background writer before this is imported).

Before Hydra parses the command line, values of numeric config groups are quoted
and chunk sizes without a preset file are registered (:mod:`rag_ablate.config.overrides`),
so ``python -m rag_ablate -m chunk=300,600`` works exactly as typed; ``resume=DIR``
becomes the folder's own command line (:mod:`rag_ablate.run.resume`).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rag_ablate.config.keys import hydra_error_line, redact_override
from rag_ablate.config.overrides import check_override_keys, normalize_overrides
from rag_ablate.core.errors import EXIT_FAILED, EXIT_INVALID, ConfigError
from rag_ablate.core.secrets import MASK, looks_like_key
from rag_ablate.run.resume import rewrite_argv
from rag_ablate.tracking import background

if TYPE_CHECKING:
    from omegaconf import DictConfig


def check_override_syntax(args: list[str]) -> None:
    """Each override parsed as Hydra will parse it; ConfigError naming one that Hydra cannot read,
    with its value as it may be printed (Hydra's own message would quote a key it holds)."""
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for override in get_args_parser().parse_known_args(args)[0].overrides:
        try:
            parser.parse_overrides([override])
        except OverrideParseException as exc:
            shown = redact_override(override)
            lines = [ln.strip() for ln in str(exc.message).splitlines()]
            why = [ln for ln in lines if ln and override not in ln and "hydra.cc" not in ln and ln != "^"]
            reason = why[0] if why else "not a valid override"
            value = override.split("=", 1)[-1]
            if shown != override and any(part in reason for part in re.findall(r"[\w.~+/-]{4,}", value)):
                reason = "not a valid override"  # the parser quotes part of a secret
            if shown == override and not value.isascii() and not value.startswith(("'", '"')):
                key = override.split("=", 1)[0]
                reason += f"; quote a value with non-ASCII characters: {key}='{value}'"
            raise ConfigError(f"cannot parse the override '{shown}': {reason}") from None


def _report_config_errors_in_one_line() -> None:
    """Hydra reports a config it cannot compose (``retrieval=bm26``, ``retrieval.top_k=abc``) over
    several lines of its own and exits 1; rag_ablate says it in its one line and exits 2 (nothing
    ran), values that are secrets masked. Hydra reports every other error as before. (Hydra calls
    ``run_and_report`` by its module's name, so the one wrapped here is the one it calls.)"""
    import hydra._internal.utils as hydra_utils
    from hydra.errors import ConfigCompositionException, OverrideParseException

    report = hydra_utils.run_and_report
    if getattr(report, "rag_ablate", False):
        return

    def run_and_report(func: Any) -> Any:
        try:
            return func()
        except (ConfigCompositionException, OverrideParseException) as exc:
            line = hydra_error_line(exc)
            for arg in sys.argv[1:]:
                value = arg.split("=", 1)[-1]
                if redact_override(arg) != arg or looks_like_key(value):  # a key given the wrong way
                    line = line.replace(value, MASK)
            print(f"rag_ablate: error: {line}", file=sys.stderr)
            sys.exit(EXIT_INVALID)
        except Exception as exc:  # reported by Hydra, as before
            return report(functools.partial(_reraise, exc))

    run_and_report.rag_ablate = True  # type: ignore[attr-defined]
    hydra_utils.run_and_report = run_and_report


def _reraise(exc: Exception) -> None:
    raise exc


def _multirun_first(argv: list[str]) -> list[str]:
    """``-m`` typed after an override (``progress=false -m chunk=256,512``) moved before the first
    override: Hydra's parser takes no option after them (it said "unrecognized arguments")."""
    first = next((i for i, a in enumerate(argv) if "=" in a and not a.startswith("-")), len(argv))
    late = [a for a in argv[first:] if a in ("-m", "--multirun")]
    if not late:
        return argv
    return argv[:first] + late + [a for a in argv[first:] if a not in late]


@contextlib.contextmanager
def _mode_composition_reused() -> Iterator[None]:
    """Hydra composes a command's whole config twice (0.2-0.3 s each): once, in multirun mode, to
    read ``hydra.mode`` (``Hydra.get_mode``), then again for the run or sweep with
    ``hydra.mode=RUN`` or ``MULTIRUN`` added. While the command runs, the second is the first's
    config with that one setting applied as Hydra applies an override after composing (its own
    ``_apply_overrides_to_config``, then recorded among ``hydra.overrides.hydra`` as Hydra records
    it), its overrides checked as Hydra checks them for that mode. A run-mode composition differs
    from a multirun one only where a config group has no option chosen (``???``: skipped in
    multirun mode, an error in run mode): such a config is composed again by Hydra. Only the first
    composition is kept, as it is (``get_mode`` reads its ``hydra.mode`` and drops it, so the
    second composition takes it over); every other one is Hydra's own."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    compose = ConfigLoaderImpl.load_configuration
    first: list[tuple[Any, RunMode, list[str], DictConfig]] = []  # the first composition
    calls = [0]

    def reusable(key: Any, run_mode: RunMode, overrides: list[str]) -> tuple[DictConfig, list[str]] | None:
        """The first composition's config and the ``hydra.mode`` overrides added since, if this
        composition may be derived from it (the first is spent then)."""
        if not first:
            return None
        first_key, first_mode, before, cfg = first.pop()
        if first_key != key or overrides[: len(before)] != before:
            return None
        extra = overrides[len(before) :]
        if not all(o.startswith("hydra.mode=") for o in extra):
            return None
        choices = cfg.hydra.runtime.choices
        if run_mode != first_mode and any(OmegaConf.is_missing(choices, k) for k in choices):
            return None
        return cfg, extra

    def load_configuration(
        self: ConfigLoaderImpl,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        calls[0] += 1
        key = (id(self), config_name, from_shell)
        reuse = reusable(key, run_mode, overrides)
        if reuse is None:
            cfg = compose(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
            if calls[0] == 1 and run_mode == RunMode.MULTIRUN:  # Hydra.get_mode's composition
                first.append((key, run_mode, list(overrides), cfg))
            return cfg
        cfg, extra = reuse
        parser = OverridesParser.create()
        if validate_sweep_overrides:
            parsed = parser.parse_overrides(overrides=overrides)
            self.validate_sweep_overrides_legal(parsed, run_mode=run_mode, from_shell=from_shell)
        added = parser.parse_overrides(overrides=extra)
        ConfigLoaderImpl._apply_overrides_to_config(added, cfg)
        for o in added:
            cfg.hydra.overrides.hydra.append(o.input_line)
        return cfg

    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
    try:
        yield
    finally:
        ConfigLoaderImpl.load_configuration = compose  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    """Run (or sweep) with the command line ``argv``; exits as the command does (``sys.exit``). The
    background MLflow writer, when there is one, was started by the entry point
    (``rag_ablate.__main__.main``) before this module was imported."""
    try:
        args = normalize_overrides(rewrite_argv(_multirun_first(argv)))
        check_override_syntax(args)
        check_override_keys(args)
    except ConfigError as exc:
        print(f"rag_ablate: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    sys.argv[1:] = args  # Hydra reads its command line from sys.argv
    _report_config_errors_in_one_line()
    try:
        from rag_ablate.cli.hydra_app import main as hydra_main

        with _mode_composition_reused():
            hydra_main()
    except SystemExit as exc:
        # Hydra reports an override it cannot parse or a config it cannot compose (retrieval=nope,
        # retrieval.top_k=abc) with exit 1; nothing ran then, so exit 2 as every config error does
        from hydra.errors import HydraException

        if exc.code == 1 and isinstance(exc.__context__, HydraException):
            sys.exit(EXIT_INVALID)
        raise
    except KeyboardInterrupt:  # before a run or sweep exists (they handle their own Ctrl-C)
        print("\nrag_ablate: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
    finally:
        _writer_done()


def _writer_done() -> None:
    """The background writer of a command that ended before its own end waited for it (a sweep
    stopped by a full disk, an error): what it was handed is done first; a call that failed there
    is said, one line each, and a command that was to exit 0 exits 1."""
    failed = background.finish()
    background.forget()
    for line in failed:
        print(f"rag_ablate: error: MLflow writer: {line}", file=sys.stderr)
    running = sys.exc_info()[1]
    if failed and (running is None or (isinstance(running, SystemExit) and not running.code)):
        sys.exit(EXIT_FAILED)

