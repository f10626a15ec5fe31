"""Every outside dependency has a deadline (issue 23, finding 1 and 14).

A tracking store that stops answering fails within ``tracking.timeout_s`` (a real server that
goes silent mid-sweep: tests/test_tracking_server.py, which starts one server for its file);
every HTTP client of the package ends a call to a service that accepts connections and never
answers within its timeout, and the run within a few of them.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, run_in_process

from rag_ablate.core.errors import EXIT_FAILED, EndpointDownError, TrackingDownError
from rag_ablate.core.layout import RECORDS_FILE
from rag_ablate.core.retry import BREAKER_LIMIT, Breaker
from rag_ablate.tracking import store as tracking


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers; its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@pytest.fixture
def small_budget() -> Iterator[None]:
    tracking.set_budget(2)
    yield
    tracking.set_budget()
    tracking._down.clear()


@pytest.mark.usefixtures("small_budget")
def test_a_silent_tracking_server_fails_within_the_budget_then_at_once() -> None:
    with silent_server() as url:
        client = tracking._client(url)
        t0 = time.monotonic()
        with pytest.raises(TrackingDownError) as caught:
            client.get_run("0" * 32)
        first = time.monotonic() - t0
        # MLflow's own default retried this call for minutes (7 tries of 120 s, backoff to 120 s)
        assert first < 2 + 3, first
        line = str(caught.value)
        assert line.startswith(f"MLflow tracking store {url} did not answer within 2 s (tracking.timeout_s)")
        assert "resume=" in line and "\n" not in line
        # every later call to that store fails at once, with the same line
        t0 = time.monotonic()
        with pytest.raises(TrackingDownError, match="did not answer within 2 s"):
            tracking.end_run(url, "0" * 32, "KILLED")
        assert time.monotonic() - t0 < 0.5


@pytest.mark.usefixtures("small_budget")
def test_a_closed_port_fails_within_the_budget() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TrackingDownError, match=f"MLflow tracking store {url} did not answer"):
        tracking.run_status(url, "0" * 32)
    assert time.monotonic() - t0 < 2 + 3


def test_the_budget_bounds_mlflow_retries_and_timeouts() -> None:
    """The variables MLflow reads at each call: tries x timeout + waits stay within the budget."""
    import os

    try:
        for budget in (1, 5, 8, 30, 60, 600):
            tracking.set_budget(budget)
            tries = int(os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]) + 1
            per_try = int(os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"])
            waits = sum(2**i for i in range(1, tries - 1))  # urllib3: no wait before the 2nd try
            assert tries * per_try + waits <= max(budget, 1), budget
            assert os.environ["MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER"] == "false"
    finally:
        tracking.set_budget()


# --------------------------------------------------------------------------- silent HTTP services


def test_the_breaker_counts_tries_that_got_no_response_and_names_the_timeout() -> None:
    b = Breaker("rerank", "http://127.0.0.1:1/rerank", ("rerank.timeout", 2.5), limit=3)
    assert not b.failed("ConnectError", silent=False) and not b.failed("ReadTimeout", silent=True)
    b.succeeded()  # an answer in between: the count starts again
    assert not b.failed("ReadTimeout") and not b.failed("ReadTimeout", silent=True)
    assert b.failed("ReadTimeout: timed out", silent=True) and b.open
    line = b.message()
    assert line.startswith(
        "rerank endpoint http://127.0.0.1:1/rerank does not answer: 3 requests in a row got no response "
        "within 2.5 s (rerank.timeout) (ReadTimeout: timed out); the run stops."
    )
    assert "raise rerank.timeout" in line and "\n" not in line


@pytest.mark.parametrize("stream", [True, False])
def test_a_chat_client_at_a_silent_server_gives_up_after_a_few_timeouts(stream: bool) -> None:
    """Before: every call waited ``timeout_s`` and failed as ``timeout``; a generator run went on
    with the next query, and the next, for n_queries x timeout_s."""
    from rag_ablate.core.errors import GenerationError
    from rag_ablate.llm.client import ChatClient

    with silent_server() as url:
        client = ChatClient(
            owner="judge", base_url=url + "/v1", model="m", api_key_env=None, timeout_s=0.3, retries=4,
            backoff_s=0.01, backoff_max_s=0.02, cache=None,
        )  # fmt: skip
        t0 = time.monotonic()
        messages = [{"role": "user", "content": "hi"}]
        for _ in range(BREAKER_LIMIT - 1):  # each a failed call (read timeouts are not retried)
            with pytest.raises(GenerationError, match="ReadTimeout"):
                client.complete(messages, temperature=0.0, max_tokens=8, stream=stream)
        with pytest.raises(EndpointDownError) as caught:
            client.complete(messages, temperature=0.0, max_tokens=8, stream=stream)
        assert str(caught.value).startswith(
            f"judge endpoint {url}/v1/chat/completions does not answer: 3 requests in a row got no "
            "response within 0.3 s (judge.timeout_s) (judge endpoint"
        )
        with pytest.raises(EndpointDownError):  # later calls fail at once, without a request
            client.complete(messages, temperature=0.0, max_tokens=8, stream=stream)
        assert client.calls == BREAKER_LIMIT and time.monotonic() - t0 < BREAKER_LIMIT * 0.3 + 1.5
        client.close()


def test_a_rerank_client_at_a_silent_server_stops_instead_of_retrying_every_query() -> None:
    """Before: read timeouts were retried (max_retries), so each query cost 3 x timeout and the
    run went on to the next query."""
    from rag_ablate.pipeline.rerank import HttpReranker

    with silent_server() as url:
        reranker = HttpReranker(url + "/rerank", timeout=0.3, max_retries=5)
        reranker.backoff_seconds = 0.01
        t0 = time.monotonic()
        with pytest.raises(EndpointDownError) as caught:
            reranker.rerank("q", ["a", "b"], top_k=2)
        assert str(caught.value).startswith(
            f"rerank endpoint {url}/rerank does not answer: 3 requests in a row got no response within "
            "0.3 s (rerank.timeout) (ReadTimeout"
        )
        with pytest.raises(EndpointDownError):
            reranker.rerank("q", ["a"], top_k=1)
        assert time.monotonic() - t0 < BREAKER_LIMIT * 0.3 + 1.5
        reranker.close()


@pytest.mark.slow
def test_an_http_system_at_a_silent_server_stops_the_run_in_seconds_exit_1(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    """A service that accepts connections and never answers: the run ends after the warm-up's
    timeout and a few of the queries' (before: every query waited its timeout, all failed)."""
    from rag_ablate.tracking.store import run_status

    db = tmp_path / "mlflow.db"
    with silent_server() as url:
        t0 = time.monotonic()
        proc = run_in_process(
            [
                *[f"dataset.path={tiny_dataset}", "system=http", f"system.base_url={url}"],
                *["system.timeout_s=0.5", "system.concurrency=1", "progress=false"],
                *[f"tracking.uri=sqlite:///{db}", f"cache.dir={tmp_path / 'cache'}"],
            ],
            tmp_path,
        )
        seconds = time.monotonic() - t0
    assert proc.returncode == EXIT_FAILED, proc.stderr
    assert seconds < 0.5 * (1 + BREAKER_LIMIT) + 15, seconds  # the run, imports and the dataset included
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("rag_ablate: error:")]
    assert f"system endpoint {url} does not answer: 3 requests in a row got no response within 0.5 s" in line
    assert "(system.timeout_s)" in line and "Traceback" not in proc.stderr
    run_dir = next((tmp_path / "outputs" / "runs").iterdir())
    records = [json.loads(x) for x in (run_dir / RECORDS_FILE).read_text(encoding="utf-8").splitlines()]
    # the query that timed out before the breaker opened is kept, as failed
    assert records and all(r["status"] == "timeout" for r in records)
    run_info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    assert run_status(run_info["tracking_uri"], run_info["run_id"]) == "FAILED"  # resume= finishes it


@pytest.mark.slow
def test_a_plan_of_thousands_of_levels_is_checked_for_repeats_in_seconds() -> None:
    """``refuse_repeats`` compared every pair of jobs (a dry run of 3,000 levels printed nothing
    for 300 s: quadratic in the levels); one look-up per job now, and a repeat is still found."""
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.errors import ConfigError
    from rag_ablate.sweep.plan import Job, Plan, refuse_repeats

    n = 1000
    jobs = [Job(i, f"seed={i}", "variant", "seed", str(i), [f"seed={i}"]) for i in range(n)]
    plan = Plan(mode="ofat", dry_run=True, common=[], factors=[], jobs=jobs)
    settings = [RunConfig(seed=i) for i in range(n)]
    # CPU seconds, not wall: a busy machine (2 cores, several suites) stretched a linear check
    # past a wall-clock bound; comparing every pair costs minutes of CPU under any load
    t0 = time.process_time()
    refuse_repeats(plan, settings)
    assert time.process_time() - t0 < 15
    settings[-1] = RunConfig(seed=7)
    with pytest.raises(
        ConfigError, match=r"would run the same settings as level seed=7 of factor seed \(#7\)"
    ):
        refuse_repeats(plan, settings)


def _composer() -> Iterator[Any]:
    from hydra import compose, initialize_config_dir

    from rag_ablate.cli.hydra_app import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        yield lambda overrides: compose("config", overrides=overrides)


@pytest.fixture
def composer() -> Iterator[Any]:
    yield from _composer()


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["seed=7"],
        ["retrieval.hybrid.rrf_k=30", "retrieval.top_k=20"],
        ["+system.body.k=v", "generator.max_sentences=2"],
        ["++retrieval.top_k=5", "seed=${retrieval.top_k}"],  # an interpolation of an override
    ],
)
def test_a_plain_level_is_its_common_config_with_the_values_applied_as_hydra_would(
    composer: Any, extra: list[str]
) -> None:
    from omegaconf import OmegaConf

    from rag_ablate.settings import to_settings
    from rag_ablate.sweep.plan import with_values

    common = ["retrieval=hybrid", "generator=extractive"]
    fast, composed = with_values(composer(common), extra), composer([*common, *extra])
    keys = [str(k) for k in composed if k != "hydra"]
    assert OmegaConf.to_container(OmegaConf.masked_copy(fast, keys)) == OmegaConf.to_container(
        OmegaConf.masked_copy(composed, keys)
    )
    assert to_settings(fast) == to_settings(composed)


def test_a_bad_plain_level_fails_as_composing_it_would(composer: Any) -> None:
    from hydra.errors import HydraException

    from rag_ablate.config.keys import hydra_error_line as one_line
    from rag_ablate.sweep.plan import with_values

    with pytest.raises(HydraException) as fast:
        with_values(composer([]), ["retrieval.top_k=abc"])
    with pytest.raises(HydraException) as composed:
        composer(["retrieval.top_k=abc"])
    assert one_line(fast.value) == one_line(composed.value)
    assert "Value 'abc' of type 'str' could not be converted to Integer" in one_line(fast.value)


@pytest.mark.slow
def test_a_plan_of_plain_levels_composes_the_common_config_once(composer: Any) -> None:
    """A dry run of thousands of levels composed every job with Hydra (~0.2-0.3 s each); plain
    values are now applied to the common config, composed once; a group's level is composed."""
    from rag_ablate.sweep.plan import Factor, Job, Plan, check_plan

    calls: list[list[str]] = []

    def counted(overrides: list[str]) -> Any:
        calls.append(overrides)
        return composer(overrides)

    seeds = [str(i) for i in range(1, 31)]
    jobs = [Job(0, "baseline", "baseline", None, None, [])]
    jobs += [Job(i, f"seed={s}", "variant", "seed", s, [f"seed={s}"]) for i, s in enumerate(seeds, 1)]
    jobs.append(Job(31, "retrieval=dense", "variant", "retrieval", "dense", ["retrieval=dense"]))
    factors = [
        Factor("seed", False, "0", seeds, [f"seed={s}" for s in seeds]),
        Factor("retrieval", True, "bm25", ["dense"], ["retrieval=dense"]),
    ]
    plan = Plan(mode="ofat", dry_run=True, common=[], factors=factors, jobs=jobs)
    settings = check_plan(plan, counted, lambda group: ["bm25", "dense", "hybrid"])
    assert calls == [[], ["retrieval=dense"]]
    assert [s.seed for s in settings[1:31]] == list(range(1, 31))
    assert settings[31].retrieval.method == "dense" and settings[0].retrieval.method == "bm25"
