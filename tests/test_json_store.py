"""Cache.json's entries live in one SQLite store (core/cache.py ``JsonStore``): whole rows only,
several threads and processes writing at once, entries of the one-folder-per-entry layout still hit."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from rag_ablate.core.cache import META_FILE, STORE_FILE, Cache, content_key
from rag_ablate.core.errors import WriteError
from tests.conftest import REPO


def rows(root: Path) -> dict[str, tuple[str, Any, Any]]:
    """The store's rows by key: (kind, value, parts)."""
    with contextlib.closing(sqlite3.connect(root / STORE_FILE)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        got = db.execute("SELECT key, kind, value, parts FROM entries").fetchall()
    return {k: (kind, json.loads(v), json.loads(p)) for k, kind, v, p in got}


def test_threads_writing_the_same_and_different_keys(tmp_path: Path) -> None:
    cache = Cache(tmp_path)  # one Cache shared by the threads (a judge's pool), and a second one
    other = Cache(tmp_path)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            target = cache if t % 2 else other
            barrier.wait(timeout=30)
            for i in range(60):
                # even i: a key every thread builds (the same value), odd i: this thread's own
                parts = {"i": i} if i % 2 == 0 else {"i": i, "thread": t}
                got = target.json("llm_calls", parts, lambda parts=parts: {"answer": parts, "n": [1.5, None]})
                assert got == {"answer": parts, "n": [1.5, None]}
        except BaseException as exc:  # a failed assertion in a thread must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    stored = rows(tmp_path)
    expected = [{"i": i} for i in range(0, 60, 2)] + [
        {"i": i, "thread": t} for i in range(1, 60, 2) for t in range(8)
    ]
    assert len(stored) == len(expected) == 30 + 30 * 8  # one row per key, however many threads built it
    for parts in expected:
        assert stored[content_key("llm_calls", parts)] == (
            "llm_calls",
            {"answer": parts, "n": [1.5, None]},
            parts,
        )
    calls = sum(st.hits + st.misses for c in (cache, other) for st in c.stats.values())
    assert calls == 8 * 60
    # a rerun (a new Cache: a new process) replays every entry without building
    rerun = Cache(tmp_path)
    for parts in expected:
        assert rerun.json("llm_calls", parts, lambda: pytest.fail("built again")) == {
            "answer": parts,
            "n": [1.5, None],
        }
    assert rerun.stats["llm_calls"].hits == len(expected)


def test_entries_of_the_folder_layout_still_hit(tmp_path: Path) -> None:
    parts = {"endpoint": "http://x/v1/chat/completions", "repeat": 0}
    key = content_key("llm_calls", parts)
    entry = tmp_path / "llm_calls" / key  # as the one-folder-per-entry layout wrote it
    entry.mkdir(parents=True)
    (entry / "data.json").write_text(json.dumps({"text": "Returns: 30 days.", "total_ms": 812.0}), "utf-8")
    meta = {"kind": "llm_calls", "key": key, "data": "data.json", "parts": parts, "build_seconds": 0.8}
    (entry / META_FILE).write_text(json.dumps(meta, indent=1), "utf-8")
    # a folder without its meta was never a whole entry: not a hit
    half = tmp_path / "llm_calls" / content_key("llm_calls", {"repeat": 1})
    half.mkdir()
    (half / "data.json").write_text("{}", "utf-8")

    cache = Cache(tmp_path)
    assert cache.json("llm_calls", parts, lambda: pytest.fail("built again")) == {
        "text": "Returns: 30 days.",
        "total_ms": 812.0,
    }
    assert cache.stats["llm_calls"].hits == 1 and cache.stats["llm_calls"].stored_build_seconds == 0.8
    assert cache.json("llm_calls", {"repeat": 1}, lambda: {"text": "new"}) == {"text": "new"}
    assert cache.stats["llm_calls"].misses == 1
    # copied into the store on its first hit; the folder is left as it was
    assert rows(tmp_path)[key] == ("llm_calls", {"text": "Returns: 30 days.", "total_ms": 812.0}, parts)
    assert (entry / "data.json").is_file()


def test_a_disabled_cache_writes_nothing_and_a_damaged_store_names_its_file(tmp_path: Path) -> None:
    off = Cache(tmp_path / "off", enabled=False)
    assert [off.json("llm_calls", {"a": 1}, lambda: [1]) for _ in range(2)] == [[1], [1]]
    assert off.stats["llm_calls"].misses == 2 and not (tmp_path / "off").exists()

    (tmp_path / STORE_FILE).write_bytes(b"not a database, a leftover of something else" * 100)
    with pytest.raises(WriteError, match=rf"cannot write .*{STORE_FILE}: file is not a database"):
        Cache(tmp_path).json("llm_calls", {"a": 1}, lambda: [1])


WRITER = """
import sys
from pathlib import Path
from rag_ablate.core.cache import Cache
cache = Cache(Path(sys.argv[1]))
for i in range(1_000_000):
    cache.json("llm_calls", {"i": i}, lambda: {"i": i, "text": "x" * (i % 5000)})
    print(i, flush=True)
"""


@pytest.mark.slow
def test_a_process_killed_mid_write_leaves_whole_entries(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # killed while it writes, after 300 committed entries
        if int(line) >= 300:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()
    stored = rows(tmp_path)  # the file is a sound database
    assert len(stored) >= 301
    for key, (kind, value, parts) in stored.items():  # every row whole: its value is the one built
        assert kind == "llm_calls"
        i = parts["i"]
        assert key == content_key("llm_calls", {"i": i}) and value == {"i": i, "text": "x" * (i % 5000)}
    assert sorted(p["i"] for _, _, p in stored.values()) == list(range(len(stored)))  # in order, no gap
    # a rerun hits what was committed and stores what was not
    cache = Cache(tmp_path)
    for i in range(len(stored) + 5):
        cache.json("llm_calls", {"i": i}, lambda i=i: {"i": i, "text": "x" * (i % 5000)})
    assert cache.stats["llm_calls"].hits == len(stored) and cache.stats["llm_calls"].misses == 5
