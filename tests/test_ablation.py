"""One factor at a time: the job plan, study files, grid mode, dry run, tags and the guard."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from rag_ablate.ablation import Plan, build_plan
from rag_ablate.app import CONF_DIR, normalize_overrides
from rag_ablate.config import register_configs
from rag_ablate.errors import ConfigError
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


def test_unknown_factor_key() -> None:
    with pytest.raises(ConfigError, match="neither a config group nor a setting"):
        plan_for(["retrieval.topk=10,20"])


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_module("rag_ablate", args, cwd)


def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path: Path) -> None:
    proc = _run(["-m", "experiment=chunk_study", "ablation.dry_run=true"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "6 job(s)" in proc.stdout and "chunk.overlap=128" in proc.stdout and "dry run" in proc.stdout
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_grid_sweep_tags_and_guard(tiny_dataset: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    proc = _run(
        [
            "-m",
            f"dataset.path={tiny_dataset}",
            "chunk=128,512",
            "router=centroid,nearest",
            "ablation.mode=grid",
            "progress=false",
            "compare.B=500",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
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
    assert set(runs) == {"baseline", "chunk=128", "router=nearest", "chunk=128,router=nearest"}
    assert (
        runs["baseline"]["ablation.factor"] == "baseline" and runs["baseline"]["ablation.role"] == "baseline"
    )
    assert (runs["chunk=128"]["ablation.factor"], runs["chunk=128"]["ablation.level"]) == ("chunk", "128")
    assert runs["chunk=128,router=nearest"]["ablation.mode"] == "grid"
