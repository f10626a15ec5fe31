"""API keys come only from environment variables and are stored nowhere.

A sweep with a generator, a judge (each with its own canary key, read from the environment) and
the comparison and report: the servers must receive the keys (so this test can fail), and no file
under the working folder (records, metrics, configs, Hydra's ``.hydra/`` and logs, the comparison,
report.html, MLflow artifacts) nor the MLflow database may contain them. The HTTP system's
header key is covered the same way by tests/test_http_system.py.
"""

from __future__ import annotations

import json
import os
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


# --------------------------------------------------------------------------- keys a careless user passes


def test_url_userinfo_is_taken_out_of_the_url_and_hidden_in_text() -> None:
    from rag_ablate.core.secrets import hide_credentials, hide_userinfo, split_userinfo

    assert split_userinfo("http://user:s3cr%40t@host:8080/v1") == ("http://host:8080/v1", ("user", "s3cr@t"))
    assert split_userinfo("https://host/v1?a=b@c") == ("https://host/v1?a=b@c", None)  # no userinfo
    assert split_userinfo("http://KEY@host/v1") == ("http://host/v1", ("KEY", ""))
    text = "generator.base_url=http://user:KEY@host/v1 and sqlite:///a@b.db, mail a@b.com"
    assert hide_userinfo(text) == "generator.base_url=http://***@host/v1 and sqlite:///a@b.db, mail a@b.com"
    assert hide_userinfo("http://u:p@ss@host:1/v1") == "http://***@host:1/v1"  # an @ in the password
    assert split_userinfo("http://u:p@ss@host:1/v1") == ("http://host:1/v1", ("u", "p@ss"))
    assert hide_credentials("Authorization: Bearer sk-abcdef123456; bearer of news") == (
        "Authorization: Bearer ***; bearer of news"
    )


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("sk-proj-4fA1c9e7B2b0d3E5f6a8", "sk-***"),
        ("sk-ant-api03-Zx8Qw2Er4Ty6Ui8Op0As", "sk-***"),
        ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", "ghp_***"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijklmnop", "github_pat_***"),
        ("AKIAIOSFODNN7EXAMPLE", "AKIA***"),
        ("xoxb-2048-4096-aBcDeFgHiJkL", "xoxb-***"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQs", "***"),
        ("q3Xv9LmT2pR8sW4nB6yK1dF7hJ0cZ5aG", "***"),  # a random token of 32, whatever its name
        ("{'k': 'x', 'token': 'Zk4Qp9Lx2Wm7Rt5Yv8Ns3Bc6Hd1Jf0Ga'}", "{'k': 'x', 'token': '***'}"),
    ],
)
def test_values_shaped_like_keys_are_hidden_whatever_their_name(value: str, stored: str) -> None:
    from rag_ablate.config.keys import redact, redact_override

    assert redact({"system": {"body": {"k": value}}}) == {"system": {"body": {"k": stored}}}
    assert redact_override(f"+system.body.k={value}") == f"+system.body.k={stored}"


def test_ids_hashes_and_names_the_tool_stores_are_not_taken_for_keys() -> None:
    """What a run stores that is long and mixes characters: hashes (prompt_hash, config and cache
    keys, git SHAs), MLflow run ids, folder names, model names, paths, document ids."""
    import hashlib
    import uuid

    from rag_ablate.core.secrets import hide_credentials
    from rag_ablate.llm.client import messages_sha256

    values = [
        messages_sha256([{"role": "user", "content": "q"}]),
        *(hashlib.sha256(str(i).encode()).hexdigest() for i in range(200)),
        *(hashlib.sha1(str(i).encode()).hexdigest() for i in range(200)),  # git SHAs
        *(uuid.uuid4().hex for _ in range(200)),  # MLflow run ids
        *(str(uuid.uuid4()) for _ in range(50)),
        "2026-05-01_10-00-00_a1b2c3",
        "outputs/multirun/2026-05-01_10-00-00_d4e5f6/0",
        "sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2",
        "BAAI/bge-reranker-v2-m3",
        "Qwen2.5-7B-Instruct-GGUF-Q4_K_M-00001-of-00002.gguf",
        "/home/Alice/Projects/RagEval2024/DataSets/ZhongWenQA/corpus.jsonl",
        "doc_000123456789_section_0042_chunk_0007",
        "retrieval.bm25.k1=1.2,retrieval.top_k=10,chunk=256",
        "task-2024-12-04T10:00:00Z",
        "sk-learn",
    ]
    assert [v for v in values if hide_credentials(v) != v] == []


@pytest.mark.slow
def test_the_default_sweeps_params_and_tags_hide_nothing(default_sweep: dict[str, Any]) -> None:
    """Nothing in README's default sweep reads as a key: no param or tag of its runs was masked."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{default_sweep['out'] / 'mlflow.db'}")
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) >= 3  # the parent and its jobs
    values = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values())]
    assert len(values) > 100
    assert [v for v in values if "***" in v] == []


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("system.body.api_key", True),
        ("system.body.apiKey", True),
        ("system.header.X-Api-Token", True),  # a misspelt system.headers
        ("system.body.params.token", True),
        ("tracking.password", True),
        ("generator.api_key_env", False),  # the NAME of the variable holding the key
        ("generator.max_tokens", False),
        ("judge.keys_en.faithfulness", False),
        ("retrieval.top_k", False),
        ("system.headers", False),  # the mapping: its values are secrets (is_secret_key), not its name
    ],
)
def test_names_that_say_a_value_is_a_secret(key: str, secret: bool) -> None:
    from rag_ablate.core.secrets import is_secret_name

    assert is_secret_name(key) is secret


def test_every_default_setting_name_is_not_taken_for_a_secret() -> None:
    """The name test must not hide a real setting: no key of the composed configs it reads."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rag_ablate.cli.hydra_app import CONF_DIR
    from rag_ablate.core.secrets import is_secret_name
    from rag_ablate.run.runner import flatten

    groups = ["generator=openai", "judge=openai", "system=http", "rerank=http", "tracking=server"]
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        keys = set(flatten(OmegaConf.to_container(compose("config", overrides=groups), resolve=False)))
    assert len(keys) > 100
    assert [k for k in sorted(keys) if is_secret_name(k)] == []


def test_a_config_and_its_overrides_are_stored_without_any_secret() -> None:
    from rag_ablate.config.keys import redact, redact_hydra, redact_override

    config = {
        "system": {
            "base_url": "http://u:KEY1@host",
            "headers": {"X-Api-Token": "KEY2"},
            "header": {"Authorization": "Bearer KEY3"},  # misspelt: not a header, but named a secret
            "body": {"api_key": "KEY4", "query": "{query}", "h": "Bearer KEY5abcdefgh", "env": "VALUE"},
        },
        "generator": {"base_url": "https://u:KEY6@api/v1", "api_key_env": "OPENAI_API_KEY"},
    }
    env = {"system.body.env": "${oc.env:RAG_BODY}"}
    assert redact(config, env=env) == {
        "system": {
            "base_url": "http://***@host",
            "headers": {"X-Api-Token": "***"},
            "header": {"Authorization": "***"},
            "body": {"api_key": "***", "query": "{query}", "h": "Bearer ***", "env": "${oc.env:RAG_BODY}"},
        },
        "generator": {"base_url": "https://***@api/v1", "api_key_env": "OPENAI_API_KEY"},
    }
    overrides = [
        "system.base_url=http://u:KEY1@host",
        "+system.headers.X-Api-Token=KEY2",
        "+system.header.Authorization='Bearer KEY3'",
        "+system.body.api_key=KEY4",
        "-m generator.base_url=https://u:KEY6@a/v1,https://u:KEY6@b/v1",
    ]
    assert [redact_override(o) for o in overrides] == [
        "system.base_url=http://***@host",
        "+system.headers.X-Api-Token=***",
        "+system.header.Authorization=***",
        "+system.body.api_key=***",
        "-m generator.base_url=https://***@a/v1,https://***@b/v1",
    ]
    # Hydra's own record of the command line: overrides.task and override_dirname made of them
    hydra = {
        "overrides": {"task": overrides[1:4], "hydra": []},
        "job": {"override_dirname": ",".join(overrides[1:4]), "name": "__main__"},
        "runtime": {"output_dir": "/tmp/x"},
    }
    stored = redact_hydra({"hydra": hydra, **config}, env)
    text = json.dumps(stored)
    assert not any(f"KEY{i}" in text for i in range(1, 7)), text
    assert stored["hydra"]["job"]["override_dirname"] == (
        "+system.headers.X-Api-Token=***,+system.header.Authorization=***,+system.body.api_key=***"
    )


def test_hydra_files_are_rewritten_only_when_they_hold_something_to_hide(tmp_path: Path) -> None:
    """A job's ``.hydra/`` files as Hydra writes them: with a header value and a URL password, each
    file that holds one is rewritten without it; with nothing to hide, every file stays as Hydra
    wrote it (not even renamed over). libyaml's parser reads them as the pure-Python one does."""
    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rag_ablate.cli.hydra_app import CONF_DIR
    from rag_ablate.config.keys import _load_yaml, redact_hydra_output

    def write(folder: Path, overrides: list[str]) -> dict[str, tuple[int, bytes]]:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
        task = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        folder.mkdir()
        (folder / "config.yaml").write_text(OmegaConf.to_yaml(task), encoding="utf-8")
        (folder / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": cfg.hydra}), encoding="utf-8")
        (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(overrides), encoding="utf-8")
        return {p.name: (p.stat().st_ino, p.read_bytes()) for p in folder.iterdir()}

    plain = ["chunk='256'", "dataset.name='2026-01-01 ü ✓'", "+system.body.q='{query}: 1e-3'"]
    before = write(tmp_path / "plain", plain)
    for name, (_, data) in before.items():
        text = data.decode()
        assert _load_yaml(text) == yaml.safe_load(text), name
    redact_hydra_output(tmp_path / "plain")
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in (tmp_path / "plain").iterdir()} == before

    secret = [*plain, "+system.headers.X-Key=KEY1", "tracking.uri=http://u:KEY2@host"]
    before = write(tmp_path / "secret", secret)
    redact_hydra_output(tmp_path / "secret")
    for name, (inode, data) in before.items():
        path = tmp_path / "secret" / name
        text = path.read_text(encoding="utf-8")
        assert "KEY1" in data.decode() and "KEY1" not in text and "KEY2" not in text, name
        assert path.stat().st_ino != inode
        assert "X-Key" in text and "2026-01-01 ü ✓" in text


def test_the_sweep_plan_is_stored_and_logged_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from rag_ablate.core.secrets import hidden_in_logs
    from rag_ablate.sweep.plan import Factor, Job, Plan, format_plan

    common = ["+system.headers.Authorization='Bearer KEY1'", "system.base_url=http://u:KEY2@h"]
    url = "http://u:KEY3@a/v1"
    plan = Plan(
        "ofat",
        False,
        common,
        [Factor("generator.base_url", False, "null", [url], [f"generator.base_url={url}"])],
        [
            Job(0, "baseline", "baseline", None, None, common),
            Job(
                1,
                f"generator.base_url={url}",
                "variant",
                "generator.base_url",
                url,
                [*common, f"generator.base_url={url}"],
            ),
        ],
    )
    stored = json.dumps(plan.to_dict()) + format_plan(plan)
    assert "KEY" not in stored and "http://***@a/v1" in stored
    # a swept secret: its levels are numbered masks, so the variants' labels stay distinct
    body = Factor(
        "system.body.api_key",
        False,
        "KEY0",
        ["KEY5", "KEY6"],
        ["system.body.api_key=KEY5", "system.body.api_key=KEY6"],
    )
    jobs = [
        Job(i, f"system.body.api_key={lv}", "variant", body.key, lv, [o])
        for i, (lv, o) in enumerate(zip(body.levels, body.level_overrides, strict=True), 1)
    ]
    swept = Plan("ofat", False, [], [body], [Job(0, "baseline", "baseline", None, None, []), *jobs]).to_dict()
    assert "KEY" not in json.dumps(swept)
    assert [j["label"] for j in swept["jobs"]] == [
        "baseline",
        "system.body.api_key=***1",
        "system.body.api_key=***2",
    ]
    assert "KEY1" in " ".join(plan.jobs[1].overrides)  # the launcher gets the real ones
    with caplog.at_level(logging.INFO):
        with hidden_in_logs(plan.secret_swaps()):
            logging.getLogger("hydra.launcher").info("\t#%d : %s", 1, " ".join(plan.jobs[1].overrides))
        assert "KEY" not in caplog.text and "Authorization=***" in caplog.text
        logging.getLogger("x").info("Bearer KEY4abcdefgh after the block")  # the factory is put back
    assert "KEY4abcdefgh" in caplog.text


# --------------------------------------------------------------------------- the canary


SYS_URL_KEY = "sk-canary-sysurl-7b1d0e9f3a2c"  # system.base_url=http://user:KEY@host
GEN_URL_KEY = "sk-canary-genurl-0e4a9c2f7b5d"  # generator.base_url=http://user:KEY@host/v1
JUDGE_URL_KEY = "sk-canary-judgeurl-5c3e1a7d9f0b"
HEADER_KEY = "sk-canary-header-2e8c4a6b0d1f"  # +system.headers.X-Api-Token=KEY
AUTH_KEY = "sk-canary-auth-8d2f6b0a4c9e"  # +system.headers.Authorization='Bearer KEY' (a sweep)
BODY_KEY = "sk-canary-body-9f3b7c1e5a0d"  # +system.body.api_key=KEY (the body template)
MISSPELT_KEY = "sk-canary-misspelt-4c0a8e2f6b1d"  # generator.api_kee=KEY, +system.header.Authorization
VALUE_KEY = "sk-canary-value-6a0e2c8f4b1d"  # +system.body.k=KEY: an innocent name, a key's shape
TYPO_KEY = "ghp_canaryTypo7Kq2Vx9Lm4Np8Rs3Tw6Yz"  # +system.body.api_kye=KEY: a misspelt secret name
BEARER_KEY = "canary-bearer-1d7f3b9e5a2c"  # +system.body.h='Bearer KEY': any config string


def _with_key(url: str, key: str) -> str:
    return url.replace("http://", f"http://user:{key}@", 1)


def _basic(key: str) -> str:
    import base64

    return "Basic " + base64.b64encode(f"user:{key}".encode()).decode()


@pytest.mark.slow
def test_no_careless_way_of_passing_a_key_stores_or_prints_it(tmp_path: Path) -> None:
    """Each way a careless user passes a key, through real runs and a sweep against servers on
    127.0.0.1: the servers get the keys (so the search can fail), and no file under the working
    folder (records, configs, run.json, variant.json, run.trec, Hydra's .hydra/ and multirun.yaml,
    plan.json, the cache's metadata, MLflow artifacts, the MLflow database) nor the terminal holds
    them, nor the basic-auth form of a URL's password."""
    from test_http_system import Plan, fault_server

    data = write_dataset(tmp_path / "data")
    service = Plan({})
    with (
        serve(FakeLLM()) as gen,
        serve(FakeLLM(respond=_judge_reply)) as judge,
        fault_server(service) as url,
    ):
        runs = {
            "local pipeline, keys in the generator's and the judge's URLs": [
                "generator=openai",
                f"generator.base_url={_with_key(gen.url, GEN_URL_KEY)}",
                "generator.model=canary-model",
                "judge=openai",
                f"judge.base_url={_with_key(judge.url, JUDGE_URL_KEY)}",
                "judge.model=canary-judge",
            ],
            "a service: a key in its URL, a literal header, a key in the body template": [
                "system=http",
                f"system.base_url={_with_key(url, SYS_URL_KEY)}",
                f"+system.headers.X-Api-Token={HEADER_KEY}",
                "+system.body.query='{query}'",
                "+system.body.query_id='{query_id}'",
                f"+system.body.api_key={BODY_KEY}",
                f"+system.body.k={VALUE_KEY}",
                f"+system.body.api_kye={TYPO_KEY}",
                f"+system.body.h='Bearer {BEARER_KEY}'",
            ],
            "a sweep with a literal Authorization header": [
                "-m",
                "chunk=256,512",
                "system=http",
                f"system.base_url={url}",
                f"+system.headers.Authorization='Bearer {AUTH_KEY}'",
                "compare.B=200",
            ],
            "a misspelt setting": [f"generator.api_kee={MISSPELT_KEY}"],
            "a misspelt section": [f"+system.header.Authorization='Bearer {MISSPELT_KEY}'"],
        }
        codes, terminal = {}, []
        for what, args in runs.items():
            out = run_module("rag_ablate", [*args, f"dataset.path={data}", "progress=false"], tmp_path)
            codes[what] = out.returncode
            terminal.append(out.stdout + out.stderr)
            assert out.returncode in (0, 2), (what, out.stderr[-3000:])
        gen_auth = {r["auth"] for r in gen.requests}
        judge_auth = {r["auth"] for r in judge.requests}
    # the keys still work: each server got its own
    assert list(codes.values()) == [0, 0, 0, 2, 2], codes
    assert gen_auth == {_basic(GEN_URL_KEY)} and judge_auth == {_basic(JUDGE_URL_KEY)}
    sent = {(h.get("Authorization"), h.get("X-Api-Token")) for h in service.headers}
    assert sent == {(_basic(SYS_URL_KEY), HEADER_KEY), (f"Bearer {AUTH_KEY}", None)}
    in_body = {(b.get("api_key"), b.get("k"), b.get("api_kye"), b.get("h")) for b in service.bodies}
    assert (BODY_KEY, VALUE_KEY, TYPO_KEY, f"Bearer {BEARER_KEY}") in in_body

    keys = [SYS_URL_KEY, GEN_URL_KEY, JUDGE_URL_KEY, HEADER_KEY, AUTH_KEY, BODY_KEY, MISSPELT_KEY]
    keys += [VALUE_KEY, TYPO_KEY, BEARER_KEY]
    needles = [*keys, *(_basic(k).split()[1] for k in (SYS_URL_KEY, GEN_URL_KEY, JUDGE_URL_KEY))]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(data)]
    names = {p.name for p in files}
    assert {"mlflow.db", "overrides.yaml", "hydra.yaml", "multirun.yaml", "plan.json", "meta.json"} <= names
    assert {"config.yaml", "run.json", "variant.json", "run.trec", "report.html"} <= names
    assert any("mlartifacts" in p.parts and ".hydra" in p.parts for p in files)
    leaks = [
        f"{p.relative_to(tmp_path)}: {n}" for p in files for n in needles if n.encode() in p.read_bytes()
    ]
    assert leaks == []
    printed = "\n".join(terminal)
    assert [n for n in needles if n in printed] == []
    # what is stored instead says where the key was
    assert "http://***@127.0.0.1" in printed or any(
        b"http://***@127.0.0.1" in p.read_bytes() for p in files if p.name == "config.yaml"
    )


def test_a_tracking_servers_password_goes_to_mlflows_variables_not_the_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rag_ablate.config.schema import TrackingConfig
    from rag_ablate.tracking.store import resolve

    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    uri, _ = resolve(TrackingConfig(uri="http://alice:KEY%2F1@127.0.0.1:5000"), tmp_path)
    assert uri == "http://127.0.0.1:5000"  # what sweep.json, run.json and the terminal name
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "KEY/1"  # what MLflow sends as basic auth
    db = "postgresql://u:pw@db/mlflow"  # a database URI needs its password: left as it is
    assert resolve(TrackingConfig(uri=db), tmp_path)[0] == db


@pytest.mark.slow
def test_resume_asks_for_the_secrets_again_and_still_stores_none(tmp_path: Path) -> None:
    """A run whose key was not stored: resume= names what to give again, then finishes the run with
    it (the service gets it), and the key is still stored nowhere."""
    from test_http_system import Plan, fault_server

    data = write_dataset(tmp_path / "data")
    service = Plan({"q2": "down"})  # one failed query: something for resume= to do
    run = tmp_path / "run"
    with fault_server(service) as url:
        secrets = [
            f"system.base_url={_with_key(url, SYS_URL_KEY)}",
            f"+system.headers.X-Api-Token={HEADER_KEY}",
        ]
        common = ["system=http", "system.retries=0", "system.max_error_rate=1.0", f"dataset.path={data}"]
        first = run_module(
            "rag_ablate", [*common, *secrets, "progress=false", f"hydra.run.dir={run}"], tmp_path
        )
        assert first.returncode == 0, first.stderr[-2000:]
        service.scenarios.clear()
        refused = run_module("rag_ablate", [f"resume={run}"], tmp_path)
        assert refused.returncode == 2
        assert "+system.headers.X-Api-Token=*** was not stored" in refused.stderr
        resumed = run_module("rag_ablate", [f"resume={run}", *secrets], tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert service.count("/rag/eval", "q2") == 2  # asked again, with the key
    assert {(h.get("Authorization"), h.get("X-Api-Token")) for h in service.headers} == {
        (_basic(SYS_URL_KEY), HEADER_KEY)
    }
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert {r["status"] for r in records} == {"ok"}
    needles = [SYS_URL_KEY, HEADER_KEY, _basic(SYS_URL_KEY).split()[1]]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(data)]
    assert [str(p) for p in files for n in needles if n.encode() in p.read_bytes()] == []
    printed = first.stdout + first.stderr + refused.stderr + resumed.stdout + resumed.stderr
    assert [n for n in needles if n in printed] == []


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        (
            "+system.headers.Authorization='Bearer sk-canary-syntax-1f2e'}",
            "+system.headers.Authorization=***",
        ),
        ("+system.headers.X-Api-Token=[sk-canary-syntax-1f2e", "+system.headers.X-Api-Token=***"),
        ("generator.base_url=http://u:sk-canary-syntax-1f2e@h/v1}", "generator.base_url=http://***@h/v1}"),
    ],
)
def test_an_override_hydra_cannot_parse_is_named_without_its_key(
    tmp_path: Path, override: str, shown: str
) -> None:
    out = run_module("rag_ablate", [override, "progress=false"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith(f"rag_ablate: error: cannot parse the override '{shown}': ")
    assert "sk-canary-syntax" not in out.stdout + out.stderr
    assert not (tmp_path / "outputs").exists()  # refused before anything is made
