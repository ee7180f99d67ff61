"""Export: the best policy by held-out score as a bundle that reloads identically, registered
in the MLflow model registry with the alias `champion`, from an experiment or a run id."""

from __future__ import annotations

import dspy
import pytest
from optimize.evolve_helpers import MARKER, World, make_agent, write_spec

import memory_policies
from evolve.config import load_spec
from evolve.errors import ConfigError
from evolve.export import CHAMPION_ALIAS, export_policy
from evolve.optimize import ExperimentStore, run_experiment
from evolve.tracking import MLflowTracker, mlflow_client


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("export")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    spec_path = write_spec(tmp_path, tracking='registered_model = "exp-policy"')
    spec = load_spec(spec_path)
    result = run_experiment(
        spec,
        World().lms,
        runs_dir=tmp_path / "runs",
        tracker=MLflowTracker(uri, spec.mlflow_experiment_name()),
        upper_bound_cache=tmp_path / "ub",
    )
    return tmp_path, uri, spec_path, result


def test_bundle_reloads_to_the_best_candidates_instructions_and_parameters(experiment):
    tmp_path, _, spec_path, result = experiment
    out = tmp_path / "bundle-only"
    exported = export_policy(str(spec_path), out, runs_dir=tmp_path / "runs", register=False)
    best = result.candidate(result.best_id)
    assert exported.candidate_id == best.id and exported.registered_name is None
    assert exported.heldout_score == best.heldout.score
    policy = memory_policies.load(out)
    assert policy.components() == best.components
    assert policy.parameters() == best.parameters
    assert MARKER in policy.components()["use"]
    provenance = memory_policies.read_bundle(out)["provenance"]
    assert provenance["candidate"] == best.id and provenance["experiment"] == "exp"
    assert provenance["parents"] == list(best.parent_ids)


def test_best_is_chosen_by_heldout_score(experiment):
    _, _, _, result = experiment
    heldout = [r for r in result.candidates if r.heldout is not None]
    assert len(heldout) >= 2
    best = result.candidate(result.best_id)
    assert best.heldout.score == max(r.heldout.score for r in heldout)


def test_registered_as_champion_and_loadable_as_pyfunc(experiment):
    import mlflow.pyfunc

    tmp_path, uri, spec_path, result = experiment
    exported = export_policy(
        "exp", tmp_path / "registered", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    assert exported.registered_name == "exp-policy"  # the spec's, recorded with the run
    client = mlflow_client(uri)
    version = client.get_model_version_by_alias("exp-policy", CHAMPION_ALIAS)
    assert str(version.version) == exported.registered_version
    assert version.tags["evolve.candidate_id"] == result.best_id
    # Logged into the best candidate's own run.
    run = client.get_run(version.run_id)
    assert run.data.tags["evolve.candidate_id"] == result.best_id

    mlflow.set_tracking_uri(uri)
    model = mlflow.pyfunc.load_model(f"models:/exp-policy@{CHAMPION_ALIAS}")
    policy = model.unwrap_python_model().policy
    assert policy.components() == result.candidate(result.best_id).components
    world = World(agent=make_agent())
    with dspy.context(lm=world.agent, adapter=dspy.JSONAdapter()):
        outputs = model.predict([{"user_message": "[Current Time: 2024-01-01]\nI am keto."}])
        answer = model.predict(
            [{"question": "What is my diet?", "options": ["vegan", "keto"], "state": None}]
        )
    assert outputs[0].reply == "Noted." and '"kind":"in_context"' in outputs[0].state
    assert answer[0].choice in (1, 2) and answer[0].state.startswith("{")

    # Exporting again (by spec file) registers a new version and moves the alias.
    again = export_policy(
        str(spec_path), tmp_path / "registered2", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    assert again.registered_name == "exp-policy" and again.registered_version == "2"
    assert str(client.get_model_version_by_alias("exp-policy", CHAMPION_ALIAS).version) == "2"
    named = export_policy(
        str(spec_path), tmp_path / "named", runs_dir=tmp_path / "runs", tracking_uri=uri,
        registered_name="other",
    )  # fmt: skip
    assert named.registered_name == "other" and named.registered_version == "1"


def test_export_from_mlflow_run_ids(experiment, tmp_path):
    _, uri, _, result = experiment
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("amemgym-evolve/exp")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    parent = next(r for r in runs if r.data.tags.get("evolve.kind") == "experiment")
    by_parent = export_policy(
        parent.info.run_id, tmp_path / "from-parent", tracking_uri=uri, register=False
    )
    assert by_parent.candidate_id == result.best_id
    base_run = next(r for r in runs if r.data.tags.get("evolve.candidate_id") == "g00-c0")
    by_child = export_policy(
        base_run.info.run_id, tmp_path / "from-child", tracking_uri=uri, register=False
    )
    assert by_child.candidate_id == "g00-c0"
    assert memory_policies.load(tmp_path / "from-child").components() == (
        result.candidate("g00-c0").components
    )


def test_parent_run_id_without_local_records_uses_the_child_runs(experiment, tmp_path):
    import shutil

    source, uri, _, result = experiment
    copy = tmp_path / "moved"
    shutil.copytree(source / "runs", copy)
    shutil.rmtree(source / "runs" / "exp" / "candidates" / "g00-c0" / "heldout")
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("amemgym-evolve/exp")
    parent = next(
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("evolve.kind") == "experiment"
    )
    run_dir = parent.data.tags["evolve.run_dir"]
    client.set_tag(parent.info.run_id, "evolve.run_dir", str(tmp_path / "nowhere"))
    try:
        exported = export_policy(
            parent.info.run_id, tmp_path / "out", tracking_uri=uri, register=False
        )
    finally:
        client.set_tag(parent.info.run_id, "evolve.run_dir", run_dir)
        shutil.rmtree(source / "runs")
        shutil.copytree(copy, source / "runs")
    assert exported.candidate_id == result.best_id
    assert memory_policies.load(tmp_path / "out").components() == (
        result.candidate(result.best_id).components
    )


def test_unknown_target_is_a_clear_error(experiment, tmp_path):
    _, uri, _, _ = experiment
    with pytest.raises(ConfigError, match="not an experiment spec"):
        export_policy("no-such-thing", tmp_path / "x", tracking_uri=uri)


def test_export_before_any_evaluation_is_refused(tmp_path):
    store = ExperimentStore(tmp_path / "runs" / "empty")
    store.open({"x": 1})
    with pytest.raises(ConfigError, match="no evaluated candidate yet"):
        export_policy("empty", tmp_path / "out", runs_dir=tmp_path / "runs", register=False)
