"""What Optuna's own tools see of a toolkit study (the chosen trial on a tie, as user
attributes), progress that counts every worker's trials, and no bar escape codes in logs."""

from __future__ import annotations

import contextlib
import sys

import optuna
import pytest
from optimize.evolve_helpers import World
from optuna.trial import TrialState, create_trial
from tuning.tune_helpers import PAPER_GRID, tune, write_tune_spec

from evolve.cli import main
from evolve.commands.tune import _Bars
from evolve.tuning.records import (
    CHOICE_RULE,
    GRID_POINT_ATTR,
    STUDY_ATTR_CHOICE,
    STUDY_ATTR_CHOSEN,
    STUDY_ATTR_CHOSEN_RULE,
    STUDY_ATTR_CHOSEN_TRIALS,
    STUDY_ATTR_OPTUNA_BEST,
)
from evolve.tuning.study import TuneProgress
from evolve.tuning.tracking import StudyTracker

# Two grid points on which the generic scripted world scores the same. With seed 1 the grid
# order queues update_every = 4 first, so Optuna's best_trial (the first of equal values) is
# trial 0 while the toolkit picks the smaller parameters, trial 1.
TIED_GRID = 'sampler = "grid"\nheldout = "best"\n[tuning.parameters]\nupdate_every = [2, 4]\n'
TIED_GRID += "short_term_len = [0]"


class _GenericWorld:
    def __init__(self) -> None:
        self.lms = World().lms


def load(tmp_path, result) -> optuna.Study:
    return optuna.load_study(
        study_name=result.study_name, storage=f"sqlite:///{tmp_path / 'optuna.db'}"
    )


def test_on_a_tie_the_study_names_the_toolkits_choice_and_its_heldout_result(tmp_path):
    spec = write_tune_spec(tmp_path, TIED_GRID, seed=1)
    result, _ = tune(tmp_path, spec, world=_GenericWorld())
    study = load(tmp_path, result)  # as Optuna's own tools and optuna-dashboard read it
    values = {t.number: t.value for t in study.trials}
    assert len(values) == 2 and len(set(values.values())) == 1  # a tie
    chosen = result.best[0]
    assert study.best_trial.number != chosen  # the case where the two disagree
    assert study.trials[chosen].params == {"update_every": 2, "short_term_len": 0}

    attrs = study.user_attrs
    assert attrs[STUDY_ATTR_CHOSEN_TRIALS] == [chosen]
    assert attrs[STUDY_ATTR_OPTUNA_BEST] == study.best_trial.number
    assert attrs[STUDY_ATTR_CHOSEN_RULE] == CHOICE_RULE and "smallest parameters" in CHOICE_RULE
    [entry] = attrs[STUDY_ATTR_CHOSEN]
    [heldout] = result.heldout
    assert entry["trial"] == chosen and heldout.trial == chosen
    assert entry["params"] == study.trials[chosen].params == heldout.parameters
    assert entry["values"] == [values[chosen]]
    assert entry["heldout"] == {
        "score": heldout.score,
        "objective_used": heldout.objective_used,
        "accuracy": heldout.metrics["accuracy"],
    }
    # The values are named after the objective (the dashboard's "Objective 0" otherwise),
    # and one sentence names the toolkit's choice next to Optuna's best_trial.
    assert study.metric_names == ["memory_score"]
    assert attrs[STUDY_ATTR_CHOICE].startswith(
        f"the toolkit's choice: trial {chosen} (short_term_len=0, update_every=2), value "
    )
    assert (
        f"Optuna's best_trial {study.best_trial.number} has the same value"
        in (attrs[STUDY_ATTR_CHOICE])
    )


def test_without_a_heldout_check_the_choice_is_still_stored(tmp_path):
    spec = write_tune_spec(tmp_path, TIED_GRID.replace('"best"', '"none"'), seed=1)
    result, _ = tune(tmp_path, spec, world=_GenericWorld())
    [entry] = load(tmp_path, result).user_attrs[STUDY_ATTR_CHOSEN]
    assert entry["trial"] == result.best[0] and entry["heldout"] is None


class _Recorder(TuneProgress):
    def __init__(self) -> None:
        self.own: list[int] = []
        self.study: list[tuple[int, int]] = []

    def trial_finished(self, record) -> None:
        self.own.append(record.number)

    def study_progress(self, *, finished: int, requested: int) -> None:
        self.study.append((finished, requested))


class _OtherWorker(StudyTracker):
    """While this worker's first trial runs, "another worker" finishes the other grid point."""

    def __init__(self, storage: str, study_name: str) -> None:
        self.storage, self.study_name, self.done = storage, study_name, False

    def trial_started(self, number: int, parameters: dict[str, int], seed: int) -> str | None:
        if self.done:
            return None
        self.done = True
        study = optuna.load_study(study_name=self.study_name, storage=self.storage)
        running = study.trials[number]  # the same distributions as this worker's trials
        other = {**parameters, "update_every": 4 if parameters["update_every"] == 2 else 2}
        study.add_trial(
            create_trial(
                params=other,
                distributions=running.distributions,
                value=0.25,
                user_attrs={GRID_POINT_ATTR: other},
                state=TrialState.COMPLETE,
            )
        )
        return None


def test_progress_counts_the_trials_other_workers_finished(tmp_path):
    spec = write_tune_spec(tmp_path, TIED_GRID.replace('"best"', '"none"'), seed=1)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    progress = _Recorder()
    other = _OtherWorker(storage, "tune")
    result, _ = tune(tmp_path, spec, world=_GenericWorld(), progress=progress, tracker=other)
    assert result.finished_trials == 2
    assert len(progress.own) == 1  # this worker ran one trial, the other worker one
    assert progress.study[-1] == (2, 2)  # ... and progress shows the study's two


def test_the_bar_follows_the_studys_count(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
    bars = _Bars(enabled=True)
    bars.study_opened(requested=6, finished=1, running=2)
    bars.study_progress(finished=4, requested=6)
    assert bars.trials is not None and not bars.trials.disable and bars.trials.n == 4
    bars.close()


@pytest.fixture
def inject(monkeypatch):
    @contextlib.contextmanager
    def scripted(config):
        yield World().lms

    monkeypatch.setattr("evolve.commands.tune.open_role_lms", scripted)
    monkeypatch.setattr("evolve.commands.run.open_role_lms", scripted)


def test_no_escape_codes_when_stderr_is_not_a_terminal(tmp_path, inject, capsys):
    spec = write_tune_spec(
        tmp_path, f'trials = 2\nsampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}'
    )
    # Progress wanted (no --no-progress), but stderr is captured: a file, not a terminal.
    assert main(["tune", str(spec), "--runs-dir", str(tmp_path / "runs")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b[" not in err, repr(err[:400])
    assert "study: 2/2 trials finished (all workers)" in err  # plain lines instead of a bar
    assert "trial 0:" in err
