"""Per-query results where MLflow users look for them: one trace per query.

After a small sweep with ``tracking.traces=all`` (the tiny dataset, tracking to a
sqlite file in a temporary folder), everything is read back through MLflow's own
API and checked against ``records.jsonl`` and ``queries.jsonl``: one trace per
query under its variant's run, root inputs identical across variants, the
retriever span's documents, span times equal to the recorded stage timings,
feedback equal to the records' metric values, the gold documents as an
expectation, the query set as the run's dataset input, the printed compare link
and the run description's note on arrows. The batched writer is also checked
against a trace built span by span with MLflow's public tracing API.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.errors import ConfigError
from rag_ablate.records.jsonl import read_records
from rag_ablate.tracking import traces as mt
from tests.conftest import DOCS, QUERIES, mlflow_ui, require_chromium, run_module, write_dataset

COMPARED = ["recall_at_5", "ndcg_at_10", "mrr_at_10", "evidence_recall_at_5", "intent_top1", "latency_ms"]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_module("rag_ablate", args, cwd)


def _traces(uri: str, experiment_id: str, run_id: str) -> list[Any]:
    from mlflow.tracing.client import TracingClient

    client = TracingClient(uri)
    out: list[Any] = []
    token = None
    while True:
        page = client.search_traces(
            locations=[experiment_id], run_id=run_id, max_results=100, page_token=token
        )
        out.extend(page)
        token = page.token
        if not token:
            return [client.get_trace(t.info.trace_id) for t in out]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    cwd = tmp_path_factory.mktemp("traces")
    data = write_dataset(cwd / "tiny")
    proc = run_cli(
        [
            "-m",
            f"dataset.path={data}",
            "chunk=256,512",
            "generator=extractive",  # answers: the per-query view shows their text
            "progress=false",
            "compare.B=500",
            "tracking.traces=all",
            "compare.metrics=[" + ",".join(COMPARED) + "]",
        ],
        cwd,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    uri = f"sqlite:///{cwd / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("rag_ablate.kind") == "variant"
    ]
    variants = {}
    for run in runs:
        label = run.data.tags["variant"]
        job_dir = next(
            Path(p).parent
            for p in (cwd / "outputs" / "multirun").glob("*/*/summary.json")
            if json.loads(Path(p).read_text(encoding="utf-8"))["run_id"] == run.info.run_id
        )
        variants[label] = {
            "run": run,
            "records": read_records(job_dir / "records.jsonl"),
            "traces": _traces(uri, exp.experiment_id, run.info.run_id),
        }
    return {"cwd": cwd, "uri": uri, "client": client, "exp": exp, "variants": variants, "proc": proc}


def _by_query(traces: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in traces:
        root = next(s for s in t.data.spans if s.parent_id is None)
        qid = root.inputs["query_id"]
        assert qid not in out, f"two traces for {qid}"
        out[qid] = t
    return out


@pytest.mark.slow
def test_one_trace_per_query_under_its_run_with_identical_root_inputs(sweep: dict[str, Any]) -> None:
    variants = sweep["variants"]
    assert set(variants) == {"baseline", "chunk=256"}
    roots: dict[str, dict[str, Any]] = {}
    for label, v in variants.items():
        by_q = _by_query(v["traces"])
        assert sorted(by_q) == sorted(q["query_id"] for q in QUERIES), label
        splits = mt.split_runs(sweep["uri"], sweep["exp"].experiment_id, v["run"].info.run_id)
        for qid, t in by_q.items():
            # each split's traces belong to the variant's evaluation run of that split
            assert t.info.trace_metadata["mlflow.sourceRun"] == splits[t.info.tags["rag_ablate.split"]]
            assert t.info.tags["variant"] == t.info.trace_metadata["variant"] == v["run"].info.run_name
            root = next(s for s in t.data.spans if s.parent_id is None)
            roots.setdefault(qid, {})[label] = root.inputs
    for qid, per_variant in roots.items():
        query = next(q["query"] for q in QUERIES if q["query_id"] == qid)
        assert per_variant["baseline"] == per_variant["chunk=256"] == {"query_id": qid, "query": query}


@pytest.mark.slow
def test_retriever_span_holds_the_retrieved_documents(sweep: dict[str, Any]) -> None:
    from mlflow.entities import SpanType

    texts = {d["doc_id"]: d["text"] for d in DOCS}
    n_docs = 0
    for v in sweep["variants"].values():
        by_q = _by_query(v["traces"])
        for rec in v["records"]:
            spans = {s.name: s for s in by_q[rec["query_id"]].data.spans}
            retrieve = spans["retrieve"]
            assert retrieve.span_type == SpanType.RETRIEVER
            got = retrieve.outputs
            assert len(got) == len(rec["retrieved"])  # BM25 finds nothing for "do you ship to Mars"
            n_docs += len(got)
            for doc, r in zip(got, rec["retrieved"], strict=True):
                assert doc["metadata"] == {
                    k: r[k] for k in ("doc_id", "chunk_id", "start", "end", "score", "rank")
                }
                assert doc["page_content"] == texts[r["doc_id"]][r["start"] : r["end"]]
                assert doc["id"] == r["chunk_id"]
    assert n_docs >= len(QUERIES)


@pytest.mark.slow
def test_span_times_replay_the_recorded_stage_timings(sweep: dict[str, Any]) -> None:
    for v in sweep["variants"].values():
        by_q = _by_query(v["traces"])
        previous_end = None
        for rec in v["records"]:  # in the order the queries ran
            spans = by_q[rec["query_id"]].data.spans
            root = next(s for s in spans if s.parent_id is None)
            timings = rec["timings_ms"]
            assert root.end_time_ns - root.start_time_ns == pytest.approx(timings["total"] * 1e6, abs=2)
            if previous_end is not None:  # queries one after another
                assert root.start_time_ns == previous_end
            previous_end = root.end_time_ns
            children = sorted(
                (s for s in spans if s.parent_id == root.span_id), key=lambda s: s.start_time_ns
            )
            # no reranker; the extractive generator answers
            assert [s.name for s in children] == ["route", "retrieve", "generate"]
            retrieval_ms = sum(t for k, t in timings.items() if k not in ("route", "generate", "total"))
            expected = {"route": timings["route"], "retrieve": retrieval_ms, "generate": timings["generate"]}
            t = root.start_time_ns
            for s in children:  # stage durations laid out one after another from the query's start
                assert s.start_time_ns == t
                assert s.end_time_ns - s.start_time_ns == pytest.approx(expected[s.name] * 1e6, abs=2)
                t = s.end_time_ns


@pytest.mark.slow
def test_feedback_equals_the_records_metric_values(sweep: dict[str, Any]) -> None:
    from mlflow.entities import AssessmentSourceType, Feedback

    for v in sweep["variants"].values():
        by_q = _by_query(v["traces"])
        for rec in v["records"]:
            feedback = {a.name: a for a in by_q[rec["query_id"]].info.assessments if isinstance(a, Feedback)}
            first, values = mt.shown_first(), rec["metrics"]
            expected = dict(mt.feedback(m, values[m], first) for m in COMPARED if values.get(m) is not None)
            assert {n: a.value for n, a in feedback.items()} == expected
            # lower-is-better latency goes negated, under a name that says so
            assert "latency_ms" not in feedback and expected["latency_ms (negated, up = better)"] <= 0
            # the quality axis first: '#3 recall_at_5' sorts before every other name
            assert "#3 recall_at_5" in expected or rec["kind"] != "answerable"
            for a in feedback.values():
                assert a.source.source_type == AssessmentSourceType.CODE
                assert a.metadata["direction"] == (
                    "lower_is_better" if a.metadata["metric"] == "latency_ms" else "higher_is_better"
                )


@pytest.mark.slow
def test_metadata_holds_the_gold_documents(sweep: dict[str, Any]) -> None:
    """The gold documents are trace metadata, not an Expectation (MLflow's per-query view puts every
    expectation column before the feedback: at 1600 px it pushed the headline metric out of view)."""
    from mlflow.entities import Expectation

    for v in sweep["variants"].values():
        by_q = _by_query(v["traces"])
        for q in QUERIES:
            info = by_q[q["query_id"]].info
            assert not [a for a in info.assessments if isinstance(a, Expectation)]
            relevant = q.get("relevant") or {}
            gold = info.trace_metadata.get("gold_doc_ids")
            if not relevant:
                assert gold is None
                continue
            assert json.loads(gold) == sorted(relevant, key=lambda d: (-relevant[d], d))


@pytest.mark.slow
def test_query_set_is_the_runs_dataset_input(sweep: dict[str, Any]) -> None:
    for v in sweep["variants"].values():
        run = sweep["client"].get_run(v["run"].info.run_id)
        inputs = run.inputs.dataset_inputs
        assert len(inputs) == 1
        ds = inputs[0]
        assert {t.key: t.value for t in ds.tags}["mlflow.data.context"] == "evaluation"
        profile = json.loads(ds.dataset.profile)
        assert profile["num_rows"] == len(QUERIES)
        schema = json.loads(ds.dataset.schema)["mlflow_colspec"]
        assert {c["name"] for c in schema} >= {"query_id", "query", "split", "gold_doc_ids"}


@pytest.mark.slow
def test_sweep_prints_the_compare_link_and_notes_arrows(sweep: dict[str, Any]) -> None:
    v = sweep["variants"]
    exp_id = sweep["exp"].experiment_id
    variant, baseline = v["chunk=256"]["run"].info.run_id, v["baseline"]["run"].info.run_id
    ours, theirs = (mt.split_runs(sweep["uri"], exp_id, r) for r in (variant, baseline))
    assert ours and set(ours) == set(theirs) == {r["split"] for r in v["chunk=256"]["records"]}
    for split in ours:
        n = sum(1 for r in v["chunk=256"]["records"] if r["split"] == split)
        link = (
            f"http://[::1]:5000/#/experiments/{exp_id}/evaluation-runs"
            f"?selectedRunUuid={ours[split]}&compareToRunUuid={theirs[split]}"
        )
        assert f"per-query chunk=256 vs baseline, {split} (all {n} queries): {link}" in sweep["proc"].stdout
    note = sweep["client"].get_run(variant).data.tags["mlflow.note.content"]
    assert mt.DESCRIPTION_NOTE in note and note.count(mt.DESCRIPTION_NOTE) == 1


@pytest.mark.slow
def test_traces_none_logs_no_trace(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    data = write_dataset(tmp_path / "tiny")
    proc = run_cli([f"dataset.path={data}", "progress=false", "tracking.traces=none"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    uri = f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("rag_ablate")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    assert _traces(uri, exp.experiment_id, run.info.run_id) == []
    assert client.search_traces(locations=[exp.experiment_id]) == []
    assert run.inputs.dataset_inputs == []
    summary = json.loads(next((tmp_path / "outputs").rglob("summary.json")).read_text(encoding="utf-8"))
    assert summary["traces"] == 0


@pytest.mark.slow
def test_a_bad_traces_setting_stops_before_running(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "tiny")
    proc = run_cli([f"dataset.path={data}", "progress=false", "tracking.traces=lots"], tmp_path)
    assert proc.returncode != 0
    assert "tracking.traces" in proc.stderr and "'lots'" in proc.stderr
    assert not list((tmp_path / "outputs").rglob("records.jsonl"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [("none", 0), ("all", None), ("ALL", None), ("25", 25), (7, 7), (0, 0), ("0", 0)],
)
def test_setting_values(value: object, expected: int | None) -> None:
    assert mt.parse_setting(value) == expected


@pytest.mark.parametrize("value", ["-1", -3, "some", "2.5", True])
def test_setting_rejects(value: object) -> None:
    with pytest.raises(ConfigError, match=r"tracking\.traces"):
        mt.parse_setting(value)


def test_selection_takes_a_small_split_whole_and_a_stratified_sample_of_a_large_one() -> None:
    # holdout: 4 queries (whole); dev: 96 queries, 3 in 4 answerable, sampled 20 of
    records = [
        {
            "query_id": f"q{i}",
            "split": "holdout" if i < 4 else "dev",
            "kind": "unanswerable" if i % 4 == 0 else "answerable",
        }
        for i in range(100)
    ]
    chosen = mt.select(records, 20)
    positions = [i for i, _ in chosen]
    assert positions == sorted(positions)  # dataset order
    picked = [r for _, r in chosen]
    assert [r["query_id"] for r in picked if r["split"] == "holdout"] == ["q0", "q1", "q2", "q3"]
    dev = [r for r in picked if r["split"] == "dev"]
    # each kind's share as in the split (72 of 96 answerable -> 15 of 20)
    assert len(dev) == 20 and sum(r["kind"] == "answerable" for r in dev) == 15
    # the same queries for every variant (and not just the first ones)
    assert mt.select([dict(r) for r in records], 20) == chosen
    assert [r["query_id"] for r in dev] != [r["query_id"] for r in records[4:24]]
    assert [s.describe() for s in mt.samples(records, chosen)] == [
        "all 4 queries",
        "20 of 96 queries, a sample stratified by kind",
    ]
    assert mt.select(records, 0) == []
    assert len(mt.select(records, None)) == len(mt.select(records, 96)) == 100


def test_lower_is_better_feedback_is_negated_under_a_name_that_says_so() -> None:
    assert mt.feedback("recall_at_5", 0.5) == ("recall_at_5", 0.5)
    assert mt.feedback("acl_leak_at_10", 1.0) == ("acl_leak_at_10 (negated, up = better)", -1.0)
    assert mt.feedback("latency_ms", 12.5) == ("latency_ms (negated, up = better)", -12.5)


def test_the_quality_axis_goes_first_under_a_name_mlflow_shows_as_the_metric() -> None:
    """MLflow 3.17 picks and lays out the first 4 or 5 feedback columns by name: the configured
    quality axis, then the automatic ones by rank, go as ``#<place> <name>``, which sorts before
    every metric name, whatever job logs them."""
    first = mt.shown_first()
    assert first == ["token_f1", "exact_match", "recall_at_5"]
    assert mt.feedback("token_f1", 0.5, first) == ("#1 token_f1", 0.5)
    assert mt.feedback("recall_at_5", 0.5, first) == ("#3 recall_at_5", 0.5)
    assert mt.feedback("ndcg_at_10", 0.5, first) == ("ndcg_at_10", 0.5)
    first = mt.shown_first("latency_ms")  # compare.quality_metric=latency_ms
    assert mt.feedback("latency_ms", 2.0, first) == ("#1 latency_ms (negated, up = better)", -2.0)
    names = [mt.feedback(m, 1.0, first)[0] for m in ("acl_leak_at_10", "bpref", "recall_at_5", "latency_ms")]
    assert sorted(names)[:2] == ["#1 latency_ms (negated, up = better)", "#4 recall_at_5"]
    assert [mt.metric_of(n) for n in names] == ["acl_leak_at_10", "bpref", "recall_at_5", "latency_ms"]


def test_token_usage_and_cost_in_mlflows_keys() -> None:
    rec: Any = {"usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}}
    tokens, money = mt.usage_and_cost(rec, lambda r: (0.002, 0.0006))
    assert tokens == {"input_tokens": 1000, "output_tokens": 200, "total_tokens": 1200}
    assert money == {"input_cost": 0.002, "output_cost": 0.0006, "total_cost": 0.0026}
    # a count the system did not report is left out; unpriced: no money
    assert mt.usage_and_cost({"usage": {"completion_tokens": 7}}, None) == (  # type: ignore[typeddict-item]
        {"output_tokens": 7, "total_tokens": 7},
        {},
    )
    assert mt.usage_and_cost({}, lambda r: (1.0, 1.0)) == ({}, {})  # type: ignore[typeddict-item]


def test_stage_layout_of_a_hybrid_reranked_answered_query() -> None:
    timings = {
        "route": 1.0,
        "encode": 2.0,
        "bm25": 3.0,
        "dense": 4.0,
        "fuse": 0.5,
        "rerank": 6.0,
        "generate": 7.0,
    }
    stages = mt.stage_layout({**timings, "total": 24.0}, answered=True)
    assert [(s.name, s.start_ms, s.duration_ms) for s in stages] == [
        ("route", 0.0, 1.0),
        ("retrieve", 1.0, 9.5),
        ("rerank", 10.5, 6.0),
        ("generate", 16.5, 7.0),
    ]
    assert stages[1].parts == {"encode": 2.0, "bm25": 3.0, "dense": 4.0, "fuse": 0.5}
    assert [s.name for s in mt.stage_layout(timings, answered=False)] == ["route", "retrieve", "rerank"]


def test_stage_layout_of_an_http_system() -> None:
    """Its eval call is the retrieval, its chat call the generation, both sent together
    and timed from the query's start; the service's own timings (inside those calls)
    are not laid out again."""
    timings = {"eval": 40.0, "chat": 300.0, "service.retrieve": 12.0, "service.llm": 250.0, "total": 301.0}
    stages = mt.stage_layout(timings, answered=True)
    assert [(s.name, s.start_ms, s.duration_ms, s.parts) for s in stages] == [
        ("retrieve", 0.0, 40.0, {"eval": 40.0}),
        ("generate", 0.0, 300.0, {"chat": 300.0}),
    ]
    # a system whose calls ran one after another keeps them so
    sequential = mt.stage_layout({**timings, "total": 345.0}, answered=True)
    assert [(s.name, s.start_ms) for s in sequential] == [("retrieve", 0.0), ("generate", 40.0)]


def test_lower_is_better_metrics() -> None:
    assert [m for m in [*COMPARED, "context_tokens_at_5", "error_rate"] if mt.lower_is_better(m)] == [
        "latency_ms",
        "context_tokens_at_5",
        "error_rate",
    ]


def _shape(trace: Any) -> dict[str, Any]:
    """What a user sees of a trace, without ids and clock times."""
    spans = sorted(trace.data.spans, key=lambda s: s.start_time_ns)
    root = spans[0]
    names = {s.span_id: s.name for s in spans}
    info = trace.info
    return {
        "state": info.state,
        "request_preview": json.loads(info.request_preview),
        "response_preview": json.loads(info.response_preview),
        "source_run": info.trace_metadata.get("mlflow.sourceRun"),
        "trace_inputs": json.loads(info.trace_metadata["mlflow.traceInputs"]),
        "name": info.tags.get("mlflow.traceName"),
        "execution_ms": info.execution_duration,
        "request_time": info.request_time,
        "spans": [
            (
                s.name,
                names.get(s.parent_id),
                s.span_type,
                s.inputs,
                s.outputs,
                s.start_time_ns - root.start_time_ns,
                s.end_time_ns - root.start_time_ns,
                s.status.status_code,
            )
            for s in spans
        ],
        "assessments": sorted(
            (type(a).__name__, a.name, json.dumps(a.value), a.source.source_type, a.source.source_id)
            for a in info.assessments
        ),
    }


@pytest.mark.slow
def test_batched_writer_matches_mlflows_span_by_span_api(tmp_path: Path) -> None:
    """The same query logged both ways reads back the same (guards against MLflow changes)."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType, SpanType
    from mlflow.tracing.client import TracingClient
    from mlflow.tracking import MlflowClient

    from rag_ablate.dataset.load import load_dataset
    from rag_ablate.tracking.store import create_sqlite

    data = write_dataset(tmp_path / "tiny")
    dataset = load_dataset(str(data), name="tiny", holdout_share=0.3, group_threshold=0.7, seed=0)
    q = dataset.queries[1]
    rec = {
        "query_id": q.query_id,
        "query": q.query,
        "split": q.split,
        "kind": q.kind,
        "status": "ok",
        "intent_pred": "K_returns",
        "intent_score": 0.5,
        "answer": None,
        "timings_ms": {"route": 0.25, "bm25": 0.5, "total": 1.0},
        "retrieved": [
            {"rank": 1, "chunk_id": "FEES#0", "doc_id": "FEES", "start": 0, "end": 50, "score": 3.5},
            {"rank": 2, "chunk_id": "RET#0", "doc_id": "RET", "start": 0, "end": 40, "score": 1.25},
        ],
        "metrics": {"recall_at_5": 1.0, "latency_ms": 1.0},
    }
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    create_sqlite(uri, tmp_path / "m.db")  # the tables from the machine's template, as a run's store
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    run_a, run_b = (client.create_run(exp).info.run_id for _ in range(2))
    start = (time.time_ns() // 1_000_000) * 1_000_000

    # span by span, with MLflow's public tracing API (which warns about its own type hints)
    mlflow.set_tracking_uri(uri)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, spans = mt.build_trace(
            rec,
            q,
            mt.documents(rec, dataset),
            experiment_id=exp,
            run_id=run_a,
            start_ns=start,
            metrics=["recall_at_5", "latency_ms"],
            rng=random.Random(0),
        )
        by_name = {s.name: s for s in spans}
        root_src = by_name["query"]
        root = client.start_trace(
            "query",
            span_type=SpanType.CHAIN,
            inputs=root_src.inputs,
            experiment_id=exp,
            start_time_ns=root_src.start_time_ns,
            run_id=run_a,
        )
        for name in ("route", "retrieve"):
            src = by_name[name]
            child = client.start_span(
                name,
                root.trace_id,
                root.span_id,
                span_type=src.span_type,
                inputs=src.inputs,
                start_time_ns=src.start_time_ns,
            )
            client.end_span(root.trace_id, child.span_id, outputs=src.outputs, end_time_ns=src.end_time_ns)
        client.end_trace(root.trace_id, outputs=root_src.outputs, end_time_ns=root_src.end_time_ns)
        mlflow.flush_trace_async_logging()
        code = AssessmentSource(AssessmentSourceType.CODE, mt.SOURCE_ID)
        for name in ("recall_at_5", "latency_ms"):
            sent, value = mt.feedback(name, rec["metrics"][name])
            mlflow.log_feedback(trace_id=root.trace_id, name=sent, value=value, source=code)
    mlflow.set_tracking_uri(None)

    # batched, as rag_ablate logs
    traced = mt.trace_set([rec], dataset, per_split=None, start_ns=start)  # as the runner does
    mt.log_trace_set(uri, exp, run_b, traced, metrics=["recall_at_5", "latency_ms"])

    (a,) = _traces(uri, exp, run_a)
    (b,) = _traces(uri, exp, run_b)
    sa, sb = _shape(a), _shape(b)
    assert sb["source_run"] == mt.split_runs(uri, exp, run_b)[q.split] and sa["source_run"] == run_a
    sa.pop("source_run"), sb.pop("source_run")
    assert sb == sa
    root = next(s for s in TracingClient(uri).get_trace(b.info.trace_id).data.spans if s.parent_id is None)
    assert root.get_attribute("rag_ablate.split") == q.split

    # logged again (a resumed run): still one trace per query
    mt.log_trace_set(uri, exp, run_b, traced, metrics=["recall_at_5"])
    (again,) = _traces(uri, exp, run_b)
    assert [a.name for a in again.info.assessments] == ["recall_at_5"]
    # in the same evaluation run of its split, not a second one
    held = client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{run_b}'")
    assert [r.info.run_id for r in held] == [mt.split_runs(uri, exp, run_b)[q.split]]
    assert again.info.trace_metadata["mlflow.sourceRun"] == held[0].info.run_id


def test_compare_link() -> None:
    link = mt.compare_link("http://h:1/", "3", "RUN", "BASE")
    assert link == "http://h:1/#/experiments/3/evaluation-runs?selectedRunUuid=RUN&compareToRunUuid=BASE"


@pytest.mark.slow
def test_compare_link_opens_the_query_by_query_view(sweep: dict[str, Any], tmp_path: Path) -> None:
    """As a person would: serve the store, open the printed link of a split in headless Chromium at
    1600x1100 with a fresh profile. Traced whole (``tracking.traces=all``), the split's column averages
    and their differences are comparison.json's means and effects of that split; without a click,
    no assistant panel covers the page (the link's host is ``[::1]``), and the headline metric's
    column (recall_at_5, the first feedback) and an answer's text are whole in the window."""
    from tests.cdp import ASSISTANT_PANEL, open_page, visible

    require_chromium()
    link = re.search(
        r"per-query chunk=256 vs baseline, (\w+) \(all \d+ queries\): (http://\[::1\]:5000/\S+)",
        sweep["proc"].stdout,
    )
    assert link, sweep["proc"].stdout
    split = link[1]
    (comparison,) = (sweep["cwd"] / "outputs" / "multirun").glob("*/comparison.json")
    rows = {
        r["metric"]: r
        for r in json.loads(comparison.read_text(encoding="utf-8"))["rows"]
        if r["split"] == split and r["variant"] == "chunk=256"
    }
    records = sweep["variants"]["chunk=256"]["records"]
    answered = [r for r in records if r["split"] == split and r.get("answer")]
    assert answered
    header = "[...document.querySelectorAll('[role=columnheader]')].find(e => e.innerText.startsWith({}))"
    with mlflow_ui(tmp_path / "ui.log", cwd=sweep["cwd"]) as port:
        url = link[2].replace(":5000/", f":{port}/")
        with open_page(url, tmp_path / "profile") as page:
            headline = header.format(json.dumps("#3 recall_at_5"))
            page.wait_for(headline)
            page.wait_for(f"document.body.innerText.includes({json.dumps(answered[0]['query_id'])})")
            time.sleep(2)  # the panel, when MLflow opens it, comes with the page's first data
            assert page.evaluate(ASSISTANT_PANEL) == 0, "MLflow's assistant panel is open"
            assert page.evaluate(visible(headline)), "the headline column is cut"
            shown = [json.dumps(a["answer"], ensure_ascii=False)[1:13] for a in answered]
            cell = (
                "[...document.querySelectorAll('[role=cell]')].find(e => "
                f"{json.dumps(shown)}.some(a => e.innerText.includes(a)))"
            )
            assert page.evaluate(visible(cell)), "no answer text in view"
            dom = page.evaluate("document.documentElement.outerHTML")
    # both runs of the split named in the comparison header, every query's row of the split
    assert f"chunk=256 · {split} · all " in dom and f"baseline (chunk=512) · {split} · all " in dom
    in_split = {r["query_id"] for r in sweep["variants"]["chunk=256"]["records"] if r["split"] == split}
    for q in QUERIES:
        shown = (
            f"&quot;query_id&quot;: &quot;{q['query_id']}&quot;" in dom
            or f'"query_id": "{q["query_id"]}"' in dom
        )
        assert shown == (q["query_id"] in in_split), q["query_id"]
    badges = _header_badges(dom)
    assert badges, dom[-2000:]
    for name, (avg, diff) in badges.items():
        if name.startswith("latency_ms"):
            continue  # each job's own times: the comparison's latency is the interleaved timing pass's
        row = rows[mt.metric_of(name)]
        sign = -1 if name.endswith(mt.NEGATED) else 1
        assert avg == pytest.approx(sign * row["variant_mean"], abs=0.006), name
        assert float(diff) == pytest.approx(sign * row["effect"], abs=0.006), name


def _header_badges(dom: str) -> dict[str, tuple[float, str]]:
    """The Evaluation runs view's column headers: feedback name -> (AVG of the selected run, the
    difference badge as shown, e.g. ``+964.42``)."""
    import html

    text = re.sub(r"<[^>]+>", "|", re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S))
    text = html.unescape(re.sub(r"\|+", "|", text))
    return {
        m[1]: (float(m[2]), m[3]) for m in re.finditer(r"\|([^|]+)\|AVG\|(-?[\d.]+)\|([-+][\d.]+)\|", text)
    }


def test_trace_carries_the_answer_first_tokens_money_and_variant_where_mlflow_reads_them() -> None:

    rec: Any = {
        "query_id": "q1",
        "query": "退货要运费吗",
        "split": "dev",
        "kind": "answerable",
        "status": "ok",
        "intent_pred": "K_returns",
        "answer": "不需要",
        "timings_ms": {"bm25": 1.0, "generate": 5.0, "total": 6.0},
        "retrieved": [],
        "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320},
        "metrics": {"recall_at_5": 1.0},
    }
    info, spans = mt.build_trace(
        rec,
        None,
        [],
        experiment_id="0",
        run_id="r",
        start_ns=0,
        metrics=["recall_at_5"],
        rng=random.Random(0),
        variant="chunk=256",
        usd=lambda r: (0.0006, 0.00016),
        model="m",
    )
    assert next(iter(json.loads(info.response_preview))) == "answer"  # the Response column starts with it
    usage = {"input_tokens": 300, "output_tokens": 20, "total_tokens": 320}
    cost = {"input_cost": 0.0006, "output_cost": 0.00016, "total_cost": pytest.approx(0.00076)}
    assert json.loads(info.trace_metadata["mlflow.trace.tokenUsage"]) == usage
    assert json.loads(info.trace_metadata["mlflow.trace.cost"]) == cost
    assert info.tags["variant"] == info.trace_metadata["variant"] == "chunk=256"
    generate = next(s for s in spans if s.name == "generate")
    assert generate.get_attribute("mlflow.chat.tokenUsage") == usage
    assert generate.get_attribute("mlflow.llm.cost") == cost
    assert generate.get_attribute("mlflow.llm.model") == "m"  # the overview breaks the cost down by model


def _pandas_query_set(dataset: Any, texts: list[Any]) -> Any:
    """The dataset input as MLflow's own pandas dataset describes the query set (the reference)."""
    import pandas as pd
    from mlflow.data.pandas_dataset import from_pandas

    frame = pd.DataFrame(
        {
            "query_id": [q.query_id for q in dataset.queries],
            "query": texts,
            "split": [q.split for q in dataset.queries],
            "group": [q.group for q in dataset.queries],
            "kind": [q.kind for q in dataset.queries],
            "intent": [q.intent_l2 for q in dataset.queries],
            mt.GOLD_NAME: [sorted(q.relevant) for q in dataset.queries],
        }
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLflow warns that a local path matches two of its sources
        ds = from_pandas(frame, source=str(dataset.path), name=f"{dataset.name} queries",
                         digest=dataset.queries_fingerprint[:36])  # fmt: skip
    return ds._to_mlflow_entity()


def test_query_set_is_described_as_mlflows_pandas_dataset_describes_it(tmp_path: Path) -> None:
    """The dataset input is made without pandas or MLflow's type inference, and says what MLflow's
    own description of the same rows says; a column some query lacks is optional, and a column no
    query has (MLflow's inference then says ``any``) is still a string column."""
    from mlflow.types import Schema

    from rag_ablate.core.privacy import Privacy
    from rag_ablate.dataset.load import load_dataset

    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    assert {q.intent_l2 for q in dataset.queries} - {None}  # every column has values
    ours = mt.dataset_input(dataset)
    theirs = _pandas_query_set(dataset, [q.query for q in dataset.queries])
    assert (ours.name, ours.digest, ours.profile) == (theirs.name, theirs.digest, theirs.profile)
    assert ("local", json.dumps({"uri": ours.source})) == (theirs.source_type, theirs.source)
    assert json.loads(ours.schema) == json.loads(theirs.schema)
    Schema.from_json(json.dumps(json.loads(ours.schema)["mlflow_colspec"]))  # MLflow reads it

    # redacted texts: still a text in every row
    redacted = Privacy(store_text=True, redact=True)
    theirs = _pandas_query_set(dataset, [redacted.text(q.query) for q in dataset.queries])
    assert json.loads(mt.dataset_input(dataset, redacted).schema) == json.loads(theirs.schema)

    # ids only: no query text is stored, the column is there and optional
    hidden = Privacy(store_text=False, redact=False)
    ours = mt.dataset_input(dataset, hidden)
    theirs = _pandas_query_set(dataset, [hidden.text(q.query) for q in dataset.queries])
    ours_cols = {c["name"]: c for c in json.loads(ours.schema)["mlflow_colspec"]}
    theirs_cols = {c["name"]: c for c in json.loads(theirs.schema)["mlflow_colspec"]}
    assert theirs_cols["query"] == {"type": "any", "name": "query", "required": False}
    assert ours_cols["query"] == {"type": "string", "name": "query", "required": False}
    assert {k: v for k, v in ours_cols.items() if k != "query"} == {
        k: v for k, v in theirs_cols.items() if k != "query"
    }
    Schema.from_json(json.dumps(json.loads(ours.schema)["mlflow_colspec"]))  # MLflow reads it
