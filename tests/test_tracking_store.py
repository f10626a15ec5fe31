"""The sqlite MLflow store: built once (from a per-machine template of MLflow's own schema),
then reopened without touching its schema; MLflow reads it as one it built itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from rag_ablate.tracking import store as tracking


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The template lives in this test's own cache folder, not the user's."""
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _lines(sql: str | None) -> str | None:
    """A CREATE statement's clauses in sorted order (MLflow's own migrations emit a table's
    constraints in varying order from one creation to the next)."""
    if sql is None:
        return None
    return "\n".join(sorted(line.strip().rstrip(",").strip() for line in sql.splitlines()))


def _schema(db: Path) -> tuple[set[tuple[str, str, str | None]], list[tuple[str, ...]], int]:
    """(every table, index and trigger with its SQL, the alembic revision, PRAGMA schema_version)."""
    with sqlite3.connect(db) as con:
        objects = {
            (str(t), str(n), _lines(s))
            for t, n, s in con.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
        }
        revision = [tuple(r) for r in con.execute("SELECT version_num FROM alembic_version")]
        version = int(con.execute("PRAGMA schema_version").fetchone()[0])
    con.close()
    return objects, revision, version


def _open(root: Path) -> tuple[str, str, Path]:
    uri = tracking.default_uri(root)
    experiment_id = tracking.open_store(uri, "rag_ablate", root / "mlartifacts", create_folder=True)
    db = tracking.sqlite_path(uri)
    assert db is not None
    return uri, experiment_id, db


@pytest.mark.slow
def test_new_store_has_the_schema_mlflow_builds_itself(tmp_path: Path) -> None:
    _, _, db = _open(tmp_path / "ours")
    assert tracking.template_path().is_file()  # built once, for the next new store
    # MLflow's own creation (every migration, one by one) of another store
    theirs = tmp_path / "theirs" / "mlflow.db"
    theirs.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{theirs}").search_experiments()
    ours_schema, ours_rev, _ = _schema(db)
    theirs_schema, theirs_rev, _ = _schema(theirs)
    assert ours_rev == theirs_rev and len(ours_rev) == 1
    assert ours_schema == theirs_schema
    assert any(kind == "table" and name == "runs" for kind, name, _ in ours_schema)
    with sqlite3.connect(db) as con:  # sqlite's default journal: one file, as MLflow's own
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    con.close()


def test_store_is_created_once_and_reopened_without_schema_changes(tmp_path: Path) -> None:
    uri, experiment_id, db = _open(tmp_path / "out")
    run_id = tracking.log_run(
        uri,
        experiment_id,
        "baseline",
        params={"chunk.size": 512},
        metrics={"dev/recall_at_5": 0.5},
        tags={},
        artifacts_dir=None,
    )
    inode, schema = db.stat().st_ino, _schema(db)
    # a second open (a second sweep into the same folder): same file, schema untouched (no migration
    # and no rebuild: sqlite's schema_version counts every CREATE and ALTER), the runs still there
    assert tracking.create_sqlite(uri, db) is False
    assert tracking.open_store(uri, "rag_ablate", tmp_path / "out" / "mlartifacts") == experiment_id
    assert db.stat().st_ino == inode and _schema(db) == schema
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).data.metrics == {"dev/recall_at_5": 0.5}
    runs = client.search_runs([experiment_id])
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"


def test_template_is_built_once_and_copied_into_each_new_folder(tmp_path: Path) -> None:
    _, _, first = _open(tmp_path / "a")
    template = tracking.template_path()
    stamp = template.stat().st_mtime_ns
    _, experiment_id, second = _open(tmp_path / "b")
    assert template.stat().st_mtime_ns == stamp  # not rebuilt
    assert _schema(first)[:2] == _schema(second)[:2]
    assert first.stat().st_ino != second.stat().st_ino
    assert MlflowClient(tracking_uri=tracking.default_uri(tmp_path / "b")).get_experiment(
        experiment_id
    ).name == ("rag_ablate")


def test_empty_file_counts_as_a_new_store(tmp_path: Path) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "mlflow.db").touch()  # e.g. made by `sqlite3 mlflow.db .quit`
    uri, experiment_id, db = _open(root)
    assert db.stat().st_size > 0
    assert MlflowClient(tracking_uri=uri).get_experiment(experiment_id).name == "rag_ablate"


@pytest.mark.slow
def test_without_a_writable_cache_folder_the_store_is_built_beside_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("", encoding="utf-8")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # the template cannot be written under a file
    uri, experiment_id, db = _open(tmp_path / "out")
    assert not tracking.template_path().exists()
    assert sorted(p.name for p in db.parent.iterdir() if p.name.startswith(".")) == []  # no scratch left
    theirs = tmp_path / "theirs.db"
    MlflowClient(tracking_uri=f"sqlite:///{theirs}").search_experiments()
    assert _schema(db)[:2] == _schema(theirs)[:2]
    assert MlflowClient(tracking_uri=uri).get_experiment(experiment_id).name == "rag_ablate"


@pytest.mark.slow  # imports MLflow (seconds)
def test_mlflow_s_database_errors_are_logged_without_a_traceback(tmp_path: Path) -> None:
    """A full disk under the sqlite store: MLflow logs the OperationalError with its traceback
    before raising it (issue 23's fault injection found the traceback printed under the run's own
    one-line error); once a store's client exists the log keeps one line with the cause."""
    import io
    import logging

    tracking._client(f"sqlite:///{tmp_path / 'mlflow.db'}")  # every call to a store goes through one
    logger = logging.getLogger("mlflow.store.db.utils")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            logger.exception("SQLAlchemy database error. The following exception is caught.\n%s", exc)
    finally:
        logger.removeHandler(handler)
    assert "Traceback" not in out.getvalue()
    assert out.getvalue().strip() == (
        "SQLAlchemy database error. The following exception is caught. "
        "(OperationalError: database or disk is full)"
    )


def _commits(uri: str) -> list[int]:
    """A list that grows by one at each commit of the store's database (MLflow's engine for ``uri``)."""
    from mlflow.tracing.client import TracingClient
    from sqlalchemy import event

    seen: list[int] = []
    event.listen(TracingClient(uri).store.engine, "commit", lambda _conn: seen.append(1))
    return seen


def test_a_run_is_logged_in_one_commit(tmp_path: Path) -> None:
    """Params, metrics, tags, artifacts and the end of a run: one transaction, so one wait for the
    disk (MLflow alone commits each call: create, each log_batch, the end), and all of it stored."""
    uri, experiment_id, _ = _open(tmp_path / "out")
    files = tmp_path / "job"
    files.mkdir()
    (files / "metrics.json").write_text("{}", encoding="utf-8")
    commits = _commits(uri)
    params = {f"p{i:03d}": i for i in range(150)}  # two log_batch calls of params
    run_id = tracking.log_run(
        uri, experiment_id, "v", params=params, metrics={"m": 0.5}, tags={"t": "x"}, artifacts_dir=files
    )
    assert len(commits) == 1
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {k: str(v) for k, v in params.items()}
    assert run.data.metrics == {"m": 0.5}
    assert run.data.tags["t"] == "x"
    assert [a.path for a in MlflowClient(tracking_uri=uri).list_artifacts(run_id)] == ["metrics.json"]


def test_an_experiment_is_read_once_in_a_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow reads the experiment for each trace it starts; in one transaction it is read once."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracing.client import TracingClient

    uri, experiment_id, _ = _open(tmp_path / "out")
    reads: list[str] = []
    real = SqlAlchemyStore.get_experiment

    def counted(self: SqlAlchemyStore, eid: str) -> object:
        reads.append(eid)
        return real(self, eid)

    monkeypatch.setattr(SqlAlchemyStore, "get_experiment", counted)
    store = TracingClient(uri).store
    names: list[str] = []
    tracking.in_one_transaction(
        uri, lambda: names.extend(store.get_experiment(experiment_id).name for _ in range(3))
    )
    assert names == ["rag_ablate"] * 3 and reads == [experiment_id]
    assert "get_experiment" not in vars(store)  # the store's own method again after the block
    store.get_experiment(experiment_id)
    assert len(reads) == 2


def test_a_transaction_that_fails_part_way_stores_nothing_and_is_redone_call_by_call(tmp_path: Path) -> None:
    uri, experiment_id, _ = _open(tmp_path / "out")
    client = MlflowClient(tracking_uri=uri)
    attempts: list[str] = []

    def write() -> None:
        run = client.create_run(experiment_id, run_name="v")
        attempts.append(run.info.run_id)
        if len(attempts) == 1:  # the first attempt fails after its first write
            raise RuntimeError("conflict")
        client.log_param(run.info.run_id, "p", "1")

    tracking.in_one_transaction(uri, write)
    runs = client.search_runs([experiment_id])
    assert len(attempts) == 2
    assert [r.info.run_id for r in runs] == [attempts[1]]  # the first attempt's run was rolled back
    assert runs[0].data.params == {"p": "1"}
    with pytest.raises(RuntimeError, match="always"):  # an error that is not a conflict is raised

        def broken() -> None:
            raise RuntimeError("always")

        tracking.in_one_transaction(uri, broken)
