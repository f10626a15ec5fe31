"""Systems under test. A target turns one query into one :class:`Trace`.

The built-in ``local`` target runs rag_ablate's own pipeline; an ``http`` target
(a user's RAG service) will produce the same traces, so everything downstream
(records, metrics, MLflow, comparison) is shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from rag_ablate.dataset import Dataset, Query

Status = Literal["ok", "failed"]


@dataclass(frozen=True)
class RetrievedChunk:
    rank: int  # 1-based
    chunk_id: str
    doc_id: str
    start: int  # [start, end) in the document text
    end: int
    score: float


@dataclass
class Trace:
    """What the system did for one query; the raw material of every metric."""

    query_id: str
    status: Status = "ok"
    error: str | None = None
    retrieved: list[RetrievedChunk] = field(default_factory=list)
    intent_pred: str | None = None
    intent_score: float | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Target(Protocol):
    """A system under test."""

    def prepare(self, dataset: Dataset) -> dict[str, Any]:
        """Build what the target needs (indexes); return facts worth logging as params."""
        ...

    def run(self, query: Query) -> Trace:
        """Answer one query. May raise; the runner records a raise as a failed query."""
        ...

    @property
    def routes_intents(self) -> bool:
        """True when the target predicts intents (intent metrics are then computed)."""
        ...
