"""Optuna inside the evolution loop: the ask/tell parameter proposer and short studies."""

from __future__ import annotations

import random

from optimize.evolve_helpers import write_spec
from optuna.trial import TrialState
from tuning.tune_helpers import BEST, TuneWorld

from evolve.optimize import evolve_policy
from evolve.spec.config import load_spec, resolve
from evolve.tuning import IntRange, OptunaParameterProposer, tune_best_candidate

BOUNDS = {
    "update_every": IntRange(low=1, high=8),
    "short_term_len": IntRange(low=0, high=4),
}


def test_proposer_asks_within_bounds_and_is_told_scores():
    proposer = OptunaParameterProposer(BOUNDS, seed=3, startup_trials=2)
    parent = {"update_every": 2, "short_term_len": 4}
    seen = []
    for index in range(6):
        child = proposer.propose(parent, BOUNDS, random.Random(index))
        assert 1 <= child["update_every"] <= 8 and 0 <= child["short_term_len"] <= 4
        assert child != parent
        seen.append(child)
        proposer.observe(child, score=float(child["update_every"] == 4))
    complete = proposer.study.get_trials(states=(TrialState.COMPLETE,))
    assert [t.params for t in complete] == seen
    # Same seeds, same history: the same proposals (a resumed loop proposes the same).
    again = OptunaParameterProposer(BOUNDS, seed=3, startup_trials=2)
    replayed = []
    for index in range(6):
        child = again.propose(parent, BOUNDS, random.Random(index))
        replayed.append(child)
        again.observe(child, score=float(child["update_every"] == 4))
    assert replayed == seen


def test_observed_candidates_without_a_proposal_become_trials():
    proposer = OptunaParameterProposer(BOUNDS, seed=0)
    proposer.observe({"update_every": 3, "short_term_len": 1}, 0.5)  # e.g. replayed on resume
    proposer.observe({"update_every": 20, "short_term_len": 1}, 0.9)  # outside: not usable
    proposer.observe({"update_every": 3}, 0.9)  # incomplete: not usable
    trials = proposer.study.get_trials()
    assert [(t.params, t.value) for t in trials] == [
        ({"update_every": 3, "short_term_len": 1}, 0.5)
    ]


def test_the_evolution_loop_runs_with_the_optuna_proposer(tmp_path):
    spec_path = write_spec(
        tmp_path,
        optimizer="""
            generations = 4
            feedback = "none"
            [optimizer.parameters]
            update_every = { low = 1, high = 8 }
            short_term_len = { low = 0, high = 4 }
        """,
    )
    spec = load_spec(spec_path)
    made: list[OptunaParameterProposer] = []

    def factory() -> OptunaParameterProposer:
        made.append(OptunaParameterProposer(spec.optimizer.parameters, seed=spec.seed))
        return made[-1]

    world = TuneWorld()
    result = evolve_policy(
        spec,
        world.lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
        proposer_factory=factory,
    )
    children = [c for c in result.candidates if c.mutation.kind == "parameter"]
    assert len(children) == 4
    for child in children:
        assert 1 <= child.parameters["update_every"] <= 8
        assert 0 <= child.parameters["short_term_len"] <= 4
    # The last proposal's sampler was told every candidate GEPA had scored on all train
    # users before it (the base (2, 2) is inside the bounds too).
    before_last = [c for c in result.candidates if c.train is not None and c.generation < 4]
    told = made[-1].study.get_trials(states=(TrialState.COMPLETE,))
    assert len(made) == 4 and len(told) == len(before_last)
    assert sorted(t.value for t in told) == sorted(c.train.score for c in before_last)


def test_tune_best_candidate_finds_the_best_parameters(tmp_path):
    spec_path = write_spec(tmp_path)  # its environment and in_context base policy
    resolved = resolve(load_spec(spec_path))
    world = TuneWorld()
    outcome = tune_best_candidate(
        resolved.base_policy,
        resolved.train,
        world.lms,
        tmp_path / "tuning" / "g02",
        resolved.episode.model_copy(update={"rounds_initial": 2}),
        parameters={"update_every": [2, 4, 8], "short_term_len": IntRange(low=0, high=4, step=4)},
        trials=6,
        sampler="grid",
        seed=1,
    )
    assert outcome.best_parameters == BEST
    assert outcome.best_value == 1.0 and outcome.objective_used == "memory_score"
    assert len([t for t in outcome.trials if t.finished]) == 6
    assert (outcome.best_run_dir / "report.json").is_file()
    assert outcome.llm_calls > 0
