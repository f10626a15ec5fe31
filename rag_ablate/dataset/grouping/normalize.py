"""Query normalisation for near-duplicate detection.

:func:`normalize` maps a query to the text that near-duplicate detection
compares: Unicode NFKC and casefold, then the parts that vary between
otherwise equal questions (e-mail addresses, URLs, UUIDs, dates and times,
ids, numbers, Chinese numerals before a measure word) are masked by one
placeholder character each (:data:`MASKS`), punctuation goes and spacing is
made uniform. :func:`normalize_many` does the same for many texts at once
(one regex pass per step over all of them); :func:`char_ngrams` is the set of
character n-grams the similarity join compares (see
:mod:`rag_ablate.dataset.grouping.join`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from rag_ablate.core.errors import ConfigError

__all__ = ["MASKS", "char_ngrams", "normalize", "normalize_many"]

#: One placeholder character per masked kind. All are Unicode symbols that
#: NFKC and casefold leave alone, that no mask pattern matches and that the
#: punctuation stripping keeps, so normalising twice changes nothing.
MASKS: dict[str, str] = {
    "email": "\u2709",  # ✉
    "url": "\u2318",  # ⌘
    "uuid": "\u25c8",  # ◈
    "date": "\u25f7",  # ◷  dates, times, relative days (昨天, yesterday...)
    "number": "\u2317",  # ⌗  numbers, amounts, long digit runs, alphanumeric ids
}
_EMAIL, _URL, _UUID, _DATE, _NUM = (MASKS[k] for k in ("email", "url", "uuid", "date", "number"))
_PLACEHOLDERS = "".join(MASKS.values())

# Separates texts while normalising many at once; never part of any pattern.
_SEP = "\x00"

_CJK = (
    "\u3005-\u3007\u3040-\u3098\u309b-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\U00020000-\U0003134f"
)

_RE_EMAIL = re.compile(r"[a-z0-9._%+\-]+@[a-z0-9\-]+(?:\.[a-z0-9\-]+)+")
_URL_CH = r"[a-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]"
_RE_URL = re.compile(
    r"(?=[a-z0-9])(?<![a-z0-9.@\-])"  # cheap checks first: most positions fail here
    rf"(?:(?:https?|ftp)://|www\.){_URL_CH}+"
    r"|(?=[a-z0-9])(?<![a-z0-9.@\-])(?:[a-z0-9\-]+\.)+"
    r"(?:com|cn|net|org|io|edu|gov|info|app|dev|co|uk|de|jp|hk|tw)(?![a-z0-9\-])"
    rf"(?:/{_URL_CH}*)?"
)
_RE_UUID = re.compile(
    r"[0-9a-f](?<![0-9a-z][0-9a-f])[0-9a-f]{7}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![0-9a-z])"
)
# "may" is also a verb: with a day it counts as a month only when a year follows
_MON_SAFE = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
)
_MON = rf"(?:may|{_MON_SAFE})"
_ORD = r"(?:st|nd|rd|th)?"
_YEAR = r"\s*,?\s*\d{4}(?!\d)(?![-/.]\d)"
_TIME = r"\d{1,2}:\d{2}(?::\d{2})?(?:\s*[ap]\.?m\b\.?)?"
# Two regexes, each behind a cheap lookahead, so most positions fail at once.
# Digit-led forms run first ("3 Nov 2026" before "Nov 2026" could match).
_RE_DATE_NUM = re.compile(
    r"(?=\d)(?:"
    + "|".join(
        [
            # 2026-11-03, 2026/11/03, 2026.11.03, 2026年11月3日, optional time
            rf"(?<!\d)\d{{4}}\s*[-/.年]\s*\d{{1,2}}\s*[-/.月]\s*\d{{1,2}}(?!\d)(?:\s*[日号])?(?:(?:t|\s+){_TIME})?",
            # 03/11/2026, 3.11.26
            r"(?<!\d)\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}(?!\d)",
            # 2026年11月, 11月3日, 11月3号, 11月
            r"(?<!\d)(?:\d{2,4}\s*年\s*)?\d{1,2}\s*月(?:\s*\d{1,2}\s*[日号])?",
            # 2026年
            r"(?<!\d)\d{4}\s*年",
            # 3 Nov 2026, 3rd of November
            rf"(?<![a-z0-9])\d{{1,2}}{_ORD}\s*(?:of\s+)?{_MON}(?![a-z]){_YEAR}",
            rf"(?<![a-z0-9])\d{{1,2}}{_ORD}\s*(?:of\s+)?{_MON_SAFE}(?![a-z])",
            # 14:30, 2:30 pm, 3pm
            rf"(?<!\d){_TIME}(?!\d)",
            r"(?<![\d.])\d{1,2}\s*[ap]\.?m\b\.?",
        ]
    )
    + ")"
)
_RE_DATE_MON = re.compile(
    r"(?=[adfjmnos])(?<![a-z])(?:"
    + "|".join(
        [
            # Nov 3 2026, November 3rd, 2026, nov. 3, May 3 2026
            rf"{_MON}\s*\d{{1,2}}{_ORD}(?![\d:]){_YEAR}",
            rf"{_MON_SAFE}\s*\d{{1,2}}{_ORD}(?![\d:a-z])",
            # November 2026
            rf"{_MON}\s+\d{{4}}(?!\d)",
        ]
    )
    + ")"
)
_RE_DECIMAL = re.compile(r"(?=\d)(?<![0-9a-z])\d+(?:[.,]\d+)+")
# ASCII tokens with digits (order numbers, tracking ids, model numbers...).
_RE_TOKEN = re.compile(r"(?<![a-z0-9])[a-z0-9]*[0-9][a-z0-9]*(?:[-_][a-z0-9]*[0-9][a-z0-9]*)*")
_RE_ORDINAL = re.compile(r"\d+(?:st|nd|rd|th)")
_RE_DIGITS = re.compile(r"\d+")

# Word masks applied after punctuation is gone (they contain no digits).
_ZH_NUM = "零〇一二两三四五六七八九十百千万亿"
_ZH_DAY = "[一二三四五六日天末]"
_RE_WORD_DATE = re.compile(
    "(?=[今昨前明后大上这本下周星礼去一二三四五六七八九十tylmnwfs])(?:"
    + "|".join(
        [
            r"大前天|大后天|今天|昨天|前天|明天|后天|今日|昨日|明日|今早|今晚|昨晚|昨夜|明早|明晚",
            rf"(?:上|这|本|下)(?:个)?(?:周|星期|礼拜){_ZH_DAY}?|周{_ZH_DAY}|(?:星期|礼拜){_ZH_DAY}",
            r"(?:上|这|本|下)个?月|今年|去年|明年|前年",
            r"[一二三四五六七八九十]{1,3}月(?:[一二三四五六七八九十]{1,3}[日号])?",
            r"(?<![a-z])(?:today|tonight|yesterday|tomorrow"
            r"|(?:last|this|next)\s+(?:week|weekend|month|year)"
            r"|(?:last|this|next)\s+(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
            r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday)(?![a-z])",
        ]
    )
    + ")"
)
_RE_ZH_NUMBER = re.compile(
    rf"[{_ZH_NUM}]+(?=个|件|元|块|次|天|周|年|月|号|日|位|台|张|瓶|箱|斤|岁|本|条|份|双|盒|袋"
    r"|小时|分钟|公斤|公里|千克)"
)
_RE_SPACES = re.compile(r"\s\s+|[^\S ]")  # runs of whitespace, or one that is not " "
_RE_MASK_RUN = re.compile(rf"([{_PLACEHOLDERS}])(?:\s*\1)+")


def _stripper(text: str) -> re.Pattern[str]:
    """Everything in ``text`` but letters, numbers, marks, whitespace, placeholders and the separator.

    That is punctuation (P*), symbols (S*), control/format/private/unassigned
    (C*) characters and the underscore. ``\\w`` holds no combining mark (M*), so
    the marks kept are listed: those that occur in ``text``, the only ones the
    pattern meets there (finding every mark Unicode has takes longer than
    normalising a thousand queries).
    """
    marks = "".join(re.escape(ch) for ch in sorted(set(text)) if _is_mark(ch))
    return re.compile(rf"[^\w\s{marks}{_PLACEHOLDERS}{_SEP}]+|_+")


_RE_CJK_CHAR = re.compile(f"[{_CJK}]")
# a single space (whitespace is collapsed by then) next to a CJK character or a placeholder
_RE_SPACE_NEAR_CJK = re.compile(rf" (?:(?=[{_CJK}{_PLACEHOLDERS}])|(?<=[{_CJK}{_PLACEHOLDERS}] ))")


def _is_mark(ch: str) -> bool:
    return bool(ch) and unicodedata.category(ch)[0] == "M"


def _drop_space(m: re.Match[str]) -> str:
    """Remove a space between CJK characters or placeholders (Chinese spacing varies).

    Kept next to a combining mark: joining it to a kana could let NFKC compose
    a new character, and normalising twice would differ.
    """
    s, i = m.string, m.start()
    left = s[i - 1] if i > 0 else ""
    right = s[i + 1] if i + 1 < len(s) else ""
    if left and right and left in _PLACEHOLDERS and right in _PLACEHOLDERS:
        return ""
    if _RE_CJK_CHAR.match(left) and not _is_mark(right):
        return ""
    if _RE_CJK_CHAR.match(right) and not _is_mark(left):
        return ""
    return " "


def _mask_token(m: re.Match[str]) -> str:
    s = m.group()
    if sum(c.isdigit() for c in s) >= 4 or _RE_ORDINAL.fullmatch(s):
        return _NUM
    return _RE_DIGITS.sub(_NUM, s)


def normalize_many(texts: Sequence[str]) -> list[str]:
    """:func:`normalize` of many texts with one regex pass per step over all of them."""
    if not texts:
        return []
    s = _SEP.join(t.replace(_SEP, " ") if _SEP in t else t for t in texts)
    # 1. compatibility forms (full-width digits and letters...) and case
    s = unicodedata.normalize("NFKC", s)
    s = unicodedata.normalize("NFKC", s.casefold())
    # 2. masks that need punctuation and digits, most specific first
    s = _RE_EMAIL.sub(_EMAIL, s)
    s = _RE_URL.sub(_URL, s)
    s = _RE_UUID.sub(_UUID, s)
    s = _RE_DATE_NUM.sub(_DATE, s)
    s = _RE_DATE_MON.sub(_DATE, s)
    s = _RE_DECIMAL.sub(_NUM, s)
    s = _RE_TOKEN.sub(_mask_token, s)
    s = _RE_DIGITS.sub(_NUM, s)
    # 3. punctuation and symbols -> space; one space; none next to CJK
    s = _stripper(s).sub(" ", s)
    s = _RE_SPACES.sub(" ", s)  # \s never matches the separator
    s = _RE_SPACE_NEAR_CJK.sub(_drop_space, s)
    # 4. word masks (relative dates, Chinese numerals before a measure word)
    s = _RE_WORD_DATE.sub(_DATE, s)
    s = _RE_ZH_NUMBER.sub(_NUM, s)
    # 5. spaces next to the new placeholders; runs of one placeholder -> one
    s = _RE_SPACE_NEAR_CJK.sub(_drop_space, s)
    s = _RE_MASK_RUN.sub(r"\1", s)
    return [part.strip() for part in s.split(_SEP)]


def normalize(text: str) -> str:
    """Normalise a query for near-duplicate detection.

    Unicode NFKC and casefold; then masks, each replaced by one placeholder
    character (see :data:`MASKS`): e-mail addresses, URLs (with a scheme,
    ``www.`` or a common top-level domain), UUIDs, dates and times
    (``2026-11-03``, ``2026/11/03``, ``03.11.2026``, ``2026年11月3日``,
    ``11月3日``, ``Nov 3 2026``, ``3rd of November``, ``14:30``, ``3pm``,
    relative days such as ``昨天``, ``下周一``, ``yesterday``, ``next week``),
    ASCII tokens with 4 or more digits as a whole (``SF1234567890``,
    ``A2026-0001``, long digit runs), every other number (``1,299.00``,
    ``3.5``, ``21st``; digits inside shorter tokens: ``iphone15`` ->
    ``iphone⌗``) and Chinese numerals before a measure word (``三天``,
    ``两个``). Runs of the same placeholder collapse into one. Punctuation and
    symbols (ASCII and CJK) become spaces, whitespace collapses to one space,
    and spaces next to a CJK character or between two placeholders are removed
    (Chinese spacing varies).

    Idempotent: ``normalize(normalize(x)) == normalize(x)``.

    >>> normalize("订单2026110312345678 昨天签收的耳机，现在还能退吗？")
    '订单⌗◷签收的耳机现在还能退吗'
    >>> normalize("Where is my order #A12345?")
    'where is my order ⌗'
    """
    return normalize_many([text])[0]


def char_ngrams(text: str, n: int = 4) -> set[str]:
    """The set of character n-grams of ``normalize(text)``.

    A normalised text shorter than ``n`` characters (also the empty one) gives
    ``{normalised text}``. Normalising is idempotent, so passing an already
    normalised text is fine.
    """
    if n < 1:
        raise ConfigError(f"n-gram size must be >= 1, got {n}")
    t = normalize(text)
    if len(t) < n:
        return {t}
    return {t[i : i + n] for i in range(len(t) - n + 1)}
