"""A published ablation on real data, with reference-tool cross-checks (issue 6).

1. Imports COVID-QA (SQuAD format) and ClapNQ dev with ``rag-ablate import``.
2. Runs, with the comparison step, on COVID-QA a chunk-size study
   (``chunk=128,256,512,1024``) and a retrieval study (``retrieval=bm25,dense,hybrid``),
   and on ClapNQ the retrieval study.
3. Cross-checks every retrieval metric of every run against ranx and pytrec_eval,
   per query, on the TREC files the runs exported (max absolute difference), and
   times the three on the same runs (ranx warm: after its numba compile).
4. Times the comparison's bootstrap against ``scipy.stats.bootstrap`` on the same
   per-query differences.

Prints markdown for benchmarks/RESULTS.md. Needs ``../shared/data`` beside the repo.

    python benchmarks/real_ablation.py [--data ../shared/data] [--out /tmp/rag_ablate_real]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KS = (1, 3, 5, 10)


def sh(args: list[str], env_extra: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        args, capture_output=True, text=True, check=False, env={**os.environ, **(env_extra or {})}
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(args)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout


def sweep(dataset: Path, factors: list[str], out: Path) -> tuple[float, Path]:
    before = set((out / "multirun").iterdir()) if (out / "multirun").is_dir() else set()
    wall, _ = sh(
        [
            sys.executable,
            "-m",
            "rag_ablate",
            "-m",
            f"dataset.path={dataset}",
            *factors,
            f"paths.output_root={out}",
            "progress=false",
        ]
    )
    (new,) = set((out / "multirun").iterdir()) - before
    return wall, new


def comparison_table(sweep_dir: Path, metrics: tuple[str, ...]) -> str:
    data = json.loads((sweep_dir / "comparison.json").read_text())
    lines = [
        "| variant | metric | split | baseline | variant | effect [95% CI] | p | p_adj | groups |",
        "|---|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for r in data["rows"]:
        if r["metric"] not in metrics:
            continue
        mark = {"better": " (better)", "worse": " (worse)"}.get(r["verdict"], "")
        lines.append(
            f"| {r['variant']} | {r['metric']} | {r['split']} | {r['baseline_mean']:.3f} | {r['variant_mean']:.3f} "
            f"| {r['effect']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['p_value']:.4f} "
            f"| {r['p_adjusted']:.4f}{mark} | {r['n_groups']} |"
        )
    return "\n".join(lines)


def summary_table(sweep_dir: Path) -> str:
    lines = [
        "| variant | dev recall@5 | holdout recall@5 | dev nDCG@10 | holdout nDCG@10 | dev evidence_recall@5 "
        "| context tokens@5 | p95 ms | run s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in sorted(sweep_dir.glob("*/summary.json")):
        s = json.loads(p.read_text())
        m = s["metrics"]
        lines.append(
            f"| {s['label']} | {m['dev/recall_at_5']:.3f} | {m['holdout/recall_at_5']:.3f} | {m['dev/ndcg_at_10']:.3f} "
            f"| {m['holdout/ndcg_at_10']:.3f} | {m.get('dev/evidence_recall_at_5', float('nan')):.3f} "
            f"| {m['all/context_tokens_at_5']:.0f} | {m['all/latency_ms_p95']:.1f} | {m['run/wall_seconds']:.1f} |"
        )
    return "\n".join(lines)


def cross_check(sweep_dirs: list[Path]) -> str:
    """Our per-query values against ranx and pytrec_eval on the exported TREC files; timings."""
    import pytrec_eval
    from ranx import Qrels, Run
    from ranx import evaluate as rx_evaluate

    from rag_ablate.metrics.retrieval import retrieval_metrics
    from rag_ablate.records.jsonl import read_records

    warnings.filterwarnings("ignore", category=Warning, module="numba")
    ours_names = {
        "hit": ("hit_rate@{k}", "success_{k}"),
        "recall": ("recall@{k}", "recall_{k}"),
        "precision": ("precision@{k}", "P_{k}"),
        "ndcg": ("ndcg_burges@{k}", None),
        "mrr": ("mrr@{k}", None),
    }
    max_rx = max_pt = 0.0
    n_values = 0
    t_ours = t_rx = t_pt = 0.0
    n_queries = 0
    for sd in sweep_dirs:
        for job in sorted(p.parent for p in sd.glob("*/run.trec")):
            records = [
                r
                for r in read_records(job / "records.jsonl")
                if r["kind"] == "answerable" and r["status"] == "ok"
            ]
            qrels_by_q: dict[str, dict[str, int]] = {}
            for line in (job / "qrels.trec").read_text().split("\n"):
                if line.strip():
                    q, _, d, g = line.split()
                    qrels_by_q.setdefault(q, {})[d] = int(g)
            run_by_q: dict[str, dict[str, float]] = {}
            for line in (job / "run.trec").read_text().split("\n"):
                if line.strip():
                    q, _, d, _rank, score, _ = line.split()
                    run_by_q.setdefault(q, {})[d] = float(score)
            ranked = {r["query_id"]: [x["doc_id"] for x in r["retrieved"]] for r in records}
            n_queries += len(records)

            t0 = time.perf_counter()
            ours = {q: retrieval_metrics(ranked[q], qrels_by_q[q], KS) for q in ranked}
            t_ours += time.perf_counter() - t0

            qrels, run = Qrels(qrels_by_q), Run({q: run_by_q.get(q, {}) for q in qrels_by_q})
            rx_metrics = [tmpl.format(k=k) for tmpl, _ in ours_names.values() for k in KS]
            rx_evaluate(
                qrels, run, rx_metrics, return_mean=False, make_comparable=True
            )  # compile (not timed)
            t0 = time.perf_counter()
            rx = rx_evaluate(qrels, run, rx_metrics, return_mean=False, make_comparable=True)
            t_rx += time.perf_counter() - t0
            qids = sorted(qrels_by_q)
            for base, (rx_t, _) in ours_names.items():
                for k in KS:
                    vals = rx[rx_t.format(k=k)]
                    for i, q in enumerate(qids):
                        max_rx = max(max_rx, abs(vals[i] - ours[q][f"{base}_at_{k}"]))
                        n_values += 1

            # pytrec_eval: ndcg with 2^g - 1 gains by re-grading the qrels; mrr cut to k by cutting the run
            pt_measures = {
                f"success.{','.join(map(str, KS))}",
                f"recall.{','.join(map(str, KS))}",
                f"P.{','.join(map(str, KS))}",
            }
            regraded = {q: {d: 2**g - 1 for d, g in rel.items()} for q, rel in qrels_by_q.items()}
            t0 = time.perf_counter()
            res = pytrec_eval.RelevanceEvaluator(qrels_by_q, pt_measures).evaluate(run_by_q)
            res_ndcg = pytrec_eval.RelevanceEvaluator(
                regraded, {f"ndcg_cut.{','.join(map(str, KS))}"}
            ).evaluate(run_by_q)
            t_pt += time.perf_counter() - t0
            for q, m in res.items():
                for k in KS:
                    max_pt = max(
                        max_pt,
                        abs(m[f"success_{k}"] - ours[q][f"hit_at_{k}"]),
                        abs(m[f"recall_{k}"] - ours[q][f"recall_at_{k}"]),
                        abs(m[f"P_{k}"] - ours[q][f"precision_at_{k}"]),
                        abs(res_ndcg[q][f"ndcg_cut_{k}"] - ours[q][f"ndcg_at_{k}"]),
                    )
    return "\n".join(
        [
            f"{n_values:,} per-query values ({n_queries:,} query rankings x {len(ours_names)} measures x {len(KS)} k):",
            "",
            "| reference | max abs difference | time for the same work (s) | ratio to rag_ablate |",
            "|---|---:|---:|---:|",
            f"| rag_ablate `retrieval_metrics` (all 6 measures) | - | {t_ours:.3f} | 1.0x |",
            f"| ranx 0.3.21 `evaluate`, warm (5 measures) | {max_rx:.2e} | {t_rx:.3f} | {t_rx / t_ours:.2f}x |",
            f"| pytrec_eval 0.5.11 (hit, recall, P, nDCG) | {max_pt:.2e} | {t_pt:.3f} | {t_pt / t_ours:.2f}x |",
        ]
    )


def bootstrap_timing(sweep_dir: Path) -> str:
    from scipy import stats as sps

    from rag_ablate.compare import stats
    from rag_ablate.records.jsonl import read_records

    jobs = sorted(p.parent for p in sweep_dir.glob("*/records.jsonl"))
    base = {r["query_id"]: r for r in read_records(jobs[0] / "records.jsonl")}
    var = {r["query_id"]: r for r in read_records(jobs[1] / "records.jsonl")}
    names = ["recall_at_5", "ndcg_at_10", "mrr_at_10", "evidence_recall_at_5", "hit_at_5"]
    qids = [q for q in base if all(base[q]["metrics"].get(m) is not None for m in names)]
    b = np.array([[base[q]["metrics"][m] for m in names] for q in qids])
    v = np.array([[var[q]["metrics"][m] for m in names] for q in qids])
    groups = np.array([base[q]["group"] for q in qids])
    t0 = time.perf_counter()
    res = stats.paired_test(b, v, groups, B=10_000, seed=0)
    t_ours = time.perf_counter() - t0
    d = v - b
    t0 = time.perf_counter()
    for j in range(d.shape[1]):
        sps.bootstrap(
            (d[:, j],),
            np.mean,
            n_resamples=10_000,
            method="percentile",
            batch=250,
            random_state=np.random.default_rng(0),
            vectorized=True,
        )
    t_sp = time.perf_counter() - t0
    return (
        f"{len(qids)} queries in {res.n_groups} groups x {len(names)} metrics x 10,000 resamples: rag_ablate "
        f"`paired_test` (group bootstrap + group sign-flip) {t_ours:.3f} s; `scipy.stats.bootstrap` (query-level "
        f"bootstrap only, per metric) {t_sp:.3f} s; ratio {t_sp / t_ours:.1f}x."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", default="/tmp/rag_ablate_real")
    a = ap.parse_args()
    data, out = Path(a.data), Path(a.out)
    if not (data / "covid-qa").is_dir():
        sys.exit(f"no data at {data}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cli = [sys.executable, "-m", "rag_ablate.cli.main"]
    t_imp_c, imp_c = sh(
        [*cli, "import", "squad", str(data / "covid-qa" / "200423_covidQA.json"), str(out / "covid")]
    )
    t_imp_n, imp_n = sh([*cli, "import", "clapnq", str(data / "clapnq-dev"), str(out / "clapnq")])

    runs = out / "runs"
    t_chunk, chunk_dir = sweep(out / "covid", ["chunk=128,256,512,1024"], runs)
    t_ret, ret_dir = sweep(out / "covid", ["retrieval=bm25,dense,hybrid"], runs)
    t_cl, cl_dir = sweep(out / "clapnq", ["retrieval=bm25,dense,hybrid"], runs)

    metrics = ("recall_at_5", "ndcg_at_10", "evidence_recall_at_5")
    print(f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print("- command: `python benchmarks/real_ablation.py` (needs ../shared/data)\n")
    print(
        f"### Imports\n\nCOVID-QA ({t_imp_c:.1f} s):\n```\n{imp_c.strip()}\n```\n"
        f"ClapNQ dev ({t_imp_n:.1f} s):\n```\n{imp_n.strip()}\n```\n"
    )
    print(f"### COVID-QA: chunk-size study ({t_chunk:.0f} s)\n\n{summary_table(chunk_dir)}\n")
    print(comparison_table(chunk_dir, metrics) + "\n")
    print(f"### COVID-QA: retrieval study ({t_ret:.0f} s)\n\n{summary_table(ret_dir)}\n")
    print(comparison_table(ret_dir, metrics) + "\n")
    print(
        f"### ClapNQ dev (answerable questions): retrieval study ({t_cl:.0f} s)\n\n{summary_table(cl_dir)}\n"
    )
    print(comparison_table(cl_dir, ("recall_at_5", "ndcg_at_10")) + "\n")
    print("### Cross-checks against ranx and pytrec_eval (every run above)\n")
    print(cross_check([chunk_dir, ret_dir, cl_dir]) + "\n")
    print("### Bootstrap time against scipy\n")
    print(bootstrap_timing(chunk_dir))
    info: dict[str, Any] = {"chunk": str(chunk_dir), "retrieval": str(ret_dir), "clapnq": str(cl_dir)}
    print(f"\n(sweep folders: {json.dumps(info)})")


if __name__ == "__main__":
    main()
