"""The only module that talks to MLflow.

Uses :class:`mlflow.tracking.MlflowClient` with explicit run ids (never the
fluent API's global "active run"), so several variants can be logged from one
process and children from worker processes can attach to a parent created by
the sweep driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_ablate import __version__
from rag_ablate.core.errors import RagAblateError, TrackingDownError, TrackingError, one_line
from rag_ablate.core.secrets import split_userinfo
from rag_ablate.tracking.tags import PARENT_TAG

if TYPE_CHECKING:
    from rag_ablate.config.schema import TrackingConfig


def mlflow_env_defaults() -> None:
    """MLflow 3 sends usage telemetry from a background thread (a DNS lookup and HTTPS requests to
    the internet on every run); a run needs no network, so it is off unless the user turns it on
    (MLFLOW_DISABLE_TELEMETRY=false). Set when this module is imported, before MLflow is (only this
    module and traces import it, inside functions, after this), and again by the resident writer's
    child once it has taken the command's environment (rag_ablate.tracking.serving)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


mlflow_env_defaults()

DEFAULT_BUDGET_S = 60.0  # tracking.timeout_s's default


def set_budget(seconds: float = DEFAULT_BUDGET_S) -> None:
    """Bound every MLflow call to a tracking server to about ``seconds`` (``tracking.timeout_s``),
    retries and waits between them included: MLflow's own default retries one call for minutes
    (7 tries, backoff up to 120 s, 120 s each), so a server that dies or stops answering mid-sweep
    hung it for 10 minutes or more. MLflow reads these variables at each call; they are set before
    the first one (and again when a run's settings are known).

    A budget of 8 s or more allows 3 tries (waits of 0 and 2 s between them), each of
    ``(seconds - 2) / 3`` s; a smaller one a single try. A Retry-After header is not obeyed
    (it could exceed the budget)."""
    tries = 3 if seconds >= 8 else 1
    wait = 2 if tries == 3 else 0
    per_try = max(1, int((seconds - wait) / tries))
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(tries - 1)
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = "1"
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_JITTER"] = "0"
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(per_try)
    os.environ["MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER"] = "false"
    _budget[0] = seconds


_budget = [DEFAULT_BUDGET_S]
set_budget()

# Tracking stores that stopped answering in this process: URI -> the line that says so. Every
# later call to such a store fails at once with that line instead of costing another budget.
_down: dict[str, str] = {}


def _unreachable(exc: BaseException) -> bool:
    """True when ``exc`` (from an MLflow call) means the store did not answer: a connection that
    failed, was refused, or timed out, after MLflow's retries."""
    seen: BaseException | None = exc
    while seen is not None:
        module = type(seen).__module__.split(".")[0]
        if module in ("requests", "urllib3") or isinstance(seen, ConnectionError | TimeoutError):
            return True
        text = str(seen)
        if text.startswith("API request to ") and " failed with " in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _root_cause(exc: BaseException) -> str:
    """The first error of ``exc``'s chain (a refused connection, a read that timed out), on one line."""
    while (below := exc.__cause__ or exc.__context__) is not None:
        exc = below
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


class _Deadlined:
    """An :class:`mlflow.tracking.MlflowClient` whose every call ends within the tracking budget
    (:func:`set_budget`): a store that did not answer raises :class:`TrackingDownError` naming it,
    and is remembered as down (:data:`_down`), so the rest of the job or sweep stops at once."""

    def __init__(self, uri: str, client: Any) -> None:
        self._uri, self._client = uri, client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._uri in _down:
                raise TrackingDownError(_down[self._uri])
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if not _unreachable(exc):
                    raise
                _down[self._uri] = (
                    f"MLflow tracking store {self._uri} did not answer within {_budget[0]:g} s "
                    f"(tracking.timeout_s): {_root_cause(exc)}; the records on disk are kept; "
                    "resume=<the run or sweep folder> finishes its runs once the store answers"
                )
                raise TrackingDownError(_down[self._uri]) from exc

        return call


_BATCH = 100  # MLflow accepts at most 100 params (and 100 tags) per log_batch

SERVER_TIMEOUT = 5.0  # seconds to wait for an MLflow server before calling it unreachable

# Which process owns a RUNNING run: "<host>:<pid>:<process start time>". When a store is opened,
# RUNNING runs whose owner process on this host is gone (a SIGKILL, a power cut) are marked KILLED
# with ORPHAN_TAG saying so; runs owned by live processes (a concurrent sweep) or by other hosts
# (a cluster's workers) are left alone.
OWNER_TAG = "rag_ablate.process"
ORPHAN_TAG = "rag_ablate.orphaned"


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux ``/proc``); "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""  # field 22 of stat; fields here start at field 3


_owner_pid: list[int] = []  # the process a background writer logs for (rag_ablate.tracking.background)


def set_owner_pid(pid: int) -> None:
    """Runs created or reopened in this process are owned by process ``pid`` (the background
    writer's: the main process it logs for)."""
    _owner_pid[:] = [pid]


def owner_tag() -> str:
    """This process (or the one it logs for) as an :data:`OWNER_TAG` value."""
    pid = _owner_pid[0] if _owner_pid else os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start(pid)}"


def owner_gone(owner: str) -> bool:
    """True when ``owner`` (an :data:`OWNER_TAG` value) is a process of this host that has ended.

    A pid that is alive but started at another time is a reused pid: the owner is gone too.
    Another host's process cannot be checked from here: never gone.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if start and Path("/proc").is_dir():
        return _proc_start(pid) != start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


def mark_orphans(uri: str, experiment_id: str) -> list[str]:
    """End (KILLED) the experiment's RUNNING runs whose owner process is gone; their ids.

    ``resume=`` on the run's folder reopens such a run and completes it.
    """
    client = _client(uri)
    runs = client.search_runs(
        [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
    )
    marked: list[str] = []
    for run in runs:
        owner = run.data.tags.get(OWNER_TAG)
        if not owner or not owner_gone(owner):
            continue
        run_id = str(run.info.run_id)
        client.set_tag(
            run_id, ORPHAN_TAG, f"its process ({owner}) ended without finishing it; resume= completes it"
        )
        client.set_terminated(run_id, status="KILLED")
        marked.append(run_id)
    return marked


def default_uri(output_root: Path) -> str:
    return f"sqlite:///{(output_root / 'mlflow.db').resolve()}"


def is_server(uri: str) -> bool:
    """True for an MLflow tracking server's URI (``http://`` or ``https://``)."""
    return uri.startswith(("http://", "https://"))


def resolve(settings: TrackingConfig, output_root: Path) -> tuple[str, Path | None]:
    """The tracking URI and artifact root a run uses (defaults under ``output_root``).

    A tracking server without ``tracking.artifact_root`` gets None: its experiments keep the
    server's own artifact root (``--artifacts-destination``, uploaded through the server), so
    every machine of a cluster can read them; a folder of this machine would not be.
    """
    uri = _credentials_to_env(settings.uri) if settings.uri else default_uri(output_root)
    if settings.artifact_root:
        return uri, Path(settings.artifact_root)
    return uri, None if is_server(uri) else output_root / "mlartifacts"


def _credentials_to_env(uri: str) -> str:
    """A tracking server's URI without the user and password written in it
    (``http://user:KEY@host:5000``): they go to ``MLFLOW_TRACKING_USERNAME`` and
    ``MLFLOW_TRACKING_PASSWORD``, which MLflow sends as basic auth, so the URI stored in
    ``sweep.json``, ``run.json`` and printed names no key. Other URIs are returned as they are."""
    if not uri.startswith(("http://", "https://")):
        return uri
    bare, userinfo = split_userinfo(uri)
    if userinfo is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = userinfo
    return bare


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other stores and in-memory ones)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = urllib.parse.unquote(uri[len("sqlite:///") :].split("?", 1)[0])
    return None if path in ("", ":memory:") else Path(path)


def _check_sqlite(uri: str, db: Path, create_folder: bool) -> None:
    folder = db.parent
    # a relative path (sqlite:///outputs/mlflow.db) lives under the working folder, like the
    # default store: its folders are made; an absolute one must point into an existing folder
    if (create_folder or not db.is_absolute()) and not folder.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrackingError(f"MLflow store {uri}: cannot create folder {folder}: {exc.strerror}") from exc
    if folder.exists() and not folder.is_dir():
        raise TrackingError(f"MLflow store {uri}: {folder} is not a folder")
    if not folder.exists():
        raise TrackingError(
            f"MLflow store {uri}: folder {folder} does not exist "
            "(create it, or leave tracking.uri unset to use <paths.output_root>/mlflow.db)"
        )
    if db.exists() and (not db.is_file() or not os.access(db, os.R_OK | os.W_OK)):
        raise TrackingError(f"MLflow store {uri}: {db} is not a readable and writable file")
    if not db.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise TrackingError(f"MLflow store {uri}: folder {folder} is not writable")


def _check_server(uri: str, experiment: str) -> None:
    import urllib.error  # with urllib.request, 0.01 s of imports a run without a server never needs
    import urllib.request

    query = urllib.parse.urlencode({"experiment_name": experiment})
    url = f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name?{query}"
    try:
        with urllib.request.urlopen(url, timeout=SERVER_TIMEOUT):
            pass
    except urllib.error.HTTPError:
        return  # it answered (404 for a new experiment, 401 without credentials): reachable
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"MLflow server {uri} is not reachable: {reason}") from exc


def open_store(uri: str, experiment: str, artifact_root: Path | None, *, create_folder: bool = False) -> str:
    """Check the store is usable, create it (and the experiment) if needed; the experiment id.

    Fails at once, with a TrackingError saying why, for a sqlite file whose folder
    is missing (created only for the default store, ``create_folder``, and for relative paths),
    not writable or not a folder, and for a server that does not answer within
    :data:`SERVER_TIMEOUT` seconds.
    """
    db = sqlite_path(uri)
    check_store(uri, experiment, create_folder=create_folder)
    if db is not None:
        # two processes creating one sqlite store at once race on its tables (the second fails
        # with "table ... already exists"): whoever opens it holds a lock file beside it meanwhile
        with _file_lock(db.with_name(db.name + ".lock")):
            create_sqlite(uri, db)
            experiment_id = ensure_experiment(uri, experiment, artifact_root)
    else:
        try:
            experiment_id = ensure_experiment(uri, experiment, artifact_root)
        except TrackingDownError as exc:  # before anything ran: a store error like the check's
            raise TrackingError(str(exc)) from exc
    try:
        orphans = mark_orphans(uri, experiment_id)
    except Exception as exc:  # best effort: never stops a run
        orphans = []
        print(f"rag_ablate: warning: could not look for orphaned runs in {uri}: {exc}", file=sys.stderr)
    if orphans:
        print(
            f"rag_ablate: marked {len(orphans)} orphaned run(s) KILLED in {uri} (their process is gone; "
            f"tag {ORPHAN_TAG}): {', '.join(orphans)}",
            file=sys.stderr,
        )
    return experiment_id


def check_store(
    uri: str, experiment: str, *, create_folder: bool = False, artifact_root: Path | None = None
) -> None:
    """The checks of :func:`open_store` that need no MLflow (a sqlite file's folder, a server that
    answers; with ``artifact_root``, that folder made): TrackingError saying what is wrong."""
    db = sqlite_path(uri)
    if db is not None:
        _check_sqlite(uri, db, create_folder)
    elif is_server(uri):
        _check_server(uri, experiment)
    if artifact_root is not None:
        try:
            artifact_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            why = f"cannot create the artifact folder {artifact_root}: {exc.strerror or exc}"
            raise TrackingError(f"MLflow store {uri}: {why}") from exc


def _is_new(db: Path) -> bool:
    """True when ``db`` has no tables yet: absent, or an empty file (``touch``, a bare ``sqlite3``)."""
    try:
        return db.stat().st_size == 0
    except FileNotFoundError:
        return True


def template_path() -> Path:
    """This machine's copy of an empty store built by this MLflow version (the per-user cache
    folder, ``$XDG_CACHE_HOME/rag_ablate`` or ``~/.cache/rag_ablate``)."""
    from importlib.metadata import version

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag_ablate" / f"mlflow-{version('mlflow')}-store.db"


def _build_tables(db: Path) -> None:
    """MLflow's own creation of an empty store (its tables, then every schema migration) in
    ``db``, without waiting for the disk after each of its hundreds of statements: ``db`` is a
    temporary file, synced once when complete. The store keeps sqlite's default journal (one
    file, readable by any sqlite client, on any disk).
    """
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")

    def no_sync(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", no_sync)
    try:
        _initialize_tables(engine)  # type: ignore[no-untyped-call]
    finally:
        engine.dispose()


def _synced_copy(source: Path, target: Path) -> None:
    """Copy ``source`` to ``target`` through a temporary file, synced, then renamed into place."""
    import shutil

    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(source, tmp)
        with tmp.open("rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def create_sqlite(uri: str, db: Path) -> bool:
    """Create a new sqlite store's tables once; True when this call created them.

    MLflow builds a store by running every schema migration, each committed and synced to disk
    on its own (seconds on a busy disk). Here the tables are built once per MLflow version and
    machine into a template (:func:`template_path`), then each new store is a synced copy of it
    renamed into place: a store is never seen half built, and an existing store is left alone
    (MLflow checks its schema when it opens it). Without a usable template folder the store is
    built the same way in a temporary file beside it. Call it under the store's lock.
    """
    if not _is_new(db):
        return False
    try:
        template = template_path()
        if not template.is_file():
            template.parent.mkdir(parents=True, exist_ok=True)
            scratch = template.with_name(f".{template.name}.{os.getpid()}.tmp")
            try:
                _build_tables(scratch)
                os.replace(scratch, template)  # another process's template is as good as ours
            finally:
                scratch.unlink(missing_ok=True)
        _synced_copy(template, db)
    except OSError:  # no writable cache folder: build this store's tables beside it
        scratch = db.with_name(f".{db.name}.{os.getpid()}.new")
        try:
            _build_tables(scratch)
            _synced_copy(scratch, db)
        except Exception:  # left to MLflow, which builds the store when it first opens it
            return False
        finally:
            scratch.unlink(missing_ok=True)
    except Exception:  # e.g. an MLflow without this creation path: MLflow builds the store itself
        return False
    return True


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if absent) for the ``with`` block."""
    import fcntl

    with path.open("a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class _RolledBack(Exception):
    """Something in a block of :func:`in_one_transaction` failed or rolled back (MLflow resolves
    some conflicts that way): nothing of the block is stored."""


@contextlib.contextmanager
def _shared_session(store: Any) -> Iterator[None]:
    """Every ``store.ManagedSessionMaker`` session this thread opens in the block is one session,
    committed once at the end. Any error in the block (even one MLflow catches), a rollback or a
    failed commit rolls the whole block back and raises :class:`_RolledBack`. An experiment is
    read once in the block (MLflow reads it again for each trace it starts: 1.7 ms each); no block
    of rag_ablate's writes changes an experiment."""
    import threading

    from sqlalchemy import event

    own = store.ManagedSessionMaker
    me = threading.get_ident()
    failed: list[bool] = []
    read = store.get_experiment
    shadowed = vars(store).get("get_experiment")  # an enclosing block's, or None: the class's
    experiments: dict[str, Any] = {}

    def get_experiment(experiment_id: str) -> Any:
        if threading.get_ident() != me:
            return read(experiment_id)
        if experiment_id not in experiments:
            experiments[experiment_id] = read(experiment_id)
        return experiments[experiment_id]

    @contextlib.contextmanager
    def shared(read_only: bool = True) -> Iterator[Any]:
        if threading.get_ident() != me:  # another thread of this process: its own session
            with own(read_only=read_only) as other:
                yield other
            return
        if failed:
            raise _RolledBack
        try:
            yield session
            session.flush()
        except BaseException:
            failed.append(True)
            raise

    try:
        with own(read_only=False) as session:  # MLflow's: commits at the end, rolls back on an error
            event.listen(session, "after_rollback", lambda _s: failed.append(True))
            commit = session.commit
            session.commit = session.flush  # MLflow commits inside some calls (log_batch): not yet
            store.ManagedSessionMaker = shared
            store.get_experiment = get_experiment
            try:
                yield
            finally:
                store.ManagedSessionMaker = own
                if shadowed is None:
                    del store.get_experiment  # the class's method again
                else:
                    store.get_experiment = shadowed
                session.commit = commit
            if failed:
                raise _RolledBack
    except Exception as exc:  # redone call by call, which raises it again if it is not a conflict
        raise _RolledBack from exc


def in_one_transaction(uri: str, write: Callable[[], None]) -> None:
    """``write()`` (MLflow calls on ``uri``) with every database write of it in one transaction:
    on a sqlite store one commit, so one wait for the disk, instead of one per call (a trace, a
    run's params, its end: each commits on its own). When anything in it fails or is rolled back
    (MLflow resolves some conflicts that way), nothing of it is stored and ``write()`` runs again
    call by call, as MLflow does it, raising what it raises. Other stores: ``write()`` as it is."""
    if sqlite_path(uri) is None:
        write()
        return
    from mlflow.tracing.client import TracingClient

    store = TracingClient(uri).store  # the process's one store object for uri (MlflowClient's too)
    if not callable(getattr(store, "ManagedSessionMaker", None)):
        write()
        return
    try:
        with _shared_session(store):
            write()
    except _RolledBack:
        write()


class _NoTraceback(logging.Filter):
    """MLflow logs a sqlite error (a full disk, a read-only or locked database) with its whole
    traceback, then raises it as an MlflowException that rag_ablate reports in its own one line (a
    job's or sweep's failure): the record keeps its first line and the error's root cause."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            first = (record.getMessage().splitlines() or [""])[0]
            record.msg, record.args = f"{first} ({_root_cause(record.exc_info[1])})", None
            record.exc_info, record.exc_text = None, None
        return True


def _quiet_tracebacks() -> None:
    logger = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _NoTraceback) for f in logger.filters):
        logger.addFilter(_NoTraceback())


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    _quiet_tracebacks()
    return _Deadlined(uri, MlflowClient(tracking_uri=uri))


def ensure_experiment(uri: str, name: str, artifact_root: Path | None) -> str:
    """Create the store (first use of a sqlite file builds its tables) and the experiment
    (its artifacts under ``artifact_root``; None: the tracking server's own artifact root)."""
    from mlflow.exceptions import MlflowException

    try:
        client = _client(uri)
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        location = None
        if artifact_root is not None:
            artifact_root.mkdir(parents=True, exist_ok=True)
            location = artifact_root.resolve().as_uri()
        try:
            return str(client.create_experiment(name, artifact_location=location))
        except MlflowException:  # created meanwhile by another process
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)
    except MlflowException as exc:
        raise TrackingError(f"MLflow store {uri} is not usable: {exc.message}") from exc
    except RagAblateError:
        raise
    except Exception as exc:  # e.g. sqlalchemy or OS errors below MLflow
        first = (str(exc).strip().splitlines() or [""])[0]
        raise TrackingError(f"MLflow store {uri} is not usable: {type(exc).__name__}: {first}") from exc


def git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def base_tags(cwd: Path) -> dict[str, str]:
    tags = {"rag_ablate.version": __version__}
    commit = git_commit(cwd)
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git.commit"] = commit
    return tags


def start_parent(uri: str, experiment_id: str, name: str, tags: Mapping[str, str]) -> str:
    tags = {"rag_ablate.kind": "sweep", **tags, OWNER_TAG: owner_tag()}
    run = _client(uri).create_run(experiment_id, run_name=name, tags=tags)
    return str(run.info.run_id)


def log_run(
    uri: str,
    experiment_id: str,
    name: str,
    *,
    params: Mapping[str, Any],
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    artifacts_dir: Path | None,
    parent_run_id: str | None = None,
    run_id: str | None = None,
    final_status: str | None = "FINISHED",
) -> str:
    """One finished variant as one run: params, metrics (one batch call), tags, artifacts.

    The run ends ``final_status`` once everything is logged (``FAILED`` for a run whose
    error rate is above ``system.max_error_rate``: all it has is still logged); with None it
    stays RUNNING for :func:`finish_run` to end.

    With ``run_id`` (the run :func:`start_run` created when the job started) that run
    is completed instead of a new one; params it already has keep their values.
    """
    from mlflow.entities import Metric, Param, RunTag

    client = _client(uri)
    all_tags = {"rag_ablate.kind": "variant", **tags, OWNER_TAG: owner_tag()}
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    logged: list[str] = []

    def write() -> None:  # one transaction (in_one_transaction): redone whole if MLflow rolls back
        logged.clear()
        have: set[str] = set()
        if run_id is None:
            rid = str(client.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id)
        else:
            rid = run_id
            have = set(client.get_run(rid).data.params)
            tlist = [RunTag(k, v) for k, v in sorted(all_tags.items())]
            for i in range(0, len(tlist), _BATCH):
                client.log_batch(rid, tags=tlist[i : i + _BATCH])
        logged.append(rid)
        try:
            plist = [Param(k, _param_value(v)) for k, v in sorted(params.items()) if k not in have]
            for i in range(0, len(plist), _BATCH):
                client.log_batch(rid, params=plist[i : i + _BATCH])
            ts = _now_ms()
            mlist = [Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items())]
            for i in range(0, len(mlist), 1000):
                client.log_batch(rid, metrics=mlist[i : i + 1000])
            if artifacts_dir is not None:
                client.log_artifacts(rid, str(artifacts_dir))
        except Exception:
            client.set_terminated(rid, status="FAILED")
            raise
        if final_status is not None:
            client.set_terminated(rid, status=final_status)

    in_one_transaction(uri, write)
    return logged[0]


def finish_run(uri: str, run_id: str, metrics: Mapping[str, float], paths: list[Path], status: str) -> None:
    """Log the last metrics and files of a run (its profile) and end it ``status`` (one transaction)."""

    def write() -> None:
        log_metrics(uri, run_id, metrics)
        log_artifacts(uri, run_id, paths)
        end_run(uri, run_id, status)

    in_one_transaction(uri, write)


def start_run(
    uri: str, experiment_id: str, name: str, parent_run_id: str | None = None, *, run_id: str | None = None
) -> str:
    """Create a variant's run when its job starts (status RUNNING); :func:`log_run` completes it.

    ``run_id`` (32 hex digits, a sqlite store only): the id the run gets, chosen by the caller (the
    background writer's main process writes it to ``run.json`` before the run exists)."""
    tags = {"rag_ablate.kind": "variant", OWNER_TAG: owner_tag()}
    if parent_run_id:
        tags[PARENT_TAG] = parent_run_id
    with _run_id_chosen(run_id):
        made = str(_client(uri).create_run(experiment_id, run_name=name, tags=tags).info.run_id)
    if run_id is not None and made != run_id:
        raise TrackingError(f"MLflow store {uri}: the run was created as {made}, not as {run_id}")
    return made


@contextlib.contextmanager
def _run_id_chosen(run_id: str | None) -> Iterator[None]:
    """MLflow's sqlite store names a new run ``uuid.uuid4().hex`` (MLflow is pinned); in the block it
    names it ``run_id`` instead."""
    if run_id is None:
        yield
        return
    import types
    import uuid

    from mlflow.store.tracking import sqlalchemy_store

    chosen = types.ModuleType("uuid")
    chosen.__dict__.update(vars(uuid))
    chosen.uuid4 = lambda: uuid.UUID(hex=run_id)  # type: ignore[attr-defined]
    real = vars(sqlalchemy_store)["uuid"]
    setattr(sqlalchemy_store, "uuid", chosen)  # noqa: B010
    try:
        yield
    finally:
        setattr(sqlalchemy_store, "uuid", real)  # noqa: B010


def run_exists(uri: str, run_id: str) -> bool:
    """True when the store has the run ``run_id``."""
    from mlflow.exceptions import MlflowException

    try:
        _client(uri).get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True


def run_status(uri: str, run_id: str) -> str:
    """A run's status: RUNNING, FINISHED, FAILED, KILLED or SCHEDULED."""
    return str(_client(uri).get_run(run_id).info.status)


def reopen_run(uri: str, run_id: str, *, create_as: tuple[str, str, str | None] | None = None) -> None:
    """Set an interrupted, failed or finished run back to RUNNING (``resume=``).

    With ``create_as`` (experiment id, run name, parent run id or None): a run a sqlite store lacks,
    because its job was killed before the background writer created it (``run.json`` names the id
    that job chose), is created under ``run_id`` first; one created meanwhile is reopened."""
    from mlflow.exceptions import MlflowException

    if create_as is not None and sqlite_path(uri) is not None and not run_exists(uri, run_id):
        try:
            start_run(uri, *create_as, run_id=run_id)
        except Exception as exc:
            if not run_exists(uri, run_id):
                raise TrackingError(f"cannot resume MLflow run {run_id} in {uri}: {one_line(exc)}") from exc
    client = _client(uri)
    try:
        client.get_run(run_id)
        client.set_tag(run_id, OWNER_TAG, owner_tag())  # this process owns it now
        client.update_run(run_id, status="RUNNING")
    except MlflowException as exc:
        raise TrackingError(f"cannot resume MLflow run {run_id} in {uri}: {exc.message}") from exc


def log_artifacts(uri: str, run_id: str, paths: list[Path]) -> None:
    client = _client(uri)
    for p in paths:
        if p.is_dir():
            client.log_artifacts(run_id, str(p))
        elif p.is_file():
            client.log_artifact(run_id, str(p))


def log_metrics(uri: str, run_id: str, metrics: Mapping[str, float]) -> None:
    from mlflow.entities import Metric

    ts = _now_ms()
    mlist = [Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items())]
    client = _client(uri)
    for i in range(0, len(mlist), 1000):
        client.log_batch(run_id, metrics=mlist[i : i + 1000])


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    _client(uri).set_terminated(run_id, status=status)


def child_runs(uri: str, parent_run_id: str) -> list[tuple[str, str]]:
    """(run id, run name) of a parent run's children, oldest first."""
    from mlflow.exceptions import MlflowException

    client = _client(uri)
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as exc:
        raise TrackingError(f"no run {parent_run_id} in {uri}: {exc.message}") from exc
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
        order_by=["attributes.start_time ASC"],
    )
    return [(str(r.info.run_id), str(r.info.run_name)) for r in runs]


def download(uri: str, run_id: str, names: list[str], dest: Path) -> dict[str, Path]:
    """Download the named top-level artifacts that exist; returns name -> local path."""
    client = _client(uri)
    present = {a.path for a in client.list_artifacts(run_id)}
    out = {}
    for name in names:
        if name in present:
            out[name] = Path(client.download_artifacts(run_id, name, str(dest)))
    return out


def _param_value(v: Any) -> str:
    s = "null" if v is None else str(v)
    return s if len(s) <= 6000 else s[:5997] + "..."


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


# --------------------------------------------------------------------------- UI: descriptions, views, tables


def set_description(uri: str, run_id: str, text: str) -> None:
    """A run's description (the ``mlflow.note.content`` tag the UI shows above its details)."""
    from rag_ablate.tracking.tags import NOTE_TAG

    _client(uri).set_tag(run_id, NOTE_TAG, text)


def set_tags(uri: str, run_id: str, tags: Mapping[str, str]) -> None:
    """Tags of a run, in one call (the ranked view's text columns: rag_ablate.tracking.ui.rank_columns)."""
    from mlflow.entities import RunTag

    _client(uri).log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


def save_view(
    uri: str, experiment_id: str, parent_run_id: str, state: Mapping[str, Any], ui_port: int
) -> str:
    """Store a runs-table view as an experiment tag the UI opens by its key; the key.

    The sweep run gets the key as its ``rag_ablate.ui_view`` tag and the port its links use as
    ``rag_ablate.ui_port``, so ``rag-ablate ui`` can print the link of the latest sweep and serve it
    on that port.
    """
    import json

    from rag_ablate.tracking.tags import UI_PORT_TAG, VIEW_KEY_TAG, VIEW_TAG_PREFIX
    from rag_ablate.tracking.ui import view_key

    key = view_key(state)
    client = _client(uri)
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, json.dumps(dict(state)))
    client.set_tag(parent_run_id, VIEW_KEY_TAG, key)
    client.set_tag(parent_run_id, UI_PORT_TAG, str(ui_port))
    return key


def log_table(uri: str, run_id: str, columns: Mapping[str, list[Any]], artifact_file: str) -> None:
    """A table (column name -> values) as a run's table artifact (``mlflow.log_table``)."""
    _client(uri).log_table(run_id, data=dict(columns), artifact_file=artifact_file)


def latest_sweep_view(uri: str, experiment: str) -> tuple[str, str | None, int | None] | None:
    """(experiment id, view key of its latest sweep run or None, the port that sweep's links use
    or None); None without the experiment."""
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    from rag_ablate.tracking.tags import UI_PORT_TAG, VIEW_KEY_TAG

    runs = client.search_runs(
        [exp.experiment_id],
        filter_string="tags.`rag_ablate.kind` = 'sweep'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    tags = runs[0].data.tags if runs else {}
    port = tags.get(UI_PORT_TAG, "")
    return str(exp.experiment_id), tags.get(VIEW_KEY_TAG), int(port) if port.isdigit() else None
