"""The normal form reference answers are looked for in (docs/metrics.md "Sentence answers"),
and the script a text is written in (docs/metrics.md "answer_language_match").

:func:`normal_form` rewrites the ways Chinese and English text write the same number or date
into one, so a reference is found in an answer whichever way either writes it. In order:

1. NFKC (full-width letters, digits and punctuation become half-width: ``１２`` -> ``12``,
   ``，`` -> ``,``) and lower case;
2. ``百分之X`` -> ``X%``;
3. numbers written with Chinese numerals or units become Arabic numbers: ``三百零五`` -> ``305``,
   ``二〇二二`` -> ``2022``, ``一点五`` -> ``1.5``, and the units 十 百 千 万 亿 multiply the
   number before them, Arabic or Chinese: ``三万五千`` -> ``35000``, ``3.5万`` -> ``35000``,
   ``3万5千`` -> ``35000``. A run of numerals starts with a digit (or ``十``), so ``万一`` and
   ``千万`` (not numbers) are left alone, while a numeral inside a word is rewritten on both
   sides alike (``一般`` -> ``1般``);
4. dates: ``2022-01-03``, ``2022/1/3`` and ``2022.1.3`` -> ``2022年1月3日``; ``3号`` after a
   month -> ``3日``;
5. every Arabic number is written one way: thousands separators dropped (``35,000`` ->
   ``35000``), leading zeros (``01`` -> ``1``) and trailing decimal zeros (``3.50`` -> ``3.5``)
   removed.

:func:`script_of` says whether a text is written in Han characters or Latin letters.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from typing import Literal

__all__ = ["HAN_SHARE", "Script", "han_share", "normal_form", "script_of"]

_ZH_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7,
              "八": 8, "九": 9}  # fmt: skip
_SMALL_UNITS = {"十": 10, "百": 100, "千": 1000}
_BIG_UNITS = (("亿", 10**8), ("万", 10**4))
_DIGIT_CLASS = "".join(_ZH_DIGITS)
_ARABIC = r"\d+(?:\.\d+)?"
# a run of numerals: it starts with a digit (Arabic or Chinese) or 十; 点 is a decimal point
# only between digits
_NUMERAL_RUN = re.compile(
    f"(?:{_ARABIC}|[{_DIGIT_CLASS}十])(?:{_ARABIC}|[{_DIGIT_CLASS}十百千万亿]|点(?=[{_DIGIT_CLASS}]))*"
)
_HAS_CHINESE = re.compile(f"[{_DIGIT_CLASS}十百千万亿点]")
_PERCENT = re.compile(f"百分之((?:{_ARABIC}|[{_DIGIT_CLASS}十百千点])+)")
_ISO_DATE = re.compile(r"(?<![\d.])(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?![\d.])")
_DAY_HAO = re.compile(r"(月\d{1,2})号")
_NUMBER = re.compile(r"\d+(?:,\d{3}(?!\d))*(?:\.\d+)?")


def _atom(a: str) -> Decimal:
    return Decimal(_ZH_DIGITS[a]) if a in _ZH_DIGITS else Decimal(a)


def _small(s: str) -> Decimal | None:
    """The value of a run without 万 or 亿, None when it is not a number."""
    if "点" in s:
        whole, frac = s.split("点", 1)
        if not whole or not frac or any(c not in _ZH_DIGITS for c in frac):
            return None
        head = _small(whole)
        tail = "".join(str(_ZH_DIGITS[c]) for c in frac)
        return None if head is None else head + Decimal(f"0.{tail}")
    atoms = re.findall(_ARABIC + "|.", s)
    if not any(a in _SMALL_UNITS for a in atoms):  # digits only, read one by one: 二〇二二 -> 2022
        if len(atoms) == 1:
            return _atom(atoms[0])
        if any(not (a in _ZH_DIGITS or a.isdigit()) for a in atoms):
            return None
        return Decimal("".join(str(_atom(a)) for a in atoms))
    total, num = Decimal(0), None
    for a in atoms:
        if a in _SMALL_UNITS:
            total += (Decimal(1) if num is None else num) * _SMALL_UNITS[a]
            num = None
        else:
            num = _atom(a)
    return total + (num or 0)


def _value(s: str) -> Decimal | None:
    """The value of a run of numerals (:data:`_NUMERAL_RUN`), None when it is not a number."""
    for unit, mult in _BIG_UNITS:
        if unit in s:
            head, tail = s.split(unit, 1)
            high = _value(head) if head else Decimal(1)
            low = _value(tail) if tail else Decimal(0)
            return None if high is None or low is None else high * mult + low
    return _small(s) if s else None


def _canonical(d: Decimal) -> str:
    """``d`` written one way: no exponent, no leading or trailing decimal zeros."""
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _numeral(m: re.Match[str]) -> str:
    run = m.group(0)
    if not _HAS_CHINESE.search(run):  # Arabic digits only: step 5 writes them
        return run
    value = _value(run)
    return run if value is None else _canonical(value)


def _number(m: re.Match[str]) -> str:
    try:
        return _canonical(Decimal(m.group(0).replace(",", "")))
    except InvalidOperation:  # pragma: no cover - the pattern only matches numbers
        return m.group(0)


def normal_form(text: str) -> str:
    """``text`` with numbers, amounts and dates written one way (steps in the module docstring)."""
    out = unicodedata.normalize("NFKC", text).lower()
    out = _PERCENT.sub(r"\1%", out)
    out = _NUMERAL_RUN.sub(_numeral, out)
    out = _ISO_DATE.sub(lambda m: f"{m[1]}年{int(m[2])}月{int(m[3])}日", out)
    out = _DAY_HAO.sub(r"\1日", out)
    return _NUMBER.sub(_number, out)


# ------------------------------------------------------------------------------------- script

Script = Literal["han", "latin"]

HAN_SHARE = 0.5
"""A text is Han when Han characters make up at least this share of its letters (see :func:`script_of`)."""

_HAN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U000323af]")
_LATIN_WORD = re.compile("[a-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f]+", re.I)


def han_share(text: str) -> float | None:
    """Han characters / (Han characters + Latin words), after NFKC; None without either.

    A Latin word counts as one unit, as a Han character does (the project's token rule), so a
    Chinese sentence that names ``Apple Pay`` is still mostly Han. Digits, punctuation and other
    scripts do not count."""
    norm = unicodedata.normalize("NFKC", text)
    han = len(_HAN.findall(norm))
    latin = len(_LATIN_WORD.findall(norm))
    return None if han + latin == 0 else han / (han + latin)


def script_of(text: str, threshold: float = HAN_SHARE) -> Script | None:
    """``"han"`` when :func:`han_share` is at least ``threshold``, ``"latin"`` below it, None for a
    text with neither Han characters nor Latin letters."""
    share = han_share(text)
    if share is None:
        return None
    return "han" if share >= threshold else "latin"
