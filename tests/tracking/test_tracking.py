"""MLflow tracking of an experiment (tmp sqlite store): parent and child runs with lineage
tags, metrics per generation, artifacts, idempotent resume, and no API key anywhere."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from optimize.evolve_helpers import MARKER, World, write_spec
from scripted_lm import ScriptedLM

from evolve.llm import EndpointConfig, RoleLMs
from evolve.optimize import evolve_policy
from evolve.results.comparison import base_and_best
from evolve.results.records import EvaluationScores
from evolve.simulator.metrics import MetricSummary
from evolve.spec.config import load_spec
from evolve.stats import Interval, compare, estimate, load_outcomes, paired, verdict_of
from evolve.tracking import (
    MLflowTracker,
    evaluation_window,
    instruction_diff,
    mlflow_client,
    per_period_metrics,
)
from evolve.tracking.tags import (
    HELDOUT_VERDICT_TAGS,
    TAG_HELDOUT_EVIDENCE,
    TAG_HELDOUT_METHOD,
    TAG_HELDOUT_SEED,
    TAG_HELDOUT_VERDICT,
)

SECRET = "sk-test-VERYSECRET-0123456789abcdef"
DESCRIPTION = "Does a sharper use instruction help the in-context policy?"


def tracked_run(tmp_path: Path, world: World, spec_path: Path, uri: str):
    spec = load_spec(spec_path)
    tracker = MLflowTracker(uri, spec.mlflow_experiment_name())
    result = evolve_policy(
        spec,
        world.lms,
        runs_dir=tmp_path / "runs",
        tracker=tracker,
        upper_bound_cache=tmp_path / "ub",
    )
    return result, tracker


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("tracking")
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    spec_path = write_spec(tmp_path, body=f'description = "{DESCRIPTION}"')
    cwd = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        result, tracker = tracked_run(tmp_path, World(), spec_path, uri)
    # Nothing goes to MLflow's default store (./mlflow.db) instead of the configured one.
    assert not (cwd / "mlflow.db").exists()
    return tmp_path, uri, spec_path, result, tracker


def runs_by_kind(uri: str, experiment_name: str):
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("evolve.kind") == "experiment"]
    children = [r for r in runs if r.data.tags.get("evolve.kind") == "candidate"]
    return client, parents, children


def test_parent_and_child_runs_carry_lineage(tracked):
    _, uri, _, result, tracker = tracked
    client, parents, children = runs_by_kind(uri, "amemgym-evolve/exp")
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED"
    assert parent.data.params["optimizer.feedback"] == "diagnostic"
    assert parent.data.params["model.agent"] == "agent-model"
    assert parent.data.tags["evolve.best_candidate"] == result.best_id
    # Every proposal is a run, rejected and invalid ones included.
    assert sorted(c.data.tags["evolve.candidate_id"] for c in children) == sorted(
        r.id for r in result.candidates
    )
    for child in children:
        tags = child.data.tags
        record = result.candidate(tags["evolve.candidate_id"])
        if record.train is None:
            continue
        assert tags["mlflow.parentRunId"] == parent.info.run_id
        assert tags["evolve.generation"] == str(record.generation)
        assert tags["evolve.parent_ids"] == ",".join(record.parent_ids)
        assert tags["evolve.mutation"] == record.mutation.kind
        assert child.data.params["policy_kind"] == "in_context"
        assert child.data.params["param.update_every"] == "2"
        assert child.data.params["seed.candidate"] == str(record.seed)
        assert child.data.metrics["train_score"] == pytest.approx(record.train.score)
        assert "train_write_failure_rate" in child.data.metrics
        assert "train_parse_failures" in child.data.metrics and "train_tokens" in child.data.metrics
        if record.heldout is not None:
            assert child.data.metrics["heldout_score"] == pytest.approx(record.heldout.score)
        history = client.get_metric_history(child.info.run_id, "train_score")
        assert [m.step for m in history] == [record.generation]


def test_parent_metrics_per_generation(tracked):
    _, uri, _, result, _ = tracked
    client, parents, _ = runs_by_kind(uri, "amemgym-evolve/exp")
    run_id = parents[0].info.run_id
    history = client.get_metric_history(run_id, "best_train_score")
    assert [m.step for m in history] == [g.generation for g in result.generations]
    assert [m.value for m in history] == pytest.approx(
        [g.best_train_score for g in result.generations]
    )
    heldout = client.get_metric_history(run_id, "best_heldout_score")
    assert [m.step for m in heldout] == [0, 1, 2]
    metrics = client.get_run(run_id).data.metrics
    assert "total_llm_calls" in metrics
    # The bill: a scripted LM reports no server time, and sends no request to share time with.
    assert metrics["total_prompt_eval_s"] == metrics["total_decode_s"] == 0
    assert "toolkit_share" not in metrics and result.toolkit_share is None


def test_candidate_artifacts(tracked):
    tmp_path, uri, _, result, _ = tracked
    client, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    mutated = next(c for c in children if c.data.tags["evolve.candidate_id"] == result.best_id)
    root = Path(client.download_artifacts(mutated.info.run_id, "", str(tmp_path / "dl")))
    assert (
        (root / "components" / "use.txt")
        .read_text()
        .strip()
        .endswith(MARKER + ": always answer from the most recent memory.")
    )
    diff = (root / "diffs" / "use.diff").read_text()
    assert diff.startswith("--- g00-c0/use") and f"+{''}" in diff and MARKER in diff
    assert (root / "policy" / "policy.json").is_file()
    table = (root / "scores" / "train_per_period.csv").read_text().splitlines()
    assert table[0].startswith("period,accuracy,memory_score") and len(table) == 4
    assert "cause:" in (root / "feedback.txt").read_text()
    assert (root / "scores" / "heldout_per_period.csv").is_file()


def test_resume_continues_the_same_parent_run_without_duplicates(tracked):
    tmp_path, uri, spec_path, result, _ = tracked
    client = mlflow_client(uri)
    names = [f"exp.{component}" for component in result.candidates[0].components]

    def versions() -> dict[str, int]:
        return {name: len(client.search_prompt_versions(name)) for name in names}

    before = versions()
    world = World()
    tracked_run(tmp_path, world, spec_path, uri)
    assert world.calls()["agent"] == 0
    _, parents, children = runs_by_kind(uri, "amemgym-evolve/exp")
    assert len(parents) == 1
    ids = [c.data.tags["evolve.candidate_id"] for c in children]
    assert len(ids) == len(set(ids))
    assert versions() == before and all(before.values())  # no prompt registered twice


def test_instruction_diff_is_a_unified_diff():
    diff = instruction_diff("a\nb\n", "a\nc\n", "use", "p", "c")
    assert diff.splitlines()[:2] == ["--- p/use", "+++ c/use"]
    assert "-b" in diff and "+c" in diff
    assert instruction_diff("same", "same", "use", "p", "c") == "(no change in use)\n"


def test_instruction_diff_keeps_an_unchanged_last_line():
    # Instructions are stored without a final newline: appending a line must not show the
    # old last line as removed and added again.
    diff = instruction_diff("Keep:\n- diet", "Keep:\n- diet\n- job", "use", "p", "c")
    changed = [line for line in diff.splitlines()[2:] if line[:1] in "+-"]
    assert changed == ["+- job"]
    assert " - diet" in diff.splitlines()


def test_no_api_key_in_mlflow_runs_or_bundles(tmp_path, monkeypatch):
    """A configured hosted endpoint's key must appear in no param, tag, metric or artifact."""
    from evolve.export.bundle import export_policy

    monkeypatch.setenv("EVOLVE_TEST_SECRET_KEY", SECRET)
    endpoint = EndpointConfig(
        model="gpt-4.1-mini",
        base_url="https://api.example.com/v1",
        api_key_env="EVOLVE_TEST_SECRET_KEY",
    )
    spec_path = write_spec(
        tmp_path,
        body="""
            [llm.agent]
            model = "gpt-4.1-mini"
            base_url = "https://api.example.com/v1"
            api_key_env = "EVOLVE_TEST_SECRET_KEY"
        """,
        tracking='experiment_name = "secret-scan"',
    )
    world = World()
    # RoleLMs as open_role_lms builds them: endpoints described (key masked) next to the LMs;
    # the agent LM even carries the key like a real dspy.LM would.
    world.agent.kwargs["api_key"] = SECRET
    lms = RoleLMs.from_lms(
        simulator=world.simulator,
        agent=world.agent,
        reflector=world.reflector,
        endpoints={"agent": endpoint.describe()},
    )
    world.lms = lms
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    result, _ = tracked_run(tmp_path, world, spec_path, uri)
    export = export_policy(
        str(spec_path), tmp_path / "exported", runs_dir=tmp_path / "runs", tracking_uri=uri
    )
    assert export.registered_version is not None and result.best_id

    client, parents, children = runs_by_kind(uri, "secret-scan")
    for run in [*parents, *children]:
        data = run.data
        texts = [*data.params.keys(), *data.params.values(), *data.tags.keys(), *data.tags.values()]
        texts += list(data.metrics)
        assert not any(SECRET in text or "VERYSECRET" in text for text in texts)
    scanned = 0
    for root in (tmp_path / "mlruns", tmp_path / "runs", tmp_path / "exported"):
        for path in root.rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                assert b"VERYSECRET" not in content, path
                scanned += 1
    assert scanned > 20
    assert (tmp_path / "mlruns" / "mlflow.db").is_file()


def test_scripted_lm_is_a_real_lm_double():
    # Guard for the secret test above: the scripted LM keeps kwargs like a dspy.LM does.
    lm = ScriptedLM(lambda call: {})
    lm.kwargs["api_key"] = "x"
    assert lm.kwargs["api_key"] == "x"


def test_candidates_log_per_period_curves_with_step_period(tracked):
    _, uri, _, result, _ = tracked
    client, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    for child in children:
        record = result.candidate(child.data.tags["evolve.candidate_id"])
        for split in ("train", "heldout"):
            scores = getattr(record, split)
            if scores is None:
                continue
            history = client.get_metric_history(child.info.run_id, f"{split}_period/accuracy")
            assert [m.step for m in history] == list(range(len(scores.per_period)))
            assert [m.value for m in history] == pytest.approx(
                [p.accuracy for p in scores.per_period]
            )
            failures = client.get_metric_history(
                child.info.run_id, f"{split}_period/write_failure_rate"
            )
            assert len(failures) == len(scores.per_period) > 1


def test_parent_logs_best_and_mean_scores_per_generation_and_counts_only_grow(tracked):
    _, uri, _, result, _ = tracked
    client, parents, _ = runs_by_kind(uri, "amemgym-evolve/exp")
    run_id = parents[0].info.run_id
    generations = [g.generation for g in result.generations]
    for name in ("best_train_score", "mean_train_score", "best_heldout_score"):
        assert [m.step for m in client.get_metric_history(run_id, name)] == generations
    # The held-out mean is a mean only where more than one candidate was scored there.
    scored = client.get_metric_history(run_id, "heldout_candidates_scored")
    assert [m.step for m in scored] == generations
    means = client.get_metric_history(run_id, "mean_heldout_score")
    assert {m.step for m in means} == {m.step for m in scored if m.value > 1}
    counts = client.get_metric_history(run_id, "candidates_evaluated")
    assert [m.step for m in counts] == generations
    values = [m.value for m in counts]
    assert values == sorted(values)  # a running count: no zig-zag back at step 0
    assert values[-1] == sum(r.train is not None for r in result.candidates)
    # Totals are logged once, at the last generation's step, never at step 0.
    for name in ("total_llm_calls", "total_candidates_evaluated"):
        assert [m.step for m in client.get_metric_history(run_id, name)] == [generations[-1]]


def test_the_parent_carries_its_best_candidates_scores_under_the_candidate_runs_names(tracked):
    # One set of runs-table columns then shows the parent's best and every candidate.
    _, uri, _, _, _ = tracked
    _, parents, children = runs_by_kind(uri, "amemgym-evolve/exp")
    parent = parents[0]
    best_id = parent.data.tags["evolve.best_candidate"]
    best = next(c for c in children if c.data.tags["evolve.candidate_id"] == best_id)
    names = [
        f"{split}_{name}"
        for split in ("train", "validation", "heldout")
        for name in ("accuracy", "memory_score", "score")
    ]
    carried = [name for name in names if name in best.data.metrics]
    assert "heldout_accuracy" in carried and "train_accuracy" in carried
    for name in carried:
        assert parent.data.metrics[name] == pytest.approx(best.data.metrics[name])


def test_a_finished_experiment_publishes_its_scored_runs_view(tracked):
    # The address `evolve run` ends with opens this view; it must exist without `evolve ui`.
    from evolve.tracking.runs_view import SHARE_KEY, SHARED_VIEW_TAG_PREFIX

    _, uri, _, _, _ = tracked
    experiment = mlflow_client(uri).get_experiment_by_name("amemgym-evolve/exp")
    state = json.loads(experiment.tags[SHARED_VIEW_TAG_PREFIX + SHARE_KEY])
    assert "metrics.`heldout_accuracy`" in state["selectedColumns"]
    assert "metrics.`train_accuracy`" in state["selectedColumns"]


def test_descriptions_and_source_tags_as_the_fluent_api_sets_them(tracked):
    _, uri, _, _, _ = tracked
    client, parents, children = runs_by_kind(uri, "amemgym-evolve/exp")
    experiment = client.get_experiment_by_name("amemgym-evolve/exp")
    assert experiment.tags["mlflow.note.content"] == DESCRIPTION
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert parents[0].data.tags["mlflow.note.content"].startswith(DESCRIPTION)
    for run in [*parents, *children]:
        tags = run.data.tags
        assert tags["mlflow.user"] and tags["mlflow.source.type"] == "LOCAL"
        assert tags["mlflow.source.name"]
        assert DESCRIPTION in tags["mlflow.note.content"]
    child = children[0]
    assert child.data.tags["mlflow.note.content"].startswith(
        f"Candidate {child.data.tags['evolve.candidate_id']} of exp"
    )


def test_diffs_are_also_logged_as_previewable_html(tracked):
    tmp_path, uri, _, result, _ = tracked
    client, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    mutated = next(c for c in children if c.data.tags["evolve.candidate_id"] == result.best_id)
    root = Path(client.download_artifacts(mutated.info.run_id, "diffs", str(tmp_path / "html")))
    page = (root / "use.html").read_text()
    assert page.lstrip().startswith("<!DOCTYPE html") and 'class="diff_add"' in page
    assert MARKER in re.sub(r"<[^>]+>", "", page)  # the added text, between highlight tags


def test_every_component_text_is_a_prompt_version_with_lineage(tracked):
    _, uri, _, result, _ = tracked
    client, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    seen: dict[tuple[str, str], str] = {}
    # Only evaluated candidates register their texts (a rejected proposal's are artifacts).
    children = [c for c in children if c.data.tags["evolve.candidate_status"] != "rejected"]
    for child in children:
        record = result.candidate(child.data.tags["evolve.candidate_id"])
        for component, text in record.components.items():
            reference = child.data.tags[f"evolve.prompt.{component}"]
            name, version = reference.rsplit("/", 1)
            assert name == f"exp.{component}"
            prompt = client.get_prompt_version(name, version)
            assert prompt.template == text
            seen[(name, version)] = record.id
            # Linked to the run in the configured store (the UI's "Prompts" of a run).
            assert f'"name": "{name}", "version": "{version}"' in child.data.tags.get(
                "mlflow.linkedPrompts", ""
            )
            if prompt.tags["evolve.candidate_id"] == record.id:  # it registered this text
                assert prompt.tags["evolve.parent_ids"] == (",".join(record.parent_ids) or "-")
                assert prompt.tags["evolve.mutation"] == record.mutation.kind
                assert float(prompt.tags["train_score"]) == pytest.approx(record.train.score)
                if record.heldout is not None:
                    assert float(prompt.tags["heldout_score"]) == pytest.approx(
                        record.heldout.score
                    )
    best = result.candidate(result.best_id)
    assert best.mutation.component is not None
    # A mutated component got its own version; unchanged texts share one.
    versions = {v for (n, v) in seen if n == f"exp.{best.mutation.component}"}
    assert len(versions) >= 2
    assert len(seen) < sum(
        len(result.candidate(c.data.tags["evolve.candidate_id"]).components) for c in children
    )


def test_no_traces_unless_asked(tracked):
    _, uri, _, _, _ = tracked
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("amemgym-evolve/exp")
    assert list(client.search_traces(locations=[experiment.experiment_id])) == []


def test_every_proposal_is_a_run_with_its_status(tracked):
    _, uri, _, result, _ = tracked
    client, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    by_id = {c.data.tags["evolve.candidate_id"]: c for c in children}
    never_evaluated = [r for r in result.candidates if r.train is None]
    assert never_evaluated, "the fixture's world should reject a proposal"
    for record in never_evaluated:
        run = by_id[record.id]
        status = run.data.tags["evolve.candidate_status"]
        assert status == str(record.status) and status in ("rejected", "invalid")
        reason = run.data.tags["evolve.candidate_reason"]
        assert reason
        # In words with rounded scores, never GEPA's raw `old_sum=-0.33333333333333187`.
        assert "old_sum" not in reason and not re.search(r"\d\.\d{4,}", reason)
        assert run.info.status in ("FINISHED", "FAILED")
        assert status in run.info.run_name
        if status == "rejected":  # GEPA's minibatch verdict, in words
            assert reason.startswith(("below its parent", "no better than its parent")), reason
            assert "minibatch_score" in run.data.metrics
            assert "minibatch_parent_score" in run.data.metrics
    for run in children:  # one status tag, not two that name the same states differently
        assert [k for k in run.data.tags if "status" in k] == ["evolve.candidate_status"]
    for record in result.candidates:
        if record.train is not None:
            expected = "base" if record.generation == 0 else "accepted"
            assert by_id[record.id].data.tags["evolve.candidate_status"] == expected


def named_scores(record) -> str:
    """`memory 0.50/- acc 0.75/-`: each score named, train/held-out, "-" where undefined."""

    def pair(name: str) -> str:
        values = [getattr(s.summary, name) if s else None for s in (record.train, record.heldout)]
        return "/".join("-" if v is None else f"{v:.2f}" for v in values)

    return f"memory {pair('memory_score')} acc {pair('accuracy')}"


def test_scores_show_without_configuring_the_runs_table(tracked):
    tmp_path, uri, _, result, _ = tracked
    client, parents, children = runs_by_kind(uri, "amemgym-evolve/exp")
    for child in children:
        record = result.candidate(child.data.tags["evolve.candidate_id"])
        if record.train is None:
            continue
        expected = f"{record.id} {named_scores(record)}"
        assert child.info.run_name == expected  # train/held-out memory score and accuracy
    parent = parents[0]
    best = result.candidate(result.best_id)
    assert parent.info.run_name == f"best {named_scores(best)} {best.id}"
    # The parent's description lists every candidate; its table artifact too.
    for record in result.candidates:
        assert f"| {record.id} |" in parent.data.tags["mlflow.note.content"]
    listed = json.loads(parent.data.tags["mlflow.loggedArtifacts"])
    assert {"path": "candidates.json", "type": "table"} in listed
    path = client.download_artifacts(parent.info.run_id, "candidates.json", str(tmp_path / "t"))
    table = json.loads(Path(path).read_text())
    assert table["columns"][:2] == ["candidate", "status"]
    assert sorted(row[0] for row in table["data"]) == sorted(r.id for r in result.candidates)


def test_candidate_runs_last_as_long_as_their_evaluations(tracked):
    tmp_path, uri, _, result, tracker = tracked
    _, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    run_dir = tracker.context.run_dir
    for child in children:
        record = result.candidate(child.data.tags["evolve.candidate_id"])
        if record.train is None:
            continue
        # The run spans its train evaluation: a held-out check made later (the base's, at
        # the end of the experiment) does not stretch it over the generations in between.
        start, end = evaluation_window(run_dir / record.train.run_dir)
        assert child.info.start_time == start
        assert child.info.end_time == end


def test_undefined_scores_have_no_point():
    summary = MetricSummary(accuracy=0.5, memory_score=None, random_score=0.25)
    nan = MetricSummary(accuracy=0.5, memory_score=float("nan"))
    scores = EvaluationScores(
        users=["u"],
        score=0.5,
        objective="accuracy",
        per_user={"u": 0.5},
        summary=summary,
        per_period=[summary, nan],
        run_dir="x",
    )
    keys = [(m.key, m.step) for m in per_period_metrics(scores, "heldout", 0)]
    assert ("heldout_period/accuracy", 0) in keys and ("heldout_period/accuracy", 1) in keys
    assert not [k for k in keys if k[0] == "heldout_period/memory_score"]
    assert ("heldout_period/random_score", 0) in keys


def test_a_prompt_names_no_candidate_before_export(tracked):
    _, uri, _, result, _ = tracked
    client = mlflow_client(uri)
    best = result.candidate(result.best_id)
    prompt = client.get_prompt(f"exp.{best.mutation.component}")
    # The header tags are the experiment's; the candidate that wrote a text is on its version.
    assert prompt.tags["evolve.experiment"] == "exp"
    assert "evolve.candidate_id" not in prompt.tags


def test_prompts_are_listed_under_their_experiment_not_the_default_one(tracked):
    _, uri, _, result, _ = tracked
    client = mlflow_client(uri)
    experiment = client.get_experiment_by_name("amemgym-evolve/exp")
    names = {f"exp.{component}" for r in result.candidates for component in r.components}

    def listed(experiment_id: str) -> set[str]:
        found = client.search_prompts(filter_string=f'experiment_id = "{experiment_id}"')
        return {prompt.name for prompt in found}

    # MLflow files the link in a background thread: give it a moment.
    deadline = time.monotonic() + 10
    while listed(experiment.experiment_id) != names and time.monotonic() < deadline:
        time.sleep(0.2)
    assert listed(experiment.experiment_id) == names
    assert listed("0") == set()  # the Default experiment's Prompts page stays empty


def test_a_tag_another_process_set_first_is_set_again_not_fatal(tmp_path):
    """Workers of one study start together, and each describes the experiment: MLflow's SQL
    store looks a tag up, then inserts it, so the slower insert breaks the unique key."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import IntegrityError

    from evolve.tracking.store import describe_experiment, mlflow_client
    from evolve.tracking.tags import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, NOTE_TAG

    store = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = store.create_experiment("shared")

    class RacedClient:
        """Another process inserts each tag between this one's lookup and insert."""

        def __init__(self) -> None:
            self.raced: set[str] = set()

        def set_experiment_tag(self, experiment: str, key: str, value: str) -> None:
            if key not in self.raced:
                self.raced.add(key)
                store.set_experiment_tag(experiment, key, "the other process's")
                duplicate = IntegrityError("INSERT INTO experiment_tags", {}, Exception("UNIQUE"))
                raise MlflowException(str(duplicate)) from duplicate
            store.set_experiment_tag(experiment, key, value)

    describe_experiment(RacedClient(), experiment_id, "a shared study")
    tags = store.get_experiment(experiment_id).tags
    assert (tags[EXPERIMENT_KIND_TAG], tags[NOTE_TAG]) == (EXPERIMENT_KIND, "a shared study")

    class BrokenClient:
        def set_experiment_tag(self, experiment: str, key: str, value: str) -> None:
            raise MlflowException("the store is read-only")

    with pytest.raises(MlflowException, match="read-only"):  # any other error still stops
        describe_experiment(BrokenClient(), experiment_id, "")


def test_candidate_runs_log_the_bounds_of_their_intervals(tracked):
    _, uri, _, result, tracker = tracked
    _, _, children = runs_by_kind(uri, "amemgym-evolve/exp")
    checked = 0
    for child in children:
        record = result.candidate(child.data.tags["evolve.candidate_id"])
        for split in ("train", "heldout"):
            scores = getattr(record, split)
            if scores is None:
                continue
            metrics = child.data.metrics
            # Recomputed from the evaluation's per-question records.
            outcomes = load_outcomes(tracker.context.run_dir / scores.run_dir, stratum="x")
            accuracy = estimate(outcomes, seed=scores.estimate.basis.seed).accuracy
            assert metrics[f"{split}_accuracy_low"] == pytest.approx(accuracy.interval.low)
            assert metrics[f"{split}_accuracy_high"] == pytest.approx(accuracy.interval.high)
            assert metrics[f"{split}_accuracy"] == pytest.approx(float(outcomes.correct.mean()))
            memory = scores.estimate.memory_score
            assert metrics[f"{split}_memory_score_low"] == pytest.approx(memory.interval.low)
            assert metrics[f"{split}_memory_score_high"] == pytest.approx(memory.interval.high)
            checked += 1
    assert checked >= 4  # train and held-out of the base and of the best


def test_parent_run_carries_the_heldout_test_of_the_best_against_the_base(tracked):
    _, uri, _, result, tracker = tracked
    _, parents, _ = runs_by_kind(uri, "amemgym-evolve/exp")
    parent = parents[0]
    base, best = base_and_best(result)
    assert base.id != best.id
    # Recomputed from the two evaluations' per-question records, paired on the same questions.
    run_dir = tracker.context.run_dir
    best_outcomes, base_outcomes = paired(
        load_outcomes(run_dir / best.heldout.run_dir), load_outcomes(run_dir / base.heldout.run_dir)
    )
    comparison = compare(best_outcomes, base_outcomes, seed=int(parent.data.tags[TAG_HELDOUT_SEED]))
    metrics, tags = parent.data.metrics, parent.data.tags
    difference = float((best_outcomes.correct - base_outcomes.correct).mean())
    assert metrics["heldout_difference"] == pytest.approx(difference)
    interval = comparison.difference.interval
    assert metrics["heldout_difference_low"] == pytest.approx(interval.low)
    assert metrics["heldout_difference_high"] == pytest.approx(interval.high)
    memory = comparison.memory_score_difference
    assert metrics["heldout_memory_score_difference"] == pytest.approx(memory.value)
    assert metrics["heldout_memory_score_difference_low"] == pytest.approx(memory.interval.low)
    assert metrics["heldout_mcnemar_p"] == pytest.approx(comparison.mcnemar_p)
    best_only = int(((best_outcomes.correct == 1) & (base_outcomes.correct == 0)).sum())
    assert metrics["heldout_best_only_correct"] == best_only
    assert "heldout_sign_flip_p" not in metrics  # one held-out user: no user-level test
    # The verdict is the interval's, not the point scores'.
    logged = Interval(
        low=metrics["heldout_difference_low"], high=metrics["heldout_difference_high"]
    )
    assert tags[TAG_HELDOUT_VERDICT] == verdict_of(logged).value == comparison.verdict.value
    assert tags[TAG_HELDOUT_METHOD] == comparison.basis.method
    assert tags[TAG_HELDOUT_EVIDENCE] == comparison.evidence()
    description = tags["mlflow.note.content"]
    assert f"the best ({best.id}) against the base ({base.id})" in description
    assert interval.format(signed=True) in description
    assert f"McNemar {best_only} vs {comparison.y_only_correct}" in description
    basis = rf"{len(best_outcomes.clusters)} users?, {best_outcomes.questions} questions"
    assert re.search(basis, description), description


def test_a_finish_without_a_verdict_forgets_the_earlier_one(tracked):
    """A resumed experiment whose best lost its held-out pairing keeps no stale verdict."""
    _, uri, _, result, tracker = tracked
    client, parents, _ = runs_by_kind(uri, "amemgym-evolve/exp")
    run_id = parents[0].info.run_id
    assert TAG_HELDOUT_VERDICT in parents[0].data.tags
    try:
        tracker.finish(result.model_copy(update={"heldout_comparison": None}))
        tags = client.get_run(run_id).data.tags
        assert not [key for key in HELDOUT_VERDICT_TAGS if key in tags]
        assert "Held-out test" not in tags["mlflow.note.content"]
    finally:
        tracker.finish(result)
    assert client.get_run(run_id).data.tags[TAG_HELDOUT_VERDICT] == (
        result.heldout_comparison.verdict.value
    )
