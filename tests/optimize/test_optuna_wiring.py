"""Optuna wired into the evolution loop by the spec: the ask/tell parameter proposer
(`parameter_proposer = "optuna"`) and a short study on a generation's best (`tune_every`)."""

from __future__ import annotations

import json

import pytest
from optimize.evolve_helpers import write_spec
from tuning.tune_helpers import BEST, TuneWorld

from evolve.config import load_spec
from evolve.errors import ConfigError
from evolve.optimize import CandidateStatus, ExperimentStore, run_experiment
from evolve.tune import OptunaParameterProposer

PROPOSER_OPTIMIZER = """
    generations = 3
    candidates_per_generation = 2
    feedback = "none"
    parameter_proposer = "optuna"
    [optimizer.parameters]
    update_every = { low = 1, high = 8 }
    short_term_len = { low = 0, high = 4 }
"""

# The study's grid holds BEST (update_every 4, short_term_len 0), the only setting that
# scores 1.0 in TuneWorld; the base (2, 1) and its child score less. The base lies within the
# bounds (a base outside them is refused when the spec is loaded).
TUNE_OPTIMIZER = """
    generations = 1
    candidates_per_generation = 1
    feedback = "none"
    tune_every = 1
    tune_trials = 6
    tune_sampler = "grid"
    [optimizer.parameters]
    update_every = { low = 2, high = 4 }
    short_term_len = { low = 0, high = 1 }
"""

TUNE_BASE_POLICY = """
    kind = "in_context"
    parameters = { update_every = 2, short_term_len = 1 }
"""


def run(directory, spec_path, world=None, **kwargs):
    world = world or TuneWorld()
    result = run_experiment(
        load_spec(spec_path),
        world.lms,
        runs_dir=directory / "runs",
        upper_bound_cache=directory / "ub",
        **kwargs,
    )
    return result, world


def calls(world: TuneWorld) -> int:
    return len(world.agent.calls) + len(world.simulator.calls)


def tuned_spec(directory, name="exp", **tables):
    directory.mkdir(parents=True, exist_ok=True)
    return write_spec(
        directory,
        name=name,
        optimizer=TUNE_OPTIMIZER,
        episode="rounds_initial = 2\nrounds_update = 1",
        **{"policy": TUNE_BASE_POLICY, **tables},
    )


def parameters_by_id(result) -> dict[str, dict[str, int]]:
    return {c.id: c.parameters for c in result.candidates}


# ----- parameter_proposer = "optuna" --------------------------------------------------------


def test_optuna_proposer_from_the_spec_is_within_bounds_and_deterministic(tmp_path):
    spec = write_spec(tmp_path, optimizer=PROPOSER_OPTIMIZER)
    first, _ = run(tmp_path / "a", spec)
    second, _ = run(tmp_path / "b", spec)
    children = [c for c in first.candidates if c.mutation.kind == "parameter"]
    assert len(children) == 6 and first.complete
    for child in children:
        assert 1 <= child.parameters["update_every"] <= 8
        assert 0 <= child.parameters["short_term_len"] <= 4
    # Same spec, same seed: the same proposals.
    assert parameters_by_id(first) == parameters_by_id(second)
    # The loop built exactly the proposer the spec names (not the random-step default).
    injected = OptunaParameterProposer(load_spec(spec).optimizer.parameters, seed=7)
    third, _ = run(tmp_path / "c", spec, proposer=injected)
    assert parameters_by_id(third) == parameters_by_id(first)
    told = injected.study.get_trials()
    assert {t.value for t in told if t.value is not None} <= {
        c.train.score for c in third.candidates if c.train is not None
    }
    random_step, _ = run(
        tmp_path / "d",
        write_spec(
            tmp_path / "d",
            optimizer=PROPOSER_OPTIMIZER.replace('parameter_proposer = "optuna"', ""),
        ),
    )
    assert parameters_by_id(random_step) != parameters_by_id(first)


def test_optuna_proposer_resumes_deterministically_after_a_budget_stop(tmp_path):
    spec = write_spec(tmp_path, optimizer=PROPOSER_OPTIMIZER)
    whole, _ = run(tmp_path / "whole", spec)
    interrupted = write_spec(
        tmp_path / "cut", optimizer=PROPOSER_OPTIMIZER, budget="max_llm_calls = 150"
    )
    stopped, _ = run(tmp_path / "cut", interrupted)
    assert stopped.stopped is not None
    assert len(stopped.candidates) < len(whole.candidates)
    # The history is replayed through observe(): later proposals are the uninterrupted run's.
    resumed, _ = run(tmp_path / "cut", write_spec(tmp_path / "cut", optimizer=PROPOSER_OPTIMIZER))
    assert resumed.complete
    assert parameters_by_id(resumed) == parameters_by_id(whole)


# ----- tune_every ---------------------------------------------------------------------------


def test_tune_every_records_a_tuned_candidate_from_the_studys_best(tmp_path):
    result, world = run(tmp_path, tuned_spec(tmp_path))
    assert result.complete
    child = result.candidate("g01-c0")
    assert child.mutation.kind == "parameter" and child.train.score < 0.5
    root = tmp_path / "runs/exp"
    outcome = json.loads((root / "tuning/gen_01/outcome.json").read_text())
    study = json.loads((root / "tuning/gen_01/tuning.json").read_text())
    assert outcome["tuned_from"] == child.id  # the generation's best (its only child)
    assert len(study["trials"]) == 6 and outcome["llm_calls"] > 0
    (best_trial,) = [t for t in study["trials"] if t["number"] == study["best"][0]]
    best = {**child.parameters, **best_trial["parameters"]}
    assert outcome["best_parameters"] == best and outcome["best_value"] == 1.0
    assert best["update_every"] == BEST["update_every"]  # the only batch size that writes
    tuned = result.candidate("g01-c1")
    assert tuned.mutation.kind == "tuned" and tuned.parent_ids == (child.id,)
    assert tuned.parameters == best and tuned.components == child.components
    assert tuned.mutation.parameter_changes == {
        name: (child.parameters[name], value)
        for name, value in best.items()
        if child.parameters[name] != value
    }
    assert tuned.mutation.describe().startswith("tuned(update_every 3->4")
    # Evaluated like any other candidate (its train run resumed from the best trial's, which
    # evaluated the same policy): the generation's best, kept by selection, checked held-out.
    assert tuned.status == CandidateStatus.EVALUATED and tuned.train.score == 1.0
    assert tuned.train.run_dir == "candidates/g01-c1/train"
    generation = result.generations[1]
    assert generation.candidate_ids == ["g01-c0", "g01-c1"]
    assert generation.best_id == tuned.id and tuned.id in generation.population
    assert tuned.heldout is not None and result.best_id == tuned.id
    # The study's calls are in the generation's and the experiment's spend, counted once.
    assert generation.llm_calls == (
        outcome["llm_calls"] + child.train.summary.llm_calls + tuned.heldout.summary.llm_calls
    )
    assert result.llm_calls == calls(world)


def test_a_finished_tuned_run_resumes_without_llm_calls(tmp_path):
    spec = tuned_spec(tmp_path)
    first, _ = run(tmp_path, spec)
    again, world = run(tmp_path, spec)
    assert calls(world) == 0 and again.complete
    assert again.candidates == first.candidates
    # A generation cut short after its study: the stored outcome is used, the study not rerun.
    root = tmp_path / "runs/exp"
    study_file = root / "tuning/gen_01/tuning.json"
    stamp = study_file.stat().st_mtime_ns
    (root / "generations/gen_01.json").unlink()
    (root / "result.json").unlink()
    third, world = run(tmp_path, spec)
    assert calls(world) == 0 and third.candidates == first.candidates
    assert study_file.stat().st_mtime_ns == stamp
    assert ExperimentStore(root).load_generation(1) == first.generations[1]


def test_a_study_stopped_by_the_budget_resumes_to_the_same_result(tmp_path):
    whole, _ = run(tmp_path, tuned_spec(tmp_path / "whole"))
    outcome = json.loads((tmp_path / "runs/exp/tuning/gen_01/outcome.json").read_text())
    # Stop in the middle of the study (the upper bound is cached now: it costs nothing).
    child = whole.candidate("g01-c0")
    limit = whole.generations[0].llm_calls + child.train.summary.llm_calls
    limit += outcome["llm_calls"] // 2
    stopped, _ = run(
        tmp_path, tuned_spec(tmp_path / "cut", "cut", budget=f"max_llm_calls = {limit}")
    )
    root = tmp_path / "runs/cut"
    assert stopped.stopped is not None and "g01-c1" not in parameters_by_id(stopped)
    assert (root / "tuning/gen_01").is_dir() and not (root / "tuning/gen_01/outcome.json").exists()
    # The budget is not part of the resume guard: rerun without it to finish the study.
    resumed, world = run(tmp_path, tuned_spec(tmp_path / "cut", "cut"))
    assert resumed.complete and calls(world) > 0
    assert parameters_by_id(resumed) == parameters_by_id(whole)
    tuned, reference = resumed.candidate("g01-c1"), whole.candidate("g01-c1")
    assert tuned.train.score == reference.train.score == 1.0
    assert tuned.mutation == reference.mutation and tuned.parent_ids == reference.parent_ids


# ----- spec validation ----------------------------------------------------------------------


def test_tune_every_needs_a_tunable_parameter(tmp_path):
    spec = write_spec(tmp_path, optimizer="tune_every = 2")
    with pytest.raises(ConfigError, match=r"optimizer: tune_every = 2 .*optimizer.parameters"):
        load_spec(spec)
    spec = write_spec(tmp_path, optimizer='parameter_proposer = "optuna"')
    with pytest.raises(ConfigError, match="parameter_proposer"):
        load_spec(spec)
    spec = write_spec(tmp_path, optimizer='schedule = "per_period"\ntune_every = 1')
    with pytest.raises(ConfigError, match="tune_every"):
        load_spec(spec)
