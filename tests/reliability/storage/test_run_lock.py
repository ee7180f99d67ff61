"""One evolve process per run directory; MLflow DB creation serialized."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from reliability.process_helpers import (
    TUNE_SPEC,
    cli_env,
    llm_flags,
    run_cli,
    run_in_process,
    start_cli,
    started,
    write_small_environment,
    write_tiny_spec,
)
from stub_server import StubServer

from evolve.cli import main
from evolve.core.errors import EXIT_RUN_BUSY, RunBusyError
from evolve.core.locking import RUN_LOCK_FILE, RunLock, lock_holder


def test_a_second_lock_on_a_directory_is_refused_at_once_naming_the_holder(tmp_path):
    with RunLock(tmp_path / "run", "run"):
        holder = lock_holder(tmp_path / "run")
        assert holder is not None and holder.pid == os.getpid() and holder.started
        started = time.monotonic()
        with pytest.raises(RunBusyError) as refused:
            RunLock(tmp_path / "run", "eval").acquire()
        assert time.monotonic() - started < 2
        message = str(refused.value)
        assert f"another evolve process (pid {os.getpid()}, started " in message
        assert message.endswith("is running this; wait or stop it")
        assert refused.value.exit_code == EXIT_RUN_BUSY == 4
    assert lock_holder(tmp_path / "run") is None
    with RunLock(tmp_path / "run", "run"):  # free again once released
        pass


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A lock file naming a process that is gone (its flock died with it).
    (run_dir / RUN_LOCK_FILE).write_text(json.dumps({"pid": 999999, "started": "long ago"}))
    assert lock_holder(run_dir) is None
    with RunLock(run_dir, "run"):
        assert lock_holder(run_dir).pid == os.getpid()

    # A live holder killed with SIGKILL: the kernel drops its lock, the next process takes it.
    holder = started(
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys, time; from evolve.core.locking import RunLock; "
                f"RunLock({str(run_dir)!r}, 'run').acquire(); print('locked', flush=True); "
                "time.sleep(60)",
            ],
            env=cli_env(tmp_path),
            stdout=subprocess.PIPE,
            text=True,
        )
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert lock_holder(run_dir).pid == holder.pid
        with pytest.raises(RunBusyError, match=f"pid {holder.pid}"):
            RunLock(run_dir, "run").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    with RunLock(run_dir, "run"):
        assert lock_holder(run_dir).pid == os.getpid()


def test_two_evolve_run_processes_on_one_spec_exactly_one_runs(tmp_path):
    spec = write_tiny_spec(tmp_path)
    with StubServer(latency=0.05) as stub:
        args = ["run", str(spec), "--runs-dir", "runs", "--no-progress", *llm_flags(stub)]
        first = start_cli(tmp_path, *args)
        second = start_cli(tmp_path, *args)
        outcomes = [p.communicate(timeout=240) for p in (first, second)]
        codes = sorted([first.returncode, second.returncode])
        assert codes == [0, EXIT_RUN_BUSY], outcomes
        refused = outcomes[[first.returncode, second.returncode].index(EXIT_RUN_BUSY)][1]
        assert "another evolve process (pid " in refused and "wait or stop it" in refused
        assert "Traceback" not in refused and len(refused.strip().splitlines()) <= 2
        both = stub.stats()["chat_requests"]

        # The same spec run alone (its own runs dir and caches) costs the same.
        assert run_in_process(tmp_path / "alone", *args) == 0
        assert stub.stats()["chat_requests"] - both == both

        # compare may read a running experiment and says that it is still going.
        with RunLock(tmp_path / "runs" / "tiny", "run"):
            compared = run_cli(tmp_path, "compare", "tiny", "--runs-dir", "runs")
        assert compared.returncode == 0, compared.stderr
        assert f"still running (pid {os.getpid()}" in compared.stderr


def test_eval_out_and_the_main_tune_process_are_locked_but_not_tune_workers(tmp_path, capsys):
    out = tmp_path / "evals"
    unreachable = ["--base-url", "http://127.0.0.1:9/v1", "--model", "stub"]
    eval_args = ["eval", "--env", str(write_small_environment(tmp_path / "env.json"))]
    eval_args += ["--policy", "in_context", "--out", str(out), *unreachable]
    with RunLock(out, "eval"):
        assert main(eval_args) == EXIT_RUN_BUSY
    assert f"another evolve process (pid {os.getpid()}, started " in capsys.readouterr().err

    spec = tmp_path / "tune.toml"
    spec.write_text(TUNE_SPEC, encoding="utf-8")
    tune_args = ["tune", str(spec), "--runs-dir", str(tmp_path / "runs"), *unreachable]
    with RunLock(tmp_path / "runs" / "tiny-tune", "tune"):
        assert main(tune_args) == EXIT_RUN_BUSY
        assert "another evolve process" in capsys.readouterr().err
        # A worker is not refused by the lock (here it fails later: no endpoint).
        assert main([*tune_args, "--worker"]) not in (0, EXIT_RUN_BUSY)
        assert "another evolve process" not in capsys.readouterr().err


MLFLOW_OPEN = """
import sys
from evolve.tracking import get_or_create_experiment, mlflow_client
uri = sys.argv[1]
client = mlflow_client(uri)
print(get_or_create_experiment(client, "race", uri))
"""


def test_two_processes_create_a_fresh_mlflow_db_at_once(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", MLFLOW_OPEN, uri],
            env=cli_env(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes = [p.communicate(timeout=120) for p in processes]
    for process, (_out, err) in zip(processes, outcomes, strict=True):
        assert process.returncode == 0, err[-2000:]
    assert len({out.strip() for out, _ in outcomes}) == 1  # one experiment, seen by all


def test_a_file_where_the_run_directory_goes_is_refused_in_one_line(tmp_path, capsys):
    write_small_environment(tmp_path / "env.json")
    (tmp_path / "taken").write_text("a file\n", encoding="utf-8")
    args = ["eval", "--env", "env.json", "--policy", "in_context", "--out", "taken"]
    assert run_in_process(tmp_path, *args, "--base-url", "http://127.0.0.1:9/v1") == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "taken is a file, not a directory" in error
    assert (tmp_path / "taken").read_text(encoding="utf-8") == "a file\n"
