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

Token usage is rag_ablate's own count (:func:`rag_ablate.text.count.count_tokens`), marked
``usage_count="local"``: prompt = the query and the chunks read, completion = the answer.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class ExtractiveGenerator:
    """The extractive answer (module docstring); settings: ``GeneratorConfig``."""

    max_chunks: int = 3
    max_sentences: int = 2
    min_support: float = 0.4
    refusal_zh: str = "文档中没有找到这个问题的答案。"
    refusal_en: str = "The documents do not answer this question."

    @classmethod
    def from_config(cls, g: GeneratorConfig) -> ExtractiveGenerator:
        return cls(g.max_chunks, g.max_sentences, g.min_support, g.refusal_zh, g.refusal_en)

    def generate(self, query_text: str, contexts: list[Context]) -> Generation:
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
                parts.append(f"{sentence}{marker}" if cjk else f"{sentence} {marker}")
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
