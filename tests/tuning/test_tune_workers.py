"""Two worker processes on one local study finish exactly the requested trials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
from optuna.trial import TrialState
from tuning.tune_helpers import PAPER_GRID, write_tune_spec

from evolve.tuning.records import ATTR_WORKER, trial_records

WORKER = Path(__file__).resolve().parent / "worker_main.py"


def _start(spec: Path, tmp_path: Path, index: int) -> subprocess.Popen:
    env = {**os.environ, "EVOLVE_CACHE_DIR": str(tmp_path / "cache")}
    log = open(tmp_path / f"worker{index}.log", "w")  # noqa: SIM115 - closed by the process end
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(spec), str(tmp_path / "runs"), str(tmp_path / "ub")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )


def test_two_workers_share_one_study_without_losing_or_repeating_trials(tmp_path):
    requested = 7  # of a 9-point grid: the last slots are raced for
    spec = write_tune_spec(
        tmp_path, f'sampler = "grid"\ntrials = {requested}\n[tuning.parameters]\n{PAPER_GRID}'
    )
    workers = [_start(spec, tmp_path, index) for index in range(2)]
    codes = [worker.wait(timeout=600) for worker in workers]
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    finished = study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert len(finished) == requested
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    # Nothing duplicated: each finished trial evaluated a different grid point, in its own
    # directory; anything else in the study is a surplus trial discarded before evaluation.
    points = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(points)) == requested
    records = trial_records(study)
    assert all(r.state in ("complete", "surplus") for r in records)
    trial_dirs = sorted((tmp_path / "runs" / "tune" / "trials" / "tune").iterdir())
    assert len(trial_dirs) == requested
    # Both processes did part of the work.
    assert len({t.user_attrs[ATTR_WORKER] for t in finished}) == 2
