"""generator=openai against a small deterministic OpenAI-compatible server on 127.0.0.1
(tests/fake_llm.py: the real wire format, streamed chunks, usage, scripted failures first).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import STORE_FILE, Cache
from rag_ablate.core.errors import ConfigError, GenerationError
from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context
from rag_ablate.generators.openai import (
    OpenAIGenerator,
    build_prompt,
    citations_from_markers,
    prompt_hash,
)
from rag_ablate.records.trace import Citation
from rag_ablate.text.count import count_tokens
from tests.conftest import REPO, run_module, write_dataset
from tests.fake_llm import FakeLLM, serve

PIECE_DELAY_S = 0.03  # between two streamed chunks
FIRST_DELAY_S = 0.05  # before the first chunk (the model "thinks")
CANARY = "sk-canary-7f3a9c1e5b2d4680"  # a fake key: must never reach a file


def _answer(body: dict[str, Any], call: int) -> list[str]:
    """A deterministic answer citing passages 1 and 2, numbered by the call that produced it."""
    return ["Returns ", "are accepted ", "within 30 days [1]", " with a receipt [2]", f" (call {call})."]


@pytest.fixture
def llm() -> Iterator[tuple[FakeLLM, str]]:
    """The shared fake server (tests/fake_llm.py), streaming five pieces with a model's pauses."""
    with serve(FakeLLM(respond=_answer, first_delay_s=FIRST_DELAY_S, piece_delay_s=PIECE_DELAY_S)) as state:
        yield state, state.url


def _settings(base_url: str, **overrides: Any) -> RunConfig:
    """The shipped conf/generator/openai.yaml, pointed at the test server."""
    s = RunConfig()
    for key, value in OmegaConf.to_container(OmegaConf.load(REPO / "conf/generator/openai.yaml")).items():  # type: ignore[union-attr]
        setattr(s.generator, str(key), value)
    s.generator.base_url = base_url
    s.generator.model = "test-model"
    s.generator.backoff_s = 0.01
    for key, value in overrides.items():
        setattr(s.generator, key, value)
    return s


CONTEXTS = [
    Context(1, "returns#0", "returns", 0, 40, "Items can be returned within 30 days."),
    Context(2, "returns#1", "returns", 40, 80, "A receipt is required for every return."),
    Context(3, "shipping#0", "shipping", 0, 30, "Shipping takes 3-5 business days."),
]


_OPEN: list[OpenAIGenerator] = []


def _gen(settings: RunConfig, cache: Cache | None = None) -> OpenAIGenerator:
    gen = GENERATORS.get("openai")(settings, cache)
    assert isinstance(gen, OpenAIGenerator)
    _OPEN.append(gen)
    return gen


@pytest.fixture(autouse=True)
def _close_generators() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


# ---------------------------------------------------------------------- prompts and citations


def test_markers_become_citations_in_order_of_first_mention() -> None:
    answer = "Thirty days [2]. A receipt [1, 2]. Shipping [3][2]. Invented [7]. 中文逗号[1，3]"
    cited = citations_from_markers(answer, CONTEXTS)
    assert cited == [CONTEXTS[1].citation(), CONTEXTS[0].citation(), CONTEXTS[2].citation()]
    assert cited[0] == Citation(doc_id="returns", chunk_id="returns#1", start=40, end=80)
    assert citations_from_markers("No citation here.", CONTEXTS) == []


def test_prompt_language_follows_the_query(llm: tuple[FakeLLM, str]) -> None:
    s = _settings(llm[1])
    en = build_prompt(s.generator, "How long do I have to return an item?", CONTEXTS)
    zh = build_prompt(s.generator, "退货期限是多久？", CONTEXTS)
    assert en.startswith("Answer the question") and "Question: How long do I have to return an item?" in en
    assert zh.startswith("请只根据") and "问题：退货期限是多久？" in zh
    for prompt in (en, zh):
        assert "[1] Items can be returned within 30 days.\n\n[2] A receipt" in prompt
        assert "{contexts}" not in prompt and "{question}" not in prompt
    # a question quoting a placeholder is not expanded again
    assert "Question: what is {contexts}?" in build_prompt(s.generator, "what is {contexts}?", CONTEXTS)


def test_prompt_hash_is_the_templates_version(llm: tuple[FakeLLM, str]) -> None:
    s = _settings(llm[1])
    h = prompt_hash(s.generator)
    assert len(h) == 16 and prompt_hash(_settings(llm[1], temperature=0.7).generator) == h
    assert prompt_hash(_settings(llm[1], prompt_zh=s.generator.prompt_zh + " ").generator) != h
    assert _gen(s).prompt_hash == h


def test_config_errors_name_the_field(llm: tuple[FakeLLM, str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"generator\.base_url"):
        _gen(_settings("ftp://x"))
    with pytest.raises(ConfigError, match=r"generator\.prompt_en must contain \{contexts\}"):
        _gen(_settings(llm[1], prompt_en="Answer {question}"))
    monkeypatch.delenv("RAG_ABLATE_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="'RAG_ABLATE_NO_SUCH_KEY', which is not set"):
        _gen(_settings(llm[1], api_key_env="RAG_ABLATE_NO_SUCH_KEY"))


# ---------------------------------------------------------------------- the wire


def test_streamed_answer_ttft_usage_and_key(
    llm: tuple[FakeLLM, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = llm
    monkeypatch.setenv("RAG_ABLATE_TEST_KEY", CANARY)
    gen = _gen(_settings(url, api_key_env="RAG_ABLATE_TEST_KEY", temperature=0.2, max_tokens=64))
    t0 = time.perf_counter()
    g = gen.generate("How long do I have to return an item?", CONTEXTS)
    total_ms = (time.perf_counter() - t0) * 1000
    gen.close()
    assert g.answer == "Returns are accepted within 30 days [1] with a receipt [2] (call 1)."
    assert g.citations == [CONTEXTS[0].citation(), CONTEXTS[1].citation()]
    assert not g.cached and g.usage_count is None
    # ttft: after the server's first delay, before the remaining pieces (4 more delays) arrived
    assert g.ttft_ms is not None and FIRST_DELAY_S * 1000 <= g.ttft_ms < total_ms - 3 * PIECE_DELAY_S * 1000
    (req,) = state.requests
    body = req["body"]
    assert body["model"] == "test-model" and body["temperature"] == 0.2 and body["max_tokens"] == 64
    assert body["stream_options"] == {"include_usage": True}
    assert req["auth"] == f"Bearer {CANARY}"
    prompt = body["messages"][0]["content"]
    assert g.usage is not None and g.usage.prompt_tokens == len(prompt.split())
    assert (g.usage.completion_tokens, g.usage.total_tokens) == (5, len(prompt.split()) + 5)


def test_usage_counted_locally_when_the_api_sends_none(llm: tuple[FakeLLM, str]) -> None:
    state, url = llm
    state.usage = False
    g = _gen(_settings(url)).generate("How long do I have to return an item?", CONTEXTS)
    prompt = state.requests[0]["body"]["messages"][0]["content"]
    assert g.usage_count == "local"
    assert g.usage is not None and g.usage.prompt_tokens == count_tokens(prompt)
    assert g.usage.completion_tokens == count_tokens(g.answer)
    assert state.requests[0]["auth"] is None  # api_key_env: null sends no key


def test_retry_after_on_429_is_honoured(llm: tuple[FakeLLM, str]) -> None:
    state, url = llm
    state.failures = [(429, {"Retry-After": "1"})]
    t0 = time.perf_counter()
    g = _gen(_settings(url, backoff_s=0.0)).generate("How long?", CONTEXTS)
    elapsed = time.perf_counter() - t0
    assert g.answer.endswith("(call 2).")
    assert len(state.requests) == 2
    waited = state.requests[1]["t"] - state.requests[0]["t"]
    assert 1.0 <= waited < 2.0 and elapsed >= 1.0


def test_500_is_retried_with_backoff_then_given_up(llm: tuple[FakeLLM, str]) -> None:
    state, url = llm
    state.failures = [(500, {}), (503, {})]
    g = _gen(_settings(url, retries=2)).generate("How long?", CONTEXTS)
    assert g.answer.endswith("(call 3).") and len(state.requests) == 3

    state.failures = [(500, {})] * 3
    with pytest.raises(GenerationError, match="HTTP 500") as exc:
        _gen(_settings(url, retries=2)).generate("How long?", CONTEXTS)
    assert exc.value.status == "http_error" and exc.value.http_status == 500
    assert len(state.requests) == 6  # 3 more: the first try and two retries

    state.failures = [(400, {})]
    with pytest.raises(GenerationError, match="HTTP 400"):  # a client error is not retried
        _gen(_settings(url, retries=2)).generate("How long?", CONTEXTS)
    assert len(state.requests) == 7


# ---------------------------------------------------------------------- the cache


def test_cache_replays_the_original_call(llm: tuple[FakeLLM, str], tmp_path: Path) -> None:
    state, url = llm
    s = _settings(url)
    first = _gen(s, Cache(tmp_path / "cache")).generate("How long?", CONTEXTS)
    assert len(state.requests) == 1 and not first.cached

    cache = Cache(tmp_path / "cache")  # a rerun: a new process would start with fresh counts
    again = _gen(s, cache).generate("How long?", CONTEXTS)
    assert len(state.requests) == 1  # no server call
    assert again.cached and again.answer == first.answer and again.citations == first.citations
    assert again.ttft_ms == first.ttft_ms and again.usage == first.usage  # the original call's
    assert cache.metrics()["run/cache_llm_calls_hits"] == 1.0
    assert cache.metrics()["run/cache_llm_calls_misses"] == 0.0
    with contextlib.closing(sqlite3.connect(tmp_path / "cache" / STORE_FILE)) as db:
        ((kind, text),) = db.execute("SELECT kind, value FROM entries").fetchall()
    stored = json.loads(text)
    assert kind == "llm_calls"
    assert stored["total_ms"] >= stored["ttft_ms"] > 0  # the original latency is kept

    # a changed prompt (other contexts, another template, another temperature) never hits
    _gen(s, cache).generate("How long?", CONTEXTS[:2])
    _gen(_settings(url, prompt_en=s.generator.prompt_en + "\nBe brief."), cache).generate(
        "How long?", CONTEXTS
    )
    _gen(_settings(url, temperature=0.5), cache).generate("How long?", CONTEXTS)
    assert len(state.requests) == 4
    assert cache.metrics()["run/cache_llm_calls_misses"] == 3.0


def test_repeats_are_independent_samples(llm: tuple[FakeLLM, str], tmp_path: Path) -> None:
    state, url = llm
    gen = _gen(_settings(url, temperature=0.8), Cache(tmp_path / "cache"))
    answers = [gen.generate("How long?", CONTEXTS, repeat=r).answer for r in range(3)]
    assert [a[-9:] for a in answers] == ["(call 1).", "(call 2).", "(call 3)."]
    rerun = _gen(_settings(url, temperature=0.8), Cache(tmp_path / "cache"))
    assert [rerun.generate("How long?", CONTEXTS, repeat=r).answer for r in (2, 0, 1)] == [
        answers[2],
        answers[0],
        answers[1],
    ]
    assert len(state.requests) == 3


# ---------------------------------------------------------------------- a whole run


@pytest.mark.slow
def test_run_logs_money_and_never_the_key(
    llm: tuple[FakeLLM, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, url = llm
    state.first_delay_s = state.piece_delay_s = 0.0  # one call per query: keep the runs short
    monkeypatch.setenv("RAG_ABLATE_TEST_KEY", CANARY)
    out = tmp_path / "outputs"
    args = [
        f"dataset.path={write_dataset(tmp_path / 'tiny')}",  # eight queries: what is logged is the point
        "generator=openai",
        f"generator.base_url={url}",
        "generator.model=test-model",
        "generator.api_key_env=RAG_ABLATE_TEST_KEY",
        "cost.model=test-model",
        "+cost.prices={test-model: {prompt: 2.0, completion: 8.0}}",
        f"paths.output_root={out}",
        "progress=false",
    ]

    def run() -> tuple[list[dict[str, Any]], dict[str, float], dict[str, str]]:
        before = {p for p in out.rglob("records.jsonl")}
        proc = run_module("rag_ablate", args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert CANARY not in proc.stdout + proc.stderr
        (new,) = [p for p in out.rglob("records.jsonl") if p not in before and "mlartifacts" not in p.parts]
        records = [json.loads(line) for line in new.read_text(encoding="utf-8").splitlines()]
        with sqlite3.connect(out / "mlflow.db") as db:
            (run_id,) = db.execute("SELECT run_uuid FROM runs ORDER BY start_time DESC LIMIT 1").fetchone()
            metrics = dict(db.execute("SELECT key, value FROM latest_metrics WHERE run_uuid=?", (run_id,)))
            params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid=?", (run_id,)))
        return records, metrics, params

    records, metrics, params = run()
    n_calls = len(state.requests)
    assert n_calls == len(records) and all(r["auth"] == f"Bearer {CANARY}" for r in state.requests)
    assert all(r["usage"]["prompt_tokens"] > 0 and not r["cached"] for r in records)
    for r in records:  # the server's answer, its [1] and [2] cite the first two retrieved chunks
        assert r["answer"].startswith("Returns are accepted"), r
        cited = [c["chunk_id"] for c in r["citations"]]
        assert cited == [c["chunk_id"] for c in r["retrieved"][:2]], r
    usd = [(r["usage"]["prompt_tokens"] * 2.0 + r["usage"]["completion_tokens"] * 8.0) / 1e6 for r in records]
    assert metrics["cost/usd_per_1k"] == pytest.approx(sum(usd) / len(usd) * 1000)
    assert metrics["run/cache_llm_calls_misses"] == n_calls
    assert params["generator.prompt_hash"] == prompt_hash(_settings(url).generator)
    assert params["generator.api_key_env"] == "RAG_ABLATE_TEST_KEY"  # the variable's name, not its value

    # a rerun costs nothing: every call replayed, with the original tokens (so the same money)
    again, metrics2, _ = run()
    assert len(state.requests) == n_calls
    assert metrics2["run/cache_llm_calls_hits"] == n_calls and metrics2["run/cache_llm_calls_misses"] == 0
    assert all(r["cached"] for r in again)
    assert [r["usage"] for r in again] == [r["usage"] for r in records]
    assert metrics2["cost/usd_per_1k"] == pytest.approx(metrics["cost/usd_per_1k"])

    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in files) and any(p.name == STORE_FILE for p in files)
    for p in files:
        assert CANARY.encode() not in p.read_bytes(), p


@pytest.mark.slow
def test_composed_config_is_checked_before_any_job() -> None:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()

    def settings(*overrides: str) -> RunConfig:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return to_settings(compose("config", overrides=normalize_overrides(list(overrides))))

    s = settings("generator=openai")
    assert s.generator.base_url == "http://127.0.0.1:8080/v1" and s.generator.temperature == 0.0
    assert "{question}" in s.generator.prompt_zh and "{contexts}" in s.generator.prompt_en
    with pytest.raises(ConfigError, match=r"needs generator\.model"):
        settings("generator=openai", "generator.model=null")
    with pytest.raises(ConfigError, match=r"generator\.max_tokens must be >= 1"):
        settings("generator=openai", "generator.max_tokens=0")


def test_local_system_keeps_retrieval_when_the_model_fails(llm: tuple[FakeLLM, str], tmp_path: Path) -> None:
    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.systems.local import LocalSystem

    state, url = llm
    s = _settings(url, retries=1)
    s.generator.name = "openai"
    s.progress = False
    ds = load_dataset(None)
    system = LocalSystem(s, Cache(tmp_path / "cache"))
    system.prepare(ds)
    query = next(q for q in ds.queries if q.kind != "no_rag")
    state.failures = [(429, {"Retry-After": "0"}), (429, {"Retry-After": "0"})]
    trace = system.run(query)
    assert (trace.status, trace.http_status, len(state.requests)) == ("http_error", 429, 2)
    assert trace.error is not None and trace.error.startswith("generate: ") and "HTTP 429" in trace.error
    assert (
        trace.retrieved and trace.answer is None and trace.timings_ms["total"] >= trace.timings_ms["generate"]
    )

    ok = system.run(query)  # the next call succeeds; a replay from the cache keeps the original time
    replay = system.run(query)
    system.close()
    assert ok.status == "ok" and not ok.cached and replay.cached and len(state.requests) == 3
    assert replay.answer == ok.answer and replay.usage == ok.usage
    assert ok.ttft_ms is not None and replay.ttft_ms == ok.ttft_ms
    assert replay.timings_ms["total"] >= replay.timings_ms["generate"] >= ok.ttft_ms
