"""``cost.max_usd``: a run stops before it spends more than its limit on model calls.

The meter counts what a run has spent: each query's tokens that the system reported at the price
of ``cost.model`` (:func:`rag_ablate.run.cost.query_usd`), and each judgement's tokens at the
price of ``judge.model``. A call replayed from the model-call cache spent nothing and is not
counted (its record still reports the original tokens, so ``usd_per_1k`` stays comparable). A
resumed run starts from what its kept records spent.

Before each query (and each judgement) the meter asks whether one more query as costly as the
costliest so far could take the total past the limit; if so the run stops with
:class:`SpendLimitError`, a :class:`~rag_ablate.core.errors.RunStopError`: the records so far
are kept, the MLflow run ends FAILED, the command exits 1, and ``resume=`` with a higher
``cost.max_usd`` finishes it (what was already answered is replayed from the cache for free).
With ``generator.concurrency``, ``system.concurrency`` or ``judge.concurrency`` above 1 the calls
already in flight still finish, so the total can pass the limit by at most that many queries.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag_ablate.core.errors import RunStopError
from rag_ablate.records.trace import Record
from rag_ablate.run.cost import query_usd
from rag_ablate.text.count import count_tokens

if TYPE_CHECKING:
    from rag_ablate.config.schema import ModelPrice, RunConfig


class SpendLimitError(RunStopError):
    """The next query could take the run's spend past ``cost.max_usd``: the run stops here."""


class SpendMeter:
    """Money a run spent on uncached model calls, against ``cost.max_usd`` (thread-safe)."""

    def __init__(
        self, limit_usd: float, system_price: ModelPrice | None, judge_price: ModelPrice | None
    ) -> None:
        self.limit_usd = limit_usd
        self.system_price, self.judge_price = system_price, judge_price
        self.spent_usd = 0.0
        self.costliest_usd = 0.0  # the most one query (or one judgement) has spent so far
        self.charges = 0  # queries and judgements that spent something
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, s: RunConfig, kept: Iterable[Record] = ()) -> SpendMeter | None:
        """The run's meter (None without ``cost.max_usd``), charged with what ``kept`` spent."""
        if s.cost.max_usd is None:
            return None
        prices = s.cost.prices
        meter = cls(
            s.cost.max_usd,
            prices.get(s.cost.model) if s.cost.model else None,
            prices.get(s.judge.model) if s.judge.model and s.judge.name != "none" else None,
        )
        for rec in kept:
            meter.charge_record(rec)
            meter.charge_judgement(rec)
        return meter

    def record_usd(self, rec: Record) -> float:
        """What a query's own (system) calls spent: 0 when replayed from the cache or unpriced."""
        if self.system_price is None or rec.get("cached"):
            return 0.0
        return query_usd(rec, self.system_price)

    def judgement_usd(self, rec: Record) -> float:
        """What the judge's calls for one record spent (its repeats not replayed from the cache)."""
        judgement = rec.get("judge")
        if self.judge_price is None or not judgement:
            return 0.0
        total = 0.0
        for rep in judgement.get("repeats") or []:
            usage = rep.get("usage") if isinstance(rep, Mapping) else None
            if rep.get("cached") or not isinstance(usage, Mapping):
                continue
            total += float(usage.get("prompt_tokens") or 0) * self.judge_price.prompt
            total += float(usage.get("completion_tokens") or 0) * self.judge_price.completion
        return total / 1_000_000

    def charge_record(self, rec: Record) -> None:
        self._charge(self.record_usd(rec))

    def charge_judgement(self, rec: Record) -> None:
        self._charge(self.judgement_usd(rec))

    def _charge(self, usd: float) -> None:
        if usd <= 0.0:
            return
        with self._lock:
            self.spent_usd += usd
            self.costliest_usd = max(self.costliest_usd, usd)
            self.charges += 1

    def check(self) -> None:
        """Raise :class:`SpendLimitError` when one more query as costly as the costliest so far
        could take the spend past the limit (or the limit is already reached)."""
        with self._lock:
            spent, costliest = self.spent_usd, self.costliest_usd
        if spent >= self.limit_usd or spent + costliest > self.limit_usd:
            raise SpendLimitError(self.message())

    def message(self) -> str:
        return (
            f"cost.max_usd={self.limit_usd:g} reached: this run spent ${self.spent_usd:.4f} on "
            f"{self.charges} uncached quer{'y' if self.charges == 1 else 'ies'} and judgements (the "
            f"costliest ${self.costliest_usd:.4f}), so the next one could pass the limit; the run "
            "stops here with its records so far kept. Raise cost.max_usd and resume the run "
            "(resume=<its folder>) to finish it: answered queries are replayed from the cache for free"
        )


# ------------------------------------------------------------------------- before a sweep spends


@dataclass
class CallEstimate:
    """What one job's model calls will cost at most, before the model-call cache (calls already
    cached are replayed for free, so a rerun costs less)."""

    label: str
    who: str  # "generator" or "judge"
    calls: int
    prompt_tokens: int  # estimated: prompt template + question + the contexts it is shown
    completion_tokens: int  # at most: calls x max_tokens
    price: ModelPrice | None

    def usd(self) -> tuple[float, float] | None:
        """(prompt tokens only, with every completion at max_tokens) in USD; None unpriced."""
        if self.price is None:
            return None
        low = self.prompt_tokens * self.price.prompt / 1_000_000
        return low, low + self.completion_tokens * self.price.completion / 1_000_000


def calls_a_model(s: RunConfig) -> bool:
    """The job calls a paid-by-the-token model: ``generator=openai`` or ``judge=openai``."""
    return s.generator.name == "openai" or s.judge.name == "openai"


def estimate_calls(s: RunConfig, queries: Sequence[str], label: str, *, baseline: bool) -> list[CallEstimate]:
    """The model calls one job makes over ``queries`` (their texts), each run ``system.repeats``
    times: one generator call per run with ``generator=openai``; ``judge.repeats`` judge calls per
    answered run with a pointwise ``judge=openai``, two per query for a variant with a pairwise
    one (both orders against the baseline). Prompt tokens count the prompt template, the question
    and each context at its chunk's full size (:func:`rag_ablate.text.count.count_tokens` units):
    an upper estimate."""
    out: list[CallEstimate] = []
    k = s.system.repeats  # each query runs k times: k generator calls, each answer judged
    n = len(queries)
    question = sum(count_tokens(q) for q in queries)
    final_k = s.rerank.top_k if s.rerank.method != "none" else s.retrieval.top_k
    if s.generator.name == "openai":
        template = max(count_tokens(s.generator.prompt_en), count_tokens(s.generator.prompt_zh))
        price = s.cost.prices.get(s.cost.model) if s.cost.model else None
        prompt = k * (n * (template + final_k * s.chunk.size) + question)
        out.append(CallEstimate(label, "generator", k * n, prompt, k * n * s.generator.max_tokens, price))
    if s.judge.name == "openai":
        pointwise = s.judge.mode == "pointwise"
        # pointwise: every run's answer; pairwise: each query's first run against the baseline's
        per_query = k * s.judge.repeats if pointwise else (0 if baseline else 2)
        template = max(count_tokens(s.judge.prompt_en), count_tokens(s.judge.prompt_zh))
        contexts = min(final_k, s.judge.max_contexts) * s.chunk.size
        answers = s.generator.max_tokens * (1 if pointwise else 2)
        prompt = per_query * (n * (template + contexts + answers) + question)
        price = s.cost.prices.get(s.judge.model) if s.judge.model else None
        calls = n * per_query
        if calls:
            out.append(CallEstimate(label, "judge", calls, prompt, calls * s.judge.max_tokens, price))
    return out


def format_estimates(estimates: Sequence[CallEstimate], max_usd: float | None) -> list[str]:
    """The plan's lines on model calls (empty when no job calls a model)."""
    if not estimates:
        return []
    lines = [
        "model calls before the cache (cached calls are free); tokens estimated from the prompt "
        "template, the question and the contexts at full chunk size, completions at max_tokens:"
    ]
    total: list[float] = [0.0, 0.0]
    priced = False
    for e in estimates:
        money = e.usd()
        cost = "unpriced (no cost.prices entry)"
        if money is not None:
            priced = True
            total[0] += money[0]
            total[1] += money[1]
            cost = f"${money[0]:.2f}-${money[1]:.2f}"
        lines.append(
            f"  {e.label}: {e.who} {e.calls} call(s), ~{e.prompt_tokens:,} prompt + up to "
            f"{e.completion_tokens:,} completion tokens, {cost}"
        )
    calls = sum(e.calls for e in estimates)
    line = f"  sweep: {calls} model call(s)"
    if priced:
        line += f", ${total[0]:.2f}-${total[1]:.2f}"
    if max_usd is not None:
        line += f"; cost.max_usd={max_usd:g} stops each run before it spends more"
    lines.append(line)
    return lines
