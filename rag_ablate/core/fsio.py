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


#: encoded JSON pieces joined per write by :func:`write_json_atomic`
_JSON_PIECES = 1 << 16


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 1, **kwargs: Any) -> None:
    """``data`` as JSON (non-ASCII kept), written whole or not at all. The text is the one
    ``json.dumps`` gives, encoded and written piece by piece: a comparison.json of 100 MB is never
    held whole (with an indent, the json module encodes in many small strings)."""
    encoder = json.JSONEncoder(ensure_ascii=False, indent=indent, **kwargs)
    with replacing(path) as tmp, tmp.open("wb") as f:
        pieces: list[str] = []
        for piece in encoder.iterencode(data):
            pieces.append(piece)
            if len(pieces) >= _JSON_PIECES:
                f.write("".join(pieces).encode("utf-8"))
                pieces.clear()
        f.write("".join(pieces).encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
