"""The trace contract: what a system under test returns for one query, and the record it becomes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NotRequired, TypedDict, cast, get_args

from rag_ablate.core.layout import RECORDS_FILE as RECORDS_FILE  # re-exported
from rag_ablate.core.retry import Status
from rag_ablate.dataset.model import ExpectedBehavior, QueryKind


@dataclass(frozen=True)
class RetrievedChunk:
    rank: int  # 1-based
    chunk_id: str
    doc_id: str | None  # None: the system named the chunk only (no document-level metrics then)
    start: int  # [start, end) in the document text (0, 0 without a document)
    end: int
    score: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RetrievedChunk:
        return cls(
            int(d["rank"]),
            str(d["chunk_id"]),
            None if d.get("doc_id") is None else str(d["doc_id"]),
            int(d["start"]),
            int(d["end"]),
            float(d["score"]),
        )

    @staticmethod
    def entries(chunks: Sequence[RetrievedChunk]) -> list[RetrievedEntry]:
        """Each chunk's :meth:`to_entry`: a plain chunk's is a copy of its ``__dict__`` (its fields in
        the same order, copied in C: half the time), a subclass's (with more fields) its own."""
        out = [c.__dict__.copy() if type(c) is RetrievedChunk else c.to_entry() for c in chunks]
        return cast("list[RetrievedEntry]", out)

    def to_entry(self) -> RetrievedEntry:
        """The chunk as a record's ``retrieved`` list stores it."""
        return {
            "rank": self.rank,
            "chunk_id": self.chunk_id,
            "doc_id": self.doc_id,
            "start": self.start,
            "end": self.end,
            "score": self.score,
        }


@dataclass(frozen=True)
class ContextChunk(RetrievedChunk):
    """A chunk given to the generator: a :class:`RetrievedChunk` and, when known, its text."""

    text: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ContextChunk:
        text = d.get("text")
        return cls(**asdict(RetrievedChunk.from_dict(d)), text=None if text is None else str(text))

    @classmethod
    def of(cls, chunk: RetrievedChunk, text: str | None) -> ContextChunk:
        return cls(**asdict(chunk), text=text)

    def to_context_entry(self) -> ContextEntry:
        """The chunk as a record's ``context`` list stores it (``text`` only when known)."""
        entry: ContextEntry = {**self.to_entry()}  # type: ignore[typeddict-item]
        if self.text is not None:
            entry["text"] = self.text
        return entry


@dataclass(frozen=True)
class Citation:
    """What an answer cites: a chunk (passage) id or a document id, optionally a span.

    ``start``/``end`` are character offsets ``[start, end)`` into the document's text.
    """

    doc_id: str | None = None
    chunk_id: str | None = None
    start: int | None = None
    end: int | None = None

    def __post_init__(self) -> None:
        if self.doc_id is None and self.chunk_id is None:
            raise ValueError("a citation needs a doc_id or a chunk_id")
        if (self.start is None) != (self.end is None):
            raise ValueError("a citation's start and end are given together or not at all")
        if self.start is not None and self.end is not None and not 0 <= self.start <= self.end:
            raise ValueError(
                f"a citation's span must satisfy 0 <= start <= end, got [{self.start}, {self.end})"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Citation:
        def opt_int(key: str) -> int | None:
            v = d.get(key)
            return None if v is None else int(v)

        def opt_str(key: str) -> str | None:
            v = d.get(key)
            return None if v is None else str(v)

        return cls(opt_str("doc_id"), opt_str("chunk_id"), opt_int("start"), opt_int("end"))

    def to_entry(self) -> CitationEntry:
        """The citation as a record's ``citations`` list stores it."""
        return {"doc_id": self.doc_id, "chunk_id": self.chunk_id, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class TokenUsage:
    """Tokens a system spent on one query (None when it does not say)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    embedding_tokens: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenUsage:
        return cls(**{k: None if d.get(k) is None else int(d[k]) for k in TOKEN_USAGE_FIELDS})

    def to_entry(self) -> UsageEntry:
        """The usage as a record's ``usage`` value stores it."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "embedding_tokens": self.embedding_tokens,
        }


TOKEN_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "embedding_tokens")


def first_intent(intents: list[str]) -> str | None:
    """The predicted intent of a raw intent list: its first non-empty code (None for an empty list, at
    once: a system without a router reports none, and the generator cost more than the rest of the
    lookup)."""
    if not intents:
        return None
    return next((code for code in intents if code and code.strip()), None)


@dataclass
class Trace:
    """What the system did for one query; the raw material of every metric.

    ``intents`` is the raw list a system reports (a router may return several);
    ``intent_pred``, when not set, is its first non-empty code.
    ``timings_ms`` holds per-stage timings (``total`` is the query's latency);
    ``ttft_ms`` is the time to the first answer token of a streaming system.
    ``http_status`` is the HTTP status that decided a remote query (the failing one, else
    the evaluation call's; None for local systems and when no response came);
    ``retries`` counts the requests that were sent again.
    ``retrieved`` is None when the system reports no evidence at all (an answer-only service:
    no retrieval metrics); an empty list is a retrieval that found nothing (a miss). Likewise
    ``citations`` is None when the system does not report citations (no citation metrics).

    The stages a system may report (None, or empty ``versions``: not reported; the record then
    has no such key): ``rewritten_query`` (the text the retriever searched with), ``filters``
    (the filters applied to the search, ``{}``: none), ``candidates`` (the list before rerank,
    with the first stage's scores), ``context`` (the chunks given to the generator, after any
    cut) and ``versions`` (``index``, ``corpus``, ``prompt``, ``model``: version tags).
    """

    query_id: str
    status: Status = "ok"
    error: str | None = None
    retrieved: list[RetrievedChunk] | None = field(default_factory=list)
    intent_pred: str | None = None
    intent_score: float | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    intents: list[str] = field(default_factory=list)
    answer: str | None = None
    citations: list[Citation] | None = field(default_factory=list)  # None: the system does not say
    usage: TokenUsage | None = None
    usage_count: str | None = None  # "local": ``usage`` is rag_ablate's own token count, not the model's
    cached: bool = False  # the answer was replayed from the model-call cache (time and tokens: the original)
    ttft_ms: float | None = None
    http_status: int | None = None
    retries: int = 0
    rewritten_query: str | None = None
    filters: dict[str, Any] | None = None
    candidates: list[RetrievedChunk] | None = None
    context: list[ContextChunk] | None = None
    versions: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in get_args(Status):
            raise ValueError(f"a trace's status is one of {get_args(Status)}, got {self.status!r}")

    @property
    def predicted_intent(self) -> str | None:
        """``intent_pred`` if set, else the first non-empty code of ``intents``."""
        return self.intent_pred if self.intent_pred is not None else first_intent(self.intents)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["intent_pred"] = self.predicted_intent
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trace:
        """A trace from :meth:`to_dict` output or a record (other record keys are ignored)."""
        usage = d.get("usage")
        score = d.get("intent_score")
        ttft = d.get("ttft_ms")
        candidates, context, filters = d.get("candidates"), d.get("context"), d.get("filters")
        rewritten = d.get("rewritten_query")
        retrieved = d.get("retrieved", [])
        cites = d.get("citations", [])
        return cls(
            query_id=str(d["query_id"]),
            status=d.get("status", "ok"),
            error=d.get("error"),
            retrieved=None if retrieved is None else [RetrievedChunk.from_dict(r) for r in retrieved],
            intent_pred=d.get("intent_pred"),
            intent_score=None if score is None else float(score),
            timings_ms={str(k): float(v) for k, v in (d.get("timings_ms") or {}).items()},
            intents=[str(i) for i in d.get("intents") or []],
            answer=d.get("answer"),
            citations=None if cites is None else [Citation.from_dict(c) for c in cites],
            usage=None if usage is None else TokenUsage.from_dict(usage),
            usage_count=d.get("usage_count"),
            cached=bool(d.get("cached") or False),
            ttft_ms=None if ttft is None else float(ttft),
            http_status=None if d.get("http_status") is None else int(d["http_status"]),
            retries=int(d.get("retries") or 0),
            rewritten_query=None if rewritten is None else str(rewritten),
            filters=None if filters is None else dict(filters),
            candidates=None if candidates is None else [RetrievedChunk.from_dict(c) for c in candidates],
            context=None if context is None else [ContextChunk.from_dict(c) for c in context],
            versions={str(k): str(v) for k, v in (d.get("versions") or {}).items()},
        )


# ------------------------------------------------------------------------------------- the record


class RetrievedEntry(TypedDict):
    """One retrieved chunk as a record stores it (:class:`RetrievedChunk`'s fields)."""

    rank: int  # 1-based position in the final list
    chunk_id: str  # the system's id of the chunk
    doc_id: str | None  # the document it was cut from (None: the system named the chunk only)
    start: int  # character offset [start, end) into the document's text
    end: int  # end of the chunk's range (exclusive)
    score: float  # the system's score of the chunk (higher ranks first)


class ContextEntry(RetrievedEntry):
    """One chunk given to the generator as a record stores it (:class:`ContextChunk`'s fields)."""

    text: NotRequired[str]  # the chunk's text (absent: not known, or privacy.store_text=false)


class CitationEntry(TypedDict):
    """One citation of the answer as a record stores it (:class:`Citation`'s fields)."""

    doc_id: str | None  # the cited document (None when only a chunk is cited)
    chunk_id: str | None  # the cited chunk (None when only a document is cited)
    start: int | None  # a cited span [start, end) in the document's text, or None
    end: int | None  # the span's end (None exactly when start is)


class UsageEntry(TypedDict):
    """The tokens a system spent on one query (:class:`TokenUsage`'s fields; None: not reported)."""

    prompt_tokens: int | None  # tokens sent to the model
    completion_tokens: int | None  # tokens the model generated
    total_tokens: int | None  # as the model reported it (not recomputed)
    embedding_tokens: int | None  # tokens embedded for the query


class JudgeUsage(TypedDict):
    """The tokens of a judge repeat's calls, summed (None: a call did not report that count)."""

    prompt_tokens: int | None  # prompt tokens of the judge call (and its repair call)
    completion_tokens: int | None  # completion tokens of those calls
    total_tokens: int | None  # total tokens of those calls


class JudgeRepeat(TypedDict):
    """One independent judgement of an answer (``judge.repeats`` of them per record)."""

    scores: dict[str, int | None]  # per judged metric (faithfulness, ...): 0-5, None when failed/not asked
    errors: dict[str, str]  # per metric (and ``citation_support``) that failed: why
    refusal: bool | None  # the answer declines to answer (None: the judge gave no valid verdict)
    support: list[bool] | None  # per (sentence, citation) pair: the cited text supports it
    repaired: bool  # a repair call was needed after an invalid first reply
    cached: bool  # every call of this repeat was replayed from the model-call cache
    latency_ms: float | None  # the calls' summed time (None: no call returned)
    usage: JudgeUsage | None  # the calls' summed tokens (None: no call reported usage)
    usage_count: str | None  # "local": rag_ablate counted the tokens, not the model


class Judgement(TypedDict):
    """A record's ``judge`` value: what :meth:`rag_ablate.judges.Judge.judge` returned."""

    model: str  # the judge's model
    prompt_hash: str  # sha256[:16] of the judge's templates and rubrics
    repeats: list[JudgeRepeat]  # one entry per repeat, in order


class Record(TypedDict):
    """One line of ``records.jsonl``: one query's identity, its trace and its metric values.

    Required keys are written for every query (:func:`rag_ablate.records.scoring.make_record`,
    then :func:`~rag_ablate.records.scoring.scored`); ``NotRequired`` ones only sometimes (see
    each). Records read from disk are trusted to have this shape once
    :func:`rag_ablate.records.jsonl.scan_records` has checked they are objects with a
    ``query_id``; older records may lack keys added since, so code reads those with ``.get``.
    README.md "The record" lists the fields for users; tests/test_record_type.py checks that a
    real run writes exactly these keys. (This module's annotations are postponed, so at run time
    on Python 3.11 ``__required_keys__`` counts every key: read the ``NotRequired`` markers with
    ``typing.get_type_hints(Record, include_extras=True)``.)
    """

    query_id: str  # the query's id in the dataset
    repeat: NotRequired[int]  # which of system.repeats runs of the query (only when system.repeats > 1)
    query: NotRequired[str]  # the query's text (absent with privacy.store_text=false)
    split: str  # "dev" or "holdout"
    group: str  # the query's group (the bootstrap resamples whole groups)
    kind: QueryKind  # "answerable", "unanswerable" or "no_rag"
    tags: NotRequired[list[str]]  # the query's tags (absent in records written before tags were)
    intent_gold: str | None  # the gold level-2 intent (None: not labelled)
    intent_gold_l1: str | None  # the gold level-1 intent (None: not labelled)
    metadata: NotRequired[dict[str, Any]]  # the query's metadata (only when the dataset gives it)
    applicable_version: NotRequired[str]  # the query's applicable_version (only when given)
    expected_behavior: NotRequired[ExpectedBehavior]  # answer / refuse / clarify (only when given)
    status: Status  # "ok" or how the query failed ("failed", "timeout", "http_error", ...)
    error: str | None  # why it failed (None when ok)
    retrieved: list[RetrievedEntry] | None  # the final retrieved chunks in rank order (None: no evidence)
    intent_pred: str | None  # the predicted intent (the first non-empty code of ``intents``)
    intent_score: float | None  # the router's confidence in ``intent_pred``, when it gives one
    timings_ms: dict[str, float]  # per stage (route, retrieve, ...); "total" is the query's latency
    intents: list[str]  # the raw intent codes the system returned
    answer: NotRequired[str | None]  # the generated answer (None: none; absent: store_text=false)
    citations: list[CitationEntry] | None  # what the answer cites (None: the system reports none)
    usage: UsageEntry | None  # tokens the system spent (None: it does not say)
    usage_count: str | None  # "local": ``usage`` is rag_ablate's own count, not the model's
    cached: bool  # the answer was replayed from the model-call cache
    ttft_ms: float | None  # time to the first answer token (streaming systems only)
    http_status: int | None  # the HTTP status that decided a remote query (None for local systems)
    retries: int  # requests sent again for this query
    rewritten_query: NotRequired[str]  # the text the retriever searched with (absent: not reported)
    filters: NotRequired[dict[str, Any]]  # the filters applied to the search, {} none (absent: not reported)
    candidates: NotRequired[list[RetrievedEntry]]  # the list before rerank (absent: not reported)
    context: NotRequired[list[ContextEntry]]  # the chunks given to the generator (absent: not reported)
    versions: NotRequired[dict[str, str]]  # version tags: index, corpus, prompt, model (absent: none)
    failure_stage: str | None  # where the query was lost (rag_ablate.metrics.stages); None: not diagnosed
    metrics: dict[str, float | None]  # per-query metric values by name (recall_at_5, latency_ms, ...)
    judge: NotRequired[Judgement]  # the LLM judge's verdicts (only when a judge judged the answer)
    redacted: NotRequired[dict[str, int]]  # privacy.redact=true: replacements per kind (email, ...)


def repeat_key(query_id: str, repeat: int | None) -> str:
    """What identifies a record in its run: the query id, with ``#<repeat>`` when the run repeats
    each query (``system.repeats`` > 1)."""
    return query_id if repeat is None else f"{query_id}#{repeat}"


def record_key(rec: Record) -> str:
    """A record's :func:`repeat_key`."""
    return repeat_key(rec["query_id"], rec.get("repeat"))
