"""How long the MLflow UI takes to serve its first page: ``mlflow ui`` against ``rag-ablate ui``.

    python benchmarks/bench_ui_start.py STORE_FOLDER [--repeat 3]

STORE_FOLDER holds ``outputs/mlflow.db`` (a sweep's folder). Each start, the two commands taking
turns: the seconds until ``/`` answers 200 and a first API call (the experiments search the page
makes) returns, and the CPU seconds the server's processes spent by then (``/proc``, every process
of its session). ``mlflow ui`` is what ``rag-ablate ui`` ran before (one worker, no job-execution
workers); ``rag-ablate ui`` now serves MLflow's app in its own process.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(sid: int) -> float:
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # field 6, the session id
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def _answers(url: str, data: bytes | None = None) -> bool:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start(cmd: list[str], port: int, cwd: Path) -> tuple[float, float]:
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        while not _answers(base + "/"):
            time.sleep(0.05)
        search = base + "/ajax-api/2.0/mlflow/experiments/search"
        while not _answers(search, b'{"max_results": 1}'):
            time.sleep(0.05)
        return time.perf_counter() - t0, _cpu_seconds(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=5791)
    args = ap.parse_args()
    uri = f"sqlite:///{(args.folder / 'outputs' / 'mlflow.db').resolve()}"
    port = str(args.port)
    mlflow_ui = ["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", port]
    commands = {
        "mlflow ui --workers 1": [sys.executable, "-m", *mlflow_ui, "--workers", "1"],
        "rag-ablate ui": [sys.executable, "-m", "rag_ablate.cli.main", "ui", "--port", port],
    }
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeat):
        for name, cmd in commands.items():
            seen[name].append(start(cmd, args.port, args.folder))
    load = os.getloadavg()[0]
    print(f"| command | first page + API, s (median of {args.repeat}) | runs | CPU s | load |")
    print("|---|---:|---|---:|---:|")
    for name, runs in seen.items():
        walls = ", ".join(f"{w:.1f}" for w, _ in runs)
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| `{name}` | {wall:.1f} | {walls} | {cpu:.1f} | {load:.1f} |")


if __name__ == "__main__":
    main()
