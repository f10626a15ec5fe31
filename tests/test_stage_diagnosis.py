"""Stage diagnosis (docs/metrics.md "Stage diagnosis"): the stage fields of the trace and the record,
``failure_stage`` per query, its distribution per run, and how the stages' shares move in the comparison.

* hand-made records, one per stage, scored as a run scores them: each gets its stage, and the
  run's counts and shares are exactly one per stage; a failed query has no stage;
* the local pipeline on the tiny dataset, with a real rerank service (127.0.0.1) and the extractive
  generator: every record carries every stage field, and its stage agrees with those fields;
* system=http maps the stage fields from the eval JSON (a real server on 127.0.0.1); a field of the
  wrong shape is a bad response;
* the comparison's stage section: counts, one row per stage reached, tested with the paired group
  test, rendered in the terminal and comparison.md, and read back from comparison.json.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest

from rag_ablate.compare.analysis import compare
from rag_ablate.compare.model import Comparison, VariantData
from rag_ablate.compare.render import format_markdown, format_terminal
from rag_ablate.compare.stages import stage_section
from rag_ablate.config.schema import RunConfig
from rag_ablate.core.privacy import Privacy
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Query
from rag_ablate.metrics.stages import STAGES, indicators
from rag_ablate.records.scoring import aggregate, make_record, rescore, scored
from rag_ablate.records.trace import Citation, ContextChunk, Record, RetrievedChunk, Trace
from rag_ablate.report.mlflow_ui import sweep_description
from rag_ablate.run.runner import evaluate
from rag_ablate.run.summary import stage_lines
from rag_ablate.systems.http import HttpSystem
from rag_ablate.systems.local import LocalSystem
from rag_ablate.tracking.ui import mlflow_metrics
from tests.conftest import run_module
from tests.rerank_server import RerankServer
from tests.stub_rag_service import in_thread

KS = [1, 3, 5]


def _chunk(rank: int, doc: str) -> RetrievedChunk:
    return RetrievedChunk(rank, f"{doc}#0", doc, 0, 40, 1.0 / rank)


def _chunks(*docs: str) -> list[RetrievedChunk]:
    return [_chunk(i, d) for i, d in enumerate(docs, start=1)]


def _context(*docs: str) -> list[ContextChunk]:
    return [ContextChunk.of(c, None) for c in _chunks(*docs)]


def _query(ds: Dataset, query_id: str, new_id: str) -> Query:
    q = next(q for q in ds.queries if q.query_id == query_id)
    return dataclasses.replace(q, query_id=new_id, split="dev")


def _scored(ds: Dataset, query: Query, trace: Trace, docs: Any = None) -> Record:
    trace = dataclasses.replace(trace, query_id=query.query_id)
    return scored(make_record(query, trace), query, ds.documents if docs is None else docs, KS, routed=False)


def _answered(context: tuple[str, ...], answer: str, cited: Citation) -> Trace:
    """RET and SHIP retrieved, ``context`` given to the generator, ``answer`` citing ``cited``."""
    return Trace(
        "", retrieved=_chunks("RET", "SHIP"), context=_context(*context), answer=answer, citations=[cited]
    )


def _per_stage(ds: Dataset) -> list[tuple[str | None, Record]]:
    """One record of q1 (relevant: RET; reference answer "30 days") per stage, and a failed one."""
    without_ret = {k: v for k, v in ds.documents.items() if k != "RET"}
    cases: list[tuple[str | None, Trace, Any]] = [
        ("no_relevant_in_corpus", Trace("", retrieved=_chunks("SHIP")), without_ret),
        ("not_retrieved", Trace("", candidates=_chunks("SHIP", "WARR"), retrieved=_chunks("SHIP")), None),
        (
            "dropped_by_rerank",
            Trace("", candidates=_chunks("RET", "SHIP", "WARR"), retrieved=_chunks("SHIP", "WARR")),
            None,
        ),
        (
            "cut_from_context",
            Trace(
                "",
                candidates=_chunks("SHIP", "RET"),
                retrieved=_chunks("SHIP", "RET"),
                context=_context("SHIP"),
            ),
            None,
        ),
        # the answers: the first cites a context chunk of SHIP; the others RET ("30 days" is right)
        (
            "not_used",
            _answered(("RET", "SHIP"), "Shipping takes 3 days [2]", Citation(chunk_id="SHIP#0")),
            None,
        ),
        (
            "answer_wrong",
            _answered(("RET",), "Refunds take 5 business days [1]", Citation(doc_id="RET")),
            None,
        ),
        ("ok", _answered(("RET",), "30 days [1]", Citation(doc_id="RET")), None),
        (None, Trace("", status="timeout", error="ReadTimeout", retrieved=[]), None),
    ]
    return [
        (stage, _scored(ds, _query(ds, "q1", f"c{i}"), trace, docs))
        for i, (stage, trace, docs) in enumerate(cases)
    ]


def test_one_hand_made_query_per_stage_gets_its_stage_and_the_run_counts_one_of_each(
    tiny_dataset: Path,
) -> None:
    ds = load_dataset(tiny_dataset)
    cases = _per_stage(ds)
    for stage, rec in cases:
        assert rec["failure_stage"] == stage, rec["query_id"]
        if stage is None:  # a failure of the system: no stage, no stage indicators
            assert rec["status"] == "timeout" and not any(k.startswith("stage_") for k in rec["metrics"])
        else:
            assert {k: v for k, v in rec["metrics"].items() if k.startswith("stage_")} == indicators(stage)
    metrics = aggregate([rec for _, rec in cases])
    for stage in STAGES:
        assert metrics[f"dev/n_stage_{stage}"] == 1.0
        assert metrics[f"dev/stage_{stage}"] == pytest.approx(1 / 7)  # over the 7 diagnosed queries
    assert metrics["dev/n_failed"] == 1.0
    # MLflow keeps the shares and counts; the end table prints the counts
    logged = mlflow_metrics(metrics, [])
    assert logged["dev/stage_ok"] == pytest.approx(1 / 7) and logged["dev/n_stage_not_used"] == 1.0
    lines = stage_lines([{"label": "base", "metrics": metrics}])
    assert "base: no_relevant_in_corpus 1 / 0, not_retrieved 1 / 0" in lines[1]
    # recomputed from the records on disk and the labels (rescore)
    stored = [rec for stage, rec in cases if stage in ("not_retrieved", "dropped_by_rerank", "ok")]
    queries = [_query(ds, "q1", rec["query_id"]) for rec in stored]
    blank = [cast(Record, {**r, "failure_stage": None, "metrics": {}}) for r in stored]
    again = rescore(blank, dataclasses.replace(ds, queries=queries), KS, routed=False)
    assert [r["failure_stage"] for r in again] == ["not_retrieved", "dropped_by_rerank", "ok"]


def test_unanswerable_no_rag_and_a_refusal_in_context(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    q5, q6 = _query(ds, "q5", "u1"), _query(ds, "q6", "n1")  # unanswerable; no_rag
    # nothing to find: an unanswerable query lost nothing, unless it is answered instead of refused
    assert _scored(ds, q5, Trace("", retrieved=_chunks("SHIP")))["failure_stage"] == "ok"
    refused = Trace("", retrieved=_chunks("SHIP"), answer="The documents do not answer this question.")
    assert _scored(ds, q5, refused)["failure_stage"] == "ok"
    answer = "Yes, in two weeks [1]"
    answered = Trace("", retrieved=_chunks("SHIP"), answer=answer, citations=[Citation("SHIP")])
    assert _scored(ds, q5, answered)["failure_stage"] == "answer_wrong"
    assert _scored(ds, q6, Trace(""))["failure_stage"] is None
    # the relevant chunk reached the generator, which refused (cites nothing): not used
    q1 = _query(ds, "q1", "r1")
    refusal = Trace("", retrieved=_chunks("RET"), context=_context("RET"), answer="I don't know.")
    assert _scored(ds, q1, refusal)["failure_stage"] == "not_used"
    # no candidates, no context, no answer: a relevant document in the final list is ok
    assert _scored(ds, q1, Trace("", retrieved=_chunks("SHIP", "RET")))["failure_stage"] == "ok"


def test_gold_chunk_ids_and_a_service_without_evidence(tiny_dataset: Path) -> None:
    """Gold named by chunk ids (relevant_chunks) matches items named by chunk id only; a service that
    reports no evidence (retrieved None) is diagnosed by its answer."""
    ds = load_dataset(tiny_dataset)
    q = dataclasses.replace(_query(ds, "q1", "k1"), relevant={}, relevant_chunks={"RET#2": 1})

    def named(*chunks: str) -> list[RetrievedChunk]:
        return [RetrievedChunk(i, c, None, 0, 0, 1.0) for i, c in enumerate(chunks, start=1)]

    assert _scored(ds, q, Trace("", retrieved=named("RET#0", "SHIP#1")))["failure_stage"] == "not_retrieved"
    assert _scored(ds, q, Trace("", retrieved=named("SHIP#1", "RET#2")))["failure_stage"] == "ok"
    q1 = _query(ds, "q1", "k2")
    cited = Trace("", retrieved=None, answer="30 days [1]", citations=[Citation(doc_id="RET")])
    assert _scored(ds, q1, cited)["failure_stage"] == "ok"
    wrong = Trace("", retrieved=None, answer="Two weeks [1]", citations=[Citation(doc_id="RET")])
    assert _scored(ds, q1, wrong)["failure_stage"] == "answer_wrong"


def test_the_local_pipeline_with_rerank_reports_every_stage(tiny_dataset: Path) -> None:
    ds = load_dataset(tiny_dataset)
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 12, 2  # about 4 chunks per document
    s.generator.name, s.generator.max_chunks = "extractive", 2
    with RerankServer() as server:
        s.rerank.method, s.rerank.url, s.rerank.candidates, s.rerank.top_k = "http", server.url, 6, 3
        system = LocalSystem(s)
        system.prepare(ds)
        try:
            records = evaluate(system, ds, KS)
        finally:
            system.close()
    assert records and all(r["status"] == "ok" for r in records)
    for r in records:
        assert r.get("rewritten_query") == next(q.query for q in ds.queries if q.query_id == r["query_id"])
        assert r.get("filters") == {}
        assert set(r.get("versions") or {}) == {"index", "corpus", "model"}  # extractive: no prompt
        assert r["versions"]["model"] == "extractive"
        candidates, context = r.get("candidates"), r.get("context")
        assert candidates is not None and context is not None
        assert len(r["retrieved"]) <= 3 and len(context) == min(2, len(r["retrieved"]))
        assert len(candidates) <= 6 and len(candidates) >= len(r["retrieved"])
        assert [c["chunk_id"] for c in context] == [c["chunk_id"] for c in r["retrieved"][:2]]
        assert all(c.get("text") for c in context)
        relevant = {d for q in ds.queries if q.query_id == r["query_id"] for d in q.relevant}
        stage = r["failure_stage"]
        if r["kind"] == "no_rag":
            assert stage is None
            continue
        assert stage in STAGES
        if stage == "dropped_by_rerank":
            assert relevant & {c["doc_id"] for c in candidates}
            assert not relevant & {c["doc_id"] for c in r["retrieved"]}
        if stage == "cut_from_context":
            assert not relevant & {c["doc_id"] for c in context}
    assert any(len(r.get("candidates") or []) > len(r["retrieved"]) for r in records)  # the reranker cut
    counts = Counter(r["failure_stage"] for r in records if r["failure_stage"] is not None)
    metrics = aggregate(records)
    assert {st: int(metrics[f"all/n_stage_{st}"]) for st in STAGES} == {st: counts[st] for st in STAGES}
    # without the text: the context keeps its ids, not its text; no rewritten query
    stored = Privacy(store_text=False).record(records[0])
    assert "rewritten_query" not in stored and all("text" not in c for c in stored.get("context") or [])
    # redacted: personal data in the context's text and the rewritten query is replaced and counted
    leaky = {
        **records[0],
        "rewritten_query": "mail a@b.com",
        "context": [{**records[0]["context"][0], "text": "call +1 415 555 0100"}],
    }
    redacted = Privacy(redact=True).record(cast(Record, leaky))
    assert (
        redacted.get("rewritten_query") == "mail [EMAIL]"
        and redacted["context"][0].get("text") == "call [PHONE]"
    )
    assert redacted.get("redacted", {}).get("email") == 1 and redacted.get("redacted", {}).get("phone") == 1


class _StageService(BaseHTTPRequestHandler):
    """An eval endpoint that reports its stages under its own names; ``bad`` sends filters as a list."""

    bad = False

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        item = {"doc_id": "RET", "start": 0, "end": 40, "score": 2.0}
        body = {
            "retrieved": [item],
            "search": {"query": "refund window days", "filters": ["en"] if self.bad else {"lang": "en"}},
            "pre": [{"doc_id": "SHIP", "score": 3.0}, {**item, "score": 1.0}],
            "ctx": [{**item, "text": "You can return most items"}],
            "meta": {"versions": {"index": "ix-7", "model": "m-1"}},
        }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextmanager
def _service(bad: bool) -> Iterator[str]:
    handler = type("Handler", (_StageService,), {"bad": bad})
    with in_thread(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("bad", [False, True], ids=["mapped", "filters-not-an-object"])
def test_system_http_maps_the_stage_fields(tiny_dataset: Path, bad: bool) -> None:
    ds = load_dataset(tiny_dataset)
    ds = dataclasses.replace(ds, queries=[q for q in ds.queries if q.query_id == "q1"])
    with _service(bad) as url:
        s = RunConfig()
        s.progress = False
        s.system = dataclasses.replace(s.system, name="http", base_url=url, chat_path=None, retries=0)
        s.system.response = dataclasses.replace(
            s.system.response,
            intents=None,
            rewritten_query="search.query",
            filters="search.filters",
            candidates="pre",
            context="ctx",
            versions="meta.versions",
        )
        system = HttpSystem(s)
        system.prepare(ds)
        try:
            (rec,) = evaluate(system, ds, KS)
        finally:
            system.close()
    if bad:
        assert rec["status"] == "bad_response" and "system.response.filters" in str(rec["error"])
        return
    assert rec["status"] == "ok", rec["error"]
    assert rec.get("rewritten_query") == "refund window days" and rec.get("filters") == {"lang": "en"}
    assert [(c["doc_id"], c["score"]) for c in rec.get("candidates") or []] == [("SHIP", 3.0), ("RET", 1.0)]
    assert rec.get("context") == [
        {"rank": 1, "chunk_id": "RET#0", "doc_id": "RET", "start": 0, "end": 40, "score": 2.0,
         "text": "You can return most items"}
    ]  # fmt: skip
    assert rec.get("versions") == {"index": "ix-7", "model": "m-1"}
    assert rec["failure_stage"] == "ok"
    # the default mapping (null paths) leaves them absent
    assert RunConfig().system.response.candidates is None


def _records(stages: list[str], failed: int = 0) -> list[Record]:
    """Synthetic dev records, one group per query, with these stages, then ``failed`` timeouts."""
    out: list[dict[str, Any]] = []
    for i, stage in enumerate(stages):
        out.append(
            {"query_id": f"q{i}", "split": "dev", "group": f"g{i}", "kind": "answerable", "status": "ok",
             "failure_stage": stage, "metrics": indicators(stage)}
        )  # fmt: skip
    for i in range(len(stages), len(stages) + failed):
        out.append(
            {"query_id": f"q{i}", "split": "dev", "group": f"g{i}", "kind": "answerable", "status": "timeout",
             "failure_stage": None, "metrics": {}}
        )  # fmt: skip
    return cast(list[Record], out)


def test_the_comparison_shows_how_each_stage_share_moved(tmp_path: Path) -> None:
    n = 20
    base = VariantData("baseline", _records(["ok"] * n))
    # the variant loses 12 of the 20 at the reranker, 2 in the context, and fails a query more
    lost = ["dropped_by_rerank"] * 12 + ["cut_from_context"] * 2 + ["ok"] * 5
    var = VariantData("rerank=x", _records(lost, failed=1))
    variants = [base, var]
    c = compare(variants, baseline="baseline", metrics=["error_rate"], splits=["dev"], B=500, seed=1)
    c.stages = stage_section(variants, c)
    sec = c.stages
    assert sec is not None
    shares = {x.variant: x for x in sec.shares}
    assert shares["rerank=x"].counts["dropped_by_rerank"] == 12 and shares["rerank=x"].n_failed == 1
    assert shares["baseline"].n_diagnosed == 20 and shares["rerank=x"].n_diagnosed == 19
    # one row per stage some query reached, over the 19 queries diagnosed on both sides
    assert sec.metrics == ["stage_dropped_by_rerank", "stage_cut_from_context", "stage_ok"]
    rows = {r.metric: r for r in sec.rows}
    assert rows["stage_dropped_by_rerank"].effect == pytest.approx(12 / 19)
    assert rows["stage_ok"].effect == pytest.approx(5 / 19 - 1)
    assert rows["stage_ok"].n_queries == 19 and rows["stage_ok"].n_groups == 19
    assert rows["stage_dropped_by_rerank"].verdict == "worse" and rows["stage_ok"].verdict == "worse"
    assert rows["stage_cut_from_context"].verdict == ""  # 2 of 19: no evidence
    terminal = format_terminal(c)
    shown = "dev, rerank=x: dropped_by_rerank 12, cut_from_context 2, ok 5 of 19 diagnosed; 1 failed"
    assert shown in terminal
    assert "how each stage's share moved" in terminal and "stage_dropped_by_rerank" in terminal
    md = format_markdown(c)
    assert "## Failure stages" in md and "| rerank=x | stage_ok | 1.000 -> 0.263 |" in md
    summaries = [{"label": v.label, "metrics": {}} for v in variants]
    described = sweep_description(c, summaries, "error_rate", "baseline")
    assert "Failure stages whose share moved" in described
    assert "rerank=x dev stage_dropped_by_rerank +0.632 worse*" in described
    assert "cut_from_context" not in described.rpartition("Failure stages")[2]  # not significant
    again = Comparison.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again.stages == sec
    # records without a stage (written before stages were): no section
    old = [VariantData(v.label, [{**r, "failure_stage": None} for r in v.records]) for v in variants]
    assert stage_section(old, c) is None


@pytest.mark.slow
def test_a_sweep_reports_the_stages_in_mlflow_the_end_table_and_the_comparison(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    with RerankServer() as server:
        proc = run_module(
            "rag_ablate",
            [
                "-m",
                "rerank=none,http",
                f"rerank.url={server.url}",
                "rerank.top_k=2",
                f"dataset.path={tiny_dataset}",
                "chunk.size=12",
                "chunk.overlap=2",
                "generator=extractive",
                "progress=false",
                "compare.B=200",
            ],
            tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "failure stages, queries per stage (dev / holdout" in proc.stdout
    assert "how each stage's share moved" in proc.stdout
    sweep_dir = next((tmp_path / "outputs" / "multirun").iterdir())
    data = json.loads((sweep_dir / "comparison.json").read_text())
    sec = data["stages"]
    assert {x["variant"] for x in sec["shares"]} == {data["baseline"], *data["variants"]}
    assert sec["rows"] and {r["metric"] for r in sec["rows"]} <= {f"stage_{s}" for s in STAGES}
    assert "## Failure stages" in (sweep_dir / "comparison.md").read_text()
    page = (sweep_dir / "report.html").read_text()
    assert "Failure stages" in page and 'id="stages-dev"' in page
    ids = re.findall(r'id="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # the stage rows' tables keep the page's ids unique
    # each job: the counts in metrics.json agree with its records; MLflow has the shares and counts
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    for variant in sweep_dir.glob("*/variant.json"):
        job = variant.parent
        records = [json.loads(line) for line in (job / "records.jsonl").read_text().splitlines()]
        metrics = json.loads((job / "metrics.json").read_text())
        counts = Counter(r["failure_stage"] for r in records if r["failure_stage"] is not None)
        assert {s: int(metrics[f"all/n_stage_{s}"]) for s in STAGES} == {s: counts[s] for s in STAGES}
        run_id = json.loads((job / "run.json").read_text())["run_id"]
        logged = client.get_run(run_id).data.metrics
        assert logged["dev/stage_ok"] == pytest.approx(metrics["dev/stage_ok"])
        assert logged["dev/n_stage_ok"] == metrics["dev/n_stage_ok"]
