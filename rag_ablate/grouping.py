"""Near-duplicate query grouping and group-aware dev/holdout split assignment.

Why: near-duplicate queries (one template with another order number, date or
amount) are not independent samples, so the comparison step resamples *groups*
(see STATISTICS.md, "Near-duplicate grouping" and "Dev and holdout").

Pipeline of :func:`group_near_duplicates`
-----------------------------------------
1. :func:`normalize` every query (NFKC, casefold, masks, punctuation, spaces).
   Items whose normalised texts are identical are joined at once; only the
   distinct normalised texts go on.
2. Character n-gram sets (:func:`char_ngrams`; n = 4 by default: Chinese has
   no spaces, so words are no unit). A text shorter than n characters is one
   "gram": itself, so short questions group only with identical ones.
3. Candidate pairs:
   * ``exact`` (at most ``exact_limit`` distinct normalised texts): prefix
     filtering, an exact all-pairs similarity join. Grams are ordered by
     rarity; a pair with Jaccard >= t must share a gram among the first
     ``|A| - ceil(t|A|) + 1`` grams of each set, so no qualifying pair is
     missed. The result equals a brute-force pairwise comparison (tested).
   * ``minhash`` (more texts): ``num_perm`` MinHash values per text
     (multiply-add-shift hashing in numpy), LSH with ``bands x rows`` chosen
     so that a pair exactly at the threshold becomes a candidate with
     probability >= 0.995 (t = 0.7, 128 permutations: 32 bands of 4 rows,
     0.99985). Candidates then pass two cheap filters: the b-bit MinHash
     estimate of J (drops pairs more than 5 standard deviations below the
     threshold; a pair at the threshold is dropped with probability < 1e-6)
     and the prefix-filter condition above (exact, loses nothing).
4. Every remaining pair is verified with the exact Jaccard of the n-gram sets
   (``|A & B| >= threshold * |A | B|``, with a 1e-9 relative tolerance), so
   the MinHash path never joins a pair the exact path would not; it can only
   miss one. A miss needs *every* path between two texts to be missed, which
   for a pair at exactly J = t with no other link has probability about
   1.5e-4 (LSH) + 1e-6 (estimate filter). Tests: same partition as the exact
   path on 3,000-item synthetic sets; of 1,000 isolated pairs with J in
   [0.69, 0.76] at most 1% may be missing (none are, with the seeds tried).
   The benchmark's 100,000 queries give the same partition with both methods.
5. Union-find over the accepted pairs. Pairs are taken by their distance in
   a bucket (1, then 2-3, 4-7, ...): the first round chains a bucket of
   near-identical texts together, after which its remaining pairs are
   skipped (their ends are connected already), which saves work without
   changing the partition. A pair found in several buckets is checked once.

The partition depends only on the multiset of inputs, not on their order.

Explicit groups
---------------
An item with an explicit ``group`` keeps it verbatim. Items without one are
grouped among themselves only: they are never merged into an explicit group,
and explicit groups are never merged with each other. Reason: an explicit
group is an authoritative decision of the dataset author; letting a computed
link add members to it (or chain two explicit groups together through an
unlabelled near-duplicate) would override that decision silently. Caveat: a
dataset that labels only some groups must label all near-duplicates of them,
or those can land in the other split.

Computed group ids are ``"g:<id of the group's first item in input order>"``
(singletons too). Should such an id equal an explicit group value, ``~2``,
``~3`` ... is appended until it is free.

Split assignment
----------------
:func:`assign_splits` places whole groups, largest first, each into the split
that is further below its target (by filled fraction); equal sizes are ordered
by a seeded hash of the group id, ties of the fill fractions are broken by that
hash too. Interleaving large groups (instead of filling the holdout with the
largest ones first) keeps both splits alike in composition, and the many small
groups at the end bring the share to within a group of the target.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from rag_ablate.errors import ConfigError, DatasetError

__all__ = [
    "MASKS",
    "GroupingResult",
    "assign_splits",
    "char_ngrams",
    "check_splits",
    "group_near_duplicates",
    "normalize",
]

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
Bool = npt.NDArray[np.bool_]

# --------------------------------------------------------------------------
# Normalisation
# --------------------------------------------------------------------------

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


def _mark_ranges() -> str:
    """Regex class body of all combining marks (M*): planes 0, 1 and 14 hold them all."""
    ranges: list[tuple[int, int]] = []
    for cp in (*range(0x20000), *range(0xE0000, 0xE1000)):
        if unicodedata.category(chr(cp))[0] == "M":
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return "".join(
        re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges
    )


@lru_cache(maxsize=1)
def _stripper() -> re.Pattern[str]:
    """Everything but letters, numbers, marks, whitespace, placeholders and the separator.

    That is punctuation (P*), symbols (S*), control/format/private/unassigned
    (C*) characters and the underscore.
    """
    return re.compile(rf"[^\w\s{_mark_ranges()}{_PLACEHOLDERS}{_SEP}]+|_+")


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


def _normalize_many(texts: Sequence[str]) -> list[str]:
    """:func:`normalize` of many texts with one regex pass per step over all of them."""
    if not texts:
        return []
    stripper = _stripper()
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
    s = stripper.sub(" ", s)
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
    return _normalize_many([text])[0]


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


# --------------------------------------------------------------------------
# Result type
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupingResult:
    """Outcome of :func:`group_near_duplicates`.

    ``group_of[i]`` is the group id of input item i; ``sizes`` maps every
    group id to its size, in order of first appearance; ``method`` is
    ``"exact"`` or ``"minhash"``. ``timings`` holds seconds per stage
    (``normalise``, ``shingle``, ``minhash``, ``candidates_verify``,
    ``union_find``, ``total``) and pair counts (``pairs_prefiltered``,
    ``pairs_verified``, ``pairs_accepted``); it takes no part in equality.
    """

    group_of: list[str]
    n_groups: int
    sizes: dict[str, int]
    method: str
    timings: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def largest(self, k: int = 5) -> list[tuple[str, int]]:
        """The k largest groups as (group id, size); equal sizes by first appearance."""
        if k <= 0:
            return []
        return sorted(self.sizes.items(), key=lambda kv: -kv[1])[:k]


# --------------------------------------------------------------------------
# Shingling (vectorised; equal to char_ngrams on the normalised texts)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shingles:
    indptr: I64  # CSR row pointers: grams of text i are indices[indptr[i]:indptr[i+1]]
    indices: I64  # gram ids, sorted within each text
    n_grams: int  # number of distinct grams (V)

    @property
    def lengths(self) -> I64:
        return np.diff(self.indptr)


def _ranges(counts: I64) -> I64:
    """concatenate(arange(c) for c in counts), vectorised."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts, counts)


def _starts(sorted_values: npt.NDArray[Any]) -> Bool:
    """True where a sorted array holds a value different from the one before."""
    flags: Bool = np.ones(sorted_values.size, dtype=np.bool_)
    if sorted_values.size > 1:
        flags[1:] = sorted_values[1:] != sorted_values[:-1]
    return flags


def _unique(a: I64) -> I64:
    """Sorted distinct values (np.unique's hash path is far slower on big arrays)."""
    s = np.sort(a)
    result: I64 = s[_starts(s)]
    return result


def _shingle(texts: Sequence[str], n: int) -> _Shingles:
    """Distinct character n-grams per (normalised) text as integer ids.

    Code points are replaced by their rank in the alphabet of all texts (1..A,
    0 pads texts shorter than n); when ``n * bits(A) <= 64`` a gram packs
    into one uint64, otherwise rows are compared as raw bytes. Either way the
    encoding is injective: two texts share a gram id iff they share the gram.
    Gram ids follow the sorted order of the packed grams, so they do not
    depend on the order of the texts.
    """
    m = len(texts)
    lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=m)
    joined = "".join(texts)
    cps = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    present = np.zeros(0x110000, dtype=np.bool_)
    present[cps] = True
    rank = np.cumsum(present, dtype=np.uint64)  # code point -> 1..A
    codes = rank[cps]
    n_symbols = int(rank[-1])
    offsets = np.cumsum(lengths) - lengths
    per_text = np.maximum(lengths - n + 1, 1)
    doc = np.repeat(np.arange(m, dtype=np.int64), per_text)
    start = offsets[doc] + _ranges(per_text)
    limit = offsets[doc] + lengths[doc]
    cols = np.zeros((n, doc.size), dtype=np.uint64)
    for k in range(n):
        pos = start + k
        valid = pos < limit
        if codes.size:
            cols[k, valid] = codes[pos[valid]]
    bits = max(1, n_symbols.bit_length())
    if n * bits <= 64:
        key = np.zeros(doc.size, dtype=np.uint64)
        for k in range(n):
            key = (key << np.uint64(bits)) | cols[k]
        order = np.argsort(key)
        new = _starts(key[order])
    else:
        rows = np.ascontiguousarray(cols.T).view(np.dtype((np.void, 8 * n))).ravel()
        order = np.argsort(rows)
        new = _starts(rows[order])
    gram = np.empty(doc.size, dtype=np.int64)
    gram[order] = np.cumsum(new) - 1
    n_grams = int(new.sum())
    width = max(n_grams, 1)
    pair = _unique(doc * width + gram)
    doc_u = pair // width
    indices = pair - doc_u * width
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(doc_u, minlength=m), out=indptr[1:])
    return _Shingles(indptr=indptr, indices=indices, n_grams=n_grams)


# --------------------------------------------------------------------------
# Exact Jaccard verification of pairs
# --------------------------------------------------------------------------

_TOL = 1e-9


def _accept(inter: I64, len_u: I64, len_v: I64, threshold: float) -> Bool:
    union = len_u + len_v - inter
    result: Bool = inter >= threshold * union * (1.0 - _TOL)
    return result


def _gather(sh: _Shingles, rows: I64) -> I64:
    """Concatenated gram ids of the given rows."""
    lens = sh.lengths[rows]
    off = np.cumsum(lens) - lens
    idx = np.repeat(sh.indptr[rows] - off, lens) + np.arange(int(lens.sum()), dtype=np.int64)
    result: I64 = sh.indices[idx]
    return result


def _intersections(sh: _Shingles, u: I64, v: I64) -> I64:
    """|A_u & A_v| for each pair: the ids of both sets, keyed by pair, sorted; duplicates are shared."""
    out = np.zeros(u.size, dtype=np.int64)
    lengths = sh.lengths
    width = max(sh.n_grams, 1)
    ends = np.cumsum(lengths[u] + lengths[v])
    lo = 0
    while lo < u.size:
        # pairs lo..hi-1 hold about 4M ids
        base = int(ends[lo - 1]) if lo else 0
        hi = max(int(np.searchsorted(ends, base + 4_000_000, side="right")), lo + 1)
        uu, vv = u[lo:hi], v[lo:hi]
        pid = np.arange(hi - lo, dtype=np.int64) * width
        keys = np.concatenate(
            (np.repeat(pid, lengths[uu]) + _gather(sh, uu), np.repeat(pid, lengths[vv]) + _gather(sh, vv))
        )
        keys.sort()
        dup = keys[1:][keys[1:] == keys[:-1]]
        out[lo:hi] = np.bincount(dup // width, minlength=hi - lo)
        lo = hi
    return out


# --------------------------------------------------------------------------
# Union-find (vectorised; the root of a component is its smallest index)
# --------------------------------------------------------------------------


def _compress(parent: I64) -> None:
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return
        parent[:] = grand


def _union(parent: I64, u: I64, v: I64) -> None:
    """Join the components of u[i] and v[i]; ``parent`` stays fully compressed."""
    while u.size:
        ru, rv = parent[u], parent[v]
        differ = ru != rv
        if not differ.any():
            return
        u, v, ru, rv = u[differ], v[differ], ru[differ], rv[differ]
        np.minimum.at(parent, np.maximum(ru, rv), np.minimum(ru, rv))
        _compress(parent)


# --------------------------------------------------------------------------
# Candidate buckets -> verified components
# --------------------------------------------------------------------------


class _PairSet:
    """A growing set of int64 pair codes: sorted levels merged like a binary counter."""

    def __init__(self) -> None:
        self.levels: list[I64] = []

    def contains(self, codes: I64) -> Bool:
        found: Bool = np.zeros(codes.size, dtype=np.bool_)
        for level in self.levels:
            pos = np.minimum(np.searchsorted(level, codes), level.size - 1)
            found |= level[pos] == codes
        return found

    def add(self, codes: I64) -> None:
        """Add sorted codes that are not in the set yet."""
        if codes.size == 0:
            return
        self.levels.append(codes)
        while len(self.levels) > 1 and self.levels[-2].size <= 2 * self.levels[-1].size:
            top = self.levels.pop()
            self.levels[-1] = np.sort(np.concatenate((self.levels[-1], top)))


@dataclass
class _Stats:
    prefiltered: int = 0
    verified: int = 0
    accepted: int = 0
    union_seconds: float = 0.0


def _runs(keys: npt.NDArray[Any]) -> tuple[I64, I64, I64]:
    """Group positions by equal key: (members, bucket starts, bucket sizes) for buckets of >= 2."""
    order = np.argsort(keys)
    sk = keys[order]
    if sk.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    starts = np.flatnonzero(_starts(sk))
    sizes = np.diff(np.append(starts, sk.size))
    big = sizes >= 2
    starts, sizes = starts[big], sizes[big]
    members = order[np.repeat(starts, sizes) + _ranges(sizes)].astype(np.int64)
    new_starts = np.cumsum(sizes) - sizes
    return members, new_starts.astype(np.int64), sizes.astype(np.int64)


_CHUNK_PAIRS = 1_000_000


def _connect_buckets(
    buckets: list[tuple[I64, I64, I64]],
    sh: _Shingles,
    parent: I64,
    threshold: float,
    stats: _Stats,
    prefilter: Callable[[I64, I64], Bool] | None = None,
) -> None:
    """Union every pair inside a bucket whose exact Jaccard reaches the threshold.

    Pairs are taken by their distance d inside a bucket, in rounds d = 1,
    then 2-3, 4-7, 8-15 ... (d = 1 already chains a bucket of near-duplicates
    together). Between batches, buckets whose members are all connected
    leave, and pairs whose ends are connected already, or that were checked
    before in another bucket, are skipped. ``prefilter`` may drop pairs that
    cannot pass before the exact check. The components equal those of the
    graph of all in-bucket pairs that pass.
    """
    buckets = [bk for bk in buckets if bk[0].size]
    if not buckets:
        return
    members = np.concatenate([bk[0] for bk in buckets])
    sizes = np.concatenate([bk[2] for bk in buckets])
    n = parent.size
    lengths = sh.lengths
    checked = _PairSet()

    def process(a: I64, b: I64) -> None:
        a, b = np.minimum(a, b), np.maximum(a, b)
        la, lb = lengths[a], lengths[b]
        # not connected yet; length filter: J >= t needs |small| >= t * |large|
        keep = (parent[a] != parent[b]) & (la >= threshold * lb * (1.0 - _TOL))
        keep &= lb >= threshold * la * (1.0 - _TOL)
        code = _unique(a[keep] * n + b[keep])
        code = code[~checked.contains(code)]
        if code.size == 0:
            return
        checked.add(code)
        a, b = code // n, code % n
        if prefilter is not None:
            passed = prefilter(a, b)
            stats.prefiltered += int(code.size - passed.sum())
            a, b = a[passed], b[passed]
        if a.size == 0:
            return
        ok = _accept(_intersections(sh, a, b), lengths[a], lengths[b], threshold)
        stats.verified += int(a.size)
        stats.accepted += int(ok.sum())
        t0 = time.perf_counter()
        _union(parent, a[ok], b[ok])
        stats.union_seconds += time.perf_counter() - t0

    d = 1
    while sizes.size:
        # keep the buckets that still have pairs at distance >= d and are not connected yet
        starts = np.cumsum(sizes) - sizes
        roots = parent[members]
        spread = np.maximum.reduceat(roots, starts) != np.minimum.reduceat(roots, starts)
        keep_bucket = (sizes > d) & spread
        if not keep_bucket.all():
            members = members[np.repeat(keep_bucket, sizes)]
            sizes = sizes[keep_bucket]
            starts = np.cumsum(sizes) - sizes
            if sizes.size == 0:
                break
        batch_a: list[I64] = []
        batch_b: list[I64] = []
        pending = 0
        for dist in range(d, 2 * d):
            has = sizes > dist
            if not has.any():
                break
            cnt = sizes[has] - dist
            idx = np.repeat(starts[has], cnt) + _ranges(cnt)
            batch_a.append(members[idx])
            batch_b.append(members[idx + dist])
            pending += idx.size
            if pending >= _CHUNK_PAIRS:
                process(np.concatenate(batch_a), np.concatenate(batch_b))
                batch_a, batch_b, pending = [], [], 0
        if pending:
            process(np.concatenate(batch_a), np.concatenate(batch_b))
        d *= 2


def _prefixes(sh: _Shingles, threshold: float) -> _Shingles:
    """Each text's prefix for prefix filtering, as gram ranks (rarest gram first).

    With all grams ordered by document frequency (ties by id), two sets with
    Jaccard >= t share at least ``ceil(t * max(|A|, |B|))`` grams, so their
    first ``|A| - ceil(t|A|) + 1`` and ``|B| - ceil(t|B|) + 1`` grams
    overlap. Sharing a prefix gram is therefore necessary for a pair to pass.
    """
    m = sh.indptr.size - 1
    lengths = sh.lengths
    width = max(sh.n_grams, 1)
    df = np.bincount(sh.indices, minlength=sh.n_grams)
    order = np.lexsort((np.arange(sh.n_grams), df))
    rank = np.empty(sh.n_grams, dtype=np.int64)
    rank[order] = np.arange(sh.n_grams, dtype=np.int64)
    t = threshold * (1.0 - _TOL)
    need = np.ceil(t * lengths - 1e-6).astype(np.int64)
    prefix = np.clip(lengths - need + 1, 1, lengths)
    doc = np.repeat(np.arange(m, dtype=np.int64), lengths)
    sorted_key = np.sort(doc * width + rank[sh.indices])
    in_prefix = _ranges(lengths) < prefix[doc]
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(prefix, out=indptr[1:])
    return _Shingles(indptr=indptr, indices=(sorted_key - doc * width)[in_prefix], n_grams=sh.n_grams)


def _prefix_buckets(pre: _Shingles) -> list[tuple[I64, I64, I64]]:
    """Buckets of texts sharing a prefix gram (the exact method's candidates)."""
    doc = np.repeat(np.arange(pre.indptr.size - 1, dtype=np.int64), pre.lengths)
    members, starts, sizes = _runs(pre.indices)
    return [(doc[members], starts, sizes)]


def _lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows): the most rows per band that still catch a pair at the threshold w.p. >= 0.995."""
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if bands < 1:
            break
        p = 1.0 - (1.0 - threshold**rows) ** bands
        if p >= 0.995:
            best = (bands, rows)
    return best


def _splitmix64(x: U64) -> U64:
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    result: U64 = z ^ (z >> np.uint64(31))
    return result


def _minhash(sh: _Shingles, num_perm: int, seed: int) -> U32:
    """MinHash signatures, shape (num_perm, texts), uint32.

    Each gram id gets a pseudo-random 32-bit value x (splitmix64 of the id
    and the seed); permutation k is ``((a_k * x + b_k) mod 2**64) >> 32``
    with random odd a_k (Dietzfelbinger's multiply-add-shift family).
    """
    m = sh.indptr.size - 1
    rng = np.random.default_rng([seed, 0x6D696E68])
    a = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False) | np.uint64(1)
    b = rng.integers(0, 2**64, size=num_perm, dtype=np.uint64, endpoint=False)
    salt = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    xs = _splitmix64(np.arange(sh.n_grams, dtype=np.uint64) ^ salt) >> np.uint64(32)
    sig = np.empty((num_perm, m), dtype=np.uint32)
    budget = max(1, 2_000_000 // num_perm)  # gram rows per chunk
    cum = sh.indptr
    d0 = 0
    while d0 < m:
        d1 = int(np.searchsorted(cum, cum[d0] + budget, side="right")) - 1
        d1 = min(max(d1, d0 + 1), m)
        g = xs[sh.indices[cum[d0] : cum[d1]]]
        h = np.multiply.outer(a, g)
        h += b[:, None]
        h >>= np.uint64(32)
        sig[:, d0:d1] = np.minimum.reduceat(h.astype(np.uint32), cum[d0:d1] - cum[d0], axis=1)
        d0 = d1
    return sig


def _band_buckets(sig: U32, bands: int, rows: int) -> list[tuple[I64, I64, I64]]:
    out: list[tuple[I64, I64, I64]] = []
    for j in range(bands):
        key = np.full(sig.shape[1], np.uint64(j), dtype=np.uint64)
        for c in range(j * rows, (j + 1) * rows):
            key = _splitmix64(key ^ sig[c].astype(np.uint64))
        members, starts, sizes = _runs(key)
        if members.size:
            out.append((members, starts, sizes))
    return out


def _lsh_prefilter(sig: U32, pre: _Shingles, threshold: float) -> Callable[[I64, I64], Bool]:
    """Cheap checks of LSH candidate pairs before the exact Jaccard.

    1. MinHash estimate (on the low byte of each value, "b-bit MinHash", to
       move less memory): a pair at J = threshold has p = t + (1 - t)/256 of
       its values equal, with standard deviation sqrt(p(1-p)/num_perm);
       pairs more than 5 such deviations below are dropped. A pair at
       J = threshold survives with probability > 1 - 1e-6, and the bulk of
       LSH candidates (J around 0.3-0.5) goes here.
    2. Prefix filter (exact, see :func:`_prefixes`): the pair must share a
       prefix gram; this costs about a third of the full check.
    """
    # b-bit MinHash: the low byte of each value; equal with probability J + (1 - J) / 256
    rows = np.ascontiguousarray((sig.T & 0xFF).astype(np.uint8))
    num_perm = sig.shape[0]
    p_t = threshold + (1.0 - threshold) / 256.0
    bound = (p_t - 5.0 * math.sqrt(p_t * (1.0 - p_t) / num_perm)) * num_perm
    step = max(1, 8_000_000 // num_perm)

    def passes(a: I64, b: I64) -> Bool:
        out = np.empty(a.size, dtype=np.bool_)
        for lo in range(0, a.size, step):
            equal = np.count_nonzero(rows[a[lo : lo + step]] == rows[b[lo : lo + step]], axis=1)
            out[lo : lo + step] = equal >= bound - 1e-9
        out[out] = _intersections(pre, a[out], b[out]) > 0
        return out

    return passes


# --------------------------------------------------------------------------
# Public: grouping
# --------------------------------------------------------------------------


def _check_params(threshold: float, n: int, exact_limit: int, num_perm: int) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ConfigError(f"grouping threshold must be in (0, 1], got {threshold}")
    if n < 1:
        raise ConfigError(f"n-gram size must be >= 1, got {n}")
    if exact_limit < 0:
        raise ConfigError(f"exact_limit must be >= 0, got {exact_limit}")
    if num_perm < 1:
        raise ConfigError(f"num_perm must be >= 1, got {num_perm}")


def _components(
    norm: list[str],
    *,
    threshold: float,
    n: int,
    exact_limit: int,
    num_perm: int,
    seed: int,
    timings: dict[str, float],
) -> tuple[list[int], str]:
    """Component label (smallest distinct-text index) per text, and the method used."""
    first: dict[str, int] = {}
    text_of = [first.setdefault(t, len(first)) for t in norm]
    distinct = list(first)
    m = len(distinct)
    method = "exact" if m <= exact_limit else "minhash"
    t0 = time.perf_counter()
    sh = _shingle(distinct, n)
    timings["shingle"] = time.perf_counter() - t0
    parent = np.arange(m, dtype=np.int64)
    stats = _Stats()
    t0 = time.perf_counter()
    prefilter: Callable[[I64, I64], Bool] | None = None
    if method == "exact":
        buckets = _prefix_buckets(_prefixes(sh, threshold))
        timings["minhash"] = 0.0
    else:
        bands, rows = _lsh_params(threshold, num_perm)
        sig = _minhash(sh, num_perm, seed)
        t1 = time.perf_counter()
        timings["minhash"] = t1 - t0
        t0 = t1
        buckets = _band_buckets(sig, bands, rows)
        prefilter = _lsh_prefilter(sig, _prefixes(sh, threshold), threshold)
    _connect_buckets(buckets, sh, parent, threshold, stats, prefilter)
    timings["candidates_verify"] = time.perf_counter() - t0 - stats.union_seconds
    timings["union_find"] = stats.union_seconds
    timings["pairs_prefiltered"] = float(stats.prefiltered)
    timings["pairs_verified"] = float(stats.verified)
    timings["pairs_accepted"] = float(stats.accepted)
    labels = parent.tolist()
    return [labels[i] for i in text_of], method


def group_near_duplicates(
    texts: Sequence[str],
    *,
    ids: Sequence[str] | None = None,
    explicit: Sequence[str | None] | None = None,
    threshold: float = 0.7,
    n: int = 4,
    exact_limit: int = 2_000,
    num_perm: int = 128,
    seed: int = 0,
) -> GroupingResult:
    """Group near-duplicate queries.

    Items with an explicit group (``explicit[i]`` not None) keep it verbatim;
    the others are joined when the Jaccard similarity of their normalised
    character n-gram sets is >= ``threshold`` (transitively). Exact when the
    items without explicit group have at most ``exact_limit`` distinct
    normalised texts, MinHash-LSH (``num_perm`` permutations seeded by
    ``seed``) with exact verification otherwise. See the module docstring.

    ``ids`` name the items (default: their positions ``"0"``, ``"1"``, ...);
    they must be unique. Computed group ids are ``"g:<id of first member>"``.
    """
    t_start = time.perf_counter()
    _check_params(threshold, n, exact_limit, num_perm)
    count = len(texts)
    if ids is None:
        ids = [str(i) for i in range(count)]
    elif len(ids) != count:
        raise ValueError(f"{len(ids)} ids for {count} texts")
    else:
        seen: set[str] = set()
        for i, item_id in enumerate(ids):
            if item_id in seen:
                raise DatasetError(f"duplicate query id '{item_id}' (item {i})", field="query_id")
            seen.add(item_id)
    if explicit is not None and len(explicit) != count:
        raise ValueError(f"{len(explicit)} explicit groups for {count} texts")

    free = [i for i in range(count) if explicit is None or explicit[i] is None]
    stages = ("normalise", "shingle", "minhash", "candidates_verify", "union_find")
    counters = ("pairs_prefiltered", "pairs_verified", "pairs_accepted")
    timings: dict[str, float] = dict.fromkeys((*stages, *counters), 0.0)
    t0 = time.perf_counter()
    norm = _normalize_many([texts[i] for i in free])
    timings["normalise"] = time.perf_counter() - t0
    if free:
        labels, method = _components(
            norm,
            threshold=threshold,
            n=n,
            exact_limit=exact_limit,
            num_perm=num_perm,
            seed=seed,
            timings=timings,
        )
    else:
        labels, method = [], "exact"

    taken = {g for g in explicit or () if g is not None}
    group_of: list[str] = [""] * count
    name_of: dict[int, str] = {}
    for i, label in zip(free, labels, strict=True):
        name = name_of.get(label)
        if name is None:
            base = name = f"g:{ids[i]}"
            k = 1
            while name in taken:
                k += 1
                name = f"{base}~{k}"
            taken.add(name)
            name_of[label] = name
        group_of[i] = name
    if explicit is not None:
        for i, g in enumerate(explicit):
            if g is not None:
                group_of[i] = g
    sizes: dict[str, int] = {}
    for g in group_of:
        sizes[g] = sizes.get(g, 0) + 1
    timings["total"] = time.perf_counter() - t_start
    return GroupingResult(group_of=group_of, n_groups=len(sizes), sizes=sizes, method=method, timings=timings)


# --------------------------------------------------------------------------
# Public: splits
# --------------------------------------------------------------------------

_SPLITS = ("dev", "holdout")


def _tie_key(seed: int) -> Callable[[str], bytes]:
    prefix = f"{seed}\x1f".encode()

    def key(group: str) -> bytes:
        return hashlib.blake2b(prefix + group.encode("utf-8", "surrogatepass"), digest_size=8).digest()

    return key


def assign_splits(
    group_of: Sequence[str],
    *,
    holdout_share: float = 0.3,
    seed: int = 0,
    fixed: Sequence[str | None] | None = None,
) -> list[str]:
    """``"dev"`` or ``"holdout"`` per item, never splitting a group.

    Groups with a fixed split (any member's ``fixed`` value) go there first,
    with all their members. The other groups follow, largest first (equal
    sizes in the order of a hash of ``seed`` and the group id), each into the
    split whose count is the smaller fraction of its target
    (``holdout_share * n`` and the rest); an exact tie goes by that hash.
    Deterministic for equal inputs.

    Raises DatasetError when ``fixed`` holds a value other than dev/holdout,
    or puts members of one group into both splits.
    """
    if not 0.0 <= holdout_share <= 1.0:
        raise ConfigError(f"holdout_share must be in [0, 1], got {holdout_share}")
    count = len(group_of)
    if fixed is not None and len(fixed) != count:
        raise ValueError(f"{len(fixed)} fixed splits for {count} items")
    sizes: dict[str, int] = {}
    for g in group_of:
        sizes[g] = sizes.get(g, 0) + 1
    placed: dict[str, str] = {}
    where: dict[str, int] = {}
    if fixed is not None:
        for i, (g, s) in enumerate(zip(group_of, fixed, strict=True)):
            if s is None:
                continue
            if s not in _SPLITS:
                raise DatasetError(f"item {i}: split must be 'dev' or 'holdout', got {s!r}", field="split")
            prev = placed.get(g)
            if prev is not None and prev != s:
                raise DatasetError(
                    f"group '{g}' is fixed to both splits: item {where[g]} is '{prev}', item {i} is '{s}'",
                    field="split",
                )
            placed.setdefault(g, s)
            where.setdefault(g, i)
    holdout = sum(sizes[g] for g, s in placed.items() if s == "holdout")
    dev = sum(sizes[g] for g, s in placed.items() if s == "dev")
    target_h = holdout_share * count
    target_d = count - target_h
    tie = _tie_key(seed)
    free = sorted((g for g in sizes if g not in placed), key=lambda g: (-sizes[g], tie(g)))
    for g in free:
        if target_h <= 0:
            split = "dev"
        elif target_d <= 0:
            split = "holdout"
        else:
            fill_h, fill_d = holdout / target_h, dev / target_d
            if fill_h == fill_d:
                split = "holdout" if tie(g)[0] & 1 else "dev"
            else:
                split = "holdout" if fill_h < fill_d else "dev"
        placed[g] = split
        if split == "holdout":
            holdout += sizes[g]
        else:
            dev += sizes[g]
    return [placed[g] for g in group_of]


def check_splits(group_of: Sequence[str], split_of: Sequence[str]) -> list[str]:
    """Ids of the groups whose items are in more than one split, sorted."""
    if len(group_of) != len(split_of):
        raise ValueError(f"{len(split_of)} splits for {len(group_of)} items")
    seen: dict[str, str] = {}
    bad: set[str] = set()
    for g, s in zip(group_of, split_of, strict=True):
        if seen.setdefault(g, s) != s:
            bad.add(g)
    return sorted(bad)
