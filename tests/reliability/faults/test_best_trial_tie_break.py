"""The best trial among tied trials does not depend on trial numbers (as after kills).

A `kill -9` during `evolve tune` makes the rerun retry the killed grid point under a new
trial number, so the order in which grid points got their numbers differs from an
uninterrupted run. When trials tie (every trial scores the same on the stub server), the
chosen best parameters, and so the held-out check, must be the same either way.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from evolve.tuning.records import best_trial_numbers

GRID = [
    {"short_term_len": 0, "update_every": 2},
    {"short_term_len": 0, "update_every": 4},
    {"short_term_len": 4, "update_every": 2},
    {"short_term_len": 4, "update_every": 4},
]
DISTRIBUTIONS = {
    "short_term_len": CategoricalDistribution([0, 4]),
    "update_every": CategoricalDistribution([2, 4]),
}


def study_with(order: list[dict[str, int]], values: list[float], direction: str) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    for params, value in zip(order, values, strict=True):
        study.add_trial(create_trial(params=params, distributions=DISTRIBUTIONS, value=value))
    return study


def best_parameters(study: optuna.Study) -> list[dict[str, int]]:
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    return [trials[n].params for n in best_trial_numbers(study)]


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_tied_trials_pick_the_same_parameters_whatever_their_numbers(direction: str) -> None:
    tied = [0.5] * len(GRID)
    uninterrupted = best_parameters(study_with(GRID, tied, direction))
    # As after kills: the first grid point was retried last, the others in another order.
    renumbered = best_parameters(study_with([GRID[2], GRID[3], GRID[1], GRID[0]], tied, direction))
    assert uninterrupted == renumbered == [GRID[0]]


def test_a_better_value_still_wins_over_the_tie_break() -> None:
    study = study_with(GRID, [0.5, 0.5, 0.5, 0.75], "maximize")
    assert best_parameters(study) == [GRID[3]]
    study = study_with(GRID, [0.5, 0.25, 0.5, 0.5], "minimize")
    assert best_parameters(study) == [GRID[1]]


def test_a_study_killed_before_its_heldout_check_is_not_recorded_complete(tmp_path):
    """tuning.json is rewritten after each trial; when the last trial is done but the
    held-out check is not (a kill there), it must not say complete: a rerun must do it."""
    from tuning.tune_helpers import GRID, TuneWorld, make_tuned_agent, tune, write_tune_spec

    from evolve.tuning.study import TuningDir

    spec = write_tune_spec(tmp_path, f'trials = 2\nheldout = "best"\n{GRID}')
    store = TuningDir(tmp_path / "runs" / "tune")
    answer = make_tuned_agent()

    def killed_after_the_trials(call):
        # The first LM call once both trials are stored is the held-out check's.
        if store.result_file.exists():
            stored = store.load_result()
            if sum(t.state == "complete" for t in stored.trials) == 2:
                raise KeyboardInterrupt
        return answer(call)

    world = TuneWorld()
    world.agent.respond = killed_after_the_trials
    with pytest.raises(KeyboardInterrupt):
        tune(tmp_path, spec, world)
    stored = store.load_result()
    assert sum(t.state == "complete" for t in stored.trials) == 2
    assert stored.complete is False
    assert stored.heldout == []
