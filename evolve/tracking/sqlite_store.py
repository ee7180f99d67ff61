"""An MLflow sqlite store is created or upgraded whole, or not at all.

MLflow builds a sqlite store's schema on first open, in place: its initial tables, then every
alembic migration up to its head revision, each statement committed on its own (sqlite's
driver does not wrap DDL in the migration's transaction). A kill or Ctrl-C in those seconds
left a half-migrated store that every later open refused (`duplicate column name`, `table
... already exists`). Here the schema is built, or an older store upgraded, in a temporary
file beside the store, and renamed over the store path only once it is complete; the store
path thus holds either no store or a complete one, whenever the process dies. Callers hold
the store's creation lock (`evolve.tracking.store.store_creation_lock`), so temporary files
left by a killed process can be removed.

A half-migrated store written before this existed is detected (its alembic revision is not
MLflow's head, or tables are missing, and migrating a copy fails). Holding no tracked data
(an interrupted first run), it is set aside as `<name>.broken-<time>` and created anew;
holding data, it is refused unchanged in one line.

Why hand-written: MLflow migrates in place and offers no hook around it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from evolve.core.errors import StorageError

logger = logging.getLogger(__name__)

_PARTIAL = ".partial"
# Tables whose rows are a user's tracked work (the default experiment, id 0, is not).
_DATA_TABLES = ("runs", "registered_models", "model_versions", "trace_info", "logged_models")


@dataclass(frozen=True)
class StoreState:
    """What a sqlite file holds, read without changing it beyond rolling back a hot journal."""

    tables: frozenset[str]
    revision: str | None
    data_rows: int

    @property
    def is_empty(self) -> bool:
        return not self.tables


@functools.cache
def _schema() -> tuple[str, frozenset[str], frozenset[str]]:
    """MLflow's head revision, every revision it knows, and the tables of its schema."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(""))
    (head,) = script.get_heads()
    known = frozenset(revision.revision for revision in script.walk_revisions())
    return head, known, frozenset(Base.metadata.tables)


def _partial_path(db_path: Path) -> Path:
    return db_path.with_name(f".{db_path.name}.{os.getpid()}{_PARTIAL}")


def _remove_leftovers(db_path: Path) -> None:
    """Temporary stores (and their journals) of processes killed while building one."""
    for leftover in db_path.parent.glob(f".{db_path.name}.*{_PARTIAL}*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


def read_state(db_path: Path) -> StoreState:
    """Tables, alembic revision and tracked rows of an existing sqlite file.

    Opened read-write: a transaction cut by a kill left a hot journal, which only a writer can
    roll back (a read-only open reports "attempt to write a readonly database")."""
    connection = sqlite3.connect(db_path, timeout=60)
    try:
        tables = frozenset(
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        )
        revision = None
        if "alembic_version" in tables:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
        rows = sum(
            connection.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]  # noqa: S608
            for table in _DATA_TABLES
            if table in tables
        )
        if "experiments" in tables:
            rows += connection.execute(
                "SELECT COUNT(*) FROM experiments WHERE experiment_id != 0"
            ).fetchone()[0]
    finally:
        connection.close()
    return StoreState(tables, revision, rows)


def is_complete(state: StoreState) -> bool:
    head, _, expected = _schema()
    return state.revision == head and expected <= state.tables


def ensure_complete_store(db_path: Path) -> str | None:
    """Make `db_path` a complete MLflow store at MLflow's head revision (see the module
    docstring); call with the store's creation lock held. Returns a note when a broken store
    was set aside, else None. Raises `StorageError` for a file that must not be touched."""
    _remove_leftovers(db_path)
    if not db_path.exists() or db_path.stat().st_size == 0:
        _build(db_path, copy_of=None)
        return None
    state = read_state(db_path)
    if state.is_empty:
        _build(db_path, copy_of=None)
        return None
    if is_complete(state):
        return None
    head, known, expected = _schema()
    if state.revision is not None and state.revision not in known:
        raise StorageError(
            f"MLflow tracking DB {db_path} has schema revision {state.revision!r}, unknown to "
            f"the installed MLflow (head {head}): a newer MLflow wrote it; upgrade MLflow, or "
            "pass another --tracking-uri"
        )
    if state.revision is None and not expected & state.tables:
        shown = ", ".join(sorted(state.tables)[:5])
        raise StorageError(
            f"MLflow tracking DB {db_path} is a SQLite database of another program (tables "
            f"{shown}); expected an MLflow store or a new path; pass another --tracking-uri, "
            "e.g. sqlite:///mlruns/mlflow.db"
        )
    try:
        _build(db_path, copy_of=db_path)  # an older store upgraded, or a half-migrated one
        return None
    except _MigrationFailed as error:
        failure = error.reason
    missing = sorted(expected - state.tables)
    found = f"revision {state.revision or 'none'}" + (
        f", {len(missing)} table(s) missing" if missing else ""
    )
    if state.data_rows:
        raise StorageError(
            f"MLflow tracking DB {db_path} is half-migrated ({found}; MLflow needs {head}; "
            f"migrating a copy failed: {failure}) and holds {state.data_rows} tracked "
            "record(s); it was left unchanged: restore your backup of it, or keep it and "
            "track into a new store with --tracking-uri sqlite:///<dir>/mlflow-new.db"
        )
    aside = db_path.with_name(f"{db_path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(db_path, aside)
    _build(db_path, copy_of=None)
    return (
        f"MLflow tracking DB {db_path} was half-migrated ({found}: an interrupted first run) "
        f"and held no runs; it was moved to {aside.name} and created anew"
    )


class _MigrationFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _build(db_path: Path, *, copy_of: Path | None) -> None:
    """The store's schema built (or `copy_of` upgraded) in a temporary file, then renamed
    over `db_path`. Any failure or interrupt removes the temporary file."""
    partial = _partial_path(db_path)
    try:
        if copy_of is not None:
            _copy_database(copy_of, partial)
        _migrate(partial)
        _fsync(partial)
        os.replace(partial, db_path)
        _fsync(db_path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def _copy_database(source: Path, target: Path) -> None:
    """sqlite's online backup: a consistent copy even if a reader has the source open."""
    with (
        contextlib.closing(sqlite3.connect(source, timeout=60)) as src,
        contextlib.closing(sqlite3.connect(target)) as dst,
    ):
        src.backup(dst)


def _migrate(path: Path) -> None:
    """MLflow's own first-open steps (create the initial tables, migrate to head, verify) on
    the file at `path`, closed afterwards."""
    import sqlalchemy.event
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException
    from mlflow.store.db import utils

    engine = utils.create_sqlalchemy_engine(f"sqlite:///{path}")
    # No sync per statement: the file is thrown away unless complete, and it is synced once
    # before the rename (the migration's hundreds of commits ran seconds slower otherwise).
    sqlalchemy.event.listen(engine, "connect", _unsynced)
    try:
        try:
            if not utils._all_tables_exist(engine):
                utils._initialize_tables(engine)
            else:
                utils._upgrade_db(engine)
            utils._verify_schema(engine)
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as error:
            text = " ".join(str(error.orig if error.orig is not None else error).split())
            if _is_storage_failure(text):
                raise  # a full or read-only disk: the caller's storage error, not a bad store
            raise _MigrationFailed(text[:160]) from None
        except MlflowException as error:
            raise _MigrationFailed(" ".join(str(error).split())[:160]) from None
    finally:
        engine.dispose()


def _unsynced(dbapi_connection: sqlite3.Connection, _record: object) -> None:
    dbapi_connection.execute("PRAGMA synchronous = OFF")
    dbapi_connection.execute("PRAGMA journal_mode = MEMORY")


def _is_storage_failure(text: str) -> bool:
    lowered = text.lower()
    return any(
        marker in lowered
        for marker in ("disk is full", "disk i/o error", "readonly database", "unable to open")
    )


def _fsync(path: Path) -> None:
    """Flush a file or directory to disk: a power cut after the rename keeps the store."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
