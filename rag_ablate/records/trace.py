"""The trace contract: what a system under test returns for one query, and the record it becomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

from rag_ablate.core.layout import RECORDS_FILE as RECORDS_FILE  # re-exported
from rag_ablate.core.retry import Status


@dataclass(frozen=True)
class RetrievedChunk:
    rank: int  # 1-based
    chunk_id: str
    doc_id: str
    start: int  # [start, end) in the document text
    end: int
    score: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RetrievedChunk:
        return cls(
            int(d["rank"]),
            str(d["chunk_id"]),
            str(d["doc_id"]),
            int(d["start"]),
            int(d["end"]),
            float(d["score"]),
        )


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


TOKEN_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens", "embedding_tokens")


def first_intent(intents: list[str]) -> str | None:
    """The predicted intent of a raw intent list: its first non-empty code."""
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
    """

    query_id: str
    status: Status = "ok"
    error: str | None = None
    retrieved: list[RetrievedChunk] = field(default_factory=list)
    intent_pred: str | None = None
    intent_score: float | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    intents: list[str] = field(default_factory=list)
    answer: str | None = None
    citations: list[Citation] = field(default_factory=list)
    usage: TokenUsage | None = None
    usage_count: str | None = None  # "local": ``usage`` is rag_ablate's own token count, not the model's
    cached: bool = False  # the answer was replayed from the model-call cache (time and tokens: the original)
    ttft_ms: float | None = None
    http_status: int | None = None
    retries: int = 0

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
        return cls(
            query_id=str(d["query_id"]),
            status=d.get("status", "ok"),
            error=d.get("error"),
            retrieved=[RetrievedChunk.from_dict(r) for r in d.get("retrieved") or []],
            intent_pred=d.get("intent_pred"),
            intent_score=None if score is None else float(score),
            timings_ms={str(k): float(v) for k, v in (d.get("timings_ms") or {}).items()},
            intents=[str(i) for i in d.get("intents") or []],
            answer=d.get("answer"),
            citations=[Citation.from_dict(c) for c in d.get("citations") or []],
            usage=None if usage is None else TokenUsage.from_dict(usage),
            usage_count=d.get("usage_count"),
            cached=bool(d.get("cached") or False),
            ttft_ms=None if ttft is None else float(ttft),
            http_status=None if d.get("http_status") is None else int(d["http_status"]),
            retries=int(d.get("retries") or 0),
        )


Record = dict[str, Any]


