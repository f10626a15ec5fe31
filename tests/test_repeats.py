"""system.repeats=k: each query run k times (records per query and repeat, own cache keys), the
per-query spread and the run's, the comparison on repeat means (nested resampling) and the flaky
queries in comparison.md and report.html (docs/statistics.md "Repeated runs")."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from rag_ablate.compare import stats
from rag_ablate.compare.analysis import compare, value
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.compare.repeats import repeat_means
from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.records.jsonl import write_records
from rag_ablate.records.repeats import first_runs, mean_record, query_spreads, repeat_metrics
from rag_ablate.records.trace import RetrievedChunk, Trace
from rag_ablate.report import html as html_report
from rag_ablate.run.budget import estimate_calls
from rag_ablate.run.resume import kept_records
from rag_ablate.run.runner import evaluate, query_key, repeated
from rag_ablate.systems.http import render_body, request_values
from rag_ablate.systems.local import LocalSystem
from tests.conftest import QUERIES as TINY_QUERIES
from tests.conftest import REPO, run_in_process, write_dataset
from tests.fake_llm import FakeLLM
from tests.stub_rag_service import StubServer, in_thread


def _rec(qid: str, repeat: int, hit: float | None, *, split: str = "dev", ok: bool = True) -> dict[str, Any]:
    metrics: dict[str, float | None] = {"latency_ms": 10.0 + repeat}
    metrics["hit_at_1"] = hit if ok else None
    metrics["mrr_at_10"] = hit if ok else None
    return {
        "query_id": qid,
        "repeat": repeat,
        "query": f"question {qid}",
        "split": split,
        "group": qid,
        "kind": "answerable",
        "status": "ok" if ok else "failed",
        "error": None if ok else "boom",
        "metrics": metrics,
    }


def _runs(verdicts: dict[str, list[float | None]], split: str = "dev") -> list[dict[str, Any]]:
    """Records of a repeated run: per query its verdicts per repeat (None: the repeat failed)."""
    return [
        _rec(q, r, v, split=split, ok=v is not None) for q, vs in verdicts.items() for r, v in enumerate(vs)
    ]


# --------------------------------------------------------------------------- the runs


class _CoinSystem:
    """A system that ranks the relevant document first or last at random; one run fails."""

    routes_intents = False

    def __init__(self, seed: int, fail: tuple[str, int]) -> None:
        self.rng = np.random.default_rng(seed)
        self.fail = fail
        self.seen: list[tuple[str, int | None]] = []

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        self.docs = sorted(dataset.documents)
        return {}

    def run(self, query: Query) -> Trace:
        self.seen.append((query.query_id, query.repeat))
        if (query.query_id, query.repeat) == self.fail:
            raise RuntimeError("the service fell over")
        ranked = sorted(self.docs, key=lambda d: (d not in query.relevant) == bool(self.rng.integers(2)))
        chunks = [RetrievedChunk(i + 1, f"{d}#0", d, 0, 10, 1.0 / (i + 1)) for i, d in enumerate(ranked)]
        return Trace(query.query_id, retrieved=chunks)

    def close(self) -> None:
        pass


def test_a_repeated_job_records_every_query_and_repeat_a_failed_repeat_failed(tmp_path: Path) -> None:
    ds = load_dataset(write_dataset(tmp_path / "tiny"))
    system = _CoinSystem(0, fail=("q2", 1))
    system.prepare(ds)
    runs = repeated(ds.queries, 3)
    records = evaluate(system, ds, [1, 5], queries=runs)  # type: ignore[arg-type]
    n = len(ds.queries)
    assert len(records) == 3 * n and len(system.seen) == 3 * n
    assert [(r["query_id"], r["repeat"]) for r in records] == [(q.query_id, q.repeat) for q in runs]
    failed = [r for r in records if r["status"] != "ok"]
    assert [(r["query_id"], r["repeat"]) for r in failed] == [("q2", 1)]
    assert "the service fell over" in str(failed[0]["error"])
    assert first_runs(records) == [r for r in records if r["repeat"] == 0]
    # system.repeats=1: the queries as they are, records without a repeat key (unchanged)
    assert repeated(ds.queries, 1) == list(ds.queries)
    once = evaluate(_CoinSystem(0, ("", 0)), ds, [1], queries=ds.queries)  # type: ignore[arg-type]
    assert all("repeat" not in r for r in once)


def test_resume_keeps_each_ok_repeat_and_reruns_the_failed_ones(tmp_path: Path) -> None:
    records = _runs({"a": [1, None, 0], "b": [1, 1, 1]})
    records.append({**records[0], "status": "failed"})  # a later attempt of a#0 failed: it is rerun
    write_records(tmp_path / "records.jsonl", records)  # type: ignore[arg-type]
    kept = kept_records(tmp_path, {"a", "b"})
    assert sorted(kept) == ["a#2", "b#0", "b#1", "b#2"]
    runs = repeated(load_dataset(write_dataset(tmp_path / "tiny")).queries[:1], 3)
    assert [query_key(q) for q in runs] == ["q1#0", "q1#1", "q1#2"]


def test_each_repeat_of_the_local_generator_is_its_own_model_call(fake_llm: FakeLLM, tmp_path: Path) -> None:
    """The model-call cache must not hand repeat 1 the answer of repeat 0; a rerun replays both."""
    s = RunConfig()
    for key, val in OmegaConf.to_container(OmegaConf.load(REPO / "conf/generator/openai.yaml")).items():  # type: ignore[union-attr]
        setattr(s.generator, str(key), val)
    s.generator.base_url, s.generator.model = fake_llm.url, "test-model"
    ds = load_dataset(write_dataset(tmp_path / "tiny"))
    query = next(q for q in ds.queries if q.kind == "answerable")
    traces = []
    for _ in range(2):  # the second pass: everything from the cache
        system = LocalSystem(s, Cache(tmp_path / "cache"))
        system.prepare(ds)
        try:
            traces += [system.run(q) for q in repeated([query], 2)]
        finally:
            system.close()
    assert len(fake_llm.requests) == 2  # one call per repeat, none for the rerun
    assert [t.cached for t in traces] == [False, False, True, True]


def test_a_service_body_template_can_send_the_repeat_index(tmp_path: Path) -> None:
    q = load_dataset(write_dataset(tmp_path / "tiny")).queries[0]
    template = {"q": "{query}", "sample": "{repeat}", "tag": "run {repeat}"}
    assert render_body(template, request_values(dataclasses.replace(q, repeat=2), 5)) == {
        "q": q.query,
        "sample": 2,
        "tag": "run 2",
    }
    assert render_body({}, request_values(q, 5)) == {"query": q.query, "query_id": q.query_id, "top_k": 5}


def test_the_plan_counts_k_times_the_model_calls() -> None:
    s = RunConfig()
    s.generator.name, s.judge.name, s.judge.repeats = "openai", "openai", 2
    once = {e.who: e for e in estimate_calls(s, ["a question", "another"], "v", baseline=True)}
    s.system.repeats = 3
    three = {e.who: e for e in estimate_calls(s, ["a question", "another"], "v", baseline=True)}
    assert (once["generator"].calls, once["judge"].calls) == (2, 4)
    assert (three["generator"].calls, three["judge"].calls) == (6, 12)
    assert three["generator"].prompt_tokens == 3 * once["generator"].prompt_tokens
    assert three["judge"].completion_tokens == 3 * once["judge"].completion_tokens


# --------------------------------------------------------------------------- the spread


def test_per_query_spread_pass_k_consistency_and_the_within_share() -> None:
    records = _runs({"a": [1, 1, 1], "b": [0, 1, 0], "c": [0, 0, 0], "d": [1, None, 1]})
    spreads = {s.query_id: s for s in query_spreads(records)}  # type: ignore[arg-type]
    b = spreads["b"]
    assert (b.n, b.n_failed, b.mean["hit_at_1"]) == (3, 0, pytest.approx(1 / 3))
    assert b.sd["hit_at_1"] == pytest.approx(math.sqrt(1 / 3)) and b.flaky("hit_at_1")
    assert b.verdicts["hit_at_1"] == [0.0, 1.0, 0.0] and "mrr_at_10" not in b.verdicts  # binary only
    d = spreads["d"]  # a failed repeat: counted, no value, not a miss in the spread
    assert (d.n_failed, d.n_values["hit_at_1"], d.mean["hit_at_1"], d.flaky("hit_at_1")) == (1, 2, 1.0, False)
    m = repeat_metrics(records)  # type: ignore[arg-type]
    assert m["run/repeats"] == 3 and m["dev/repeats/flaky_queries"] == 1
    # over the queries with a value in every repeat (a, b, c): all pass in a; agree in a and c
    assert m["dev/repeats/hit_at_1/pass_k"] == pytest.approx(1 / 3)
    assert m["dev/repeats/hit_at_1/consistency"] == pytest.approx(2 / 3)
    assert m["dev/repeats/hit_at_1/sd"] == pytest.approx(math.sqrt(1 / 3) / 3)
    # one-way random effects: W = mean within variance = 1/9; V = var of means (1, 1/3, 0) = 7/27
    w, v = 1 / 9, np.var([1, 1 / 3, 0], ddof=1)
    assert m["dev/repeats/hit_at_1/within_share"] == pytest.approx(w / (w + v - w / 3))
    assert "dev/repeats/latency_ms/within_share" in m and "holdout/repeats/flaky_queries" not in m
    assert repeat_metrics([{**r, "repeat": None} for r in records]) == {}  # type: ignore[list-item]


def test_a_querys_repeats_stand_as_their_failure_aware_mean() -> None:
    runs = _runs({"d": [1, None, 1]})
    rec = mean_record(runs, value)  # type: ignore[arg-type]
    assert rec["status"] == "ok" and rec["query"] == "question d"
    assert rec["metrics"]["hit_at_1"] == pytest.approx(2 / 3)  # the failed repeat scores the miss
    assert rec["metrics"]["latency_ms"] == pytest.approx(11.0)  # ok repeats only (10 and 12)
    assert rec["metrics"]["error_rate"] == pytest.approx(1 / 3) and value(rec, "error_rate") == pytest.approx(
        1 / 3
    )
    every = mean_record(_runs({"e": [None, None]}), value)  # type: ignore[arg-type]
    assert every["status"] == "failed" and every["metrics"]["error_rate"] == 1.0
    assert mean_record(runs[:1], value) is runs[0]  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the comparison


def _variants() -> list[VariantData]:
    rng = np.random.default_rng(3)
    base = {f"q{i}": [float(x) for x in rng.integers(0, 2, 3)] for i in range(30)}
    var = {q: [1.0, 1.0, 1.0] if i % 2 else vs for i, (q, vs) in enumerate(base.items())}
    return [
        VariantData("baseline", _runs(base), info={"role": "baseline"}),  # type: ignore[arg-type]
        VariantData("steady", _runs(var)),  # type: ignore[arg-type]
    ]


def test_the_comparison_lists_flaky_queries_in_every_view(tmp_path: Path) -> None:
    variants = _variants()
    means, summaries = repeat_means(variants)
    assert [len(v.records) for v in means] == [30, 30]
    c = compare(means, metrics=["hit_at_1"], splits=["dev"], B=200)
    c.repeats = summaries
    base_flaky = {s.query_id for s in query_spreads(variants[0].records) if s.flaky("hit_at_1")}
    assert {f.query_id for f in summaries[0].flaky} == base_flaky and summaries[0].n_flaky == len(base_flaky)
    assert summaries[1].n_flaky < summaries[0].n_flaky and summaries[0].repeats == 3
    row = c.row("dev", "steady", "hit_at_1")
    assert row is not None and row.n_queries == 30  # one value per query: the repeats' mean
    shown = summaries[0].flaky[0]
    line = f"`{shown.query_id}` hit@1 {' '.join(f'{v:g}' for v in shown.verdicts['hit_at_1'])}"
    md = format_markdown(c)
    assert "## Repeated runs and flaky queries" in md and line in md and f"question {shown.query_id}" in md
    assert f"repeats of baseline: 3 runs per query; {len(base_flaky)} of 30 queries flaky" in format_terminal(
        c
    )
    page = html_report.render(
        title="t", variants=means, comparison=c, plan=None, tradeoff_png=None, recall_png=None
    )
    section = page.split('id="repeats"')[1]
    assert f"{len(base_flaky)} of 30 queries flaky" in section and f"question {shown.query_id}" in section
    assert Comparison.from_dict(json.loads(json.dumps(c.to_dict()))).repeats == summaries
    # a run without repeats: the same objects, no section
    plain = [VariantData(v.label, first_runs(v.records), info=v.info) for v in variants]
    stripped = [dataclasses.replace(v, records=[{**r, "repeat": None} for r in v.records]) for v in plain]
    again, none = repeat_means(stripped)
    assert none == [] and all(a is b for a, b in zip(again, stripped, strict=True))


def _simulate(
    rng: np.random.Generator, n_rep: int, *, effect: float, spread: float, noise: float, k: int = 3
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n_rep`` simulated studies as columns: 50 groups of 2 queries, each run ``k`` times per side.
    A query's quality is shared by both sides; the variant adds ``effect`` plus a per-group and
    per-query part (SD ``spread``); every run adds noise (SD ``noise``). Returns (baseline, variant)
    of shape (queries, studies, k), and the groups."""
    groups = np.repeat(np.arange(50), 2)
    quality = rng.normal(0, 1, (100, n_rep))
    shift = effect + rng.normal(0, spread, (50, n_rep))[groups] + rng.normal(0, spread / 2, (100, n_rep))
    base = quality[..., None] + rng.normal(0, noise, (100, n_rep, k))
    var = (quality + shift)[..., None] + rng.normal(0, noise, (100, n_rep, k))
    return base, var, groups


@pytest.mark.slow  # 2 x 2,000 simulated studies through the comparison's test: about 8 s of CPU
def test_nested_interval_covers_at_95_and_an_aa_test_rejects_at_5_percent() -> None:
    """The comparison's test on repeat means (what repeat_means hands it) keeps its level: the 95%
    interval covers the true effect 0.95 +- 0.015 of the time, an A/A test of a noisy system
    rejects 0.05 +- 0.015; the naive interval, repeats as independent queries, does not cover."""
    rng = np.random.default_rng(27)
    base, var, groups = _simulate(rng, 2000, effect=0.2, spread=0.8, noise=0.5)
    ours = stats.paired_test(base.mean(2), var.mean(2), groups, B=1000, seed=1)
    covered = float(np.mean((ours.ci_low <= 0.2) & (ours.ci_high >= 0.2)))
    runs = lambda x: x.transpose(0, 2, 1).reshape(-1, x.shape[1])  # noqa: E731 - each run a query
    naive = stats.paired_test(runs(base), runs(var), None, B=1000, seed=1)
    naive_covered = float(np.mean((naive.ci_low <= 0.2) & (naive.ci_high >= 0.2)))
    print(f"coverage: nested {covered:.4f}, naive {naive_covered:.4f}")
    assert 0.935 <= covered <= 0.965
    assert naive_covered < 0.85  # the naive interval is too narrow by about sqrt(k)
    base, var, groups = _simulate(rng, 2000, effect=0.0, spread=0.0, noise=1.0)
    aa = stats.paired_test(base.mean(2), var.mean(2), groups, B=1000, seed=2)
    rate = float(np.mean(aa.p_value < 0.05))
    print(f"A/A false positives: {rate:.4f}")
    assert 0.035 <= rate <= 0.065


# --------------------------------------------------------------------------- the done-when


class _FlakyService(StubServer):
    """The stub service (tests/stub_rag_service.py) with each query's own chance, drawn once per
    query from ``seed``, that its relevant documents land at a random rank: two deployments are
    flaky on different queries, so the change's effect varies from query to query."""

    def __init__(self, dataset: Dataset, seed: int) -> None:
        super().__init__(dataset, rank_noise=0.0, first_delay_s=0.0, seed=seed)
        pick = random.Random(seed)
        self.noise = {q: pick.random() for q in sorted(self.queries)}
        self.lock = threading.RLock()  # type: ignore[assignment]  # answer() holds it around the stub's

    def answer(self, query_id: str) -> dict[str, Any]:
        with self.lock:
            self.rank_noise = self.noise.get(query_id, 0.0)
            return super().answer(query_id)


@pytest.mark.slow  # one sweep of two jobs against two stub services: about 20 s
def test_a_sweep_against_a_random_service_shows_flaky_queries_and_a_wider_interval(tmp_path: Path) -> None:
    """system.repeats=3 against two deployments of a service that ranks at random (the stub on
    127.0.0.1), each flaky on its own queries: the report lists the flaky queries with their text,
    and the comparison's interval is wider than the naive one that counts each repeat as a query of
    its own (which divides the query-to-query spread of the effect by 3 x the queries)."""
    queries = [
        {
            **q,
            "query_id": f"{q['query_id']}-{i}",
            "group": f"{q['query_id']}-{i}",
            "query": f"{q['query']} ({i})",
        }
        for i in range(5)
        for q in TINY_QUERIES
    ]
    path = write_dataset(tmp_path / "tiny", queries=queries)
    ds = load_dataset(path)
    with in_thread(_FlakyService(ds, 1)) as a, in_thread(_FlakyService(ds, 2)) as b:
        out = run_in_process(
            [
                "-m",
                "system=http",
                f"system.base_url={a.url},{b.url}",
                "system.chat_path=null",
                "system.repeats=3",
                f"dataset.path={path}",
                "compare.metrics=[hit_at_1]",
                "compare.B=1000",
                "progress=false",
                "tracking=none",
            ],
            tmp_path,
        )
        # 3 runs of each query in the baseline's job, 1 in the sweep's interleaved timing pass
        assert sum(a.requests[q.query_id] for q in ds.queries) == 4 * len(ds.queries)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "repeated runs (system.repeats" in out.stdout and "3 runs per query, flaky queries" in out.stdout
    sweep = next((tmp_path / "outputs" / "multirun").iterdir())
    c = Comparison.from_dict(json.loads((sweep / "comparison.json").read_text()))
    flaky = c.repeats[0].flaky
    assert c.repeats[0].repeats == 3 and flaky
    page = (sweep / "report.html").read_text()
    assert "Flaky queries" in page and all(f.query is not None and f.query in page for f in flaky[:5])
    assert flaky[0].query_id in (sweep / "comparison.md").read_text()
    spread = json.loads((sweep / "0" / "repeats.json").read_text())
    assert len(spread) == len(ds.queries) and {s["runs"] for s in spread} == {3}
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["run/repeats"] == 3 and 0 < metrics["dev/repeats/hit_at_1/within_share"] <= 1
    # the naive interval: every run its own query, paired by repeat
    row = c.row("dev", c.variants[0], "hit_at_1")
    assert row is not None and row.tested
    recs = [[json.loads(x) for x in (sweep / j / "records.jsonl").read_text().splitlines()] for j in "01"]
    hits = [
        {(r["query_id"], r["repeat"]): r["metrics"].get("hit_at_1") for r in rs if r["split"] == "dev"}
        for rs in recs
    ]
    pairs = [(v, hits[1][run]) for run, v in hits[0].items() if v is not None and hits[1][run] is not None]
    naive = stats.paired_test([p[0] for p in pairs], [p[1] for p in pairs], None, B=1000, seed=0)
    ours_w, naive_w = row.ci_high - row.ci_low, float(naive.ci_high[0] - naive.ci_low[0])
    print(
        f"dev hit@1 effect {row.effect:+.3f}: nested [{row.ci_low:+.3f}, {row.ci_high:+.3f}] over "
        f"{row.n_queries} queries; naive [{naive.ci_low[0]:+.3f}, {naive.ci_high[0]:+.3f}] over "
        f"{len(pairs)} runs"
    )
    assert row.effect == pytest.approx(float(naive.effect[0]))  # the same point estimate
    assert ours_w > naive_w
