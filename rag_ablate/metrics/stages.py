"""Stage diagnosis: which stage of the pipeline lost a query (docs/metrics.md "Stage diagnosis").

A query's ``failure_stage`` is the first stage, along the pipeline, whose output no longer holds
a relevant document; relevance is the dataset's labels: a chunk is relevant when its document is
(``relevant``, grade > 0) or the labels name it (``relevant_chunks``, grade > 0).
The lists a system reports are read in pipeline order, and a list it does not report is skipped:

1. ``no_relevant_in_corpus``: an answerable query none of whose relevant documents is in the
   corpus (or, when the corpus restricts documents, none the asking user may see);
2. ``not_retrieved``: no relevant document among the ``candidates`` (the list before rerank), or,
   when the system reports no candidates, among the final ``retrieved`` list;
3. ``dropped_by_rerank``: among the candidates, not in the final ``retrieved`` list;
4. ``cut_from_context``: retrieved, not in the ``context`` given to the generator;
5. ``not_used``: in the context (the retrieved list when no context is reported), but the answer
   cites only other documents, or cites nothing and is wrong;
6. ``answer_wrong``: the answer cites a relevant document and is still wrong (for an unanswerable
   query: it answers instead of refusing);
7. ``ok``: none of the above (a run without answers ends at the last list it reports); an
   unanswerable query whose answer refuses, or that has no answer, is ``ok``: by its labels the
   corpus holds nothing for it, so nothing was lost, and declining is the right outcome.

An answer is *wrong* when it refuses (the ``refusal`` metric) or, for a query with reference
answers, when its ``token_f1`` is below :data:`ANSWER_F1_MIN`; a query without references that
does not refuse counts as right. Failed queries and ``no_rag`` queries are not diagnosed (None):
a failure is the system's, reported by ``error_rate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

STAGES = (
    "no_relevant_in_corpus",
    "not_retrieved",
    "dropped_by_rerank",
    "cut_from_context",
    "not_used",
    "answer_wrong",
    "ok",
)
OK = "ok"
ANSWER_F1_MIN = 0.5  # an answer with token_f1 below this (against the references) is wrong
PREFIX = "stage_"  # the per-query indicator of a stage is the metric stage_<stage>


def stage_metric(stage: str) -> str:
    """The metric whose per-query value is 1 when the query's failure stage is ``stage``."""
    if stage not in STAGES:
        raise ValueError(f"unknown failure stage {stage!r}; one of {', '.join(STAGES)}")
    return PREFIX + stage


def indicators(stage: str) -> dict[str, float]:
    """Every stage's metric: 1.0 for ``stage``, 0.0 for the others (their means are the shares)."""
    stage_metric(stage)
    return {PREFIX + s: float(s == stage) for s in STAGES}


def answer_wrong(values: Mapping[str, float | None]) -> bool:
    """A scored answer is wrong: it refuses, or its token_f1 is below :data:`ANSWER_F1_MIN`."""
    f1 = values.get("token_f1")
    return values.get("refusal") == 1.0 or (f1 is not None and f1 < ANSWER_F1_MIN)


def diagnose(
    *,
    answerable: bool,
    relevant_present: bool,
    candidates: Sequence[bool] | None,
    retrieved: Sequence[bool] | None,
    context: Sequence[bool] | None,
    answered: bool,
    cited: Sequence[bool],
    wrong: bool,
) -> str:
    """The failure stage of one query that did not fail (see the module docstring).

    Each list says, entry by entry in its order, whether the entry is relevant (None: the system
    does not report that list); ``relevant_present``: some relevant document is in the corpus (and
    visible to the user), or the labels name gold chunks; ``cited``: per citation of the answer,
    whether it names a relevant document or chunk; ``wrong``: the answer is wrong
    (:func:`answer_wrong`); for an unanswerable query, that it does not refuse.
    """
    if not answerable:
        return "answer_wrong" if answered and wrong else OK
    if not relevant_present:
        return "no_relevant_in_corpus"
    lists = [
        ("not_retrieved", candidates),
        ("dropped_by_rerank" if candidates is not None else "not_retrieved", retrieved),
        ("cut_from_context", context),
    ]
    for stage, hits in lists:
        if hits is not None and not any(hits):
            return stage
    if not answered:
        return OK
    if (cited and not any(cited)) or (not cited and wrong):
        return "not_used"
    return "answer_wrong" if wrong else OK
