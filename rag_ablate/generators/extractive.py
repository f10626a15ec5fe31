"""``generator=extractive``: an answer quoted from the top chunks, with no language model.

The sentences of the first ``generator.max_chunks`` contexts are scored by their *support*:
the share of the query's overlap terms they contain (characters for Chinese, content words
for English; :func:`rag_ablate.metrics.answers.overlap_terms`). When the best support is
above ``generator.min_support``, the best ``generator.max_sentences`` sentences with any
support are quoted, best first (ties: higher-ranked chunk, earlier sentence), each followed by
the marker ``[n]`` of its chunk; markers number the cited chunks in order of first citation,
and a sentence two overlapping chunks share counts once, for the higher-ranked chunk.
Otherwise the answer is the refusal sentence (``generator.refusal_zh`` for a Chinese query or
corpus, ``generator.refusal_en`` otherwise) and cites nothing.

Long sentences (legal and news text, whose sentences run to whole paragraphs between two 。) are
not quoted whole: a chosen sentence of more than ``generator.max_sentence_tokens`` tokens
(:func:`~rag_ablate.text.count.count_tokens`: a CJK character or a Latin word is one) is split into
clauses after ，： (and after , : followed by a space), and the quote is the run of adjacent clauses
of at most that many tokens that holds the most of the query's terms (ties: the earliest), without
its last clause mark; a single clause longer than that is cut to it. So an answer quotes at most
``max_sentences x max_sentence_tokens`` tokens besides its markers; ``max_sentence_tokens=0``
quotes whole sentences. Which sentences are chosen, and whether the answer refuses, is decided on
the whole sentences, before any cut.

Token usage is rag_ablate's own count (:func:`rag_ablate.text.count.count_tokens`), marked
``usage_count="local"``: prompt = the query and the chunks read, completion = the answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rag_ablate.generators import GENERATORS
from rag_ablate.generators.base import Context, Generation
from rag_ablate.metrics.answers import overlap_terms, sentences
from rag_ablate.records.trace import TokenUsage
from rag_ablate.text.count import count_tokens, is_cjk_text

if TYPE_CHECKING:
    from rag_ablate.config.schema import GeneratorConfig, RunConfig
    from rag_ablate.core.cache import Cache

USAGE_COUNT = "local"  # Generation.usage_count: token counts are rag_ablate's own, not a model tokenizer's

# a clause ends after a Chinese comma or colon, or after a Latin one followed by a space ("3,5" and
# "10:30" stay whole)
_CLAUSE_END = re.compile(r"[，：]+|[,:]+(?=\s)")


def clauses(sentence: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of the clauses of ``sentence``, each with its ending mark."""
    ends = [m.end() for m in _CLAUSE_END.finditer(sentence) if m.end() < len(sentence)]
    return list(zip([0, *ends], [*ends, len(sentence)], strict=True))


def cut_to_tokens(text: str, limit: int, cjk: bool) -> str:
    """The longest start of ``text`` with at most ``limit`` tokens (:func:`count_tokens`); Latin
    text ends at the last space that fits, when there is one."""
    if count_tokens(text) <= limit:
        return text
    lo, hi = 0, len(text)  # count_tokens(text[:lo]) <= limit < count_tokens(text[:hi])
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count_tokens(text[:mid]) <= limit else (lo, mid)
    head = text[:lo]
    space = head.rfind(" ")
    return head[:space] if not cjk and space > 0 else head


@dataclass(frozen=True)
class ExtractiveGenerator:
    """The extractive answer (module docstring); settings: ``GeneratorConfig``."""

    max_chunks: int = 3
    max_sentences: int = 2
    min_support: float = 0.4
    refusal_zh: str = "文档中没有找到这个问题的答案。"
    refusal_en: str = "The documents do not answer this question."
    max_sentence_tokens: int = 60

    @classmethod
    def from_config(cls, g: GeneratorConfig) -> ExtractiveGenerator:
        return cls(
            g.max_chunks, g.max_sentences, g.min_support, g.refusal_zh, g.refusal_en, g.max_sentence_tokens
        )

    def quote(self, sentence: str, wanted: set[str], cjk: bool) -> str:
        """What is quoted of a chosen ``sentence``: all of it when it fits ``max_sentence_tokens``
        (or that is 0), else its best run of adjacent clauses (module docstring)."""
        limit = self.max_sentence_tokens
        if limit <= 0 or count_tokens(sentence) <= limit:
            return sentence
        spans = clauses(sentence)
        sizes = [count_tokens(sentence[a:b]) for a, b in spans]  # a token never spans a clause mark
        best, best_share = "", -1
        for i, (start, end) in enumerate(spans):
            size = sizes[i]
            for j in range(i + 1, len(spans)):  # adjacent clauses while the run fits
                if size + sizes[j] > limit:
                    break
                size += sizes[j]
                end = spans[j][1]
            text = cut_to_tokens(sentence[start:end].strip(), limit, cjk).rstrip("，：,: ")
            share = len(overlap_terms(text, cjk) & wanted)
            if share > best_share:
                best, best_share = text, share
        return best

    def generate(self, query_text: str, contexts: list[Context], *, repeat: int = 0) -> Generation:
        read = contexts[: self.max_chunks]
        cjk = is_cjk_text(query_text) or any(is_cjk_text(c.text[:500]) for c in read[:1])
        wanted = overlap_terms(query_text, cjk)
        scored: list[tuple[float, int, int, str]] = []
        seen: set[str] = set()  # overlapping chunks share sentences: each is quoted once, from the higher
        for rank, ctx in enumerate(read):
            for pos, sentence in enumerate(sentences(ctx.text)):
                if sentence in seen:
                    continue
                seen.add(sentence)
                share = len(wanted & overlap_terms(sentence, cjk)) / len(wanted) if wanted else 0.0
                if share > 0:
                    scored.append((-share, rank, pos, sentence))
        scored.sort()
        cited: list[Context] = []
        if not scored or -scored[0][0] <= self.min_support:
            text = self.refusal_zh if cjk else self.refusal_en
        else:
            parts = []
            for _, rank, _, sentence in scored[: self.max_sentences]:
                ctx = read[rank]
                if ctx not in cited:
                    cited.append(ctx)
                marker = f"[{cited.index(ctx) + 1}]"
                quoted = self.quote(sentence, wanted, cjk)
                parts.append(f"{quoted}{marker}" if cjk else f"{quoted} {marker}")
            text = ("" if cjk else " ").join(parts)
        prompt = count_tokens(query_text) + sum(count_tokens(c.text) for c in read)
        completion = count_tokens(text)
        return Generation(
            answer=text,
            citations=[c.citation() for c in cited],
            usage=TokenUsage(prompt, completion, prompt + completion),
            usage_count=USAGE_COUNT,
            n_read=len(read),
        )


@GENERATORS.register("extractive")
def extractive(settings: RunConfig, cache: Cache | None = None) -> ExtractiveGenerator:
    return ExtractiveGenerator.from_config(settings.generator)
