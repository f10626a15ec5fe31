"""Tracking to a shared MLflow server (``tracking=server tracking.uri=http://host:port``).

A real ``mlflow server`` on 127.0.0.1 (sqlite backend, artifacts uploaded through the server to
its ``--artifacts-destination``); a sweep logs to it, and everything is read back through
MlflowClient from the server. An unreachable server stops a run before any compute.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, free_port, run_in_process, serving, write_dataset
from mlflow.tracking import MlflowClient

from rag_ablate.core.layout import COMPARISON_JSON, METRICS_FILE, RECORDS_FILE, SWEEP_FILE, VARIANT_FILE
from rag_ablate.tracking.tags import PARENT_TAG

ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}


@contextlib.contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """``mlflow server`` with a sqlite store and an artifact root under ``root``; yields its URL.
    The store's tables are copied from this machine's template (``create_sqlite``, as every store
    rag_ablate creates), so the server does not build them through every schema migration."""
    from rag_ablate.tracking.store import create_sqlite

    root.mkdir(parents=True, exist_ok=True)
    create_sqlite(f"sqlite:///{root / 'mlflow.db'}", root / "mlflow.db")
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**ENV, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with serving("mlflow server", cmd, port, root / "server.log", cwd=root, env=env, timeout_s=150):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One ``mlflow server`` for this file's sweeps (its start costs ~10 s of CPU); its URL and root.
    Each test reads back only its own runs."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server(root) as url:
        yield url, root


@pytest.mark.slow
def test_sweep_logs_to_a_tracking_server(tmp_path: Path, server: tuple[str, Path]) -> None:
    url, root = server
    work = tmp_path / "work"
    write_dataset(work / "tiny")
    proc = run_in_process(
        [
            "-m",
            "chunk=8,512",
            "tracking=server",
            f"tracking.uri={url}",
            "dataset=custom",
            "dataset.path=tiny",
            "progress=false",
            "compare.B=200",
        ],
        work,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (sweep,) = (work / "outputs" / "multirun").iterdir()
    info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
    assert info["tracking_uri"] == url

    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    # the experiment keeps the server's artifact root (uploads go through the server)
    assert exp.artifact_location.startswith("mlflow-artifacts:")
    parent = client.get_run(info["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["sweep/n_variants"] == 2.0
    children = client.search_runs([exp.experiment_id], f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["variant"] for r in children) == ["baseline", "chunk=8"]
    assert all(r.info.status == "FINISHED" for r in children)

    by_label = {r.data.tags["variant"]: r for r in children}
    for job in (sweep / "0", sweep / "1"):
        label = json.loads((job / VARIANT_FILE).read_text(encoding="utf-8"))["label"]
        run = by_label[label]
        on_disk = json.loads((job / METRICS_FILE).read_text(encoding="utf-8"))
        # every per-split metric the run logs is the job's number (the all/ split stays on disk)
        logged = {k: v for k, v in run.data.metrics.items() if k.startswith(("dev/", "holdout/"))}
        assert {"holdout/recall_at_5", "dev/ndcg_at_10", "holdout/context_tokens_at_5"} <= set(logged)
        assert logged == {k: pytest.approx(on_disk[k], rel=1e-12) for k in logged}
        # the records, read back through the server, are the job's file byte for byte
        arts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert RECORDS_FILE in arts
        got = Path(client.download_artifacts(run.info.run_id, RECORDS_FILE, str(tmp_path / label)))
        assert got.read_bytes() == (job / RECORDS_FILE).read_bytes()
    got = Path(client.download_artifacts(parent.info.run_id, COMPARISON_JSON, str(tmp_path / "parent")))
    assert json.loads(got.read_text()) == json.loads((sweep / COMPARISON_JSON).read_text())

    # stored by the server, under its artifact root; nothing tracked on the client's disk
    assert any(info["parent_run_id"] in p.parts for p in (root / "artifacts").rglob(COMPARISON_JSON))
    assert not (work / "outputs" / "mlflow.db").exists() and not (work / "outputs" / "mlartifacts").exists()


@pytest.mark.slow
def test_unreachable_server_stops_the_run_before_any_compute(tmp_path: Path) -> None:
    write_dataset(tmp_path / "tiny")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    proc = run_in_process(
        ["tracking=server", f"tracking.uri={url}", "dataset=custom", "dataset.path=tiny"], tmp_path
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"rag_ablate: error: MLflow server {url} is not reachable: ")
    assert "Connection refused" in lines[0]
    assert not list(tmp_path.rglob(RECORDS_FILE)) and not list(tmp_path.rglob(METRICS_FILE))


@pytest.mark.slow
def test_server_without_uri_uses_mlflow_tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracking=server`` alone reads MLflow's own MLFLOW_TRACKING_URI; it never falls back to
    the local sqlite store (a forgotten uri must not log somewhere else unnoticed)."""
    write_dataset(tmp_path / "tiny")
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    proc = run_in_process(["tracking=server", "dataset=custom", "dataset.path=tiny"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"rag_ablate: error: MLflow server {url} is not reachable: ")
    assert not (tmp_path / "outputs" / "mlflow.db").exists() and not list(tmp_path.rglob(RECORDS_FILE))


# --------------------------------------------------------------------------- a server that goes silent


class GoingSilentProxy:
    """A TCP proxy on 127.0.0.1 to ``upstream`` that forwards until a request holds ``trigger``,
    then reads every request and answers none: a tracking server that stops answering
    mid-sweep, at a known point."""

    def __init__(self, upstream: str, trigger: bytes) -> None:
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.trigger = trigger
        self.silent = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client = self.listener.accept()[0]
                self.conns.append(client)
                if self.silent.is_set():
                    continue  # held open, never answered
                server = socket.create_connection(self.upstream)
                self.conns.append(server)
                threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if requests and self.trigger in data:
                    self.silent.set()
                if requests and self.silent.is_set():
                    continue  # read, never forwarded: the client waits for an answer
                dst.sendall(data)

    def close(self) -> None:
        self.listener.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


@pytest.mark.slow
def test_a_tracking_server_that_stops_answering_mid_sweep_ends_it_within_the_budget(
    tmp_path: Path, server: tuple[str, Path]
) -> None:
    """Issue 23: the sweep ends within ``tracking.timeout_s`` (plus slack) with lines naming the
    store's URI, exit 1, the records on disk kept."""
    url, _ = server
    write_dataset(tmp_path / "tiny")
    # silent from the baseline's first logging at its end: its queries have run
    proxy = GoingSilentProxy(url, b"/runs/log-batch")
    try:
        t0 = time.monotonic()
        proc = run_in_process(
            [
                *["-m", "chunk=8,512", "tracking=server", f"tracking.uri={proxy.url}"],
                *["tracking.timeout_s=3", "dataset=custom", "dataset.path=tiny", "progress=false"],
                "compare.B=100",
            ],
            tmp_path,
        )
        seconds = time.monotonic() - t0
    finally:
        proxy.close()
    assert proxy.silent.is_set(), proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stderr[-3000:]
    # MLflow's defaults hung here for 10 minutes or more; now: one budget, then every call fails at once
    assert seconds < 3 + 30, seconds
    down = f"MLflow tracking store {proxy.url} did not answer within 3 s (tracking.timeout_s)"
    assert down in proc.stderr
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    assert json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))["tracking_uri"] == proxy.url
    assert (sweep / "0" / RECORDS_FILE).is_file()  # the baseline's queries ran and are kept
    failures = json.loads((sweep / "failures.json").read_text(encoding="utf-8"))
    assert failures["failed"] and all(down in f["error"] for f in failures["failures"] if f["step"] == "job")
