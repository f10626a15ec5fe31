"""The contract every answer generator follows (the ``generator`` config group).

A generator turns a query and the contexts the system retrieved into one
:class:`Generation`: the answer text with ``[n]`` markers, the citations those
markers stand for, token usage, and the time to the first token when it streams.

``GENERATORS.get(name)(settings, cache)`` builds one; the factory of ``none``
returns ``None`` (retrieval only: no answer is generated). See docs/metrics.md
"Answers" for how answers are scored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from rag_ablate.records.trace import Citation, TokenUsage

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache


@dataclass(frozen=True)
class Context:
    """One retrieved chunk handed to a generator; ``n`` is its 1-based marker number ``[n]``."""

    n: int
    chunk_id: str
    doc_id: str
    start: int  # [start, end) in the document text
    end: int
    text: str

    def citation(self) -> Citation:
        return Citation(doc_id=self.doc_id, chunk_id=self.chunk_id, start=self.start, end=self.end)


@dataclass
class Generation:
    """What a generator produced for one query.

    ``usage`` is None when the generator does not know its token counts; a count made by
    rag_ablate itself (not a model tokenizer) sets ``usage_count="local"``. ``cached`` marks
    an answer replayed from the model-call cache (its latency and tokens are the original call's).
    """

    answer: str
    citations: list[Citation] = field(default_factory=list)
    usage: TokenUsage | None = None
    ttft_ms: float | None = None
    cached: bool = False
    usage_count: str | None = None  # "local": usage is rag_ablate's own count (metrics/text.py)
    latency_ms: float | None = None  # the model call's own time; a cached call reports the original's
    n_read: int | None = None  # the generator read only the first n contexts (None: all of them)


class Generator(Protocol):
    """Answers one query from its contexts."""

    def generate(self, query_text: str, contexts: list[Context], *, repeat: int = 0) -> Generation:
        """Answer one query; ``repeat`` (system.repeats) selects an independent sample: a model
        call's own cache entry (a deterministic generator answers the same)."""
        ...


# How a registered generator is built: ``GENERATORS.get(name)(settings, cache)``; None = no answers.
GeneratorFactory = Callable[["RunConfig", "Cache | None"], "Generator | None"]
