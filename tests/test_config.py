"""Every config composes into the typed schema; numeric groups work as typed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rag_ablate.app import CONF_DIR, normalize_overrides, numeric_groups
from rag_ablate.config import RunConfig, register_configs, to_settings
from rag_ablate.errors import ConfigError

register_configs()

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]
NEEDS_VALUE = {
    ("rerank", "cross_encoder"): ["rerank.model_path=/tmp/x"],
    ("rerank", "http"): ["rerank.url=http://127.0.0.1:1/rerank"],
    ("dataset", "custom"): ["dataset.path=/tmp/x"],
    ("tracking", "server"): ["tracking.uri=http://127.0.0.1:1"],
}


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=normalize_overrides(overrides))


def test_default_config_composes() -> None:
    s = to_settings(_compose([]))
    assert isinstance(s, RunConfig)
    assert s.chunk.size == 512 and s.retrieval.method == "bm25" and s.dataset.path is None


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


def test_unknown_group_option_lists_choices() -> None:
    with pytest.raises(Exception, match="Available options") as info:
        _compose(["chunk=300"])
    assert "256" in str(info.value)


def test_conf_dir_is_the_checkout_conf() -> None:
    assert (Path(CONF_DIR) / "config.yaml").is_file()
