"""Files written whole or not at all.

Every file the package writes (records.jsonl appends aside) goes through here: it is written
to a temporary name in the same folder, synced and renamed over the target, so a reader sees
the old file or the new one, never half of either. A write that fails (a full disk, a read-only
folder, no permission) removes its temporary file, leaves the old file as it was and raises
:class:`~rag_ablate.core.errors.WriteError` naming the path and the error.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from itertools import islice
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

from rag_ablate.core.errors import WriteError


def make_dirs(folder: Path) -> None:
    """``folder`` and its parents created when missing; WriteError when they cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(folder, exc) from exc


def check_writable(folder: Path) -> None:
    """``folder`` created when missing and a file written into it and removed: WriteError (exit 2,
    nothing ran) when either cannot be, before anything else is written there."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-check.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise WriteError(folder, exc, nothing_ran=True) from exc


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; renamed to ``path`` when the block ends without
    an error, removed when it raises. An OSError (in the block or the rename) becomes WriteError."""
    make_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:
        raise WriteError(path, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``path`` holds exactly ``data`` afterwards, or is as it was (WriteError)."""
    with replacing(path) as tmp, tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(path: Path, text: str) -> None:
    """``path`` holds exactly ``text`` (UTF-8) afterwards, or is as it was (WriteError)."""
    write_bytes_atomic(path, text.encode("utf-8"))


#: :func:`write_json_atomic` writes its encoded pieces once they hold this many characters
_JSON_CHARS = 1 << 20


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 1, **kwargs: Any) -> None:
    """``data`` as JSON (non-ASCII kept), written whole or not at all. The text is the one
    ``json.dumps`` gives, encoded and written piece by piece: a comparison.json of 100 MB is never
    held whole (with an indent, the json module encodes in many small strings; without other
    options, :func:`indented_pieces` gives the same text from fewer, larger ones)."""
    encoder = json.JSONEncoder(ensure_ascii=False, indent=indent, **kwargs)
    if indent is not None and not kwargs:
        encoded = indented_pieces(data, indent, 0, encoder)
    else:
        encoded = encoder.iterencode(data)
    with replacing(path) as tmp, tmp.open("wb") as f:
        pieces: list[str] = []
        held = 0
        for piece in encoded:
            pieces.append(piece)
            held += len(piece)
            if held >= _JSON_CHARS:
                f.write("".join(pieces).encode("utf-8"))
                pieces.clear()
                held = 0
        f.write("".join(pieces).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


_SCALARS = {str, int, float, bool, type(None)}  # what the json module writes the same at any depth
_STR = {str}
_FLAT_ITEMS = 4096


def indented_pieces(data: Any, indent: int, level: int, encoder: json.JSONEncoder) -> Iterator[str]:
    """The text ``encoder`` (``json.JSONEncoder(ensure_ascii=False, indent=indent)``) gives for ``data``
    nested ``level`` deep, in pieces. A dict (str keys) or list whose values are all plain scalars is
    written by the json module's C encoder, one call per :data:`_FLAT_ITEMS` items (its item separator
    holds the newline and the indent; the Python encoder that an indent needs writes each item in
    several pieces: 6.3 ms against 3.4 for a run's slices of the sample); other dicts and lists are
    walked here. Anything
    else is ``encoder``'s own text with each newline indented to ``level`` (a string's newline is
    escaped, so every newline in JSON text is the encoder's)."""
    kind = type(data)
    if (kind is dict and data and set(map(type, data)) == _STR) or ((kind is list or kind is tuple) and data):
        pad = "\n" + " " * (indent * (level + 1))
        close = "\n" + " " * (indent * level) + ("}" if kind is dict else "]")
        values = data.values() if kind is dict else data
        if set(map(type, values)) <= _SCALARS:  # up to _FLAT_ITEMS items a call (a piece's size bounded)
            flat = json.JSONEncoder(ensure_ascii=False, separators=("," + pad, ": "))
            items = iter(data.items() if kind is dict else data)
            yield ("{" if kind is dict else "[") + pad
            first = True
            while chunk := list(islice(items, _FLAT_ITEMS)):
                text = flat.encode(dict(chunk) if kind is dict else chunk)
                yield text[1:-1] if first else "," + pad + text[1:-1]
                first = False
            yield close
            return
        if kind is dict:
            yield "{"
            for i, (key, value) in enumerate(data.items()):
                yield ("," if i else "") + pad + encode_basestring(key) + ": "
                yield from indented_pieces(value, indent, level + 1, encoder)
        else:
            yield "["
            for i, value in enumerate(data):
                yield ("," if i else "") + pad
                yield from indented_pieces(value, indent, level + 1, encoder)
        yield close
        return
    pad = "\n" + " " * (indent * level)
    for piece in encoder.iterencode(data):
        yield piece.replace("\n", pad) if level else piece
