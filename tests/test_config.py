"""Every config composes into the typed schema; numeric groups work as typed, any chunk size."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_module
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import DictConfig

from rag_ablate.config.overrides import CONF_DIR, normalize_overrides, numeric_groups, preset_options
from rag_ablate.config.schema import RunConfig, register_configs
from rag_ablate.core.errors import ConfigError
from rag_ablate.settings import to_settings

register_configs()

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]
NEEDS_VALUE = {
    ("rerank", "cross_encoder"): ["rerank.model_path=/tmp/x"],
    ("rerank", "http"): ["rerank.url=http://127.0.0.1:1/rerank"],
    ("dataset", "custom"): ["dataset.path=/tmp/x"],
    ("tracking", "server"): ["tracking.uri=http://127.0.0.1:1"],
    ("system", "http"): ["system.base_url=http://127.0.0.1:1"],
    ("system", "replay"): ["system.path=/tmp"],  # an existing folder
}


def _compose(overrides: list[str], hydra: bool = False) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=normalize_overrides(overrides), return_hydra_config=hydra)


def test_default_config_composes() -> None:
    s = to_settings(_compose([]))
    assert isinstance(s, RunConfig)
    assert s.chunk.size == 512 and s.retrieval.method == "bm25" and s.dataset.path is None


def test_the_schema_is_built_once_and_hydra_composes_from_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering the schema and parsing a config into it build it from the dataclasses once; the
    node Hydra's ConfigStore holds is an equal copy (its types too), never the one parsed into."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from rag_ablate.config import schema

    built: list[object] = []
    structured = OmegaConf.structured

    def counted(obj: object, *args: object, **kwargs: object) -> object:
        built.append(obj)
        return structured(obj, *args, **kwargs)

    monkeypatch.setattr(OmegaConf, "structured", counted)
    schema._schema.cache_clear()
    try:
        register_configs()
        to_settings(_compose(["chunk='256'"]))
        assert sum(obj is RunConfig for obj in built) == 1  # (a DictConfig equals its dataclass)
        stored = ConfigStore.instance().load("rag_ablate_schema.yaml").node
        assert stored == schema._schema() and OmegaConf.get_type(stored) is RunConfig
        assert OmegaConf.get_type(stored.chunk) is OmegaConf.get_type(schema._schema().chunk)
        assert ConfigStore.instance().repo["rag_ablate_schema.yaml"].node is not schema._schema()
    finally:
        schema._schema.cache_clear()
        register_configs()


@pytest.mark.parametrize("mode", ["RUN", "MULTIRUN"])
def test_the_mode_composition_is_taken_over_by_the_run_as_hydra_composes_it(mode: str) -> None:
    """``python -m rag_ablate`` composes once: Hydra's composition for ``get_mode`` becomes the run's
    (or sweep's) own, the very object, equal to what Hydra composes for it without the reuse."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from rag_ablate.cli.command import _mode_composition_reused

    overrides = normalize_overrides(["chunk=256", "retrieval.top_k=7", "+system.body.q='{query}'"])
    if mode == "MULTIRUN":
        overrides[0] = "chunk='256','512'"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        run_mode = RunMode[mode]
        expected = hydra.compose_config("config", [*overrides, f"hydra.mode={mode}"], run_mode=run_mode)
        composed: list[object] = []
        compose = ConfigLoaderImpl._load_configuration_impl

        def counted(self: ConfigLoaderImpl, *args: object, **kwargs: object) -> object:
            composed.append(result := compose(self, *args, **kwargs))  # type: ignore[arg-type]
            return result

        ConfigLoaderImpl._load_configuration_impl = counted  # type: ignore[method-assign,assignment]
        try:
            with _mode_composition_reused():
                assert hydra.get_mode("config", list(overrides)) is None  # neither flag given
                cfg = hydra.compose_config("config", [*overrides, f"hydra.mode={mode}"], run_mode=run_mode)
        finally:
            ConfigLoaderImpl._load_configuration_impl = compose  # type: ignore[method-assign]
    assert composed == [cfg] and composed[0] is cfg  # one composition, taken over as it is
    assert cfg.hydra.mode == run_mode
    assert OmegaConf.to_yaml(cfg) == OmegaConf.to_yaml(expected)


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes(group: str, option: str) -> None:
    cfg = _compose([f"{group}={option}", *NEEDS_VALUE.get((group, option), [])])
    s = to_settings(cfg)
    assert isinstance(s, RunConfig)
    if group == "chunk":
        assert s.chunk.size == int(option)


def test_numeric_group_detected_and_quoted() -> None:
    assert "chunk" in numeric_groups()
    assert normalize_overrides(["chunk=256,512"]) == ["chunk='256','512'"]
    assert normalize_overrides(["chunk=256"]) == ["chunk='256'"]
    # plain values and other groups are left alone
    assert normalize_overrides(["chunk.overlap=10", "retrieval.top_k=5", "-m"]) == [
        "chunk.overlap=10",
        "retrieval.top_k=5",
        "-m",
    ]


def test_chunk_group_and_field_override_together() -> None:
    s = to_settings(_compose(["chunk=256", "chunk.overlap=10"]))
    assert (s.chunk.size, s.chunk.overlap) == (256, 10)


def test_unknown_key_fails_at_composition() -> None:
    with pytest.raises(Exception, match="chunk_sise"):
        _compose(["chunk.chunk_sise=3"])
    # even when forced in with '+', the schema refuses it, naming the key
    with pytest.raises(ConfigError, match="chunk_sise"):
        to_settings(_compose(["+chunk.chunk_sise=3"]))


def test_wrong_type_fails() -> None:
    with pytest.raises(Exception, match="size"):
        _compose(["chunk.size=big"])


@pytest.mark.parametrize(
    "override,match",
    [
        ("chunk.overlap=600", "chunk.overlap"),
        ("rerank=biencoder rerank.top_k=80", "rerank.top_k"),
        ("chunk.unit=words", "chunk.unit"),
        ("dataset.holdout_share=1.5", "holdout_share"),
    ],
)
def test_range_checks(override: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        to_settings(_compose(override.split()))


@pytest.mark.slow
def test_any_chunk_size_composes_with_the_presets_overlap_rule() -> None:
    # the presets: overlap is one eighth of the size
    for option in preset_options("chunk"):
        s = to_settings(_compose([f"chunk={option}"]))
        assert s.chunk.overlap * 8 == s.chunk.size == int(option)
    # a size without a file gets the same rule, rounded down
    s = to_settings(_compose(["chunk=300"]))
    assert (s.chunk.size, s.chunk.overlap) == (300, 37)
    s = to_settings(_compose(["chunk=7"]))
    assert (s.chunk.size, s.chunk.overlap) == (7, 0)
    # the group choice is the size, as for a preset
    assert _compose(["chunk=300"], hydra=True).hydra.runtime.choices.chunk == "300"
    # an explicit overlap still wins, and a preset written with a leading zero is the preset
    s = to_settings(_compose(["chunk=300", "chunk.overlap=50"]))
    assert (s.chunk.size, s.chunk.overlap) == (300, 50)
    assert normalize_overrides(["chunk=0256"]) == ["chunk='256'"]
    assert normalize_overrides(["chunk=300,'600'"]) == ["chunk='300','600'"]


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=1, max_value=1_000_000))
def test_every_positive_size_is_a_valid_chunking(size: int) -> None:
    s = to_settings(_compose([f"chunk={size}"]))
    assert s.chunk.size == size and 0 <= s.chunk.overlap < size and s.chunk.overlap == size // 8


@pytest.mark.parametrize("value", ["0", "-5", "12.5", "1e3", "big", "300,0"])
def test_bad_chunk_size_is_one_clear_line(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        normalize_overrides([f"chunk={value}"])
    msg = str(info.value)
    assert "\n" not in msg and "whole number >= 1" in msg
    assert "presets: 128, 256, 512, 1024" in msg
    bad = value.split(",")[-1]
    assert msg.startswith(f"chunk={bad}:")


def test_folder_names_get_a_random_suffix() -> None:
    a = _compose([], hydra=True).hydra
    b = _compose([], hydra=True).hydra
    assert str(a.sweep.dir) != str(b.sweep.dir) and str(a.run.dir) != str(b.run.dir)
    # fixed once per config: every read (and every job of a sweep) sees the same name
    assert str(a.sweep.dir) == str(a.sweep.dir)
    stamp, suffix = Path(str(a.sweep.dir)).name.rsplit("_", 1)
    assert len(suffix) == 6 and int(suffix, 16) >= 0 and len(stamp) == len("2026-11-30_10-00-00")


def test_conf_dir_is_the_checkout_conf() -> None:
    assert (Path(CONF_DIR) / "config.yaml").is_file()


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("retreival=bm25", "unknown config key 'retreival' in 'retreival=bm25': did you mean 'retrieval'?"),
        ("retrieval.top_kk=3", "did you mean 'retrieval.top_k'? valid under 'retrieval': "),
        ("retrieval.dense.encodr=minilm", "did you mean 'retrieval.dense.encoder'?"),
        ("chunk.sise=300", "valid under 'chunk': "),
        ("retreival@pkg=bm25", "unknown config key 'retreival' in 'retreival@pkg=bm25'"),  # a packaged group
    ],
)
def test_a_misspelt_key_is_refused_before_hydra_naming_the_valid_ones(arg: str, message: str) -> None:
    from rag_ablate.config.overrides import check_override_keys

    with pytest.raises(ConfigError) as info:
        check_override_keys([arg])
    assert message in str(info.value)


@pytest.mark.parametrize(
    "arg",
    [
        "retrieval=dense",
        "experiment=chunk_study",  # a conf/ group outside the schema
        "+cost.prices={m: {prompt: 1}}",
        "system.headers.Authorization=x",  # under a mapping: Hydra decides
        "hydra/launcher=basic",
        "hydra.job.chdir=false",
        "seed=3",
        "-m",
    ],
)
def test_valid_keys_pass_the_check(arg: str) -> None:
    from rag_ablate.config.overrides import check_override_keys

    check_override_keys([arg])


@pytest.mark.slow
def test_the_command_line_says_one_line_and_exits_2_for_a_misspelt_key(tmp_path: Path) -> None:
    from tests.conftest import run_module

    out = run_module("rag_ablate", ["-m", "chunk=256,512", "retrieval.top_kk=3"], tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(
        "rag_ablate: error: unknown config key 'retrieval.top_kk' in 'retrieval.top_kk=3': did you mean "
        "'retrieval.top_k'? valid under 'retrieval': "
    )
    assert {"bm25", "dense", "method", "top_k"} <= set(line.rsplit(": ", 1)[1].split(", "))
    assert not (tmp_path / "outputs").exists()


# ---------------------------------------------------------------- an override's key, runtime keys

_ID = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,6}", fullmatch=True)
_SPECIAL = st.from_regex(r"[A-Za-z_$][A-Za-z0-9_\-$]{0,6}", fullmatch=True)
_PART = st.one_of(_SPECIAL, st.integers(0, 99).map(str))
_DOTTED = st.builds(lambda a, rest: ".".join([a, *rest]), _PART, st.lists(_PART, min_size=1, max_size=3))
_GROUP_PATH = st.builds(lambda a, rest: "/".join([a, *rest]), _ID, st.lists(_ID, min_size=1, max_size=2))
_KEY = st.one_of(_SPECIAL, _DOTTED, _GROUP_PATH)
_PACKAGE = st.one_of(st.just(""), _SPECIAL, _DOTTED)
_QUOTED = st.text(st.characters(blacklist_characters="'\\", blacklist_categories=("Cs",)), max_size=12)
_VALUE = st.one_of(
    st.sampled_from(
        [
            "",
            "256",
            " 3",
            "-1.5e3",
            "null",
            "true",
            "'256','512'",
            "a,b,c",
            "{numeric: -1}",
            "{a: {b: 1}, c: [1, 2]}",
            "[1,2]",
            "range(1,3)",
            "choice(bm25, dense)",
            "${oc.env:X}",
            "http://a",
            '"x=y"',
            "'http://a?b=1&c=2'",
        ]
    ),
    _QUOTED.map(lambda t: f"'{t}'"),
)


@st.composite
def _overrides(draw: st.DrawFn) -> str:
    prefix = draw(st.sampled_from(["", "+", "++", "~"]))
    key = draw(_KEY)
    if draw(st.booleans()):
        key += "@" + draw(_PACKAGE)
    if prefix == "~" and draw(st.booleans()):
        return f"~{key}"  # a deletion needs no value
    return f"{prefix}{key}={draw(_VALUE)}"


@settings(max_examples=400, deadline=None)
@given(_overrides())
def test_override_key_agrees_with_hydras_parser(override: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from rag_ablate.config.overrides import override_key

    parsed = OverridesParser.create().parse_override(override)
    assert override_key(override) == parsed.key_or_group
    # what follows the key is its package (Hydra's key element is the two together)
    element = parsed.get_key_element().lstrip("+~")
    assert element == override_key(override) + ("" if parsed.package is None else f"@{parsed.package}")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("chunk=256", "chunk"),
        ("+chunk.chunk_sise=3", "chunk.chunk_sise"),
        ("++dataset.slice_weights={numeric: -1}", "dataset.slice_weights"),
        ("~rerank", "rerank"),
        ("~rerank=bm25", "rerank"),
        ("hydra/launcher=joblib", "hydra/launcher"),
        ("system.base_url='http://a?b=1'", "system.base_url"),
        ("+db@backup=mysql", "db"),
        ("-m", "-m"),
    ],
)
def test_override_key_worked_examples(override: str, key: str) -> None:
    from rag_ablate.config.overrides import override_key

    assert override_key(override) == key


@pytest.mark.parametrize(
    ("key", "runtime"),
    [
        ("progress", True),
        ("progress_bar", False),
        ("compare", True),
        ("compare.B", True),
        ("compare_x", False),
        ("compareB", False),
        ("system.headers", True),
        ("system.headers.Authorization", True),
        ("system.header", False),
        ("system.base_url", False),
        ("hydra.run.dir", True),
        ("hydra/launcher", True),  # a Hydra config group: a runtime setting like hydra.*
        ("hydrangea", False),
        ("dataset.slice_weights.numeric", True),
        ("dataset.path", False),
        ("dataset", False),
        ("chunk", False),
    ],
)
def test_is_runtime_key(key: str, runtime: bool) -> None:
    from rag_ablate.config.keys import is_runtime_key

    assert is_runtime_key(key) is runtime


_NAMES = st.sampled_from(["compare", "compare_x", "compareB", "B", "hydra", "launcher", "a"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_NAMES, min_size=1, max_size=4),
    st.sampled_from([".", "/"]),
    st.lists(st.lists(_NAMES, min_size=1, max_size=3), max_size=3),
)
def test_is_under_is_a_prefix_of_whole_path_parts(
    parts: list[str], sep: str, prefixes: list[list[str]]
) -> None:
    from rag_ablate.config.keys import is_under

    expected = any(parts[: len(p)] == p for p in prefixes)
    assert is_under(sep.join(parts), [".".join(p) for p in prefixes]) is expected


@pytest.mark.parametrize(
    ("method", "fusion", "why"),
    [
        # two rules hold for rrf_k: the table's first (the whole hybrid section) names the reason
        ("bm25", "weighted", "retrieval.hybrid.rrf_k is not used when retrieval.method=bm25"),
        ("hybrid", "weighted", "retrieval.hybrid.rrf_k is not used when retrieval.hybrid.fusion=weighted"),
        ("hybrid", "rrf", None),
    ],
)
def test_unused_settings_name_the_first_rule_that_holds(method: str, fusion: str, why: str | None) -> None:
    """Each key a configuration never reads, once, with the first rule of USED_ONLY_WHEN that holds;
    a rule's deciding setting is never unused by its own rule."""
    from dataclasses import asdict

    from rag_ablate.config.keys import USED_ONLY_WHEN, is_under, unused_settings
    from rag_ablate.sweep.plan import flatten

    s = RunConfig()
    s.retrieval.method, s.retrieval.hybrid.fusion = method, fusion
    flat = flatten(asdict(s))
    unused = unused_settings(flat)
    got = unused.get("retrieval.hybrid.rrf_k")
    assert got is None if why is None else why in str(got)
    # the definition, rule by rule: a key is unused iff some rule that holds covers it
    for key in flat:
        holding = [
            r
            for r in USED_ONLY_WHEN
            if r.setting in flat and r.unused(flat[r.setting]) and key != r.setting and is_under(key, r.keys)
        ]
        assert unused.get(key) == (holding[0].why(key, flat[holding[0].setting]) if holding else None), key


@pytest.mark.parametrize(
    "key",
    ["progress", "compare.B", "compare_x", "cache.dir", "system.headers.X-Key", "system.base_url", "seed"],
)
def test_every_place_that_leaves_out_runtime_settings_agrees(key: str) -> None:
    """A run's name, the baseline's name and the confounding guard leave out exactly the
    runtime settings (resume=: tests/test_resume.py)."""
    from rag_ablate.compare.guard import changed_factors
    from rag_ablate.config.keys import is_runtime_key
    from rag_ablate.run.runner import variant_label
    from rag_ablate.tracking.ui import baseline_run_name

    runtime = is_runtime_key(key)
    assert runtime is (key in ("progress", "compare.B", "cache.dir", "system.headers.X-Key"))
    assert (variant_label([f"{key}=1", "chunk=256"]) == "chunk=256") is runtime
    assert (baseline_run_name([{"key": key, "default": 1}]) == "baseline") is runtime
    assert changed_factors({key: 1}, {key: 2}) == ([] if runtime else [key])


def test_a_pinned_baseline_folder_must_exist(tmp_path: Path) -> None:
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.settings import validate_compare

    missing = tmp_path / "runs" / "gone"
    with pytest.raises(ConfigError, match=f"^compare.baseline_run: no folder {missing} "):
        validate_compare(CompareConfig(baseline_run=str(missing)))
    validate_compare(CompareConfig(baseline_run=str(tmp_path)))  # a folder
    validate_compare(CompareConfig(baseline_run="0123456789abcdef0123456789abcdef"))  # an MLflow run id
    with pytest.raises(ConfigError, match="name two baselines"):
        validate_compare(CompareConfig(baseline="chunk=256", baseline_run=str(tmp_path)))


def test_a_compare_section_at_its_defaults_is_checked_without_the_comparisons_modules() -> None:
    """The trade-off's, slices' and gate's checks pass a compare section left at its defaults, whatever
    its metrics: a run's check skips them (a single run never imports the comparison's modules), and
    a section that sets something is checked by them."""
    import subprocess
    import sys

    from conftest import REPO

    from rag_ablate.compare.gate import parse_rules
    from rag_ablate.compare.slices import check_settings as check_slices
    from rag_ablate.compare.tradeoff import check_settings as check_tradeoff
    from rag_ablate.config.schema import CompareConfig
    from rag_ablate.core.errors import RagAblateError
    from rag_ablate.metrics.registry import default_compare_metrics
    from rag_ablate.settings import validate_compare

    for metrics in ([], default_compare_metrics(), ["recall@5", "latency_ms"]):
        c = CompareConfig(metrics=metrics)
        check_tradeoff(c)
        check_slices(c)
        parse_rules(c.fail_on, c.metrics or None)
    for bad, match in [
        (CompareConfig(quality_metric="nope"), "nope"),
        (CompareConfig(cost_metric="latency_p101_ms"), "is not a cost"),
        (CompareConfig(slice_metrics=["latency_p95_ms"]), "percentile of the split"),
        (CompareConfig(min_slice_groups=0), "min_slice_groups"),
        (CompareConfig(fail_on=["holdout/recall_at_5:+0.02"]), "compare.fail_on"),
    ]:
        with pytest.raises(RagAblateError, match=match):
            validate_compare(bad)
    code = (
        "import sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from rag_ablate.config.overrides import CONF_DIR\n"
        "from rag_ablate.config.schema import register_configs\n"
        "from rag_ablate.settings import to_settings\n"
        "register_configs()\n"
        "with initialize_config_dir(config_dir=str(CONF_DIR), version_base='1.3'):\n"
        "    to_settings(compose('config', overrides=['compare.B=500']))\n"
        "    assert 'rag_ablate.compare.tradeoff' in sys.modules\n"
        "    del sys.modules['rag_ablate.compare.tradeoff']\n"
        "    to_settings(compose('config'))\n"
        "print(sorted(m for m in sys.modules if m.startswith('rag_ablate.compare.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "rag_ablate.compare.tradeoff" not in out.stdout.split("\n")[-2]


def test_an_unquoted_non_ascii_value_is_refused_with_how_to_quote_it() -> None:
    """Hydra's grammar takes no unquoted non-ASCII value; the line says how to write it (issue 23's
    fault injection: ``dataset.name=客服数据`` said only "not a valid override")."""
    from rag_ablate.cli.command import check_override_syntax

    with pytest.raises(ConfigError) as refused:
        check_override_syntax(["dataset.name=客服数据"])
    assert str(refused.value) == (
        "cannot parse the override 'dataset.name=客服数据': not a valid override; "
        "quote a value with non-ASCII characters: dataset.name='客服数据'"
    )
    check_override_syntax(["dataset.name='客服数据'"])  # quoted, as the line says: parsed


CANNOT_CONVERT = "Value '{}' of type 'str' could not be converted to {}"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["retrieval=bm26"], "In 'config': Could not find 'retrieval/bm26'; valid: bm25, dense, hybrid"),
        (
            ["retrieval.top_k=abc"],
            "Error merging override retrieval.top_k=abc: " + CANNOT_CONVERT.format("abc", "Integer"),
        ),
        (  # -m after an override, an empty list
            ["progress=false", "-m", "router="],
            "In 'config': Could not find 'router/'; valid: centroid, nearest, none",
        ),
        (  # a key pasted into the wrong setting is not echoed
            ["system.timeout_s=sk-canary-4f1c9e0b2d7a6c35"],
            "Error merging override system.timeout_s=***: " + CANNOT_CONVERT.format("***", "Float"),
        ),
    ],
)
def test_a_config_hydra_cannot_compose_is_refused_in_one_line(
    tmp_path: Path, args: list[str], line: str
) -> None:
    """Hydra's own report spans several lines (issue 23's fault injection); rag_ablate's is one, exit 2."""
    out = run_module("rag_ablate", [*args, "progress=false"], tmp_path)
    assert (out.returncode, out.stderr) == (2, f"rag_ablate: error: {line}\n")
    assert "sk-canary" not in out.stdout
