"""Where a study lives: Optuna storages from URLs, opened so that several workers can share one.

Accepted storage URLs:

- any SQLAlchemy database URL Optuna's `RDBStorage` takes: `sqlite:///mlruns/optuna.db`
  (the default; relative paths are relative to the current directory), `postgresql://...`,
  `mysql+pymysql://...`. Database storages get a heartbeat, so a trial whose worker died
  (killed, machine lost) is marked failed after `HEARTBEAT_GRACE_S` and its slot reused.
- `journal:PATH`: Optuna's journal file (one append-only file, safe for processes on one
  machine or an NFS share; no heartbeat: after a worker is killed with SIGKILL, run
  `evolve tune SPEC --fail-running` once no other worker is active).
- `redis://...`: Optuna's journal on Redis (needs the `redis` package).

A URL must not carry a password: PostgreSQL and MySQL clients read it from PGPASSWORD /
~/.pgpass or an option file, which keeps it out of spec files, logs and MLflow.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlparse

import optuna
from optuna.trial import TrialState

from evolve.errors import ConfigError

HEARTBEAT_INTERVAL_S = 60
HEARTBEAT_GRACE_S = 300
# sqlite: wait for another worker's write instead of failing with "database is locked".
_SQLITE_TIMEOUT_S = 60
_CREATE_ATTEMPTS = 5


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
        raise ConfigError(
            f"storage {url!r} is not a URL; use e.g. sqlite:///mlruns/optuna.db, "
            "postgresql://user@host/db or journal:PATH"
        )
    if parsed.password:
        raise ConfigError(
            f"storage URL {redact_storage_url(url)} carries a password; remove it and let the "
            "database client read it (PGPASSWORD or ~/.pgpass for PostgreSQL, an option file "
            "for MySQL)"
        )


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url` (see the module docstring); creates local directories."""
    url = normalize_storage_url(url)
    _check_url(url)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith("redis://") or url.startswith("rediss://"):
        from optuna.storages.journal import JournalRedisBackend, JournalStorage

        try:
            return JournalStorage(JournalRedisBackend(url))
        except ImportError:
            raise ConfigError(
                f"storage {redact_storage_url(url)} needs the 'redis' package; install it "
                "or use a database URL"
            ) from None
    engine_kwargs: dict = {}
    if url.startswith("sqlite:"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": _SQLITE_TIMEOUT_S}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # Two workers starting together may both create the schema of a new database; the
        # loser sees a transient error and simply retries against the finished schema.
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                return optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=HEARTBEAT_INTERVAL_S,
                    grace_period=HEARTBEAT_GRACE_S,
                )
            except ImportError as error:
                raise ConfigError(
                    f"storage {redact_storage_url(url)} needs a database driver: {error}"
                ) from None
            except Exception:
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def open_study(
    url: str | None,
    study_name: str,
    *,
    directions: Sequence[str],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
    load_if_exists: bool,
) -> optuna.Study:
    storage = open_storage(url) if url is not None else optuna.storages.InMemoryStorage()
    for attempt in range(_CREATE_ATTEMPTS):
        try:
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
                    f"a study named {study_name!r} already exists in "
                    f"{redact_storage_url(normalize_storage_url(url or ''))}; set [tuning] "
                    "load_if_exists = true to resume it, or choose another study_name"
                ) from None
            # Created by another worker between our lookup and our insert: load it.
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


def fail_stale_trials(study: optuna.Study) -> None:
    """Mark trials whose worker stopped sending heartbeats as failed (database storages)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def fail_running_trials(study: optuna.Study) -> list[int]:
    """Mark every RUNNING trial failed; only safe when no worker of the study is active."""
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            study._storage.set_trial_user_attr(trial._trial_id, "evolve.failed", "--fail-running")
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
            failed.append(trial.number)
    return failed


@contextlib.contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Keep a database trial's heartbeat alive while it runs (what `study.optimize` does).

    Optuna exposes the heartbeat thread only privately; without it (another Optuna version)
    trials simply run without one, as on a journal storage.
    """
    try:
        from optuna.storages._heartbeat import get_heartbeat_thread
    except ImportError:  # pragma: no cover - depends on the Optuna version
        yield
        return
    with get_heartbeat_thread(trial._trial_id, study._storage):
        yield
