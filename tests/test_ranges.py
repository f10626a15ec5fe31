"""Every setting is range-checked when the config is composed, from the bounds on the schema's fields.

The table is built from the schema itself: every numeric field (and every string field with a fixed
set of values) of every config dataclass gets an out-of-range value on the command line and must be
refused with one line naming the setting, the value and the range. A new numeric field without a
range fails :func:`test_every_numeric_setting_declares_a_range`.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
from rag_ablate.config.ranges import OneOf, Range, bounds
from rag_ablate.config.schema import RunConfig, register_configs
from rag_ablate.core.errors import ConfigError
from rag_ablate.settings import to_settings, validate
from tests.conftest import run_in_process

register_configs()


def _plain(hint: Any) -> Any:
    """``hint`` without Annotated and without ``| None``."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        kinds = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = kinds[0]
    return hint


@dataclasses.dataclass(frozen=True)
class Case:
    key: str  # the setting as the error names it
    bound: Range | OneOf | None
    kind: type  # int, float or str
    container: str  # "" | "list" | "dict"
    wrap: tuple[str, ...] = ()  # mapping keys above the field: cost.prices={m:{prompt:-1}}

    def override(self, value: str) -> str:
        if self.container == "list":
            return f"{self.key}=[1,{value}]"
        if self.container == "dict":
            return f"++{self.key}={{probe:{value}}}"
        if self.wrap:
            head, field = self.key.split(".probe.")
            return f"++{head}={{probe:{{{field}:{value}}}}}"
        return f"{self.key}={value}"

    def shown_key(self) -> str:
        if self.container == "list":
            return f"{self.key}[1]"
        if self.container == "dict":
            return f"{self.key}.probe"
        return self.key


def _cases(cls: type, prefix: str = "", wrap: tuple[str, ...] = ()) -> Iterator[Case]:
    limits = bounds(cls)
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        key = f"{prefix}{name}"
        kind = _plain(hint)
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        if dataclasses.is_dataclass(kind):
            yield from _cases(kind, f"{key}.", wrap)
        elif origin is dict and dataclasses.is_dataclass(args[1]):
            yield from _cases(args[1], f"{key}.probe.", (*wrap, name))
        elif origin in (list, dict) and args[-1] in (int, float):
            yield Case(key, limits.get(name), args[-1], origin.__name__, wrap)
        elif kind in (int, float) or (kind is str and name in limits):
            yield Case(key, limits.get(name), kind, "", wrap)


CASES = list(_cases(RunConfig))


def _out_of_range(case: Case) -> str:
    if isinstance(case.bound, OneOf):
        return "no_such_value"
    assert isinstance(case.bound, Range)
    value = case.bound.outside()
    return str(int(value)) if case.kind is int and value != float("inf") else str(float(value))


@pytest.fixture
def composer() -> Iterator[Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):

        def make(*overrides: str) -> DictConfig:
            return compose("config", overrides=normalize_overrides(list(overrides)))

        yield make


def _with(case: Case, value: Any) -> RunConfig:
    """The default settings with ``case``'s setting at ``value``, as composition would give it."""
    s = RunConfig()
    *path, name = case.key.replace(".probe.", ".").split(".")
    node: Any = s
    for part in path[:-1] if case.wrap else path:
        node = getattr(node, part)
    if case.wrap:  # a field of a mapping's entry (cost.prices.<model>.prompt)
        entry = typing.get_type_hints(type(node))[path[-1]]
        item_type = typing.get_args(_plain(entry))[1]
        setattr(node, path[-1], {"probe": item_type(**{name: value})})
    elif case.container == "list":
        setattr(node, name, [1, value])
    elif case.container == "dict":
        setattr(node, name, {"probe": value})
    else:
        setattr(node, name, value)
    return s


def test_every_numeric_setting_declares_a_range() -> None:
    assert len(CASES) >= 60, "the schema walk found too few settings"
    keys = {c.key for c in CASES}
    assert {"retrieval.bm25.k1", "router.ngram", "cost.prices.probe.prompt", "metrics.ks"} <= keys
    missing = [c.key for c in CASES if c.bound is None]
    assert not missing, f"numeric settings without a range on the schema (config/ranges.py): {missing}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.key)
def test_an_out_of_range_value_is_refused_in_one_line(case: Case) -> None:
    if case.bound is None:
        pytest.fail(f"{case.key} declares no range")
    text = _out_of_range(case)
    value = text if case.kind is str else case.kind(float(text))
    probes = [value, float("nan")] if case.kind is float else [value]  # NaN passes no comparison
    for probe in probes:
        with pytest.raises(ConfigError) as caught:
            validate(_with(case, probe))
        message = str(caught.value)
        expected = rf"{re.escape(case.shown_key())} must be {re.escape(str(case.bound))}, got \S+$"
        assert "\n" not in message and re.match(expected, message), (case.key, probe, message)


@pytest.mark.parametrize(
    "key",
    ["retrieval.bm25.k1", "dataset.slice_weights", "cost.prices.probe.prompt", "metrics.ks", "chunk.unit"],
)
def test_composition_refuses_an_out_of_range_value(key: str, composer: Any) -> None:
    case = next(c for c in CASES if c.key == key)
    with pytest.raises(ConfigError) as caught:
        to_settings(composer(case.override(_out_of_range(case))))
    assert str(caught.value).startswith(f"{case.shown_key()} must be {case.bound}, got ")


@pytest.mark.slow  # seven compositions
def test_the_bounds_users_hit_are_the_documented_ones(composer: Any) -> None:
    for override, line in [
        ("retrieval.bm25.k1=-1", "retrieval.bm25.k1 must be >= 0, got -1.0"),
        ("retrieval.bm25.b=5", "retrieval.bm25.b must be in [0, 1], got 5.0"),
        ("retrieval.hybrid.rrf_k=-60", "retrieval.hybrid.rrf_k must be > 0, got -60.0"),
        ("retrieval.hybrid.depth_dense=0", "retrieval.hybrid.depth_dense must be >= 1, got 0"),
        ("router.ngram=-2", "router.ngram must be >= 1, got -2"),
        (
            "retrieval.bm25.method=foo",
            "retrieval.bm25.method must be one of lucene | robertson | atire | bm25l | bm25+, got 'foo'",
        ),
    ]:
        with pytest.raises(ConfigError) as caught:
            to_settings(composer(override))
        assert str(caught.value) == line
    to_settings(composer("retrieval.bm25.k1=0", "retrieval.bm25.b=1", "router.ngram=1"))  # the edges pass


def test_an_unset_environment_variable_names_the_variable_and_the_setting(
    composer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAG_ABLATE_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError) as caught:
        to_settings(composer("generator.base_url=${oc.env:RAG_ABLATE_NO_SUCH_KEY}"))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "generator.base_url: the environment variable RAG_ABLATE_NO_SUCH_KEY is not set"
    )
    monkeypatch.setenv("RAG_ABLATE_NO_SUCH_KEY", "http://127.0.0.1:9/v1")
    s = to_settings(composer("generator.base_url=${oc.env:RAG_ABLATE_NO_SUCH_KEY}"))
    assert s.generator.base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["retrieval.bm25.method=foo"], "retrieval.bm25.method must be one of lucene"),
        (["-m", "router.ngram=0,3"], "router.ngram must be >= 1, got 0"),
        (
            ["generator.base_url=${oc.env:RAG_ABLATE_NO_SUCH_KEY}"],
            "environment variable RAG_ABLATE_NO_SUCH_KEY",
        ),
        (
            ["-m", "router.ngram=1,3", "generator.base_url=${oc.env:RAG_ABLATE_NO_SUCH_KEY}"],
            "environment variable RAG_ABLATE_NO_SUCH_KEY",
        ),
        (["retrieval.bm25.k1=-1"], "retrieval.bm25.k1 must be >= 0, got -1.0"),
        (["-m", "retrieval.bm25.k1=-1,1"], "retrieval.bm25.k1 must be >= 0, got -1.0"),
        (["system.name=nope"], "nope"),
        (["dataset.path=no/such/folder"], "dataset folder not found"),
        (["-m", "dataset.path=no/such/folder", "chunk=128,256"], "dataset folder not found"),
    ],
)
def test_a_refused_run_or_sweep_exits_2_with_one_line_and_creates_nothing(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not even the outputs folder (Hydra created it, and ``runs/``, for a single run's folder;
    a missing dataset folder was found only after the run's folder and MLflow run were made)."""
    monkeypatch.delenv("RAG_ABLATE_NO_SUCH_KEY", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_in_process([*args, "progress=false"], work)  # outputs/ under the current folder
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and line in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    made = sorted(p.relative_to(work).as_posix() for p in work.rglob("*"))
    assert made == [], made  # no outputs/, no run folder, no sweep folder, no MLflow store
    out = tmp_path / "elsewhere" / "out"  # paths.output_root: none of its missing folders either
    proc = run_in_process([*args, "progress=false", f"paths.output_root={out}"], work)
    assert proc.returncode == 2 and not (tmp_path / "elsewhere").exists(), proc.stderr
