"""One factor at a time: the job plan, study files, grid mode, dry run, tags and the guard;
every job validated before any runs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
from rag_ablate.config.schema import RunConfig, register_configs
from rag_ablate.core.errors import ConfigError
from rag_ablate.sweep.plan import Job, Plan, build_plan, check_plan, refuse_repeats
from tests.conftest import run_module

register_configs()


def plan_for(args: list[str]) -> Plan:
    """What the sweeper plans for `python -m rag_ablate -m <args>`."""
    args = normalize_overrides(args)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        parser = OverridesParser.create()
        common = [o.input_line for o in parser.parse_overrides(args) if not o.is_sweep_override()]
        cfg = compose("config", overrides=common, return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        return build_plan(cfg, args, OverridesParser.create(config_loader=loader))


def checked(args: list[str]) -> tuple[Plan, list[RunConfig]]:
    """Plan and validate as the sweeper does: every job composed by Hydra's config loader."""
    args = normalize_overrides(args)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        parser = OverridesParser.create()
        common = [o.input_line for o in parser.parse_overrides(args) if not o.is_sweep_override()]
        cfg = compose("config", overrides=common, return_hydra_config=True)
        loader = GlobalHydra.instance().config_loader()
        plan = build_plan(cfg, args, OverridesParser.create(config_loader=loader))
        jobs = check_plan(
            plan, lambda ovs: loader.load_sweep_config(cfg, ovs), lambda g: loader.get_group_options(g)
        )
        return plan, jobs


def labels(plan: Plan) -> list[str]:
    return [j.label for j in plan.jobs]


def test_one_group() -> None:
    p = plan_for(["router=centroid,nearest"])
    assert labels(p) == ["baseline", "router=nearest"]
    assert p.jobs[1].overrides == ["router=nearest"] and p.jobs[0].overrides == []
    assert (p.jobs[1].factor, p.jobs[1].level, p.jobs[1].role) == ("router", "nearest", "variant")


def test_two_groups_are_not_crossed() -> None:
    p = plan_for(["chunk=256,1024", "router=centroid,nearest"])
    assert labels(p) == ["baseline", "chunk=256", "chunk=1024", "router=nearest"]
    assert all(len(j.overrides) <= 1 for j in p.jobs)
    # a single value is not a factor: it applies to every job, the baseline included
    q = plan_for(["chunk=256,1024", "router=nearest"])
    assert labels(q) == ["baseline", "chunk=256", "chunk=1024"]
    assert all("router=nearest" in j.overrides for j in q.jobs)


def test_plain_value() -> None:
    p = plan_for(["retrieval.top_k=10,20,50"])
    assert labels(p) == ["baseline", "retrieval.top_k=20", "retrieval.top_k=50"]
    assert p.jobs[2].overrides == ["retrieval.top_k=50"]


def test_numeric_group_as_typed() -> None:
    p = plan_for(["chunk=256,512"])
    assert labels(p) == ["baseline", "chunk=256"]
    assert p.jobs[1].overrides == ["chunk='256'"]  # quoted for Hydra


def test_level_equal_to_default_is_the_baseline() -> None:
    p = plan_for(["chunk=512"])
    assert labels(p) == ["baseline"]
    p = plan_for(["retrieval.hybrid.rrf_k=60,10"])  # 60 is the baseline's 60.0
    assert labels(p) == ["baseline", "retrieval.hybrid.rrf_k=10"]
    p = plan_for(["retrieval.top_k=10,10,20"])
    assert labels(p) == ["baseline", "retrieval.top_k=20"]


def test_common_overrides_reach_every_job_and_the_baseline() -> None:
    p = plan_for(["chunk=256,512", "retrieval.top_k=20", "progress=false"])
    assert labels(p) == ["baseline", "chunk=256"]
    assert p.jobs[0].overrides == ["retrieval.top_k=20", "progress=false"]
    # the baseline's value is read after the common overrides
    q = plan_for(["retrieval.top_k=10,20", "chunk=256"])
    assert labels(q) == ["baseline", "retrieval.top_k=20"] and q.jobs[0].overrides == ["chunk='256'"]


def test_study_file_plus_command_line_factor() -> None:
    p = plan_for(["experiment=chunk_study", "retrieval.top_k=20,30"])
    assert labels(p) == [
        "baseline",
        "chunk=128",
        "chunk=256",
        "chunk=1024",
        "chunk.overlap=0",
        "chunk.overlap=128",
        "retrieval.top_k=20",
        "retrieval.top_k=30",
    ]
    assert all("experiment=chunk_study" in j.overrides for j in p.jobs)
    # a command-line list replaces the study's levels for that key
    q = plan_for(["experiment=chunk_study", "chunk=256,512"])
    assert [j.label for j in q.jobs if j.factor == "chunk"] == ["chunk=256"]


def test_grid_mode_is_labelled() -> None:
    p = plan_for(["chunk=256,512", "router=centroid,nearest", "ablation.mode=grid"])
    assert p.mode == "grid"
    assert labels(p) == ["baseline", "chunk=256", "chunk=256,router=nearest", "router=nearest"]
    both = p.jobs[2]
    assert both.role == "grid" and both.factor == "chunk,router"
    assert sorted(both.overrides) == sorted(["ablation.mode=grid", "chunk='256'", "router=nearest"])


@pytest.mark.slow
def test_any_chunk_size_is_a_level() -> None:
    plan, jobs = checked(["chunk=300,600"])
    assert labels(plan) == ["baseline", "chunk=300", "chunk=600"]
    assert plan.jobs[1].overrides == ["chunk='300'"]
    assert [(s.chunk.size, s.chunk.overlap) for s in jobs] == [(512, 64), (300, 37), (600, 75)]
    # range() gives sizes too
    plan, jobs = checked(["chunk=range(256,1025,256)"])
    assert labels(plan) == ["baseline", "chunk=256", "chunk=768", "chunk=1024"]
    assert [s.chunk.size for s in jobs] == [512, 256, 768, 1024]
    # a study may list sizes without a file too
    plan, jobs = checked(["experiment=chunk_study", "chunk=100,512"])
    assert [j.label for j in plan.jobs if j.factor == "chunk"] == ["chunk=100"]
    assert jobs[1].chunk.size == 100


def test_unknown_factor_key_suggests_the_nearest_setting() -> None:
    with pytest.raises(ConfigError) as info:
        plan_for(["retrieval.topk=10,20"])
    msg = str(info.value)
    assert msg.startswith("unknown factor 'retrieval.topk' in retrieval.topk=10,20: not a config group")
    assert "did you mean retrieval.top_k" in msg and "\n" not in msg
    # a misspelt group gets the group
    with pytest.raises(ConfigError, match=r"unknown factor 'retriever'.*did you mean retrieval"):
        plan_for(["retriever=bm25,dense"])
    # nothing close: the groups are listed
    groups = "config groups: chunk, cost, dataset, experiment, generator, judge, re"
    with pytest.raises(ConfigError, match=groups):
        plan_for(["zzzzzz=1,2"])


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["retrieval=bm25,nope"],
            "unknown level 'nope' of factor retrieval (retrieval=nope); valid: bm25, dense, hybrid",
        ),
        (
            ["chunk.overlap=0,600"],
            "invalid level chunk.overlap=600 of factor chunk.overlap: "
            "chunk.overlap must be in [0, chunk.size=512), got 600",
        ),
        (
            ["retrieval.top_k=5,abc"],
            "invalid level retrieval.top_k=abc of factor retrieval.top_k: Error merging override "
            "retrieval.top_k=abc: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (
            ["system.name=local,nope"],
            "invalid level system.name=nope of factor system.name: unknown system 'nope'; valid: http, local",
        ),
        (
            ["chunk=256,512", "chunk.overlap=300"],
            "invalid level chunk=256 of factor chunk: chunk.overlap must be in [0, chunk.size=256), got 300",
        ),
        (
            ["chunk=256,512", "rerank.top_k=0", "rerank=biencoder"],
            "invalid the baseline (the config every job starts from): rerank.top_k must be >= 1, got 0",
        ),
        (
            ["chunk=256,512", "router=centroid,nearest", "ablation.mode=grid", "chunk.overlap=300"],
            "invalid grid job chunk=256: chunk.overlap must be in [0, chunk.size=256), got 300",
        ),
    ],
)
def test_every_job_is_validated_before_any_runs(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        checked(args)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def _settings(**values: Any) -> RunConfig:
    """RunConfig() with dotted settings (``retrieval__top_k=5``) changed."""
    s = RunConfig()
    for key, value in values.items():
        *path, name = key.split("__")
        node: Any = s
        for part in path:
            node = getattr(node, part)
        setattr(node, name, value)
    return s


@pytest.mark.parametrize(
    "common,level,why",
    [
        (
            {"rerank__method": "biencoder"},
            {"retrieval__top_k": 20},
            "retrieval.top_k is not used when "
            "rerank.method=biencoder (with a reranker, rerank.candidates sets how many chunks are retrieved",
        ),
        (
            {},
            {"retrieval__hybrid__weight": 0.3},
            "retrieval.hybrid.weight is not used when retrieval.method=bm25",
        ),
        (
            {"retrieval__method": "hybrid"},
            {"retrieval__hybrid__weight": 0.3},
            "retrieval.hybrid.weight is not used when retrieval.hybrid.fusion=rrf",
        ),
        (
            {},
            {"retrieval__dense__encoder": "minilm"},
            "retrieval.dense.encoder is not used when retrieval.method=bm25",
        ),
        (
            {"retrieval__method": "dense"},
            {"retrieval__bm25__k1": 2.0},
            "retrieval.bm25.k1 is not used when retrieval.method=dense",
        ),
        ({}, {"rerank__candidates": 20}, "rerank.candidates is not used when rerank.method=none"),
        (
            {"rerank__method": "biencoder"},
            {"rerank__model_path": "/m"},
            "rerank.model_path is not used when rerank.method=biencoder",
        ),
        ({}, {"generator__max_chunks": 5}, "generator.max_chunks is not used when generator.name=none"),
        (
            {"generator__name": "extractive"},
            {"generator__temperature": 1.0},
            "generator.temperature is not used when generator.name=extractive",
        ),
        ({}, {"judge__repeats": 3}, "judge.repeats is not used when judge.name=none"),
        (
            {"router__method": "none"},
            {"router__ngram": 3},
            "router.ngram is not used when router.method=none",
        ),
        ({}, {"system__timeout_s": 5.0}, "system.timeout_s is not used when system.name=local"),
    ],
    ids=lambda a: ",".join(a) if isinstance(a, dict) else None,
)
def test_a_level_that_changes_only_unused_settings_is_refused(
    common: dict[str, Any], level: dict[str, Any], why: str
) -> None:
    (key, value), *_ = level.items()
    label = f"{key.replace('__', '.')}={value}"
    plan = Plan("ofat", False, [], [])
    plan.jobs = [
        Job(0, "baseline", "baseline", None, None, []),
        Job(1, label, "variant", label, str(value), []),
    ]
    with pytest.raises(ConfigError) as info:
        refuse_repeats(plan, [_settings(**common), _settings(**common, **level)])
    line = str(info.value)
    assert line.startswith(
        f"level {label} of factor {label} would run the same settings as the baseline (#0): {why}"
    )
    assert line.endswith("; drop the level, or change a setting this configuration uses") and "\n" not in line


def test_the_plan_refuses_unused_levels_as_composed() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^level retrieval.top_k=20 of factor retrieval.top_k would run the "
        r"same settings as the baseline \(#0\): retrieval.top_k is not used when rerank.method=bi",
    ):
        checked(["retrieval.top_k=20,100", "rerank=biencoder"])


def test_a_grid_job_that_repeats_another_is_refused() -> None:
    args = ["retrieval=bm25,hybrid", "retrieval.hybrid.rrf_k=60,10", "ablation.mode=grid"]
    with pytest.raises(
        ConfigError,
        match=r"^grid job retrieval.hybrid.rrf_k=10 would run the same settings as "
        r"the baseline \(#0\): retrieval.hybrid.rrf_k is not used when retrieval.method=bm25",
    ):
        checked(args)


def test_levels_of_settings_the_configuration_uses_run() -> None:
    plan = Plan("ofat", False, [], [])
    plan.jobs = [Job(i, f"job{i}", "variant", "x", "y", []) for i in range(4)]
    refuse_repeats(
        plan,
        [
            _settings(),
            _settings(retrieval__top_k=20),  # no reranker: top_k is the list's length
            _settings(rerank__method="biencoder", rerank__candidates=20),
            _settings(rerank__method="biencoder"),  # candidates unused in the baseline only
        ],
    )


def test_every_used_only_when_rule_names_real_settings() -> None:
    from dataclasses import asdict

    from rag_ablate.config.keys import USED_ONLY_WHEN, is_under
    from rag_ablate.run.runner import flatten

    names = set(flatten(asdict(RunConfig()))) | {"system.headers", "system.body"}  # empty mappings
    for rule in USED_ONLY_WHEN:
        assert rule.setting in names, rule
        for key in rule.keys:
            assert any(is_under(n, [key]) for n in names), (rule, key)


@pytest.mark.parametrize(
    "levels",
    [
        "system.base_url=http://127.0.0.1:8001,http://127.0.0.1:8002",
        'system.base_url="http://127.0.0.1:8001","http://127.0.0.1:8002"',
        "system.base_url='http://127.0.0.1:8001','http://127.0.0.1:8002'",
    ],
    ids=["unquoted", "double-quoted", "single-quoted"],
)
def test_urls_as_levels_quoted_or_not(levels: str) -> None:
    """Hydra escapes an unquoted URL's colons; the level is still the URL: the one equal to the
    baseline's is the baseline (not a job under another label), the other job calls its own."""
    plan, jobs = checked(["system=http", "system.base_url=http://127.0.0.1:8001", levels])
    assert labels(plan) == ["baseline", "system.base_url=http://127.0.0.1:8002"]
    assert [s.system.base_url for s in jobs] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    plan, jobs = checked(["system=http", "system.base_url=http://127.0.0.1:8003", levels])
    assert labels(plan)[1:] == [
        "system.base_url=http://127.0.0.1:8001",
        "system.base_url=http://127.0.0.1:8002",
    ]
    assert [s.system.base_url for s in jobs] == [f"http://127.0.0.1:800{i}" for i in (3, 1, 2)]


def test_missing_dataset_folder_is_caught_before_any_job(tmp_path: Path, tiny_dataset: Path) -> None:
    with pytest.raises(ConfigError) as info:
        checked([f"dataset.path={tiny_dataset},{tmp_path / 'missing'}"])
    assert str(info.value) == (
        f"invalid level dataset.path={tmp_path / 'missing'} of factor dataset.path: "
        f"dataset folder not found: {tmp_path / 'missing'}"
    )


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_module("rag_ablate", args, cwd)


@pytest.mark.slow
def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path: Path) -> None:
    proc = _run(["-m", "experiment=chunk_study", "ablation.dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "6 job(s)" in proc.stdout and "chunk.overlap=128" in proc.stdout and "dry run" in proc.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_grid_sweep_tags_and_guard(tiny_dataset: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    load = ConfigLoaderImpl.load_configuration
    with mock.patch.object(ConfigLoaderImpl, "load_configuration", autospec=True, side_effect=load) as spy:
        proc = _run(
            [
                "-m",
                f"dataset.path={tiny_dataset}",
                "chunk=128,512",
                "router=centroid,nearest",
                "ablation.mode=grid",
                "progress=false",
                "compare.B=500",
                "timing.interleave=false",  # no latency read here: no timing pass after the jobs
                "tracking.traces=none",  # nor per-query traces
            ],
            tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
    # Hydra composes the sweep's config once (not again for hydra.mode) and each job's config once
    # (the plan check's config goes to the launcher, not composed again)
    assert spy.call_count == 1 + 4
    # and each job ran with the config Hydra composes for its overrides
    for job in sorted(p.parent.parent for p in sweep_dir.glob("*/.hydra/config.yaml")):
        overrides = OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "overrides.yaml"))
        assert isinstance(overrides, list)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            want = compose("config", overrides=[str(o) for o in overrides])
        assert OmegaConf.load(job / ".hydra" / "config.yaml") == want, job.name
    data = json.loads((sweep_dir / "comparison.json").read_text())
    assert data["confounded"] == {"chunk=128,router=nearest": ["chunk", "router"]}
    assert "CONFOUNDED" in proc.stdout and "CONFOUNDED" in (sweep_dir / "comparison.md").read_text()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = {
        r.info.run_name: r.data.tags
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("rag_ablate.kind") == "variant"
    }
    base = "baseline (chunk=512, router=centroid)"  # the baseline's run name says what it is
    assert set(runs) == {base, "chunk=128", "router=nearest", "chunk=128,router=nearest"}
    assert runs[base]["ablation.factor"] == "baseline" and runs[base]["ablation.role"] == "baseline"
    assert (runs["chunk=128"]["ablation.factor"], runs["chunk=128"]["ablation.level"]) == ("chunk", "128")
    assert runs["chunk=128,router=nearest"]["ablation.mode"] == "grid"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["retrieval.topk=5,10"],
            "rag_ablate: error: unknown config key 'retrieval.topk' in 'retrieval.topk=5,10': did you mean "
            "'retrieval.top_k'? valid under 'retrieval': ",
        ),
        (
            ["retrieval=bm25,nope"],
            "rag_ablate: error: unknown level 'nope' of factor retrieval (retrieval=nope); "
            "valid: bm25, dense, hybrid",
        ),
        (
            ["chunk.overlap=0,600"],
            "rag_ablate: error: invalid level chunk.overlap=600 of factor chunk.overlap: "
            "chunk.overlap must be in [0, chunk.size=512), got 600",
        ),
        (
            ["chunk=256,0"],
            "rag_ablate: error: chunk=0: a chunk size must be a whole number >= 1 "
            "(presets: 128, 256, 512, 1024; any other size such as chunk=300 works too)",
        ),
        (
            ["retrieval.top_k=20,100", "rerank=biencoder"],
            "rag_ablate: error: level retrieval.top_k=20 of factor retrieval.top_k would run the same "
            "settings as the baseline (#0): retrieval.top_k is not used when rerank.method=biencoder",
        ),
    ],
    ids=["misspelt-factor", "unknown-option", "invalid-level", "bad-size", "unused-setting"],
)
def test_bad_sweep_stops_before_anything_with_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    proc = _run(["-m", *args, "progress=false"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(line) and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and "Launching" not in proc.stdout + proc.stderr
    # no sweep folder, no MLflow store (so no run) was created
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_bad_chunk_size_in_a_single_run(tmp_path: Path) -> None:
    proc = _run(["chunk=-3", "tracking=none"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "rag_ablate: error: chunk=-3: a chunk size must be a whole number >= 1 "
        "(presets: 128, 256, 512, 1024; any other size such as chunk=300 works too)"
    )
    assert not (tmp_path / "outputs").exists()
