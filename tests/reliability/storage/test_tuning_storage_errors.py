"""A bad study storage is a one-line error, at once.

- an unknown URL scheme and a missing database driver are refused before any LLM call, and
  the driver message says what to install (SQLAlchemy 2.1 opens postgresql:// with psycopg 3);
- a database that refuses (bad password, not a database) fails once with exit 5, without
  the blind retries that used to take ~7.5 s and end in a 137-line traceback;
- only the schema-creation race of two workers on a new database is retried.
"""

from __future__ import annotations

import sys
import time

import optuna
import pytest
import sqlalchemy.exc
from tuning.tune_helpers import PAPER_GRID, write_tune_spec

from evolve.cli import main
from evolve.core.errors import EXIT_BAD_INPUT, EXIT_STORAGE, StorageError
from evolve.tuning.storage import open_storage

GRID = f'sampler = "grid"\ntrials = 1\nheldout = "none"\n[tuning.parameters]\n{PAPER_GRID}'


def _tune(tmp_path, stub, monkeypatch, storage: str) -> int:
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache"))
    spec = write_tune_spec(tmp_path, f'storage = "{storage}"\n{GRID}')
    return main(
        ["tune", str(spec), "--no-progress", "--no-tracking", "--runs-dir", str(tmp_path / "r")]
        + ["--base-url", stub.base_url, "--model", "stub"]
    )


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("evolve: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_an_unknown_storage_scheme_is_refused_before_any_llm_call(
    tmp_path, stub, monkeypatch, capsys
):
    assert _tune(tmp_path, stub, monkeypatch, "nosuchdb://x") == EXIT_BAD_INPUT
    line = _error_line(capsys.readouterr().err)
    assert "nosuchdb" in line and "sqlite:///" in line and "journal:" in line
    assert stub.stats()["chat_requests"] == 0


@pytest.mark.parametrize(
    ("url", "module", "install"),
    [
        ("postgresql://me@127.0.0.1:1/optuna", "psycopg", "pip install 'amemgym-evolve[postgres]'"),
        (
            "postgresql+psycopg://me@127.0.0.1:1/optuna",
            "psycopg",
            "pip install 'amemgym-evolve[postgres]'",
        ),
        ("mysql://me@127.0.0.1:1/optuna", "MySQLdb", "pip install mysqlclient"),
        ("mysql+pymysql://me@127.0.0.1:1/optuna", "pymysql", "pip install PyMySQL"),
    ],
)
def test_a_missing_database_driver_says_what_to_install(
    tmp_path, stub, monkeypatch, capsys, url, module, install
):
    monkeypatch.setitem(sys.modules, module, None)  # not installed, whatever this machine has
    assert _tune(tmp_path, stub, monkeypatch, url) == EXIT_BAD_INPUT
    line = _error_line(capsys.readouterr().err)
    assert install in line and "@127.0.0.1:1/optuna" in line
    assert stub.stats()["chat_requests"] == 0


def test_a_file_that_is_not_a_database_fails_once_in_one_line(tmp_path, stub, monkeypatch, capsys):
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a sqlite database, just text " * 200)
    started = time.monotonic()
    assert _tune(tmp_path, stub, monkeypatch, f"sqlite:///{garbage}") == EXIT_STORAGE
    elapsed = time.monotonic() - started
    line = _error_line(capsys.readouterr().err)
    assert "not a database" in line and str(garbage) in line
    assert elapsed < 5.0, f"took {elapsed:.1f} s: retried a permanent error"
    assert stub.stats()["chat_requests"] == 0


def _refusing_storage(monkeypatch, errors: list[Exception]) -> list[int]:
    """RDBStorage raising `errors` in turn, then opening for real; returns the call count."""
    real = optuna.storages.RDBStorage
    calls: list[int] = []

    def storage(*args, **kwargs):
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return real(*args, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", storage)
    return calls


def _operational(message: str) -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(message))


def test_a_refused_password_is_not_retried(tmp_path, monkeypatch):
    refused = _operational('FATAL:  password authentication failed for user "me"')
    calls = _refusing_storage(monkeypatch, [refused] * 10)
    started = time.monotonic()
    with pytest.raises(StorageError) as error:
        open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert time.monotonic() - started < 1.0 and len(calls) == 1
    message = str(error.value)
    assert "password authentication failed" in message and "\n" not in message
    assert error.value.exit_code == EXIT_STORAGE


@pytest.mark.parametrize(
    "race",
    [
        _operational("table studies already exists"),
        sqlalchemy.exc.IntegrityError(
            "INSERT", {}, Exception("UNIQUE constraint failed: version_info.version_info_id")
        ),
    ],
)
def test_the_schema_creation_race_is_retried(tmp_path, monkeypatch, race):
    calls = _refusing_storage(monkeypatch, [race])
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    assert len(calls) == 2
    assert storage.get_all_studies() == []
