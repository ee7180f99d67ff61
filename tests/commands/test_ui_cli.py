"""`evolve ui`: the store and experiment it serves, refusals in one line, and a real
`mlflow ui` that answers with the scored view and stops on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow

from evolve.cli import main
from evolve.core.errors import EXIT_BAD_INPUT
from evolve.tracking.runs_view import SHARE_KEY, SHARED_VIEW_TAG_PREFIX

REPO = Path(__file__).resolve().parents[2]


def _store(directory: Path) -> str:
    """A store like a run's: one experiment whose run has a train and a held-out score."""
    uri = f"sqlite:///{directory}/mlruns/mlflow.db"
    (directory / "mlruns").mkdir(parents=True)
    client = mlflow.MlflowClient(uri)
    experiment_id = client.create_experiment("amemgym-evolve/demo")
    run = client.create_run(experiment_id, run_name="g01-c0").info.run_id
    client.log_metric(run, "train_accuracy", 0.5)
    client.log_metric(run, "heldout_accuracy", 0.75)
    return uri


def test_no_store_is_refused_with_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["ui", "--no-browser"]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "no MLflow store at mlruns/mlflow.db" in error and "run an experiment first" in error
    assert not (tmp_path / "mlruns").exists()  # looking created nothing


def test_an_unknown_experiment_is_refused_naming_the_stores_experiments(tmp_path, capsys):
    uri = _store(tmp_path)
    code = main(["ui", "nope", "--tracking-uri", uri, "--no-browser"])
    assert code == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "no MLflow experiment 'nope'" in error and "it has: amemgym-evolve/demo" in error


def test_an_experiment_is_found_by_the_name_its_run_directory_has(tmp_path):
    from evolve.commands.ui import find_experiment

    uri = _store(tmp_path)
    client = mlflow.MlflowClient(uri)
    # `evolve export demo` ends naming `evolve ui demo`: the run's name, not MLflow's.
    assert find_experiment(client, "demo", uri).name == "amemgym-evolve/demo"
    assert find_experiment(client, "amemgym-evolve/demo", uri).name == "amemgym-evolve/demo"
    assert find_experiment(client, "1", uri).name == "amemgym-evolve/demo"
    assert find_experiment(client, None, uri).name == "amemgym-evolve/demo"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_it_serves_the_store_with_the_scored_view_until_ctrl_c(tmp_path):
    uri = _store(tmp_path)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "evolve.cli", "ui", "--tracking-uri", uri]
    command += ["--port", str(port), "--no-browser"]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("serving"):
                break
        assert lines and lines[-1].startswith("serving"), process.stderr.read()
        address = lines[0].split(": ", 1)[1].strip()
        assert address == (
            f"http://127.0.0.1:{port}/#/experiments/1/runs?viewStateShareKey={SHARE_KEY}"
            "&workflowType=machine_learning"
        )
        assert "heldout_accuracy, train_accuracy" in "".join(lines)
        assert "no browser opened" in "".join(lines)
        # The server answers for this store, and the experiment holds the view it names.
        api = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/get?experiment_id=1"
        with urllib.request.urlopen(api, timeout=30) as response:
            experiment = json.load(response)["experiment"]
        tags = {tag["key"]: tag["value"] for tag in experiment["tags"]}
        state = json.loads(tags[SHARED_VIEW_TAG_PREFIX + SHARE_KEY])
        assert state["selectedColumns"] == [
            "metrics.`heldout_accuracy`",
            "metrics.`train_accuracy`",
        ]
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    assert code == 0
    # The server and its workers are gone: the port is free again. SO_REUSEADDR: connections
    # the server closed may linger in TIME_WAIT on that port (seen on a loaded machine), which
    # says nothing about a listener; a socket still listening there refuses the bind anyway.
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
