"""The scored runs view: which columns, the tag MLflow's UI reads, the lines a command ends with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlflow
import pytest

from evolve.commands.ui import mlflow_ui_hint
from evolve.tracking import runs_view, ui_server
from evolve.tracking.runs_view import (
    SHARE_KEY,
    SHARED_VIEW_TAG_PREFIX,
    publish_runs_view,
    runs_view_route,
    score_columns,
    shared_view_state,
)

TAG = SHARED_VIEW_TAG_PREFIX + SHARE_KEY


def test_score_columns_keep_the_views_order_and_fit_the_table():
    keys = ["train_accuracy", "heldout_accuracy", "spent_tokens", "heldout_memory_score"]
    assert score_columns(keys) == ["heldout_accuracy", "heldout_memory_score", "train_accuracy"]
    every = list(runs_view.SCORE_METRICS) + ["heldout_accuracy_low", "total_llm_calls"]
    assert score_columns(every) == list(runs_view.SCORE_METRICS[: runs_view.MAX_COLUMNS])
    assert score_columns([]) == []


def test_the_shared_state_names_the_uis_own_columns_and_widths():
    state = json.loads(shared_view_state(["heldout_accuracy", "value"]))
    assert state["selectedColumns"] == ["metrics.`heldout_accuracy`", "metrics.`value`"]
    # ag-grid applies widths only to the columns its order lists: the name comes first.
    assert state["columnOrder"][:2] == ["attributes.`Run Name`", "runDateAndNestInfo"]
    assert set(state["columnWidths"]) <= set(state["columnOrder"])
    assert state["columnWidths"]["attributes.`Run Name`"] >= 300
    assert state["orderByKey"] == "attributes.start_time" and state["orderByAsc"] is False


def test_the_route_names_the_runs_tab_with_the_view_and_the_training_workflow():
    # The bare experiment route redirects to its runs tab and drops the view key on the way.
    assert runs_view_route("7") == (
        "/#/experiments/7/runs?viewStateShareKey=evolve-scores&workflowType=machine_learning"
    )


def _store(tmp_path) -> tuple[mlflow.MlflowClient, str]:
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = client.create_experiment("amemgym-evolve/demo")
    return client, experiment_id


def test_publishing_writes_the_columns_the_runs_have_and_only_when_they_change(tmp_path):
    client, experiment_id = _store(tmp_path)
    run = client.create_run(experiment_id).info.run_id
    client.log_metric(run, "train_accuracy", 0.5)
    assert publish_runs_view(client, experiment_id) == ["train_accuracy"]
    tag = client.get_experiment(experiment_id).tags[TAG]
    assert json.loads(tag)["selectedColumns"] == ["metrics.`train_accuracy`"]

    writes = []
    original = client.set_experiment_tag
    client.set_experiment_tag = lambda *args: (writes.append(args), original(*args))
    publish_runs_view(client, experiment_id)
    assert writes == []  # unchanged: nothing written again

    client.log_metric(run, "heldout_accuracy", 0.75)
    assert publish_runs_view(client, experiment_id) == ["heldout_accuracy", "train_accuracy"]
    assert len(writes) == 1


def test_the_hint_for_a_local_store_names_evolve_ui_and_mlflow_ui_by_hand(tmp_path):
    store = f"sqlite:///{tmp_path}/my store/mlflow.db"
    first, second = mlflow_ui_hint(store, "7", "experiments/quickstart.toml").splitlines()
    # Quoted for the shell (a space in the path); the store named unless it is the default.
    assert first.startswith("MLflow UI: ")
    assert " ui experiments/quickstart.toml --tracking-uri " in first
    assert f"'{store}'" in first
    assert "LITELLM_LOCAL_MODEL_COST_MAP=True" in second
    assert f" ui --backend-store-uri '{store}' --workers 1" in second
    assert second.endswith("http://127.0.0.1:5000" + runs_view_route("7"))
    # The spec as the command got it (a path).
    default = mlflow_ui_hint("sqlite:///mlruns/mlflow.db", "1", Path("spec.toml")).splitlines()[0]
    assert "--tracking-uri" not in default


def test_the_hint_for_a_server_is_its_address_without_credentials():
    assert mlflow_ui_hint("https://bob:secret@mlflow.example:5000/", "3") == (
        "MLflow UI: https://***@mlflow.example:5000" + runs_view_route("3")
    )


def test_printed_commands_name_the_copies_installed_with_the_toolkit(tmp_path, monkeypatch):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    for name in ("mlflow", "evolve"):
        (venv / name).write_text("#!/bin/sh\n")
        (venv / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))  # not on PATH: the full path
    hint = mlflow_ui_hint("sqlite:///x.db", None)
    assert f"{venv / 'evolve'} ui" in hint and f"{venv / 'mlflow'} ui" in hint
    monkeypatch.setenv("PATH", str(venv))  # the same ones on PATH: their short names
    assert ui_server.installed_executable(prog="evolve") == "evolve"
    assert mlflow_ui_hint("sqlite:///x.db", None).startswith("MLflow UI: evolve ui ")


def test_a_taken_port_is_refused_in_one_line():
    import socket

    from evolve.core.errors import ConfigError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*pass --port"):
            ui_server.check_port_free("127.0.0.1", port)


def test_metric_values_lose_their_summing_noise_but_counts_and_small_p_values_are_kept():
    from evolve.tracking.store import metric_value

    assert metric_value(0.33333333333333354) == 0.3333333
    assert metric_value(0.1 + 0.2) == 0.3
    assert metric_value(145431) == 145431.0  # a count, never rounded
    assert metric_value(1.23456789e-06) == 1.234568e-06  # a McNemar p stays informative
    assert metric_value(0.03125) == 0.03125
    assert metric_value(float("nan")) != metric_value(float("nan"))  # passed through
