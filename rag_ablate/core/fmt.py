"""Plain-text formatting shared by every view: aligned tables, text made safe for a terminal."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence


def char_width(ch: str) -> int:
    """Columns a character takes in a terminal: 2 for East Asian wide and full-width characters
    (汉字, ＡＢ, 。), 0 for combining marks and invisible characters, else 1."""
    if unicodedata.combining(ch) or invisible(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Columns ``text`` takes in a terminal (not its length in code points: ``"召回"`` takes 4)."""
    if text.isascii():
        return len(text)
    return sum(char_width(ch) for ch in text)


def pad(text: str, width: int) -> str:
    """``text`` padded with spaces on the right to ``width`` terminal columns (``str.ljust`` by
    display width, so columns of Chinese and English cells line up)."""
    return text + " " * max(0, width - display_width(text))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An aligned plain-text table; columns are measured in terminal columns (:func:`display_width`)."""
    widths = [max([display_width(h), *(display_width(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = "  ".join(pad(h, w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(pad(c, w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, sep, *body])


def invisible(ch: str) -> bool:
    """A control, format or line/paragraph-separator character: it moves the cursor, changes colours,
    reorders text or cannot be seen (ESC, NUL, CR, U+200B, U+202E, U+2028)."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def visible(text: str) -> str:
    """``text`` with every :func:`invisible` character written as an escape (``\\x1b``, ``\\u202e``),
    so dataset text printed to a terminal shows what it holds instead of acting on the terminal."""
    if not any(invisible(ch) for ch in text):
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii") if invisible(ch) else ch for ch in text)
