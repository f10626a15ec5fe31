"""The dataset contract (docs/dataset-format.md): load, validate, group, split.

A dataset is a folder with ``corpus.jsonl``, ``queries.jsonl`` and optionally
``intents.jsonl``. :func:`load_dataset` reads all three, checks every rule of the
contract, and either returns a complete :class:`Dataset` or raises
:class:`DatasetValidationError` listing every problem with file, line and field.
Nothing is loaded partially.

Queries without a ``group`` get one from near-duplicate grouping; queries without a
``split`` get one by group (largest groups first), so a group never spans splits.

Evidence entries that carry a ``quote`` are checked against the corpus
(:mod:`rag_ablate.dataset.labels`): moved quotes are relocated, stale or ambiguous ones are left
out of the query's spans and reported in :attr:`Dataset.labels`, not refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_ablate.core.errors import DatasetError
from rag_ablate.core.fmt import invisible, visible
from rag_ablate.dataset.labels import locate_quote
from rag_ablate.dataset.model import (
    CORPUS_FILE,
    EXPECTED_BEHAVIORS,
    HUMAN_PREFERENCE_MAX,
    HUMAN_SCORE_MAX,
    INTENTS_FILE,
    QUERIES_FILE,
    SPLITS,
    Dataset,
    DatasetValidationError,
    Document,
    ExpectedBehavior,
    HumanJudgement,
    HumanPreference,
    Intent,
    LabelCheck,
    LabelReport,
    Query,
    Span,
    dataset_name,
    sample_dataset_path,
)

_CORPUS_FIELDS = {"doc_id", "text", "title", "metadata", "allowed_groups"}
_QUERY_FIELDS = {
    "query_id",
    "query",
    "relevant",
    "evidence",
    "answerable",
    "reference_answer",
    "intent_l1",
    "intent_l2",
    "requires_rag",
    "split",
    "group",
    "tags",
    "user_groups",
    "human_judgements",
    "relevant_sets",
    "relevant_chunks",
    "nonrelevant",
    "metadata",
    "applicable_version",
    "expected_behavior",
}
_EVIDENCE_FIELDS = {"doc_id", "start", "end", "quote"}
_INTENT_FIELDS = {"intent_l2", "intent_l1", "description", "examples", "requires_rag"}
_JUDGEMENT_FIELDS = {"answer", "scores", "rater"}
_PREFERENCE_FIELDS = {"answers", "preference", "rater"}


# --------------------------------------------------------------------------- reading


def _read_jsonl(path: Path, errors: list[DatasetError]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each line's JSON object with its line number, read one line at a time (a corpus of a
    million documents is never held as one string or one list of lines)."""
    name = path.name
    try:
        f = path.open("rb")
    except OSError as exc:
        errors.append(DatasetError(f"cannot read file: {exc.strerror}", file=name))
        return
    with f:
        # a binary file's lines end at b"\n" only (a "\r" before it is dropped: CRLF files are fine);
        # never at the other characters str.splitlines() breaks on (U+2028, form feed, ...), which
        # JSON strings may hold. "\n" never occurs inside a multi-byte UTF-8 character, so decoding
        # line by line equals decoding the whole file.
        for lineno, line_bytes in enumerate(f, start=1):
            if lineno == 1:
                line_bytes = line_bytes.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark is accepted
            try:
                line_text = line_bytes.decode("utf-8")
            except UnicodeDecodeError:
                errors.append(DatasetError("not valid UTF-8", file=name, line=lineno))
                return
            if not line_text.strip():
                continue
            try:
                obj = json.loads(line_text.removesuffix("\n").removesuffix("\r"))
            except json.JSONDecodeError as exc:
                errors.append(DatasetError(f"invalid JSON: {exc.msg}", file=name, line=lineno))
                continue
            except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting too deep
                what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
                errors.append(DatasetError(f"invalid JSON: {what}", file=name, line=lineno))
                continue
            if not isinstance(obj, dict):
                errors.append(DatasetError("a line must be a JSON object", file=name, line=lineno))
                continue
            yield lineno, obj


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Fingerprint:
    """sha256 over a file's records (each as sorted-key JSON and a newline), fed one record at a time:
    independent of the file's formatting (key order, spaces, CRLF, a byte-order mark)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, record: dict[str, Any]) -> None:
        self._h.update(json.dumps(record, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        self._h.update(b"\n")

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class _Checker:
    """Collects contract violations for one file."""

    def __init__(self, file: str, errors: list[DatasetError]) -> None:
        self.file = file
        self.errors = errors

    def err(self, line: int, fld: str | None, msg: str) -> None:
        self.errors.append(DatasetError(msg, file=self.file, line=line, field=fld))

    def unknown(self, line: int, obj: dict[str, Any], allowed: set[str]) -> None:
        for key in obj:
            if key not in allowed:
                self.err(line, key, f"unknown field; valid fields: {', '.join(sorted(allowed))}")

    def string(self, line: int, obj: dict[str, Any], key: str, *, required: bool) -> str | None:
        if key not in obj or obj[key] is None:
            if required:
                self.err(line, key, "required field is missing")
            return None
        value = obj[key]
        if not isinstance(value, str):
            self.err(line, key, f"must be a string, got {type(value).__name__}")
            return None
        if required and not value.strip():
            self.err(line, key, "must be a non-empty string")
            return None
        return value

    def ident(self, line: int, obj: dict[str, Any], key: str) -> str | None:
        """A required id: a non-empty string without whitespace or invisible characters, which would
        break TREC files (whitespace-separated columns), file names and terminals."""
        value = self.string(line, obj, key, required=True)
        if value is None:
            return None
        bad = next((ch for ch in value if ch.isspace() or invisible(ch)), None)
        if bad is not None:
            what = "whitespace" if bad.isspace() and not invisible(bad) else "a control character"
            self.err(
                line,
                key,
                f"{key} {visible(repr(value))} contains {what} (U+{ord(bad):04X}); "
                "ids must be free of whitespace and control characters",
            )
            return None
        return value

    def boolean(self, line: int, obj: dict[str, Any], key: str) -> bool | None:
        if key not in obj or obj[key] is None:
            return None
        if not isinstance(obj[key], bool):
            self.err(line, key, f"must be true or false, got {obj[key]!r}")
            return None
        return bool(obj[key])

    def str_list(self, line: int, obj: dict[str, Any], key: str) -> tuple[str, ...] | None:
        if key not in obj or obj[key] is None:
            return None
        value = obj[key]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.err(line, key, "must be a list of strings")
            return None
        return tuple(value)


def _load_corpus(path: Path, errors: list[DatasetError]) -> tuple[dict[str, Document], str]:
    chk = _Checker(path.name, errors)
    docs: dict[str, Document] = {}
    first_line: dict[str, int] = {}
    fingerprint = _Fingerprint()
    for line, obj in _read_jsonl(path, errors):
        fingerprint.add(obj)
        chk.unknown(line, obj, _CORPUS_FIELDS)
        doc_id = chk.ident(line, obj, "doc_id")
        text = chk.string(line, obj, "text", required=True)
        title = chk.string(line, obj, "title", required=False)
        metadata = obj.get("metadata") or {}
        if not isinstance(metadata, dict):
            chk.err(line, "metadata", "must be a JSON object")
            metadata = {}
        allowed = chk.str_list(line, obj, "allowed_groups")
        if doc_id is None or text is None:
            continue
        if doc_id in docs:
            chk.err(line, "doc_id", f"duplicate doc_id '{doc_id}' (first on line {first_line[doc_id]})")
            continue
        first_line[doc_id] = line
        docs[doc_id] = Document(doc_id, text, title, metadata, allowed)
    if not docs and not errors:
        chk.err(1, None, "the corpus holds no documents")
    return docs, fingerprint.hexdigest()


def _load_intents(path: Path, errors: list[DatasetError]) -> dict[str, Intent]:
    chk = _Checker(path.name, errors)
    intents: dict[str, Intent] = {}
    for line, obj in _read_jsonl(path, errors):
        chk.unknown(line, obj, _INTENT_FIELDS)
        l2 = chk.string(line, obj, "intent_l2", required=True)
        l1 = chk.string(line, obj, "intent_l1", required=True)
        desc = chk.string(line, obj, "description", required=True)
        examples = chk.str_list(line, obj, "examples") or ()
        rag = chk.boolean(line, obj, "requires_rag")
        if l2 is None or l1 is None or desc is None:
            continue
        if l2 in intents:
            chk.err(line, "intent_l2", f"duplicate intent_l2 '{l2}'")
            continue
        intents[l2] = Intent(l2, l1, desc, examples, True if rag is None else rag)
    return intents


@dataclass
class _RawQuery:
    line: int
    query_id: str
    query: str
    relevant: dict[str, int]
    evidence: tuple[Span, ...]
    answerable: bool
    requires_rag: bool
    references: tuple[str, ...]
    intent_l1: str | None
    intent_l2: str | None
    split: str | None
    group: str | None
    tags: tuple[str, ...]
    user_groups: tuple[str, ...] | None
    judgements: tuple[HumanJudgement, ...]
    preferences: tuple[HumanPreference, ...] = ()
    relevant_sets: tuple[tuple[str, ...], ...] = ()
    relevant_chunks: dict[str, int] | None = None
    metadata: dict[str, Any] | None = None
    applicable_version: str | None = None
    expected_behavior: ExpectedBehavior | None = None
    nonrelevant: tuple[str, ...] = ()
    quotes: int = 0  # evidence entries with a quote
    label_checks: tuple[LabelCheck, ...] = ()  # quotes that did not match at their offsets


_METRIC_KEY_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def _item_fields(chk: _Checker, line: int, where: str, item: dict[str, Any], fields: set[str]) -> bool:
    """Report a ``human_judgements`` item's unknown fields and a ``rater`` that is not a string;
    whether it had neither."""
    n_err = len(chk.errors)
    for key in item:
        if key not in fields:
            chk.err(line, f"{where}.{key}", f"unknown field; valid fields: {', '.join(sorted(fields))}")
    rater = item.get("rater")
    if rater is not None and not isinstance(rater, str):
        chk.err(line, f"{where}.rater", f"must be a string, got {type(rater).__name__}")
    return len(chk.errors) == n_err


def _human_preference(chk: _Checker, line: int, where: str, item: dict[str, Any]) -> HumanPreference | None:
    """A pairwise item of ``human_judgements``: ``{answers: [first, second], preference: {aspect:
    -2..2}, rater}``; None (with each problem reported) when it is not valid."""
    n_err = len(chk.errors)
    _item_fields(chk, line, where, item, _PREFERENCE_FIELDS)
    answers = item.get("answers")
    if not (isinstance(answers, list) and len(answers) == 2 and all(isinstance(a, str) for a in answers)):
        chk.err(
            line,
            f"{where}.answers",
            'must be the two compared answers, a list of 2 strings ("": that system answered nothing)',
        )
    top = HUMAN_PREFERENCE_MAX
    prefs = item.get("preference")
    valid: dict[str, int] = {}
    if not isinstance(prefs, dict) or not prefs:
        chk.err(line, f"{where}.preference", f"must be a non-empty object {{aspect: -{top}..{top}}}")
    else:
        for aspect, score in prefs.items():
            at = f"{where}.preference.{aspect}"
            if not _METRIC_KEY_RE.fullmatch(aspect):
                chk.err(line, at, "not an aspect name (lower snake case)")
            elif not _is_int(score) or not -top <= score <= top:
                chk.err(
                    line,
                    at,
                    f"must be an integer -{top}..{top} (> 0: the second answer is better), got {score!r}",
                )
            else:
                valid[aspect] = int(score)
    if len(chk.errors) > n_err or not isinstance(answers, list):
        return None
    return HumanPreference((answers[0], answers[1]), valid, item.get("rater"))


def _human_judgements(
    chk: _Checker, line: int, value: object, metrics: Collection[str] | None
) -> tuple[tuple[HumanJudgement, ...], tuple[HumanPreference, ...]]:
    """The optional ``human_judgements`` list of a query: its scored answers and its pairwise
    preferences (items with ``answers``); each problem is reported with its field path.

    ``metrics``: the metric names a score may have (``None``: any lower snake case name)."""
    over = ", ".join(metrics) if metrics is not None else "metric names"
    if value is None:
        return (), ()
    if not isinstance(value, list):
        chk.err(
            line,
            "human_judgements",
            "must be a list of {answer, scores, rater} or {answers, preference, rater}",
        )
        return (), ()
    out: list[HumanJudgement] = []
    pairs: list[HumanPreference] = []
    for i, item in enumerate(value):
        where = f"human_judgements[{i}]"
        if not isinstance(item, dict):
            chk.err(line, where, "must be an object {answer, scores, rater} or {answers, preference, rater}")
            continue
        if "answers" in item or "preference" in item:
            pair = _human_preference(chk, line, where, item)
            if pair is not None:
                pairs.append(pair)
            continue
        ok = _item_fields(chk, line, where, item, _JUDGEMENT_FIELDS)
        answer = item.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            got = "missing" if answer is None else f"got {answer!r}"
            chk.err(line, f"{where}.answer", f"must be the judged answer, a non-empty string ({got})")
            ok = False
        rater = item.get("rater")
        scores = item.get("scores")
        valid: dict[str, int] = {}
        if not isinstance(scores, dict) or not scores:
            chk.err(
                line,
                f"{where}.scores",
                f"must be a non-empty object {{metric: 0-{HUMAN_SCORE_MAX}}} over {over}",
            )
            ok = False
        else:
            for metric, score in scores.items():
                at = f"{where}.scores.{metric}"
                if metrics is not None and metric not in metrics:
                    chk.err(line, at, f"unknown metric; valid: {over}")
                    ok = False
                elif metrics is None and not (isinstance(metric, str) and _METRIC_KEY_RE.fullmatch(metric)):
                    chk.err(line, at, "not a metric name (lower snake case)")
                    ok = False
                elif not _is_int(score):
                    chk.err(line, at, f"must be an integer 0-{HUMAN_SCORE_MAX}, got {score!r}")
                    ok = False
                elif not 0 <= score <= HUMAN_SCORE_MAX:
                    chk.err(line, at, f"must be in 0-{HUMAN_SCORE_MAX}, got {score}")
                    ok = False
                else:
                    valid[str(metric)] = int(score)
        if ok and isinstance(answer, str):
            out.append(HumanJudgement(answer, valid, rater))
    return tuple(out), tuple(pairs)


def _evidence(
    chk: _Checker, line: int, qid: str | None, value: object, docs: Mapping[str, Document]
) -> tuple[tuple[Span, ...], int, tuple[LabelCheck, ...]]:
    """The evidence spans of a query, the number that carry a quote, and every quote that did not match.

    A span with a ``quote`` is checked against the corpus (rag_ablate.dataset.labels): when the
    text moved it is relocated, when the quote is gone or occurs several times the span
    is left out and reported; its offsets then need not lie inside the document.
    """
    spans: list[Span] = []
    checks: list[LabelCheck] = []
    quotes = 0
    if value is None:
        return (), 0, ()
    if not isinstance(value, list):
        chk.err(line, "evidence", "must be a list of {doc_id, start, end, quote}")
        return (), 0, ()
    for i, item in enumerate(value):
        where = f"evidence[{i}]"
        if not isinstance(item, dict) or not {"doc_id", "start", "end"} <= set(item) <= _EVIDENCE_FIELDS:
            chk.err(line, where, "must be an object with doc_id, start, end and optionally quote")
            continue
        doc_id, start, end, quote = item["doc_id"], item["start"], item["end"], item.get("quote")
        if not isinstance(doc_id, str) or doc_id not in docs:
            chk.err(line, where + ".doc_id", f"doc_id {doc_id!r} is not in the corpus")
            continue
        if not (isinstance(start, int) and _is_int(start) and isinstance(end, int) and _is_int(end)):
            chk.err(line, where, "start and end must be integers")
            continue
        if quote is not None and (not isinstance(quote, str) or not quote):
            chk.err(line, where + ".quote", f"must be the non-empty text at [start, end), got {quote!r}")
            continue
        text = docs[doc_id].text
        if quote is None:
            if not 0 <= start < end <= len(text):
                n = len(text)
                chk.err(line, where, f"need 0 <= start < end <= len(text) = {n}, got [{start}, {end})")
                continue
            spans.append(Span(doc_id, start, end))
            continue
        if not 0 <= start < end:
            chk.err(line, where, f"need 0 <= start < end, got [{start}, {end})")
            continue
        quotes += 1
        status, new_start, new_end, matches = locate_quote(text, start, end, quote)
        if status != "ok":
            checks.append(
                LabelCheck(
                    query_id=qid or "?",
                    line=line,
                    index=i,
                    doc_id=doc_id,
                    start=start,
                    end=end,
                    quote=quote,
                    status=status,
                    new_start=new_start if status == "relocated" else None,
                    new_end=new_end if status == "relocated" else None,
                    matches=tuple(matches),
                    n_matches=len(matches),
                )
            )
        if status in ("ok", "relocated"):
            spans.append(Span(doc_id, new_start, new_end, quote))
    return tuple(spans), quotes, tuple(checks)


def _relevant_sets(
    chk: _Checker,
    line: int,
    value: object,
    docs: Mapping[str, Document],
    relevant: Mapping[str, int],
    has_relevant: bool,
) -> tuple[tuple[str, ...], ...]:
    """The optional ``relevant_sets``: alternative sets of doc ids, each enough to answer on its own."""
    if value is None:
        return ()
    shape = "must be a non-empty list of alternative sets, each a non-empty list of doc ids"
    if not isinstance(value, list) or not value:
        chk.err(line, "relevant_sets", shape)
        return ()
    if not has_relevant:
        chk.err(
            line, "relevant_sets", "needs a non-empty 'relevant' (an unanswerable query has no evidence sets)"
        )
        return ()
    out: list[tuple[str, ...]] = []
    first: dict[frozenset[str], int] = {}
    ok = True
    for i, item in enumerate(value):
        where = f"relevant_sets[{i}]"
        if not isinstance(item, list) or not item or not all(isinstance(d, str) for d in item):
            chk.err(line, where, "must be a non-empty list of doc ids (strings)")
            ok = False
            continue
        for doc_id in item:
            if doc_id not in docs:
                chk.err(line, where, f"doc_id '{doc_id}' is not in the corpus")
                ok = False
            elif doc_id not in relevant:
                chk.err(
                    line,
                    where,
                    f"doc_id '{doc_id}' is not in 'relevant' (a document that answers the question "
                    "is relevant: give it a grade there)",
                )
                ok = False
        if len(set(item)) < len(item):
            chk.err(line, where, "lists a doc id more than once")
            ok = False
        key = frozenset(item)
        if key in first:
            chk.err(line, where, f"is the same set as relevant_sets[{first[key]}]")
            ok = False
        first.setdefault(key, i)
        out.append(tuple(item))
    return tuple(out) if ok else ()


def _nonrelevant(
    chk: _Checker, line: int, obj: dict[str, Any], docs: Mapping[str, Document], relevant: Mapping[str, int]
) -> tuple[str, ...]:
    """The optional ``nonrelevant``: doc ids someone judged and found not relevant (grade 0 in qrels
    terms), read by ``judged_at_k`` and ``bpref``; each in the corpus and not in ``relevant``."""
    ids = chk.str_list(line, obj, "nonrelevant") or ()
    for doc_id in ids:
        if doc_id not in docs:
            chk.err(line, "nonrelevant", f"doc_id '{doc_id}' is not in the corpus")
        elif doc_id in relevant:
            chk.err(
                line,
                "nonrelevant",
                f"doc_id '{doc_id}' is also in 'relevant': a document is one or the other",
            )
    return tuple(dict.fromkeys(ids))


def _relevant_chunks(chk: _Checker, line: int, value: object) -> dict[str, int]:
    """The optional ``relevant_chunks``: gold chunk ids (the system's own ids) with their grades.

    Chunk ids are not checked against the corpus: chunks are cut by the system under test."""
    out: dict[str, int] = {}
    if value is None:
        return out
    if not isinstance(value, dict):
        chk.err(line, "relevant_chunks", f"must be an object {{chunk_id: grade}}, got {type(value).__name__}")
        return out
    for chunk_id, grade in value.items():
        if not chunk_id.strip():
            chk.err(line, "relevant_chunks", "a chunk id must be a non-empty string")
        elif not _is_int(grade) or grade < 1:
            chk.err(line, "relevant_chunks", f"grade of '{chunk_id}' must be an integer >= 1, got {grade!r}")
        else:
            out[chunk_id] = grade
    return out


def _expected_behavior(chk: _Checker, line: int, value: object) -> ExpectedBehavior | None:
    """The optional ``expected_behavior``: ``answer``, ``refuse`` or ``clarify``."""
    if value is None:
        return None
    for behavior in EXPECTED_BEHAVIORS:
        if value == behavior:
            return behavior
    chk.err(line, "expected_behavior", f"must be one of {', '.join(EXPECTED_BEHAVIORS)}, got {value!r}")
    return None


def _behavior_agrees(
    chk: _Checker, line: int, behavior: ExpectedBehavior | None, answerable: bool, requires_rag: bool
) -> None:
    """``expected_behavior`` must agree with the gold: ``refuse`` has none, ``answer`` (on a query
    that needs retrieval) has some; ``clarify`` goes with either."""
    if behavior == "refuse" and answerable:
        chk.err(
            line,
            "expected_behavior",
            "'refuse' on an answerable query: a query the system must refuse has no gold "
            "('relevant', 'relevant_chunks', 'evidence'); drop them or say 'answer' or 'clarify'",
        )
    elif behavior == "answer" and requires_rag and not answerable:
        chk.err(
            line,
            "expected_behavior",
            "'answer' on an unanswerable query: give its gold ('relevant' or 'relevant_chunks'), "
            "or say 'refuse' or 'clarify'",
        )


def _load_queries(
    path: Path,
    docs: Mapping[str, Document],
    intents: Mapping[str, Intent] | None,
    errors: list[DatasetError],
    human_metrics: Collection[str] | None = None,
) -> tuple[list[_RawQuery], str]:
    chk = _Checker(path.name, errors)
    out: list[_RawQuery] = []
    seen: dict[str, int] = {}
    fingerprint = _Fingerprint()
    for line, obj in _read_jsonl(path, errors):
        fingerprint.add(obj)
        n_err = len(errors)
        chk.unknown(line, obj, _QUERY_FIELDS)
        qid = chk.ident(line, obj, "query_id")
        text = chk.string(line, obj, "query", required=True)
        if qid is not None:
            if qid in seen:
                chk.err(line, "query_id", f"duplicate query_id '{qid}' (first on line {seen[qid]})")
            else:
                seen[qid] = line

        relevant: dict[str, int] = {}
        rel = obj.get("relevant")
        if rel is not None:
            if not isinstance(rel, dict):
                chk.err(line, "relevant", "must be an object {doc_id: grade}")
            else:
                for doc_id, grade in rel.items():
                    if isinstance(grade, bool) or not isinstance(grade, int) or grade < 1:
                        chk.err(
                            line, "relevant", f"grade of '{doc_id}' must be an integer >= 1, got {grade!r}"
                        )
                    elif doc_id not in docs:
                        chk.err(line, "relevant", f"doc_id '{doc_id}' is not in the corpus")
                    else:
                        relevant[doc_id] = grade

        relevant_chunks = _relevant_chunks(chk, line, obj.get("relevant_chunks"))
        nonrelevant = _nonrelevant(chk, line, obj, docs, relevant)
        gold = bool(rel) or bool(obj.get("relevant_chunks"))
        spans, quotes, checks = _evidence(chk, line, qid, obj.get("evidence"), docs)
        relevant_sets = _relevant_sets(chk, line, obj.get("relevant_sets"), docs, relevant, bool(rel))

        l1 = chk.string(line, obj, "intent_l1", required=False)
        l2 = chk.string(line, obj, "intent_l2", required=False)
        if intents is not None:
            if l2 is not None and l2 not in intents:
                chk.err(
                    line, "intent_l2", f"'{l2}' is not in intents.jsonl; valid: {', '.join(sorted(intents))}"
                )
            elif l2 is not None and l1 is not None and intents[l2].intent_l1 != l1:
                chk.err(line, "intent_l1", f"'{l1}' is not the parent of '{l2}' ('{intents[l2].intent_l1}')")
            if l1 is not None and l1 not in {i.intent_l1 for i in intents.values()}:
                chk.err(line, "intent_l1", f"'{l1}' is not a parent intent in intents.jsonl")

        answerable = chk.boolean(line, obj, "answerable")
        if answerable is None:
            answerable = gold
        elif answerable and not gold:
            chk.err(
                line, "answerable", "answerable is true but 'relevant' is empty (and so is 'relevant_chunks')"
            )
        elif not answerable and rel:
            chk.err(line, "answerable", "answerable is false but 'relevant' is not empty")
        elif not answerable and gold:
            chk.err(line, "answerable", "answerable is false but 'relevant_chunks' is not empty")
        if (spans or checks) and not answerable:
            chk.err(line, "evidence", "an unanswerable query cannot have evidence")

        requires_rag = chk.boolean(line, obj, "requires_rag")
        if requires_rag is None:
            requires_rag = intents[l2].requires_rag if intents and l2 is not None and l2 in intents else True
        behavior = _expected_behavior(chk, line, obj.get("expected_behavior"))
        _behavior_agrees(chk, line, behavior, answerable, requires_rag)
        metadata = obj.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            chk.err(line, "metadata", f"must be a JSON object {{key: value}}, got {type(metadata).__name__}")
        version = chk.string(line, obj, "applicable_version", required=False)
        if version is not None and not version.strip():
            chk.err(line, "applicable_version", "must be a non-empty string")

        ref = obj.get("reference_answer")
        refs: tuple[str, ...] = ()
        if isinstance(ref, str):
            refs = (ref,)
        elif isinstance(ref, list) and all(isinstance(r, str) for r in ref):
            refs = tuple(ref)
        elif ref is not None:
            chk.err(line, "reference_answer", "must be a string or a list of strings")

        split = chk.string(line, obj, "split", required=False)
        if split is not None and split not in SPLITS:
            chk.err(line, "split", f"must be one of {', '.join(SPLITS)}, got '{split}'")
        group = chk.string(line, obj, "group", required=False)
        tags = chk.str_list(line, obj, "tags") or ()
        user_groups = chk.str_list(line, obj, "user_groups")
        judgements, preferences = _human_judgements(chk, line, obj.get("human_judgements"), human_metrics)

        if len(errors) > n_err or qid is None or text is None:
            continue
        out.append(
            _RawQuery(
                line,
                qid,
                text,
                relevant,
                tuple(spans),
                answerable,
                requires_rag,
                refs,
                l1,
                l2,
                split,
                group,
                tags,
                user_groups,
                judgements,
                preferences,
                relevant_sets=relevant_sets,
                relevant_chunks=relevant_chunks,
                metadata=metadata,
                applicable_version=version,
                expected_behavior=behavior,
                nonrelevant=nonrelevant,
                quotes=quotes,
                label_checks=checks,
            )
        )
    if not out and not errors:
        chk.err(1, None, "the file holds no queries")
    return out, fingerprint.hexdigest()


def _assign_groups_and_splits(
    raw: list[_RawQuery], file: str, holdout_share: float, group_threshold: float, seed: int
) -> tuple[list[str], list[str], int, int]:
    from rag_ablate.dataset.grouping.groups import group_near_duplicates
    from rag_ablate.dataset.grouping.splits import assign_splits

    explicit = [q.group for q in raw]
    result = group_near_duplicates(
        [q.query for q in raw],
        ids=[q.query_id for q in raw],
        explicit=explicit,
        threshold=group_threshold,
        seed=seed,
    )
    fixed = [q.split for q in raw]
    by_group: dict[str, list[_RawQuery]] = {}
    for q, g in zip(raw, result.group_of, strict=True):
        if q.split is not None:
            by_group.setdefault(g, []).append(q)
    clashes = [
        DatasetError(
            f"group '{g}' spans both splits: "
            + ", ".join(f"{q.query_id} (line {q.line}, {q.split})" for q in members),
            file=file,
            line=members[0].line,
            field="split",
        )
        for g, members in by_group.items()
        if len({q.split for q in members}) > 1
    ]
    if clashes:
        raise DatasetValidationError(clashes)
    splits = assign_splits(result.group_of, holdout_share=holdout_share, seed=seed, fixed=fixed)
    computed = sum(1 for e in explicit if e is None)
    assigned = sum(1 for s in fixed if s is None)
    return result.group_of, splits, computed, assigned


def load_dataset(
    path: str | Path | None = None,
    *,
    name: str | None = None,
    holdout_share: float = 0.3,
    group_threshold: float = 0.7,
    seed: int = 0,
    human_metrics: Collection[str] | None = None,
) -> Dataset:
    """Load and validate a dataset folder (``None``: the embedded sample).

    ``human_metrics``: the metrics a ``human_judgements`` score may name, which the metric
    registry knows (``rag_ablate.metrics.registry.human_metrics()``; the dataset layer sits below
    it, so a caller above passes them in); ``None`` checks only that each is a metric-shaped name.
    """
    folder = sample_dataset_path() if path is None else Path(path).expanduser()
    if not folder.is_dir():
        raise DatasetError(f"dataset folder not found: {folder}", file=str(folder))
    for required in (CORPUS_FILE, QUERIES_FILE):
        if not (folder / required).is_file():
            raise DatasetError(
                f"missing {required} in {folder} (a dataset folder holds corpus.jsonl, queries.jsonl"
                " and optionally intents.jsonl)",
                file=required,
            )
    errors: list[DatasetError] = []
    docs, corpus_fp = _load_corpus(folder / CORPUS_FILE, errors)
    intents: dict[str, Intent] | None = None
    if (folder / INTENTS_FILE).is_file():
        intents = _load_intents(folder / INTENTS_FILE, errors)
    raw, queries_fp = _load_queries(folder / QUERIES_FILE, docs, intents, errors, human_metrics)
    if errors:
        raise DatasetValidationError(errors)
    labels = LabelReport(sum(q.quotes for q in raw), tuple(c for q in raw for c in q.label_checks))

    groups, splits, computed, assigned = _assign_groups_and_splits(
        raw, QUERIES_FILE, holdout_share, group_threshold, seed
    )
    queries = tuple(
        Query(
            query_id=q.query_id,
            query=q.query,
            relevant=q.relevant,
            evidence=q.evidence,
            answerable=q.answerable,
            requires_rag=q.requires_rag,
            reference_answers=q.references,
            intent_l1=q.intent_l1,
            intent_l2=q.intent_l2,
            split=s,
            group=g,
            tags=q.tags,
            user_groups=q.user_groups,
            line=q.line,
            human_judgements=q.judgements,
            relevant_sets=q.relevant_sets,
            relevant_chunks=q.relevant_chunks or {},
            metadata=q.metadata or {},
            applicable_version=q.applicable_version,
            expected_behavior=q.expected_behavior,
            nonrelevant=q.nonrelevant,
            human_preferences=q.preferences,
        )
        for q, g, s in zip(raw, groups, splits, strict=True)
    )
    return Dataset(
        name=name or dataset_name(path),
        path=folder,
        documents=docs,
        queries=queries,
        intents=intents or {},
        corpus_fingerprint=corpus_fp,
        queries_fingerprint=queries_fp,
        groups_computed=computed,
        splits_assigned=assigned,
        labels=labels,
    )


def read_human_judgements(
    path: str | Path | None = None, *, human_metrics: Collection[str] | None = None
) -> dict[str, tuple[HumanJudgement, ...]]:
    """The ``human_judgements`` of a dataset folder's queries (``None``: the embedded sample), by
    query id, read from ``queries.jsonl`` alone (no corpus, no grouping): what the comparison's
    prediction-powered estimates need (:mod:`rag_ablate.compare.ppi`). Queries without any are
    left out. A malformed judgement raises :class:`DatasetValidationError` naming its line and
    field, as :func:`load_dataset` would; ``human_metrics`` as there."""
    folder = sample_dataset_path() if path is None else Path(path).expanduser()
    file = folder / QUERIES_FILE
    if not file.is_file():
        raise DatasetError("not found (the human_judgements are read from it)", file=str(file))
    errors: list[DatasetError] = []
    chk = _Checker(file.name, errors)
    out: dict[str, tuple[HumanJudgement, ...]] = {}
    for line, obj in _read_jsonl(file, errors):
        qid = obj.get("query_id")
        found, _ = _human_judgements(chk, line, obj.get("human_judgements"), human_metrics)  # scores only
        if found and isinstance(qid, str):
            out[qid] = found
    if errors:
        raise DatasetValidationError(errors)
    return out
