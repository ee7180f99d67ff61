"""Where a study lives: Optuna storages from URLs, opened so that several workers can share one.

Accepted storage URLs:

- any SQLAlchemy database URL Optuna's `RDBStorage` takes: `sqlite:///mlruns/optuna.db`
  (the default; relative paths are relative to the current directory),
  `postgresql+psycopg://USER@HOST:PORT/DB` (psycopg 3, the extra `amemgym-evolve[postgres]`;
  SQLAlchemy 2.1 also opens a bare `postgresql://` with it),
  `mysql+pymysql://...`. Database storages get Optuna's heartbeat: a trial whose worker died
  (killed, machine lost) is failed once its heartbeat is older than `[tuning]
  heartbeat_grace_s` and retried with the same parameters (`RetryHeartbeatStaleTrialCallback`).
- `journal:PATH`: Optuna's journal file (one append-only file, safe for processes on one
  machine or an NFS share; no heartbeat: after a worker is killed with SIGKILL, run
  `evolve tune SPEC --fail-running` once no other worker is active).
- `redis://...`: Optuna's journal on Redis (needs the `redis` package).

A URL must not carry a password: PostgreSQL and MySQL clients read it from PGPASSWORD /
~/.pgpass or an option file, which keeps it out of spec files, logs and MLflow.

Errors are one line: a URL that names no known database or a driver that is not installed
is a `ConfigError` (checked by `check_storage_url` before any LLM call); a database that
refuses (wrong password, unreachable, not a database) is a `StorageError`. Only the race of
two workers creating the schema of a new database is retried.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import optuna
import sqlalchemy
import sqlalchemy.event
import sqlalchemy.exc
from optuna.trial import TrialState

from evolve.core.errors import ConfigError, StorageError
from evolve.stores.database_urls import missing_driver_message

DEFAULT_HEARTBEAT_GRACE_S = 120
# sqlite: wait for another worker's write instead of failing with "database is locked".
_SQLITE_TIMEOUT_S = 60
_CREATE_ATTEMPTS = 5
# What another worker creating the same tables or version row at the same moment looks like
# (sqlite, PostgreSQL, MySQL); anything else is a real error and is not retried.
_SCHEMA_RACE_MARKERS = ("already exists", "duplicate", "unique constraint", "database is locked")
_URL_FORMS = (
    "sqlite:///PATH, postgresql+psycopg://USER@HOST/DB, mysql+pymysql://USER@HOST/DB, "
    "journal:PATH "
    "or redis://HOST"
)


def heartbeat_interval_for(grace_s: int) -> int:
    """Seconds between heartbeats: several fit in the grace period, so one slow database
    write does not fail a live trial (Optuna takes whole seconds)."""
    return max(1, min(60, grace_s // 4))


def normalize_storage_url(url: str) -> str:
    """Relative sqlite / journal paths made absolute (relative to the current directory)."""
    url = url.strip()
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    if url.startswith("journal:"):
        return f"journal:{Path(url.removeprefix('journal:')).expanduser().resolve()}"
    return url


def redact_storage_url(url: str) -> str:
    """The URL without user name or password (for logs, tables and MLflow)."""
    parsed = urlparse(url)
    if parsed.username or parsed.password:
        host = parsed.hostname or ""
        port = f":{parsed.port}" if parsed.port else ""
        return parsed._replace(netloc=f"***@{host}{port}").geturl()
    return url


def _check_url(url: str) -> None:
    if url.startswith("journal:"):
        if not url.removeprefix("journal:"):
            raise ConfigError("storage 'journal:' needs a file path, e.g. journal:mlruns/tune.log")
        return
    parsed = urlparse(url)
    if not parsed.scheme or "://" not in url:
        raise ConfigError(f"storage {url!r} is not a URL; use {_URL_FORMS}")
    if parsed.password:
        raise ConfigError(
            f"storage URL {redact_storage_url(url)} carries a password; remove it and let the "
            "database client read it (PGPASSWORD or ~/.pgpass for PostgreSQL, an option file "
            "for MySQL)"
        )


def storage_has_heartbeat(url: str | None) -> bool:
    """Whether trials in this storage get a heartbeat (database storages only)."""
    if url is None:
        return False
    url = url.strip()
    return not (url.startswith(("journal:", "redis://", "rediss://")))


def check_storage_url(url: str) -> None:
    """Refuse a storage URL that cannot work, without connecting: not a URL, a password in
    it, an unknown database, or a database driver that is not installed."""
    url = normalize_storage_url(url)
    _check_url(url)
    if url.startswith("journal:"):
        return
    if url.startswith(("redis://", "rediss://")):
        try:
            import redis  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"storage {redact_storage_url(url)} needs the 'redis' package: pip install "
                "redis (or use a database URL or journal:PATH)"
            ) from None
        return
    shown = redact_storage_url(url)
    try:
        sqlalchemy.engine.make_url(url).get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"storage {shown}: {scheme!r} is not a database SQLAlchemy knows; use {_URL_FORMS}"
        ) from None
    except sqlalchemy.exc.ArgumentError as error:
        raise ConfigError(
            f"storage {shown} is not a valid database URL ({error}); use {_URL_FORMS}"
        ) from None
    message = missing_driver_message(url)
    if message:
        raise ConfigError(f"storage {shown}: {message}")


def storage_directory(url: str) -> Path | None:
    """The local directory a sqlite or journal storage lives in (None: a server, or memory)."""
    url = normalize_storage_url(url)
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:")).parent
    if url.startswith("sqlite:///") and url.removeprefix("sqlite:///") not in ("", ":memory:"):
        return Path(url.removeprefix("sqlite:///")).parent
    return None


def prepare_storage_directory(url: str, *, create: bool) -> None:
    """Refuse a sqlite or journal storage whose directory does not exist, or create it when
    asked: a missing directory is usually a typo in the path, and creating a whole tree
    there (as root, anywhere) would hide it."""
    directory = storage_directory(url)
    if directory is None or directory.is_dir():
        return
    shown = redact_storage_url(normalize_storage_url(url))
    if not create:
        raise ConfigError(
            f"study storage {shown}: its directory {directory} does not exist; fix the path, "
            f"create the directory (mkdir -p {directory}), or let evolve create it with "
            "--create-storage-dir or [tuning] create_storage_dir = true"
        )
    with _database_errors(url):  # a read-only parent is an OSError
        directory.mkdir(parents=True, exist_ok=True)


def open_storage(
    url: str, *, heartbeat_grace_s: int | None = DEFAULT_HEARTBEAT_GRACE_S
) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url` (see the module docstring). The directory of a sqlite or
    journal storage must exist (`prepare_storage_directory` creates it when asked).

    Database storages get a heartbeat with `heartbeat_grace_s` (None: no heartbeat, for
    ask/tell users such as the evolution loop's parameter proposer).
    """
    url = normalize_storage_url(url)
    check_storage_url(url)
    prepare_storage_directory(url, create=False)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal:"))
        with _database_errors(url):
            return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith(("redis://", "rediss://")):
        from optuna.storages.journal import JournalRedisBackend, JournalStorage

        with _database_errors(url):
            return JournalStorage(JournalRedisBackend(url))
    engine_kwargs: dict = {}
    if url.startswith("sqlite:"):
        engine_kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
    with warnings.catch_warnings():
        # The heartbeat and its retry callback are marked experimental; they are tested here.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        heartbeat: dict = {}
        if heartbeat_grace_s is not None:
            heartbeat = {
                "heartbeat_interval": heartbeat_interval_for(heartbeat_grace_s),
                "grace_period": heartbeat_grace_s,
                # A trial failed by its stale heartbeat (its worker died) is queued again
                # with the same parameters; the next free worker runs it.
                "heartbeat_stale_trial_callback": (
                    optuna.storages.RetryHeartbeatStaleTrialCallback()
                ),
            }
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                with _database_errors(url):
                    storage = optuna.storages.RDBStorage(
                        url, engine_kwargs=engine_kwargs, **heartbeat
                    )
                if url.startswith("sqlite:"):
                    _serialize_sqlite_transactions(storage.engine)
                return storage
            except _SchemaRace:
                # Two workers starting together on a new database both create its schema;
                # the loser retries against the finished one.
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise StorageError(
                        f"could not create the schema of study storage "
                        f"{redact_storage_url(url)}: other workers kept creating it; retry"
                    ) from None
                time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _serialize_sqlite_transactions(engine: sqlalchemy.engine.Engine) -> None:
    """Make every transaction on this sqlite engine take the write lock when it begins.

    Python's sqlite3 driver starts a transaction only at the first write, so the read and
    the write of Optuna's "pop a queued trial" (WAITING -> RUNNING) run in different
    transactions and two workers can pop the same trial (seen: one grid point evaluated by
    two processes). SQLAlchemy's documented pysqlite recipe: let the driver autocommit and
    emit BEGIN IMMEDIATE ourselves. PostgreSQL and MySQL lock the row (FOR UPDATE) already.
    """

    @sqlalchemy.event.listens_for(engine, "connect")
    def _driver_autocommit(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners lack the driver setting


class _SchemaRace(Exception):
    """Another process is creating the same database schema right now."""


@contextlib.contextmanager
def _database_errors(url: str) -> Iterator[None]:
    """Database failures as one-line `StorageError`s (a schema race as `_SchemaRace`)."""
    try:
        yield
    except sqlalchemy.exc.SQLAlchemyError as error:
        detail = _first_line(getattr(error, "orig", None) or error)
        if isinstance(error, sqlalchemy.exc.DBAPIError) and any(
            marker in detail.lower() for marker in _SCHEMA_RACE_MARKERS
        ):
            raise _SchemaRace(detail) from None
        raise StorageError(_refused(url, detail)) from None
    except (OSError, RuntimeError) as error:
        # RuntimeError: Optuna's schema version check ("... optuna storage upgrade ...").
        raise StorageError(_refused(url, _first_line(error))) from None


def _refused(url: str, detail: str) -> str:
    shown = redact_storage_url(url)
    if url.startswith(("sqlite:", "journal:")):
        fix = (
            "check that the file is an Optuna study database or journal (or choose a new "
            "path) and that its directory exists and is writable"
        )
    else:
        fix = (
            "check the host, port and database name and that the database accepts this user "
            "(the password comes from PGPASSWORD / ~/.pgpass or a MySQL option file)"
        )
    return f"study storage {shown} refused: {detail}; {fix}"


def _first_line(error: BaseException | object) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0].strip()


def open_study(
    url: str | None,
    study_name: str,
    *,
    directions: Sequence[str],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    load_if_exists: bool,
    heartbeat_grace_s: int | None = DEFAULT_HEARTBEAT_GRACE_S,
) -> optuna.Study:
    if url is None:
        storage: optuna.storages.BaseStorage = optuna.storages.InMemoryStorage()
    else:
        storage = open_storage(url, heartbeat_grace_s=heartbeat_grace_s)
    label = redact_storage_url(normalize_storage_url(url or ""))
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            with _database_errors(url or ""):
                study = optuna.create_study(
                    storage=storage,
                    study_name=study_name,
                    directions=list(directions),
                    sampler=sampler,
                    pruner=pruner,
                    load_if_exists=load_if_exists,
                )
            break
        except optuna.exceptions.DuplicatedStudyError:
            if not load_if_exists:
                raise ConfigError(
                    f"a study named {study_name!r} already exists in {label}; set [tuning] "
                    "load_if_exists = true to resume it, or choose another study_name"
                ) from None
            # Created by another worker between our lookup and our insert: load it.
            time.sleep(0.2 * (attempt + 1))
        except _SchemaRace:
            time.sleep(0.2 * (attempt + 1))
    else:
        raise ConfigError(f"could not create or load study {study_name!r}; retry")
    existing = [d.name.lower() for d in study.directions]
    if existing != [d.lower() for d in directions]:
        raise ConfigError(
            f"study {study_name!r} optimizes {existing}, the spec asks for {list(directions)}; "
            "choose another study_name for other objectives"
        )
    return study


@contextlib.contextmanager
def storage_errors(url: str | None) -> Iterator[None]:
    """Database failures while trials run (e.g. the server went away) as one-line errors."""
    try:
        yield
    except sqlalchemy.exc.SQLAlchemyError as error:
        if url is None:
            raise
        detail = _first_line(getattr(error, "orig", None) or error)
        raise StorageError(_refused(url, detail)) from None


def fail_stale_trials(
    study: optuna.Study, url: str | None, grace_s: int, beatless_since: dict[int, float]
) -> None:
    """Fail trials whose worker stopped sending heartbeats (database storages); the storage's
    retry callback queues each again with the same parameters.

    Optuna never counts stale a trial that has no heartbeat at all: one whose worker was
    killed between creating the trial and its first heartbeat, a few milliseconds. Such a
    trial would hold the study forever, so it is failed and retried the same way once this
    process has seen it without a heartbeat for `grace_s` (a live worker sends its first
    heartbeat at once). `beatless_since` holds, per trial number, when this process first
    saw it so, on its own monotonic clock: workers' clocks and time zones never enter.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
        if url is None or not storage_has_heartbeat(url):
            return
        now = time.monotonic()
        beatless = _running_trials_without_heartbeat(url, study.study_name)
        for number in list(beatless_since):
            if number not in beatless:
                del beatless_since[number]  # it beat, or it ended
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback()
        for number in beatless:
            if now - beatless_since.setdefault(number, now) >= grace_s:
                trial = study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
                retry(study, trial)
                del beatless_since[number]


def _running_trials_without_heartbeat(url: str, study_name: str) -> set[int]:
    """Numbers of the study's RUNNING trials without a heartbeat row. Optuna has no public
    reader of heartbeats, so its schema's tables are read directly (`trials`, `studies`,
    `trial_heartbeats`)."""
    query = sqlalchemy.text(
        "SELECT t.number FROM trials t "
        "JOIN studies s ON s.study_id = t.study_id "
        "LEFT JOIN trial_heartbeats h ON h.trial_id = t.trial_id "
        "WHERE s.study_name = :name AND t.state = 'RUNNING' AND h.trial_id IS NULL"
    )
    with _database_errors(url), _reader_engine(url).connect() as connection:
        return {number for (number,) in connection.execute(query, {"name": study_name})}


@functools.cache
def _reader_engine(url: str) -> sqlalchemy.engine.Engine:
    """One engine per storage per process, for the heartbeat check's reads."""
    url = normalize_storage_url(url)
    connect_args = {"timeout": _SQLITE_TIMEOUT_S} if url.startswith("sqlite:") else {}
    return sqlalchemy.create_engine(url, connect_args=connect_args)


def fail_running_trials(study: optuna.Study) -> list[int]:
    """Mark every RUNNING trial failed; only safe when no worker of the study is active."""
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        failed.append(trial.number)
    return failed


def name_objectives(study: optuna.Study, objectives: Sequence[str]) -> None:
    """Name the study's values after the spec's objectives (`memory_score`, `cost`), so
    optuna-dashboard and `study.trials_dataframe()` show them, not "Objective 0"."""
    if study.metric_names == list(objectives):
        return
    with warnings.catch_warnings():  # `set_metric_names` is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(objectives))
