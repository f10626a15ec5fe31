"""Content-addressed caches shared across variants and processes.

A chunked corpus, a BM25 index and an embedding matrix are each computed once per
distinct input and reused by every variant that needs the same thing: the key
is a hash of exactly what the artefact depends on (corpus fingerprint, chunk
settings, analyzer or model id and version). Writes are atomic (written under a
temporary name, then renamed), so parallel jobs never read a half-written entry;
when two jobs build the same entry at once, both results are identical and the
second rename simply wins.

Layout: ``<root>/<kind>/<key>.<ext>`` plus ``<key>.meta.json`` holding the key's
parts and the build time, for a person who wonders what an entry is.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def content_key(kind: str, parts: Mapping[str, Any]) -> str:
    """A stable hash of everything an artefact depends on."""
    payload = json.dumps({"kind": kind, **parts}, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


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

    def _paths(self, kind: str, key: str, ext: str) -> tuple[Path, Path]:
        folder = self.root / kind
        return folder / f"{key}{ext}", folder / f"{key}.meta.json"

    def _record(self, kind: str, hit: bool, seconds: float, stored: float) -> None:
        st = self.stats.setdefault(kind, CacheStats())
        if hit:
            st.hits += 1
        else:
            st.misses += 1
            st.build_seconds += seconds
        st.stored_build_seconds += stored

    def _write_meta(self, meta: Path, parts: Mapping[str, Any], seconds: float) -> None:
        _atomic_write_bytes(
            meta,
            json.dumps(
                {"parts": dict(parts), "build_seconds": seconds, "created": time.time()},
                default=str,
                ensure_ascii=False,
                indent=1,
            ).encode("utf-8"),
        )

    def _stored_seconds(self, meta: Path) -> float:
        try:
            return float(json.loads(meta.read_text(encoding="utf-8")).get("build_seconds", 0.0))
        except (OSError, ValueError):
            return 0.0

    def array(self, kind: str, parts: Mapping[str, Any], build: Callable[[], np.ndarray]) -> np.ndarray:
        """A numpy array, loaded from the cache or built and stored."""
        key = content_key(kind, parts)
        path, meta = self._paths(kind, key, ".npy")
        if self.enabled and path.is_file():
            arr = np.asarray(np.load(path, allow_pickle=False))
            self._record(kind, True, 0.0, self._stored_seconds(meta))
            return arr
        t0 = time.perf_counter()
        arr = build()
        seconds = time.perf_counter() - t0
        if self.enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".npy")
            with os.fdopen(fd, "wb") as f:
                np.save(f, arr, allow_pickle=False)
            os.replace(tmp, path)
            self._write_meta(meta, parts, seconds)
        self._record(kind, False, seconds, seconds)
        return arr

    def json(self, kind: str, parts: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        """A JSON-serialisable value, loaded from the cache or built and stored."""
        key = content_key(kind, parts)
        path, meta = self._paths(kind, key, ".json")
        if self.enabled and path.is_file():
            value = json.loads(path.read_text(encoding="utf-8"))
            self._record(kind, True, 0.0, self._stored_seconds(meta))
            return value
        t0 = time.perf_counter()
        value = build()
        seconds = time.perf_counter() - t0
        if self.enabled:
            _atomic_write_bytes(path, json.dumps(value, ensure_ascii=False).encode("utf-8"))
            self._write_meta(meta, parts, seconds)
        self._record(kind, False, seconds, seconds)
        return value

    def folder(self, kind: str, parts: Mapping[str, Any], build: Callable[[Path], None]) -> Path:
        """A folder written by ``build(folder)``; returns where it lives (a temporary one when disabled)."""
        key = content_key(kind, parts)
        path, meta = self._paths(kind, key, "")
        if self.enabled and path.is_dir():
            self._record(kind, True, 0.0, self._stored_seconds(meta))
            return path
        if self.enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{key}."))
        else:  # a private temporary folder, removed when the process ends
            tmp = Path(tempfile.mkdtemp(prefix=f"rag_ablate_{kind}_"))
            atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        t0 = time.perf_counter()
        build(tmp)
        seconds = time.perf_counter() - t0
        self._record(kind, False, seconds, seconds)
        if not self.enabled:
            return tmp
        try:
            os.rename(tmp, path)
        except OSError:  # built meanwhile by another job: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
        self._write_meta(meta, parts, seconds)
        return path

    def metrics(self) -> dict[str, float]:
        """Per-kind hits, misses and build seconds, as run metrics."""
        out: dict[str, float] = {}
        for kind, st in sorted(self.stats.items()):
            out[f"run/cache_{kind}_hits"] = float(st.hits)
            out[f"run/cache_{kind}_misses"] = float(st.misses)
            out[f"run/cache_{kind}_build_seconds"] = st.build_seconds
        return out


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
