"""Fault injection (issue 23): careless and hostile attempts against the real tool, each classified.

    python benchmarks/fault_injection.py [--jobs 2] [--only NAME,...] [--keep DIR] [--write-results]

Every case of :data:`CATALOGUE` is one thing a careless or hostile user does: a bad config, a bad
dataset, a key passed the wrong way, personal data with redaction on, a dead, refusing, silent or
failing service, a read-only or full outputs folder, odd requests to ``rag-ablate serve``,
``compare`` / ``report`` / ``resume=`` on folders that are not what they should be. Each runs as a
user would (``python -m rag_ablate ...`` or ``rag-ablate ...`` in a subprocess, in a folder of its
own, or an HTTP request to a running ``rag-ablate serve``) and states what correct means: the exit
code (the HTTP status for ``serve``), what the terminal must say, the planted strings that must
appear nowhere, and for a run that succeeds, what its numbers must be. :func:`classify` sorts each
outcome:

* **clear error**: the expected non-zero exit, the project's one-line ``rag_ablate: error: ...``
  (``rag-ablate: error: ...``; for ``serve`` a JSON ``{"error": ...}``) naming what it must name;
* **ok**: a case that must succeed did, with right numbers;
* **traceback**: ``Traceback (most recent call last)`` in stdout or stderr (the server's log for
  ``serve``);
* **silent wrong**: exit 0 where the case must fail, or a success whose numbers are wrong (all
  queries failed, a value out of range accepted);
* **leak**: a planted canary key or planted personal data in any file under the case's
  ``outputs/`` (``mlflow.db`` and ``mlartifacts/`` included) or in the terminal;
* **hang**: the case ran past its time bound (killed);
* **unclear**: none of those, but not the expected exit code or message (e.g. Hydra's own
  multi-line error instead of the project's line).

A case can be more than one of the last five; it is clean when it is none of them. The script
prints one line per case and the counts, exits 1 when any case is not clean, and with
``--write-results`` replaces the "Fault injection" section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import http.server
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unicodedata
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "RESULTS.md"
TRACEBACK = "Traceback (most recent call last)"
ONE_LINE = re.compile(r"^rag[-_]ablate: error: \S", re.MULTILINE)

#: a key a careless user passes; it must reach no file and no terminal
CANARY = "sk-fi-canary-5e1d07b3c9a24f68"

# --------------------------------------------------------------------------- the tiny dataset

DOCS: list[dict[str, Any]] = [
    {"doc_id": "RET", "title": "Return policy",
     "text": "You can return most items within 30 days of delivery. Items must be unused and in the "
     "original packaging. Refunds go back to the original payment method within 5 business days."},
    {"doc_id": "SHIP", "title": "Shipping",
     "text": "Standard shipping takes 3 to 5 business days. Express shipping arrives the next day when "
     "ordered before noon. Shipping to remote islands can take two weeks."},
    {"doc_id": "WARR", "title": "Warranty",
     "text": "Electronics carry a one year warranty against manufacturing defects. Accidental damage "
     "such as drops or water is not covered. Send the device to the repair center with the receipt."},
    {"doc_id": "FEES", "title": "Return shipping fees",
     "text": "When an item is faulty we pay the return shipping. When you simply changed your mind the "
     "return shipping fee of 6 dollars is deducted from the refund."},
]  # fmt: skip


def _span(doc_id: str, quote: str) -> dict[str, Any]:
    text = next(d["text"] for d in DOCS if d["doc_id"] == doc_id)
    start = text.index(quote)
    return {"doc_id": doc_id, "start": start, "end": start + len(quote)}


QUERIES: list[dict[str, Any]] = [
    {"query_id": "q1", "query": "how many days do I have to return an item", "relevant": {"RET": 2},
     "evidence": [_span("RET", "You can return most items within 30 days of delivery.")],
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_returns"},
    {"query_id": "q2", "query": "who pays return shipping for a faulty item", "relevant": {"FEES": 2, "RET": 1},
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_returns"},
    {"query_id": "q3", "query": "how long does express shipping take", "relevant": {"SHIP": 2},
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_shipping"},
    {"query_id": "q4", "query": "is water damage covered by the warranty", "relevant": {"WARR": 2},
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_warranty"},
    {"query_id": "q5", "query": "do you ship to Mars", "answerable": False,
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_shipping"},
    {"query_id": "q6", "query": "hello there", "intent_l1": "CHITCHAT", "intent_l2": "C_greeting"},
    {"query_id": "q7", "query": "where is order 123456 it has been 4 days", "relevant": {"SHIP": 2},
     "group": "tpl_where", "intent_l1": "KNOWLEDGE", "intent_l2": "K_shipping"},
    {"query_id": "q8", "query": "where is order 998877 it has been 6 days", "relevant": {"SHIP": 2},
     "group": "tpl_where", "intent_l1": "KNOWLEDGE", "intent_l2": "K_shipping"},
]  # fmt: skip

INTENTS: list[dict[str, Any]] = [
    {"intent_l2": "K_returns", "intent_l1": "KNOWLEDGE", "description": "returns, refunds and return fees",
     "examples": ["can I send this back", "refund time"]},
    {"intent_l2": "K_shipping", "intent_l1": "KNOWLEDGE", "description": "delivery times and shipping",
     "examples": ["when will my parcel arrive", "delivery to my city"]},
    {"intent_l2": "K_warranty", "intent_l1": "KNOWLEDGE", "description": "warranty and repairs",
     "examples": ["repair my broken device", "is it under guarantee"]},
    {"intent_l2": "C_greeting", "intent_l1": "CHITCHAT", "description": "greetings and small talk",
     "examples": ["hi", "hello", "good morning"], "requires_rag": False},
]  # fmt: skip


def _cn_id(first17: str) -> str:
    """A Chinese national id with its GB 11643 check character."""
    weights = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]
    return first17 + "10X98765432"[sum(int(c) * w for c, w in zip(first17, weights, strict=True)) % 11]


#: personal data planted in documents and queries, as a careless corpus writes it (Chinese and English)
PERSONAL = {
    "mobile_fullwidth": "１５９１２３４５６７８",
    "mobile_dotted": "138.1234.5678",
    "email_fullwidth_idn": "zhang＠例子.中国",
    "email": "john.doe@example.com",
    "us_phone": "(415) 555-0100",
    "card_after_comma": "4111 1111 1111 1111",
    "cn_id_groups": "110105 19491231 " + _cn_id("11010519491231002")[-4:],
}
PII_DOCS = [
    {"doc_id": "CONTACT", "title": "联系我们",
     "text": f"退货请拨打{PERSONAL['mobile_fullwidth']}或{PERSONAL['mobile_dotted']}，邮件{PERSONAL['email_fullwidth_idn']}。"
     f"卡号,{PERSONAL['card_after_comma']}，身份证{PERSONAL['cn_id_groups']}。"},
    {"doc_id": "SUPPORT", "title": "Support",
     "text": f"Call support at {PERSONAL['us_phone']} or mail {PERSONAL['email']} about returns."},
]  # fmt: skip
PII_QUERIES = [
    {"query_id": "p1", "query": f"我的手机{PERSONAL['mobile_fullwidth']}，怎么退货", "relevant": {"CONTACT": 2},
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_returns"},
    {"query_id": "p2", "query": f"I am {PERSONAL['email']}, how do I return an item", "relevant": {"SUPPORT": 2},
     "intent_l1": "KNOWLEDGE", "intent_l2": "K_returns"},
]  # fmt: skip


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_dataset(
    folder: Path, docs: list[dict[str, Any]] | None = None, queries: list[dict[str, Any]] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl", DOCS if docs is None else docs)
    write_jsonl(folder / "queries.jsonl", QUERIES if queries is None else queries)
    write_jsonl(folder / "intents.jsonl", INTENTS)
    return folder


# --------------------------------------------------------------------------- the case and its outcome



@dataclass
class Outcome:
    """What an attempt did: its exit code (HTTP status for ``serve``; None when killed at the bound),
    its terminal, its time, where a planted string was found and, for a success, what is wrong."""

    code: int | None
    stdout: str
    stderr: str
    seconds: float = 0.0
    leaks: list[str] = field(default_factory=list)
    wrong: str | None = None


@dataclass(frozen=True)
class Case:
    """One attempt and what correct means for it.

    ``argv`` follows the program (``run``: ``python -m rag_ablate``; ``cli``: ``rag-ablate``;
    ``serve``: ``argv[0]`` names a request of :data:`REQUESTS` sent to the running
    ``rag-ablate serve``). Its ``{placeholders}`` are filled from :meth:`Env.fill` (``{data}``: the
    case's dataset folder; ``{case}``: the case's folder; ``{serve}``, ``{dead}``, ...: services)."""

    name: str
    kind: str  # the class of fault
    argv: tuple[str, ...]
    program: str = "run"
    exit: tuple[int, ...] = (2,)  # expected exit codes (HTTP statuses for serve); (0,) = must succeed
    shows: tuple[str, ...] = ()  # must appear in the terminal
    secrets: tuple[str, ...] = ()  # must appear in no file under outputs/ and not in the terminal
    setup: Callable[[Path, Env], None] | None = None  # prepares the folder (after the tiny dataset)
    check: Callable[[Path, Outcome], str | None] | None = None  # after exit 0: what is wrong, or None
    env: tuple[tuple[str, str], ...] = ()
    bound_s: float = 60.0
    message: str = r"^rag[-_]ablate: error: \S"  # the error line a failure must print
    owner: str = ""  # another branch fixing this class: listed, not fixed here


@dataclass
class Verdict:
    case: Case
    outcome: Outcome
    problems: list[str]  # of PROBLEMS
    status: str  # "clear error", "ok", "skipped" or the first problem
    why: str


PROBLEMS = ("traceback", "silent wrong", "leak", "hang", "unclear")


def classify(case: Case, outcome: Outcome) -> Verdict:
    """Sort one outcome: clean ("clear error", "ok") or its problems (:data:`PROBLEMS`)."""
    terminal = outcome.stdout + "\n" + outcome.stderr
    problems: list[str] = []
    why: list[str] = []
    if outcome.code is None:
        problems.append("hang")
        why.append(f"killed after {case.bound_s:.0f} s")
    if TRACEBACK in terminal:
        problems.append("traceback")
        why.append("traceback: " + _last_line(terminal))
    if outcome.leaks:
        problems.append("leak")
        places = [re.sub(r"[0-9a-f]{32}", "<run>", leak.split(": ")[0]) for leak in outcome.leaks]
        why.append(f"found in {len(places)} place(s): {', '.join(f'`{p}`' for p in sorted(set(places))[:4])}, ...")
    wrong = "exit 0, must fail" if outcome.code == 0 and 0 not in case.exit else outcome.wrong
    if outcome.code == 0 and wrong:
        problems.append("silent wrong")
        why.append(wrong)
    if outcome.code is not None and not problems:
        unclear = _unclear(case, outcome, terminal)
        if unclear:
            problems.append("unclear")
            why.append(unclear)
    if problems:
        return Verdict(case, outcome, problems, problems[0], "; ".join(why))
    return Verdict(case, outcome, [], "ok" if outcome.code == 0 else "clear error", f"exit {outcome.code}")


def _unclear(case: Case, outcome: Outcome, terminal: str) -> str | None:
    if outcome.code not in case.exit:
        return f"exit {outcome.code}, expected {'/'.join(map(str, case.exit))}: {_last_line(terminal)}"
    if outcome.code != 0:
        if case.program == "serve":
            with contextlib.suppress(ValueError):
                body = json.loads(outcome.stdout)
                if isinstance(body, dict) and "error" in body:
                    return None
            return f"HTTP {outcome.code} without a JSON error: {outcome.stdout[:120]!r}"
        if not re.search(case.message, terminal, re.MULTILINE):
            return f"no {case.message!r} line: {_last_line(terminal)}"
    missing = [s for s in case.shows if s not in terminal]
    return f"does not say {missing!r}: {_last_line(terminal)}" if missing else None


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "(nothing)")[:200]


# --------------------------------------------------------------------------- leaks


def forms(secret: str) -> set[str]:
    """The ways a planted string can be stored: as written, in NFKC, JSON-escaped, its digits alone."""
    nfkc = unicodedata.normalize("NFKC", secret)
    found = {secret, nfkc, json.dumps(secret)[1:-1], json.dumps(nfkc)[1:-1]}
    digits = re.sub(r"\D", "", nfkc)
    if len(digits) >= 7 and digits != nfkc:
        found.add(digits)
    return found


def find_leaks(folder: Path, terminal: str, secrets: tuple[str, ...]) -> list[str]:
    """Where any form of ``secrets`` occurs: files under ``folder`` (bytes, so ``mlflow.db`` too) and
    the terminal; each as ``path: secret``."""
    needles = {f: s for s in secrets for f in forms(s)}
    hits: list[str] = []
    for needle, secret in needles.items():
        if needle in terminal:
            hits.append(f"terminal: {secret}")
    if folder.is_dir():
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            with contextlib.suppress(OSError):
                data = path.read_bytes()
                hits += [f"{path.relative_to(folder)}: {s}" for n, s in needles.items() if n.encode() in data]
    return sorted(set(hits))


# --------------------------------------------------------------------------- services on 127.0.0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Fixed(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's ``status`` and ``body``."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, body = self.server.reply  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@dataclass
class Env:
    """The services and folders every case may use; ``fill`` puts them into a case's argv."""

    root: Path
    urls: dict[str, str] = field(default_factory=dict)
    serve_log: Path | None = None
    mounts: list[Path] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: list[Callable[[], None]] = field(default_factory=list)

    def fill(self, arg: str, folder: Path) -> str:
        hosts = {f"{k}_host": v.removeprefix("http://") for k, v in self.urls.items()}
        values = {**self.urls, **hosts, "data": str(folder / "data"), "case": str(folder)}
        return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), arg)

    def start(self, serve: bool) -> None:
        for name, reply in {"h500": (500, b'{"error": "boom"}'), "h403": (403, b'{"error": "no"}'),
                            "garbage": (200, b"<html>not json</html>")}.items():  # fmt: skip
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Fixed)
            server.reply = reply  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.urls[name] = f"http://127.0.0.1:{server.server_address[1]}"
            self._stop += [server.shutdown, server.server_close]
        silent = socket.create_server(("127.0.0.1", 0), backlog=256)  # connects, never answers
        self.urls["silent"] = f"http://127.0.0.1:{silent.getsockname()[1]}"
        self._stop.append(silent.close)
        closer = socket.create_server(("127.0.0.1", 0), backlog=256)  # accepts, hangs up at once
        self.urls["closer"] = f"http://127.0.0.1:{closer.getsockname()[1]}"
        threading.Thread(target=_hang_up, args=(closer,), daemon=True).start()
        self._stop.append(closer.close)
        self.urls["dead"] = f"http://127.0.0.1:{free_port()}"  # nothing listens
        if serve:
            self._start_serve()

    def _start_serve(self) -> None:
        data = write_dataset(self.root / "serve-data")
        port = free_port()
        self.serve_log = self.root / "serve.log"
        log = self.serve_log.open("w")
        proc = subprocess.Popen(
            [*program("cli"), "serve", "--port", str(port), f"dataset.path={data}", "progress=false"],
            cwd=self.root, env=child_env(()), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._stop += [lambda: _stop_group(proc), log.close]
        self.urls["serve"] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if http_request(self.urls["serve"], "GET", "/health", b"")[0] == 200:
                    return
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"rag-ablate serve did not come up: {self.serve_log.read_text()[-2000:]}")

    def stop(self) -> None:
        for stop in reversed(self._stop):
            with contextlib.suppress(Exception):
                stop()
        for mount in self.mounts:
            subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)

    def shared_sweep(self) -> Path:
        """A finished two-variant sweep on the tiny dataset (made once), for the cases that damage one."""
        with self._lock:
            home = self.root / "shared-sweep"
            if not home.is_dir():
                home.mkdir()
                data = write_dataset(home / "data")
                args = ["-m", "chunk=256,512", f"dataset.path={data}", *QUICK_SWEEP]
                done = subprocess.run([*program("run"), *args], cwd=home, env=child_env(()),
                                      capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
                if done.returncode != 0:
                    raise RuntimeError(f"the shared sweep failed: {done.stderr[-2000:]}")
            (sweep,) = (home / "outputs" / "multirun").iterdir()
            return sweep


def _hang_up(server: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            conn, _ = server.accept()
            conn.close()


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the process group (a run, a sweep and its workers, the server), SIGKILL after 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def http_request(base: str, method: str, path: str, body: bytes, *, chunked: bool = False) -> tuple[int, str]:
    """One request on a fresh connection; (status, body). ``chunked`` sends no Content-Length."""
    import http.client

    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        if chunked:
            conn.putrequest(method, path)
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            with contextlib.suppress(OSError):  # the server may answer 413 and close mid-body
                for i in range(0, len(body), 65536):
                    piece = body[i : i + 65536]
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


# --------------------------------------------------------------------------- running a case

QUICK_SWEEP = ("progress=false", "compare.B=200", "timing.interleave=false", "tracking.traces=none")


def program(name: str) -> list[str]:
    if name == "cli":
        found = shutil.which("rag-ablate")
        return [found] if found else [sys.executable, "-m", "rag_ablate.cli.main"]
    return [sys.executable, "-m", "rag_ablate"]


def child_env(extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The user's environment, with this checkout first on the path and no tracking or key variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAG_API", "FI_"))}
    env["PYTHONPATH"] = str(REPO)
    return {**env, **dict(extra)}


class Skip(Exception):
    """A case this machine cannot set up (e.g. a read-only mount without root)."""


def run_case(case: Case, env: Env, folder: Path) -> Verdict:
    folder.mkdir(parents=True)
    write_dataset(folder / "data")
    try:
        if case.setup is not None:
            case.setup(folder, env)
    except Skip as exc:
        return Verdict(case, Outcome(None, "", ""), [], "skipped", str(exc))
    args = [env.fill(a, folder) for a in case.argv]
    case = dataclasses.replace(case, shows=tuple(env.fill(s, folder) for s in case.shows))
    start = time.monotonic()
    if case.program == "serve":
        outcome = _send(env, args)
    else:
        outcome = _spawn([*program(case.program), *args], folder, case)
    outcome.seconds = time.monotonic() - start
    terminal = outcome.stdout + "\n" + outcome.stderr
    outcome.leaks = find_leaks(folder / "outputs", terminal, case.secrets)
    if outcome.code == 0 and case.check is not None:
        outcome.wrong = case.check(folder, outcome)
    return classify(case, outcome)


def _spawn(cmd: list[str], folder: Path, case: Case) -> Outcome:
    proc = subprocess.Popen(
        cmd, cwd=folder, env=child_env(case.env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, errors="replace", start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=case.bound_s)
        return Outcome(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        out, err = proc.communicate()
        return Outcome(None, out, err)


def _send(env: Env, args: list[str]) -> Outcome:
    assert env.serve_log is not None
    before = env.serve_log.stat().st_size
    kind = args[0]
    try:
        status, body = REQUESTS[kind](env.urls["serve"])
    except OSError as exc:
        status, body = 0, f"{type(exc).__name__}: {exc}"
    time.sleep(0.2)  # the server's log line
    with env.serve_log.open("rb") as log:
        log.seek(before)
        server_log = log.read().decode("utf-8", "replace")
    return Outcome(status, body, server_log)


def _eval(base: str, body: bytes, chunked: bool = False) -> tuple[int, str]:
    return http_request(base, "POST", "/rag/eval", body, chunked=chunked)


_BIG = b'{"query": "' + b"a" * 2_000_000 + b'", "query_id": "q1", "top_k": 5}'

#: the requests sent to ``rag-ablate serve``, by name
REQUESTS: dict[str, Callable[[str], tuple[int, str]]] = {
    "oversize": lambda base: _eval(base, _BIG),
    "oversize_chunked": lambda base: _eval(base, _BIG, chunked=True),
    "deep": lambda base: _eval(base, b'{"query": "x", "query_id": "q", "top_k": 5, "params": '
                                     + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "huge_number": lambda base: _eval(base, b'{"query": "x", "query_id": "q", "top_k": 1' + b"0" * 100_000 + b"}"),
    "nan": lambda base: _eval(base, b'{"query": "x", "query_id": "q", "top_k": NaN}'),
    "not_json": lambda base: _eval(base, b"\xff\xfe{query"),
    "wrong_type": lambda base: _eval(base, b'{"query": "x", "query_id": "q", "top_k": "3"}'),
    "chat_deep": lambda base: http_request(base, "POST", "/rag/chat", b"{" * 50_000),
}  # fmt: skip


# --------------------------------------------------------------------------- set-ups and checks


def dataset(
    docs: list[dict[str, Any]] | None = None, queries: list[dict[str, Any]] | None = None
) -> Callable[[Path, Env], None]:
    """Write the case's dataset with these documents and queries (the tiny ones by default)."""

    def setup(folder: Path, _env: Env) -> None:
        write_dataset(folder / "data", docs, queries)

    return setup


def raw(file: str, text: str) -> Callable[[Path, Env], None]:
    """Replace one file of the case's dataset with ``text`` as it is (bad JSON, empty files)."""

    def setup(folder: Path, _env: Env) -> None:
        (folder / "data" / file).write_text(text, encoding="utf-8")

    return setup


def missing(file: str) -> Callable[[Path, Env], None]:
    return lambda folder, _env: (folder / "data" / file).unlink()


def query(i: int, **changes: Any) -> list[dict[str, Any]]:
    """The tiny queries with query ``i`` changed."""
    return [{**q, **changes} if n == i else q for n, q in enumerate(QUERIES)]


def sweep_copy(damage: Callable[[Path], None] | None = None) -> Callable[[Path, Env], None]:
    """A copy of the shared finished sweep at ``{case}/sweep``, then ``damage`` done to it."""

    def setup(folder: Path, env: Env) -> None:
        shutil.copytree(env.shared_sweep(), folder / "sweep")
        if damage is not None:
            damage(folder / "sweep")

    return setup


def tmpfs(size: str, read_only: bool, with_sweep: bool = False) -> Callable[[Path, Env], None]:
    """A tmpfs of ``size`` at ``{case}/disk`` (root: permission bits do not stop root), optionally
    holding a copy of the shared sweep, remounted read-only when asked."""

    def setup(folder: Path, env: Env) -> None:
        disk = folder / "disk"
        disk.mkdir()
        if os.geteuid() != 0:
            if with_sweep:
                shutil.copytree(env.shared_sweep(), disk / "sweep")
            if read_only:
                for path in [disk, *disk.rglob("*")]:
                    path.chmod(0o555 if path.is_dir() else 0o444)
                return
            raise Skip("a full disk is a tmpfs: mounting one needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise Skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
        env.mounts.append(disk)
        if with_sweep:
            shutil.copytree(env.shared_sweep(), disk / "sweep")
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)

    return setup


def _metric_files(folder: Path) -> list[Path]:
    return sorted((folder / "outputs").glob("**/metrics.json"))


def numbers_right(folder: Path, outcome: Outcome) -> str | None:
    """A run that succeeded: every query answered, recall@5 a real share above 0."""
    files = _metric_files(folder)
    if not files:
        return "exit 0 but no metrics.json"
    for path in files:
        values = json.loads(path.read_text(encoding="utf-8"))
        if values.get("all/n_failed", 1) != 0:
            return f"{path.relative_to(folder)}: all/n_failed={values.get('all/n_failed')}"
        recall = values.get("all/recall_at_5")
        if not isinstance(recall, (int, float)) or not 0 < recall <= 1:
            return f"{path.relative_to(folder)}: all/recall_at_5={recall}"
    return None


def redacted(folder: Path, outcome: Outcome) -> str | None:
    """Numbers right, and the records say what was redacted."""
    wrong = numbers_right(folder, outcome)
    if wrong:
        return wrong
    total = 0
    for path in (folder / "outputs").glob("**/records.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            total += sum((json.loads(line).get("redacted") or {}).values())
    return None if total > 0 else "privacy.redact=true but no record says anything was redacted"


def no_raw_escape(folder: Path, outcome: Outcome) -> str | None:
    return "an escape sequence from the dataset printed raw" if "\x1b[" in outcome.stdout + outcome.stderr else None


def compared(folder: Path, outcome: Outcome) -> str | None:
    """``compare`` succeeded: comparison.json holds the variant against the baseline."""
    path = folder / "sweep" / "comparison.json"
    if not path.is_file():
        return "exit 0 but no comparison.json"
    return None if "chunk=256" in path.read_text(encoding="utf-8") else "comparison.json without chunk=256"


def garbled_run(folder: Path, _env: Env) -> None:
    (folder / "run" / ".hydra").mkdir(parents=True)
    (folder / "run" / ".hydra" / "overrides.yaml").write_text("- [unclosed\n", encoding="utf-8")


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _garble_records(sweep: Path) -> None:
    records = next(sweep.glob("*/records.jsonl"))
    lines = records.read_text(encoding="utf-8").splitlines()
    lines[1] = '{"query_id": "q2", "status": '
    records.write_text("\n".join(lines) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- the catalogue


def _config(name: str, *overrides: str, shows: str = "", exit: tuple[int, ...] = (2,)) -> Case:
    """A single run with ``overrides`` that must be refused naming ``shows`` (the setting)."""
    shown = (shows,) if shows else ()
    return Case(name, "config", ("dataset.path={data}", "progress=false", *overrides), shows=shown, exit=exit)


def _dataset_case(name: str, setup: Callable[[Path, Env], None], shows: str) -> Case:
    return Case(name, "dataset", ("dataset.path={data}", "progress=false"), setup=setup, shows=(shows,))


HTTP = ("system=http", "dataset.path={data}", "progress=false")
PII_DATA = dataset(DOCS + PII_DOCS, QUERIES + PII_QUERIES)
PII = tuple(PERSONAL.values())
BEARER = f"+system.headers.Authorization=Bearer {CANARY}"

CATALOGUE: list[Case] = [
    # a plain run: the control (it must succeed with right numbers)
    Case("control: a plain run", "control", ("dataset.path={data}", "progress=false"), exit=(0,),
         check=numbers_right),
    # ---- configs: unknown names, wrong types, empty sweep lists, non-ASCII
    _config("unknown group option", "retrieval=bm26", shows="bm26"),
    _config("unknown router", "router=nope", shows="nope"),
    _config("unknown bm25 method", "retrieval.bm25.method=foo", shows="retrieval.bm25.method"),
    _config("unknown key", "retrieval.bm25.k2=3", shows="retrieval.bm25.k2"),
    _config("unknown hybrid fusion", "retrieval=hybrid", "retrieval.hybrid.fusion=wieghted",
            shows="retrieval.hybrid.fusion"),
    _config("unknown dense index", "retrieval=dense", "retrieval.dense.index=faiss", shows="retrieval.dense.index"),
    _config("unknown traces value", "tracking.traces=some", shows="tracking.traces"),
    _config("text for a count", "retrieval.top_k=abc", shows="retrieval.top_k"),
    _config("fraction for a count", "chunk.size=1.5", shows="chunk.size"),
    _config("word for a boolean", "privacy.redact=sure", shows="privacy.redact"),
    _config("non-ASCII group option", "retrieval=检索", shows="retrieval"),
    _config("non-ASCII method, unquoted", "retrieval.bm25.method=日本", shows="retrieval.bm25.method"),
    _config("non-ASCII value, unquoted", "dataset.name=客服数据", shows="dataset.name='客服数据'"),
    Case("non-ASCII value, quoted (valid)", "config", ("dataset.path={data}", "dataset.name='客服数据'",
         "progress=false"), exit=(0,), check=numbers_right),
    Case("empty sweep list", "config", ("-m", "chunk=", "dataset.path={data}", "progress=false"), shows=("chunk",)),
    Case("empty sweep list of a setting", "config",
         ("-m", "retrieval.top_k=", "dataset.path={data}", "progress=false"), shows=("retrieval.top_k",)),
    # ---- out-of-range values, one per numeric factor
    _config("bm25 k1 negative", "retrieval.bm25.k1=-1", shows="retrieval.bm25.k1"),
    _config("bm25 b above 1", "retrieval.bm25.b=5", shows="retrieval.bm25.b"),
    _config("rrf_k negative", "retrieval=hybrid", "retrieval.hybrid.rrf_k=-60", shows="retrieval.hybrid.rrf_k"),
    _config("fusion weight above 1", "retrieval=hybrid", "retrieval.hybrid.weight=1.5",
            shows="retrieval.hybrid.weight"),
    _config("fusion depth 0", "retrieval=hybrid", "retrieval.hybrid.depth_dense=0",
            shows="retrieval.hybrid.depth_dense"),
    _config("router ngram 0", "router=nearest", "router.ngram=0", shows="router.ngram"),
    _config("router ngram negative", "router.ngram=-2", shows="router.ngram"),
    _config("top_k 0", "retrieval.top_k=0", shows="retrieval.top_k"),
    _config("chunk size 0", "chunk.size=0", shows="chunk.size"),
    _config("overlap over chunk size", "chunk.overlap=600", shows="chunk.overlap"),
    _config("holdout share above 1", "dataset.holdout_share=1.5", shows="dataset.holdout_share"),
    _config("cut-off 0", "metrics.ks=[0]", shows="metrics.ks"),
    _config("rerank candidates 0", "rerank.candidates=0", shows="rerank.candidates"),
    _config("NaN weight", "retrieval=hybrid", "retrieval.hybrid.weight=nan", shows="retrieval.hybrid.weight"),
    _config("http concurrency 0", *HTTP[:1], "system.base_url={serve}", "system.concurrency=0",
            shows="system.concurrency"),
    _config("http error budget above 1", *HTTP[:1], "system.base_url={serve}", "system.max_error_rate=1.5",
            shows="system.max_error_rate"),
    Case("sweep with an out-of-range level", "config",
         ("-m", "retrieval.bm25.k1=1.2,-1", "dataset.path={data}", *QUICK_SWEEP), shows=("retrieval.bm25.k1",)),
    Case("sweep with too few resamples", "config",
         ("-m", "chunk=256,512", "compare.B=5", "dataset.path={data}", *QUICK_SWEEP[:1]), shows=("compare.B",)),
    # ---- datasets
    Case("missing dataset folder", "dataset", ("dataset.path={case}/nowhere", "progress=false"),
         shows=("nowhere",)),
    _dataset_case("missing queries.jsonl", missing("queries.jsonl"), "queries.jsonl"),
    _dataset_case("bad JSON on line 3", raw("queries.jsonl", "".join(
        json.dumps(q) + "\n" if i != 2 else '{"query_id": "q3", "query": \n' for i, q in enumerate(QUERIES))),
        "queries.jsonl:3"),
    _dataset_case("query id with a space", dataset(queries=query(0, query_id="q 1")), "queries.jsonl:1"),
    _dataset_case("query id with NUL", dataset(queries=query(1, query_id="q\x002")), "queries.jsonl:2"),
    _dataset_case("query id with an escape", dataset(queries=query(2, query_id="q\x1b[31m3")), "queries.jsonl:3"),
    _dataset_case("doc id with a tab", dataset(docs=[{**DOCS[0], "doc_id": "R\tET"}, *DOCS[1:]]),
                  "corpus.jsonl:1"),
    _dataset_case("duplicate query ids", dataset(queries=query(3, query_id="q1")), "q1"),
    _dataset_case("duplicate doc ids", dataset(docs=[*DOCS, DOCS[0]]), "RET"),
    _dataset_case("span outside its document", dataset(queries=query(
        0, evidence=[{"doc_id": "RET", "start": 150, "end": 900}])), "queries.jsonl:1"),
    _dataset_case("relevant doc not in corpus", dataset(queries=query(2, relevant={"NOPE": 2})), "NOPE"),
    _dataset_case("empty corpus.jsonl", raw("corpus.jsonl", ""), "corpus.jsonl"),
    _dataset_case("empty queries.jsonl", raw("queries.jsonl", ""), "queries.jsonl"),
    Case("validate: bad JSON", "dataset", ("validate", "{data}"), program="cli", exit=(1, 2),
         setup=raw("queries.jsonl", json.dumps(QUERIES[0]) + "\n{oops\n"), shows=("queries.jsonl:2",),
         message=r"^(rag-ablate: error: |invalid dataset: )"),
    Case("validate: NUL in an id", "dataset", ("validate", "{data}"), program="cli", exit=(1, 2),
         setup=dataset(queries=query(1, query_id="q\x002")), shows=("queries.jsonl:2",),
         message=r"^(rag-ablate: error: |invalid dataset: )"),
    Case("validate: escape sequences in text", "dataset", ("validate", "{data}"), program="cli", exit=(0,),
         setup=dataset(queries=query(5, query="hello \x1b[2J\x1b[31mthere")), check=no_raw_escape),
    # ---- secrets passed each careless way (canary must be nowhere)
    Case("key from an env var", "secrets", (*HTTP, "system.base_url={serve}",
         "+system.headers.Authorization=Bearer ${oc.env:RAG_API_KEY}"), exit=(0,), secrets=(CANARY,),
         env=(("RAG_API_KEY", CANARY),), check=numbers_right),
    Case("key in URL userinfo", "secrets", (*HTTP, f"system.base_url=http://fi:{CANARY}@{{serve_host}}"),
         exit=(0,), secrets=(CANARY,), check=numbers_right),
    Case("literal Authorization header", "secrets", (*HTTP, "system.base_url={serve}", BEARER), exit=(0,),
         secrets=(CANARY,), check=numbers_right),
    Case("literal header, other name", "secrets", (*HTTP, "system.base_url={serve}",
         f"+system.headers.X-Api={CANARY}"), exit=(0,), secrets=(CANARY,), check=numbers_right),
    Case("key in body template, secret name", "secrets", (*HTTP, "system.base_url={serve}",
         '+system.body.query="{query}"', '+system.body.query_id="{query_id}"', '+system.body.top_k="{top_k}"',
         f"+system.body.api_key={CANARY}"), exit=(0,), secrets=(CANARY,), check=numbers_right),
    Case("key in body template, plain name", "secrets", (*HTTP, "system.base_url={serve}",
         '+system.body.query="{query}"', '+system.body.query_id="{query_id}"', '+system.body.top_k="{top_k}"',
         f"+system.body.extra.v={CANARY}"), exit=(0,), secrets=(CANARY,), check=numbers_right,
         owner="deadline2"),
    Case("misspelt headers setting", "secrets", (*HTTP, "system.base_url={serve}",
         f"+system.header.X-Token={CANARY}"), secrets=(CANARY,)),
    Case("misspelt generator key setting", "secrets", ("dataset.path={data}", "progress=false",
         "generator=openai", f"generator.api_kye={CANARY}"), secrets=(CANARY,), shows=("generator.api_kye",)),
    Case("key in generator URL, endpoint down", "secrets", ("dataset.path={data}", "progress=false",
         "generator=openai", f"generator.base_url=http://fi:{CANARY}@{{dead_host}}/v1"), exit=(1,),
         secrets=(CANARY,)),
    Case("key in tracking URI, server down", "secrets", ("dataset.path={data}", "progress=false",
         "tracking=server", f"tracking.uri=http://fi:{CANARY}@{{dead_host}}"), secrets=(CANARY,)),
    Case("literal header in a sweep", "secrets", ("-m", "chunk=256,512", *HTTP, "system.base_url={serve}",
         BEARER, *QUICK_SWEEP[1:]), exit=(0,), secrets=(CANARY,), check=numbers_right, bound_s=120),
    # ---- personal data with redaction on (the cache kept outside outputs/, as README says)
    Case("personal data, redact=true", "privacy", ("dataset.path={data}", "progress=false", "privacy.redact=true",
         "cache.dir={case}/cache"), exit=(0,), setup=PII_DATA, secrets=PII, check=redacted),
    Case("personal data, redact=true, a sweep", "privacy", ("-m", "chunk=256,512", "dataset.path={data}",
         "privacy.redact=true", "cache.dir={case}/cache", *QUICK_SWEEP[:3]), exit=(0,), setup=PII_DATA,
         secrets=PII, check=redacted, bound_s=120),
    Case("personal data, store_text=false", "privacy", ("dataset.path={data}", "progress=false",
         "privacy.store_text=false", "cache.dir={case}/cache"), exit=(0,), setup=PII_DATA,
         secrets=(*PII, PII_QUERIES[0]["query"]), check=numbers_right),
    # ---- unset environment variables
    Case("${oc.env:UNSET} in a header", "env", (*HTTP, "system.base_url={serve}",
         "+system.headers.Authorization=Bearer ${oc.env:FI_UNSET_KEY}"), shows=("FI_UNSET_KEY",)),
    Case("${oc.env:UNSET} as the dataset", "env", ("dataset.path=${oc.env:FI_UNSET_DATA}", "progress=false"),
         shows=("FI_UNSET_DATA",)),
    # ---- outputs folders
    Case("read-only outputs: a run", "disk", ("dataset.path={data}", "progress=false",
         "paths.output_root={case}/disk/outputs"), setup=tmpfs("16m", True), shows=("disk",)),
    Case("read-only outputs: a sweep", "disk", ("-m", "chunk=256,512", "dataset.path={data}",
         "paths.output_root={case}/disk/outputs", *QUICK_SWEEP), setup=tmpfs("16m", True), shows=("disk",)),
    Case("read-only folder: compare", "disk", ("compare", "{case}/disk/sweep", "--B", "200"), program="cli",
         exit=(1, 2), setup=tmpfs("64m", True, with_sweep=True), shows=("disk/sweep",)),
    Case("read-only folder: report", "disk", ("report", "{case}/disk/sweep", "--B", "200"), program="cli",
         exit=(1, 2), setup=tmpfs("64m", True, with_sweep=True), shows=("disk/sweep",)),
    Case("full disk (1 MB)", "disk", ("dataset.path={data}", "progress=false",
         "paths.output_root={case}/disk/outputs"), exit=(1, 2), setup=tmpfs("1m", False), shows=("disk",)),
    # ---- tracking server and HTTP services
    Case("dead tracking server", "tracking", ("dataset.path={data}", "progress=false", "tracking=server",
         "tracking.uri={dead}"), shows=("{dead}",)),
    Case("service down", "http", (*HTTP, "system.base_url={dead}"), exit=(1,), shows=("{dead}",)),
    Case("service hangs up at once", "http", (*HTTP, "system.base_url={closer}"), exit=(1,), shows=("{closer}",),
         bound_s=120),
    Case("service answers 500", "http", (*HTTP, "system.base_url={h500}"), exit=(1,), bound_s=120),
    Case("service answers 403", "http", (*HTTP, "system.base_url={h403}"), exit=(1,)),
    Case("service answers HTML", "http", (*HTTP, "system.base_url={garbage}"), exit=(1,)),
    Case("service silent", "http", (*HTTP, "system.base_url={silent}"), exit=(1,), bound_s=150, owner="deadline2"),
    # ---- serve under odd requests
    *[Case(f"serve: {kind}", "serve", (kind,), program="serve", exit=codes)
      for kind, codes in {"oversize": (413,), "oversize_chunked": (413,), "deep": (400,), "huge_number": (400,),
                          "nan": (400,), "not_json": (400,), "wrong_type": (422,), "chat_deep": (400,)}.items()],
    Case("serve: a sweep list", "serve", ("serve", "chunk=256,512", "dataset.path={data}"), program="cli",
         shows=("chunk",)),
    # ---- compare / report / resume= on folders that are not what they should be
    Case("compare: missing folder", "sweep folder", ("compare", "{case}/nowhere"), program="cli",
         shows=("nowhere",)),
    Case("report: missing folder", "sweep folder", ("report", "{case}/nowhere"), program="cli", shows=("nowhere",)),
    Case("report: empty folder", "sweep folder", ("report", "{case}/data"), program="cli", exit=(1, 2),
         shows=("comparison.json",)),
    Case("report: comparison.json cut", "sweep folder", ("report", "{case}/sweep"), program="cli", exit=(1, 2),
         setup=sweep_copy(lambda s: _truncate(s / "comparison.json", 500)), shows=("comparison.json",)),
    Case("compare: records.jsonl garbled", "sweep folder", ("compare", "{case}/sweep", "--B", "200"),
         program="cli", exit=(1, 2), setup=sweep_copy(_garble_records), shows=("records.jsonl",)),
    Case("compare: plan.json gone (the jobs suffice)", "sweep folder", ("compare", "{case}/sweep", "--B", "200"),
         program="cli", exit=(0,), setup=sweep_copy(lambda s: (s / "plan.json").unlink()), check=compared),
    Case("resume= of a missing folder", "resume", ("resume={case}/nowhere",), shows=("nowhere",)),
    Case("resume= of a run with a garbled overrides.yaml", "resume", ("resume={case}/run",), setup=garbled_run,
         shows=("overrides.yaml",)),
    Case("resume= of a sweep with plan.json cut", "resume", ("resume={case}/sweep",), exit=(1, 2),
         setup=sweep_copy(lambda s: _truncate(s / "plan.json", 40)), shows=("plan.json",)),
]  # fmt: skip


# --------------------------------------------------------------------------- the run and its counts


def run_all(cases: list[Case], root: Path, jobs: int, say: Callable[[str], None] = print) -> list[Verdict]:
    """Every case in its own folder under ``root``, ``jobs`` at a time; the verdicts in catalogue order."""
    env = Env(root)
    try:
        env.start(serve=any(c.program == "serve" or "{serve}" in " ".join(c.argv) for c in cases))

        def one(item: tuple[int, Case]) -> Verdict:
            i, case = item
            slug = re.sub(r"[^a-z0-9]+", "-", case.name.lower()).strip("-")
            verdict = run_case(case, env, root / f"{i:03d}-{slug}")
            mark = "  " if verdict.status in ("ok", "clear error", "skipped") else "!!"
            say(f"{mark} {i:3d} {verdict.status:<12} {verdict.outcome.seconds:6.1f}s  {case.kind:<12} "
                f"{case.name}: {verdict.why[:220]}")  # fmt: skip
            return verdict

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(one, enumerate(cases)))
    finally:
        env.stop()


def counts(verdicts: list[Verdict]) -> dict[str, int]:
    done = [v for v in verdicts if v.status != "skipped"]
    found = {
        "attempts": len(done),
        "clear errors": sum(v.status == "clear error" for v in done),
        "correct successes": sum(v.status == "ok" for v in done),
    }
    for problem in PROBLEMS:
        found[problem + ("s" if problem in ("traceback", "leak", "hang") else "")] = sum(
            problem in v.problems for v in done
        )
    found["skipped"] = len(verdicts) - len(done)
    return found


def command_of(verdict: Verdict) -> str:
    case = verdict.case
    if case.program == "serve":
        return f"POST /rag/eval to rag-ablate serve ({case.argv[0]} body, see REQUESTS)"
    head = "rag-ablate" if case.program == "cli" else "python -m rag_ablate"
    env = " ".join(f"{k}=..." for k, _ in case.env)
    return " ".join(x for x in (env, head, " ".join(_quote(a) for a in case.argv)) if x)


def _quote(arg: str) -> str:
    return f"'{arg}'" if re.search(r"[\s${}\"]", arg) else arg


def markdown(verdicts: list[Verdict], seconds: float, command: str) -> str:
    found = counts(verdicts)
    kinds = list(dict.fromkeys(v.case.kind for v in verdicts))
    intro = (
        f"`{command}` ({datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; {seconds:.0f} s "
        "wall, shared with other processes): a fixed catalogue of careless and hostile attempts, each run "
        "as a user would in a folder of its own (subprocesses, tiny servers on 127.0.0.1, requests to "
        "`rag-ablate serve`), each with what correct means (exit code, what the terminal must say, planted "
        "keys and personal data that must be in no file under `outputs/`, `mlflow.db` included, nor the "
        "terminal). The classes and the classifier: `benchmarks/fault_injection.py`; a subset runs in "
        "`tests/test_fault_injection.py`. Clean: a clear error (the expected exit code and the one-line "
        "`rag_ablate: error: ...` naming the setting, file or path) or a correct success."
    )
    lines = [
        "## Fault injection (issue 23)",
        "",
        textwrap.fill(intro, width=100, break_on_hyphens=False, break_long_words=False),
        "",
        "| attempts | clear errors | correct successes | tracebacks | silent wrong | leaks | hangs | unclear |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| " + " | ".join(str(found[k]) for k in ("attempts", "clear errors", "correct successes", "tracebacks",
                                                  "silent wrong", "leaks", "hangs", "unclear")) + " |",
        "",
        "| class | attempts | clean | not clean |",
        "|---|---:|---:|---:|",
    ]  # fmt: skip
    for kind in kinds:
        mine = [v for v in verdicts if v.case.kind == kind and v.status != "skipped"]
        bad = sum(bool(v.problems) for v in mine)
        lines.append(f"| {kind} | {len(mine)} | {len(mine) - bad} | {bad} |")
    not_clean = [v for v in verdicts if v.problems]
    if not_clean:
        lines += ["", "Not clean:", ""]
        for v in not_clean:
            owner = f" (branch {v.case.owner})" if v.case.owner else ""
            why = v.why.replace("|", "/")[:300]
            lines.append(f"* {v.case.name}{owner}: {', '.join(v.problems)}, {why}: `{command_of(v)}`")
    skipped = [v for v in verdicts if v.status == "skipped"]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{v.case.name} ({v.why})" for v in skipped)]
    return "\n".join(lines) + "\n"


def write_results(section: str, path: Path = RESULTS) -> None:
    """Put ``section`` in place of the old "Fault injection" section of RESULTS.md, or at its end."""
    text = path.read_text(encoding="utf-8")
    start = text.find("\n## Fault injection")
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[: start + 1] + section + (text[end:] if end != -1 else "")
    path.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2, help="cases at a time (default 2; the machine has 2 cores)")
    parser.add_argument("--only", default="", help="comma-separated parts of case names to run")
    parser.add_argument("--keep", type=Path, help="run the cases in this folder and keep it")
    parser.add_argument("--write-results", action="store_true", help="write the counts into benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    cases = [c for c in CATALOGUE if not wanted or any(w in c.name.lower() for w in wanted)]
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=False)
            root = args.keep.resolve()
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rag-ablate-faults-")))
        start = time.monotonic()
        verdicts = run_all(cases, root, max(1, min(args.jobs, 2)))
        seconds = time.monotonic() - start
    section = markdown(verdicts, seconds, "python benchmarks/fault_injection.py" + (" --write-results" if
                                                                                    args.write_results else ""))
    print("\n" + section)
    if args.write_results:
        write_results(section)
    return 1 if any(v.problems for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
