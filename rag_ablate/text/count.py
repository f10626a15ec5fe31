"""A simple, language-aware token count for context-cost metrics.

This is a cost proxy that treats Chinese, Japanese, Korean and space-separated
languages alike; it is not any model's tokenizer. After NFC normalisation the
text is read left to right and every match of one of these counts one token:

1. one **CJK character**: CJK ideographs (all extensions, compatibility
   ideographs, radicals, strokes), Hiragana, Katakana (incl. half-width),
   Bopomofo, Hangul (syllables and jamo), and the CJK punctuation and symbol
   blocks including full-width forms (``，。！？：；（）「」、`` and full-width
   letters such as ``Ａ``). Decision: CJK punctuation counts, one token per
   character, exactly like an ideograph.
2. one **run of letters/digits** of any other script (``hello``, ``GPT4``,
   ``café``, ``3.5`` is ``3``, ``.``, ``5``); the underscore is not a letter;
3. one **other non-space character**: ASCII punctuation and symbols, emoji,
   ``_`` ... one token each, for consistency with rule 1.

Whitespace (including the ideographic space U+3000) never counts. Examples:
``"你好，世界。"`` -> 6, ``"Hello, world."`` -> 4, ``"用GPT-4回答"`` -> 6
(用, GPT, -, 4, 回, 答). Known limit: combining marks that NFC cannot compose
(e.g. Devanagari vowel signs) split a word and count as symbols.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from rag_ablate.core.errors import ConfigError

__all__ = ["CJK_RANGES", "context_tokens", "count_tokens", "is_cjk_text"]

CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK Radicals Supplement, Kangxi Radicals
    (0x2FF0, 0x2FFF),  # Ideographic Description Characters
    (0x3001, 0x303F),  # CJK Symbols and Punctuation (U+3000 is a space)
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x31FF),  # Bopomofo, Hangul Compatibility Jamo, Kanbun, CJK Strokes, ...
    (0x3200, 0x33FF),  # Enclosed CJK Letters and Months, CJK Compatibility
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xA960, 0xA97F),  # Hangul Jamo Extended-A
    (0xAC00, 0xD7FF),  # Hangul Syllables, Hangul Jamo Extended-B
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0xFE30, 0xFE4F),  # CJK Compatibility Forms
    (0xFF01, 0xFFEF),  # Halfwidth and Fullwidth Forms
    (0x1B000, 0x1B16F),  # Kana Supplement, Kana Extended-A, Small Kana Extension
    (0x20000, 0x2FA1F),  # CJK Extensions B-F, Compatibility Ideographs Supplement
    (0x30000, 0x323AF),  # CJK Extensions G-H
)
"""Code point ranges (inclusive) whose characters are "CJK characters" here."""

_CJK_CLASS = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in CJK_RANGES)
_CJK_RE = re.compile(f"[{_CJK_CLASS}]")
_TOKEN_RE = re.compile(f"[{_CJK_CLASS}]|[^\\W_{_CJK_CLASS}]+|\\S")
_NON_SPACE_RE = re.compile(r"\S")


def count_tokens(text: str) -> int:
    """Tokens in ``text`` under the rules in the module docstring."""
    if not isinstance(text, str):
        raise TypeError(f"count_tokens takes a str, got {type(text).__name__}")
    return len(_TOKEN_RE.findall(unicodedata.normalize("NFC", text)))


def context_tokens(chunk_texts: Sequence[str], k: int) -> int:
    """Tokens of the first k chunk texts (all of them when there are fewer)."""
    if isinstance(chunk_texts, str):
        raise TypeError("chunk_texts must be a sequence of strings, not a string")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"cutoff k must be a positive integer, got {k!r}")
    return sum(count_tokens(text) for text in chunk_texts[:k])


def is_cjk_text(text: str, threshold: float = 0.3) -> bool:
    """True when CJK characters make up at least ``threshold`` of the non-space characters.

    CJK characters are those in ``CJK_RANGES`` (so CJK punctuation counts as
    CJK). Text with no non-space character is not CJK.
    """
    if not isinstance(text, str):
        raise TypeError(f"is_cjk_text takes a str, got {type(text).__name__}")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be within [0, 1], got {threshold!r}")
    normalised = unicodedata.normalize("NFC", text)
    non_space = len(_NON_SPACE_RE.findall(normalised))
    if non_space == 0:
        return False
    return len(_CJK_RE.findall(normalised)) / non_space >= threshold
