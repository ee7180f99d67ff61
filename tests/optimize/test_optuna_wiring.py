"""Optuna wired into the evolution loop by the spec: the ask/tell parameter proposer
(`parameter_proposer = "optuna"`) and a short study on the parent (`tune_every`, the
`tuned` operator), both inside GEPA generations."""

from __future__ import annotations

import pytest
from optimize.evolve_helpers import write_spec
from tuning.tune_helpers import BEST, TuneWorld

from evolve.core.errors import ConfigError
from evolve.optimize import CandidateStatus, ExperimentDir, evolve_policy
from evolve.spec.config import load_spec
from evolve.tuning import OptunaParameterProposer

PROPOSER_OPTIMIZER = """
    generations = 6
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
    result = evolve_policy(
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
    made: list[OptunaParameterProposer] = []

    def factory() -> OptunaParameterProposer:
        made.append(OptunaParameterProposer(load_spec(spec).optimizer.parameters, seed=7))
        return made[-1]

    third, _ = run(tmp_path / "c", spec, proposer_factory=factory)
    assert parameters_by_id(third) == parameters_by_id(first)
    # One fresh proposer per proposal, told every pool candidate's train score so far.
    assert len(made) == len(children)
    told = made[-1].study.get_trials()
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


def test_tune_every_makes_a_tuned_candidate_from_the_studys_best(tmp_path):
    result, world = run(tmp_path, tuned_spec(tmp_path))
    assert result.complete
    base = result.candidate("g00-c0")
    # Generation 1 is a tune_every generation: the tuned operator owns the numeric
    # components, runs a short study on the parent and proposes its best setting.
    tuned = result.candidate("g01-c0")
    assert tuned.mutation.kind == "tuned" and tuned.parent_ids == (base.id,)
    assert tuned.parameters["update_every"] == BEST["update_every"]
    assert tuned.components == base.components
    assert tuned.mutation.parameter_changes == {
        name: (base.parameters[name], value)
        for name, value in tuned.parameters.items()
        if base.parameters[name] != value
    }
    # Accepted by GEPA (better than its parent on the minibatch), scored on all train users
    # and, as the new best, on the held-out user.
    assert tuned.status == CandidateStatus.EVALUATED and tuned.train.score == 1.0
    assert tuned.train.score > base.train.score
    assert tuned.heldout is not None and result.best_id == tuned.id
    study_dirs = list((tmp_path / "runs/exp/tuning").iterdir())
    assert len(study_dirs) == 1
    # The study's calls are in the experiment's spend.
    assert result.llm_calls == calls(world)


def test_a_finished_tuned_run_resumes_without_llm_calls(tmp_path):
    spec = tuned_spec(tmp_path)
    first, _ = run(tmp_path, spec)
    again, world = run(tmp_path, spec)
    assert calls(world) == 0 and again.complete
    assert again.candidates == first.candidates
    # Records lost after the run (a kill between GEPA's checkpoint and our write) are
    # rebuilt from GEPA's state and the finished runner directories, without any call.
    root = tmp_path / "runs/exp"
    (root / "generations/gen_01.json").unlink()
    (root / "result.json").unlink()
    third, world = run(tmp_path, spec)
    assert calls(world) == 0 and third.candidates == first.candidates
    assert ExperimentDir(root).load_generation(1) == first.generations[1]


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
