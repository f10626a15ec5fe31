"""Large corpora: compact chunks and lazy views, token counts cached with the chunks, embeddings
written batch by batch into a memory-mapped cache entry, the dense index chosen by size, and a
dataset loader that holds every text once (docs/architecture.md "Large corpora")."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.config.schema import RunConfig
from rag_ablate.core.cache import Cache
from rag_ablate.core.errors import UnknownNameError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Document
from rag_ablate.pipeline import chunking, encoders
from rag_ablate.pipeline.chunking import (
    Chunks,
    ChunkSpans,
    ChunkTokenCounts,
    IndexTexts,
    chunk_corpus,
    chunk_key_parts,
    chunk_spans,
    tiebreak_ranks,
)
from rag_ablate.pipeline.dense import DenseIndex, choose_index
from rag_ablate.pipeline.encoders import _BatchedEncoder
from rag_ablate.systems.local import LocalSystem
from rag_ablate.text.count import count_tokens
from tests.conftest import REPO, write_dataset

SAMPLE_CHUNKINGS = ((128, 16), (256, 32), (512, 64))


@pytest.fixture(scope="module")
def sample() -> Dataset:
    return load_dataset(None)


def eager_tiebreak(chunks: Sequence[Any]) -> np.ndarray:
    """The tie ranks as the eager code computed them: position in (doc_id, row) order."""
    order = sorted(range(len(chunks)), key=lambda j: (chunks[j].doc_id, j))
    ranks = np.empty(len(chunks), dtype=np.int64)
    ranks[order] = np.arange(len(chunks))
    return ranks


def assert_same_as_eager(docs: list[Document], size: int, overlap: int, unit: str, snap: bool) -> None:
    eager, _ = chunk_corpus(docs, size, overlap, unit, snap)
    spans = chunk_spans(docs, size, overlap, unit, snap)
    lazy = Chunks(docs, spans)
    assert len(lazy) == len(eager)
    assert list(lazy) == eager  # ids, documents, offsets, text and title
    assert [lazy[i] for i in range(-len(eager), 0)] == eager
    assert lazy[1:3] == eager[1:3] and lazy[::-2] == eager[::-2]
    for out in (len(eager), -len(eager) - 1):  # like a list: out of range is an IndexError
        with pytest.raises(IndexError, match="chunk index"):
            lazy[out]
    assert np.array_equal(tiebreak_ranks(docs, spans), eager_tiebreak(eager))
    assert lazy.numbers().tolist() == [int(c.chunk_id.rsplit("#", 1)[1]) for c in eager]
    rows = [*range(len(eager) - 1, -1, -2), *range(0, len(eager), 3)]  # any order, repeats
    assert lazy.locate(rows) == [(c.chunk_id, c.doc_id, c.start, c.end) for c in (eager[i] for i in rows)]
    assert lazy.locate([]) == []
    for bad in ([len(eager)], [0, -1]):
        with pytest.raises(IndexError, match="chunk rows"):
            lazy.locate(bad)
    for include_title in (True, False):
        texts = IndexTexts(lazy, include_title)
        want = [c.index_text(include_title) for c in eager]
        assert list(texts) == want
        assert [texts[i] for i in range(-len(want), 0)] == want and texts[1:3] == want[1:3]
        with pytest.raises(IndexError, match="text index"):
            texts[len(want)]
        assert texts.lengths().tolist() == [len(t) for t in want]
    counts = ChunkTokenCounts(lazy)
    assert len(counts) == len(eager)
    for c in eager:
        assert counts[(c.doc_id, c.start, c.end)] == count_tokens(c.text)
    assert counts.get(("no such document", 0, 1)) is None
    if eager:
        c = eager[0]
        assert counts.get((c.doc_id, c.start, c.end + 1)) is None  # not a chunk of this chunking


@pytest.mark.parametrize(("size", "overlap"), SAMPLE_CHUNKINGS)
def test_lazy_chunks_equal_the_eager_chunks_on_the_sample(sample: Dataset, size: int, overlap: int) -> None:
    assert_same_as_eager(list(sample.documents.values()), size, overlap, "char", True)


_WORDS = st.sampled_from(
    ["退款", "到账", "。", "refund", "days", "3.5mm", "kz-55", "!", "\n", "é", "e\u0301"]
)
_TEXT = st.lists(_WORDS, min_size=1, max_size=40).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.tuples(_TEXT, st.one_of(st.none(), st.just(""), _TEXT)), min_size=1, max_size=6),
    size=st.integers(1, 30),
    overlap_share=st.floats(0, 0.9),
    unit=st.sampled_from(["char", "token"]),
    snap=st.booleans(),
)
def test_lazy_chunks_equal_the_eager_chunks_on_generated_documents(
    texts: list[tuple[str, str | None]], size: int, overlap_share: float, unit: str, snap: bool
) -> None:
    # ids out of alphabetical order, so the tie ranks differ from the row order
    docs = [Document(f"d{(7 * i) % 11}-{i}", text, title) for i, (text, title) in enumerate(texts)]
    assert_same_as_eager(docs, size, int(size * overlap_share), unit, snap)


def test_chunk_token_counts_match_the_checked_in_fixture(sample: Dataset, tmp_path: Path) -> None:
    """tests/data/sample_tokens.json holds count_tokens of each chunk's indexed text (title, a
    newline, text) computed with the old code; tokens never cross whitespace, so it is the
    title's count plus the chunk text's count the system caches."""
    fixture = json.loads((REPO / "tests" / "data" / "sample_tokens.json").read_text(encoding="utf-8"))
    for size, overlap in SAMPLE_CHUNKINGS:
        expected = fixture["chunkings"][f"{size}/{overlap}"]["chunks"]
        s = RunConfig()
        s.progress = False
        s.chunk.size, s.chunk.overlap = size, overlap
        system = LocalSystem(s, Cache(tmp_path / f"{size}"))
        system.prepare(sample)
        assert len(system.chunk_token_counts) == len(expected) == len(system.chunks)
        for c in system.chunks:
            cached = system.chunk_token_counts[(c.doc_id, c.start, c.end)]
            assert cached == count_tokens(c.text)
            assert cached + (count_tokens(c.title) if c.title else 0) == expected[c.chunk_id][0], c.chunk_id


def probe_keys(chunks: Sequence[Any], data: st.DataObject) -> list[Any]:
    """Keys to ask a ChunkTokenCounts: chunks' keys, near misses, and keys of other shapes and types."""
    c = data.draw(st.sampled_from(chunks))
    doc, s, e = c.doc_id, c.start, c.end
    near = data.draw(st.integers(-3, 3))
    return [
        (doc, s, e),
        (doc, s + near, e),
        (doc, s, e + near),
        (doc, s + near, e + near),
        (doc + "x", s, e),
        ("", s, e),
        (np.str_(doc), s, e),  # equal to doc_id: a dict finds it, so must the mapping
        (doc, np.int64(s), np.int32(e)),
        (doc, float(s), e),
        (doc, s, e + 0.5),
        (doc, bool(s), e),  # True == 1: a chunk starting at 1 (or 0) is found, as in a dict
        (doc, np.float64(s), np.uint8(e % 256)),
        [doc, s, e],  # not a tuple: never equal to a key
        (doc, s),
        (doc, s, e, 0),
        (),
        (doc, [s], e),  # unhashable parts: no chunk's key
        (doc, np.array(s), e),
        ([doc], s, e),
        doc,
        f"{doc}{s}{e}",
        None,
        s,
        (None, None, None),
        (doc, "s", "e"),
    ]


def dict_get(table: dict[Any, int], key: Any) -> int | None:
    """What a dictionary of every chunk answers, None for an unhashable key (a TypeError there)."""
    try:
        return table.get(key)
    except TypeError:
        return None


@settings(max_examples=80, deadline=None)
@given(
    texts=st.lists(_TEXT, min_size=1, max_size=5),
    size=st.integers(1, 12),
    overlap_share=st.floats(0, 0.9),
    unit=st.sampled_from(["char", "token"]),
    snap=st.booleans(),
    data=st.data(),
)
def test_chunk_token_counts_answer_as_a_dictionary_of_every_chunk(
    texts: list[str], size: int, overlap_share: float, unit: str, snap: bool, data: st.DataObject
) -> None:
    """Every chunk's key gives count_tokens of its text and every other key nothing (a KeyError,
    None or the default, not in), however the keys are mixed and repeated, documents asked for
    in any order."""
    docs = [Document(f"d{i % 3}-{i}", text) for i, text in enumerate(texts)]
    eager, _ = chunk_corpus(docs, size, int(size * overlap_share), unit, snap)
    want = {(c.doc_id, c.start, c.end): count_tokens(c.text) for c in eager}
    counts = ChunkTokenCounts(Chunks(docs, chunk_spans(docs, size, int(size * overlap_share), unit, snap)))
    keys = [k for _ in range(data.draw(st.integers(1, 4))) for k in probe_keys(eager, data)]
    for key in data.draw(st.permutations(keys)):
        n = dict_get(want, key)
        assert counts.get(key) == n and counts.get(key, -1) == (-1 if n is None else n), key
        assert (key in counts) == (n is not None), key
        if n is None:
            with pytest.raises(KeyError):
                counts[key]
        else:
            assert counts[key] == n
    assert len(counts) == len(want) and dict(counts.items()) == want


def test_chunk_token_counts_keep_nothing_but_the_document_positions() -> None:
    """The first lookup makes the documents' positions (a few Python objects a document); no
    lookup after it, of every chunk and misses of every kind, keeps anything."""
    words = ["退款", "到账", "。", "refund", "days", "3.5mm", "!", "\n"]
    docs = [Document(f"d{i}", " ".join(words[(i * j) % len(words)] for j in range(300))) for i in range(100)]
    lazy = Chunks(docs, chunk_spans(docs, 30, 5, "char", True))
    keys = list(ChunkTokenCounts(lazy))  # every chunk's key, from another mapping
    assert len(keys) > 40 * len(docs)
    only_chunking = [tracemalloc.Filter(True, chunking.__file__)]  # what its code allocated and holds

    def held() -> int:
        return sum(t.size for t in tracemalloc.take_snapshot().filter_traces(only_chunking).traces)

    tracemalloc.start()
    try:
        counts = ChunkTokenCounts(lazy)
        base = held()
        assert counts.get(keys[0]) is not None
        first = held() - base
        for k in keys:  # hits, then misses of every kind
            assert counts.get(k) is not None
            assert counts.get((k[0], k[1], k[2] + 1)) is None
            assert counts.get(("no such " + k[0], k[1], k[2])) is None
            assert k[:2] not in counts and counts.get([*k]) is None
        after = held() - base
    finally:
        tracemalloc.stop()
    assert first < 128 * len(docs), first  # the positions dictionary: nothing a chunk
    assert after == first, after - first  # 10,000s of lookups kept nothing


def small_settings() -> RunConfig:
    s = RunConfig()
    s.progress = False
    s.chunk.size, s.chunk.overlap = 20, 4
    return s


def chunk_entry(cache_root: Path, dataset: Dataset, s: RunConfig) -> Path:
    parts = chunk_key_parts(s.chunk, dataset.corpus_fingerprint, "token")
    return Cache(cache_root).entry("chunks", parts)


def test_a_chunk_entry_of_the_old_layout_or_damaged_is_built_again(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    s = small_settings()
    fresh = LocalSystem(s, Cache(tmp_path / "fresh"))
    fresh.prepare(dataset)
    want = list(fresh.chunks)

    root = tmp_path / "cache"
    entry = chunk_entry(root, dataset, s)
    entry.mkdir(parents=True)  # what the JSON layout wrote: data.json of [doc_id, start, end] rows
    (entry / "data.json").write_text(json.dumps([[c.doc_id, c.start, c.end] for c in want]), "utf-8")
    (entry / "meta.json").write_text(json.dumps({"kind": "chunks", "data": "data.json"}), "utf-8")
    system = LocalSystem(s, Cache(root))
    system.prepare(dataset)
    assert list(system.chunks) == want
    assert sorted(p.name for p in (entry / "data").iterdir()) == [
        "doc.npy",
        "end.npy",
        "start.npy",
        "tokens.npy",
    ]
    assert not (entry / "data.json").exists()

    (entry / "data" / "end.npy").write_bytes(b"\x93NUMPY damaged")  # a damaged entry
    again = LocalSystem(s, Cache(root))
    again.prepare(dataset)
    assert list(again.chunks) == want and again.chunk_token_counts == fresh.chunk_token_counts


def test_chunk_spans_refuse_arrays_of_another_corpus(tmp_path: Path) -> None:
    spans = chunk_spans([Document("a", "one two three"), Document("b", "four five")], 2, 0, "token")
    spans.save(tmp_path)
    assert len(ChunkSpans.load(tmp_path, 2)) == len(spans) == 3
    with pytest.raises(ValueError, match="outside the corpus"):
        ChunkSpans.load(tmp_path, 1)


# --------------------------------------------------------------------------- embeddings


class RowEncoder(_BatchedEncoder):
    """Deterministic unit rows from each text's length and first character; records its batches."""

    name, model_id, dim = "rows", "rows@1", 8

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def _encode_batch(self, texts: list[str], *, query: bool) -> np.ndarray:
        self.batches.append(texts)
        m = np.array([[len(t), ord(t[0]) if t else 0, 1, 2, 3, 4, 5, 6] for t in texts], dtype=np.float64)
        rows: np.ndarray = (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)
        return rows


class NoIteration(Sequence[str]):
    """Texts that may be indexed but not copied whole (iterating them fails)."""

    def __init__(self, texts: list[str]) -> None:
        self._texts = texts

    def __len__(self) -> int:
        return len(self._texts)

    def __getitem__(self, i: Any) -> Any:
        return self._texts[i]

    def __iter__(self) -> Any:
        raise AssertionError("the encoder iterated over every text")

    def lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self._texts], dtype=np.int64)


def test_the_encoder_writes_batches_into_the_given_matrix_reading_texts_by_index() -> None:
    texts = ["a", "ccc", "bb", "dddd", "ee", "f"]
    enc = RowEncoder()
    plain = enc.encode_passages(texts, batch_size=2)
    out = np.zeros((len(texts), 8), dtype=np.float32)
    got = enc.encode_passages(NoIteration(texts), batch_size=2, out=out)
    assert got is out
    np.testing.assert_array_equal(out, plain)
    assert enc.batches[-3:] == [["dddd", "ccc"], ["bb", "ee"], ["a", "f"]]  # longest first, stable
    with pytest.raises(ValueError, match="shape"):
        enc.encode_passages(texts, out=np.zeros((2, 8), dtype=np.float32))


def test_cache_matrix_is_filled_in_place_and_read_back_memory_mapped(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    calls: list[int] = []

    def fill(out: np.ndarray) -> None:
        calls.append(1)
        for s in range(0, out.shape[0], 3):  # batch by batch
            out[s : s + 3] = np.arange(s, min(s + 3, out.shape[0]))[:, None]

    first = cache.matrix("embeddings", {"x": 1}, (10, 4), fill)
    assert isinstance(first, np.memmap) and not first.flags.writeable
    again = cache.matrix("embeddings", {"x": 1}, (10, 4), fill)
    np.testing.assert_array_equal(again, first)
    assert first[7].tolist() == [7.0] * 4
    assert calls == [1] and cache.stats["embeddings"].hits == 1
    rebuilt = cache.matrix("embeddings", {"x": 1}, (11, 4), fill)  # not what the entry holds: built again
    assert rebuilt.shape == (11, 4) and calls == [1, 1]
    off = Cache(tmp_path / "off", enabled=False).matrix("embeddings", {"x": 1}, (0, 4), fill)
    assert off.shape == (0, 4) and not (tmp_path / "off").exists()


# --------------------------------------------------------------------------- the dense index by size


def test_choose_index_by_size() -> None:
    assert choose_index("auto", 100, 100) == "exact"
    assert choose_index("auto", 101, 100) == "usearch"
    assert choose_index("exact", 10**9, 100) == "exact"
    assert choose_index("usearch", 1, 100) == "usearch"
    with pytest.raises(UnknownNameError, match="auto, exact, usearch"):
        choose_index("hnsw", 1, 100)


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    m = rng.standard_normal((n, dim))
    rows: np.ndarray = (m / np.linalg.norm(m, axis=1, keepdims=True)).astype(np.float32)
    return rows


def test_a_saved_graph_opens_memory_mapped_and_answers_as_the_built_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    matrix = unit_rows(rng, 3000, 64)
    np.save(tmp_path / "m.npy", matrix)
    mapped = np.load(tmp_path / "m.npy", mmap_mode="r")  # as the embeddings cache hands it over
    tiebreak = np.arange(3000)
    built = DenseIndex(mapped, tiebreak, kind="usearch")
    built.save_graph(tmp_path / "graph.usearch")
    opened = DenseIndex(mapped, tiebreak, kind="usearch", graph=tmp_path / "graph.usearch")
    queries = unit_rows(rng, 200, 64)
    found = opened.search_many(queries, 10)
    assert found == built.search_many(queries, 10)
    truth = DenseIndex(mapped, tiebreak).search_many(queries, 10)
    recall = np.mean(
        [len({i for i, _ in f} & {i for i, _ in t}) / 10 for f, t in zip(found, truth, strict=True)]
    )
    assert recall >= 0.9, recall  # the documented floor for small corpora (docs/architecture.md)
    with pytest.raises(ValueError, match="not a usearch graph of this matrix"):
        DenseIndex(mapped[:2999], tiebreak[:2999], kind="usearch", graph=tmp_path / "graph.usearch")


class FakeMinilm:
    """An encoder with cheap, deterministic vectors (the dense index is under test, not the model)."""

    name, model_id, dim = "minilm", "fake-minilm", 16

    def __init__(self) -> None:
        from rag_ablate.pipeline.encoders import EncoderSettings

        self.settings = EncoderSettings("minilm", "fake-minilm", "", "", True, None, "truncate", 16, ())

    def _rows(self, texts: Sequence[str]) -> np.ndarray:
        seeds = [sum(map(ord, t)) for t in texts]
        return np.vstack([unit_rows(np.random.default_rng(x), 1, self.dim) for x in seeds])

    def encode_passages(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
        return self._rows(texts)

    def encode_queries(self, texts: Sequence[str], **kw: Any) -> np.ndarray:
        return self._rows(texts)

    def count_tokens(self, texts: Sequence[str], *, query: bool) -> list[int]:
        return [len(t.split()) for t in texts]


@pytest.mark.parametrize(("approximate_above", "kind"), [(1, "usearch"), (10**6, "exact")])
def test_auto_picks_the_index_by_the_number_of_chunks_and_caches_the_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, approximate_above: int, kind: str
) -> None:
    monkeypatch.setattr(encoders, "load_encoder", lambda name: FakeMinilm())
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    s = small_settings()
    s.retrieval.method = "dense"
    s.retrieval.dense.encoder = "minilm"
    s.retrieval.dense.approximate_above = approximate_above
    assert s.retrieval.dense.index == "auto"  # the default
    runs = []
    for _ in range(2):  # the second run finds the graph in the cache
        cache = Cache(tmp_path / "cache")
        system = LocalSystem(s, cache)
        info = system.prepare(dataset)
        assert info["retrieval.dense.index_resolved"] == kind
        runs.append([[r.chunk_id for r in system.run(q).retrieved] for q in dataset.queries])
        graph = cache.stats.get("dense_graph")
        if kind == "exact":
            assert graph is None
        else:
            assert graph is not None
            assert (graph.misses, graph.hits) == ((1, 0) if len(runs) == 1 else (0, 1))
    assert runs[0] == runs[1]
    s.retrieval.dense.index = "exact"
    exact = LocalSystem(s, Cache(tmp_path / "cache"))
    exact.prepare(dataset)
    # a corpus this small: the HNSW beam holds every chunk, so the approximate lists are exact
    assert runs[0] == [[r.chunk_id for r in exact.run(q).retrieved] for q in dataset.queries]


# --------------------------------------------------------------------------- loading a dataset


def peak_while_loading(folder: Path) -> int:
    tracemalloc.start()
    try:
        load_dataset(folder)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_loading_holds_every_text_about_once(tmp_path: Path) -> None:
    """The memory a corpus adds to loading stays near the documents' own size: the loader reads a
    line at a time and fingerprints as it goes (it used to hold the file's bytes, its decoded
    text, its lines and every parsed record at once: five to six times the texts)."""
    query = json.dumps({"query_id": "q1", "query": "refund days", "relevant": {"d0": 1}}) + "\n"
    words = ["refund", "order", "shipping", "warranty", "days", "policy", "item", "return"]
    texts = 0
    for name, n_docs in (("one", 1), ("big", 20_000)):
        folder = tmp_path / name
        folder.mkdir()
        with (folder / "corpus.jsonl").open("w", encoding="utf-8") as f:
            for i in range(n_docs):
                text = " ".join(words[(i * 7 + j) % len(words)] for j in range(60)) + f" {i}"
                f.write(json.dumps({"doc_id": f"d{i}", "text": text}) + "\n")
                texts += len(text) + 49 if n_docs > 1 else 0  # an ASCII str's bytes
        (folder / "queries.jsonl").write_text(query, "utf-8")
    load_dataset(tmp_path / "one")  # imports done before measuring
    # what the corpus adds to the peak: the one-document load has the same fixed costs (grouping)
    added = peak_while_loading(tmp_path / "big") - peak_while_loading(tmp_path / "one")
    assert added < 2.0 * texts, (added, texts)
