"""`evolve tune --wait`: the main invocation waits for trials other workers are running, then
checks the held-out users; without it (on a storage without heartbeat) it says how."""

from __future__ import annotations

import threading

import optuna
from optuna.distributions import CategoricalDistribution
from tuning.tune_helpers import PAPER_GRID, TuneWorld, write_tune_spec

from evolve.cli import main
from evolve.tuning import TuneProgress, load_study_spec, resolve_tuning, run_study

GRID = f'sampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}'


class _WaitSignal(TuneProgress):
    def __init__(self) -> None:
        self.waiting = threading.Event()

    def stage(self, text: str) -> None:
        if text.startswith("waiting for"):
            self.waiting.set()


def _study_with_a_trial_running_elsewhere(tmp_path):
    """A journal study with one finished trial and one RUNNING in "another worker"."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    journal = tmp_path / "study.log"
    spec_path = write_tune_spec(
        tmp_path,
        f'storage = "journal:{journal}"\nheartbeat_grace_s = 4\nheldout = "best"\n{GRID}',
    )
    spec = load_study_spec(spec_path)
    world = TuneWorld()
    run = {"runs_dir": tmp_path / "runs", "upper_bound_cache": tmp_path / "ub"}
    run_study(resolve_tuning(spec, trials=1), world.lms, **run, worker_only=True)
    study = optuna.load_study(
        study_name="tune", storage=JournalStorage(JournalFileBackend(str(journal)))
    )
    other = study.ask(
        {
            "update_every": CategoricalDistribution((2, 4, 8)),
            "short_term_len": CategoricalDistribution((0, 4, 8)),
        }
    )
    return spec, world, run, study, other


def test_wait_holds_the_held_out_check_until_other_workers_finish(tmp_path):
    spec, world, run, study, other = _study_with_a_trial_running_elsewhere(tmp_path)
    progress = _WaitSignal()
    outcome = {}

    def main_invocation() -> None:
        outcome["result"] = run_study(
            resolve_tuning(spec, trials=2), world.lms, **run, progress=progress, wait=True
        )

    thread = threading.Thread(target=main_invocation)
    thread.start()
    assert progress.waiting.wait(60), "the main invocation did not wait for the other trial"
    assert thread.is_alive()
    study.tell(other, 0.01)  # the other worker finishes its trial
    thread.join(60)
    result = outcome["result"]
    assert result.complete and result.finished_trials == 2
    assert [h.label for h in result.heldout] == ["best"]
    assert not any("--wait" in note for note in result.notes)


def test_without_wait_the_note_says_to_rerun_with_wait(tmp_path):
    spec, world, run, _study, other = _study_with_a_trial_running_elsewhere(tmp_path)
    result = run_study(resolve_tuning(spec, trials=2), world.lms, **run)
    assert not result.heldout and not result.complete
    assert any("rerun evolve tune with --wait" in note for note in result.notes)
    assert result.trial(other.number).state == "running"


def test_wait_and_worker_together_are_refused(tmp_path, capsys):
    spec_path = write_tune_spec(tmp_path, f"trials = 1\n{GRID}")
    assert main(["tune", str(spec_path), "--worker", "--wait", "--no-progress"]) == 2
    assert "--wait is for the main invocation" in capsys.readouterr().err
