"""Content-addressed caches shared across variants and processes.

A chunked corpus, a BM25 index and an embedding matrix are each computed once per
distinct input and reused by every variant that needs the same thing. The key is
a hash of everything that can change the artefact: the stage's effective settings
and inputs, plus the code that computes it (this package's version, the Python
version and a hash of the stage's own source files) and the versions of the
libraries it calls. Each stage builds its key parts in one function
(``chunk_key_parts``, ``bm25_key_parts``, ``passage_embedding_key_parts``,
``query_embedding_key_parts``) from the helpers below: :func:`code_parts`,
:func:`code_fingerprint`, :func:`library_versions`, :func:`bytes_fingerprint`,
:func:`words_fingerprint` and :func:`file_fingerprint`. None of them imports a heavy
library: versions come from the installed distributions' metadata, sources are read
from disk. docs/architecture.md describes the stages.

Layout: one folder per entry, ``<root>/<kind>/<key>/``, holding the data (``data.npy``,
``data.json`` or a ``data/`` folder) and ``meta.json`` (the key's parts, the build
time), for a person who wonders what an entry is. An entry is written in a hidden
temporary folder next to it and renamed into place in one step, so a reader sees
data and meta together or not at all; a build that raises removes its temporary
folder. When two processes build the same entry at once, the first rename wins and
the second process discards its own (identical) copy. Temporary folders a killed process left
behind (older than a day) are removed once per process and kind, not on every write.

Small JSON entries (:meth:`Cache.json`: the model-call cache, ``llm_calls``) live in one SQLite
file instead, ``<root>/json.sqlite`` (:class:`JsonStore`): one table keyed by the same content
key, a row per entry with its kind, value, key parts, build time and creation time. One file per
call made 10,000 entries cost 10,000 folders (125 s to write, benchmarks/RESULTS.md); a row
costs a fraction of a millisecond. Each write is one transaction (a reader sees a whole row or
none; a process killed mid-write leaves the last committed state), in write-ahead-log mode so
readers do not wait for writers; several threads (one connection each) and several processes
write at once, SQLite serialising their writes (a writer waits up to ``BUSY_SECONDS`` for
another's). When two build the same entry, the first row stays (``INSERT OR IGNORE``: the
content is the same). Entries of the one-folder-per-entry layout (``<root>/<kind>/<key>/
data.json``) are still read, and copied into the store on their first hit; their folders are
left as they are.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_ablate.core.errors import WriteError

META_FILE = "meta.json"
STORE_FILE = "json.sqlite"  # the store of Cache.json's entries, in the cache's root
BUSY_SECONDS = 60.0  # how long a write waits for another connection's to finish
_TMP_PREFIX = ".tmp-"
_STALE_TMP_SECONDS = 24 * 3600  # temporary folders older than this were left by a killed process
_SWEPT: set[tuple[int, Path]] = set()  # (process id, kind folder) already cleared of stale temporary folders
ABSENT = "absent"  # the version of a distribution that is not installed


def content_key(kind: str, parts: Mapping[str, Any]) -> str:
    """A stable hash of everything an artefact depends on (key order does not matter)."""
    payload = json.dumps({"kind": kind, **parts}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


# --------------------------------------------------------------------------- key parts


def bytes_fingerprint(data: bytes) -> str:
    """sha256 of ``data`` (hex, 16 characters): for word lists and other small resources."""
    return hashlib.sha256(data).hexdigest()[:16]


def words_fingerprint(words: Iterable[str]) -> str:
    """Fingerprint of a set of words (a stop-word list): independent of their order."""
    return bytes_fingerprint("\n".join(sorted(set(words))).encode("utf-8"))


_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_fingerprint(path: Path) -> str:
    """sha256 of a file's content (hex, 16 characters); remembered per path, size and mtime."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    digest = _FILE_DIGESTS.get(stamp)
    if digest is None:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        digest = _FILE_DIGESTS[stamp] = h.hexdigest()[:16]
    return digest


def _module_source(module: str) -> bytes:
    """The source file of an importable module, read without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.has_location:
        raise ValueError(f"module {module!r} has no source file to fingerprint")
    return Path(spec.origin).read_bytes()


def code_fingerprint(*modules: str) -> str:
    """sha256 (hex, 16 characters) over the named modules' source files, in the given order.

    The stage's own modules, e.g. ``code_fingerprint("rag_ablate.pipeline.chunking")``:
    any edit to them changes every key built from this fingerprint, so nobody has to
    remember to bump a version number.
    """
    if not modules:
        raise ValueError("code_fingerprint needs at least one module name")
    h = hashlib.sha256()
    for name in modules:
        source = _module_source(name)
        h.update(f"{name}\0{len(source)}\0".encode())
        h.update(source)
    return h.hexdigest()[:16]


def package_version() -> str:
    """This package's version (read at call time)."""
    import rag_ablate

    return str(rag_ablate.__version__)


def code_parts(*modules: str) -> dict[str, str]:
    """The identity of the code that computes a stage: package, Python (major.minor) and source hash."""
    return {
        "package": package_version(),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "source": code_fingerprint(*modules),
    }


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ABSENT


def library_versions(*dists: str) -> dict[str, str]:
    """Installed versions of the named distributions (``"absent"`` when not installed).

    Read from package metadata, so asking for ``torch`` does not import it.
    """
    return {d: _dist_version(d) for d in sorted(set(dists))}


# --------------------------------------------------------------------------- the JSON store

_SQLITE_ERRNO = {  # SQLite's primary result codes, as the OS error a WriteError reports
    sqlite3.SQLITE_FULL: errno.ENOSPC,
    sqlite3.SQLITE_READONLY: errno.EROFS,
    sqlite3.SQLITE_CANTOPEN: errno.EACCES,
    sqlite3.SQLITE_PERM: errno.EACCES,
}
_SCHEMA = """CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    parts TEXT NOT NULL,
    build_seconds REAL NOT NULL,
    created REAL NOT NULL
)"""


def _write_error(path: Path, exc: sqlite3.Error) -> WriteError:
    code = getattr(exc, "sqlite_errorcode", None)
    number = errno.EIO if code is None else _SQLITE_ERRNO.get(code & 0xFF, errno.EIO)
    return WriteError(path, OSError(number, str(exc)))


class JsonStore:
    """The SQLite file of :meth:`Cache.json`'s entries (see the module docstring).

    One connection per thread and process, opened on first use; the file is created by the first
    write, so a cache that only misses, or whose builds all fail, leaves no file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:  # connections are not copied to another process
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        local = self._local
        conn: sqlite3.Connection | None = getattr(local, "conn", None)
        if conn is not None and local.pid == os.getpid():
            return conn
        if not create and not self.path.is_file():
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError(self.path, exc) from exc
        deadline = time.monotonic() + BUSY_SECONDS
        while True:
            try:
                conn = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None)
                try:
                    # write-ahead log: readers never wait for a writer; NORMAL: a commit is atomic and
                    # survives a killed process (only a power cut may lose the last ones)
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute(_SCHEMA)
                except BaseException:
                    conn.close()
                    raise
                break
            except sqlite3.OperationalError as exc:
                # changing the journal mode does not wait for a busy file: two processes creating it
                if (
                    getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY
                    or time.monotonic() > deadline
                ):
                    raise _write_error(self.path, exc) from exc
                time.sleep(0.01)
            except sqlite3.Error as exc:  # not a database (a damaged or foreign file)
                raise _write_error(self.path, exc) from exc
        local.conn, local.pid = conn, os.getpid()
        return conn

    def get(self, key: str) -> tuple[str, float] | None:
        """The stored value (JSON text) and build seconds of ``key``, or None."""
        conn = self._connection(create=False)
        if conn is None:
            return None
        try:
            row = conn.execute("SELECT value, build_seconds FROM entries WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise _write_error(self.path, exc) from exc
        return None if row is None else (str(row[0]), float(row[1]))

    def put(self, key: str, kind: str, value: str, parts: str, seconds: float) -> None:
        """Store an entry in one transaction; an entry already stored under ``key`` stays."""
        conn = self._connection(create=True)
        assert conn is not None
        try:
            conn.execute(
                "INSERT OR IGNORE INTO entries VALUES (?, ?, ?, ?, ?, ?)",
                (key, kind, value, parts, seconds, time.time()),
            )
        except sqlite3.Error as exc:
            raise _write_error(self.path, exc) from exc

    def delete(self, key: str) -> None:
        conn = self._connection(create=False)
        if conn is not None:
            try:
                conn.execute("DELETE FROM entries WHERE key = ?", (key,))
            except sqlite3.Error as exc:
                raise _write_error(self.path, exc) from exc

    def close(self) -> None:
        """Close this thread's connection (another call opens a new one)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            conn.close()


# --------------------------------------------------------------------------- cache


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    build_seconds: float = 0.0  # time spent building on misses, in this process
    stored_build_seconds: float = 0.0  # what the entries cost when they were built (hits included)


@dataclass
class Cache:
    """A cache folder; ``enabled=False`` builds everything and stores nothing."""

    root: Path
    enabled: bool = True
    stats: dict[str, CacheStats] = field(default_factory=dict)
    store: JsonStore = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.store = JsonStore(self.root / STORE_FILE)

    def entry(self, kind: str, parts: Mapping[str, Any]) -> Path:
        """The folder of the entry ``parts`` would be stored in (it may not exist)."""
        return self.root / kind / content_key(kind, parts)

    def _record(self, kind: str, hit: bool, seconds: float, stored: float) -> None:
        st = self.stats.setdefault(kind, CacheStats())
        if hit:
            st.hits += 1
        else:
            st.misses += 1
            st.build_seconds += seconds
        st.stored_build_seconds += stored

    def _present(self, entry: Path) -> bool:
        return self.enabled and (entry / META_FILE).is_file()

    def _hit(self, kind: str, entry: Path) -> None:
        try:
            meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
            stored = float(meta.get("build_seconds", 0.0))
        except (OSError, ValueError, AttributeError):
            stored = 0.0
        self._record(kind, True, 0.0, stored)

    def _new_tmp(self, entry: Path) -> Path:
        """A new temporary folder beside ``entry``; WriteError when it cannot be made (a full disk, a
        read-only cache folder)."""
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            swept = (os.getpid(), entry.parent)
            if swept not in _SWEPT:
                _SWEPT.add(swept)
                _remove_stale_tmp(entry.parent)
            return Path(tempfile.mkdtemp(dir=entry.parent, prefix=f"{_TMP_PREFIX}{entry.name}."))
        except OSError as exc:
            raise WriteError(entry, exc) from exc

    def _publish(
        self, kind: str, entry: Path, tmp: Path, parts: Mapping[str, Any], data: str, seconds: float
    ) -> None:
        """Add the meta to the finished ``tmp`` folder and rename it to ``entry`` (removing it on failure)."""
        try:
            meta = {
                "kind": kind,
                "key": entry.name,
                "data": data,
                "parts": dict(parts),
                "build_seconds": seconds,
                "created": time.time(),
            }
            text = json.dumps(meta, default=str, ensure_ascii=False, indent=1)
            (tmp / META_FILE).write_text(text, encoding="utf-8")
            for attempt in range(2):
                try:
                    os.rename(tmp, entry)  # fails when entry exists (a non-empty folder)
                    break
                except OSError:
                    if (entry / META_FILE).is_file():
                        break  # another process published the same entry first; its content is the same
                    if attempt or not entry.exists():
                        raise
                    # a folder without meta was not written by this class (entries appear whole):
                    # a leftover of an older layout or of a manual edit, so replace it
                    shutil.rmtree(entry, ignore_errors=True)
        except OSError as exc:  # a full disk, a read-only cache folder
            raise WriteError(entry, exc) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # a no-op after a successful rename

    def _store(
        self,
        kind: str,
        entry: Path,
        parts: Mapping[str, Any],
        data: str,
        seconds: float,
        write: Callable[[Path], None],
    ) -> None:
        tmp = self._new_tmp(entry)
        try:
            write(tmp / data)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise WriteError(entry, exc) from exc
            raise
        self._publish(kind, entry, tmp, parts, data, seconds)

    def array(self, kind: str, parts: Mapping[str, Any], build: Callable[[], np.ndarray]) -> np.ndarray:
        """A numpy array, loaded from the cache or built and stored."""
        entry = self.entry(kind, parts)
        if self._present(entry):
            arr = np.asarray(np.load(entry / "data.npy", allow_pickle=False))
            self._hit(kind, entry)
            return arr
        t0 = time.perf_counter()
        arr = build()
        seconds = time.perf_counter() - t0
        if self.enabled:
            self._store_array(kind, entry, parts, arr, seconds)
        self._record(kind, False, seconds, seconds)
        return arr

    def _store_array(
        self, kind: str, entry: Path, parts: Mapping[str, Any], arr: np.ndarray, seconds: float
    ) -> None:
        """Store ``arr`` as the entry's ``data.npy``."""

        def write(path: Path) -> None:
            with path.open("wb") as f:
                np.save(f, arr, allow_pickle=False)

        self._store(kind, entry, parts, "data.npy", seconds, write)

    def matrix(
        self,
        kind: str,
        parts: Mapping[str, Any],
        shape: tuple[int, int],
        fill: Callable[[np.ndarray], None],
    ) -> np.ndarray:
        """A float32 ``shape`` matrix that ``fill(out)`` writes in place (batch by batch), stored as
        ``data.npy`` and returned memory-mapped read-only: a million embeddings are never held
        twice (no list of batches, no concatenation), and a hit reads only the pages it touches.

        Disabled, or for an empty matrix, ``out`` is an ordinary array kept in memory.
        """
        entry = self.entry(kind, parts)
        if self._present(entry):
            try:
                arr: np.ndarray | None = np.load(entry / "data.npy", mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError):
                arr = None
            if arr is not None and arr.shape == shape and arr.dtype == np.float32:
                self._hit(kind, entry)
                return arr
            self.discard(kind, parts)  # not the matrix asked for (a damaged entry): build it again
        t0 = time.perf_counter()
        if not self.enabled or 0 in shape:
            out = np.empty(shape, dtype=np.float32)
            fill(out)
            seconds = time.perf_counter() - t0
            if self.enabled:
                self._store_array(kind, entry, parts, out, seconds)
            self._record(kind, False, seconds, seconds)
            return out
        tmp = self._new_tmp(entry)
        try:
            mm = np.lib.format.open_memmap(tmp / "data.npy", mode="w+", dtype=np.float32, shape=shape)
            fill(mm)
            mm.flush()
            del mm
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.perf_counter() - t0
        self._publish(kind, entry, tmp, parts, "data.npy", seconds)
        self._record(kind, False, seconds, seconds)
        stored: np.ndarray = np.load(entry / "data.npy", mmap_mode="r", allow_pickle=False)
        return stored

    def json(self, kind: str, parts: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        """A JSON-serialisable value, loaded from the store (or an entry folder of the older layout)
        or built and stored."""
        key = content_key(kind, parts)
        if self.enabled:
            stored = self.store.get(key)
            if stored is None:
                stored = self._json_folder(kind, key, parts)
            if stored is not None:
                self._record(kind, True, 0.0, stored[1])
                return json.loads(stored[0])
        t0 = time.perf_counter()
        value = build()
        seconds = time.perf_counter() - t0
        if self.enabled:
            self.store.put(key, kind, json.dumps(value, ensure_ascii=False), _parts_json(parts), seconds)
        self._record(kind, False, seconds, seconds)
        return value

    def _json_folder(self, kind: str, key: str, parts: Mapping[str, Any]) -> tuple[str, float] | None:
        """An entry of the one-folder-per-entry layout, copied into the store (None: there is none)."""
        entry = self.root / kind / key
        if not (entry / META_FILE).is_file():
            return None
        try:
            text = (entry / "data.json").read_text(encoding="utf-8")
            json.loads(text)
        except (OSError, ValueError):
            return None  # not a whole entry: built again, into the store
        try:
            meta = json.loads((entry / META_FILE).read_text(encoding="utf-8"))
            seconds = float(meta.get("build_seconds", 0.0))
        except (OSError, ValueError, AttributeError, TypeError):
            seconds = 0.0
        self.store.put(key, kind, text, _parts_json(parts), seconds)
        return text, seconds

    def folder(self, kind: str, parts: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        """A folder written by ``build(folder)``; returns where it lives (a temporary one when disabled).

        ``build`` receives an existing empty folder.
        """
        entry = self.entry(kind, parts)
        if self._present(entry):
            self._hit(kind, entry)
            return entry / "data"
        if not self.enabled:  # a private temporary folder, removed when the process ends
            tmp = Path(tempfile.mkdtemp(prefix=f"rag_ablate_{kind}_"))
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
            t0 = time.perf_counter()
            try:
                build(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            seconds = time.perf_counter() - t0
            self._record(kind, False, seconds, seconds)
            return tmp
        tmp = self._new_tmp(entry)
        t0 = time.perf_counter()
        try:
            (tmp / "data").mkdir()
            build(tmp / "data")
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        seconds = time.perf_counter() - t0
        self._publish(kind, entry, tmp, parts, "data", seconds)
        self._record(kind, False, seconds, seconds)
        return entry / "data"

    def discard(self, kind: str, parts: Mapping[str, Any]) -> None:
        """Remove an entry its reader found unusable (another layout, damaged), so it is built again."""
        entry = self.entry(kind, parts)
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        if self.enabled:
            self.store.delete(entry.name)

    def metrics(self) -> dict[str, float]:
        """Per-kind hits, misses and build seconds, as run metrics."""
        out: dict[str, float] = {}
        for kind, st in sorted(self.stats.items()):
            out[f"run/cache_{kind}_hits"] = float(st.hits)
            out[f"run/cache_{kind}_misses"] = float(st.misses)
            out[f"run/cache_{kind}_build_seconds"] = st.build_seconds
        return out


def _parts_json(parts: Mapping[str, Any]) -> str:
    return json.dumps(dict(parts), default=str, ensure_ascii=False, sort_keys=True)


def _remove_stale_tmp(folder: Path) -> None:
    """Remove temporary folders that a killed process left behind (older than a day)."""
    now = time.time()
    for p in folder.glob(f"{_TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(p, ignore_errors=True)
