"""context_tokens_at_k counts each distinct retrieved chunk once per run (issue 16).

:class:`rag_ablate.records.scoring.TokenCounts` memoises ``count_tokens`` per ``(doc_id, start, end)``
and takes counts known already (a local system's, cached with its chunks) through ``seed``.
Checked here: the memo equals ``count_tokens`` (random texts with CJK, Latin, punctuation,
combining marks), ``context_tokens_at_k`` equals the previous definition
(``context_tokens`` of the first k chunk texts), the counts of the embedded sample's chunks
equal the fixed expectation computed with the old code (tests/data/sample_tokens.json), and
a run (``evaluate``) or a rescoring tokenises each distinct chunk once, or not at all when the
system hands its counts over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError
from rag_ablate.dataset.load import load_dataset
from rag_ablate.dataset.model import Dataset, Document, Query
from rag_ablate.pipeline.chunking import chunk_corpus
from rag_ablate.records import scoring as records_mod
from rag_ablate.records.scoring import TokenCounts, rescore, score_record, scored
from rag_ablate.records.trace import RetrievedChunk, Trace
from rag_ablate.run.runner import evaluate
from rag_ablate.text.count import context_tokens, count_tokens

FIXTURE = Path(__file__).parent / "data" / "sample_tokens.json"

# letters of several scripts, CJK ideographs and punctuation, kana, hangul, digits, spaces
# (incl. the ideographic space), ASCII punctuation, a combining acute accent and an emoji
ALPHABET = st.sampled_from(
    list("abcXYZ019 \t\n.,-_!?你好世界退货运费，。！？（）「」、こんにちはカタカナ안녕ＡＢ１\u3000\u0301é😀")
)
TEXTS = st.text(ALPHABET, max_size=80)


def _docs(texts: Sequence[str]) -> dict[str, Document]:
    return {f"D{i}": Document(f"D{i}", text) for i, text in enumerate(texts)}


@st.composite
def chunks_of(draw: st.DrawFn) -> tuple[dict[str, Document], list[dict[str, Any]]]:
    docs = _docs(draw(st.lists(TEXTS, min_size=1, max_size=4)))
    retrieved: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 14))):
        doc_id = draw(st.sampled_from(sorted(docs)))
        n = len(docs[doc_id].text)
        start = draw(st.integers(0, n))
        end = draw(st.integers(start, n))
        retrieved.append({"doc_id": doc_id, "start": start, "end": end})
    return docs, retrieved


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, data=st.data())
def test_memo_equals_count_tokens(text: str, data: st.DataObject) -> None:
    docs = _docs([text])
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    memo = TokenCounts()
    first = memo.count("D0", start, end, docs)
    assert first == count_tokens(text[start:end])
    assert memo.count("D0", start, end, docs) == first and memo.tokenised == 1  # the second is remembered


@settings(max_examples=300, deadline=None)
@given(case=chunks_of(), ks=st.lists(st.integers(1, 20), min_size=1, max_size=5))
def test_context_tokens_at_k_equals_the_previous_definition(
    case: tuple[dict[str, Document], list[dict[str, Any]]], ks: list[int]
) -> None:
    docs, retrieved = case
    texts = [docs[r["doc_id"]].text[r["start"] : r["end"]] for r in retrieved]
    memo = TokenCounts()
    got = memo.context_tokens_at(retrieved, docs, ks)
    assert got == {f"context_tokens_at_{k}": float(context_tokens(texts, k)) for k in ks}
    assert list(got) == [f"context_tokens_at_{k}" for k in dict.fromkeys(ks)]
    counted = {(r["doc_id"], r["start"], r["end"]) for r in retrieved[: max(ks)]}
    assert memo.tokenised == len(counted)  # each distinct chunk once, however often and at however many k


def test_sample_chunk_counts_equal_the_fixed_expectation() -> None:
    """Counts of every chunk of the sample (128/16, 256/32, 512/64) agree with those of the old code."""
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))["chunkings"]
    ds = load_dataset()
    docs = list(ds.documents.values())
    for setting, expected in fixture.items():
        size, overlap = (int(x) for x in setting.split("/"))
        chunks, _ = chunk_corpus(docs, size, overlap, expected["unit"])
        assert {c.chunk_id for c in chunks} == set(expected["chunks"]), setting
        memo = TokenCounts()
        for c in chunks:
            # the fixture counts the indexed text, the title line first (include_title); the context
            # counts the chunk's own text: the title's tokens are the difference
            title = count_tokens(c.title) if c.title else 0
            assert (
                memo.count(c.doc_id, c.start, c.end, ds.documents) + title
                == expected["chunks"][c.chunk_id][0]
            )
        assert memo.tokenised == len(chunks)


def test_seeded_counts_are_used_as_they_are() -> None:
    docs = _docs(["退货运费由谁承担？ who pays", "第二篇"])
    seeded = {("D0", 0, 9): 9}
    memo = TokenCounts(seeded)
    retrieved = [{"doc_id": "D0", "start": 0, "end": 9}, {"doc_id": "D1", "start": 0, "end": 3}]
    assert memo.context_tokens_at(retrieved, docs, [1, 2, 5]) == {
        "context_tokens_at_1": 9.0,
        "context_tokens_at_2": 12.0,
        "context_tokens_at_5": 12.0,
    }
    assert memo.tokenised == 1  # only D1's chunk was tokenised
    # a seed is the system's own count: it is trusted, never recomputed (so it must equal count_tokens)
    wrong = TokenCounts({("D0", 0, 9): 100})
    assert wrong.context_tokens_at(retrieved[:1], docs, [1]) == {"context_tokens_at_1": 100.0}


def test_unknown_document_fails_the_query_even_past_the_largest_cutoff() -> None:
    docs = _docs(["abc def"])
    retrieved = [{"doc_id": "D0", "start": 0, "end": 3}, {"doc_id": "NOPE", "start": 0, "end": 3}]
    with pytest.raises(KeyError):
        TokenCounts().context_tokens_at(retrieved, docs, [1])
    q = Query("q", "x", {}, (), False, True, (), None, None, "dev", "g")
    rec = {"query_id": "q", "status": "ok", "retrieved": retrieved, "timings_ms": {"total": 2.0}}
    out = scored(rec, q, docs, [1], routed=False, tokens=TokenCounts())
    assert out["status"] == "failed" and out["error"].startswith("scoring failed: KeyError")
    with pytest.raises(ConfigError):
        score_record({**rec, "retrieved": retrieved[:1]}, q, docs, [0], routed=False)


def test_a_runs_cutoffs_are_checked_once_and_bad_ones_still_fail_each_record() -> None:
    docs = _docs(["abc def"])
    q = Query("q", "x", {"D0": 1}, (), True, True, (), None, None, "dev", "g")
    rec = {"query_id": "q", "status": "ok", "retrieved": [{"doc_id": "D0", "start": 0, "end": 3}]}
    key = records_mod.run_cutoffs([1, 5])
    assert key == (1, 5) and records_mod.run_cutoffs([1, 5]) is key  # one shared tuple per run
    assert (
        scored(rec, q, docs, key, routed=False)["metrics"]
        == scored(rec, q, docs, [1, 5], routed=False)["metrics"]
    )
    for bad in ([1, 0], [True, 5], [1, 2.0]):
        assert records_mod.run_cutoffs(bad) is bad  # left as given: each record's scoring fails, as before
        out = scored(rec, q, docs, bad, routed=False)  # type: ignore[arg-type]
        assert out["status"] == "failed" and "cutoff k must be a positive integer" in out["error"]


def test_a_query_scored_against_another_corpus_uses_that_corpus() -> None:
    """The labels scoring remembers per query (its relevant documents, whether the user may see one)
    belong to one corpus: the same query against a corpus without its document has none present."""
    q = Query("q", "x", {"D0": 1}, (), True, True, (), None, None, "dev", "g")
    rec = {"query_id": "q", "status": "ok", "retrieved": [{"doc_id": "D1", "start": 0, "end": 3}]}
    both, other = _docs(["abc def", "ghi"]), {"D1": Document("D1", "ghi")}
    assert scored(rec, q, both, [1], routed=False)["failure_stage"] == "not_retrieved"
    assert scored(rec, q, other, [1], routed=False)["failure_stage"] == "no_relevant_in_corpus"
    assert scored(rec, q, both, [1], routed=False)["failure_stage"] == "not_retrieved"
    assert all(labels.docs is both for labels in records_mod._LABELS.values())  # the other corpus is not held


def _sample_run() -> tuple[Dataset, list[dict[str, Any]], list[tuple[str, int, int]]]:
    ds = load_dataset()
    chunks, _ = chunk_corpus(list(ds.documents.values()), 256, 32, "char")
    keys = [(c.doc_id, c.start, c.end) for c in chunks]
    recs = []
    for i, q in enumerate(ds.queries):
        picked = [keys[(7 * i + j * j) % 60] for j in range(10)]  # 60 chunks shared by 364 queries
        recs.append(
            {
                "query_id": q.query_id,
                "split": q.split,
                "kind": q.kind,
                "status": "ok",
                "retrieved": [
                    {"rank": r + 1, "chunk_id": f"{d}@{s}", "doc_id": d, "start": s, "end": e, "score": 1.0}
                    for r, (d, s, e) in enumerate(picked)
                ],
                "timings_ms": {"total": 1.0},
            }
        )
    return ds, recs, keys


def test_rescore_tokenises_each_distinct_chunk_once_and_keeps_the_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ds, recs, _ = _sample_run()
    ks = [1, 3, 5, 10]
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return count_tokens(text)

    monkeypatch.setattr(records_mod, "count_tokens", counting)
    memo = TokenCounts()
    out = rescore(recs, ds, ks, False, tokens=memo)
    distinct = {(c["doc_id"], c["start"], c["end"]) for r in recs for c in r["retrieved"]}
    assert len(calls) == memo.tokenised == len(distinct) == 60  # not 364 queries x 10 chunks x 4 k
    for rec, res in zip(recs, out, strict=True):
        texts = [ds.documents[c["doc_id"]].text[c["start"] : c["end"]] for c in rec["retrieved"]]
        for k in ks:
            if res["kind"] != "no_rag":
                assert res["metrics"][f"context_tokens_at_{k}"] == float(context_tokens(texts, k))


class _FixedSystem:
    """Returns the same ten chunks of the sample per query (a stand-in retriever for the runner)."""

    routes_intents = False

    def __init__(self, picks: dict[str, list[tuple[str, int, int]]], counts: dict[Any, int] | None) -> None:
        self.picks = picks
        if counts is not None:
            self.chunk_token_counts = counts

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        return {}

    def run(self, query: Query) -> Trace:
        retrieved = [
            RetrievedChunk(r + 1, f"{d}@{s}", d, s, e, 1.0)
            for r, (d, s, e) in enumerate(self.picks[query.query_id])
        ]
        return Trace(query.query_id, retrieved=retrieved)

    def close(self) -> None:
        return None


@pytest.mark.parametrize("seeded", [False, True])
def test_a_run_counts_each_chunk_once_or_uses_the_systems_counts(
    monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    ds, recs, keys = _sample_run()
    picks = {r["query_id"]: [(c["doc_id"], c["start"], c["end"]) for c in r["retrieved"]] for r in recs}
    counts = (
        {key: count_tokens(ds.documents[key[0]].text[key[1] : key[2]]) for key in keys} if seeded else None
    )
    calls: list[str] = []

    def counting(text: str) -> int:
        calls.append(text)
        return count_tokens(text)

    monkeypatch.setattr(records_mod, "count_tokens", counting)
    out = evaluate(_FixedSystem(picks, counts), ds, [1, 5, 10])
    assert len(calls) == (0 if seeded else 60)
    by_id = {r["query_id"]: r for r in out}
    for rec in recs:
        if rec["kind"] == "no_rag":
            continue
        texts = [ds.documents[c["doc_id"]].text[c["start"] : c["end"]] for c in rec["retrieved"]]
        got = by_id[rec["query_id"]]["metrics"]
        assert [got[f"context_tokens_at_{k}"] for k in (1, 5, 10)] == [
            float(context_tokens(texts, k)) for k in (1, 5, 10)
        ]
