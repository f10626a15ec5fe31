"""Composition-time checks: the one module that knows every registry and every plug-in's validator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig

from rag_ablate.config.ranges import check_ranges
from rag_ablate.config.schema import CompareConfig, RunConfig, parse_config, validate_system
from rag_ablate.core.errors import ComparisonError, ConfigError, UnknownNameError


def check_names(s: RunConfig) -> None:
    """Every pluggable name in ``s`` must be registered; UnknownNameError lists the valid ones.

    Runs when the config is composed, so a misspelt ``retrieval=bm52`` or
    ``rerank.encoder=minlm`` fails before any job starts.
    """
    from rag_ablate.generators import GENERATORS
    from rag_ablate.judges import JUDGES
    from rag_ablate.pipeline.stages import FUSIONS, RERANKERS, RETRIEVERS, ROUTERS, check_encoder
    from rag_ablate.systems import SYSTEMS

    SYSTEMS.check(s.system.name)
    RETRIEVERS.check(s.retrieval.method)
    _named("retrieval.hybrid.fusion", FUSIONS.check, s.retrieval.hybrid.fusion)
    RERANKERS.check(s.rerank.method)
    ROUTERS.check(s.router.method)
    GENERATORS.check(s.generator.name)
    JUDGES.check(s.judge.name)
    check_encoder("retrieval.dense.encoder", s.retrieval.dense.encoder)
    from rag_ablate.pipeline.dense import choose_index

    _named("retrieval.dense.index", lambda index: choose_index(index, 0, 0), s.retrieval.dense.index)
    check_encoder("rerank.encoder", s.rerank.encoder)


def _named(setting: str, check: Callable[[str], object], value: str) -> None:
    """``check(value)``, whose unknown-name error then names the setting too (as the encoders'
    do): these values are set by key (``retrieval.hybrid.fusion=...``), not by a config group."""
    try:
        check(value)
    except UnknownNameError as exc:
        raise UnknownNameError(f"{exc.kind} ({setting})", exc.name, exc.valid) from None


def validate(s: RunConfig) -> None:
    """Every setting's range and allowed values (declared on the schema's fields, one generic check),
    then what a field alone cannot say: registered names and combinations."""
    check_ranges(s, "")
    check_names(s)
    from rag_ablate.tracking.traces import parse_setting

    parse_setting(s.tracking.traces)  # none | a number of queries per split | all
    validate_system(s.system)
    if s.system.name == "http":  # its shape, endpoints and response paths
        from rag_ablate.config.shapes import check_shape

        check_shape(s.system)
    if s.generator.name == "openai":  # base_url, model and both prompts, before any job starts
        from rag_ablate.generators.openai import validate_openai

        validate_openai(s.generator)
    if s.judge.name == "openai":  # endpoint, model, prompts and rubric, before any job starts
        from rag_ablate.judges.openai import validate_judge

        validate_judge(s.judge)
    if not s.metrics.ks:
        raise ConfigError("metrics.ks must list at least one cut-off, e.g. [1, 5, 10]")
    c = s.chunk
    if not 0 <= c.overlap < c.size:
        raise ConfigError(f"chunk.overlap must be in [0, chunk.size={c.size}), got {c.overlap}")
    if s.rerank.method != "none" and not 1 <= s.rerank.top_k <= s.rerank.candidates:
        raise ConfigError(
            f"rerank.top_k={s.rerank.top_k} must be in [1, rerank.candidates={s.rerank.candidates}]"
        )
    if s.cost.model is not None and s.cost.model not in s.cost.prices:
        known = ", ".join(sorted(s.cost.prices)) or "none (add them under cost.prices)"
        raise ConfigError(f"cost.model '{s.cost.model}' has no price in cost.prices; known: {known}")
    judge_priced = s.judge.name != "none" and s.judge.model in s.cost.prices
    if s.cost.max_usd is not None and s.cost.model is None and not judge_priced:
        raise ConfigError(
            f"cost.max_usd={s.cost.max_usd:g} has nothing to count: no price applies (set cost.model to "
            "the system's model and its cost.prices entry, or give the judge's model a price)"
        )
    validate_compare(s.compare)
    from rag_ablate.dataset.weights import check_settings as check_weights

    check_weights(s.dataset)  # slice_weights finite and >= 0 (the tags are checked against the data)


def validate_compare(c: CompareConfig) -> None:
    """The comparison's settings, for a sweep (``compare.*``) and for ``rag-ablate compare`` alike.

    A section left at its defaults (its metrics aside) passes the trade-off's, the slices' and the
    gate's checks (tests/test_config.py); their modules, which a single run never uses otherwise
    (0.03 s of imports), are loaded to check a section that sets something."""
    check_ranges(c, "compare")
    changed = replace(c, metrics=[]) != CompareConfig()
    if changed:
        from rag_ablate.compare.tradeoff import check_settings

        check_settings(c)
        from rag_ablate.compare.slices import check_settings as check_slices

        check_slices(c)  # slice metrics known (no percentiles), min_slice_groups >= 1
    if c.baseline is not None and c.baseline_run is not None:
        raise ConfigError(
            f"compare.baseline ({c.baseline}, a variant of this sweep) and compare.baseline_run "
            f"({c.baseline_run}, an earlier run) name two baselines; give one"
        )
    ref = c.baseline_run
    if ref is not None and ("/" in ref or ref.startswith((".", "~"))) and not Path(ref).expanduser().is_dir():
        raise ConfigError(
            f"compare.baseline_run: no folder {ref} (a run folder, a sweep's job folder, a sweep folder, "
            "or an MLflow run id)"
        )
    if not set(c.splits) <= {"dev", "holdout"}:
        raise ConfigError(f"compare.splits must be among dev, holdout, got {c.splits}")
    if not changed:
        return
    from rag_ablate.compare.gate import parse_rules

    try:  # a gate rule that cannot be read stops the sweep before any job runs
        parse_rules(c.fail_on, c.metrics or None)  # empty: the registry's defaults, filled in later
    except ComparisonError as exc:
        raise ConfigError(f"compare.fail_on: {exc}") from None


def fill_metric_defaults(s: RunConfig) -> None:
    """An empty ``compare.metrics`` or ``metrics.summary`` (the default) becomes the metric
    registry's default list (``MetricSpec.default_compare``, ``default_summary``)."""
    from rag_ablate.metrics.registry import default_compare_metrics, default_summary_metrics

    if not s.compare.metrics:
        s.compare.metrics = default_compare_metrics()
    if not s.metrics.summary:
        s.metrics.summary = default_summary_metrics()


def fill_dataset_name(s: RunConfig) -> None:
    """No ``dataset.name`` (the default) becomes the dataset folder's name, as ``rag-ablate validate``
    names it (``sample`` for the embedded sample); a name given explicitly is kept."""
    if s.dataset.name is None:
        from rag_ablate.dataset.model import dataset_name

        s.dataset.name = dataset_name(s.dataset.path)


def to_settings(cfg: DictConfig) -> RunConfig:
    """A composed config as a :class:`RunConfig`, checked: the schema, the metric defaults and the
    dataset's name filled in (:func:`fill_metric_defaults`, :func:`fill_dataset_name`), then
    :func:`validate`."""
    settings = parse_config(cfg)
    fill_metric_defaults(settings)
    fill_dataset_name(settings)
    validate(settings)
    return settings
