"""A BM25 run imports only what it uses: no torch, sentence-transformers, matplotlib or httpx.

Checked on a real ``python -m rag_ablate`` run in a subprocess: the modules the process
had loaded when it ended are written out at exit and read back here.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_dataset

from rag_ablate.core.layout import PROFILE_FILE, RECORDS_FILE

pytestmark = pytest.mark.slow  # each test runs python -m rag_ablate in a fresh process

# runs rag_ablate as `python -m rag_ablate` does, and writes sys.modules at exit (also after sys.exit)
ENTRY = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
runpy.run_module("rag_ablate", run_name="__main__", alter_sys=True)
"""

HEAVY = ("torch", "sentence_transformers", "matplotlib", "httpx", "httpx_sse")


def _run_and_list_modules(
    tmp_path: Path, *overrides: str, env_extra: dict[str, str] | None = None
) -> tuple[set[str], Path]:
    write_dataset(tmp_path / "tiny")
    listing = tmp_path / "modules.json"
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", **(env_extra or {})}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            ENTRY,
            str(listing),
            "dataset=custom",
            "dataset.path=tiny",
            "progress=false",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return set(json.loads(listing.read_text(encoding="utf-8"))), run_dir


def _top(modules: set[str]) -> set[str]:
    return {m.split(".", 1)[0] for m in modules}


@pytest.mark.parametrize("writer", ["1", "0"])
def test_bm25_run_with_mlflow_imports_no_torch_matplotlib_or_httpx(tmp_path: Path, writer: str) -> None:
    """With the background writer (RAG_ABLATE_MLFLOW_WRITER, the default) the run's own process never
    imports MLflow, and the run is in MLflow all the same; without it MLflow's imports bring none."""
    modules, run_dir = _run_and_list_modules(tmp_path, env_extra={"RAG_ABLATE_MLFLOW_WRITER": writer})
    assert (run_dir / RECORDS_FILE).is_file() and (run_dir / PROFILE_FILE).is_file()
    # the run did retrieve with BM25 and log to MLflow: the absence below is not a run that did nothing
    run_id = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["run_id"]
    db = sqlite3.connect(tmp_path / "outputs" / "mlflow.db")
    assert db.execute("SELECT status FROM runs WHERE run_uuid = ?", (run_id,)).fetchall() == [("FINISHED",)]
    db.close()
    if writer == "1":
        assert not _top(modules) & {"mlflow", "sqlalchemy", "pandas", "alembic"}
    else:
        assert "mlflow" in _top(modules)
    assert {"rag_ablate.pipeline.retrievers.bm25", "rag_ablate.pipeline.bm25"} <= modules
    assert not _top(modules) & set(HEAVY), sorted(_top(modules) & set(HEAVY))


def test_bm25_run_without_tracking_imports_no_mlflow(tmp_path: Path) -> None:
    modules, run_dir = _run_and_list_modules(tmp_path, "tracking=none")
    assert (run_dir / RECORDS_FILE).is_file()
    assert "rag_ablate.pipeline.bm25" in modules  # it built a BM25 index (a fresh cache)...
    # ...with its own formulas: bm25s (and the numba it imports) are not loaded
    assert not _top(modules) & {*HEAVY, "mlflow", "pandas", "sqlalchemy", "alembic", "bm25s", "numba"}
    # nor what only system=http (asyncio), a tracking server (urllib's client) or a sweep's comparison
    # needs (a compare section at its defaults passes its checks without them)
    unused = {"asyncio", "urllib.request", "http.client", "rag_ablate.compare.model"}
    unused |= {"rag_ablate.compare.tradeoff"}
    assert not modules & unused, sorted(modules & unused)


GC_ENTRY = """
import atexit, gc, json, runpy, sys
out = sys.argv.pop(1)
seen = {}
import rag_ablate.core.profiling as profiling
claim = profiling.claim_startup
def claimed():
    seen["before"] = gc.isenabled()
    result = claim()
    seen["after"], seen["frozen"] = gc.isenabled(), gc.get_freeze_count()
    return result
profiling.claim_startup = claimed
atexit.register(lambda: open(out, "w").write(json.dumps({**seen, "exit": gc.isenabled()})))
runpy.run_module("rag_ablate", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("args", [["dataset.path=tiny"], ["dataset.path=tiny", "retrieval=nope"]])
def test_the_collector_is_off_during_start_up_and_frozen_out_of_what_it_made(
    tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m rag_ablate`` runs its start-up (imports, Hydra, the config's checks) without the
    cyclic collector; the first job turns it on with the start-up's objects frozen. A command that
    ends before any job (a bad config) turns it on too; a call from Python leaves it alone."""
    write_dataset(tmp_path / "tiny")
    listing = tmp_path / "gc.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-c", GC_ENTRY, str(listing), *args, "tracking=none", "progress=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    seen = json.loads(listing.read_text(encoding="utf-8"))
    if "retrieval=nope" in args:
        assert proc.returncode == 2 and seen == {"exit": True}, (proc.stderr[-2000:], seen)
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seen["before"] is False and seen["after"] is True and seen["exit"] is True
    assert seen["frozen"] > 50_000  # modules, classes, functions and configs of the start-up

    import gc

    from rag_ablate.__main__ import main

    monkeypatch.setattr(sys, "argv", ["rag_ablate"])  # the command sets Hydra's command line there
    assert gc.isenabled()
    with pytest.raises(SystemExit):
        main(["retrieval=nope"], startup=True)
    assert gc.isenabled()


def test_mlflow_telemetry_is_off_unless_the_user_sets_it() -> None:
    """MLflow's usage telemetry would reach the internet from every run: off by default."""
    code = "import os, rag_ablate.tracking.store; print(os.environ['MLFLOW_DISABLE_TELEMETRY'])"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DISABLE_TELEMETRY"}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "true"
    env["MLFLOW_DISABLE_TELEMETRY"] = "false"  # the user's own choice is kept
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "false"
