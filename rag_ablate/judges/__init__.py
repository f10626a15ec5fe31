"""LLM judges behind one contract (the ``judge`` config group).

A judge scores a generated answer on :data:`JUDGE_METRICS` (0-5 each, by a written rubric: one
section per metric in ``judge.rubric_<lang>``), the metrics the metric registry marks ``judged``,
says whether the answer declines to answer (``refusal``) and whether each cited passage
supports the sentence that cites it (``support``). ``JUDGES.get(settings.judge.name)(settings,
cache)`` builds one; the factory of ``none`` returns ``None`` (no judge: the deterministic
answer metrics only). docs/metrics.md "LLM judge" describes the rubric, the shuffling of
contexts, parsing and repair, repeats and judge errors.

:meth:`Judge.judge` returns the record's ``"judge"`` value::

    {"model": ..., "prompt_hash": ...,
     "repeats": [{"scores": {"faithfulness": 4, "relevance": 5, "completeness": None},
                  "errors": {"completeness": "not an integer 0-5: 'high'"},
                  "refusal": False, "support": [True, False],
                  "repaired": False, "cached": False, "latency_ms": 812.4,
                  "usage": {...}, "usage_count": None}]}

one entry per repeat; a score that is ``None`` has its reason in ``errors`` unless the metric
was not asked (completeness without reference answers). :meth:`Judge.pairwise` returns
``{"winner": "a" | "b" | "tie" | None, "orders": [...], "consistent": bool | None}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rag_ablate.core.registry import Registry
from rag_ablate.generators.base import Context
from rag_ablate.metrics.registry import judged_metrics
from rag_ablate.records.trace import Judgement

if TYPE_CHECKING:
    from rag_ablate.config.schema import RunConfig
    from rag_ablate.core.cache import Cache

#: the metrics a judge scores: the registry's ``MetricSpec.judged`` ones, in registration order (the
#: registry is the one list; this is its value when the judges are imported)
JUDGE_METRICS: tuple[str, ...] = judged_metrics()


def asked_metrics(has_references: bool) -> tuple[str, ...]:
    """The judged metrics a judge asks about one answer: ``completeness`` only when the query has
    reference answers (it is measured against them)."""
    return tuple(m for m in JUDGE_METRICS if m != "completeness" or has_references)
SUPPORT_KEY = "citation_support"  # the ``errors`` key when the judge's ``support`` list failed


@dataclass(frozen=True)
class JudgeInput:
    """What the judge sees of one query's answer."""

    query_id: str
    question: str
    answer: str
    contexts: list[Context]  # as retrieved, in rank order (the judge shuffles its own copy)
    references: list[str]  # reference answers; empty: completeness is not asked
    # (answer sentence index, cited text) in the order of
    # [(i, n) for i, s in enumerate(answer_sentences(answer)) for n in s.markers]
    citations: list[tuple[int, str]]


class Judge(Protocol):
    """Scores answers; see the module docstring for what it returns."""

    model: str
    prompt_hash: str  # sha256[:16] of every template and rubric the judge uses
    repeats: int  # judge.repeats
    mode: str  # "pointwise" | "pairwise"

    def judge(self, inp: JudgeInput) -> Judgement: ...

    def pairwise(self, inp_a: JudgeInput, answer_b: str) -> dict[str, Any]: ...

    def close(self) -> None: ...


# How a registered judge is built: ``JUDGES.get(name)(settings, cache)``; None = no judge.
JudgeFactory = Callable[["RunConfig", "Cache | None"], "Judge | None"]

JUDGES: Registry[JudgeFactory] = Registry(
    "judge",
    providers=("rag_ablate.judges.none", "rag_ablate.judges.openai"),
)

__all__ = ["JUDGES", "JUDGE_METRICS", "SUPPORT_KEY", "Judge", "JudgeFactory", "JudgeInput", "asked_metrics"]
