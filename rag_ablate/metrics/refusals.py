"""Does an answer decline, or ask back? The curated phrase sets (docs/metrics.md "Refusals and
clarifications").

Two kinds of evidence, each in Chinese and English, are looked for in the answer after NFKC and
lower case (``[n]`` markers removed):

* **phrases**, matched anywhere: :data:`REFUSAL_PHRASES` (declining, "not found", insufficient
  information) and :data:`CLARIFICATION_PHRASES` (asking the user back), plus the phrases the
  configuration adds (``metrics.refusal_phrases``, ``metrics.clarification_phrases``);
* **"not in the documents"**: a word for the material (:data:`SOURCES_ZH`, :data:`SOURCES_EN`)
  followed closely by a negated statement about it (:data:`NOT_IN_ZH`: at most 4 characters
  between, no punctuation; :data:`NOT_IN_EN`: the source is the verb's subject, at most two of
  :data:`FILLERS_EN` between): ``段落中未提及``, ``The passages provided do not contain``; or, in
  English, the negation first: ``not mentioned in the documents``. A word like ``不包含`` alone is no refusal
  (``价格不包含运费`` answers); tied to the material it is.

A match that lies inside text copied from the passages (the context the generator read, else the
retrieved chunks: :func:`rag_ablate.metrics.answers.passage_texts`) is not evidence: when the
match, extended by :data:`COPY_MARGIN` more characters of the answer around it, occurs in a
passage, the answer is quoting (a judgment that mentions ``无法找到``), not declining.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

__all__ = [
    "CLARIFICATION_PHRASES",
    "COPY_MARGIN",
    "FILLERS_EN",
    "NOT_IN_EN",
    "NOT_IN_ZH",
    "REFUSAL_PHRASES",
    "SOURCES_EN",
    "SOURCES_ZH",
    "PhraseRule",
    "fold",
]

REFUSAL_PHRASES: tuple[str, ...] = (
    # Chinese: declining
    "无法回答", "无法作答", "不能回答", "无法确定", "无法判断", "无法得知", "无从得知", "不知道",
    # Chinese: not found
    "没有找到", "未找到", "无法找到", "没有相关信息", "没有相关内容", "暂无相关", "未提供相关",
    # Chinese: insufficient information
    "信息不足", "资料不足", "不足以回答", "不足以判断", "不足以确定", "没有足够的信息", "缺乏相关信息",
    # English: declining
    "cannot answer", "can't answer", "can not answer", "unable to answer", "not able to answer",
    "do not answer", "does not answer", "don't know", "do not know", "cannot determine",
    "can't determine", "unable to determine", "cannot be determined",
    # English: not found
    "could not find", "couldn't find", "cannot find", "can't find", "unable to find",
    "no relevant information", "no information",
    # English: insufficient information
    "not enough information", "insufficient information", "not enough context",
    "not sufficient to answer",
)  # fmt: skip
"""Phrases that make an answer a refusal wherever they occur (outside copied text)."""

CLARIFICATION_PHRASES: tuple[str, ...] = (
    "您指的是", "你指的是", "您是指", "你是指", "您说的是哪", "你说的是哪", "请问您是", "请问你是",
    "请问是哪", "请问您想", "您想了解哪", "你想了解哪", "您想问的是", "请具体说明", "请说明您", "请补充",
    "请提供更多", "能否提供更多", "可以提供更多", "能否具体", "需要更多信息", "需要更多细节",
    "是哪一个", "是哪一款",
    "could you clarify", "can you clarify", "please clarify", "could you specify", "can you specify",
    "please specify", "could you provide more", "can you provide more", "please provide more",
    "do you mean", "did you mean", "could you tell me which", "can you tell me which",
    "could you tell me more", "can you tell me more", "are you asking about", "which one do you mean",
)  # fmt: skip
"""Phrases that make an answer a clarification request (it asks the user back)."""

SOURCES_ZH: tuple[str, ...] = (
    "段落", "资料", "文档", "上下文", "文中", "原文", "参考信息", "参考内容", "检索结果", "知识库",
    "提供的信息", "给出的信息", "所给信息", "已知信息",
)  # fmt: skip
"""Words for the material a RAG answer reads (not 文件 or 材料: ``申请材料不包含…`` answers)."""
NOT_IN_ZH: tuple[str, ...] = (
    "未提", "没有提", "没提", "未包含", "没有包含", "不包含", "未涉及", "没有涉及", "未说明", "没有说明",
    "未给出", "没有给出", "没有相关", "无相关", "未记载", "没有记载", "找不到", "没有关于", "未明确",
    "没有明确",
)  # fmt: skip
SOURCES_EN: tuple[str, ...] = (
    "passage", "passages", "document", "documents", "context", "contexts", "source", "sources",
    "material", "materials", "excerpt", "excerpts", "knowledge base", "provided information",
    "information provided", "given information",
)  # fmt: skip
FILLERS_EN: tuple[str, ...] = (
    "provided", "given", "retrieved", "above", "available", "here", "shown", "you gave me",
    "you provided", "you shared",
)  # fmt: skip
"""Words that may stand between an English source word and its negated verb."""
NOT_IN_EN: tuple[str, ...] = (
    "contain", "mention", "include", "say", "specify", "state", "provide", "cover", "address",
    "discuss", "give",
)  # fmt: skip

COPY_MARGIN = 4
"""Characters of the answer beyond a match that must also occur in a passage for it to be a quote."""


def fold(text: str) -> str:
    """NFKC, lower case, ``’`` as ``'``, without ``[n]`` citation markers: the form phrases are
    matched in."""
    return re.sub(r"\[\d+\]", "", unicodedata.normalize("NFKC", text)).lower().replace("\u2019", "'")


def _alt(words: Iterable[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_ZH_NOT_IN = re.compile(f"(?:{_alt(SOURCES_ZH)})[^。！？!?,，\n]{{0,4}}?(?:{_alt(NOT_IN_ZH)})")
_EN_NOT_IN = re.compile(
    rf"\b(?:{_alt(SOURCES_EN)})(?: \d+)?(?: (?:{_alt(FILLERS_EN)})){{0,2}} (?:do|does|did)(?: not|n't) "
    rf"(?:{_alt(NOT_IN_EN)})"
    rf"|\bnot (?:mentioned|specified|provided|covered|stated|found|given|included|addressed) "
    rf"(?:in|by) (?:the |any )?(?:provided |given |retrieved |available )?(?:{_alt(SOURCES_EN)})\b"
    r"|\b(?:no mention of|makes? no mention)\b"
)


def _phrase_pattern(phrases: Iterable[str]) -> re.Pattern[str] | None:
    folded = {fold(p).strip() for p in phrases}
    folded.discard("")
    return re.compile(_alt(folded)) if folded else None


def _copied(text: str, start: int, end: int, passages: Sequence[str]) -> bool:
    """The match ``text[start:end]`` with :data:`COPY_MARGIN` more characters of ``text`` around it
    (split any way between before and after) occurs in one of ``passages`` (folded)."""
    for before in range(COPY_MARGIN + 1):
        after = COPY_MARGIN - before
        if start - before < 0 or end + after > len(text):
            continue
        piece = text[start - before : end + after]
        if any(piece in p for p in passages):
            return True
    return False


class PhraseRule:
    """The phrase rule: :meth:`refuses` and :meth:`asks_back` for one answer and its passages.

    ``extra_refusals`` and ``extra_clarifications`` are added to the curated sets."""

    def __init__(self, extra_refusals: Sequence[str] = (), extra_clarifications: Sequence[str] = ()) -> None:
        refusal = _phrase_pattern((*REFUSAL_PHRASES, *extra_refusals))
        clarify = _phrase_pattern((*CLARIFICATION_PHRASES, *extra_clarifications))
        self._refusal = [p for p in (refusal, _ZH_NOT_IN, _EN_NOT_IN) if p is not None]
        self._clarify = [p for p in (clarify,) if p is not None]

    @staticmethod
    def _found(patterns: Sequence[re.Pattern[str]], answer: str, passages: Sequence[str]) -> bool:
        text = fold(answer)
        folded: list[str] | None = None
        for pattern in patterns:
            for m in pattern.finditer(text):
                if folded is None:  # only an answer with a match pays for reading its passages
                    folded = [unicodedata.normalize("NFKC", p).lower() for p in passages]
                if not _copied(text, m.start(), m.end(), folded):
                    return True
        return False

    def refuses(self, answer: str, passages: Sequence[str] = ()) -> bool:
        """The answer declines: a refusal phrase or a "not in the documents" statement outside
        text copied from ``passages``."""
        return self._found(self._refusal, answer, passages)

    def asks_back(self, answer: str, passages: Sequence[str] = ()) -> bool:
        """The answer asks for clarification: a clarification phrase outside copied text."""
        return self._found(self._clarify, answer, passages)
