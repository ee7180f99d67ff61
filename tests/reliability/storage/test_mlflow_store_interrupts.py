"""An interrupt never breaks the MLflow store: killed (SIGKILL) or interrupted (SIGINT) at any
moment of its creation, the store path holds no store or a complete one, and the rerun
succeeds; an older store is upgraded on a copy, so its runs survive any interrupt; a store
left half-migrated by an older version is set aside (no data) or refused unchanged (data).

Most offsets interrupt a small process that only opens the store (the code path of every
command's first tracking call); a few interrupt real `evolve run` and `evolve tune` commands.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability.process_helpers import (
    REPO,
    TUNE_SPEC,
    llm_flags,
    start_cli,
    started,
    write_small_environment,
    write_tiny_spec,
)
from stub_server import StubServer

from evolve.core.errors import StorageError
from evolve.tracking.sqlite_store import _schema, ensure_complete_store, is_complete, read_state

OPEN_STORE = (
    "import sys; from evolve.tracking import mlflow_client; "
    "client = mlflow_client(sys.argv[1]); "
    "client.create_experiment(sys.argv[2]) if len(sys.argv) > 2 else None"
)
SIGNALS = (signal.SIGKILL, signal.SIGINT)


def store_appeared(db_path: Path) -> bool:
    """The store or its temporary file exists: creation has begun."""
    return db_path.exists() or any(db_path.parent.glob(f".{db_path.name}.*"))


def interrupt_when_created(process: subprocess.Popen, db_path: Path, offset: float, signum: int):
    """Send `signum` `offset` seconds after the store's creation began; wait for the exit."""
    deadline = time.monotonic() + 120
    while not store_appeared(db_path) and process.poll() is None:
        assert time.monotonic() < deadline, "the store was never created"
        time.sleep(0.002)
    time.sleep(offset)
    if process.poll() is None:
        process.send_signal(signum)
    process.communicate(timeout=60)


def assert_no_or_complete_store(db_path: Path) -> None:
    if db_path.exists():
        assert is_complete(read_state(db_path)), f"{db_path} holds half a schema"


def creation_seconds(tmp_path: Path) -> float:
    """How long a store's creation takes here, as an interrupt meets it: from the moment its
    (temporary) file appears to the moment the complete store stands at its path, measured
    on a process that opens a store uninterrupted. Offsets are spread over this window (the
    process's start, imports included, is not part of it)."""
    directory = tmp_path / "timing"
    directory.mkdir()
    db_path = directory / "mlruns" / "mlflow.db"
    process = open_store_process(directory, f"sqlite:///{db_path}")
    deadline = time.monotonic() + 120
    while not store_appeared(db_path):
        assert process.poll() is None and time.monotonic() < deadline, "no store was created"
        time.sleep(0.001)
    appeared = time.monotonic()
    while not db_path.exists() and process.poll() is None:
        time.sleep(0.001)
    created = time.monotonic()
    process.communicate(timeout=60)
    assert process.returncode == 0 and is_complete(read_state(db_path))
    return max(created - appeared, 0.05)


def spread(span: float, count: int) -> list[float]:
    """`count` offsets from 0 to `span`, both ends included."""
    return [span * step / (count - 1) for step in range(count)]


def open_store_process(directory: Path, uri: str, *extra: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", OPEN_STORE, uri, *extra],
        cwd=directory,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return started(process)


def test_a_store_interrupted_at_any_moment_of_its_creation_is_absent_or_complete(tmp_path):
    from evolve.tracking import get_or_create_experiment, mlflow_client

    span = creation_seconds(tmp_path)
    # 10 offsets over the whole window for each signal.
    for index, (offset, signum) in enumerate(
        (offset, signum) for signum in SIGNALS for offset in spread(span, 10)
    ):
        directory = tmp_path / f"fresh-{index}"
        directory.mkdir()
        db_path = directory / "mlruns" / "mlflow.db"
        uri = f"sqlite:///{db_path}"
        process = open_store_process(directory, uri)
        interrupt_when_created(process, db_path, offset, signum)
        assert_no_or_complete_store(db_path)
        client = mlflow_client(uri)  # the rerun
        get_or_create_experiment(client, "after-interrupt", uri)
        assert is_complete(read_state(db_path))
        assert not list(db_path.parent.glob(".mlflow.db.*")), "a temporary store was left"


def older_store_with_a_run(db_path: Path, revision: str) -> str:
    """A store at an older MLflow schema `revision` holding one run; returns its run id."""
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config, create_sqlalchemy_engine
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    engine = create_sqlalchemy_engine(f"sqlite:///{db_path}")
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()
    with sqlite3.connect(db_path) as connection:
        connection.execute(
            "INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
            "VALUES (1, 'kept', '/tmp/a', 'active')"
        )
        connection.execute(
            "INSERT INTO runs (run_uuid, experiment_id, lifecycle_stage, status, user_id, "
            "source_type, source_name, entry_point_name, start_time, end_time, source_version, "
            "artifact_uri) VALUES ('run-kept', 1, 'active', 'FINISHED', 'u', 'LOCAL', 's', 'e', "
            "1, 2, 'v', '/tmp/a/run')"
        )
    return "run-kept"


# An early revision: the upgrade to head runs most of MLflow's migrations.
OLD_REVISION = "451aebb31d03"


def test_an_older_store_upgraded_under_interrupts_keeps_its_runs(tmp_path):
    from evolve.tracking import mlflow_client

    template = tmp_path / "template.db"
    run_id = older_store_with_a_run(template, OLD_REVISION)
    span = creation_seconds(tmp_path)
    for index, offset in enumerate(spread(span, 4)):
        directory = tmp_path / f"old-{index}"
        (directory / "mlruns").mkdir(parents=True)
        db_path = directory / "mlruns" / "mlflow.db"
        db_path.write_bytes(template.read_bytes())
        process = open_store_process(directory, f"sqlite:///{db_path}")
        interrupt_when_created(process, db_path, offset, SIGNALS[index % 2])
        state = read_state(db_path)
        assert state.revision in (OLD_REVISION, _schema()[0]), state.revision
        assert state.data_rows >= 2  # the experiment and its run, at either revision
        assert mlflow_client(f"sqlite:///{db_path}").get_run(run_id).info.status == "FINISHED"


def half_migrated_store(db_path: Path, *, with_run: bool) -> None:
    """What an interrupted in-place migration leaves: an older revision, and a column that a
    later migration adds already there (its upgrade then meets `duplicate column name`)."""
    older_store_with_a_run(db_path, OLD_REVISION)
    with sqlite3.connect(db_path) as connection:
        if not with_run:
            connection.execute("DELETE FROM runs")
            connection.execute("DELETE FROM experiments")
        connection.execute("ALTER TABLE runs ADD COLUMN deleted_time BIGINT")


def test_a_half_migrated_store_without_runs_is_set_aside_and_created_anew(tmp_path):
    from evolve.tracking import mlflow_client

    db_path = tmp_path / "mlruns" / "mlflow.db"
    db_path.parent.mkdir()
    half_migrated_store(db_path, with_run=False)
    mlflow_client(f"sqlite:///{db_path}")
    assert is_complete(read_state(db_path))
    aside = list(db_path.parent.glob("mlflow.db.broken-*"))
    assert len(aside) == 1 and read_state(aside[0]).revision == OLD_REVISION


def test_a_half_migrated_store_with_runs_is_refused_unchanged_in_one_line(tmp_path):
    db_path = tmp_path / "mlflow.db"
    half_migrated_store(db_path, with_run=True)
    before = db_path.read_bytes()
    with pytest.raises(StorageError) as raised:
        ensure_complete_store(db_path)
    message = str(raised.value)
    assert "\n" not in message and "half-migrated" in message and "left unchanged" in message
    assert "--tracking-uri" in message
    assert db_path.read_bytes() == before
    assert not list(tmp_path.glob(".mlflow.db.*"))


# ----- real commands -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _default_store(monkeypatch):
    """The commands below track into their directory's default store: a tracking URI left in
    the environment by an earlier test of this worker would send them elsewhere."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def store_runs(db_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db_path) as connection:
        return connection.execute(
            "SELECT e.name, r.status FROM runs r JOIN experiments e USING (experiment_id) "
            "JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'evolve.kind' "
            "WHERE t.value IN ('experiment', 'tuning')"
        ).fetchall()


def interrupt_command_then_rerun(home: Path, args: list[str], offset: float, signum: int):
    db_path = home / "mlruns" / "mlflow.db"
    with StubServer(latency=0.01) as stub:
        process = start_cli(home, *args, *llm_flags(stub))
        interrupt_when_created(process, db_path, offset, signum)
        assert_no_or_complete_store(db_path)
        # A process of its own, as a user's rerun is: in this one, MLflow's process-wide
        # tracking URI may still name a store an earlier test of this worker set.
        rerun = start_cli(home, *args, *llm_flags(stub))
        _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert is_complete(read_state(db_path))
    return store_runs(db_path)


# Each command is interrupted at 10 offsets over the creation window, kill -9 and SIGINT in
# turn (5 each, spread over the whole window).
COMMAND_OFFSETS = 10


def test_the_first_evolve_run_interrupted_while_creating_the_store_reruns(tmp_path):
    span = creation_seconds(tmp_path)
    for index, offset in enumerate(spread(span, COMMAND_OFFSETS)):
        home = tmp_path / f"run-{index}"
        spec = write_tiny_spec(home, generations=0, tracking=True)
        args = ["run", str(spec), "--no-progress", "--runs-dir", "runs"]
        runs = interrupt_command_then_rerun(home, args, offset, SIGNALS[index % 2])
        assert runs[-1] == ("amemgym-evolve/tiny", "FINISHED"), runs


def test_the_first_evolve_tune_interrupted_while_creating_the_store_reruns(tmp_path):
    span = creation_seconds(tmp_path)
    for index, offset in enumerate(spread(span, COMMAND_OFFSETS)):
        home = tmp_path / f"tune-{index}"
        write_small_environment(home / "env.json")
        spec = home / "tune.toml"
        # A trial the kill leaves RUNNING is retried after the grace: keep the rerun short.
        tuned = TUNE_SPEC.replace("enabled = false", "enabled = true")
        tuned = tuned.replace("[tuning]\n", "[tuning]\nheartbeat_grace_s = 10\n")
        spec.write_text(tuned, "utf-8")
        args = ["tune", str(spec), "--no-progress", "--runs-dir", "runs"]
        runs = interrupt_command_then_rerun(home, args, offset, SIGNALS[(index + 1) % 2])
        assert ("amemgym-evolve/tiny-tune", "FINISHED") in runs, runs
