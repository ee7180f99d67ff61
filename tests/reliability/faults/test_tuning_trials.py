"""Optuna's trial loop survives a killed worker and uses public APIs only.

- a `kill -9` of the main `evolve tune` process mid-trial leaves a RUNNING trial; the rerun
  (here with an extra `--worker` beside it) fails it by heartbeat after `heartbeat_grace_s`,
  retries its grid point, and finishes with exactly the requested trials, exit 0;
- grid points enqueued twice (two workers starting together) are evaluated once;
- `[tuning] heartbeat_grace_s` is validated; the trial loop reaches no private Optuna API
  and optuna is pinned to the tested range.
"""

from __future__ import annotations

import os
import re
import signal
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from packaging.specifiers import SpecifierSet
from reliability.process_helpers import (
    ONE_TRAIN_USER,
    load_tune_study,
    running_trial,
    tune_process,
)
from stub_server import StubServer
from tuning.tune_helpers import GRID, TuneWorld, write_tune_spec

from evolve.core.errors import ConfigError
from evolve.tuning import load_study_spec, resolve_tuning, run_study
from evolve.tuning.records import trial_records

ROOT = Path(__file__).resolve().parents[3]
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def test_a_rerun_after_kill_9_mid_trial_finishes_the_study(tmp_path):
    requested = 3
    spec = write_tune_spec(
        tmp_path,
        f'trials = {requested}\nheldout = "none"\nheartbeat_grace_s = 3\n{GRID}',
        environment=ONE_TRAIN_USER,
    )
    with StubServer(latency=0.2) as stub:
        first = tune_process(spec, tmp_path, stub)
        deadline = time.monotonic() + 180  # a loaded CI machine starts Python slowly
        killed_trial, started = None, 0
        while time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            if killed_trial is None:
                killed_trial = running_trial(tmp_path)
                started = stub.stats()["chat_requests"]
            elif stub.stats()["chat_requests"] >= started + 3:
                break  # mid-trial: some of its LLM calls are done
            time.sleep(0.05)
        assert killed_trial is not None, "no trial started within 180 s"
        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=10)
        assert [t.state for t in load_tune_study(tmp_path).trials].count(TrialState.RUNNING) == 1

        # The rerun: the main process and an extra worker, together.
        rerun = tune_process(spec, tmp_path, stub)
        worker = tune_process(spec, tmp_path, stub, "--worker")
        out, err = rerun.communicate(timeout=300)
        worker_out, worker_err = worker.communicate(timeout=120)
    assert rerun.returncode == 0, err[-3000:]
    assert worker.returncode == 0, worker_err[-3000:]
    assert f"{requested}/{requested} trials finished" in out, out
    study = load_tune_study(tmp_path)
    finished = study.get_trials(states=FINISHED)
    assert len(finished) == requested
    points = [tuple(sorted(t.params.items())) for t in finished]
    assert len(set(points)) == requested, f"a grid point was evaluated twice: {points}"
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
    # The killed trial was failed by its stale heartbeat and its grid point retried.
    killed = study.trials[killed_trial.number]
    assert killed.state == TrialState.FAIL
    assert tuple(sorted(killed.params.items())) in points
    records = trial_records(study)
    assert all(r.state in ("complete", "pruned", "failed", "surplus") for r in records)
    assert sum(r.state == "failed" for r in records) == 1


def test_grid_points_enqueued_twice_are_evaluated_once(tmp_path):
    """Two workers starting together may both enqueue the grid: each point still runs once."""
    from evolve.tuning.samplers import GRID_POINT_ATTR, grid_order

    requested = 4
    spec_path = write_tune_spec(tmp_path, f'trials = {requested}\nheldout = "none"\n{GRID}')
    spec = load_study_spec(spec_path)
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="tune", direction="maximize"
    )
    for _worker in range(2):  # both saw an empty study
        for point in grid_order(spec.tuning.grid(), spec.seed)[:requested]:
            study.enqueue_trial(point, user_attrs={GRID_POINT_ATTR: point})
    world = TuneWorld()
    result = run_study(
        spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    assert result.complete and result.finished_trials == requested
    finished = [r for r in result.trials if r.finished]
    assert len({tuple(sorted(r.parameters.items())) for r in finished}) == requested
    # The duplicates were discarded before any evaluation, and none is left waiting.
    assert {r.state for r in result.trials} <= {"complete", "pruned", "surplus"}
    assert not [t for t in load_tune_study(tmp_path).trials if t.state == TrialState.WAITING]
    assert len(list((tmp_path / "runs" / "tune" / "trials" / "tune").iterdir())) == requested


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "heartbeat_grace_s: .*greater than or equal to 2"),
        ("1", "heartbeat_grace_s: .*greater than or equal to 2"),
        ('"soon"', "heartbeat_grace_s: .*integer"),
    ],
)
def test_heartbeat_grace_is_validated(tmp_path, value, message):
    with pytest.raises(ConfigError, match=message):
        load_study_spec(write_tune_spec(tmp_path, f"heartbeat_grace_s = {value}\n{GRID}"))


def test_heartbeat_grace_is_configurable_with_a_default(tmp_path):
    spec = load_study_spec(write_tune_spec(tmp_path, f"heartbeat_grace_s = 5\n{GRID}"))
    assert spec.tuning.heartbeat_grace_s == 5
    default = load_study_spec(write_tune_spec(tmp_path / "d", GRID))
    assert 2 <= default.tuning.heartbeat_grace_s <= 600


_PRIVATE_OPTUNA = re.compile(
    r"\._storage\b|\._study_id\b|\._trial_id\b|\._contains\b|optuna\.\w+\._|"
    r"from optuna(\.\w+)*\._\w+ import|get_heartbeat_thread"
)


def test_the_trial_loop_uses_public_optuna_apis_only():
    offenders = []
    for path in sorted((ROOT / "evolve" / "tuning").glob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _PRIVATE_OPTUNA.search(line):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []


def test_optuna_is_pinned_to_the_tested_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [d for d in project["project"]["dependencies"] if re.match(r"optuna\b", d)]
    assert len(pins) == 1
    specifier = SpecifierSet(pins[0].removeprefix("optuna"))
    assert version("optuna") in specifier
    assert any(s.operator in ("<", "<=", "~=", "==") for s in specifier), "no upper bound"


def test_fail_running_recovers_a_journal_study_left_running(tmp_path):
    """A journal storage has no heartbeat: `--fail-running` fails the orphan and the grid
    point it held is queued again, so the rerun completes the study."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    journal = tmp_path / "study.log"
    spec_path = write_tune_spec(
        tmp_path, f'storage = "journal:{journal}"\ntrials = 2\nheldout = "none"\n{GRID}'
    )
    spec = load_study_spec(spec_path)
    world = TuneWorld()
    run = {"runs_dir": tmp_path / "runs", "upper_bound_cache": tmp_path / "ub"}
    first = run_study(spec, world.lms, **run, worker_only=True)
    assert first.finished_trials == 2
    # A worker that died mid-trial: one more trial stays RUNNING forever.
    storage = JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="tune", storage=storage)
    orphan = study.ask({"update_every": optuna.distributions.CategoricalDistribution((2, 4, 8))})
    more = run_study(
        resolve_tuning(spec, trials=4), world.lms, **run, worker_only=True, fail_running=True
    )
    assert more.complete and more.finished_trials == 4
    assert more.trial(orphan.number).state == "failed"
    finished = [tuple(sorted(r.parameters.items())) for r in more.trials if r.finished]
    assert len(set(finished)) == 4


@pytest.mark.timeout(120)  # before the fix, the main invocation waited forever
def test_a_trial_killed_before_its_first_heartbeat_is_retried_after_the_grace(tmp_path):
    """A worker killed between creating a trial and its first heartbeat leaves a RUNNING
    trial Optuna never counts stale; the main invocation fails and retries it after
    `heartbeat_grace_s` instead of waiting for it forever."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    spec_path = write_tune_spec(
        tmp_path, f'storage = "{url}"\ntrials = 2\nheldout = "none"\nheartbeat_grace_s = 2\n{GRID}'
    )
    spec = load_study_spec(spec_path)
    world = TuneWorld()
    run = {"runs_dir": tmp_path / "runs", "upper_bound_cache": tmp_path / "ub"}
    first = run_study(spec, world.lms, **run, worker_only=True)
    assert first.finished_trials == 2
    # `ask` creates the trial without a heartbeat row, as a worker killed at that moment.
    study = optuna.load_study(study_name="tune", storage=url)
    orphan = study.ask({"update_every": optuna.distributions.CategoricalDistribution((2, 4, 8))})
    started = time.monotonic()
    more = run_study(resolve_tuning(spec, trials=3), world.lms, **run, worker_only=False)
    assert time.monotonic() - started >= 2, "a trial younger than the grace was failed"
    assert more.complete and more.finished_trials == 3
    assert more.trial(orphan.number).state == "failed"
    finished = [tuple(sorted(r.parameters.items())) for r in more.trials if r.finished]
    assert len(set(finished)) == 3
    assert not study.get_trials(states=(TrialState.RUNNING, TrialState.WAITING))
