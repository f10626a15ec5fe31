"""Text analyzers for lexical retrieval: jieba for Chinese, words for English."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from rag_ablate.cache import file_fingerprint, library_versions, words_fingerprint
from rag_ablate.errors import ConfigError, UnknownNameError

Analyzer = Callable[[str], list[str]]

_WORD = re.compile(r"[0-9a-z]+(?:['’][a-z]+)?")
_KEEP = re.compile(r"[0-9a-z\u3400-\u9fff]", re.IGNORECASE)

EN_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "so",
        "than",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)
ZH_STOPWORDS = frozenset(
    [
        "的",
        "了",
        "吗",
        "呢",
        "吧",
        "啊",
        "呀",
        "哦",
        "嗯",
        "是",
        "在",
        "和",
        "与",
        "及",
        "就",
        "都",
        "也",
        "还",
        "又",
        "个",
        "请问",
        "一下",
    ]
)


def analyze_en(text: str) -> list[str]:
    """Lowercased word tokens without English stopwords."""
    return [t for t in _WORD.findall(text.lower()) if t not in EN_STOPWORDS]


@cache
def _jieba() -> object:
    import jieba

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def analyze_zh(text: str) -> list[str]:
    """jieba search-mode segmentation (also splits long words into their parts), no stopwords."""
    jieba = _jieba()
    tokens = jieba.lcut_for_search(text.lower())  # type: ignore[attr-defined]
    return [t for t in tokens if _KEEP.search(t) and t not in ZH_STOPWORDS and not t.isspace()]


ANALYZERS: dict[str, Analyzer] = {"zh": analyze_zh, "en": analyze_en}


def get_analyzer(name: str) -> Analyzer:
    try:
        return ANALYZERS[name]
    except KeyError:
        raise UnknownNameError("analyzer", name, [*ANALYZERS, "auto"]) from None


def jieba_dictionary() -> Path:
    """The dictionary file jieba segments with: one set by ``jieba.set_dictionary``, else its bundled one.

    Found without importing jieba when nothing has imported it yet.
    """
    loaded = sys.modules.get("jieba")
    custom = getattr(getattr(loaded, "dt", None), "dictionary", None)
    if custom:
        return Path(custom)
    spec = importlib.util.find_spec("jieba")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("analyzer 'zh' needs jieba: pip install jieba")
    return Path(next(iter(spec.submodule_search_locations))) / "dict.txt"


def analyzer_key_parts(name: str) -> dict[str, Any]:
    """What an analyzer's tokens depend on besides this module's source: its stop words
    (a hash of the list), and for ``zh`` the jieba dictionary (a hash of its content) and
    jieba's version. Part of the BM25 cache key.
    """
    get_analyzer(name)  # an unknown name raises, listing the valid ones
    if name == "en":
        return {"name": name, "stopwords": words_fingerprint(EN_STOPWORDS)}
    if name == "zh":
        return {
            "name": name,
            "stopwords": words_fingerprint(ZH_STOPWORDS),
            "dictionary": file_fingerprint(jieba_dictionary()),
            "libraries": library_versions("jieba"),
        }
    return {"name": name}
