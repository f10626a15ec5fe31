"""system=replay: recorded traffic scored without calling anything (rag_ablate/systems/replay.py).

The exact reproduction runs the tiny dataset through the local pipeline with a model on 127.0.0.1
(tests/fake_llm.py) whose first call fails, then replays the run's records and its MLflow traces;
the other cases build logs by hand and run the system with the runner's own ``evaluate``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.config.schema import RunConfig
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.records.scoring import aggregate
from rag_ablate.records.trace import Record
from rag_ablate.run.runner import evaluate
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.http import map_logged
from rag_ablate.systems.replay import ReplayError, ReplaySystem
from tests.conftest import DOCS, QUERIES, chromium, mlflow_ui, require_chromium, run_in_process, write_jsonl
from tests.fake_llm import FakeLLM

FAST = ["progress=false", "compare.B=200"]


def _metrics_db(db: Path) -> dict[str, dict[str, float]]:
    """Every run's latest metrics in an MLflow sqlite store, by run name."""
    with sqlite3.connect(db) as con:
        names = dict(con.execute("SELECT run_uuid, name FROM runs"))
        out: dict[str, dict[str, float]] = {name: {} for name in names.values()}
        for run, key, value in con.execute("SELECT run_uuid, key, value FROM latest_metrics"):
            out[names[run]][key] = value
    return out


def _of_the_queries(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics derived from the records: all but the process's own (run/, time/, memory/)."""
    return {k: v for k, v in metrics.items() if not k.startswith(("run/", "time/", "memory/"))}


@pytest.mark.slow
def test_replaying_a_runs_records_reproduces_every_metric_exactly(
    tmp_path: Path, tiny_dataset: Path, fake_llm: FakeLLM
) -> None:
    fake_llm.failures.append((400, {}))  # the first model call fails: that query is http_error
    out = tmp_path / "outputs"
    common = [
        f"dataset.path={tiny_dataset}",
        f"paths.output_root={out}",
        f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
        "tracking.traces=all",
        "system.max_error_rate=0.5",
        "cost.model=m",
        "+cost.prices={m: {prompt: 2.0, completion: 8.0}}",
        *FAST,
    ]
    model = [
        "generator=openai",
        f"generator.base_url={fake_llm.url}",
        "generator.model=m",
        "generator.retries=0",
    ]
    proc = run_in_process([*common, *model, "hydra.run.dir=" + str(out / "original")], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    original = out / "original"
    replayed = out / "replayed"
    args = [*common, "system=replay", f"system.path={original}", f"hydra.run.dir={replayed}"]
    proc = run_in_process(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(fake_llm.requests) == len(QUERIES)  # the replay called nothing

    before = json.loads((original / "metrics.json").read_text(encoding="utf-8"))
    after = json.loads((replayed / "metrics.json").read_text(encoding="utf-8"))
    assert before["all/n_status_http_error"] == 1 and before["cost/usd_per_1k"] > 0  # a failure, money
    assert _of_the_queries(after) == _of_the_queries(before)  # every value equal, not approximately
    records = [
        json.loads(line) for line in (replayed / "records.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    failed = [r for r in records if r["status"] != "ok"]
    assert [(r["status"], r["http_status"]) for r in failed] == [("http_error", 400)]
    assert "HTTP 400" in failed[0]["error"]
    runs = _metrics_db(out / "mlflow.db")
    (name_before,) = [n for n in runs if "generator=openai" in n]
    (name_after,) = [n for n in runs if "system=replay" in n]
    assert _of_the_queries(runs[name_after]) == _of_the_queries(runs[name_before])
    assert runs[name_after]["run/replay_lines"] == len(QUERIES)

    # the same run's MLflow traces: retrieval, intents, answers and times come back as they were
    with sqlite3.connect(out / "mlflow.db") as con:
        (run_id, exp_id) = con.execute(
            "SELECT run_uuid, experiment_id FROM runs WHERE name=?", (name_before,)
        ).fetchone()
    # its tokens and money are on its traces where MLflow's overview sums them, as cost/ counts them
    from mlflow.tracing.client import TracingClient

    infos = TracingClient(f"sqlite:///{out / 'mlflow.db'}").search_traces(
        locations=[str(exp_id)], run_id=run_id, include_spans=False
    )
    originals = [json.loads(x) for x in (original / "records.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(infos) == len(originals)
    usage = [json.loads(t.info.trace_metadata.get("mlflow.trace.tokenUsage", "{}")) for t in infos]
    assert sum(u.get("input_tokens", 0) for u in usage) == sum(
        (r.get("usage") or {}).get("prompt_tokens") or 0 for r in originals
    )
    assert sum(u.get("total_tokens", 0) for u in usage) > 0
    money = sum(
        json.loads(t.info.trace_metadata.get("mlflow.trace.cost", "{}")).get("total_cost", 0) for t in infos
    )
    assert money == pytest.approx(before["cost/usd_per_1k"] / 1000 * len(originals))
    # and MLflow's experiment overview, as a person opens it (1600x1100, a fresh profile), says so
    require_chromium()
    with mlflow_ui(tmp_path / "ui.log", uri=f"sqlite:///{out / 'mlflow.db'}") as port:
        url = f"http://127.0.0.1:{port}/#/experiments/{exp_id}"
        dom = chromium(url, tmp_path / "profile", "--dump-dom", window="1600,1100", budget_ms=60000)
    text = re.sub(r"\|+", "|", re.sub(r"\s*<[^>]+>\s*", "|", dom))
    shown = re.search(r"\|Token Usage\|([\d.]+)(K?)", text)
    assert shown and float(shown[1]) > 0, text[-3000:]
    assert "|Total Cost|" in text and "|No cost data available|" not in text  # cost, by model
    traced = out / "traced"
    args = [*common, "system=replay", "system.format=mlflow", f"system.path=sqlite:///{out / 'mlflow.db'}"]
    proc = run_in_process([*args, f"system.run_id={run_id}", f"hydra.run.dir={traced}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from_traces = json.loads((traced / "metrics.json").read_text(encoding="utf-8"))
    same = [
        k for k in before if k.split("/")[-1].startswith(("recall_at", "ndcg_at", "intent_top1", "token_f1"))
    ]
    same += ["all/latency_ms", "all/n_status_http_error", "holdout/latency_ms_p95"]
    assert {k: from_traces[k] for k in same} == {k: before[k] for k in same}

    # every trace of the experiment: the original's, then each replay's; the latest line per query counts
    args = [*args, "system.experiment=rag_ablate", "tracking=none", f"hydra.run.dir={out / 'experiment'}"]
    proc = run_in_process(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"replay: {len(QUERIES)} of {3 * len(QUERIES)} lines of MLflow" in proc.stderr
    superseded = (out / "experiment" / "replay_unmatched.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(superseded) == 2 * len(QUERIES) and all("superseded by line" in x for x in superseded)


# ---------------------------------------------------------------------- logged responses, by hand


def _settings(tmp_path: Path, *overrides: str) -> RunConfig:
    from hydra import compose, initialize_config_dir

    from rag_ablate.config.schema import register_configs
    from rag_ablate.settings import to_settings

    register_configs()  # the schema the defaults list starts with
    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose("config", overrides=["system=replay", f"system.path={tmp_path}", *overrides])
    return to_settings(cfg)


def _dataset(folder: Path) -> Dataset:
    return load_dataset(str(folder), holdout_share=0.3, group_threshold=0.7, seed=0)


def _eval_body(doc_id: str, quote: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"doc_id": doc_id, "score": 1.0}
    if quote is not None:
        text = next(d["text"] for d in DOCS if d["doc_id"] == doc_id)
        item["start"] = text.index(quote)
        item["end"] = item["start"] + len(quote)
    return {"retrieved": [item], "intentLeafIds": ["K_returns"]}


CHAT = (
    'data: {"delta": "30 "}\n\n'
    'data: {"delta": "days"}\n\n'
    'data: {"done": true, "citations": ["RET#0"], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}\n\n'
)


def _replay(
    tmp_path: Path, dataset_dir: Path, lines: list[Any], *overrides: str
) -> tuple[ReplaySystem, dict[str, Record]]:
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines), encoding="utf-8"
    )
    s = _settings(log, "system.format=responses", *overrides)
    system = SYSTEMS.get("replay")(s, None)
    assert isinstance(system, ReplaySystem)
    ds = _dataset(dataset_dir)
    system.prepare(ds)
    system.write_files(tmp_path)
    records = evaluate(system, ds, [1, 5])
    return system, {r["query_id"]: r for r in records}


def test_logged_responses_join_by_id_and_report_what_matched_nothing(
    tmp_path: Path, tiny_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [
        {"query_id": "q1", "eval": _eval_body("RET", "30 days"), "chat": CHAT, "latency_ms": 812.5},
        {"query_id": "q2", "eval": _eval_body("FEES")},
        {"query_id": "nope", "eval": _eval_body("RET")},  # line 3: no such query
        {"query_id": "q3", "eval": {"hits": []}},  # the mapping does not match: bad_response, as live
        {"query_id": "q4", "eval": _eval_body("WARR"), "http_status": 503},  # a logged failure
    ]
    system, recs = _replay(tmp_path, tiny_dataset, lines)
    q1 = recs["q1"]
    assert q1["status"] == "ok" and q1["retrieved"][0]["doc_id"] == "RET" and q1["answer"] == "30 days"
    assert q1["usage"] is not None and q1["usage"]["prompt_tokens"] == 7
    assert q1["metrics"]["recall_at_1"] == 1.0 and q1["metrics"]["latency_ms"] == 812.5
    assert "latency_ms" not in recs["q2"]["metrics"]  # no logged time: no latency, never replay's own
    assert recs["q3"]["status"] == "bad_response" and "log.jsonl:4" in str(recs["q3"]["error"])
    assert (recs["q4"]["status"], recs["q4"]["http_status"]) == ("http_error", 503)
    for qid in ("q5", "q6", "q7", "q8"):  # no line: failed with its own status, never dropped
        assert recs[qid]["status"] == "not_logged" and "no line of" in str(recs[qid]["error"])
    agg = aggregate(list(recs.values()))
    assert agg["all/n_status_not_logged"] == 4 and agg["all/n_queries"] == len(QUERIES)

    unmatched = [json.loads(x) for x in (tmp_path / "replay_unmatched.jsonl").read_text().splitlines()]
    assert [(u["line"], u["key"]) for u in unmatched] == [(3, "nope")]
    err = capsys.readouterr().err
    assert "4 of 5 lines" in err and "(line 3;" in err and "4 queries of dataset" in err
    assert system.generates_answers and system.routes_intents


def test_logged_responses_join_by_query_text_with_whitespace_normalised(
    tmp_path: Path, tiny_dataset: Path
) -> None:
    q3 = next(q["query"] for q in QUERIES if q["query_id"] == "q3")
    lines = [
        {"query": "  " + q3.upper(), "eval": _eval_body("SHIP")},  # line 1: the case differs: no match
        {"query": q3.replace(" ", "  \t") + "\n", "eval": _eval_body("SHIP")},
        {"query": "how many days do I have to return an item", "eval": _eval_body("RET")},
        {
            "query": "how many days do I have to return an item",
            "eval": _eval_body("FEES"),
        },  # the later counts
    ]
    system, recs = _replay(tmp_path, tiny_dataset, lines, "system.join=query")
    assert recs["q3"]["status"] == "ok" and recs["q3"]["metrics"]["recall_at_1"] == 1.0
    assert recs["q1"]["retrieved"][0]["doc_id"] == "FEES" and recs["q2"]["status"] == "not_logged"
    assert [(u.line, u.reason) for u in system.unmatched] == [
        (1, "no query of dataset 'tiny' has this query text"),
        (3, "superseded by line 4 (same query)"),
    ]


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("{not json", None),
        ('["a list"]', None),
        ({"eval": {}}, "query_id"),
        ({"query_id": "q1"}, "eval"),
        ({"query_id": "q1", "eval": {}, "latency_ms": "fast"}, "latency_ms"),
        ({"query_id": "q1", "eval": {}, "http_status": "500"}, "http_status"),
    ],
)
def test_a_line_that_cannot_be_read_names_file_line_and_field(
    tmp_path: Path, tiny_dataset: Path, line: Any, field: str | None
) -> None:
    good = {"query_id": "q2", "eval": _eval_body("FEES")}
    with pytest.raises(ReplayError) as info:
        _replay(tmp_path, tiny_dataset, [good, line])
    assert info.value.line == 2 and info.value.field == field
    assert "log.jsonl:2" in str(info.value)


def test_records_that_cannot_be_read_name_the_field(tmp_path: Path, tiny_dataset: Path) -> None:
    rec = {"query_id": "q1", "status": "ok", "retrieved": [{"rank": 1, "doc_id": "RET"}]}  # no chunk_id ...
    write_jsonl(tmp_path / "records.jsonl", [{"query_id": "q2", "status": "timeout"}, rec])
    system = ReplaySystem(_settings(tmp_path), None)
    with pytest.raises(ReplayError, match=r"records\.jsonl:2: field 'retrieved'"):
        system.prepare(_dataset(tiny_dataset))
    write_jsonl(tmp_path / "records.jsonl", [{"query_id": "q2", "status": "lost"}])
    with pytest.raises(ReplayError, match=r"records\.jsonl:1: field 'status'"):
        system.prepare(_dataset(tiny_dataset))


def test_a_replay_without_its_log_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from rag_ablate.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no such file or folder"):
        _settings(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=r"needs system\.run_id or system\.experiment"):
        _settings(tmp_path, "system.format=mlflow")


def test_map_logged_maps_an_exchange_as_a_live_response_and_fails_as_one(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    s = _settings(tmp_path)
    ds = _dataset(tiny_dataset)
    q1 = ds.queries[0]
    trace = map_logged(s, q1, _eval_body("RET", "30 days"), CHAT, documents=ds.documents)
    assert trace.answer == "30 days" and [c.chunk_id for c in trace.citations] == ["RET#0"]
    assert trace.retrieved[0].doc_id == "RET" and trace.intents == ["K_returns"]
    events = [{"delta": "30 days"}, {"done": True}]  # the events' data as a list
    assert map_logged(s, q1, _eval_body("RET"), events, documents=ds.documents).answer == "30 days"
    assert map_logged(s, q1, _eval_body("RET"), None, documents=ds.documents).answer is None
    with pytest.raises(Exception, match="without its end event") as cut:
        map_logged(s, q1, _eval_body("RET"), 'data: {"delta": "30"}\n\n', documents=ds.documents)
    assert getattr(cut.value, "status", None) == "stream_cut"
    with pytest.raises(Exception, match="not a document") as bad:
        map_logged(s, q1, _eval_body("NOPE"), None, documents=ds.documents)
    assert getattr(bad.value, "status", None) == "bad_response"


def test_the_timing_pass_skips_replay_variants(tmp_path: Path, tiny_dataset: Path) -> None:
    from rag_ablate.run.timing import TimingJob, timing_pass

    write_jsonl(tmp_path / "records.jsonl", [{"query_id": "q1", "status": "ok"}])
    s = _settings(tmp_path, f"dataset.path={tiny_dataset}")
    jobs = [TimingJob("a", s, tmp_path / "records.jsonl"), TimingJob("b", s, tmp_path / "records.jsonl")]
    done = timing_pass(tmp_path, jobs, tmp_path, repeats=1, seed=0)
    assert not done.written and done.untimed == ["a", "b"] and not (tmp_path / "timing.jsonl").exists()


@pytest.mark.slow
def test_two_logs_compare_like_two_variants(tmp_path: Path, tiny_dataset: Path) -> None:
    good = [
        {"query_id": q["query_id"], "eval": _eval_body(next(iter(q.get("relevant") or {"SHIP": 1})))}
        for q in QUERIES
    ]
    worse = [
        {**line, "eval": {"retrieved": [], "intentLeafIds": []}} if i < 4 else line
        for i, line in enumerate(good)
    ]
    write_jsonl(tmp_path / "before.jsonl", good)
    write_jsonl(tmp_path / "after.jsonl", worse)
    args = [
        "-m",
        f"dataset.path={tiny_dataset}",
        "system=replay",
        "system.format=responses",
        "system.path=before.jsonl,after.jsonl",  # README's form: the first log is the baseline
        "tracking=none",
        *FAST,
    ]
    proc = run_in_process(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "timing pass: skipped" in proc.stdout
    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    comparison = json.loads((sweep / "comparison.json").read_text(encoding="utf-8"))
    rows = [
        r
        for r in comparison["rows"]
        if r["variant"] == "system.path=after.jsonl" and r["metric"] == "recall_at_5"
    ]
    assert rows and any(r["effect"] < 0 for r in rows)
    assert "system=replay variants, whose times are their logs'" in comparison["latency_method"]
