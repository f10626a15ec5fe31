"""Records on disk: one JSON line per query, appended as queries finish, read back tolerantly."""

from __future__ import annotations

import contextlib
import gc
import json
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from rag_ablate.core.errors import EXIT_INVALID, RagAblateError, WriteError
from rag_ablate.core.fsio import replacing
from rag_ablate.core.layout import RECORDS_FILE as RECORDS_FILE  # re-exported
from rag_ablate.records.trace import Record, record_key

_orjson: ModuleType | None
try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - a pinned dependency; the json module reads the same records
    _orjson = None

#: 19 digits in a row: an integer that may not fit 64 bits, which orjson reads as a float
#: (-9223372036854775809 -> -9.223372036854776e+18), silently; such lines go to the json module.
#: Found by mapping every digit to "0" and every other byte to " " (bytes.translate, then a substring
#: search: 2.6 us for a 2.5 KB record line, a tenth of a regular expression's time)
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_DIGITS = b"0" * 19

FSYNC_SECONDS = 1.0  # RecordWriter: at most this long between fsyncs (each record is written at once)


def _finite(data: Mapping[str, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """No float in ``data`` (nested mappings, lists and tuples) is NaN or infinite (``x - x`` is 0
    only for a finite x). Exact types are tested first: the ABC checks are slow."""
    for v in data.values() if type(data) is dict or isinstance(data, Mapping) else data:
        t = type(v)
        if t is float:
            if v - v != 0.0:
                return False
        elif t is str or t is int or v is None or t is bool:
            continue
        elif (t is dict or t is list or isinstance(v, Mapping | list | tuple)) and not _finite(v):
            return False
    return True


def dumps_line(rec: Record) -> bytes:
    """One record as a JSON line (with its newline), as :class:`RecordWriter` appends it: orjson's
    compact encoding (a tenth of the json module's time on a record); the json module's when orjson
    would not write the same values (NaN or an infinity, which it writes as null; a key that is not a
    str, an int beyond 64 bits). :func:`loads_line` reads both.

    orjson's line holds ``null`` at least once for each None and each non-finite float (and again for
    each ``null`` inside a string); when it holds it exactly as often as the record has None values
    at its top level, there is no non-finite float (a record's usual case: 0.5 us). Otherwise the
    record is walked (:func:`_finite`, 16 us on a 4 KB record)."""
    if _orjson is not None:
        try:
            line: bytes = _orjson.dumps(rec, option=_orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # orjson.JSONEncodeError: a key that is not a str, a big int
            pass
        else:
            if line.count(b"null") == operator.countOf(rec.values(), None) or _finite(rec):
                return line
    return (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")


def write_records(path: Path, records: Iterable[Record]) -> None:
    """Write ``records`` as the whole of ``path``, atomically (a temporary file, fsync'd, renamed),
    each line as :class:`RecordWriter` appends it (:func:`dumps_line`: a quarter of the json
    module's time, 0.36 -> 0.09 s for 6,000 records)."""
    with replacing(path) as tmp, tmp.open("wb") as f:
        f.writelines(map(dumps_line, records))
        f.flush()
        os.fsync(f.fileno())


class RecordsError(RagAblateError):
    """A records file has a line that is not a record (anywhere but a half-written last line)."""

    exit_code = EXIT_INVALID


@dataclass
class RecordsScan:
    """What :func:`scan_records` found in a records file."""

    records: list[Record]
    good_bytes: int  # length of the valid prefix (every complete line)
    torn_tail: bool  # the last line was half-written (no newline, not a complete record): ignored


def loads_line(raw: bytes) -> Any:
    """One JSON line: orjson's parser (about twice as fast on a record), else the json module's, which
    also reads what orjson refuses (NaN and Infinity as json.dumps writes them) and names the error."""
    if _orjson is not None and not may_hold_big_int(raw):
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw.decode("utf-8"))


def may_hold_big_int(raw: bytes) -> bool:
    """Whether JSON text has 19 digits in a row: an integer orjson may turn into a float (it reads
    what does not fit 64 bits as a float, without an error); the json module keeps it exact."""
    return _LONG_DIGITS in raw.translate(_DIGITS_AS_ZERO)


def dumps_sorted(data: Any) -> bytes:
    """``data`` as JSON bytes with sorted keys (a digest's input; anything JSON lacks as its str):
    orjson's encoder, else the json module's (the bytes can differ between the two; a digest is
    only ever compared with one made in the same process)."""
    if _orjson is not None:
        with contextlib.suppress(TypeError):  # a key that is not a str, an int beyond 64 bits
            encoded: bytes = _orjson.dumps(data, default=str, option=_orjson.OPT_SORT_KEYS)
            return encoded
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str).encode("utf-8")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off (when it was on) while a bulk of acyclic data is read or made
    (records are JSON trees; reference counting still frees them): each of its full collections
    walks every object so far (reading 100,000 records in a fresh process: 4.0 s of CPU against
    4.4-4.8 s; a run's score stage, whose aggregates, cost and slices make hundreds of thousands of
    small containers: about a fifth of its CPU on 6,000 queries)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def scan_records(
    path: Path, project: Callable[[Record], Record] | None = None, start: int = 0, end: int | None = None
) -> RecordsScan:
    """Read a records file written by :class:`RecordWriter` (or :func:`write_records`).

    Lines end with a newline once they are complete. A last line without one that is
    not a complete JSON object is what a process killed mid-write leaves: it is
    ignored (``torn_tail``), never read as data. A last line that is a complete
    object only lacks its newline and is kept. Blank lines are skipped. Any other
    line that is not a JSON object raises :class:`RecordsError` naming file and line.
    ``project``: applied to each record as it is read (the comparison keeps less of each).
    ``start``/``end``: only the lines from byte ``start`` to byte ``end`` (both at line boundaries:
    a piece of the file, read side by side with the others); errors still name the file's line.
    """
    records: list[Record] = []
    pos, lineno = start, 0
    stop = sys.maxsize if end is None else end
    torn = False
    with gc_paused(), path.open("rb") as f:  # line by line: the file is never held whole
        f.seek(start)
        for line in f:
            if pos >= stop:
                break
            lineno += 1
            last = not line.endswith(b"\n")
            raw = line if last else line[:-1]
            if raw.strip():
                try:
                    rec = loads_line(raw)
                except (UnicodeDecodeError, ValueError) as exc:
                    if last:
                        torn = True
                        break
                    excerpt = raw[:80].decode("utf-8", errors="replace")
                    where = f"{path}:{lineno + _lines_before(path, start)}"
                    raise RecordsError(f"{where}: not a JSON record ({exc}): {excerpt!r}") from exc
                if not isinstance(rec, dict) or "query_id" not in rec:
                    if last:
                        torn = True
                        break
                    where = f"{path}:{lineno + _lines_before(path, start)}"
                    raise RecordsError(f"{where}: not a record (a JSON object with a query_id)")
                # the boundary: a JSON object with a query_id is taken to be a Record (written by
                # make_record/scored; an older one may lack fields added since, see Record)
                record = cast(Record, rec)
                records.append(record if project is None else project(record))
            pos += len(line)
    return RecordsScan(records, pos, torn)


def _lines_before(path: Path, offset: int) -> int:
    """How many lines the first ``offset`` bytes of ``path`` hold (an error's line number in a piece
    of the file: counted only then)."""
    n = 0
    with path.open("rb") as f:
        while offset > 0 and (block := f.read(min(offset, 1 << 20))):
            n += block.count(b"\n")
            offset -= len(block)
    return n


def read_records(path: Path, project: Callable[[Record], Record] | None = None) -> list[Record]:
    """Every record of ``path`` in file order (a half-written last line is ignored, see
    :func:`scan_records`). While a run is in progress, or after it was interrupted, a
    query can have several records: :func:`final_records` keeps the last one of each."""
    return scan_records(path, project).records


def final_records(records: Iterable[Record]) -> dict[str, Record]:
    """The last record of each query id, or of each (query, repeat) with ``system.repeats`` > 1
    (:func:`~rag_ablate.records.trace.record_key`; a later attempt supersedes an earlier one)."""
    out: dict[str, Record] = {}
    for rec in records:
        key = record_key(rec)
        out.pop(key, None)  # keep completion order of the final attempts
        out[key] = rec
    return out


class RecordWriter:
    """Appends records to a file as they complete: each is written to the file at once, in one
    unbuffered write (a killed process loses at most the line it was writing), and fsync'd at most every
    ``fsync_every`` seconds and when closed (an OS crash loses at most that window).

    Opening repairs the file's end first: a half-written last line is cut off, and a
    complete last record without its newline gets one, so appended lines stay whole.
    Thread-safe: a concurrent runner may call :meth:`write` from several threads.
    """

    def __init__(self, path: Path, *, fsync_every: float = FSYNC_SECONDS) -> None:
        self.path = path
        self.fsync_every = fsync_every
        self.written = 0
        self.fsyncs = 0
        self._lock = threading.Lock()
        if path.is_file():
            scan = scan_records(path)
            size = path.stat().st_size
            if scan.good_bytes < size:  # torn tail: cut it off
                with path.open("r+b") as f:
                    f.truncate(scan.good_bytes)
            elif size and not path.read_bytes().endswith(b"\n"):
                with path.open("ab") as f:
                    f.write(b"\n")
        try:  # unbuffered: each line goes to the file in one write call (a buffer would copy it first)
            self._f = path.open("ab", buffering=0)
        except OSError as exc:
            raise WriteError(path, exc) from exc
        self._last_sync = time.monotonic()

    def write(self, rec: Record) -> None:
        """Append ``rec``; WriteError (a full disk) leaves at most a half line, which reading and
        :class:`RecordWriter` ignore (``resume=`` runs that query again)."""
        line = dumps_line(rec)
        with self._lock:
            try:
                done = self._f.write(line)
                while done < len(line):  # a short write (a nearly full disk): the rest, or the error
                    done += self._f.write(line[done:])
                now = time.monotonic()
                if now - self._last_sync >= self.fsync_every:
                    os.fsync(self._f.fileno())
                    self.fsyncs += 1
                    self._last_sync = now
            except OSError as exc:
                raise WriteError(self.path, exc) from exc
            self.written += 1

    def close(self) -> None:
        with self._lock:
            if self._f.closed:
                return
            try:
                os.fsync(self._f.fileno())
                self.fsyncs += 1
            except OSError as exc:
                raise WriteError(self.path, exc) from exc
            finally:
                with contextlib.suppress(OSError):  # (unbuffered: nothing is left to write)
                    self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
