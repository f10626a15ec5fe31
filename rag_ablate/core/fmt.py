"""Plain-text formatting shared by every view: aligned tables, text made safe for a terminal."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
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
