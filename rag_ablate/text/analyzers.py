"""Text analyzers for lexical retrieval: jieba for Chinese, words for English."""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_ablate.core.cache import file_fingerprint, library_versions, words_fingerprint
from rag_ablate.core.errors import ConfigError, UnknownNameError

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


# --------------------------------------------------------------------------- Chinese segmentation
#
# analyze_zh's tokens are jieba's search mode (``lcut_for_search``) with jieba's bundled or
# configured dictionary. rjieba 0.2.2 (jieba-rs) was evaluated for issue 16: about 20x faster,
# but not the same segmentation. Besides runs where letters or digits meet ``+#&._%-`` (it keeps
# ``3.5mm`` whole) and CJK characters outside jieba's range, which a split at jieba's block
# boundaries can route around, its dynamic programme breaks some ties another way (2 of the
# 3,492 texts of 400 dictionary words each that tests/test_analyzers_zh.py segments, e.g. a run
# of single characters ending in 呱呱), which nothing outside it can detect; and it raises on a
# lone surrogate where jieba does not. So jieba stays the segmenter: the tokens are cached per
# chunking and analyzer (the ``tokens`` stage), so a corpus is segmented once, not per variant.
ZH_LIBRARIES = ("jieba",)  # their versions are part of the zh analyzer's identity


class ZhSegmenter:
    """jieba's ``lcut_for_search`` over one dictionary.

    A private ``jieba.Tokenizer`` (initialised on first use) so that words added to the global
    jieba at run time, which no cache key records, cannot change the tokens.
    """

    def __init__(self, dictionary: Path | None) -> None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        self.dictionary = dictionary  # None: jieba's bundled dictionary
        self._jieba = jieba.Tokenizer(str(dictionary)) if dictionary is not None else jieba.Tokenizer()

    def cut_for_search(self, text: str) -> list[str]:
        """Exactly ``jieba.lcut_for_search(text)`` with this segmenter's dictionary."""
        return list(self._jieba.cut_for_search(text))  # loads the dictionary on first use


def _custom_dictionary() -> Path | None:
    """The dictionary set with ``jieba.set_dictionary`` (None: jieba's bundled one)."""
    loaded = sys.modules.get("jieba")
    custom = getattr(getattr(loaded, "dt", None), "dictionary", None)
    return Path(custom) if custom else None


_SEGMENTERS: dict[Path | None, ZhSegmenter] = {}


def zh_segmenter() -> ZhSegmenter:
    """The segmenter of the dictionary jieba is configured with (one per dictionary, made once)."""
    dictionary = _custom_dictionary()
    seg = _SEGMENTERS.get(dictionary)
    if seg is None:
        seg = _SEGMENTERS[dictionary] = ZhSegmenter(dictionary)
    return seg


def analyze_zh(text: str) -> list[str]:
    """jieba search-mode segmentation (also splits long words into their parts), no stopwords."""
    tokens = zh_segmenter().cut_for_search(text.lower())
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
    custom = _custom_dictionary()
    if custom is not None:
        return custom
    spec = importlib.util.find_spec("jieba")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("analyzer 'zh' needs jieba: pip install jieba")
    return Path(next(iter(spec.submodule_search_locations))) / "dict.txt"


def analyzer_key_parts(name: str) -> dict[str, Any]:
    """What an analyzer's tokens depend on besides this module's source: its stop words
    (a hash of the list), and for ``zh`` the jieba dictionary (a hash of its content) and
    the version of jieba. Part of the ``tokens`` and ``bm25`` cache keys.
    """
    get_analyzer(name)  # an unknown name raises, listing the valid ones
    if name == "en":
        return {"name": name, "stopwords": words_fingerprint(EN_STOPWORDS)}
    if name == "zh":
        return {
            "name": name,
            "stopwords": words_fingerprint(ZH_STOPWORDS),
            "dictionary": file_fingerprint(jieba_dictionary()),
            "libraries": library_versions(*ZH_LIBRARIES),
        }
    return {"name": name}
