"""The record's type and the records a run writes cannot drift apart.

``rag_ablate.records.trace.Record`` (a TypedDict, with nested ones for the retrieved chunks,
citations, usage and the judge's value) is what mypy checks every reader against. Here the
embedded sample is run in-process through the runner's own steps (``evaluate`` with the local
pipeline and the extractive generator, ``judge_records`` with the OpenAI judge against the fake
server, ``Privacy.record``, ``RecordWriter``/``write_records``/``read_records``), and every
record read back must have exactly the declared shape: no key that is not declared, every
required key present, every value of its declared type, every declared key written by some
record. README.md's table of record fields must name exactly the declared keys.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import types
from pathlib import Path
from typing import (
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import pytest
from omegaconf import OmegaConf

from rag_ablate.config.schema import PrivacyConfig, RunConfig
from rag_ablate.core.privacy import Privacy
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import sample_dataset_path
from rag_ablate.judges import JUDGES
from rag_ablate.metrics.answers import AnswerScoring
from rag_ablate.records import trace as trace_module
from rag_ablate.records.jsonl import RecordWriter, read_records, write_records
from rag_ablate.records.scoring import make_record
from rag_ablate.records.trace import (
    Citation,
    ContextChunk,
    Record,
    RetrievedChunk,
    TokenUsage,
    Trace,
)
from rag_ablate.run.judging import judge_records
from rag_ablate.run.runner import evaluate
from rag_ablate.systems.local import LocalSystem
from tests.fake_llm import FakeLLM

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# every TypedDict the record is made of
RECORD_TYPES = {t for t in vars(trace_module).values() if is_typeddict(t)}


def fields_of(td: Any) -> tuple[dict[str, Any], set[str]]:
    """A TypedDict's field types and its required keys, read from its annotations.

    (With postponed annotations, Python 3.11's ``__required_keys__`` counts every key, so the
    ``NotRequired[...]`` markers are read here instead.)
    """
    hints = get_type_hints(td, include_extras=True)
    types_: dict[str, Any] = {}
    required: set[str] = set()
    for key, tp in hints.items():
        origin = get_origin(tp)
        if origin is NotRequired:
            types_[key] = get_args(tp)[0]
        elif origin is Required:
            types_[key], required = get_args(tp)[0], required | {key}
        else:
            types_[key] = tp
            if td.__total__:
                required.add(key)
    return types_, required


def check(value: Any, tp: Any, where: str, seen: dict[Any, set[str]]) -> None:
    """Assert that ``value`` (as read from JSON) is of type ``tp``; ``seen`` collects, per
    TypedDict, the keys met."""
    origin = get_origin(tp)
    if is_typeddict(tp):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        declared, required = fields_of(tp)
        assert set(value) <= set(declared), f"{where}: undeclared keys {set(value) - set(declared)}"
        assert required <= set(value), f"{where}: required keys missing {required - set(value)}"
        seen.setdefault(tp, set()).update(value)
        for key, v in value.items():
            check(v, declared[key], f"{where}.{key}", seen)
    elif origin in (Union, types.UnionType):
        problems = []
        for arm in get_args(tp):
            try:
                check(value, arm, where, seen)
                return
            except AssertionError as exc:
                problems.append(str(exc))
        raise AssertionError(f"{where}: {value!r} is none of {tp}: {problems}")
    elif origin is Literal:
        assert value in get_args(tp), f"{where}: {value!r} not in {get_args(tp)}"
    elif origin is list:
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        for i, item in enumerate(value):
            check(item, get_args(tp)[0], f"{where}[{i}]", seen)
    elif origin is dict:
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        for key, item in value.items():
            assert isinstance(key, str), where
            check(item, get_args(tp)[1], f"{where}.{key}", seen)
    elif tp is type(None):
        assert value is None, f"{where}: {value!r} is not null"
    elif tp is float:  # JSON may write a whole float as an integer
        assert isinstance(value, int | float) and not isinstance(value, bool), f"{where}: {value!r}"
    elif tp is Any:  # free JSON (a query's metadata)
        json.dumps(value)
    elif tp in (int, str, bool):
        assert isinstance(value, tp) and (tp is bool or not isinstance(value, bool)), f"{where}: {value!r}"
    else:
        raise AssertionError(f"{where}: the check does not know the type {tp!r}")


def _judge_reply(body: dict[str, Any], call: int) -> str:
    """A valid judgement: scores, no refusal, every citation supported."""
    prompt = str(body["messages"][0]["content"])
    reply: dict[str, Any] = {"faithfulness": 4, "relevance": 5, "refusal": False}
    if '- "completeness"' in prompt:
        reply["completeness"] = 3
    found = re.search(r"a list of exactly (\d+) booleans", prompt)
    if found:
        reply["support"] = [True] * int(found.group(1))
    return json.dumps(reply)


def _sample_with_query_fields(tmp_path: Path) -> Path:
    """A copy of the embedded sample whose first queries carry the optional query fields the records
    keep (metadata, applicable_version, expected_behavior)."""
    folder = tmp_path / "sample"
    shutil.copytree(sample_dataset_path(), folder)
    lines = (folder / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first.update(metadata={"product": "phone"}, applicable_version="2026-10", expected_behavior="answer")
    lines[0] = json.dumps(first, ensure_ascii=False)
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def _sample_records(fake_llm: FakeLLM, tmp_path: Path) -> list[Record]:
    """The embedded sample run as a job runs it, with a few answers judged; read back from disk."""
    s = RunConfig()
    s.progress = False
    s.generator.name = "extractive"
    for key, value in OmegaConf.to_container(OmegaConf.load(REPO / "conf/judge/openai.yaml")).items():  # type: ignore[union-attr]
        setattr(s.judge, str(key), value)
    s.judge.base_url, s.judge.model, s.judge.repeats = fake_llm.url, "judge-model", 2
    fake_llm.respond = _judge_reply
    ds = load_dataset(_sample_with_query_fields(tmp_path))
    target = LocalSystem(s)
    guard = Privacy.from_config(PrivacyConfig(redact=True))
    path = tmp_path / "records.jsonl"
    try:
        target.prepare(ds)
        with RecordWriter(path) as writer:
            records = evaluate(
                target,
                ds,
                s.metrics.ks,
                # the last query as the second run of system.repeats: its record has a repeat index
                queries=[*ds.queries[:-1], dataclasses.replace(ds.queries[-1], repeat=1)],
                on_record=lambda rec: writer.write(guard.record(rec)),
                answers=AnswerScoring.from_config(s.metrics),
            )
    finally:
        target.close()
    answered = [i for i, r in enumerate(records) if r.get("answer") is not None][:4]
    judge = JUDGES.get("openai")(s, None)
    assert judge is not None
    try:
        judged = judge_records([records[i] for i in answered], judge, ds, ks=s.metrics.ks, routed=True)
    finally:
        judge.close()
    for i, rec in zip(answered, judged, strict=True):
        records[i] = rec
    appended = read_records(path)
    assert len(appended) == len(records)
    write_records(path, [guard.record(r) for r in records])
    return read_records(path)


@pytest.mark.slow  # the whole sample through the pipeline, answered and judged: about 10 s
def test_a_run_of_the_sample_writes_exactly_the_declared_record(fake_llm: FakeLLM, tmp_path: Path) -> None:
    records = _sample_records(fake_llm, tmp_path)
    assert len(records) == len(load_dataset().queries)
    seen: dict[Any, set[str]] = {}
    for rec in records:
        check(rec, Record, f"record {rec.get('query_id')}", seen)
    # every declared key, nested ones too, is written by some record (none is a dead declaration)
    assert set(seen) == RECORD_TYPES, RECORD_TYPES - set(seen)
    for td, keys in seen.items():
        assert keys == set(fields_of(td)[0]), (td.__name__, set(fields_of(td)[0]) - keys)
    judged = [r for r in records if "judge" in r]
    assert len(judged) == 4 and all(len(r["judge"]["repeats"]) == 2 for r in judged)
    # without the text, query and answer are left out and the record is still of its type
    no_text = Privacy.from_config(PrivacyConfig(store_text=False))
    for rec in records[:50]:
        stored = no_text.record(rec)
        assert "query" not in stored and "answer" not in stored
        check(stored, Record, "stored", {})


def _trace_with_every_field() -> Trace:
    return Trace(
        "q1",
        status="timeout",
        error="ReadTimeout",
        retrieved=[RetrievedChunk(1, "D#0", "D", 0, 40, 3.5)],
        intent_pred="K_b",
        intent_score=0.75,
        timings_ms={"retrieve": 2.0, "total": 3.0},
        intents=["K_a"],
        answer="30 days [1]",
        citations=[Citation(chunk_id="D#0"), Citation(doc_id="D", start=3, end=17)],
        usage=TokenUsage(120, 8, 128, 4),
        usage_count="local",
        cached=True,
        ttft_ms=1.5,
        http_status=504,
        retries=2,
        rewritten_query="refund window days",
        filters={"product": "K_b", "year": [2024, 2025]},
        candidates=[RetrievedChunk(1, "D#1", "D", 40, 80, 0.9), RetrievedChunk(2, "D#0", "D", 0, 40, 0.5)],
        context=[ContextChunk(1, "D#0", "D", 0, 40, 3.5, text="Refunds within 30 days.")],
        versions={"index": "ix-7", "corpus": "c-3", "prompt": "p-2", "model": "m-1"},
    )


def _trace_without_reranker() -> Trace:
    """A local system without a reranker: its retrieved list holds the candidates' own chunk objects."""
    chunks = [RetrievedChunk(1, "D#1", "D", 40, 80, 0.9), RetrievedChunk(2, "D#0", "D", 0, 40, 0.5)]
    return Trace("q1", retrieved=list(chunks), candidates=chunks)


# the Trace fields a record carries only when the system reported them (absent: None, or no versions)
STAGE_FIELDS = {"rewritten_query", "filters", "candidates", "context", "versions"}


@pytest.mark.parametrize(
    "trace",
    [Trace("q1"), _trace_with_every_field(), _trace_without_reranker()],
    ids=["defaults", "every-field", "no-reranker"],
)
def test_make_record_carries_the_whole_trace(trace: Trace) -> None:
    """Every Trace field but the query id is a record key, with the value Trace.to_dict gives it; the
    stage fields only when reported. Trace.from_dict reads the record back into the same trace."""
    q = load_dataset().queries[0]
    trace = dataclasses.replace(trace, query_id=q.query_id)
    rec: dict[str, Any] = dict(make_record(q, trace))
    reported = {k for k, v in trace.to_dict().items() if k in STAGE_FIELDS and v not in (None, {})}
    names = {f.name for f in dataclasses.fields(Trace)} - {"query_id"} - (STAGE_FIELDS - reported)
    assert names <= set(fields_of(Record)[0]) and names <= set(rec)
    assert not (STAGE_FIELDS - reported) & set(rec)
    expected = {k: v for k, v in trace.to_dict().items() if k in names}
    if "context" in expected:  # a context chunk's text is written only when known
        expected["context"] = [{k: v for k, v in c.items() if v is not None} for c in expected["context"]]
    assert {k: rec[k] for k in names} == expected
    check(json.loads(json.dumps(rec)), Record, "record", {})
    assert Trace.from_dict(json.loads(json.dumps(rec))) == trace
    if rec.get("candidates") is not None:  # its own list (the entries may be shared: never changed)
        assert rec["candidates"] is not rec["retrieved"]


def _readme_fields() -> tuple[set[str], set[str]]:
    """The keys README's record table names, and those it marks *sometimes*."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### The record: one line of `records.jsonl`", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    names: set[str] = set()
    sometimes: set[str] = set()
    for row in rows:
        first, rest = row.split("|")[1], "|".join(row.split("|")[2:])
        keys = set(re.findall(r"`([a-z_0-9]+)`", first))
        names |= keys
        if "*sometimes*" in rest:
            sometimes |= keys
    return names, sometimes


def test_readme_lists_every_record_field() -> None:
    names, sometimes = _readme_fields()
    declared, required = fields_of(Record)
    assert names == set(declared), (set(declared) - names, names - set(declared))
    assert sometimes == set(declared) - required  # the optional keys, and only they, say when
