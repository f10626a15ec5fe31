"""A pinned baseline across commits: a sweep's variants compared with an earlier run (a run folder, a
sweep's job folder, a sweep folder, an MLflow run id), the gate on that comparison, and the refusal of
a run made on another corpus or query set (README "CI: does this commit regress against main?")."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, rag_ablate_cli, run_module, write_dataset

pytestmark = pytest.mark.slow  # each test runs the command line over real runs

RULE = "holdout/recall_at_5:-0.02"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """main's run (the embedded sample, defaults), this commit's sweep (top_k 10 as main, and 1)
    pinned to it with compare.baseline_run, and a run on another dataset."""
    cwd = tmp_path_factory.mktemp("pinned")
    # no test here reads the per-query traces (test_mlflow_traces.py does): none logged
    main = run_module("rag_ablate", ["progress=false", "tracking.traces=none"], cwd)
    assert main.returncode == 0, main.stderr[-3000:]
    (main_dir,) = (cwd / "outputs" / "runs").iterdir()
    args = ["-m", "retrieval.top_k=1,10", "progress=false", "compare.B=500", "tracking.traces=none"]
    args.append(f"compare.baseline_run={main_dir}")
    # no test here reads latency: the interleaved timing pass after the jobs is off
    sweep = run_module("rag_ablate", [*args, "timing.interleave=false"], cwd)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    (sweep_dir,) = (cwd / "outputs" / "multirun").iterdir()
    other = cwd / "elsewhere"
    other.mkdir()
    tiny = run_module("rag_ablate", [f"dataset.path={write_dataset(cwd / 'tiny')}", "progress=false"], other)
    assert tiny.returncode == 0, tiny.stderr[-3000:]
    (tiny_dir,) = (other / "outputs" / "runs").iterdir()
    run_id = json.loads((main_dir / "summary.json").read_text())["run_id"]
    found = {"main": main_dir, "run_id": run_id, "sweep": sweep_dir, "tiny": tiny_dir}
    return {"cwd": cwd, "proc": sweep, **found}


def _rows(comparison: dict[str, Any], variant: str, metric: str) -> list[dict[str, Any]]:
    return [r for r in comparison["rows"] if r["variant"] == variant and r["metric"] == metric]


def _compare(runs: dict[str, Any], *args: str) -> tuple[Any, dict[str, Any]]:
    proc = rag_ablate_cli(["compare", str(runs["sweep"]), "--B", "500", *args], runs["cwd"])
    path = runs["sweep"] / "pinned" / "comparison.json"
    return proc, json.loads(path.read_text()) if path.is_file() else {}


def test_the_sweep_compares_every_job_with_the_pinned_run(runs: dict[str, Any]) -> None:
    data = json.loads((runs["sweep"] / "comparison.json").read_text())
    assert data["baseline"] == f"pinned:{runs['main'].name}"
    assert data["variants"] == ["baseline", "retrieval.top_k=1"]  # the sweep's own baseline too
    same = _rows(data, "baseline", "recall_at_5")  # main's config again: no effect
    assert len(same) == 2 and all(r["effect"] == 0.0 for r in same)
    worse = _rows(data, "retrieval.top_k=1", "recall_at_5")
    assert all(r["effect"] < -0.2 and r["significant"] for r in worse)
    assert f"comparison against baseline 'pinned:{runs['main'].name}'" in runs["proc"].stdout
    info = json.loads((runs["sweep"] / "sweep.json").read_text())
    assert info["baseline_run"] == str(runs["main"].resolve())
    # the report is drawn again with the pinned run, and compare without options pins it again
    report = rag_ablate_cli(["report", str(runs["sweep"])], runs["cwd"])
    assert report.returncode == 0, report.stderr
    again = rag_ablate_cli(["compare", str(runs["sweep"]), "--B", "500"], runs["cwd"])
    assert again.returncode == 0 and f"baseline 'pinned:{runs['main'].name}'" in again.stdout
    # --baseline names a variant of the sweep instead: its own baseline
    own = rag_ablate_cli(["compare", str(runs["sweep"]), "--B", "500", "--baseline", "baseline"], runs["cwd"])
    assert own.returncode == 0 and "comparison against baseline 'baseline'" in own.stdout


@pytest.mark.parametrize("form", ["run folder", "mlflow run id", "sweep folder", "job folder"])
def test_compare_against_an_earlier_run_and_gate(runs: dict[str, Any], form: str) -> None:
    ref, name = {
        "run folder": (str(runs["main"]), runs["main"].name),
        "mlflow run id": (runs["run_id"], runs["run_id"]),
        "sweep folder": (str(runs["sweep"]), runs["sweep"].name),  # its baseline job
        "job folder": (str(runs["sweep"] / "0"), f"{runs['sweep'].name}/0"),
    }[form]
    before = (runs["sweep"] / "comparison.json").read_text()
    proc, data = _compare(runs, "--baseline-run", ref, "--fail-on", RULE)
    assert proc.returncode == 3, proc.stderr[-2000:]  # the gate blocked
    assert data["baseline"] == f"pinned:{name}" and data["variants"] == ["baseline", "retrieval.top_k=1"]
    assert all(r["effect"] == 0.0 for r in _rows(data, "baseline", "recall_at_5"))
    blocked = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip().startswith("BLOCK ")]
    assert len(blocked) == 1 and blocked[0].startswith(f"BLOCK retrieval.top_k=1 {RULE}: effect -0.")
    assert (runs["sweep"] / "pinned" / "report.html").is_file()
    assert (runs["sweep"] / "comparison.json").read_text() == before  # the sweep's own is kept


def test_a_run_on_another_dataset_is_refused(runs: dict[str, Any]) -> None:
    proc, _ = _compare(runs, "--baseline-run", str(runs["tiny"]), "--fail-on", RULE)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"rag-ablate: error: the pinned baseline pinned:{runs['tiny'].name} (")
    assert "ran on another corpus than baseline (corpus_fingerprint " in line
    assert "dataset tiny vs sample" in line and "cannot be paired" in line


def test_two_baselines_are_refused(runs: dict[str, Any]) -> None:
    proc, _ = _compare(runs, "--baseline-run", str(runs["main"]), "--baseline", "baseline")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("rag-ablate: error: compare.baseline (baseline, a variant")


def test_readme_ci_recipe_runs_as_written(tmp_path: Path) -> None:
    """README's CI recipe, line by line, in a fresh folder: main's run, the pull request's sweep, the gate."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("**CI: does this commit regress against main?**") :]
    start = section.index("```bash\n") + 8
    block = section[start : section.index("\n```", start)]
    commands = [shlex.split(ln) for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [c[:3] for c in commands] == [["python", "-m", "rag_ablate"]] * 2 + [
        ["rag-ablate", "compare", "ci/pr"]
    ]
    for cmd in commands:
        if cmd[0] == "python":
            proc = run_module("rag_ablate", cmd[3:], tmp_path)
        else:
            proc = rag_ablate_cli(cmd[1:], tmp_path)
        assert proc.returncode == 0, (cmd, proc.stderr[-3000:])
    assert "regression gate passed (1 rule(s))" in proc.stdout
    data = json.loads((tmp_path / "ci" / "pr" / "pinned" / "comparison.json").read_text())
    assert data["baseline"] == "pinned:main" and data["variants"] == ["baseline", "retrieval.top_k=20"]
