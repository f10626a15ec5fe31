"""Per-query records: write, read, score and aggregate.

A record is one JSON line per query in ``records.jsonl``: the query's identity
(id, split, group, kind, gold intent), the system's trace (retrieved chunks with
doc ids, offsets and scores; predicted intent; status; stage timings) and the
per-query metric values. :func:`score_record` computes the values from the
record's own fields plus the dataset, so every number can be recomputed from disk.

While a job runs, :class:`RecordWriter` appends each record as its query completes, before
scoring (written at once, fsync'd about every second), so an interrupted run keeps its
finished queries and ``resume=`` reruns only the rest; the reader ignores a
half-written last line. Every record is scored once the queries are done (:func:`score_all`).
When the job ends, :func:`write_records` rewrites the file atomically with exactly one final,
scored record per query, in dataset order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, chain
from operator import countOf, is_, itemgetter
from typing import cast

import numpy as np
import numpy.typing as npt

from rag_ablate.core.errors import ConfigError
from rag_ablate.core.layout import RECORDS_FILE as RECORDS_FILE  # re-exported
from rag_ablate.dataset.model import SPLITS, Dataset, Document, Query
from rag_ablate.dataset.weights import TagWeights, run_metrics
from rag_ablate.metrics import stages
from rag_ablate.metrics.acl import acl_metrics, has_restrictions, may_see
from rag_ablate.metrics.answers import AnswerScoring, answer_metrics
from rag_ablate.metrics.intent import intent_top1
from rag_ablate.metrics.registry import metric_names_at, spec_of
from rag_ablate.metrics.retrieval import (
    chunk_metrics,
    cutoffs,
    evidence_at,
    ranking_names,
    ranking_values,
    set_metrics,
)
from rag_ablate.records.trace import Record, RetrievedChunk, RetrievedEntry, Trace
from rag_ablate.text.count import count_tokens


def make_record(query: Query, trace: Trace) -> Record:
    """A query's record before scoring: its identity, tags and gold intents, and the system's trace.

    ``tags`` (the query's tags) and the gold intents make the record enough to recompute its
    slices (:mod:`rag_ablate.run.slices`); records written before tags were recorded have no
    ``tags`` key and stay readable (their tag slices leave them out). ``metrics`` is empty until
    :func:`scored` fills it. The query's ``metadata``, ``applicable_version`` and
    ``expected_behavior`` are kept when the dataset gives them (slices read them too).
    """
    citations = trace.citations
    rec: Record = {
        "query_id": query.query_id,
        "query": query.query,
        "split": query.split,
        "group": query.group,
        "kind": query.kind,
        "tags": list(query.tags),
        "intent_gold": query.intent_l2,
        "intent_gold_l1": query.intent_l1,
        # the trace's fields, in its order (Trace.to_dict without the query id)
        "status": trace.status,
        "error": trace.error,
        "retrieved": None if trace.retrieved is None else RetrievedChunk.entries(trace.retrieved),
        "intent_pred": trace.predicted_intent,
        "intent_score": trace.intent_score,
        "timings_ms": dict(trace.timings_ms),
        "intents": list(trace.intents),
        "answer": trace.answer,
        "citations": None if citations is None else [c.to_entry() for c in citations] if citations else [],
        "usage": None if trace.usage is None else trace.usage.to_entry(),
        "usage_count": trace.usage_count,
        "cached": trace.cached,
        "ttft_ms": trace.ttft_ms,
        "http_status": trace.http_status,
        "retries": trace.retries,
        "failure_stage": None,  # filled by scored()
        "metrics": {},  # filled by scored()
    }
    if query.repeat is not None:  # system.repeats > 1: one record per (query, repeat)
        rec["repeat"] = query.repeat
    # the stages the system reported, each key only when reported
    if trace.rewritten_query is not None:
        rec["rewritten_query"] = trace.rewritten_query
    if trace.filters is not None:
        rec["filters"] = dict(trace.filters)
    if trace.candidates is not None:
        rec["candidates"] = _candidate_entries(trace.candidates, trace.retrieved, rec["retrieved"])
    if trace.context is not None:
        rec["context"] = [c.to_context_entry() for c in trace.context]
    if trace.versions:
        rec["versions"] = dict(trace.versions)
    if query.metadata:
        rec["metadata"] = dict(query.metadata)
    if query.applicable_version is not None:
        rec["applicable_version"] = query.applicable_version
    if query.expected_behavior is not None:
        rec["expected_behavior"] = query.expected_behavior
    return rec


def _candidate_entries(
    candidates: Sequence[RetrievedChunk],
    retrieved: Sequence[RetrievedChunk] | None,
    entries: list[RetrievedEntry] | None,
) -> list[RetrievedEntry]:
    """The ``candidates`` entries of a record whose ``retrieved`` chunks made ``entries``: a new list of
    the same entry dicts when the two lists hold the very same chunk objects (a system without a
    reranker hands its candidates on as they are; nothing changes an entry once made), else each
    candidate's own entry."""
    same = entries is not None and retrieved is not None and len(candidates) == len(retrieved)
    if same and all(map(is_, candidates, cast("Sequence[RetrievedChunk]", retrieved))):
        return list(cast("list[RetrievedEntry]", entries))
    return RetrievedChunk.entries(candidates)


_DOC_ID, _CHUNK_ID = itemgetter("doc_id"), itemgetter("chunk_id")  # an entry's ids
_CHUNK_KEY = itemgetter("doc_id", "start", "end")  # an entry's ChunkKey
_INDICATORS = {stage: stages.indicators(stage) for stage in stages.STAGES}  # copied into a record's metrics

ChunkKey = tuple[str, int, int]  # (doc_id, start, end): a chunk's character range in its document


class TokenCounts:
    """:func:`~rag_ablate.text.count.count_tokens` of chunk texts, each distinct chunk counted once.

    A chunk is its ``(doc_id, start, end)``; its text is ``docs[doc_id].text[start:end]`` (no
    title), what ``context_tokens_at_k`` sums. One memo serves a whole run (every query and
    every cutoff): the same retrieved chunk is tokenised once, not once per query and k.
    :meth:`seed` hands it counts known already (``LocalSystem.chunk_token_counts``, cached
    with the chunks), which are then used as they are (they must equal ``count_tokens``).
    Safe to share between threads (a race can only count a chunk twice, to the same value).
    """

    def __init__(self, counts: Mapping[ChunkKey, int] | None = None) -> None:
        self._memo: dict[ChunkKey, int] = {}
        self._seeds: list[Mapping[ChunkKey, int]] = []
        self.tokenised = 0  # texts this memo tokenised itself (not seeded, not repeated)
        if counts:
            self.seed(counts)

    def seed(self, counts: Mapping[ChunkKey, int]) -> None:
        """Use ``counts`` ((doc_id, start, end) -> count) for the chunks it has; kept, not copied."""
        if counts:
            self._seeds.append(counts)

    def __len__(self) -> int:
        return len(self._memo)

    def count(self, doc_id: str, start: int, end: int, docs: Mapping[str, Document]) -> int:
        """Tokens of ``docs[doc_id].text[start:end]`` (KeyError for an unknown document)."""
        key = (doc_id, start, end)
        n = self._memo.get(key)
        return self._first(key, docs) if n is None else n

    def _first(self, key: ChunkKey, docs: Mapping[str, Document]) -> int:
        """A chunk not met before: its seeded count, or count_tokens of its text."""
        for seeded in self._seeds:
            n = seeded.get(key)
            if n is not None:
                break
        else:
            doc_id, start, end = key
            n = count_tokens(docs[doc_id].text[start:end])
            self.tokenised += 1
        self._memo[key] = n
        return n

    def context_tokens_at(
        self, retrieved: Sequence[RetrievedEntry], docs: Mapping[str, Document], ks: Sequence[int]
    ) -> dict[str, float]:
        """``context_tokens_at_k`` for every k: tokens of the first k retrieved chunks (all when
        fewer), from prefix sums over the chunks' counts; equal to
        :func:`~rag_ablate.text.count.context_tokens` of their texts. Every chunk's document
        must exist (KeyError otherwise); only the first ``max(ks)`` chunks are counted."""
        chunks = [(r["doc_id"] or "", r["start"], r["end"]) for r in retrieved]  # no document: KeyError
        key = tuple(ks)
        return dict(
            zip(metric_names_at("context_tokens", key), self.tokens_at(chunks, docs, key), strict=True)
        )

    def tokens_at(
        self, chunks: Sequence[ChunkKey], docs: Mapping[str, Document], ks: Sequence[int]
    ) -> list[float]:
        """:meth:`context_tokens_at`'s values, in the order of ``ks``, from the retrieved chunks' keys."""
        limit = max(ks) if ks else 0  # (max's default= keyword: 0.15 us more)
        top = chunks if len(chunks) <= limit else chunks[:limit]  # read only
        memo = self._memo
        counts: list[int | None] = list(map(memo.get, top))  # the counts met before, in C
        if None in counts:  # a chunk not met before (which may repeat): counted once, in order
            for i, n in enumerate(counts):
                if n is None:
                    key = top[i]
                    n = memo.get(key)  # (met earlier in this list)
                    counts[i] = self._first(key, docs) if n is None else n
        if len(chunks) > limit:
            for doc_id, _, _ in chunks[limit:]:
                if doc_id not in docs:
                    raise KeyError(doc_id)
        prefix = list(accumulate(cast("list[int]", counts), initial=0))
        n = len(counts)
        return [float(prefix[k if k < n else n]) for k in ks]


class _Labels:
    """What scoring reads of one query's labels for each of its records, made once per query and
    corpus (:func:`_labels_of`): the judged labels (``judged_at_k``, ``bpref``), the evidence spans,
    the relevant documents and chunks (grade > 0) and whether the user may see one of the documents."""

    __slots__ = ("docs", "judged", "query", "rel_chunks", "rel_docs", "spans", "visible")

    def __init__(self, query: Query, docs: Mapping[str, Document]) -> None:
        self.query, self.docs = query, docs  # kept: the ids the cache is keyed by are never reused meanwhile
        self.judged = {**dict.fromkeys(query.nonrelevant, 0), **query.relevant}  # judged either way
        self.spans = [(e.doc_id, e.start, e.end) for e in query.evidence]
        self.rel_docs = {d for d, grade in query.relevant.items() if grade > 0}
        self.rel_chunks = {c for c, grade in query.relevant_chunks.items() if grade > 0}
        self.visible = any(
            d in docs and may_see(docs[d].allowed_groups, query.user_groups) for d in self.rel_docs
        )


_LABELS: dict[int, _Labels] = {}  # id(query) -> its _Labels, all against one corpus
_LABELS_CORPUS: list[Mapping[str, Document]] = []  # that corpus
_LABELS_MAX = 1 << 16


def _labels_of(query: Query, docs: Mapping[str, Document]) -> _Labels:
    """The query's :class:`_Labels` against ``docs``, remembered (a run scores each query once per
    repeat, a rescore and the judge's pass again). Only one corpus's queries are kept: another corpus
    starts afresh, so a finished job's dataset is not held."""
    known = _LABELS.get(id(query))
    if known is not None and known.query is query and known.docs is docs:
        return known
    if len(_LABELS) >= _LABELS_MAX or not _LABELS_CORPUS or _LABELS_CORPUS[0] is not docs:
        _LABELS.clear()
        _LABELS_CORPUS[:] = [docs]
    made = _LABELS[id(query)] = _Labels(query, docs)
    return made


def score_record(
    rec: Record,
    query: Query,
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
    answers: AnswerScoring | None = None,
    tokens: TokenCounts | None = None,
    answered: bool = False,
) -> dict[str, float | None]:
    """Per-query metric values of one record.

    A failed query gets no quality values: ``latency_ms`` (its time until it failed) and, for
    every metric with a failure-aware form (``MetricSpec.miss``) that would have applied to the
    query, the name with the value None (:func:`applicable_misses`): "applies, no value, the query
    failed", from which aggregates and comparisons derive the failure-aware form; never a 0. A record with an
    ``answer`` also gets the answer metrics (:func:`rag_ablate.metrics.answers.answer_metrics`,
    scored with ``answers``, default :class:`~rag_ablate.metrics.answers.AnswerScoring`); when it
    carries an LLM judge's verdicts (``judge``, added by :mod:`rag_ablate.run.judging`), the judged
    metrics too, and the judge's refusal and citation-support verdicts enter those metrics.
    When the corpus restricts documents (``allowed_groups``), every query that retrieved
    (answerable and unanswerable) gets the access-control leak metrics
    (:mod:`rag_ablate.metrics.acl`).

    ``tokens`` is the run's memo of chunk token counts (:class:`TokenCounts`); without one,
    this record's chunks are counted afresh.
    """
    out: dict[str, float | None] = {}
    timings = rec.get("timings_ms") or {}
    if "total" in timings:
        out["latency_ms"] = float(timings["total"])
    if rec["status"] != "ok":
        out.update(applicable_misses(rec, query, docs, ks, routed=routed, answered=answered))
        return out
    if routed and query.intent_l2 is not None:
        out["intent_top1"] = intent_top1(query.intent_l2, rec.get("intent_pred"))
    if rec.get("answer") is not None:
        out.update(answer_metrics(rec, query, docs, answers or AnswerScoring()))
    retrieved = rec.get("retrieved")
    kind = query.kind  # (a property: read once)
    if kind == "no_rag" or retrieved is None:  # None: the system reports no evidence
        return out
    ids = list(map(_DOC_ID, retrieved))
    if None in ids:  # chunks named by id only: no document-level metrics
        return out
    ranked = cast("list[str]", ids)  # every chunk names its document
    key = cutoffs(ks)[0]
    chunks = cast("list[ChunkKey]", list(map(_CHUNK_KEY, retrieved)))  # (doc_id, start, end), in C
    # the names of the values below, part by part, and the values in the same order: put into the
    # metrics in one update at the end (a dict or an update per part cost more); both flat lists
    tokens_names, rank_names, recall_names, coverage_names = _names_of(key)
    names = list(tokens_names)
    values = (TokenCounts() if tokens is None else tokens).tokens_at(chunks, docs, key)
    if has_restrictions(docs):  # security metrics beside quality, answerable and unanswerable alike
        _add(names, values, acl_metrics(ranked, docs, query.user_groups, key))
    if kind == "answerable":
        labels = _labels_of(query, docs)
        if query.relevant:  # absent when the query names gold chunks only (relevant_chunks)
            # retrieval metrics, judged_at_k and bpref from one pass over the ranking
            names += rank_names
            values += ranking_values(ranked, labels.judged, key)
        if query.relevant_sets:  # alternative evidence sets, each sufficient (docs/metrics.md)
            _add(names, values, set_metrics(ranked, query.relevant_sets, key))
        # gold chunk ids: scored when every retrieved item carries a chunk id (no items: a miss)
        if query.relevant_chunks and all(r.get("chunk_id") for r in retrieved):
            _add(names, values, chunk_metrics([r["chunk_id"] for r in retrieved], query.relevant_chunks, key))
        if query.evidence:
            recall, coverage = evidence_at(chunks, labels.spans, key)
            names += recall_names
            names += coverage_names
            values += recall
            values += coverage
    # the lengths checked here rather than by zip(strict=...) (a keyword argument makes zip's call
    # 0.15 us slower), the names one flat list rather than chained tuples: 2.0 -> 1.5 us for 41 values
    if len(names) != len(values):
        raise ValueError(f"score_record: {len(names)} metric names for {len(values)} values")
    out.update(zip(names, values))  # noqa: B905 (lengths checked above)
    return out


_NAMES_OF: dict[tuple[int, ...], tuple[tuple[str, ...], ...]] = {}  # checked cutoffs -> _names_of


def _names_of(key: tuple[int, ...]) -> tuple[tuple[str, ...], ...]:
    """The names :func:`score_record` gives at the checked cutoffs ``key``: context tokens, the ranking
    metrics, evidence recall and coverage (one lookup per record instead of one per part)."""
    names = _NAMES_OF.get(key)
    if names is None:
        if len(_NAMES_OF) > 256:
            _NAMES_OF.clear()
        tokens = metric_names_at("context_tokens", key)
        recall = metric_names_at("evidence_recall", key)
        coverage = metric_names_at("evidence_coverage", key)
        names = _NAMES_OF[key] = (tokens, ranking_names(key), recall, coverage)
    return names


def _add(names: list[str], values: list[float], metrics: dict[str, float]) -> None:
    """One part of :func:`score_record`'s values given as a dict: its names and values appended."""
    names += metrics
    values += metrics.values()


def applicable_misses(
    rec: Record,
    query: Query,
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
    answered: bool,
) -> dict[str, float | None]:
    """The metrics with a failure-aware form (``MetricSpec.miss``) that apply to a failed query,
    each with the value None: those an empty ok trace of the query would be scored on (its labels
    decide: answerable, evidence spans, relevant sets, a gold intent under a router) and, when the
    system generates answers (``answered``), those an empty answer would be scored on."""
    blank: Record = {
        **rec,
        "status": "ok",
        "retrieved": None if rec.get("retrieved") is None else [],
        "citations": None if rec.get("citations") is None else [],
        "answer": "" if answered else None,
    }
    blank.pop("judge", None)
    names = score_record(blank, query, docs, ks, routed=routed, tokens=TokenCounts())
    return {name: None for name in names if spec_of(name).miss is not None}


def failure_stage(
    rec: Record, query: Query, docs: Mapping[str, Document], values: Mapping[str, float | None]
) -> str | None:
    """The stage that lost the query (:mod:`rag_ablate.metrics.stages`), from its record, its labels
    and its metric ``values`` (refusal, token_f1); None for a failed or a no_rag query."""
    kind = query.kind  # (a property: read once)
    if rec["status"] != "ok" or kind == "no_rag":
        return None
    labels = _labels_of(query, docs)
    rel_chunks = labels.rel_chunks
    candidates, retrieved, context = rec.get("candidates"), rec.get("retrieved"), rec.get("context")

    # citation entries are read with get: a hand-written record's citation may name only a chunk,
    # whose document is then the one the listed chunks give it
    citations = rec.get("citations") or []
    cited: list[bool] = []
    if citations:
        doc_of: dict[str | None, str | None] = {}
        if any(not c.get("doc_id") for c in citations):
            entries = [*(candidates or []), *(retrieved or []), *(context or [])]
            doc_of = {e["chunk_id"]: e["doc_id"] for e in entries}
        cited = [
            _relevant(c.get("doc_id") or doc_of.get(c.get("chunk_id") or ""), c.get("chunk_id"), labels)
            for c in citations
        ]
    refused = values.get("refusal") == 1.0
    in_candidates = _hits(candidates, labels)
    # a system without a reranker hands its candidates on: the same entries, the same answer
    same = candidates is not None and retrieved is not None and retrieved == candidates
    return stages.diagnose(
        answerable=kind == "answerable",
        relevant_present=labels.visible or bool(rel_chunks),
        candidates=in_candidates,
        retrieved=in_candidates if same else _hits(retrieved, labels),
        context=_hits(context, labels),
        answered=rec.get("answer") is not None,
        cited=cited,
        wrong=stages.answer_wrong(values) if kind == "answerable" else not refused,
    )


def _relevant(doc_id: str | None, chunk_id: str | None, labels: _Labels) -> bool:
    """A cited document or chunk is relevant by the query's labels."""
    in_docs = doc_id is not None and doc_id in labels.rel_docs
    return in_docs or (chunk_id is not None and chunk_id in labels.rel_chunks)


def _hits(listed: Sequence[RetrievedEntry] | None, labels: _Labels) -> list[bool] | None:
    """Whether some entry of a list is relevant, as a one-element list (``diagnose`` reads a list only
    through ``any``): set tests in C instead of a call per entry (a document id or chunk id of None is
    in neither set); None for a list the system does not report."""
    if listed is None:
        return None
    rel_chunks = labels.rel_chunks
    found = not labels.rel_docs.isdisjoint(map(_DOC_ID, listed))
    return [found or (bool(rel_chunks) and not rel_chunks.isdisjoint(map(_CHUNK_ID, listed)))]


def scored(
    rec: Record,
    query: Query,
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
    answers: AnswerScoring | None = None,
    tokens: TokenCounts | None = None,
    answered: bool = False,
) -> Record:
    """``rec`` with its ``metrics`` and ``failure_stage``; a crash while scoring makes the query
    failed, not the run.

    The stage (:func:`failure_stage`) adds its indicators to the metrics (``stage_<stage>``: 1 for
    the query's stage, 0 for the others). The failed record keeps its trace and latency; ``error``
    says ``scoring failed: ...``.
    ``tokens``: the run's chunk token counts (:class:`TokenCounts`), shared by every record;
    ``answered``: the system generates answers (a failed query then misses the answer metrics too).
    """
    try:
        metrics = score_record(
            rec, query, docs, ks, routed=routed, answers=answers, tokens=tokens, answered=answered
        )
        stage = failure_stage(rec, query, docs, metrics)
        if stage is not None:
            metrics.update(_INDICATORS[stage])
        out = rec.copy()  # (the dict copied whole, then two keys set: 0.16 against {**rec, ...}'s 0.22 us)
        out["failure_stage"], out["metrics"] = stage, metrics
        return out
    except Exception as exc:  # a bad trace (unknown doc id, broken offsets, ...) fails one query only
        failed: Record = {
            **rec,
            "status": "failed",
            "error": f"scoring failed: {type(exc).__name__}: {exc}",
            "failure_stage": None,
        }
        total = (rec.get("timings_ms") or {}).get("total")
        failed["metrics"] = {} if total is None else {"latency_ms": float(total)}
        return failed


def run_cutoffs(ks: Sequence[int]) -> Sequence[int]:
    """A run's ``ks`` checked once for all its records: the shared tuple of
    :func:`~rag_ablate.metrics.retrieval.cutoffs` (each record's scoring then finds them checked), or
    ``ks`` as given when they are bad (each record's scoring fails with the error, as before)."""
    try:
        return cutoffs(ks)[0]
    except (ConfigError, TypeError):
        return ks


def score_all(
    pairs: Iterable[tuple[Record, Query]],
    docs: Mapping[str, Document],
    ks: Sequence[int],
    *,
    routed: bool,
    answers: AnswerScoring | None = None,
    tokens: TokenCounts | None = None,
    answered: bool = False,
) -> list[Record]:
    """:func:`scored` of each record with its query, in turn: the cutoffs checked once, and each distinct
    retrieved chunk tokenised once for all of them (``tokens``, or a new memo)."""
    memo = TokenCounts() if tokens is None else tokens
    checked = run_cutoffs(ks)
    return [
        scored(rec, query, docs, checked, routed=routed, answers=answers, tokens=memo, answered=answered)
        for rec, query in pairs
    ]


def rescore(
    records: Sequence[Record],
    dataset: Dataset,
    ks: Sequence[int],
    routed: bool,
    answers: AnswerScoring | None = None,
    tokens: TokenCounts | None = None,
) -> list[Record]:
    """Recompute every record's metrics from its trace (records on disk suffice).

    Each distinct retrieved chunk is tokenised once for all records (``tokens``, or a new memo).
    """
    by_id = {q.query_id: q for q in dataset.queries}
    answered = any(r.get("answer") is not None for r in records)
    pairs = [(r, by_id[r["query_id"]]) for r in records]
    return score_all(
        pairs, dataset.documents, ks, routed=routed, answers=answers, tokens=tokens, answered=answered
    )


MetricItems = tuple[dict[str, float], list[str], tuple[str, ...]]
"""A record's metric values (name -> value; None and NaN left out: the record's own ``metrics`` dict,
read only, when it holds floats only and none NaN), the names whose value is None, and the values'
names in order (one tuple object for every record with the same names)."""

_FLOAT = {float}
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)
_SHAPES: dict[tuple[str, ...], tuple[str, ...]] = {}  # metric_items: each distinct tuple of names, once


_SHORT = 1024  # _p50_p95: a list of floats shorter than this is interpolated in Python


def _p50_p95(values: Sequence[float]) -> tuple[float, float]:
    """The 50th and 95th percentiles (numpy's linear interpolation): ``np.percentile(values, (50, 95))``,
    bit for bit. A short list of floats (none NaN: their sum is not) is sorted and
    interpolated here with numpy's operations in numpy's order (:func:`_lerp_at`): a call of
    ``np.percentile`` costs about 30 us whatever the length, and a run's slices make hundreds
    (the sample's 29 slices: 87 calls). A longer list, or one with a NaN, a non-float or a zero goes
    to numpy: 0.0 and -0.0 are equal, and which of them numpy's partition puts where is its own (it
    depends on the percentiles asked for: a separate call for each can give the other zero)."""
    if (
        0 < len(values) < _SHORT
        and set(map(type, values)) == _FLOAT
        and (total := sum(values)) == total
        and 0.0 not in values
    ):
        ordered = sorted(values)
        return _lerp_at(ordered, 0.5), _lerp_at(ordered, 0.95)
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), (50, 95)).tolist()
    return p50, p95


def _lerp_at(ordered: list[float], q: float) -> float:
    """numpy's ``linear`` quantile ``q`` (0.5 or 0.95: ``np.percentile``'s ``q / 100``) of sorted floats,
    none NaN, step by step as numpy 2 computes it (``_quantile``, ``_get_indexes``, ``_lerp``): the
    virtual index ``(n - 1) * q``; its floor and the next index, both the last one (index -1) when the
    virtual index is at or past it; ``gamma`` the virtual index minus the floor index (-1 included);
    ``a + (b - a) * gamma``, or ``b - (b - a) * (1 - gamma)`` when ``gamma >= 0.5``."""
    n = len(ordered)
    virtual = (n - 1) * q
    below = -1 if virtual >= n - 1 else math.floor(virtual)
    a, b = ordered[below], ordered[-1 if below == -1 else below + 1]
    gamma = virtual - below
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def aggregate(
    records: Sequence[Record], weights: TagWeights | None = None, items: Sequence[MetricItems] | None = None
) -> dict[str, float]:
    """Split-prefixed means and counts: ``dev/recall_at_5``, ``holdout/n_failed``, ``all/...``.

    Means run over the queries a metric applies to (answerable ones for retrieval metrics).
    A metric with a failure-aware form (``MetricSpec.miss``) is failure-aware under its plain
    name: a failed query it applies to (its record names the metric with None) scores the miss
    (``recall_at_5`` counts it as 0); when some failed query did, ``<split>/ok/<metric>`` is the
    ok-only mean beside it (absent when no query succeeded). Every other metric is a mean over
    the queries that have a value. Failed queries count in ``n_failed`` and ``error_rate``, and
    in ``latency_ms`` (timed until they failed). A metric no query applies to is absent, not 0.

    Each failure status the run has (``timeout``, ``http_error``, ... see
    :data:`rag_ablate.core.retry.Status`) gets ``n_status_<status>`` and ``error_rate_<status>``
    in every split; a streaming system's time to first token gets ``ttft_ms_p50``/``_p95``
    (over the queries that got a first token).

    When some record was diagnosed (``failure_stage``, :mod:`rag_ablate.metrics.stages`), every
    split gets ``n_stage_<stage>`` for every stage (the count) beside the share ``stage_<stage>``
    (the metric's mean over the split's diagnosed queries).

    With ``weights`` (the production mix, :mod:`rag_ablate.dataset.weights`), each split also gets
    ``<split>/prod/<metric>`` (weighted means) and ``<split>/edge/<metric>`` (the edge cases'
    own means) from the records' ``tags`` (see :func:`rag_ablate.dataset.weights.run_metrics`).

    ``items``: each record's :func:`metric_items`, when the caller has them already.
    """
    return aggregate_counted(records, weights, items)[0]


def metric_items(rec: Record) -> MetricItems:
    """The :data:`MetricItems` of one record, in its metrics' order."""
    metrics = rec.get("metrics") or {}
    kept = metrics.values()
    values: dict[str, float]
    # floats only, none NaN (nor their sum): the values are the record's own dict, nothing left out
    # (read only, never changed: a copy of 50 values per record cost more than the rest of this); the
    # types counted in C, each compared by identity (no None: an `in` test compares each float with None)
    floats = bool(metrics) and countOf(map(type, kept), float) == len(metrics)
    if floats and (sum_ := sum(cast("Iterable[float]", kept))) == sum_:
        values, nones = cast("dict[str, float]", metrics), []
    else:
        values = {name: float(v) for name, v in metrics.items() if v is not None and v == v}  # v != v: NaN
        nones = [name for name, v in metrics.items() if v is None] if None in kept else []
    names = tuple(values)
    shape = _SHAPES.get(names)
    if shape is None:
        if len(_SHAPES) > 4096:
            _SHAPES.clear()
        shape = _SHAPES[names] = names
    return values, nones, shape


class _SplitValues:
    """One split's records in one pass: counts by kind, status and stage, and every record's values."""

    __slots__ = ("kinds", "misses", "n", "rows", "shapes", "stages", "statuses", "ttft", "values")

    def __init__(self) -> None:
        self.n = 0
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.stages: Counter[str | None] = Counter()
        self.ttft: list[float] = []
        self.values: list[dict[str, float]] = []  # each record's values (ok queries', NaN left out)
        self.shapes: list[tuple[str, ...]] = []  # each record's names of its values (MetricItems)
        self.misses: Counter[str] = Counter()  # failed queries a failure-aware metric applies to
        self.rows: list[int] = []  # each record's position among all the records

    def columns(self) -> dict[str, list[float]]:
        """metric -> its values in record order, transposed in C: the records with one list of names
        (:data:`MetricItems`) at a time, a metric of several such groups merged by record position."""
        rows, shapes = self.values, self.shapes
        if len(set(map(id, shapes))) == 1:  # every record has the same metrics in the same order
            return dict(zip(shapes[0], map(list, zip(*map(dict.values, rows), strict=True)), strict=True))
        groups: dict[int, tuple[tuple[str, ...], list[int]]] = {}  # names -> positions of their records
        for i, shape in enumerate(shapes):
            groups.setdefault(id(shape), (shape, []))[1].append(i)
        parts: dict[str, list[tuple[list[int], tuple[float, ...]]]] = {}
        for shape, positions in groups.values():
            group = zip(*map(dict.values, map(rows.__getitem__, positions)), strict=True)
            for name, column in zip(shape, group, strict=True):
                parts.setdefault(name, []).append((positions, column))
        out: dict[str, list[float]] = {}
        for name, found in parts.items():
            if len(found) == 1:
                out[name] = list(found[0][1])
            else:  # (position, value) pairs sorted by position (each position once: values never compared)
                merged = sorted(chain.from_iterable(zip(pos, column, strict=True) for pos, column in found))
                out[name] = list(map(_SECOND, merged))
        return out


_MATRIX_ROWS = 64  # a split of at least this many records: its means from one matrix (_Matrix)


class _Matrix:
    """A split's values as one float64 matrix (a row per record, a column per metric), each metric's
    mean summed by numpy over its values in record order, as :func:`_means` sums them (bit for bit):
    the metrics present in the same groups of records (one group per list of names,
    :data:`MetricItems`) form one sub-matrix, transposed to contiguous rows and reduced along them
    (each row summed pairwise as alone). Filled in C from each group's values (``np.fromiter``), where
    :meth:`_SplitValues.columns` makes a list per metric and numpy then converts every list; a split's
    rows are taken from the matrix of all the records (``base``) instead of filled again."""

    __slots__ = ("_col", "_m", "_rows", "counts", "means")
    _col: dict[str, int]  # metric -> its column
    _m: npt.NDArray[np.float64]

    def __init__(self, part: _SplitValues, base: _Matrix | None = None) -> None:
        rows = part.values
        groups: dict[int, tuple[tuple[str, ...], list[int]]] = {}  # names -> positions of their records
        for i, shape in enumerate(part.shapes):
            groups.setdefault(id(shape), (shape, []))[1].append(i)
        col: dict[str, int] = {} if base is None else base._col
        present: dict[str, list[int]] = {}  # metric -> the groups that have it
        for gid, (shape, _) in groups.items():
            for name in shape:
                col.setdefault(name, len(col))
                present.setdefault(name, []).append(gid)
        if base is not None:  # the rows of this split's records (a metric's rows: of groups that have it)
            m = base._m[part.rows]
        else:
            m = np.empty((len(rows), len(col)), dtype=np.float64)
            for shape, positions in groups.values():
                flat = chain.from_iterable(map(dict.values, map(rows.__getitem__, positions)))
                group = np.fromiter(flat, np.float64, len(positions) * len(shape)).reshape(len(positions), -1)
                cols = [col[name] for name in shape]
                if cols and cols == list(range(cols[0], cols[0] + len(cols))):  # side by side: a slice
                    m[positions, cols[0] : cols[0] + len(cols)] = group
                else:
                    m[np.ix_(positions, cols)] = group
        classes: dict[tuple[int, ...], list[str]] = {}  # the metrics present in the same groups
        for name, gids in present.items():
            classes.setdefault(tuple(gids), []).append(name)
        self._m, self._col = m, col
        self._rows: dict[str, list[int] | None] = {}  # metric -> its records' rows (None: every row)
        self.means: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        for among, names in classes.items():
            picked = None  # every group has them: every row
            if len(among) < len(groups):
                picked = sorted(chain.from_iterable(groups[g][1] for g in among))
            n = len(rows) if picked is None else len(picked)
            self._rows.update(dict.fromkeys(names, picked))
            self.counts.update(dict.fromkeys(names, n))
            if n < 8:  # summed as _mean sums a short list
                self.means.update({name: _mean(self.column(name)) for name in names})
                continue
            cols = [col[name] for name in names]
            sub = m[:, cols] if picked is None else m[np.ix_(picked, cols)]
            sums = np.add.reduce(np.ascontiguousarray(sub.T), axis=1)
            self.means.update(zip(names, (total / n for total in sums.tolist()), strict=True))

    def column(self, name: str) -> list[float]:
        """The metric's values in record order (none: an empty list)."""
        if name not in self._rows:  # (the columns may be the whole run's: name them all)
            return []
        picked = self._rows[name]
        values = self._m[:, self._col[name]]
        return cast(list[float], (values if picked is None else values[picked]).tolist())


class _Lists:
    """:class:`_Matrix`'s answers from a small split's lists (:meth:`_SplitValues.columns`, :func:`_means`):
    a slice's few records."""

    __slots__ = ("_columns", "counts", "means")

    def __init__(self, columns: dict[str, list[float]]) -> None:
        self._columns = columns
        self.means = _means(columns)
        self.counts = {name: len(values) for name, values in columns.items()}

    def column(self, name: str) -> list[float]:
        return self._columns.get(name, [])


def _split_values(records: Sequence[Record], items: Sequence[MetricItems]) -> dict[str, _SplitValues]:
    """Every split's (and ``all``'s) :class:`_SplitValues`, each record read once, in record order: a
    record goes to its own split's values (or to the records of no known split); ``all`` takes every
    record's values, shape and time to first token in record order, and the counts of the splits
    and of those records added up (a count does not depend on the order it was made in)."""
    out = {split: _SplitValues() for split in (*SPLITS, "all")}
    everything = out["all"]
    other = _SplitValues()  # the records of no known split: in ``all`` only
    ttft_all = everything.ttft
    for i, (r, (values, nones, shape)) in enumerate(zip(records, items, strict=True)):
        part = out.get(r["split"])
        if part is None or part is everything:
            part = other
        status = str(r["status"])
        part.n += 1
        part.kinds[r["kind"]] += 1
        part.statuses[status] += 1
        part.stages[r.get("failure_stage")] += 1
        ttft = r.get("ttft_ms")
        if ttft is not None:
            part.ttft.append(float(ttft))
            ttft_all.append(float(ttft))
        part.values.append(values)
        part.shapes.append(shape)
        part.rows.append(i)
        if nones and status != "ok":
            part.misses.update(nones)
    everything.values = list(map(_FIRST, items))
    everything.shapes = list(map(_THIRD, items))
    everything.rows = list(range(len(items)))
    for part in (*(out[split] for split in SPLITS), other):
        everything.n += part.n
        everything.kinds.update(part.kinds)
        everything.statuses.update(part.statuses)
        everything.stages.update(part.stages)
        everything.misses.update(part.misses)
    return out


def _mean(values: list[float]) -> float:
    """``float(np.mean(values))``, bit for bit, without np.mean's own overhead (a run's slices take
    thousands of means). numpy adds from 0.0, one value after another below 8 values (its pairwise
    sum's first block), then divides once; a short list is summed so here, a longer one by numpy."""
    n = len(values)
    if n < 8:
        total = 0.0
        for v in values:
            total += v
        return total / n
    return float(np.add.reduce(np.array(values, dtype=np.float64))) / n


def _means(columns: Mapping[str, list[float]]) -> dict[str, float]:
    """:func:`_mean` of every column that has values, bit for bit: the columns of 8 values or more in
    one ``np.add.reduce`` per length, over a matrix whose rows are the columns (a sum along the
    contiguous axis adds each row pairwise, as over the row alone); a slice's hundreds of means cost
    one numpy call per length instead of two per mean."""
    out: dict[str, float] = {}
    by_length: dict[int, list[str]] = {}
    for name, column in columns.items():
        if len(column) >= 8:
            by_length.setdefault(len(column), []).append(name)
        elif column:
            out[name] = _mean(column)
    for n, names in by_length.items():
        sums = np.add.reduce(np.array([columns[name] for name in names], dtype=np.float64), axis=1)
        out.update(zip(names, (total / n for total in sums.tolist()), strict=True))
    return out


def aggregate_counted(
    records: Sequence[Record], weights: TagWeights | None = None, items: Sequence[MetricItems] | None = None
) -> tuple[dict[str, float], dict[str, dict[str, int]]]:
    """:func:`aggregate`'s metrics, and split -> metric -> how many queries have a value (the values
    its means run over; metrics sorted by name), from one pass over the records. ``items``: each
    record's :func:`metric_items`, when the caller has them (a run's slices read each record often)."""
    out: dict[str, float] = {}
    counts: dict[str, dict[str, int]] = {}
    if items is None:
        items = [metric_items(r) for r in records]
    parts = _split_values(records, items)
    # from the counts of every record's status and stage (no pass over the records of its own)
    failure_statuses = sorted(status for status in parts["all"].statuses if status != "ok")
    diagnosed = any(stage is not None for stage in parts["all"].stages)
    base = _Matrix(parts["all"]) if parts["all"].n >= _MATRIX_ROWS else None  # every record's values
    for split, part in parts.items():
        p = f"{split}/"
        n = part.n
        out[p + "n_queries"] = float(n)
        for kind in ("answerable", "unanswerable", "no_rag"):
            out[p + f"n_{kind}"] = float(part.kinds[kind])
        failed = n - part.statuses["ok"]
        out[p + "n_failed"] = float(failed)
        out[p + "error_rate"] = failed / n if n else 0.0
        for status in failure_statuses:
            n_status = part.statuses[status]
            out[p + f"n_status_{status}"] = float(n_status)
            out[p + f"error_rate_{status}"] = n_status / n if n else 0.0
        if diagnosed:
            out.update({p + "n_" + stages.stage_metric(st): float(part.stages[st]) for st in stages.STAGES})
        if part.ttft:
            out[p + "ttft_ms_p50"], out[p + "ttft_ms_p95"] = _p50_p95(part.ttft)
        misses = part.misses
        if base is not None and n >= _MATRIX_ROWS:
            matrix: _Matrix | _Lists = base if split == "all" else _Matrix(part, base)
        else:
            matrix = _Lists(part.columns())
        means, n_values, column = matrix.means, matrix.counts, matrix.column
        for name in sorted({*n_values, *misses}):
            has = n_values.get(name, 0) > 0
            miss = spec_of(name).miss if name in misses else None
            if miss is None:
                if has:
                    out[p + name] = means[name]
                continue
            ok = column(name)
            out[p + name] = (sum(ok) + miss * misses[name]) / (len(ok) + misses[name])
            if has:
                out[p + "ok/" + name] = means[name]
        if n_values.get("latency_ms"):
            out[p + "latency_ms_p50"], out[p + "latency_ms_p95"] = _p50_p95(column("latency_ms"))
        counts[split] = {name: n_values[name] for name in sorted(n_values)}
    if weights is not None:
        out.update(weighted_metrics(records, weights))
    return out, counts


def weighted_metrics(records: Sequence[Record], weights: TagWeights) -> dict[str, float]:
    """The ``<split>/prod/<metric>`` and ``<split>/edge/<metric>`` means :func:`aggregate` adds with
    ``weights`` (:func:`rag_ablate.dataset.weights.run_metrics`, every split and ``all``)."""
    return run_metrics(records, weights, (*SPLITS, "all"))
