"""Export: the experiment's best policy as a bundle that reloads identically, registered in
the MLflow model registry with the alias `champion`, from an experiment or a run id, carrying
the held-out verdict against its base (a paired test, never two point scores)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import dspy
import mlflow
import pytest
from optimize.evolve_helpers import MARKER, World, make_agent, write_spec

import memory_policies
from evolve.core.errors import ConfigError
from evolve.export.bundle import export_policy
from evolve.export.registry import CHAMPION_ALIAS
from evolve.optimize import ExperimentDir, evolve_policy
from evolve.results.comparison import base_and_best
from evolve.results.records import best_of
from evolve.spec.config import load_spec
from evolve.stats import PairedComparison, Verdict, compare, load_outcomes
from evolve.tracking import MLflowTracker, mlflow_client
from evolve.tracking.store import use_tracking_uri

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "benchmarks" / "records" / "quickstart_seeds-addable-failures"
WITHIN_NOISE, BEATS = SEEDS / "quickstart-s13", SEEDS / "quickstart-s14"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("export")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    spec_path = write_spec(tmp_path, tracking='registered_model = "exp-policy"')
    spec = load_spec(spec_path)
    result = evolve_policy(
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


def test_best_is_chosen_where_selection_happens_not_on_the_heldout_users(experiment):
    _, _, _, result = experiment
    assert not [r for r in result.candidates if r.validation is not None]  # no validation users
    assert result.best_id == best_of(result.candidates, "train").id


def test_a_parent_run_without_its_best_tag_ranks_its_children_never_by_heldout_score():
    from evolve.export.candidate_runs import selected_candidate_run

    def run(candidate: str, **metrics: float) -> SimpleNamespace:
        tags = {"evolve.candidate_id": candidate, "evolve.generation": candidate[-1]}
        return SimpleNamespace(data=SimpleNamespace(tags=tags, metrics=metrics))

    # c1 is the best on the held-out users, c2 on the train users, c3 on the validation users.
    children = [
        run("c1", train_score=0.2, heldout_score=0.9),
        run("c2", train_score=0.8, heldout_score=0.1),
    ]
    assert selected_candidate_run(children, None).data.tags["evolve.candidate_id"] == "c2"
    children.append(run("c3", train_score=0.1, validation_score=0.5, heldout_score=0.0))
    assert selected_candidate_run(children, None).data.tags["evolve.candidate_id"] == "c3"
    # The experiment's own choice, where its parent run recorded one.
    assert selected_candidate_run(children, "c1").data.tags["evolve.candidate_id"] == "c1"


def test_registered_as_champion_and_loadable_as_pyfunc(experiment):
    import mlflow.artifacts
    import mlflow.pyfunc

    tmp_path, uri, spec_path, result = experiment
    runs_before = _candidate_runs(uri)
    exported = export_policy(
        "exp", tmp_path / "registered", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    assert exported.registered_name == "exp-policy"  # the spec's, recorded with the run
    client = mlflow_client(uri)
    version = client.get_model_version_by_alias("exp-policy", CHAMPION_ALIAS)
    assert str(version.version) == exported.registered_version
    assert version.tags["evolve.candidate_id"] == result.best_id
    best = result.candidate(result.best_id)
    assert float(version.tags["heldout_score"]) == pytest.approx(best.heldout.score, abs=1e-5)
    # The score's unit is named; the memory score is tagged only where it is defined.
    assert version.tags["heldout_objective_used"] == best.heldout.objective_used
    memory = best.heldout.summary.memory_score
    assert version.tags.get("heldout_memory_score") == (None if memory is None else f"{memory:.6g}")
    assert result.best_id in version.description and "Held-out score" in version.description
    # The crown's worth: the held-out test against the base, recomputed from its records.
    comparison = recomputed_comparison(tmp_path / "runs" / "exp", result)
    assert version.tags["evolve.heldout_verdict"] == comparison.verdict.value == "beats"
    assert comparison.difference.interval.format(signed=True) in version.description
    assert f"McNemar {comparison.x_only_correct} vs {comparison.y_only_correct}" in (
        version.description
    )
    assert exported.heldout.warning is None
    # A LoggedModel whose source is the best candidate's run; the run was not reopened.
    assert version.source.startswith("models:/m-"), version.source
    logged = client.get_logged_model(version.source.removeprefix("models:/"))
    assert logged.source_run_id == runs_before[result.best_id].info.run_id
    run = client.get_run(logged.source_run_id)
    assert run.data.tags["evolve.candidate_id"] == result.best_id
    before = runs_before[result.best_id].info
    assert (run.info.status, run.info.end_time) == (before.status, before.end_time)
    assert [o.model_id for o in run.outputs.model_outputs] == [logged.model_id]
    # The champion's instructions carry the alias in the Prompt Registry too.
    assert set(exported.prompts) == set(best.components)
    for component, text in best.components.items():
        prompt = client.get_prompt_version_by_alias(f"exp.{component}", CHAMPION_ALIAS)
        assert prompt.template == text
        assert exported.prompts[component] == f"prompts:/exp.{component}@{CHAMPION_ALIAS}"

    # MLflow's loaders read the process-wide URI: set for these two calls only, so that later
    # tests of this worker are not sent to this store.
    with use_tracking_uri(uri):
        model = mlflow.pyfunc.load_model(f"models:/exp-policy@{CHAMPION_ALIAS}")
        model_dir = Path(
            mlflow.artifacts.download_artifacts(f"models:/exp-policy@{CHAMPION_ALIAS}")
        )
    # Models from code: no pickle, and nothing in the model refers to the toolkit.
    assert not list(model_dir.rglob("*.pkl"))
    model_text = "\n".join(
        p.read_text()
        for p in model_dir.rglob("*")
        if p.suffix in {".py", ".yaml", ""} and p.is_file()
    )
    assert "import evolve" not in model_text and "from evolve" not in model_text
    requirements = (model_dir / "requirements.txt").read_text().split()
    assert {"dspy==3.4.1", "numpy>=1.26", "pydantic>=2.7"} <= set(requirements)
    assert any(r.startswith("mlflow") for r in requirements)
    world = World(agent=make_agent())
    with dspy.context(lm=world.agent, adapter=dspy.JSONAdapter()):
        outputs = model.predict([{"user_message": "[Current Time: 2024-01-01]\nI am keto."}])
        answer = model.predict(
            [{"question": "What is my diet?", "options": ["vegan", "keto"], "state": None}]
        )
    assert outputs[0]["reply"] == "Noted." and '"kind":"in_context"' in outputs[0]["state"]
    assert answer[0]["choice"] in (1, 2) and answer[0]["state"].startswith("{")

    # Exporting the unchanged experiment again (by spec file) reuses its version and its
    # LoggedModel: no second version, no second model.
    models_before = client.search_logged_models(experiment_ids=[logged.experiment_id])
    again = export_policy(
        str(spec_path), tmp_path / "registered2", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    assert again.registered_name == "exp-policy" and again.registered_version == "1"
    assert [str(v.version) for v in client.search_model_versions("name = 'exp-policy'")] == ["1"]
    assert str(client.get_model_version_by_alias("exp-policy", CHAMPION_ALIAS).version) == "1"
    models_after = client.search_logged_models(experiment_ids=[logged.experiment_id])
    assert [m.model_id for m in models_after] == [m.model_id for m in models_before]
    # The registered model describes itself, not only its versions.
    assert "amemgym-evolve" in client.get_registered_model("exp-policy").description
    named = export_policy(
        str(spec_path), tmp_path / "named", runs_dir=tmp_path / "runs", tracking_uri=uri,
        registered_name="other",
    )  # fmt: skip
    assert named.registered_name == "other" and named.registered_version == "1"


def test_registered_model_carries_metrics_figures_and_its_prompts(experiment):
    tmp_path, uri, _, result = experiment
    exported = export_policy(
        "exp", tmp_path / "carried", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    client = mlflow_client(uri)
    version = client.get_model_version(exported.registered_name, exported.registered_version)
    logged = client.get_logged_model(version.source.removeprefix("models:/"))
    best = result.candidate(result.best_id)
    # The version page shows tags, not metrics: the accuracy is a tag there too.
    assert float(version.tags["heldout_accuracy"]) == pytest.approx(
        best.heldout.summary.accuracy, abs=1e-5
    )
    metrics = {m.key: m.value for m in logged.metrics}
    assert metrics["heldout_score"] == pytest.approx(best.heldout.score)
    # Named after the registered model and the candidate, with the policy's parameters as
    # its params and a description that says what it is and the verdict.
    assert logged.name == f"{exported.registered_name}-{best.id}"
    assert logged.params == {key: str(value) for key, value in best.parameters.items()}
    assert logged.params  # update_every, short_term_len, top_k, ...
    description = logged.tags["mlflow.note.content"]
    assert best.id in description and exported.heldout.text in description
    comparison = recomputed_comparison(tmp_path / "runs" / "exp", result)
    assert logged.tags["evolve.heldout_verdict"] == comparison.verdict.value
    assert metrics["heldout_difference"] == pytest.approx(comparison.difference.value)
    assert metrics["heldout_difference_low"] == pytest.approx(comparison.difference.interval.low)
    assert metrics["heldout_mcnemar_p"] == pytest.approx(comparison.mcnemar_p)
    interval = best.heldout.estimate.accuracy.interval
    assert metrics["heldout_accuracy_low"] == pytest.approx(interval.low)
    assert metrics["heldout_accuracy_high"] == pytest.approx(interval.high)
    assert metrics["heldout_accuracy"] == pytest.approx(best.heldout.summary.accuracy)
    assert "train_score" in metrics
    artifacts = [a.path for a in client.list_logged_model_artifacts(logged.model_id, "figures")]
    assert artifacts == ["figures/evolution.png"]
    linked = logged.tags.get("mlflow.linkedPrompts", "")
    for component in best.components:
        prompt = client.get_prompt(f"exp.{component}")
        champion = client.get_prompt_version_by_alias(f"exp.{component}", CHAMPION_ALIAS)
        # The prompt's own tags name the champion, whichever candidate registered it last.
        assert prompt.tags["evolve.candidate_id"] == best.id
        assert prompt.tags["evolve.champion_version"] == str(champion.version)
        assert f'"name": "exp.{component}", "version": "{champion.version}"' in linked


def test_a_copied_checkout_exports_into_its_own_store(experiment, tmp_path, monkeypatch):
    """The run recorded an absolute store path; a copy of the checkout (runs/ and mlruns/
    side by side, the spec naming no store) registers into the copy's store, or into
    MLFLOW_TRACKING_URI when it is set: the documented precedence, not the recorded path."""
    import shutil

    original, uri, _, result = experiment
    copy = tmp_path / "copy"
    shutil.copytree(original / "runs", copy / "runs")
    shutil.copytree(original / "mlruns", copy / "mlruns")
    monkeypatch.chdir(copy)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    exported = export_policy("exp", copy / "out", runs_dir="runs", registered_name="copied")
    copied = mlflow_client(f"sqlite:///{copy / 'mlruns' / 'mlflow.db'}")
    version = copied.get_model_version("copied", exported.registered_version)
    assert version.tags["evolve.candidate_id"] == result.best_id
    # The candidate's run is in the copy too: the version's model links it.
    logged = copied.get_logged_model(version.source.removeprefix("models:/"))
    assert copied.get_run(logged.source_run_id).data.tags["evolve.candidate_id"] == result.best_id
    assert not mlflow_client(uri).search_registered_models("name = 'copied'")

    team = f"sqlite:///{tmp_path / 'team' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", team)
    export_policy("exp", copy / "out2", runs_dir="runs", registered_name="teamed")
    assert mlflow_client(team).get_registered_model("teamed").name == "teamed"
    assert not copied.search_registered_models("name = 'teamed'")


def test_a_copy_of_a_checkout_whose_original_is_deleted_exports_and_loads(
    experiment, tmp_path, monkeypatch
):
    """A checkout used once (its store's artifacts under its own path), copied elsewhere and
    deleted: the copy registers its policy and MLflow loads it from the copy alone."""
    import shutil

    source, _, _, result = experiment
    first = tmp_path / "first"
    for name in ("runs", "mlruns"):
        shutil.copytree(source / name, first / name)
    monkeypatch.chdir(first)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    export_policy("exp", first / "out", runs_dir="runs", registered_name="moved")
    second = tmp_path / "second"
    shutil.copytree(first, second)
    shutil.rmtree(first)
    monkeypatch.chdir(second)
    exported = export_policy("exp", second / "out2", runs_dir="runs", registered_name="moved")
    store = f"sqlite:///{second / 'mlruns' / 'mlflow.db'}"
    with use_tracking_uri(store):
        model = mlflow.pyfunc.load_model(f"models:/moved/{exported.registered_version}")
        model_dir = Path(mlflow.artifacts.download_artifacts(f"models:/moved@{CHAMPION_ALIAS}"))
    assert model is not None and not str(model_dir).startswith(str(first))
    policy = memory_policies.load(second / "out2")
    best = result.candidate(result.best_id)
    assert policy.components() == best.components and policy.parameters() == best.parameters
    # Nothing of the copy's store points at the deleted checkout.
    client = mlflow_client(store)
    for experiment_record in client.search_experiments():
        assert str(first) not in experiment_record.artifact_location


def _candidate_runs(uri: str) -> dict:
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name("amemgym-evolve/exp")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return {
        r.data.tags["evolve.candidate_id"]: r for r in runs if "evolve.candidate_id" in r.data.tags
    }


def test_model_requirements_match_the_memory_policies_distribution():
    import tomllib

    from evolve.export.registry import LOCAL_EMBEDDING_REQUIREMENTS, POLICY_REQUIREMENTS

    project = tomllib.loads((REPO / "dist" / "memory-policies" / "pyproject.toml").read_text())
    assert project["project"]["dependencies"] == POLICY_REQUIREMENTS
    extras = project["project"]["optional-dependencies"]["local-embeddings"]
    assert extras == LOCAL_EMBEDDING_REQUIREMENTS


def test_the_model_reads_its_lm_from_model_config_or_the_environment(monkeypatch):
    from evolve.export.exported_model import CONFIG_KEYS, lm_from_settings
    from evolve.export.registry import MODEL_CONFIG_KEYS

    assert MODEL_CONFIG_KEYS == CONFIG_KEYS  # every key can be given at load time

    monkeypatch.delenv("MEMORY_POLICY_MODEL", raising=False)
    assert lm_from_settings(None) is None
    monkeypatch.setenv("MEMORY_POLICY_MODEL", "openai/from-env")
    monkeypatch.setenv("MY_KEY", "sk-test")
    lm = lm_from_settings({"base_url": "http://127.0.0.1:9/v1", "api_key_env": "MY_KEY"})
    assert lm.model == "openai/from-env" and lm.kwargs["api_key"] == "sk-test"
    assert lm_from_settings({"model": "openai/from-config"}).model == "openai/from-config"
    with pytest.raises(ValueError, match="unknown model_config keys"):
        lm_from_settings({"api_key": "sk-never-stored"})


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
    # Local records are gone (wherever the engine kept the base's held-out evaluation).
    shutil.rmtree(source / "runs" / "exp" / "candidates" / "g00-c0" / "heldout", ignore_errors=True)
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
    # The verdict the parent run recorded, the records being gone.
    assert exported.heldout.verdict == result.heldout_comparison.verdict.value
    assert result.heldout_comparison.evidence() in exported.heldout.text


def test_unknown_target_is_a_clear_error(experiment, tmp_path):
    _, uri, _, _ = experiment
    with pytest.raises(ConfigError, match="not an experiment spec"):
        export_policy("no-such-thing", tmp_path / "x", tracking_uri=uri)


def test_a_bad_registered_model_name_is_refused_before_the_bundle_is_written(experiment, capsys):
    from evolve.cli import main

    tmp_path, uri, _, _ = experiment
    out = tmp_path / "bad-name"
    refused = r"registered model name 'bad/name:x\?' contains the character\(s\) '/' ':' '\?'"
    with pytest.raises(ConfigError, match=refused):
        export_policy(
            "exp", out, runs_dir=tmp_path / "runs", registered_name="bad/name:x?", tracking_uri=uri
        )
    assert not out.exists()
    args = ["export", "exp", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]
    assert main([*args, "--name", "bad/name:x?", "--tracking-uri", uri]) == 2
    error = capsys.readouterr().err
    assert error.startswith("evolve: error: registered model name 'bad/name:x?' contains")
    assert error.count("\n") == 1 and not out.exists()


def test_export_before_any_evaluation_is_refused(tmp_path):
    store = ExperimentDir(tmp_path / "runs" / "empty")
    store.open({"x": 1})
    with pytest.raises(ConfigError, match="no evaluated candidate yet"):
        export_policy("empty", tmp_path / "out", runs_dir=tmp_path / "runs", register=False)


def test_python_api_page_script_builds_the_candidates_table(experiment, monkeypatch, capsys):
    """The Python API page's script, on this experiment (the run itself is substituted)."""
    import re

    from evolve import api

    tmp_path, uri, spec_path, result = experiment
    page = (REPO / "docs" / "python-api.md").read_text()
    script = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    for text in ('"experiments/quickstart.toml"', '"sqlite:///mlruns/mlflow.db"'):
        assert text in script
    script = script.replace('"experiments/quickstart.toml"', repr(str(spec_path)))
    script = script.replace('"sqlite:///mlruns/mlflow.db"', repr(uri))
    monkeypatch.setattr(api, "run_experiment", lambda spec, **_: result)
    namespace: dict = {}
    exec(compile(script, "docs/python-api.md", "exec"), namespace)
    candidates, runs = namespace["candidates"], namespace["runs"]
    assert sorted(candidates["id"]) == sorted(c.id for c in result.candidates)
    best = candidates.sort_values("heldout", ascending=False).iloc[0]
    assert best["id"] == result.best_id
    assert set(runs["tags.evolve.candidate_id"]) <= set(candidates["id"])
    assert len(runs) >= 2 and runs["tags.evolve.mutation"].notna().all()


def recomputed_comparison(root: Path, result) -> PairedComparison:
    """The best minus the base, from their per-question held-out records."""
    base, best = base_and_best(result)
    return compare(
        load_outcomes(root / best.heldout.run_dir), load_outcomes(root / base.heldout.run_dir)
    )


@pytest.mark.parametrize("root", [WITHIN_NOISE, BEATS], ids=["within-noise", "beats"])
def test_export_warns_in_one_line_unless_the_best_beats_the_base(root, tmp_path, capsys):
    """quickstart-s13's best is within noise of its base on the held-out users, s14's beats
    it; both score above their base, so a verdict from point scores would crown both."""
    from evolve.cli import main

    result = ExperimentDir(root).load_result()
    base, best = base_and_best(result)
    assert best.heldout.summary.accuracy > base.heldout.summary.accuracy
    comparison = recomputed_comparison(root, result)
    assert main(["export", str(root), "--out", str(tmp_path / "out"), "--no-register"]) == 0
    printed = capsys.readouterr()
    evidence = [
        comparison.difference.interval.format(signed=True),
        f"McNemar {comparison.x_only_correct} vs {comparison.y_only_correct}",
        f"{comparison.basis.users} users, {comparison.basis.questions} questions",
    ]
    warnings = [line for line in printed.err.splitlines() if "warning" in line]
    if comparison.verdict is Verdict.BEATS:
        assert warnings == []
        verdict = next(line for line in printed.out.splitlines() if "Held-out test" in line)
        assert f"the best ({best.id}) against the base ({base.id})" in verdict
        assert ": beats: " in verdict
    else:
        assert comparison.verdict is Verdict.WITHIN_NOISE
        assert len(warnings) == 1
        verdict = warnings[0]
        assert verdict.startswith(
            f"warning: the best ({best.id}) is within noise of the base ({base.id})"
        )
        assert "beats" not in printed.out
    assert all(text in verdict for text in evidence), verdict
    provenance = memory_policies.read_bundle(tmp_path / "out")["provenance"]
    assert provenance["heldout_verdict"] == comparison.verdict.value


def test_a_within_noise_best_is_registered_with_its_verdict_and_a_warning(tmp_path):
    result = ExperimentDir(WITHIN_NOISE).load_result()
    comparison = recomputed_comparison(WITHIN_NOISE, result)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exported = export_policy(str(WITHIN_NOISE), tmp_path / "out", tracking_uri=uri)
    version = mlflow_client(uri).get_model_version(
        exported.registered_name, exported.registered_version
    )
    assert version.tags["evolve.heldout_verdict"] == comparison.verdict.value == "within noise"
    interval = comparison.difference.interval
    assert interval.low < 0 < interval.high
    description = version.description
    assert "is within noise of the base" in description
    assert interval.format(signed=True) in description
    assert f"McNemar {comparison.x_only_correct} vs {comparison.y_only_correct}" in description
    assert f"{comparison.basis.users} users, {comparison.basis.questions} questions" in description
    memory = comparison.memory_score_difference
    assert f"Memory score difference {memory.format(signed=True)}" in description
    assert exported.heldout.warning.startswith("warning: the best")


def test_an_interrupted_registration_leaves_no_pending_model(experiment, monkeypatch):
    import mlflow

    tmp_path, uri, _, _ = experiment
    register = mlflow.register_model

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C after the model was logged, before its version

    monkeypatch.setattr(mlflow, "register_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_policy(
            "exp",
            tmp_path / "pending",
            runs_dir=tmp_path / "runs",
            tracking_uri=uri,
            registered_name="exp-pending",
        )
    monkeypatch.setattr(mlflow, "register_model", register)
    exported = export_policy(
        "exp",
        tmp_path / "pending",
        runs_dir=tmp_path / "runs",
        tracking_uri=uri,
        registered_name="exp-pending",
    )
    client = mlflow_client(uri)
    version = client.get_model_version("exp-pending", exported.registered_version)
    digest = version.tags["evolve.content_digest"]
    with use_tracking_uri(uri):
        models = mlflow.search_logged_models(
            filter_string=f"tags.`evolve.content_digest` = '{digest}'",
            experiment_ids=[e.experiment_id for e in client.search_experiments()],
            output_format="list",
        )
    # Other exports of the same candidate (under other names) share the content: every
    # model of it is one a version was registered from, and none is left PENDING.
    registered = {
        v.source for v in client.search_model_versions(f"tags.`evolve.content_digest` = '{digest}'")
    }
    assert version.source in registered
    assert {f"models:/{model.model_id}" for model in models} == registered
    assert {str(model.status) for model in models} == {"READY"}
