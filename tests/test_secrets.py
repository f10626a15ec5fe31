"""API keys come only from environment variables and are stored nowhere.

A sweep with a generator, a judge (each with its own canary key, read from the environment) and
the comparison and report: the servers must receive the keys (so this test can fail), and no file
under the working folder (records, metrics, configs, Hydra's ``.hydra/`` and logs, the comparison,
report.html, MLflow artifacts) nor the MLflow database may contain them. The HTTP system's
header key is covered the same way by tests/test_http_system.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run_module, write_dataset
from fake_llm import FakeLLM, serve

GEN_KEY = "sk-canary-generator-5d1e8b2a9c7f"
JUDGE_KEY = "sk-canary-judge-3a6f0c4e1b9d"
BODY_TOKEN = "tok-canary-body-6c2d9e0f4a"  # a config value read with ${oc.env:...}


def _judge_reply(body: dict[str, Any], call: int) -> str:
    return json.dumps({"faithfulness": 4, "relevance": 5, "completeness": 3, "refusal": False, "support": []})


@pytest.mark.slow
def test_keys_reach_the_servers_and_no_file_or_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_dataset(tmp_path / "data")
    monkeypatch.setenv("RAG_GEN_KEY", GEN_KEY)
    monkeypatch.setenv("RAG_JUDGE_KEY", JUDGE_KEY)
    monkeypatch.setenv("RAG_BODY_TOKEN", BODY_TOKEN)
    with serve(FakeLLM()) as gen, serve(FakeLLM(respond=_judge_reply)) as judge:
        out = run_module(
            "rag_ablate",
            [
                "-m",
                "chunk=256,512",
                f"dataset.path={data}",
                "generator=openai",
                f"generator.base_url={gen.url}",
                "generator.model=canary-model",
                "generator.api_key_env=RAG_GEN_KEY",
                "judge=openai",
                f"judge.base_url={judge.url}",
                "judge.model=canary-judge",
                "judge.api_key_env=RAG_JUDGE_KEY",
                "+system.body.token=${oc.env:RAG_BODY_TOKEN}",
                "progress=false",
                "compare.B=200",
            ],
            tmp_path,
            timeout=900,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        gen_auth = {r["auth"] for r in gen.requests}
        judge_auth = {r["auth"] for r in judge.requests}
    # the keys were used: each server got its own, and only its own
    assert gen_auth == {f"Bearer {GEN_KEY}"}
    assert judge_auth == {f"Bearer {JUDGE_KEY}"}
    assert (tmp_path / "outputs" / "mlflow.db").is_file()
    assert list((tmp_path / "outputs" / "multirun").glob("*/report.html"))

    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(data)]
    assert len(files) > 20  # records, configs, .hydra, comparison, report, artifacts, the database
    leaks = [
        str(p) for p in files for key in (GEN_KEY, JUDGE_KEY, BODY_TOKEN) if key.encode() in p.read_bytes()
    ]
    assert leaks == []
    # what is stored instead: the variable's name, so a reader knows where the key came from
    (config,) = {p.read_text(encoding="utf-8") for p in tmp_path.glob("outputs/multirun/*/0/config.yaml")}
    assert "api_key_env: RAG_GEN_KEY" in config and "api_key_env: RAG_JUDGE_KEY" in config
    assert "token: ${oc.env:RAG_BODY_TOKEN}" in config
    assert GEN_KEY not in out.stdout + out.stderr and JUDGE_KEY not in out.stdout + out.stderr


def test_values_read_from_the_environment_are_stored_as_their_interpolation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config value taken from ``${oc.env:NAME}`` is stored as that text (config.yaml, MLflow params),
    never as the value; header values are masked whatever they hold."""
    from omegaconf import OmegaConf

    from rag_ablate.config.keys import env_interpolated, redact
    from rag_ablate.run.runner import flatten

    monkeypatch.setenv("RAG_BODY_TOKEN", "canary-body-token-8e2f7a1c")
    cfg = OmegaConf.create(
        {
            "system": {
                "body": {"token": "${oc.env:RAG_BODY_TOKEN}", "query": "{query}"},
                "headers": {"Authorization": "Bearer literal-key"},
                "list": ["a", "x-${oc.env:RAG_BODY_TOKEN}"],
            },
            "seed": 3,
        }
    )
    env = env_interpolated(cfg)
    assert env == {
        "system.body.token": "${oc.env:RAG_BODY_TOKEN}",
        "system.list.1": "x-${oc.env:RAG_BODY_TOKEN}",
    }
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["system"]["body"]["token"] == "canary-body-token-8e2f7a1c"  # type: ignore[index]
    stored = redact(resolved, env=env)
    assert stored == {
        "system": {
            "body": {"token": "${oc.env:RAG_BODY_TOKEN}", "query": "{query}"},
            "headers": {"Authorization": "***"},
            "list": ["a", "x-${oc.env:RAG_BODY_TOKEN}"],
        },
        "seed": 3,
    }
    params = redact(flatten(resolved), env=env)
    assert params["system.body.token"] == "${oc.env:RAG_BODY_TOKEN}"
    assert "canary-body-token-8e2f7a1c" not in json.dumps(params)
