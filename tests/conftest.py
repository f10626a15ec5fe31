"""Shared fixtures: a tiny English dataset written to a temporary folder, the README's sweep run once
per session, servers and a browser; and the suite's own scheduling (see ``pytest_collection_modifyitems``)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_llm import FakeLLM
from tests.fake_llm import serve as serve_fake_llm

DOCS: list[dict[str, Any]] = [
    {
        "doc_id": "RET",
        "title": "Return policy",
        "text": "You can return most items within 30 days of delivery. Items must be unused and in the "
        "original packaging. Refunds go back to the original payment method within 5 business days.",
    },
    {
        "doc_id": "SHIP",
        "title": "Shipping",
        "text": "Standard shipping takes 3 to 5 business days. Express shipping arrives the next day when "
        "ordered before noon. Shipping to remote islands can take two weeks.",
    },
    {
        "doc_id": "WARR",
        "title": "Warranty",
        "text": "Electronics carry a one year warranty against manufacturing defects. Accidental damage "
        "such as drops or water is not covered. Send the device to the repair center with the receipt.",
    },
    {
        "doc_id": "FEES",
        "title": "Return shipping fees",
        "text": "When an item is faulty we pay the return shipping. When you simply changed your mind the "
        "return shipping fee of 6 dollars is deducted from the refund.",
    },
]


def _span(doc_id: str, quote: str) -> dict[str, Any]:
    text = next(d["text"] for d in DOCS if d["doc_id"] == doc_id)
    start = text.index(quote)
    return {"doc_id": doc_id, "start": start, "end": start + len(quote)}


QUERIES: list[dict[str, Any]] = [
    {
        "query_id": "q1",
        "query": "how many days do I have to return an item",
        "relevant": {"RET": 2},
        "evidence": [_span("RET", "You can return most items within 30 days of delivery.")],
        "reference_answer": "30 days",
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_returns",
    },
    {
        "q": 1,
        "query_id": "q2",
        "query": "who pays return shipping for a faulty item",
        "relevant": {"FEES": 2, "RET": 1},
        "evidence": [_span("FEES", "When an item is faulty we pay the return shipping.")],
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_returns",
    },
    {
        "query_id": "q3",
        "query": "how long does express shipping take",
        "relevant": {"SHIP": 2},
        "evidence": [_span("SHIP", "Express shipping arrives the next day when ordered before noon.")],
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_shipping",
    },
    {
        "query_id": "q4",
        "query": "is water damage covered by the warranty",
        "relevant": {"WARR": 2},
        "evidence": [_span("WARR", "Accidental damage such as drops or water is not covered.")],
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_warranty",
    },
    {
        "query_id": "q5",
        "query": "do you ship to Mars",
        "answerable": False,
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_shipping",
    },
    {"query_id": "q6", "query": "hello there", "intent_l1": "CHITCHAT", "intent_l2": "C_greeting"},
    {
        "query_id": "q7",
        "query": "where is order 123456 it has been 4 days",
        "relevant": {"SHIP": 2},
        "group": "tpl_where",
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_shipping",
    },
    {
        "query_id": "q8",
        "query": "where is order 998877 it has been 6 days",
        "relevant": {"SHIP": 2},
        "group": "tpl_where",
        "intent_l1": "KNOWLEDGE",
        "intent_l2": "K_shipping",
    },
]
for _q in QUERIES:
    _q.pop("q", None)

INTENTS: list[dict[str, Any]] = [
    {
        "intent_l2": "K_returns",
        "intent_l1": "KNOWLEDGE",
        "description": "returns, refunds and return fees",
        "examples": ["can I send this back", "refund time"],
    },
    {
        "intent_l2": "K_shipping",
        "intent_l1": "KNOWLEDGE",
        "description": "delivery times and shipping",
        "examples": ["when will my parcel arrive", "delivery to my city"],
    },
    {
        "intent_l2": "K_warranty",
        "intent_l1": "KNOWLEDGE",
        "description": "warranty and repairs",
        "examples": ["repair my broken device", "is it under guarantee"],
    },
    {
        "intent_l2": "C_greeting",
        "intent_l1": "CHITCHAT",
        "description": "greetings and small talk",
        "examples": ["hi", "hello", "good morning"],
        "requires_rag": False,
    },
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def write_dataset(
    folder: Path,
    docs: list[dict[str, Any]] | None = None,
    queries: list[dict[str, Any]] | None = None,
    intents: list[dict[str, Any]] | None = None,
    with_intents: bool = True,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "corpus.jsonl", DOCS if docs is None else docs)
    write_jsonl(folder / "queries.jsonl", QUERIES if queries is None else queries)
    if with_intents:
        write_jsonl(folder / "intents.jsonl", INTENTS if intents is None else intents)
    return folder


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "tiny")


# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines): without them each pytest-xdist worker rewrites every test module's asserts again, and
# each `python -m rag_ablate` process the suite starts compiles the package from source (the whole
# suite: 590 CPU-s without, 540 with, on 2 cores). Python writes each cache file atomically.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# One BLAS/OpenMP thread per process: the suite runs cores + 1 workers, each starting subprocesses,
# so every core is already busy; a second BLAS thread per process only spins waiting for a core
# (the whole suite on 2 cores: 558 CPU-s and 306 s with BLAS's default threads, 536 CPU-s and 295 s
# with one). Set before any test imports numpy or torch; a variable the caller set is kept.
for _threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")

# The suite's `python -m rag_ablate` processes share resident MLflow writers of their own (README:
# "The resident MLflow writer"), in a private folder the controller makes (pytest-xdist's workers
# inherit it) and whose writers it stops at the session's end: the suite leaves no process behind.
if "RAG_ABLATE_RUNTIME_DIR" not in os.environ:
    import tempfile

    os.environ["RAG_ABLATE_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="rag_ablate-writers-")
    _OWN_RUNTIME_DIR = True
else:
    _OWN_RUNTIME_DIR = False

# Ctrl-C as in a terminal: a shell starts a background job (`python -m pytest &`) with SIGINT
# ignored, every process it starts inherits that, and the tests that press Ctrl-C on a run
# (tests/test_resume.py) would see it finish as if never interrupted. Each test process, and so
# each run it starts, takes SIGINT as Python does by default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A path under ``../shared`` (the design folder and public datasets).

    Locally a test that needs it skips when it is absent; in CI (``CI=true``) it
    fails instead, so a missing ``../shared`` never turns checks into skips.
    """
    path = SHARED.joinpath(*parts)
    if not path.exists():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{path} is missing: CI runs with ../shared beside the clone")
        pytest.skip(f"{path} is absent (tests that need ../shared skip outside CI)")
    return path


def run_module(
    module: str, args: list[str], cwd: Path, timeout: int = 900, *, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m <module> args...`` in ``cwd`` as a user would, from this checkout.

    ``python -m rag_ablate`` runs in this process (:func:`run_in_process`) unless ``process``:
    a test of the command line as a process (signals, imports, launchers that start workers,
    concurrency) asks for a real one; every other test checks what the run writes and says,
    which is the same in process, without a new interpreter's start-up and imports."""
    if module == "rag_ablate" and not process:
        return run_in_process(args, cwd)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_in_process(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m rag_ablate args...`` in ``cwd``, run in this process: its exit code, stdout and
    stderr as :func:`run_module` returns them. What a run changes in the process is put back
    afterwards: the working directory, the environment, ``sys.argv``, the root logger's handlers
    (Hydra configures logging per run; the files it opened are closed), the SIGINT handler,
    Hydra's global state and the per-process dataset cache (a test may rewrite a dataset in place).
    Warnings are ignored as in :func:`run_module` (``PYTHONWARNINGS=ignore``)."""
    import io
    import logging
    import signal
    import traceback
    import warnings

    from hydra.core.global_hydra import GlobalHydra

    from rag_ablate.__main__ import main
    from rag_ablate.run import runner

    out, err = io.StringIO(), io.StringIO()
    env, here, argv = dict(os.environ), Path.cwd(), sys.argv[:]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    known = logging.root.manager.loggerDict.items()
    loggers = {n: (g.handlers[:], g.level, g.propagate) for n, g in known if isinstance(g, logging.Logger)}
    sigint = signal.getsignal(signal.SIGINT)
    runner._cached_dataset.cache_clear()
    code = 0
    os.chdir(cwd)
    sys.argv = ["rag_ablate"]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        GlobalHydra.instance().clear()
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, (hs, lvl, prop) in loggers.items():
            lg = logging.getLogger(name)
            for h in lg.handlers:
                if h not in hs:
                    h.close()
            lg.handlers[:], lg.propagate = hs, prop
            lg.setLevel(lvl)
        signal.signal(signal.SIGINT, sigint)
        sys.argv = argv
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
        runner._cached_dataset.cache_clear()
    return subprocess.CompletedProcess(["rag_ablate", *args], code, out.getvalue(), err.getvalue())


def rag_ablate_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``rag-ablate args...`` (rag_ablate.cli.main) in ``cwd``, run in this process: its exit code,
    stdout and stderr as :func:`run_module` returns them, without a new interpreter's start-up.
    For tests that check what a command writes and says; the command line as a process (exit on a
    signal, imports, concurrency) is tested with :func:`run_module`. Warnings are ignored as in
    :func:`run_module` (``PYTHONWARNINGS=ignore``)."""
    import io
    import warnings

    from rag_ablate.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    env, here = dict(os.environ), Path.cwd()
    os.chdir(cwd)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            code = main(args)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
    return subprocess.CompletedProcess(["rag-ablate", *args], code, out.getvalue(), err.getvalue())


# --------------------------------------------------------------------------- servers and a browser

CHROMIUM = Path("/usr/bin/chromium")


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_chromium() -> Path:
    """Debian's headless Chromium: skips without it locally, fails without it in CI."""
    if not CHROMIUM.is_file():
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{CHROMIUM} is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} not installed (Debian: apt-get install chromium): this check needs it")
    return CHROMIUM


def chromium(url: str, profile: Path, *args: str, window: str = "1900,700", budget_ms: int = 25000) -> str:
    """Headless Chromium on ``url`` (no GPU, no sandbox, its own profile); its stdout."""
    proc = subprocess.run(
        [
            str(require_chromium()),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",  # a single-page app loads, then fetches its data
            f"--window-size={window}",
            *args,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return proc.stdout


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """Stop a server started with ``start_new_session=True`` and every process of its group."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=20)
            break
        except subprocess.TimeoutExpired:
            continue
    time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers that ignored SIGTERM


@contextlib.contextmanager
def serving(
    name: str,
    args: list[str],
    port: int,
    log_path: Path,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120,
) -> Iterator[None]:
    """Start ``args`` (an MLflow server) as its own process group, wait until it answers
    ``/health`` on ``port``, and stop the whole group afterwards, so no worker outlives the
    test. Its output goes to ``log_path``."""
    import httpx

    with log_path.open("w") as log:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                        break
                assert proc.poll() is None, log_path.read_text()
                time.sleep(0.2)  # a server up between two looks waits at most this long
            else:
                log_tail = log_path.read_text()[-2000:]
                pytest.fail(f"{name} did not come up within {timeout_s:.0f} s: {log_tail}")
            yield
        finally:
            stop_group(proc)


@contextlib.contextmanager
def mlflow_ui(log_path: Path, *, cwd: Path | None = None, uri: str | None = None) -> Iterator[int]:
    """``rag-ablate ui`` on a free port, up and answering /health; yields the port."""
    port = free_port()
    args = [sys.executable, "-m", "rag_ablate.cli.main", "ui", "--port", str(port)]
    if uri is not None:
        args += ["--uri", uri]
    with serving("the MLflow UI", args, port, log_path, cwd=cwd):
        yield port


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A deterministic OpenAI-compatible chat server on 127.0.0.1 (tests/fake_llm.py); ``.url`` is the API
    root to use as ``base_url``; set ``.respond`` to choose what it answers."""
    with serve_fake_llm() as state:
        yield state


# --------------------------------------------------------------------------- sweeps shared by a session


def _session_root(factory: pytest.TempPathFactory) -> Path:
    """A folder every process of this pytest session sees: under pytest-xdist each worker has its
    own base temp folder (``.../pytest-N/popen-gwK``) and the session's is its parent."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_run(
    factory: pytest.TempPathFactory, name: str, args: list[str], *, process: bool = True
) -> dict[str, Any]:
    """``python -m rag_ablate args...`` run once per session in a folder of its own, whichever
    worker asks first (the others wait on a file lock and read its result): as a process of its
    own, as typed, or with ``process=False`` in the worker that asks (:func:`run_in_process`,
    without a new interpreter's imports). Returns ``cwd`` (the folder it ran in), ``out`` (its
    ``outputs/``) and ``proc`` (exit code, stdout and stderr). Callers only read the folder: a test
    that changes outputs runs its own sweep."""
    root = _session_root(factory)
    cwd = root / f"shared-{name}"
    result = root / f"shared-{name}.json"
    with (root / f"shared-{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not result.is_file():
            cwd.mkdir()
            proc = run_module("rag_ablate", args, cwd, process=process)
            done = {"args": args, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
            tmp = result.with_suffix(".tmp")
            tmp.write_text(json.dumps(done), encoding="utf-8")
            tmp.replace(result)
        done = json.loads(result.read_text(encoding="utf-8"))
    assert done["args"] == args, (name, done["args"], args)
    proc = subprocess.CompletedProcess(args, done["returncode"], done["stdout"], done["stderr"])
    return {"cwd": cwd, "out": cwd / "outputs", "proc": proc}


DEFAULT_SWEEP = ("default-sweep", ["-m", "chunk=256,512", "progress=false"])
_early: list[threading.Thread] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """The whole suite under pytest-xdist (README's ``python -m pytest``): the controller starts
    README's sweep (:func:`default_sweep`) at once, in a thread, while the workers start and collect,
    instead of the first test that needs it starting it later while other workers wait on its lock.
    Whatever happens to it, a worker that finds no result runs it itself (:func:`shared_run`)."""
    config = session.config
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", 0) or not whole:
        return
    if config.getoption("markexpr") or config.getoption("keyword"):
        return
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]

    def run() -> None:
        with contextlib.suppress(Exception):
            shared_run(factory, *DEFAULT_SWEEP)

    _early.append(threading.Thread(target=run, name="default-sweep", daemon=True))
    _early[-1].start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for thread in _early:
        thread.join(timeout=900)
    if _OWN_RUNTIME_DIR and not os.environ.get("PYTEST_XDIST_WORKER"):
        import shutil

        from rag_ablate.tracking import resident

        resident.stop_all()
        shutil.rmtree(os.environ["RAG_ABLATE_RUNTIME_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def default_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """README's main command, ``python -m rag_ablate -m chunk=256,512`` on the embedded sample, run
    once per session; ``dir`` is its sweep folder. Read it, never write to it."""
    run = shared_run(tmp_path_factory, *DEFAULT_SWEEP)
    assert run["proc"].returncode == 0, run["proc"].stderr[-3000:]
    (sweep_dir,) = (run["out"] / "multirun").iterdir()
    return {**run, "dir": sweep_dir}


def copy_shared(run: dict[str, Any], dest: Path) -> dict[str, Any]:
    """A copy of a shared run's folder at ``dest``, for a test that writes where it reads: the paths
    the run recorded (its files, the MLflow store's artifact locations) name the copy, so nothing
    the test does reaches the shared folder. Returns ``run`` with ``cwd``, ``out`` (and ``dir``) moved."""
    import shutil
    import sqlite3

    shutil.copytree(run["cwd"], dest, ignore=shutil.ignore_patterns("*.lock"))
    old, new = str(Path(run["cwd"]).resolve()), str(dest.resolve())
    for path in dest.rglob("*"):
        if path.suffix in (".json", ".yaml") and path.is_file():
            text = path.read_text(encoding="utf-8")
            if old in text:
                path.write_text(text.replace(old, new), encoding="utf-8")
    db = dest / "outputs" / "mlflow.db"
    if db.is_file():
        with contextlib.closing(sqlite3.connect(db)) as con, con:
            con.execute(
                "UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (old, new)
            )
            con.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (old, new))
    moved = {"cwd": dest, "out": dest / "outputs"}
    if "dir" in run:
        moved["dir"] = dest / Path(run["dir"]).relative_to(run["cwd"])
    return {**run, **moved}


def _sweep_labels(sweep_dir: Path) -> dict[str, Path]:
    """A sweep's job folders by their variant label (``summary.json``'s ``label``)."""
    jobs = sorted(p.parent for p in sweep_dir.glob("*/summary.json"))
    return {json.loads((j / "summary.json").read_text(encoding="utf-8"))["label"]: j for j in jobs}


@pytest.fixture(scope="session")
def sample_answers_sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The embedded sample with the extractive generator and with the access-control filter, one
    factor at a time (jobs: baseline, ``generator=extractive``, ``retrieval.acl_filter=true``), run
    once per session for test_answers.py and test_acl.py; ``dir`` is its sweep folder and ``jobs``
    its job folders by label. Read it, never write to it."""
    args = ["-m", "generator=none,extractive", "retrieval.acl_filter=false,true"]
    run = shared_run(
        tmp_path_factory,
        "sample-answers",
        # no test of it reads latency: the interleaved timing pass after the four jobs is off
        [*args, "tracking=none", "progress=false", "compare.B=1000", "timing.interleave=false"],
        process=False,
    )
    assert run["proc"].returncode == 0, run["proc"].stderr[-3000:]
    (sweep_dir,) = (run["out"] / "multirun").iterdir()
    return {**run, "dir": sweep_dir, "jobs": _sweep_labels(sweep_dir)}


# --------------------------------------------------------------------------- scheduling and the slow mark

#: With this set to a number of seconds, a test not marked ``slow`` whose setup or call takes longer
#: fails: the mark means "runs a real sweep, a subprocess job or a long simulation", and
#: ``python -m pytest -m "not slow"`` is the inner loop that must stay quick.
FAST_LIMIT_ENV = "RAG_ABLATE_FAST_LIMIT_S"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject's addopts) starts one worker more than the machine has cores: a worker
    often waits (on a subprocess, a server, Chromium, the disk), and on 2 cores the whole suite took
    348 s with 2 workers, 297 s with 3 and 310 s with 4."""
    return len(os.sched_getaffinity(0)) + 1


#: Test files that run one after another on one worker, as one unit of ``--dist loadfile``: each
#: group's files load the same heavy libraries, which a worker then imports once instead of every
#: worker once (sentence-transformers, torch and MiniLM: about 6 CPU-s a process; ranx and its numba
#: kernels: about 5 CPU-s). A file not listed is a unit of its own.
SAME_WORKER: dict[str, tuple[str, ...]] = {
    "models": (
        "test_dense.py",
        "test_serve.py",
        "test_stages.py",
        "test_cache_keys.py",
        "test_rerank.py",
        "test_acl.py",
    ),
    "ranx": (
        "test_metrics_retrieval.py",
        "test_metrics_scoring.py",
        "test_dataset_fields.py",
        "test_export.py",
    ),
}
_GROUP_OF = {name: group for group, names in SAME_WORKER.items() for name in names}


def _unit(path: str) -> str:
    """The unit of work of the test file at ``path`` (a node id's file part): its group or itself."""
    return _GROUP_OF.get(path.rsplit("/", 1)[-1], path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (pyproject's addopts) with the files of a :data:`SAME_WORKER` group as one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid.split("::", 1)[0])

    return FileGroups(config, log)


@pytest.hookimpl(trylast=True)  # after -m has deselected: only the tests that will run count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The units of work (a file, or a :data:`SAME_WORKER` group) with the most ``slow`` tests first,
    each unit's files and each file's tests in their own order.

    pytest.ini_options runs the suite on pytest-xdist workers with ``--dist loadfile`` (each unit
    on one worker, so a module-scoped sweep runs once) and ``--no-loadscope-reorder`` (units handed
    out in this order): the longest units start first and the short ones fill in at the end, so no
    worker is left with a long file while the other one idles."""
    unit = {item.nodeid: _unit(item.nodeid.split("::", 1)[0]) for item in items}
    weight: dict[str, float] = {}
    for item in items:
        weight[unit[item.nodeid]] = weight.get(unit[item.nodeid], 0.0) + (
            10.0 if item.get_closest_marker("slow") else 0.1
        )
    unit_seen = {u: i for i, u in enumerate(dict.fromkeys(unit.values()))}
    file_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(
        key=lambda item: (-weight[unit[item.nodeid]], unit_seen[unit[item.nodeid]], file_seen[item.path])
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    limit = os.environ.get(FAST_LIMIT_ENV)
    if (
        limit
        and report.passed
        and report.when in ("setup", "call")
        and item.get_closest_marker("slow") is None
        and call.duration > float(limit)
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: {report.when} took {call.duration:.1f} s, over {FAST_LIMIT_ENV}={limit}: "
            "mark it slow (it runs a sweep, a subprocess job or a long simulation) or make it faster"
        )
    return report


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Let a test register metrics without leaking them into other tests (a copy of the metric
    registry for the test's duration)."""
    from rag_ablate.core.registry import Registry
    from rag_ablate.metrics import registry as registry_module
    from rag_ablate.metrics.registry import MetricSpec

    saved = registry_module._METRICS
    scratch: Registry[MetricSpec] = Registry(saved.kind)
    for base in saved.names():
        scratch.add(base, saved.get(base))
    registry_module._METRICS = scratch
    try:
        yield
    finally:
        registry_module._METRICS = saved
