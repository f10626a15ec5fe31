"""The dataset contract's types (docs/dataset-format.md): documents, queries, intents, the dataset."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from rag_ablate.core.errors import DatasetError

LabelStatus = Literal["ok", "relocated", "stale", "ambiguous"]


def _short(text: str, limit: int = 50) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


SPLITS = ("dev", "holdout")

QueryKind = Literal["answerable", "unanswerable", "no_rag"]

ExpectedBehavior = Literal["answer", "refuse", "clarify"]
#: what a query's ``expected_behavior`` may say the system should do (docs/dataset-format.md)
EXPECTED_BEHAVIORS: tuple[ExpectedBehavior, ...] = ("answer", "refuse", "clarify")

CORPUS_FILE = "corpus.jsonl"

QUERIES_FILE = "queries.jsonl"

INTENTS_FILE = "intents.jsonl"

#: a human judgement scores metrics (the registry's ``MetricSpec.human`` ones, which
#: ``load_dataset(human_metrics=...)`` is given) each an integer 0 to this
HUMAN_SCORE_MAX = 5
HUMAN_PREFERENCE_MAX = 2  # a human preference between two answers: -2..+2 (RAGChecker's scale)


class DatasetValidationError(DatasetError):
    """One or more contract violations. ``errors`` holds each, in file order."""

    def __init__(self, errors: list[DatasetError]) -> None:
        self.errors = errors
        first = errors[0]
        head = f"{len(errors)} problem(s) in dataset; first: " if len(errors) > 1 else ""
        shown = "\n".join(f"  - {e}" for e in errors[:20])
        more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
        super().__init__(
            f"{head}{first.reason}" + (f"\n{shown}{more}" if len(errors) > 1 else ""),
            file=first.file,
            line=first.line,
            field=first.field,
        )


@dataclass(frozen=True)
class LabelCheck:
    """One evidence label whose quote did not match where it points (relocated, stale, ambiguous)."""

    query_id: str
    line: int  # line of the query in queries.jsonl
    index: int  # position in the query's evidence list
    doc_id: str
    start: int  # as written
    end: int
    quote: str
    status: LabelStatus
    new_start: int | None = None  # relocated: where the quote is now
    new_end: int | None = None
    # ambiguous: start offsets of the quote in the document and how many there are (the loader
    # stops at two, which settles that it is ambiguous; check_dataset_labels counts them all)
    matches: tuple[int, ...] = ()
    n_matches: int = 0
    elsewhere: tuple[tuple[str, int], ...] = ()  # stale: (doc_id, start) of the quote in other documents

    @property
    def field(self) -> str:
        return f"evidence[{self.index}]"

    def message(self) -> str:
        """One line a person reads: what is wrong with the label and what was done."""
        span = f"[{self.start}, {self.end})"
        where = f"{self.query_id}: quote {_short(self.quote)} of doc '{self.doc_id}' {span}"
        if self.status == "relocated":
            return f"relocated: {where} -> [{self.new_start}, {self.new_end})"
        if self.status == "ambiguous":
            shown = ", ".join(str(m) for m in self.matches)
            more = ", ..." if self.n_matches > len(self.matches) else ""
            return (
                f"ambiguous: {where} is not at its offsets and occurs {self.n_matches} times in the "
                f"document (at {shown}{more}); the label is not used until it is fixed by hand"
            )
        hint = ""
        if self.elsewhere:
            hint = "; it occurs in " + ", ".join(f"'{d}' at {s}" for d, s in self.elsewhere)
            hint += " (evidence is never moved to another document: decide by hand)"
        return f"stale: {where} no longer occurs in the document{hint}; the label is not used"


@dataclass(frozen=True)
class LabelReport:
    """The quote check of a dataset: how many labels carried a quote, and each that did not match."""

    checked: int = 0
    issues: tuple[LabelCheck, ...] = field(default=())

    def count(self, status: LabelStatus) -> int:
        return sum(1 for c in self.issues if c.status == status)

    @property
    def relocated(self) -> int:
        return self.count("relocated")

    @property
    def stale(self) -> int:
        return self.count("stale")

    @property
    def ambiguous(self) -> int:
        return self.count("ambiguous")

    @property
    def unresolved(self) -> tuple[LabelCheck, ...]:
        """Stale and ambiguous labels: left out of the evidence until someone fixes them."""
        return tuple(c for c in self.issues if c.status != "relocated")


@dataclass(frozen=True)
class Span:
    """Character range ``[start, end)`` inside one document's text."""

    doc_id: str
    start: int
    end: int
    quote: str | None = None  # the text the label points at, when the dataset gives it


@dataclass(frozen=True, slots=True)  # slots: no per-document __dict__ (a corpus may hold millions)
class Document:
    doc_id: str
    text: str
    title: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    allowed_groups: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Intent:
    intent_l2: str
    intent_l1: str
    description: str
    examples: tuple[str, ...] = ()
    requires_rag: bool = True


@dataclass(frozen=True)
class HumanJudgement:
    """A person's 0-5 scores of one answer to a query (any subset of the human-labelled metrics,
    ``rag_ablate.metrics.registry.human_metrics()``)."""

    answer: str
    scores: Mapping[str, int]
    rater: str | None = None


@dataclass(frozen=True)
class HumanPreference:
    """A person's preference between two answers to a query, per aspect (``correctness``,
    ``overall``, ...): -2 (the first answer much better) to +2 (the second much better), 0 equal."""

    answers: tuple[str, str]
    preference: Mapping[str, int]
    rater: str | None = None


@dataclass(frozen=True)
class Query:
    query_id: str
    query: str
    relevant: Mapping[str, int]
    evidence: tuple[Span, ...]
    answerable: bool
    requires_rag: bool
    reference_answers: tuple[str, ...]
    intent_l1: str | None
    intent_l2: str | None
    split: str
    group: str
    tags: tuple[str, ...] = ()
    user_groups: tuple[str, ...] | None = None
    line: int = 0
    human_judgements: tuple[HumanJudgement, ...] = ()
    relevant_sets: tuple[tuple[str, ...], ...] = ()  # alternative sets of doc ids, each sufficient
    relevant_chunks: Mapping[str, int] = field(default_factory=dict)  # chunk id -> grade (gold chunk ids)
    metadata: Mapping[str, Any] = field(default_factory=dict)  # free JSON object, kept in records
    applicable_version: str | None = None  # the version (of product, policy, corpus) the query is about
    expected_behavior: ExpectedBehavior | None = None  # what the system should do; None: from the gold
    nonrelevant: tuple[str, ...] = ()  # doc ids judged not relevant (judged_at_k, bpref)
    # which of ``system.repeats`` runs of the query this is (set by the runner, never read from the
    # dataset); None: the query runs once (system.repeats=1)
    repeat: int | None = None
    human_preferences: tuple[HumanPreference, ...] = ()  # the pairwise items of human_judgements

    @property
    def behavior(self) -> ExpectedBehavior | None:
        """What the system should do: ``expected_behavior`` when given, else ``answer`` for an
        answerable query and ``refuse`` for an unanswerable one (None for ``no_rag``)."""
        if self.expected_behavior is not None:
            return self.expected_behavior
        kind = self.kind
        if kind == "no_rag":
            return None
        return "answer" if kind == "answerable" else "refuse"

    @property
    def kind(self) -> QueryKind:
        """``no_rag`` (intent only), ``answerable`` or ``unanswerable``."""
        if not self.requires_rag:
            return "no_rag"
        return "answerable" if self.answerable else "unanswerable"


@dataclass(frozen=True)
class Dataset:
    name: str
    path: Path
    documents: Mapping[str, Document]
    queries: tuple[Query, ...]
    intents: Mapping[str, Intent]
    corpus_fingerprint: str
    queries_fingerprint: str
    groups_computed: int = 0
    splits_assigned: int = 0
    labels: LabelReport = field(default_factory=LabelReport)  # quoted evidence checked at load

    def summary(self) -> dict[str, Any]:
        """Counts a person checks before trusting a dataset."""
        kinds = Counter(q.kind for q in self.queries)
        splits = Counter(q.split for q in self.queries)
        group_sizes = Counter(q.group for q in self.queries)
        lengths = sorted(len(d.text) for d in self.documents.values())
        multi = sum(1 for q in self.queries if len(q.relevant) > 1)
        largest = group_sizes.most_common(5)
        examples = {g: [q.query for q in self.queries if q.group == g][:3] for g, n in largest if n > 1}
        return {
            "name": self.name,
            "path": str(self.path),
            "documents": len(self.documents),
            "doc_chars": {
                "min": lengths[0] if lengths else 0,
                "median": lengths[len(lengths) // 2] if lengths else 0,
                "max": lengths[-1] if lengths else 0,
            },
            "queries": len(self.queries),
            "answerable": kinds.get("answerable", 0),
            "unanswerable": kinds.get("unanswerable", 0),
            "no_rag": kinds.get("no_rag", 0),
            "multi_doc": multi,
            "with_evidence": sum(1 for q in self.queries if q.evidence),
            "with_relevant_sets": sum(1 for q in self.queries if q.relevant_sets),
            "with_relevant_chunks": sum(1 for q in self.queries if q.relevant_chunks),
            "with_metadata": sum(1 for q in self.queries if q.metadata),
            "with_applicable_version": sum(1 for q in self.queries if q.applicable_version is not None),
            "expected_behavior": {
                b: sum(1 for q in self.queries if q.expected_behavior == b) for b in EXPECTED_BEHAVIORS
            },
            "human_judgements": sum(len(q.human_judgements) for q in self.queries),
            "human_judged_queries": sum(1 for q in self.queries if q.human_judgements),
            "human_preferences": sum(len(q.human_preferences) for q in self.queries),
            "labels_checked": self.labels.checked,
            "labels_relocated": self.labels.relocated,
            "labels_stale": self.labels.stale,
            "labels_ambiguous": self.labels.ambiguous,
            "intents": len(self.intents),
            "intent_parents": len({i.intent_l1 for i in self.intents.values()}),
            "splits": {s: splits.get(s, 0) for s in SPLITS},
            "groups": len(group_sizes),
            "groups_multi": sum(1 for n in group_sizes.values() if n > 1),
            "largest_groups": [[g, n] for g, n in largest],
            "group_examples": examples,
            "groups_computed": self.groups_computed,
            "splits_assigned": self.splits_assigned,
            "corpus_fingerprint": self.corpus_fingerprint,
            "queries_fingerprint": self.queries_fingerprint,
        }


def sample_dataset_path() -> Path:
    """The folder of the embedded sample dataset shipped in the package."""
    return Path(str(resources.files("rag_ablate") / "data" / "sample"))


def dataset_name(path: str | Path | None) -> str:
    """A dataset's name when none is given: its folder's name (``sample`` for the embedded one),
    the name ``rag-ablate validate`` prints and a run's ``dataset.name`` defaults to."""
    folder = sample_dataset_path() if path is None else Path(path).expanduser().resolve()
    return folder.name
