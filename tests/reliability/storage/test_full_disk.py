"""A full disk under the MLflow store is one line with exit 5 (storage), never a traceback.

The disk is really full: a tiny tmpfs is mounted (root only), the store is created on it,
and the rest of it is filled before the run.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from reliability.process_helpers import llm_flags, run_in_process, write_tiny_spec
from stub_server import StubServer

from evolve.cli import storage_failure
from evolve.core.errors import EXIT_STORAGE, StorageError


@pytest.fixture
def tiny_filesystem(tmp_path: Path):
    """A 4 MiB tmpfs, unmounted afterwards; skipped where mounting is not allowed."""
    mount_point = tmp_path / "tiny-fs"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tiny filesystem, and mounting one needs root")
    command = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)]
    try:
        mounted = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command to make a tiny filesystem")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=30)


def _fill(directory: Path) -> None:
    """Write until the filesystem refuses: every later write there fails with ENOSPC."""
    with open(directory / "filler", "wb") as filler:
        block = b"\0" * 65536
        try:
            while True:
                filler.write(block)
                filler.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    with pytest.raises(OSError):
        (directory / "probe").write_bytes(b"x" * 8192)


def test_a_full_disk_under_the_mlflow_store_exits_5_in_one_line(tiny_filesystem, tmp_path, capsys):
    from evolve.tracking import mlflow_client

    home = tmp_path / "home"
    spec = write_tiny_spec(home, tracking=True)
    uri = f"sqlite:///{tiny_filesystem}/mlruns/mlflow.db"
    mlflow_client(uri)  # the store exists (its schema fits), then the disk fills up
    _fill(tiny_filesystem)
    capsys.readouterr()
    with StubServer(latency=0.0) as stub:
        args = ["run", str(spec), "--runs-dir", "runs", "--no-progress", *llm_flags(stub)]
        code = run_in_process(home, *args, "--tracking-uri", uri)
    error = capsys.readouterr().err
    assert code == EXIT_STORAGE, error
    failure = [line for line in error.splitlines() if line.startswith("evolve: error:")]
    assert len(failure) == 1 and "Traceback" not in error, error
    assert failure[0].startswith("evolve: error: storage failed in the MLflow tracking store")
    assert "database or disk is full" in failure[0] or "disk I/O error" in failure[0]
    assert "[SQL:" not in error  # neither the statement nor MLflow's own log of it


def test_storage_failures_are_recognized_through_any_wrapping():
    from mlflow.exceptions import MlflowException

    def wrapped(inner: BaseException, outer: BaseException) -> BaseException:
        try:
            try:
                raise inner
            except BaseException as cause:
                raise outer from cause
        except BaseException as error:
            return error

    full = sqlite3.OperationalError("database or disk is full")
    mlflow = wrapped(full, MlflowException("(sqlite3.OperationalError) database or disk is full"))
    found = storage_failure(mlflow)
    assert isinstance(found, StorageError) and found.exit_code == EXIT_STORAGE
    assert "the MLflow tracking store" in str(found)
    no_space = OSError(errno.ENOSPC, "No space left on device")
    assert isinstance(storage_failure(wrapped(no_space, RuntimeError("copy failed"))), StorageError)
    assert storage_failure(wrapped(KeyError("x"), RuntimeError("a bug"))) is None
    assert storage_failure(MlflowException("RESOURCE_DOES_NOT_EXIST: no run 'abc'")) is None


def raised_in(module: str, error: BaseException) -> BaseException:
    """`error` as raised by code of `module` (its frame in the traceback names it)."""
    namespace: dict = {"__name__": module, "error": error}
    exec("def fail():\n    raise error\n", namespace)  # noqa: S102 - a frame of that module
    try:
        namespace["fail"]()
    except BaseException as raised:  # noqa: BLE001
        return raised
    raise AssertionError("unreachable")


def test_a_full_disk_is_blamed_on_the_store_whose_code_met_it():
    import sqlalchemy.exc

    def full() -> sqlalchemy.exc.OperationalError:
        return sqlalchemy.exc.OperationalError(
            "INSERT INTO metrics ...", {}, sqlite3.OperationalError("database or disk is full")
        )

    # SQLAlchemy's own error, let through by MLflow's store code: the MLflow store.
    mlflow = storage_failure(raised_in("mlflow.store.tracking.sqlalchemy_store", full()))
    assert mlflow is not None and "the MLflow tracking store" in str(mlflow), mlflow
    optuna = storage_failure(raised_in("optuna.storages._rdb.storage", full()))
    assert optuna is not None and "the study storage" in str(optuna), optuna
