"""Two sweeps started at the same moment into one ``outputs/`` (one MLflow database, one cache).

Both must finish, each in a folder of its own; each comparison must read only its own variants,
each parent run must hold only its own children, and the shared cache and database must stay
readable afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_in_process, write_dataset

from rag_ablate.core.layout import COMPARISON_JSON, SWEEP_FILE


@pytest.mark.slow
def test_two_sweeps_at_once_into_one_output_folder(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    write_dataset(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    common = ["dataset=custom", "dataset.path=tiny", "progress=false", "compare.B=200"]
    factors = {"a": "chunk=128,1024", "b": "chunk=256,1024"}  # both build chunk=1024 (one cache entry)
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "rag_ablate", "-m", factor, *common],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, factor in factors.items()
    }
    outs = {name: p.communicate(timeout=600) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, outs[name][1][-3000:]

    sweeps = sorted((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 2
    seen: dict[str, set[str]] = {}
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    for sweep in sweeps:
        # each sweep got its own folder (started in the same second), its jobs wrote into it, and
        # nothing failed
        assert (sweep / "0" / "records.jsonl").is_file() and (sweep / "plan.json").is_file()
        assert json.loads((sweep / "failures.json").read_text()) == {"failed": False, "failures": []}
        comparison = json.loads((sweep / COMPARISON_JSON).read_text(encoding="utf-8"))
        variants = {row["variant"] for row in comparison["rows"]}
        seen[" ".join(sorted(variants))] = variants
        info = json.loads((sweep / SWEEP_FILE).read_text(encoding="utf-8"))
        parent = client.get_run(info["parent_run_id"])
        assert parent.info.status == "FINISHED"
        children = client.search_runs(
            [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
        )
        # each parent holds its own baseline and variants, nothing of the other sweep
        assert sorted(r.data.tags["variant"] for r in children) == sorted(["baseline", *variants])
        assert all(r.info.status == "FINISHED" for r in children)
    assert sorted(seen) == ["chunk=1024 chunk=128", "chunk=1024 chunk=256"]

    # the shared cache is whole: a third run of a size both sweeps built is served from it
    third = run_in_process(["chunk=1024", *common], tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    (job,) = [d for d in (tmp_path / "outputs" / "runs").iterdir()]
    metrics = json.loads((job / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["run/cache_bm25_hits"] >= 1 and metrics["run/cache_bm25_misses"] == 0
