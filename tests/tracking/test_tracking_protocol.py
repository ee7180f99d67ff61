"""MLflow records the protocol on the parent run and on every candidate / trial run, so
numbers from the two information flows are never confused."""

from __future__ import annotations

from pathlib import Path

import pytest
from optimize.evolve_helpers import World, write_spec
from tuning.tune_helpers import TuneWorld, write_tune_spec

from evolve.optimize import evolve_policy
from evolve.spec.config import load_spec
from evolve.tracking import MLflowTracker, mlflow_client
from evolve.tuning import load_study_spec, run_study, study_tracker_for


def all_runs(uri: str, experiment_name: str):
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    return client.search_runs([experiment.experiment_id], max_results=1000)


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_experiment_parent_and_candidate_runs_record_the_protocol(tmp_path, protocol):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    optimizer = """
        generations = 1
        reflection_minibatch_size = 2
        mutate_components = ["use"]
    """
    spec = load_spec(write_spec(tmp_path, f'protocol = "{protocol}"', optimizer=optimizer))
    evolve_policy(
        spec,
        World().lms,
        runs_dir=tmp_path / "runs",
        tracker=MLflowTracker(uri, spec.mlflow_experiment_name()),
        upper_bound_cache=tmp_path / "ub",
    )
    runs = all_runs(uri, spec.mlflow_experiment_name())
    kinds = {run.data.tags.get("evolve.kind") for run in runs}
    assert {"experiment", "candidate"} <= kinds
    assert all(run.data.params["protocol"] == protocol for run in runs)


def test_tuning_parent_and_trial_runs_record_the_protocol(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = write_tune_spec(
        tmp_path,
        'sampler = "grid"\nheldout = "none"\n[tuning.parameters]\nupdate_every = [2, 4]',
        body='protocol = "paper"',
        tracking=f'tracking_uri = "{uri}"\nexperiment_name = "tune-protocol"',
    )
    spec = load_study_spec(path)
    run_study(
        spec,
        TuneWorld().lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
        tracker=study_tracker_for(spec),
    )
    runs = all_runs(uri, "tune-protocol")
    assert {run.data.tags.get("evolve.kind") for run in runs} >= {"tuning"}
    assert len(runs) >= 3  # the parent and two trials
    assert all(run.data.params["protocol"] == "paper" for run in runs)


def test_protocol_param_is_there_when_left_at_its_default(tmp_path):
    from evolve.tracking import TrackingContext, experiment_params

    spec = load_spec(write_spec(tmp_path))
    context = TrackingContext(
        name="exp",
        config_hash="h",
        spec=spec,
        run_dir=Path(tmp_path),
        model_names={},
        environment="env",
    )
    assert experiment_params(context)["protocol"] == "evolve"
