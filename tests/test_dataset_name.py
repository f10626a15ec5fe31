"""dataset.name: the dataset folder's name unless given (params, tags, variant.json, serve's /health)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
from rag_ablate.config.schema import RunConfig, register_configs
from rag_ablate.settings import to_settings
from tests.conftest import run_module, write_dataset

register_configs()


def _settings(*overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_settings(compose("config", overrides=normalize_overrides(list(overrides))))


def test_name_defaults_to_the_folder_and_an_explicit_name_wins(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "shop_faq")
    assert _settings().dataset.name == "sample"  # the embedded sample
    assert _settings(f"dataset.path={folder}").dataset.name == "shop_faq"
    assert _settings("dataset=custom", f"dataset.path={folder}").dataset.name == "shop_faq"
    assert _settings(f"dataset.path={folder}/.").dataset.name == "shop_faq"  # as validate names it
    assert _settings(f"dataset.path={folder}", "dataset.name=faq_v2").dataset.name == "faq_v2"


def test_serve_health_names_the_folder(tmp_path: Path) -> None:
    from rag_ablate.cli.serve import ReferenceService

    folder = write_dataset(tmp_path / "shop_faq")
    service = ReferenceService.start([f"dataset.path={folder}", "progress=false"], cwd=tmp_path)
    try:
        assert service.health()["dataset"] == "shop_faq"
    finally:
        service.system.close()


@pytest.mark.slow
def test_a_run_on_a_folder_logs_its_name(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    folder = write_dataset(tmp_path / "shop_faq")
    proc = run_module("rag_ablate", [f"dataset.path={folder}", "progress=false"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    assert json.loads((run_dir / "variant.json").read_text())["dataset"] == "shop_faq"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["dataset.name"] == "shop_faq" and run.data.tags["dataset.name"] == "shop_faq"
