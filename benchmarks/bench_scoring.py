"""Scoring against pytrec_eval, scoring a 6,000-query run (issue 16), and a run's score stage (issue 28).

Four measurements, the first two in this one process, the others in child processes:

1. **Per-query retrieval metrics against pytrec_eval**, side by side: 5,000 queries x 100
   retrieved documents (graded qrels, 1-5 relevant documents per query, some judged 0),
   cutoffs 10 and 100. pytrec_eval's time is building its ``RelevanceEvaluator`` with the
   measures equivalent to ours (``success``, ``recall``, ``P``, ``ndcg_cut`` at 10 and 100,
   and ``recip_rank``), ``evaluate`` on the run, and reading every value out of its result
   dicts. Ours is :func:`rag_ablate.metrics.retrieval_metrics` called once per query on the
   ranked list (de-duplication included), which returns more (``mrr`` at both cutoffs and
   ``full_recall``). The two run alternately; the ratio is of the median round. Neither side's
   input preparation is timed (pytrec_eval's run dict, and its qrels re-graded ``g -> 2**g - 1``
   so its linear-gain nDCG equals ours); every value is checked against pytrec_eval. A second
   row scores rankings of 100 *chunks* whose documents repeat (what the runner hands over);
   pytrec_eval cannot see repeats and gets the de-duplicated (shorter) ranking.
2. **Scoring a 6,000-query run**: a synthetic Chinese corpus of 1,000 documents (paragraphs of
   the embedded sample, shuffled), cut into 256-character chunks; 6,000 records with 10 retrieved
   chunks each (about 90 % answerable, with evidence spans); ``ks = [1, 3, 5, 10]``. Timed:
   :func:`rag_ablate.records.scoring.rescore` (every record scored as the runner does, chunk token counts
   memoised for the run), and, when the memo exists, the same seeded with every chunk's count (what a
   local system caches with its chunks). A digest of every metric value shows that two versions
   of the code agree.

3. **A run's score stage, before and after** (issue 28, ``--part stage``): the records of one run
   of the default config (made once, by ``python -m rag_ablate tracking=none`` with this code) on
   the embedded sample and on each ``--dataset`` (a real set in the dataset format, e.g. COVID-QA
   imported by ``rag-ablate import squad``), scored as the runner's score stage does: where the
   code has ``score_all`` (since stop 41), every record made (``make_record(query, trace)``, the
   trace read back from the record) and appended by a
   :class:`~rag_ablate.records.jsonl.RecordWriter` one after another, as its query completes, then
   every record scored (``score_all``); before, each record made, scored and appended in turn
   (``--order phases``: every record made and scored, then every record appended, timed apart);
   then ``aggregate`` (with the default production mix's weighted means), the cost
   metrics, the judge and repeat metrics, the slices and their files. Each round is as a run:
   (a) the labels memo of the scoring module (``_LABELS``, keyed by the query object, where the
   code has it) is cleared before it, so every round builds each query's labels once, as a run
   does (the same ``Query`` objects are scored every round); (b) the token memo is seeded with
   what a local system hands over, a ``ChunkTokenCounts`` over the chunks of the run's config
   (``chunk`` of the ``config.yaml`` beside the records, ``unit: auto`` resolved as
   ``LocalSystem._chunk`` does), a new one each round (its first lookup builds its index, as in a
   run); code without that class gets a plain dict of the retrieved chunks' counts. Each side is
   a child process whose ``rag_ablate`` is this checkout or ``--code DIR`` (default
   ``/work/main``: the code before a change); the two alternate, best CPU time (user + sys) of
   ``--rounds`` per child. A digest of every value (each record's metrics and stage, the
   aggregates, the cost and slice metrics) shows the two sides agree. What this does not copy:
   in a run each record is made (and, before stop 41, scored) between retrievals, its data colder,
   and ``python -m rag_ablate`` runs with the cyclic collector's first threshold at 50,000 (since
   stop 39) where this child has the interpreter's 700, so the collections its surviving labels
   and records set off cost more here (part 4, real runs, is the figure of record).
4. **The score stage of real runs, before and after** (issue 28, ``--part runs``): the default
   config run for real, ``python -m rag_ablate tracking=none progress=false
   [dataset.path=DIR] hydra.run.dir=<a new folder>`` with ``RAG_ABLATE_WRITER_IDLE=0``, on the
   embedded sample and on each ``--dataset``, by each side (``--code DIR`` and this checkout,
   ``PYTHONPATH`` set to the tree) alternately, ``--runs`` per side after one warm-up run per
   side. Each side runs in its own working folder, so each has its own cache
   (``outputs/cache`` under it): the warm-up fills the chunk, token and BM25 entries, the timed
   runs are warm (the folders are removed at the end). Read from each run's ``profile.json``: the
   CPU seconds (``cpu_s``) of the ``score`` and ``query`` stages (work can move between the two,
   so both are shown) and of the whole profile, and the process's CPU (user + sys of the child);
   median and best per side. The
   numbers of every run's ``metrics.json`` are compared between the sides, leaving out the keys
   whose value differs between the runs of one side (timings, cost latencies, ``run/`` build
   seconds and the like, found, not listed).

Run it on the current code, and on an older checkout to compare (``PYTHONPATH=<old tree>``)::

    python benchmarks/bench_scoring.py [--rounds 7]
    python benchmarks/bench_scoring.py --part stage [--code /work/main] [--dataset DIR ...]
    python benchmarks/bench_scoring.py --part runs [--runs 5] [--code /work/main] [--dataset DIR ...]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytrec_eval

import rag_ablate
from rag_ablate.dataset.model import Dataset, Document, Query, Span, sample_dataset_path
from rag_ablate.metrics.retrieval import retrieval_metrics
from rag_ablate.records import scoring as records_mod
from rag_ablate.text.count import count_tokens

REPO = Path(__file__).resolve().parents[1]
N_QUERIES, N_RETRIEVED, KS = 5_000, 100, (10, 100)
RECORD_QUERIES, RECORD_DOCS, CHUNK, OVERLAP, TOP_K = 6_000, 1_000, 256, 32, 10
RECORD_KS = [1, 3, 5, 10]


def retrieval_cases(seed: int) -> tuple[list[list[str]], list[dict[str, int]]]:
    """5,000 rankings of 100 distinct doc ids and their graded qrels (R never empty)."""
    rng = random.Random(seed)
    rankings: list[list[str]] = []
    qrels: list[dict[str, int]] = []
    for _ in range(N_QUERIES):
        ranking = [f"doc{d:06d}" for d in rng.sample(range(200_000), N_RETRIEVED)]
        rel: dict[str, int] = {}
        for _ in range(rng.randint(1, 5)):
            doc = (
                ranking[rng.randrange(N_RETRIEVED)]
                if rng.random() < 0.6
                else f"doc{rng.randrange(200_000):06d}"
            )
            rel[doc] = rng.randint(1, 3)
        if rng.random() < 0.3:
            rel.setdefault(f"doc{rng.randrange(200_000):06d}", 0)  # judged non-relevant
        rankings.append(ranking)
        qrels.append(rel)
    return rankings, qrels


def with_repeats(ranking: list[str], rng: random.Random) -> list[str]:
    """A ranking of 100 chunks: the documents of ``ranking`` in order, about 40 % of the
    places taken by another chunk of a document already listed (what the runner scores)."""
    out: list[str] = []
    for doc in ranking:
        while out and rng.random() < 0.4 and len(out) < N_RETRIEVED:
            out.append(out[rng.randrange(len(out))])
        if len(out) == N_RETRIEVED:
            break
        out.append(doc)
    return out


def time_side_by_side(
    rankings: list[list[str]], qrels: list[dict[str, int]], rounds: int
) -> tuple[list[float], list[float], float, int]:
    """Alternating rounds of pytrec_eval and ours on the same queries: both time lists, max abs
    difference, number of values compared. pytrec_eval sees each ranking de-duplicated."""
    qids = [f"q{i:05d}" for i in range(len(rankings))]
    run = {}
    for q, rk in zip(qids, rankings, strict=True):
        docs = list(dict.fromkeys(rk))
        run[q] = {d: float(len(docs) - r) for r, d in enumerate(docs)}
    regraded = {
        q: {d: 2**g - 1 if g > 0 else 0 for d, g in rel.items()} for q, rel in zip(qids, qrels, strict=True)
    }
    cut = ",".join(map(str, KS))
    measures = {f"success.{cut}", f"recall.{cut}", f"P.{cut}", f"ndcg_cut.{cut}", "recip_rank"}
    pt_names = [f"{m}_{k}" for m in ("success", "recall", "P", "ndcg_cut") for k in KS] + ["recip_rank"]
    our_names = [f"{m}_at_{k}" for m in ("hit", "recall", "precision", "ndcg") for k in KS] + [
        f"mrr_at_{max(KS)}"
    ]

    def pytrec() -> list[list[float]]:
        res = pytrec_eval.RelevanceEvaluator(regraded, measures).evaluate(run)
        return [[res[q][name] for name in pt_names] for q in qids]

    def ours() -> list[dict[str, float]]:
        ks = list(KS)
        return [retrieval_metrics(rk, rel, ks) for rk, rel in zip(rankings, qrels, strict=True)]

    ref, got = pytrec(), ours()
    max_diff = max(
        abs(r - g[name])
        for rv, g in zip(ref, got, strict=True)
        for r, name in zip(rv, our_names, strict=True)
    )
    times: dict[str, list[float]] = {"pytrec_eval": [], "rag_ablate": []}
    for _ in range(rounds):
        for name, fn in (("pytrec_eval", pytrec), ("rag_ablate", ours)):
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times["pytrec_eval"], times["rag_ablate"], max_diff, len(ref) * len(pt_names)


def bench_pytrec(rounds: int) -> list[str]:
    rankings, qrels = retrieval_cases(seed=16)
    rng = random.Random(17)
    chunk_rankings = [with_repeats(rk, rng) for rk in rankings]
    pt_version = version("pytrec_eval-terrier")
    lines = [
        f"{N_QUERIES:,} queries x {N_RETRIEVED} retrieved, cutoffs {', '.join(map(str, KS))}; seconds are the "
        f"median of {rounds} alternating rounds (min in brackets). pytrec_eval {pt_version} "
        "(pytrec_eval-terrier): evaluator + evaluate + reading every value, measures success, recall, P, "
        "ndcg_cut at 10 and 100 and recip_rank; rag_ablate: `retrieval_metrics` per query, hit, recall, "
        "precision, mrr, ndcg, full_recall at 10 and 100 (de-duplication included).",
        "",
        "| rankings | pytrec_eval (s) | rag_ablate (s) | ratio | max abs difference |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, rks in (
        ("100 distinct documents", rankings),
        ("100 chunks, repeated documents (pytrec_eval gets them de-duplicated)", chunk_rankings),
    ):
        pt, us, diff, n_values = time_side_by_side(rks, qrels, rounds)
        mp, mu = statistics.median(pt), statistics.median(us)
        lines.append(
            f"| {label} | {mp:.3f} [{min(pt):.3f}] | {mu:.3f} [{min(us):.3f}] | {mu / mp:.2f}x "
            f"| {diff:.1e} over {n_values:,} values |"
        )
    return lines


def synthetic_run(seed: int) -> tuple[Dataset, list[dict[str, Any]], dict[tuple[str, int, int], str]]:
    """A 1,000-document Chinese corpus from the sample's paragraphs, and 6,000 scored-to-be records."""
    rng = random.Random(seed)
    paragraphs = [
        p.strip()
        for line in (sample_dataset_path() / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
        for p in json.loads(line)["text"].split("\n")
        if len(p.strip()) > 20
    ]
    docs: dict[str, Document] = {}
    chunks: dict[tuple[str, int, int], str] = {}
    by_doc: dict[str, list[tuple[str, int, int]]] = {}
    for i in range(RECORD_DOCS):
        doc_id = f"D{i:04d}"
        text = "\n".join(rng.sample(paragraphs, rng.randint(16, 48)))
        docs[doc_id] = Document(doc_id, text, f"文档{i}")
        starts = range(0, max(1, len(text) - OVERLAP), CHUNK - OVERLAP)
        by_doc[doc_id] = [(doc_id, s, min(s + CHUNK, len(text))) for s in starts]
        for key in by_doc[doc_id]:
            chunks[key] = text[key[1] : key[2]]
    all_chunks = list(chunks)
    doc_ids = list(docs)
    queries: list[Query] = []
    recs: list[dict[str, Any]] = []
    for i in range(RECORD_QUERIES):
        answerable = rng.random() < 0.9
        rel_docs = rng.sample(doc_ids, rng.randint(1, 3)) if answerable else []
        relevant = {d: rng.randint(1, 2) for d in rel_docs}
        evidence: tuple[Span, ...] = ()
        if rel_docs:
            doc_id, s, e = rng.choice(by_doc[rel_docs[0]])
            a = rng.randrange(s, max(s + 1, e - 30))
            evidence = (Span(doc_id, a, min(a + 30, len(docs[doc_id].text))),)
        q = Query(
            f"q{i:05d}", f"问题{i}", relevant, evidence, answerable, True, (), None, None,
            "dev" if i % 4 else "holdout", f"g{i}",
        )  # fmt: skip
        retrieved = [rng.choice(all_chunks) for _ in range(TOP_K)]
        if rel_docs and rng.random() < 0.7:
            retrieved[rng.randrange(TOP_K)] = rng.choice(by_doc[rel_docs[0]])
        queries.append(q)
        recs.append(
            {
                "query_id": q.query_id,
                "split": q.split,
                "group": q.group,
                "kind": q.kind,
                "status": "ok",
                "retrieved": [
                    {"chunk_id": f"{d}@{s}", "doc_id": d, "start": s, "end": e, "score": 1.0 / (r + 1)}
                    for r, (d, s, e) in enumerate(retrieved)
                ],
                "timings_ms": {"total": 1.0},
            }
        )
    dataset = Dataset("synthetic-zh", Path("."), docs, tuple(queries), {}, "c", "q")
    return dataset, recs, chunks


def bench_records(rounds: int) -> list[str]:
    dataset, recs, chunks = synthetic_run(seed=6)
    rescore: Callable[..., list[dict[str, Any]]] = records_mod.rescore
    memo_cls = getattr(records_mod, "TokenCounts", None)
    rows: list[tuple[str, float]] = []
    t0 = time.perf_counter()
    first = rescore(recs, dataset, RECORD_KS, False)
    rows.append(("rescore, first call", time.perf_counter() - t0))
    times = []
    for _ in range(rounds - 1):
        gc.collect()
        t0 = time.perf_counter()
        rescore(recs, dataset, RECORD_KS, False)
        times.append(time.perf_counter() - t0)
    rows.append((f"rescore again, median of {rounds - 1} calls", statistics.median(times)))
    if memo_cls is not None:
        seed = {key: count_tokens(text) for key, text in chunks.items()}  # what the chunk cache holds
        seeded = []
        for _ in range(rounds - 1):
            gc.collect()
            t0 = time.perf_counter()
            again = rescore(recs, dataset, RECORD_KS, False, tokens=memo_cls(seed))
            seeded.append(time.perf_counter() - t0)
        assert [r["metrics"] for r in again] == [r["metrics"] for r in first]
        rows.append(("rescore with a memo seeded by every chunk's count", statistics.median(seeded)))
    digest = hashlib.sha256(json.dumps([r["metrics"] for r in first], sort_keys=True).encode()).hexdigest()[
        :16
    ]
    n_ok = sum(1 for r in first if r["status"] == "ok")
    lines = [
        f"{len(recs):,} records ({sum(1 for q in dataset.queries if q.answerable):,} answerable), "
        f"{len(dataset.documents):,} documents, {len(chunks):,} chunks of {CHUNK} characters, "
        f"{TOP_K} retrieved per query, ks={RECORD_KS}; {n_ok:,} scored ok:",
        "",
        "| scoring | seconds |",
        "|---|---:|",
        *(f"| {name} | {sec:.2f} |" for name, sec in rows),
        "",
        f"digest of every metric value: `{digest}`",
    ]
    return lines


STAGE_PARTS = ("scored", "writer", "aggregate", "cost", "judge_repeats", "slices", "slice_files")
# --order runner: the records made, appended and scored as the code's evaluate() does (each record made
# and appended, then every record scored; before stop 41 each made, scored and appended in turn); the
# two per-query parts are then timed together
RUNNER_PARTS = ("scored and written", *STAGE_PARTS[2:])


def stage_records(dataset: str, folder: Path) -> Path:
    """records.jsonl of one default run on ``dataset`` ("sample" or a folder), made once in ``folder``."""
    out = folder / "run"
    found = sorted(out.glob("**/records.jsonl"))
    if not found:
        cmd = [sys.executable, "-m", "rag_ablate", "tracking=none", "progress=false", f"hydra.run.dir={out}"]
        if dataset != "sample":
            cmd.append(f"dataset.path={Path(dataset).resolve()}")
        env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's code
        subprocess.run(cmd, check=True, cwd=folder, capture_output=True, env=env)
        found = sorted(out.glob("**/records.jsonl"))
    return found[0]


def local_token_counts(ds: Dataset, config_path: Path) -> Callable[[], Any] | None:
    """A maker of what a local system hands the runner as chunk token counts: a
    ``ChunkTokenCounts`` over the chunks of the run's config (``chunk.size``, ``overlap``,
    ``unit``, ``snap`` of ``config_path``; ``unit: auto`` resolved as ``LocalSystem._chunk``
    does). None where the code has no ``ChunkTokenCounts`` or the config is not there."""
    chunking = importlib.import_module("rag_ablate.pipeline.chunking")
    counts_cls = getattr(chunking, "ChunkTokenCounts", None)
    if counts_cls is None or not config_path.is_file():
        return None
    import yaml

    c = yaml.safe_load(config_path.read_text(encoding="utf-8"))["chunk"]
    docs = list(ds.documents.values())
    unit = c["unit"] if c["unit"] != "auto" else chunking.detect_unit(d.text for d in docs)
    chunks = chunking.Chunks(docs, chunking.chunk_spans(docs, c["size"], c["overlap"], unit, c["snap"]))
    return lambda: counts_cls(chunks)


def stage_child(dataset: str, records_path: Path, rounds: int, order: str = "runner") -> None:
    """One side of part 3 (this process's rag_ablate): best CPU seconds of each part, as JSON.

    ``order``: ``runner`` does as the code's runner does: where the code has ``score_all``, makes and
    appends each record in turn (as its query completes), then scores every record; before, makes,
    scores and appends each record in turn; ``phases`` (the loop of the measurements before stop 38)
    scores every record, then appends every record."""
    import tempfile

    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.dataset.weights import TagWeights
    from rag_ablate.records.jsonl import RecordWriter, dumps_sorted, read_records
    from rag_ablate.records.repeats import repeat_metrics
    from rag_ablate.records.trace import Trace
    from rag_ablate.run import cost, slices
    from rag_ablate.run.judging import judge_run_metrics

    ds = load_dataset(None if dataset == "sample" else dataset)
    recs = read_records(records_path)
    by_id = {q.query_id: q for q in ds.queries}
    traces = [(by_id[r["query_id"]], Trace.from_dict(r)) for r in recs]  # what the system handed over
    for _, trace in traces:  # a local system without a reranker hands on its candidates' own chunks
        if trace.candidates is not None and trace.candidates == trace.retrieved:
            trace.retrieved = list(trace.candidates)
    routed = any(r.get("intent_pred") is not None for r in recs)
    # what a local system hands over: every chunk's count (a plain dict where the code has no
    # ChunkTokenCounts)
    make_counts = local_token_counts(ds, records_path.parent / "config.yaml")
    if make_counts is None:
        seed = records_mod.TokenCounts()
        for r in recs:
            for e in r.get("retrieved") or []:
                if e["doc_id"] in ds.documents:
                    seed.count(e["doc_id"], e["start"], e["end"], ds.documents)
        plain = {k: seed.count(*k, ds.documents) for k in list(seed._memo)}
        make_counts = plain.copy
    labels = getattr(records_mod, "_LABELS", None)  # the per-query labels memo (where the code has it)
    folder = Path(tempfile.mkdtemp())
    weights = TagWeights.from_config({})  # the default config's production mix (edge-tagged queries weigh 0)
    # the run's cutoffs checked once, as the runner does (where the code has it)
    ks = records_mod.run_cutoffs(RECORD_KS) if hasattr(records_mod, "run_cutoffs") else RECORD_KS

    seen: dict[str, int] = {}

    def once() -> tuple[dict[str, float], bytes]:
        t: dict[str, float] = {}
        clock = time.process_time
        if labels is not None:  # a run builds each query's labels once: so does every round
            labels.clear()
        counts = make_counts()  # a new one each round: its first lookup builds its index, as in a run
        c = clock()
        tokens = records_mod.TokenCounts(counts)
        (folder / "records.jsonl").unlink(missing_ok=True)
        if order == "runner" and hasattr(records_mod, "score_all"):
            # each record appended before scoring as its query completes, every record scored once the
            # queries are done (the writer still open, as in the runner)
            with RecordWriter(folder / "records.jsonl") as w:
                made = []
                for q, trace in traces:
                    rec = records_mod.make_record(q, trace)
                    w.write(rec)
                    made.append((rec, q))
                out = records_mod.score_all(made, ds.documents, ks, routed=routed, tokens=tokens)
            c, t["scored and written"] = clock(), clock() - c
        elif order == "runner":
            out = []
            with RecordWriter(folder / "records.jsonl") as w:
                for q, trace in traces:
                    rec = records_mod.scored(
                        records_mod.make_record(q, trace), q, ds.documents, ks, routed=routed, tokens=tokens
                    )
                    w.write(rec)
                    out.append(rec)
            c, t["scored and written"] = clock(), clock() - c
        else:
            out = [
                records_mod.scored(
                    records_mod.make_record(q, trace), q, ds.documents, ks, routed=routed, tokens=tokens
                )
                for q, trace in traces
            ]
            c, t["scored"] = clock(), clock() - c
            with RecordWriter(folder / "records.jsonl") as w:
                for rec in out:
                    w.write(rec)
            c, t["writer"] = clock(), clock() - c
        # the runner's score stage pauses the cyclic garbage collector (where the code has it)
        jsonl = importlib.import_module("rag_ablate.records.jsonl")
        paused = jsonl.gc_paused() if hasattr(jsonl, "gc_paused") else contextlib.nullcontext()
        with paused:
            # each record's values read once for the run and its slices, as the runner does (where the
            # code has it); the unweighted aggregate shared with a slice of every record (the same)
            has_items = hasattr(records_mod, "metric_items")
            items = [records_mod.metric_items(r) for r in out] if has_items else None
            whole = None
            if hasattr(records_mod, "weighted_metrics"):
                whole = records_mod.aggregate_counted(out, items=items)
                metrics = {**whole[0], **records_mod.weighted_metrics(out, weights)}
            elif items is None:
                metrics = records_mod.aggregate(out, weights)
            else:
                metrics = records_mod.aggregate(out, weights, items)
            c, t["aggregate"] = clock(), clock() - c
            costs = cost.run_cost_metrics(out, ("dev", "holdout"))
            c, t["cost"] = clock(), clock() - c
            judged = {**judge_run_metrics(out, price=None), **repeat_metrics(out)}
            c, t["judge_repeats"] = clock(), clock() - c
            if whole is not None:
                table = slices.slice_metrics(out, items, whole)
            else:
                table = slices.slice_metrics(out) if items is None else slices.slice_metrics(out, items)
            c, t["slices"] = clock(), clock() - c
            slices.write_slices(table, folder, ["recall_at_5", "ndcg_at_10"])
            t["slice_files"] = clock() - c
        seen["tokenised"] = tokens.tokenised  # chunks the seed did not have (0 when it covers the run)
        per_query = [[r["metrics"], r["failure_stage"], r["status"]] for r in out]
        digest = dumps_sorted([per_query, metrics, costs, judged, table.to_dict()])
        return t, digest

    once()  # warm-up: imports, caches
    best: dict[str, float] = {}
    digest = b""
    for _ in range(rounds):
        gc.collect()
        t, digest = once()
        if not best or sum(t.values()) < sum(best.values()):
            best = t
    print(
        json.dumps(
            {
                "n": len(recs),
                "ms": {k: 1000 * v for k, v in best.items()},
                "digest": hashlib.sha256(digest).hexdigest()[:16],
                "tokenised": seen["tokenised"],
            }
        )
    )


def bench_stage(datasets: list[str], code: Path, rounds: int, pairs: int, order: str = "runner") -> list[str]:
    """Part 3: the score stage on each dataset, ``code`` (before) and this checkout (after), alternating."""
    import tempfile

    here = Path(__file__).resolve()
    work = Path(tempfile.mkdtemp(prefix="bench_scoring_"))
    lines = [
        f"Score stage, CPU ms (best of {rounds} rounds x {pairs} alternating children per side, "
        f"--order {order}); before: {code}, after: {REPO}",
        "",
        "| dataset | queries | part | before (ms) | after (ms) | before / after |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for dataset in datasets:
        folder = work / (Path(dataset).name or "set")
        folder.mkdir(parents=True, exist_ok=True)
        records_path = stage_records(dataset, folder)
        results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for _ in range(pairs):
            for side, tree in (("before", code), ("after", REPO)):
                env = {**os.environ, "PYTHONPATH": str(tree)}
                cmd = [
                    sys.executable,
                    str(here),
                    "--stage-child",
                    dataset,
                    str(records_path),
                    "--rounds",
                    str(rounds),
                    "--order",
                    order,
                ]
                done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
                results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
        best = {side: min(rs, key=lambda r: sum(r["ms"].values())) for side, rs in results.items()}
        digests = {side: {r["digest"] for r in rs} for side, rs in results.items()}
        n = best["after"]["n"]
        name = Path(dataset).name if dataset != "sample" else "embedded sample"
        for part in (*(RUNNER_PARTS if order == "runner" else STAGE_PARTS), "total"):
            b, a = (
                sum(best[side]["ms"].values()) if part == "total" else best[side]["ms"][part]
                for side in ("before", "after")
            )
            label = f"**total** ({a / n:.3f} ms a query after)" if part == "total" else part
            lines.append(f"| {name} | {n:,} | {label} | {b:.1f} | {a:.1f} | {b / a:.2f}x |")
        same = digests["before"] == digests["after"] and len(digests["after"]) == 1
        unseeded = "/".join(str(max(r.get("tokenised", 0) for r in results[side])) for side in results)
        lines.append(
            f"| {name} | | values (chunks not in the seed, before/after: {unseeded}) "
            f"| digest {sorted(digests['before'])} | {sorted(digests['after'])} | "
            f"{'equal' if same else '**DIFFER**'} |"
        )
    return lines


RUN_ROWS = ("score", "query", "score + query", "profile total", "process")


def real_run(tree: Path, cwd: Path, dataset: str, run_dir: Path) -> dict[str, Any]:
    """One default run by the code in ``tree``, in ``cwd``: its profile's CPU seconds, the child's
    CPU, its metrics and its number of records."""
    import resource

    cmd = [sys.executable, "-m", "rag_ablate", "tracking=none", "progress=false", f"hydra.run.dir={run_dir}"]
    if dataset != "sample":
        cmd.append(f"dataset.path={Path(dataset).resolve()}")
    env = {**os.environ, "PYTHONPATH": str(tree), "RAG_ABLATE_WRITER_IDLE": "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, cwd=cwd, env=env, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    profile = json.loads((run_dir / "profile.json").read_text(encoding="utf-8"))
    stages = profile["stages"]
    cpu = {name: float(stages.get(name, {}).get("cpu_s", 0.0)) for name in ("score", "query")}
    cpu["score + query"] = cpu["score"] + cpu["query"]
    cpu["profile total"] = float(profile["cpu_s"])
    cpu["process"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with (run_dir / "records.jsonl").open("rb") as f:
        n = sum(1 for line in f if line.strip())
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    return {"cpu": cpu, "metrics": metrics, "n": n}


def varying_keys(runs: list[dict[str, Any]]) -> set[str]:
    """The metrics.json keys whose value is not the same in every one of ``runs`` (one side's)."""
    keys = set().union(*(r["metrics"] for r in runs))
    return {k for k in keys if len({json.dumps(r["metrics"].get(k)) for r in runs}) > 1}


def bench_runs(datasets: list[str], code: Path, runs: int) -> list[str]:
    """Part 4: real default runs on each dataset, ``code`` (before) and this checkout (after),
    alternating, after a warm-up run per side; the profile's CPU seconds per side."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="bench_scoring_runs_"))
    sides = {"before": code.resolve(), "after": REPO}
    lines = [
        f"Working folders (each side's cache in `outputs/cache` under its own; removed at the end, "
        f"some 400 MB on the sets here): {work}/{{before,after}}"
    ]
    for side, tree in sides.items():
        (work / side).mkdir()
        where = subprocess.run(
            [sys.executable, "-c", "import rag_ablate; print(rag_ablate.__file__)"],
            check=True, cwd=work / side, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(tree)},
        ).stdout.strip()  # fmt: skip
        lines.append(f"- {side}: `{tree}` (the child imports `{where}`)")
    lines += [
        "",
        f"Real runs, CPU seconds from each run's profile.json: median [best] of {runs} runs per side, "
        "the sides alternating, after a warm-up run each; `process` is the child's user + sys",
        "",
        "| dataset | queries | CPU s | before median [best] | after median [best] | ratio of medians | "
        "ratio of bests |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    checks: list[str] = []
    for dataset in datasets:
        name = Path(dataset).name if dataset != "sample" else "embedded sample"
        label = Path(dataset).name or "set"
        done: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
        for i in range(runs + 1):  # run 0: the warm-up, not counted
            for side, tree in sides.items():
                result = real_run(tree, work / side, dataset, work / side / "runs" / f"{label}-{i}")
                if i:
                    done[side].append(result)
        n = done["after"][0]["n"]
        for row in RUN_ROWS:
            vals = {side: [r["cpu"][row] for r in done[side]] for side in sides}
            med = {side: statistics.median(v) for side, v in vals.items()}
            best = {side: min(v) for side, v in vals.items()}

            def ratio(x: dict[str, float]) -> str:
                return f"{x['before'] / x['after']:.2f}x" if x["after"] > 0 else "-"

            shown = f"**{row}**" if row == "score" else row
            lines.append(
                f"| {name} | {n:,} | {shown} | {med['before']:.3f} [{best['before']:.3f}] | "
                f"{med['after']:.3f} [{best['after']:.3f}] | {ratio(med)} | {ratio(best)} |"
            )
        left_out = varying_keys(done["before"]) | varying_keys(done["after"])
        keys = {side: set().union(*(r["metrics"] for r in done[side])) for side in sides}
        compared = sorted((keys["before"] & keys["after"]) - left_out)
        differ = sorted(
            {
                k
                for b in done["before"]
                for a in done["after"]
                for k in compared
                if json.dumps(b["metrics"].get(k)) != json.dumps(a["metrics"].get(k))
            }
        )
        only = {
            side: sorted(keys[side] - keys[other])
            for side, other in (("before", "after"), ("after", "before"))
        }
        checks.append(
            f"- {name}: {len(compared)} metrics.json keys compared, "
            + (
                "all equal between the sides"
                if not differ
                else f"**{len(differ)} DIFFER**: {', '.join(differ)}"
            )
            + f"; left out, differing between one side's runs ({len(left_out)}): {', '.join(sorted(left_out))}"
            + "".join(f"; only {side} ({len(ks)}): {', '.join(ks)}" for side, ks in only.items() if ks)
        )
    shutil.rmtree(work, ignore_errors=True)
    return [*lines, "", *checks]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per side (default 7)")
    ap.add_argument("--part", choices=["all", "pytrec", "records", "stage", "runs"], default="all")
    ap.add_argument(
        "--code", type=Path, default=Path("/work/main"), help="--part stage/runs: the code before"
    )
    ap.add_argument(
        "--dataset", action="append", default=[], help="--part stage/runs: a real set (repeatable)"
    )
    ap.add_argument("--runs", type=int, default=5, help="--part runs: timed runs per side (default 5)")
    ap.add_argument("--pairs", type=int, default=2, help="--part stage: children per side, alternating")
    ap.add_argument(
        "--order",
        choices=["runner", "phases"],
        default="runner",
        help="--part stage: each record scored and appended in turn as the runner does (default), or "
        "every record scored, then every record appended (the loop before stop 38)",
    )
    ap.add_argument("--stage-child", nargs=2, metavar=("DATASET", "RECORDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage_child:
        stage_child(args.stage_child[0], Path(args.stage_child[1]), args.rounds, args.order)
        return
    print(f"- machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"- code: {Path(rag_ablate.__file__).parent}")
    print(f"- command: `python benchmarks/bench_scoring.py {' '.join(sys.argv[1:])}`".rstrip() + "\n")
    if args.part in ("all", "pytrec"):
        print("\n".join(bench_pytrec(args.rounds)) + "\n")
    if args.part in ("all", "records"):
        print("\n".join(bench_records(max(2, args.rounds))))
    if args.part == "stage":
        print(f"- load average at the start: {os.getloadavg()[0]:.1f}\n")
        print(
            "\n".join(bench_stage(["sample", *args.dataset], args.code, args.rounds, args.pairs, args.order))
        )
        print(f"\n- load average at the end: {os.getloadavg()[0]:.1f}")
    if args.part == "runs":
        print(f"- load average at the start: {os.getloadavg()[0]:.1f}\n")
        print("\n".join(bench_runs(["sample", *args.dataset], args.code, args.runs)))
        print(f"\n- load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
