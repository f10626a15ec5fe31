"""Deterministic answer metrics: exact match, token F1, refusals and citations (docs/metrics.md "Answers").

Every function here reads text only (no model), so every answer metric runs offline.

* :func:`answer_tokens`: one token per CJK character (letters and digits of other scripts form
  one word token per run; a number with a decimal point or thousands separators is one token,
  ``3.5``, ``35,000`` -> ``35000``), lower-cased after NFKC; punctuation never counts. So
  Chinese is compared character by character and English word by word, mixed text both ways.
* :func:`exact_match`: 1 when the normalised answer equals a normalised reference.
* :func:`token_f1`: the F1 of the answer's and a reference's token multisets, max over references.
* :func:`reference_in_answer` and :func:`reference_recall`: a reference found whole in the answer,
  and the share of its tokens found there, both in :func:`reference_tokens` (numbers, amounts and
  dates written one way, :func:`rag_ablate.text.normalize.normal_form`).
* :func:`answer_language_match`: the answer is written in the question's script.
* refusals and clarification requests: the phrase rule of :mod:`rag_ablate.metrics.refusals`.
* :func:`citation_scores`: precision and coverage of ``[n]`` citations under the lexical
  support rule of :func:`supports`, or the judge's support verdicts where it gave them.
* :func:`judge_metrics`: ``faithfulness``, ``relevance``, ``completeness`` and ``judge_error_<metric>``
  from a record's ``judge`` value (what an LLM judge returned, docs/metrics.md "Judged answers");
  :func:`judge_refusal` and :func:`judge_support` are the judge's majority verdicts over its repeats.

Citation markers ``[n]`` are removed from an answer before it is compared with a reference.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rag_ablate.metrics.refusals import PhraseRule
from rag_ablate.metrics.registry import judged_metrics
from rag_ablate.text.count import CJK_RANGES
from rag_ablate.text.normalize import HAN_SHARE, normal_form, script_of

if TYPE_CHECKING:
    from rag_ablate.config.schema import GeneratorConfig, MetricsConfig
    from rag_ablate.dataset.model import Document, Query

__all__ = [
    "AnswerScoring",
    "AnswerSentence",
    "CitationScores",
    "answer_language_match",
    "answer_metrics",
    "answer_sentences",
    "answer_tokens",
    "citation_scores",
    "exact_match",
    "judge_metrics",
    "judge_refusal",
    "judge_scores",
    "judge_support",
    "majority",
    "overlap_terms",
    "passage_texts",
    "reference_in_answer",
    "reference_recall",
    "reference_tokens",
    "sentences",
    "strip_markers",
    "supports",
    "token_f1",
]

_CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES)
# a decimal number (3.5), one CJK letter/digit, or a run of other letters/digits (CJK punctuation is
# not \w, so it never counts); thousands separators are dropped first (35,000 -> 35000)
_ANSWER_TOKEN = re.compile(f"\\d+\\.\\d+|(?:(?![\\W_])[{_CJK_CLASS}])|[^\\W_{_CJK_CLASS}]+")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_CJK_CHAR = re.compile(f"[{_CJK_CLASS}]")
MARKER = re.compile(r"\[(\d+)\]")
_LEADING_MARKERS = re.compile(r"^(?:\s*\[\d+\])+")
# a sentence: up to . ! ? followed by a space or the end (so "3.5" stays whole), a CJK stop, or a line end
_SENTENCE = re.compile(r"\S.*?(?:[.!?]+(?=\s|$)|[。！？；]+|(?=\n)|$)", re.S)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, stripped, in order."""
    return [m.group(0).strip() for m in _SENTENCE.finditer(text) if m.group(0).strip()]


def overlap_terms(text: str, cjk: bool) -> set[str]:
    """What support is counted in: characters (letters and digits, stopwords dropped) for Chinese;
    for English the content words of the BM25 analyzer, a plural ``s`` dropped from words longer than
    three letters (``items`` and ``item`` match)."""
    from rag_ablate.text.analyzers import ZH_STOPWORDS, analyze_en

    if cjk:
        return {ch for ch in text.lower() if ch.isalnum() and ch not in ZH_STOPWORDS}
    return {
        w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in analyze_en(text)
    }


def is_chinese(text: str) -> bool:
    """True when the text has any CJK character (its overlap is then counted in characters)."""
    return _CJK_CHAR.search(text) is not None


def strip_markers(answer: str) -> str:
    """``answer`` without its ``[n]`` citation markers."""
    return MARKER.sub("", answer)


def answer_tokens(text: str) -> list[str]:
    """Tokens compared by exact match and token F1 (see the module docstring)."""
    text = unicodedata.normalize("NFKC", strip_markers(text)).lower()
    return _ANSWER_TOKEN.findall(_THOUSANDS.sub("", text))


def reference_tokens(text: str) -> list[str]:
    """The tokens a reference is looked for in: :func:`answer_tokens` of the text's
    :func:`~rag_ablate.text.normalize.normal_form` (``三万五千元`` and ``3.5万元`` are 35000, 元)."""
    return answer_tokens(normal_form(strip_markers(text)))


def _contains(tokens: Sequence[str], part: Sequence[str]) -> bool:
    n = len(part)
    return any(tokens[i : i + n] == part for i in range(len(tokens) - n + 1))


def _in_answer(tokens: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    return float(any(ref and _contains(tokens, ref) for ref in refs))


def _recall(tokens: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    pred = Counter(tokens)
    golds = [Counter(ref) for ref in refs if ref]
    return max((sum((pred & gold).values()) / sum(gold.values()) for gold in golds), default=0.0)


def reference_in_answer(answer: str, references: Sequence[str]) -> float:
    """1.0 when the :func:`reference_tokens` of some reference occur, in order and contiguous, in
    the answer's, else 0.0 (a reference without tokens never does)."""
    return _in_answer(reference_tokens(answer), [reference_tokens(r) for r in references])


def reference_recall(answer: str, references: Sequence[str]) -> float:
    """Max over references of the share of the reference's :func:`reference_tokens` (a multiset)
    that the answer's hold; 0.0 without references."""
    return _recall(reference_tokens(answer), [reference_tokens(r) for r in references])


def answer_language_match(question: str, answer: str, threshold: float = HAN_SHARE) -> float | None:
    """1.0 when the answer is written in the question's script (Han or Latin,
    :func:`~rag_ablate.text.normalize.script_of` at ``threshold``), or in none (no letters:
    ``42``); 0.0 when in the other; None when the question has no script."""
    want = script_of(question, threshold)
    if want is None:
        return None
    got = script_of(strip_markers(answer), threshold)
    return float(got is None or got == want)


def exact_match(answer: str, references: Sequence[str]) -> float:
    """1.0 when the answer's token sequence equals one reference's, else 0.0 (case, punctuation,
    spacing and citation markers ignored)."""
    tokens = answer_tokens(answer)
    return float(any(tokens == answer_tokens(ref) for ref in references))


def token_f1(answer: str, references: Sequence[str]) -> float:
    """Max over references of the F1 of shared tokens (multiset overlap); 0.0 without references."""
    pred = Counter(answer_tokens(answer))
    best = 0.0
    for ref in references:
        gold = Counter(answer_tokens(ref))
        common = sum((pred & gold).values())
        if common == 0:
            continue
        precision = common / sum(pred.values())
        recall = common / sum(gold.values())
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass(frozen=True)
class AnswerSentence:
    """One sentence of an answer, without markers, and the citation numbers it carries."""

    text: str
    markers: tuple[int, ...]


def answer_sentences(answer: str) -> list[AnswerSentence]:
    """The answer's sentences with their ``[n]`` markers; markers that open a sentence (as in
    ``"It is red. [1] It is big."``) belong to the sentence before them."""
    out: list[tuple[str, list[int]]] = []
    for raw in sentences(answer):
        lead = _LEADING_MARKERS.match(raw)
        if lead and out:
            out[-1][1].extend(int(n) for n in MARKER.findall(lead.group(0)))
            raw = raw[lead.end() :]
        text = strip_markers(raw).strip()
        markers = [int(n) for n in MARKER.findall(raw)]
        if answer_tokens(text):
            out.append((text, markers))
        elif out:
            out[-1][1].extend(markers)
    return [AnswerSentence(text, tuple(dict.fromkeys(m))) for text, m in out]


def supports(sentence: str, source: str, threshold: float) -> bool:
    """The lexical support rule: ``source`` supports ``sentence`` when at least ``threshold`` of the
    sentence's overlap terms (:func:`overlap_terms`, characters for Chinese) occur in the source."""
    cjk = is_chinese(sentence)
    terms = overlap_terms(sentence, cjk)
    if not terms:
        return False
    return len(terms & overlap_terms(source, cjk)) / len(terms) >= threshold


@dataclass(frozen=True)
class CitationScores:
    precision: float | None  # supporting (sentence, citation) pairs / all pairs; None without citations
    coverage: float | None  # sentences with a supporting citation / sentences; None without sentences


def citation_scores(
    answer: str,
    cited_texts: Sequence[str | None],
    threshold: float,
    judged: Sequence[bool | None] | None = None,
) -> CitationScores:
    """Citation precision and coverage of ``answer``; ``cited_texts[n - 1]`` is the text marker
    ``[n]`` cites (None or a marker beyond the list: a citation that supports nothing).

    ``judged`` (a judge's verdicts, see :func:`judge_support`) decides the support of each
    (sentence, marker) pair in the order of :func:`answer_sentences` and their markers; a pair
    the judge gave no verdict for (None, or beyond the list) falls back to the lexical rule."""
    sents = answer_sentences(answer)
    pairs = 0
    good = 0
    covered = 0
    for s in sents:
        any_good = False
        for n in s.markers:
            verdict = judged[pairs] if judged is not None and pairs < len(judged) else None
            pairs += 1
            source = cited_texts[n - 1] if 1 <= n <= len(cited_texts) else None
            if source is None:
                continue
            if verdict if verdict is not None else supports(s.text, source, threshold):
                good += 1
                any_good = True
        covered += any_good
    return CitationScores(
        precision=good / pairs if pairs else None,
        coverage=covered / len(sents) if sents else None,
    )


@dataclass(frozen=True)
class AnswerScoring:
    """How answers are scored: ``metrics.refusal_phrases`` and ``metrics.clarification_phrases``
    (added to the curated sets of :mod:`rag_ablate.metrics.refusals`), ``metrics.citation_support``
    and ``metrics.han_share`` (:func:`answer_language_match`)."""

    refusal_phrases: tuple[str, ...] = ()
    citation_support: float = 0.5
    clarification_phrases: tuple[str, ...] = ()
    han_share: float = HAN_SHARE

    @classmethod
    def from_config(cls, m: MetricsConfig, g: GeneratorConfig | None = None) -> AnswerScoring:
        """The ``metrics`` settings; with ``generator=extractive`` (``g``) its own refusal sentences
        (``generator.refusal_zh``, ``refusal_en``) are refusal phrases too, whatever they say."""
        own = (g.refusal_zh, g.refusal_en) if g is not None and g.name == "extractive" else ()
        refusals = (*m.refusal_phrases, *own)
        return cls(tuple(refusals), m.citation_support, tuple(m.clarification_phrases), m.han_share)

    @cached_property
    def rule(self) -> PhraseRule:
        """The phrase rule with the configured phrases added."""
        return PhraseRule(self.refusal_phrases, self.clarification_phrases)


def passage_texts(rec: Mapping[str, Any], docs: Mapping[str, Document]) -> list[str]:
    """What an answer may quote: the chunks of the ``context`` the generator read when the record
    has one, else the retrieved chunks; each entry's span of its document, else its stored ``text``."""
    out: list[str] = []
    for e in rec.get("context") or rec.get("retrieved") or []:
        doc = docs.get(e.get("doc_id") or "")
        start, end = e.get("start"), e.get("end")
        if doc is not None and start is not None and end is not None:
            out.append(doc.text[int(start) : int(end)])
        elif isinstance(e.get("text"), str):
            out.append(e["text"])
    return out


def cited_texts(
    citations: Sequence[Mapping[str, Any]],
    retrieved: Sequence[Mapping[str, Any]],
    docs: Mapping[str, Document],
) -> list[str | None]:
    """The text each citation points at: its span of its document; a chunk id alone is looked up among
    the retrieved chunks; a document id alone is the whole document; anything unknown is None."""
    by_chunk = {r["chunk_id"]: r for r in retrieved}
    out: list[str | None] = []
    for c in citations:
        doc_id, start, end = c.get("doc_id"), c.get("start"), c.get("end")
        hit = by_chunk.get(c.get("chunk_id"))
        if start is None and hit is not None:
            doc_id, start, end = hit["doc_id"], hit["start"], hit["end"]
        doc = docs.get(doc_id) if doc_id is not None else None
        if doc is None:
            out.append(None)
        elif start is None or end is None:
            out.append(doc.text)
        else:
            out.append(doc.text[int(start) : int(end)])
    return out


# ------------------------------------------------------------------------------------- judged answers


def _repeats(judge: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    reps = (judge or {}).get("repeats") or []
    return [r for r in reps if isinstance(r, Mapping)]


def _valid_score(v: object) -> float | None:
    """``v`` as a 0-5 score, or None when it is not one (null, a bool, a string, out of range)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= float(v) <= 5:
        return float(v)
    return None


def judge_scores(judge: Mapping[str, Any] | None, metric: str) -> tuple[list[float], int]:
    """The valid 0-5 scores the judge's repeats gave ``metric``, and how many repeats failed it
    (a null or invalid score: a parse failure or a failed call, never counted as 0)."""
    scores: list[float] = []
    failed = 0
    for rep in _repeats(judge):
        v = _valid_score((rep.get("scores") or {}).get(metric))
        if v is not None:
            scores.append(v)
        else:
            failed += 1
    return scores, failed


def majority(verdicts: Sequence[bool | None]) -> bool | None:
    """True or False when more of the given (non-None) verdicts say so; None on a tie or without any."""
    yes = sum(1 for v in verdicts if v is True)
    no = sum(1 for v in verdicts if v is False)
    return None if yes == no else yes > no


def judge_refusal(judge: Mapping[str, Any] | None) -> bool | None:
    """The judge's majority verdict over its repeats that the answer declines to answer (None: none)."""
    return majority([r.get("refusal") for r in _repeats(judge) if isinstance(r.get("refusal"), bool)])


def judge_support(judge: Mapping[str, Any] | None, n_pairs: int) -> list[bool | None] | None:
    """The judge's majority support verdict per (sentence, citation) pair, None where it has none.

    A repeat's ``support`` counts only when it is a list of ``n_pairs`` booleans (the pairs it was
    asked about); None when no repeat gave one."""
    lists = [
        sup
        for r in _repeats(judge)
        if isinstance(sup := r.get("support"), list)
        and len(sup) == n_pairs
        and all(isinstance(x, bool) for x in sup)
    ]
    if not lists or n_pairs == 0:
        return None
    return [majority([sup[j] for sup in lists]) for j in range(n_pairs)]


def judge_metrics(judge: Mapping[str, Any] | None, query: Query) -> dict[str, float | None]:
    """``faithfulness``, ``relevance`` and (with reference answers) ``completeness``: the mean of the
    repeats' valid 0-5 scores (absent when none is valid); ``judge_error_<metric>``: the share of
    repeats whose judgement of it failed. Empty without judge repeats."""
    out: dict[str, float | None] = {}
    if not _repeats(judge):
        return out
    for metric in judged_metrics():  # the registry's MetricSpec.judged metrics
        if metric == "completeness" and not query.reference_answers:
            continue  # judged against the references only: without one, not asked (or ignored)
        scores, failed = judge_scores(judge, metric)
        if scores:
            out[metric] = sum(scores) / len(scores)
        out[f"judge_error_{metric}"] = failed / (len(scores) + failed)
    return out


def answer_metrics(
    rec: Mapping[str, Any], query: Query, docs: Mapping[str, Document], scoring: AnswerScoring
) -> dict[str, float | None]:
    """The answer metrics of one record with an ``answer`` (docs/metrics.md "Answers").

    ``refusal``, ``asked_clarification`` and ``answer_language_match`` on every query (the last
    when the question has a script); ``correct_refusal`` on the queries the system should refuse,
    ``over_refusal`` on those it should answer, ``correct_clarification`` on those it should ask
    back (``Query.behavior``: the query's ``expected_behavior``, else ``refuse`` when unanswerable
    and ``answer`` when answerable; a no_rag one without ``expected_behavior`` gets none of the
    three); ``exact_match``, ``token_f1``, ``reference_in_answer`` and ``reference_recall`` on
    answerable queries with reference answers; ``citation_precision`` (when the answer cites) and
    ``citation_coverage`` on answers that do not refuse, unless the system does not report
    citations (``citations`` None).

    Refusals and clarification requests are found by the phrase rule
    (:mod:`rag_ablate.metrics.refusals`), which ignores phrases inside text copied from the
    record's passages. With a judge's verdicts in ``rec["judge"]``: the judged metrics
    (:func:`judge_metrics`); the judge's majority refusal verdict, when it gave one, decides
    ``refusal`` and ``refusal_rule_agreement`` says whether the phrase rule agreed; citation
    support is the judge's majority verdict per pair where it gave one, the lexical rule elsewhere.
    """
    answer = str(rec["answer"])
    judge = rec.get("judge")
    passages = passage_texts(rec, docs)
    by_rule = scoring.rule.refuses(answer, passages)
    verdict = judge_refusal(judge)
    refused = by_rule if verdict is None else verdict
    asked = scoring.rule.asks_back(answer, passages)
    out: dict[str, float | None] = {"refusal": float(refused), "asked_clarification": float(asked)}
    if verdict is not None:
        out["refusal_rule_agreement"] = float(by_rule == verdict)
    behavior = query.behavior
    if behavior == "refuse":
        out["correct_refusal"] = float(refused)
    elif behavior == "answer":
        out["over_refusal"] = float(refused)
    elif behavior == "clarify":
        out["correct_clarification"] = float(asked)
    language = answer_language_match(query.query, answer, scoring.han_share)
    if language is not None:
        out["answer_language_match"] = language
    if query.kind == "answerable" and query.reference_answers:
        refs = query.reference_answers
        out["exact_match"] = exact_match(answer, refs)
        out["token_f1"] = token_f1(answer, refs)
        tokens, ref_tokens = reference_tokens(answer), [reference_tokens(r) for r in refs]
        out["reference_in_answer"] = _in_answer(tokens, ref_tokens)
        out["reference_recall"] = _recall(tokens, ref_tokens)
    if not refused and rec.get("citations") is not None:
        texts = cited_texts(rec.get("citations") or [], rec.get("retrieved") or [], docs)
        n_pairs = sum(len(sent.markers) for sent in answer_sentences(answer))
        judged = judge_support(judge, n_pairs)
        scores = citation_scores(answer, texts, scoring.citation_support, judged)
        if scores.precision is not None:
            out["citation_precision"] = scores.precision
        if scores.coverage is not None:
            out["citation_coverage"] = scores.coverage
    out.update(judge_metrics(judge, query))
    return out
