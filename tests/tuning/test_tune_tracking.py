"""Two workers of one study that both create a parent run end with one parent.

The race CI hit (main + 2 workers on PostgreSQL): a run's start time is taken before the run
is stored, so worker B can store an earlier-stamped parent after worker A looked, found only
its own, and kept it. Here B's first lookup is made to miss A's run and B's run is stamped
before A's; without the re-check both parents stay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tuning.tune_helpers import write_tune_spec

from evolve.tracking import PARENT_RUN_TAG, TAG_KIND, mlflow_client
from evolve.tracking import study as tuning_tracking
from evolve.tuning.records import TrialRecord
from evolve.tuning.spec import load_study_spec
from evolve.tuning.tracking import KIND_TUNING, MLflowStudyTracker, StudyContext


def _context(tmp_path: Path) -> StudyContext:
    spec = load_study_spec(
        write_tune_spec(
            tmp_path,
            """
            trials = 2
            [tuning.parameters]
            update_every = [2, 4]
            """,
        )
    )
    return StudyContext(
        name="tune",
        study_name="race",
        storage="sqlite",
        config_hash="abc123",
        spec=spec,
        run_dir=tmp_path / "runs",
        model_names={"agent": "agent-model"},
        environment="env.json",
        requested_trials=2,
    )


class _RacingClient:
    """A client whose first parent lookup answers `first_lookup` (what another worker's
    concurrent write or deletion made stale) and, given `start_time`, whose parent run is
    stamped then: it started first but stored its run last."""

    def __init__(
        self, inner: Any, *, first_lookup: list[Any], start_time: int | None = None
    ) -> None:
        self._inner = inner
        self._first_lookup = first_lookup
        self._start_time = start_time
        self._lookups = 0

    def search_runs(self, *args: Any, **kwargs: Any) -> Any:
        self._lookups += 1
        if self._lookups == 1:
            return self._first_lookup
        return self._inner.search_runs(*args, **kwargs)

    def create_run(self, *args: Any, **kwargs: Any) -> Any:
        if self._start_time is not None and kwargs.get("run_name", "").startswith("tune "):
            kwargs["start_time"] = self._start_time
        return self._inner.create_run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _record(number: int, run_id: str) -> TrialRecord:
    return TrialRecord(
        number=number,
        state="complete",
        parameters={"update_every": 2 + 2 * number},
        values=[0.5],
        mlflow_run_id=run_id,
    )


def _active_parents(uri: str, experiment: str) -> list[Any]:
    client = mlflow_client(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    runs = client.search_runs([experiment_id], max_results=100)
    return [r for r in runs if r.data.tags.get(TAG_KIND) == KIND_TUNING]


def test_a_parent_stored_late_with_an_earlier_start_wins_and_the_other_worker_moves_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = _context(tmp_path)
    first = MLflowStudyTracker(uri, "race-experiment")
    first.start(context)  # finds nothing, creates its parent, keeps it (it is the only one)
    first_parent = first.parent_run_id
    first_trial = first.trial_started(0, {"update_every": 2}, seed=1)
    assert first_trial is not None

    stamped = first.client.get_run(first_parent).info.start_time - 1000
    real_client = tuning_tracking.mlflow_client
    monkeypatch.setattr(
        tuning_tracking,
        "mlflow_client",
        lambda tracking_uri: _RacingClient(
            real_client(tracking_uri), first_lookup=[], start_time=stamped
        ),
    )
    second = MLflowStudyTracker(uri, "race-experiment")
    second.start(context)  # its lookup missed `first`'s run; its own is the earliest: kept
    assert second.parent_run_id != first_parent
    assert len(_active_parents(uri, "race-experiment")) == 2  # the race, as CI saw it

    first.trial_finished(_record(0, first_trial))  # looks again: moves to the earlier parent
    parents = _active_parents(uri, "race-experiment")
    assert [p.info.run_id for p in parents] == [second.parent_run_id]
    assert first.parent_run_id == second.parent_run_id
    moved = first.client.get_run(first_trial)
    assert moved.data.tags[PARENT_RUN_TAG] == second.parent_run_id
    # The parent kept has the study's params and the tags every worker writes.
    kept = parents[0].data
    assert kept.params["config_hash"] == "abc123"
    assert kept.tags["evolve.trials_requested"] == "2"

    next_trial = first.trial_started(1, {"update_every": 4}, seed=2)
    assert first.client.get_run(next_trial).data.tags[PARENT_RUN_TAG] == second.parent_run_id


def test_a_worker_whose_parent_is_deleted_under_it_writes_to_the_earliest_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third worker looks up the parents while the first one's is still there; the first
    then moves to an earlier parent and deletes its own; the third's writes must follow
    (MLflow refuses any write to a deleted run, and the worker would crash)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    context = _context(tmp_path)
    first = MLflowStudyTracker(uri, "race-experiment")
    first.start(context)
    first_parent = first.parent_run_id
    first_trial = first.trial_started(0, {"update_every": 2}, seed=1)
    stale = [first.client.get_run(first_parent)]

    stamped = stale[0].info.start_time - 1000
    real_client = tuning_tracking.mlflow_client
    monkeypatch.setattr(
        tuning_tracking,
        "mlflow_client",
        lambda tracking_uri: _RacingClient(
            real_client(tracking_uri), first_lookup=[], start_time=stamped
        ),
    )
    second = MLflowStudyTracker(uri, "race-experiment")
    second.start(context)
    first.trial_finished(_record(0, first_trial))  # moves to `second`'s parent, deletes its own
    assert first.client.get_run(first_parent).info.lifecycle_stage == "deleted"

    monkeypatch.setattr(
        tuning_tracking,
        "mlflow_client",
        lambda tracking_uri: _RacingClient(real_client(tracking_uri), first_lookup=stale),
    )
    third = MLflowStudyTracker(uri, "race-experiment")
    third.start(context)  # found the deleted parent; its first write fails, then it looks again
    assert third.parent_run_id == second.parent_run_id
    parents = _active_parents(uri, "race-experiment")
    assert [p.info.run_id for p in parents] == [second.parent_run_id]
    assert parents[0].info.status == "RUNNING"
