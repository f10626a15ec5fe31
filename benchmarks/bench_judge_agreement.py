"""The pairwise judge against people: RAGChecker's meta-evaluation set (issue 27 item 3).

Imports ``../shared/data/ragchecker-meta`` (``rag-ablate import ragchecker-meta``; or takes an
imported folder with ``--dataset``), picks ``--limit`` instances spread evenly over the file
(every k-th; the source datasets come in blocks, so the subset covers them all), and asks the
project's pairwise judge (``judge.mode=pairwise``: :meth:`OpenAIJudge.pairwise`, the input of
:func:`rag_ablate.judges.calibration.judge_input`) which of the two systems' answers is better,
in both orders, with the systems' names hidden. The two answers with the same text are a tie
without asking (as in the comparison step).

Per instance, the judge's preference of model2 over model1 is the sum of its two order
verdicts (+1 an order picked model2, -1 model1, 0 tie): -2..+2, the humans' scale. A failed
judgement is a NaN, replaced by the median; the scores are then rescaled linearly to [-2, 2].
This is the normalisation of upstream's meta_eval.py (SOURCE.txt), which leaves Pearson and
Spearman unchanged apart from the filled NaNs.

Reported, x100 as upstream, for each labelled aspect (correctness, completeness, overall):
Pearson and Spearman of the judge against annotator 1, annotator 2, and both pooled (each
instance's score paired with both labels, as upstream's figures are computed); the human-human
agreement (annotator 1 against 2) on the same subset and on all instances; upstream's published
figures on all 280 instances (SOURCE.txt). And the judge's position bias: the share of instances
whose two orders disagree, the share of decided order verdicts that picked the answer shown
first, wins/losses/ties with the net win rate of model2, the wall time and tokens per second.

    # the local model (the [local-llm] extra; starts llama_cpp.server on 127.0.0.1:--port):
    nice -n 10 python benchmarks/bench_judge_agreement.py --local --limit 20
    # a hosted OpenAI-compatible model: any judge.* override of conf/judge/openai.yaml
    OPENAI_API_KEY=... python benchmarks/bench_judge_agreement.py --limit 140 \\
        judge.base_url=https://api.openai.com/v1 judge.model=gpt-4o-mini judge.api_key_env=OPENAI_API_KEY

Judgements go through the model-call cache (``<out>/cache``): a rerun asks only what is missing.
Writes ``<out>/result.json`` (figures) and ``<out>/judgements.jsonl`` (one line per instance).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as sps

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "data" / "ragchecker-meta"
ASPECTS = ("correctness", "completeness", "overall")
# SOURCE.txt: Pearson x100 on all 280 instances (upstream's normalisation)
PUBLISHED = {
    "ragchecker_vs_humans": {"correctness": 49.7, "completeness": 60.7, "overall": 61.9},
    "human_vs_human": {"correctness": 63.7, "completeness": 71.9, "overall": 70.1},
}


# --------------------------------------------------------------------------- the figures


def votes(verdicts: Sequence[str | None]) -> float:
    """The judge's preference of model2 (shown as answer "b") over model1 ("a"): the sum of its
    order verdicts, -2..2; NaN when an order has no verdict (a judge error)."""
    if not verdicts or any(v is None for v in verdicts):
        return math.nan
    return float(sum({"b": 1, "a": -1, "tie": 0}[str(v)] for v in verdicts))


def normalise(scores: Sequence[float]) -> np.ndarray:
    """Upstream meta_eval.py's normalisation: NaN -> the median, then linear onto [-2, 2] (left as
    is when all scores are equal)."""
    x = np.array(scores, dtype=float)
    if np.all(np.isnan(x)):
        return x
    lo, hi, mid = np.nanmin(x), np.nanmax(x), np.nanmedian(x)
    x[np.isnan(x)] = mid
    return ((x - lo) / (hi - lo) - 0.5) * 4 if hi > lo else x


def correlation(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman x100 (NaN when either side is constant or there are < 3 pairs)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"pearson": math.nan, "spearman": math.nan, "n": len(x)}
    return {
        "pearson": round(100 * float(sps.pearsonr(x, y)[0]), 1),
        "spearman": round(100 * float(sps.spearmanr(x, y)[0]), 1),
        "n": len(x),
    }


def agreement(judge: Sequence[float], human: dict[str, list[list[int]]]) -> dict[str, Any]:
    """Per aspect: the judge (normalised) against annotator 1, annotator 2, both pooled (each
    instance's score once per label, as upstream), and annotator 1 against annotator 2.
    ``human[aspect]`` is per instance the labels in annotator order."""
    score = normalise(judge)
    out: dict[str, Any] = {}
    for aspect, labels in human.items():
        both = [i for i, ls in enumerate(labels) if len(ls) >= 2]
        out[aspect] = {
            "annotator1": correlation(score, [ls[0] for ls in labels]),
            "annotator2": correlation([score[i] for i in both], [labels[i][1] for i in both]),
            "pooled": correlation(
                [score[i] for i, ls in enumerate(labels) for _ in ls], [v for ls in labels for v in ls]
            ),
            **human_human(labels),
        }
    return out


def human_human(labels: list[list[int]]) -> dict[str, Any]:
    """Annotator 1 against annotator 2 over the instances both labelled."""
    both = [ls for ls in labels if len(ls) >= 2]
    return {"human_human": correlation([ls[0] for ls in both], [ls[1] for ls in both])}


def human_labels(queries: Sequence[Any]) -> dict[str, list[list[int]]]:
    """Per aspect, per query: the annotators' labels in rater order."""
    return {
        a: [
            [int(p.preference[a]) for p in sorted(q.human_preferences, key=lambda p: p.rater or "")]
            for q in queries
        ]
        for a in ASPECTS
    }


def length_preference(queries: Sequence[Any]) -> list[float]:
    """A judge-free reference point: +1 when model2's answer is longer, -1 when shorter."""
    out = []
    for q in queries:
        first, second = q.human_preferences[0].answers
        out.append(float(np.sign(len(second.strip()) - len(first.strip()))))
    return out


def pick(queries: Sequence[Any], limit: int | None) -> list[Any]:
    """``limit`` queries spread evenly over the file (every k-th), all when ``limit`` is None."""
    if not limit or limit >= len(queries):
        return list(queries)
    step = len(queries) / limit
    return [queries[int(i * step)] for i in range(limit)]


# --------------------------------------------------------------------------- the run


def _settings(overrides: Sequence[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=normalize_overrides(["judge=openai", "judge.mode=pairwise", *overrides])
        )
    return to_settings(cfg)


def judge_all(
    settings: Any, cache_dir: Path, dataset: Any, queries: Sequence[Any]
) -> tuple[list[dict[str, Any]], str]:
    """One line per query (the order verdicts, the vote score, tokens and time of its calls), and
    the judge's prompt hash."""
    from concurrent.futures import ThreadPoolExecutor

    from rag_ablate.compare.pairwise import outcome_of
    from rag_ablate.core.cache import Cache
    from rag_ablate.core.errors import RagAblateError
    from rag_ablate.judges import JUDGES
    from rag_ablate.judges.calibration import judge_input

    judge = JUDGES.get("openai")(settings, Cache(cache_dir))

    def one(q: Any) -> dict[str, Any]:
        first, second = q.human_preferences[0].answers
        row: dict[str, Any] = {"query_id": q.query_id, "dataset": q.metadata.get("dataset")}
        if first.strip() == second.strip():
            return {**row, "identical": True, "verdicts": [], "firsts": [], "score": 0.0, "orders": []}
        t0 = time.perf_counter()
        try:
            got = judge.pairwise(judge_input(q, dataset.documents, first), second)
        except RagAblateError as exc:
            got = {"orders": [], "error": f"{type(exc).__name__}: {exc}"}
        res = outcome_of(got)
        orders = [
            {k: o.get(k) for k in ("first", "verdict", "error", "cached", "latency_ms", "usage")}
            for o in got.get("orders") or []
        ]
        return {
            **row,
            "identical": False,
            "verdicts": res.verdicts,
            "firsts": res.firsts,
            "consistent": res.consistent,
            "error": res.error or got.get("error"),
            "score": votes(res.verdicts) if not res.error else math.nan,
            "orders": orders,
            "wall_s": time.perf_counter() - t0,
        }

    try:
        with ThreadPoolExecutor(max_workers=max(1, settings.judge.concurrency)) as pool:
            return list(pool.map(one, queries)), judge.prompt_hash
    finally:
        judge.close()


def position_bias(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Order agreement and first-position picks, with wins of model2 (``compare.pairwise.summarise``)."""
    from rag_ablate.compare.model import PairwiseQuery
    from rag_ablate.compare.pairwise import summarise

    qs = []
    for r in rows:
        if r["identical"]:
            qs.append(PairwiseQuery(r["query_id"], r["query_id"], 0, [], [], True, identical=True))
        elif r["error"]:
            qs.append(
                PairwiseQuery(
                    r["query_id"], r["query_id"], None, r["verdicts"], r["firsts"], None, r["error"]
                )
            )
        else:
            outcome = {"b": 1, "a": -1, "tie": 0}[r["verdicts"][0]] if r["consistent"] else 0
            qs.append(
                PairwiseQuery(
                    r["query_id"], r["query_id"], outcome, r["verdicts"], r["firsts"], r["consistent"]
                )
            )
    s = summarise("all", "model2", qs, B=2000, seed=0, alpha=0.05)
    keys = ("n_pairs", "n", "wins", "losses", "ties", "inconsistent", "errors", "identical")
    out: dict[str, Any] = {k: getattr(s, k) for k in keys}
    asked = s.n - s.identical
    out["inconsistent_share_of_asked"] = s.inconsistent / asked if asked else math.nan
    out["first_position_share"] = s.first_position_share
    out["net_win_rate_model2"] = [s.net_win_rate, s.ci_low, s.ci_high]
    return out


def speed(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Judge calls, their tokens and time (cached calls left out)."""
    calls = [o for r in rows for o in r["orders"] if not o.get("cached") and o.get("latency_ms")]
    seconds = sum(o["latency_ms"] for o in calls) / 1000
    prompt = sum((o.get("usage") or {}).get("prompt_tokens", 0) for o in calls)
    completion = sum((o.get("usage") or {}).get("completion_tokens", 0) for o in calls)
    return {
        "calls": len(calls),
        "call_seconds": round(seconds, 1),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens_per_s": round((prompt + completion) / seconds, 1) if seconds else math.nan,
        "completion_tokens_per_s": round(completion / seconds, 2) if seconds else math.nan,
    }


def table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table: Pearson / Spearman x100."""
    lines = [
        "| aspect | judge vs annotator 1 | judge vs annotator 2 | judge vs both (pooled) "
        "| longer answer wins (pooled) | human-human, subset | human-human, all "
        "| published: RAGChecker vs humans (P, 280) | published: human-human (P, 280) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def ps(c: dict[str, float]) -> str:
        return f"{c['pearson']:.1f} / {c['spearman']:.1f}"

    for a in ASPECTS:
        g, h = result["agreement"][a], result["human_all"][a]
        lines.append(
            f"| {a} | {ps(g['annotator1'])} | {ps(g['annotator2'])} | {ps(g['pooled'])} "
            f"| {ps(result['longer_answer_wins'][a]['pooled'])} | {ps(g['human_human'])} | {ps(h['human_human'])} "
            f"| {PUBLISHED['ragchecker_vs_humans'][a]} | {PUBLISHED['human_vs_human'][a]} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="judge.* overrides, e.g. judge.model=gpt-4o-mini")
    ap.add_argument("--limit", type=int, default=20, help="instances (0: all 140)")
    ap.add_argument(
        "--dataset", help="an imported ragchecker-meta folder (default: import SOURCE into <out>)"
    )
    ap.add_argument("--source", default=str(SOURCE))
    ap.add_argument("--local", action="store_true", help="start the local model and judge with it")
    ap.add_argument("--threads", type=int, help="local server threads (default: every core)")
    ap.add_argument("--port", type=int, default=8094)
    ap.add_argument("--out", default=str(REPO / "outputs" / "bench_judge_agreement"))
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from rag_ablate.dataset.importers import import_dataset
    from rag_ablate.dataset.load import load_dataset

    out = Path(args.out)
    folder = Path(args.dataset) if args.dataset else out / "dataset"
    if not args.dataset:
        import_dataset("ragchecker-meta", Path(args.source), folder, overwrite=True)
    dataset = load_dataset(folder)
    queries = [q for q in dataset.queries if q.human_preferences]
    picked = pick(queries, args.limit)
    overrides = list(args.overrides)
    proc = None
    log = None
    if args.local:
        from rag_ablate.llm import local as local_llm

        url = local_llm.base_url(port=args.port)
        overrides = [f"judge.base_url={url}", f"judge.model={local_llm.MODEL_ALIAS}", *overrides]
        out.mkdir(parents=True, exist_ok=True)
        log = (out / "server.log").open("wb")
        proc = local_llm.start_server(
            local_llm.assemble_model(), port=args.port, n_threads=args.threads, log=log
        )
        local_llm.wait_ready(url, proc, timeout_s=300)
    settings = _settings(overrides)
    load_before = os.getloadavg()
    cpu0 = os.times()
    t0 = time.perf_counter()
    try:
        rows, prompt_hash = judge_all(settings, out / "cache", dataset, picked)
    finally:
        if proc is not None:
            local_llm.stop_server(proc)
        if log is not None:
            log.close()
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    server: dict[str, float] = {}
    if args.local:  # llama.cpp's own prompt evaluation and decoding speed, from the server log
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_local_llm import server_rates

        server = server_rates(out / "server.log", 0)
    result: dict[str, Any] = {
        "model": settings.judge.model,
        "base_url": settings.judge.base_url,
        "prompt_hash": prompt_hash,
        "instances": len(picked),
        "of": len(queries),
        "judge_errors": sum(1 for r in rows if r.get("error")),
        "agreement": agreement([r["score"] for r in rows], human_labels(picked)),
        "longer_answer_wins": agreement(length_preference(picked), human_labels(picked)),
        "human_all": {a: human_human(ls) for a, ls in human_labels(queries).items()},
        "published": PUBLISHED,
        "position_bias": position_bias(rows),
        "speed": speed(rows),
        "server": server,
        "wall_s": round(wall, 1),
        "server_cpu_s": round(
            cpu1.children_user + cpu1.children_system - cpu0.children_user - cpu0.children_system, 1
        ),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "command": " ".join(sys.argv),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "judgements.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (out / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(
        json.dumps(
            {
                k: v
                for k, v in result.items()
                if k not in ("agreement", "longer_answer_wins", "human_all", "published")
            },
            indent=1,
        )
    )
    print(table(result))


if __name__ == "__main__":
    main()
