"""The one parent MLflow run of a tuning study, shared by the study's concurrent workers.

`evolve.tracking.study` logs what the parent run says; this module decides which run that
is. Several workers of one study share the parent run: each looks it up by its tags and
creates one when there is none. Workers starting together may each create one; the earliest
(start time, then run id) is the parent. A run's start time is taken before it is stored, so
a worker can store its run after another worker already checked and kept its own: every
worker therefore looks again before each trial, after each trial and at the end, and on
finding an earlier parent moves its trial runs there and deletes its own; a worker whose
write finds its parent deleted (it looked just before the deletion) looks again and writes
there. A worker ends after the last run was created (creation happens at start, before any
trial), so the study ends with one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evolve.tracking.store import filter_literal
from evolve.tracking.study_records import KIND_TUNING, TAG_STUDY
from evolve.tracking.tags import PARENT_RUN_TAG, TAG_CONFIG_HASH, TAG_KIND

# Writes to a parent that another worker deleted meanwhile: look again, write again. Each
# retry follows a deletion, and a worker deletes at most the one parent it created.
_PARENT_ATTEMPTS = 4


class SharedParentRun:
    """The study's parent run as one worker sees it: found by the tags that identify it,
    created when there is none, and given up for an earlier one another worker created."""

    def __init__(
        self,
        client: Any,
        experiment_id: str,
        *,
        study_name: str,
        config_hash: str,
        worker_tags: dict[str, str],
    ) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.study_name = study_name
        self.config_hash = config_hash
        # Tags each worker writes to whichever run it ends up using: the parent may have been
        # created by another worker, with another run directory or trial count.
        self.worker_tags = worker_tags
        self.run_id: str | None = None
        self._created: str | None = None  # the parent run this worker created, if any
        self._children: list[str] = []  # every trial run this worker created

    def identity_tags(self) -> dict[str, str]:
        """The tags every worker of the study looks the parent up by."""
        return {
            TAG_KIND: KIND_TUNING,
            TAG_STUDY: self.study_name,
            TAG_CONFIG_HASH: self.config_hash,
        }

    def join_or_create(
        self,
        *,
        run_name: str,
        description_tags: Callable[[], dict[str, str]],
        params: Callable[[], dict[str, str]],
    ) -> None:
        """Use the study's earliest parent run (marked RUNNING again), or create one named
        `run_name` with `description_tags()` besides the identity tags and `params()` when
        there is none. Both are called only when creating: the tags read git."""
        from mlflow.entities import Param

        existing = self._parents()
        if existing:
            self.run_id = existing[0].info.run_id
            self._on_earliest(lambda run_id: self.client.update_run(run_id, status="RUNNING"))
        else:
            run = self.client.create_run(
                self.experiment_id,
                run_name=run_name,
                tags={**description_tags(), **self.identity_tags()},
            )
            own = run.info.run_id
            # Params before the check: whichever run stays the parent has them.
            self.client.log_batch(own, params=[Param(k, v) for k, v in params().items()])
            self._created = self.run_id = own
        self._on_earliest(self._write_worker_tags)

    def record_child(self, run_id: str) -> None:
        """A trial run this worker created: it moves along if the parent changes."""
        self._children.append(run_id)

    def adopt_earliest(self) -> None:
        """Look again for an earlier parent (another worker's, stored late) and move there."""
        self._on_earliest()

    def write(self, write: Callable[[str], object]) -> None:
        """`write(run_id)` to the earliest parent, following it if it changes meanwhile."""
        self._on_earliest(write)

    def _on_earliest(self, write: Callable[[str], object] | None = None) -> None:
        """Adopt the earliest parent run, then `write(run_id)`. Between a lookup and a write
        the parent can be deleted: the worker that created it found an earlier one (see the
        module docstring). Then look again and write to that one; a deleted parent is the
        only error retried."""
        from mlflow.exceptions import MlflowException

        for attempt in range(_PARENT_ATTEMPTS):
            try:
                self._adopt_earliest_parent()
                if write is not None:
                    write(str(self.run_id))
                return
            except MlflowException:
                if attempt + 1 == _PARENT_ATTEMPTS or not self._parent_deleted():
                    raise

    def _parent_deleted(self) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(self.run_id)
        except MlflowException:
            return False
        return run.info.lifecycle_stage == "deleted"

    def _write_worker_tags(self, run_id: str) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(
            run_id, tags=[RunTag(name, value) for name, value in self.worker_tags.items()]
        )

    def _adopt_earliest_parent(self) -> None:
        """Make the earliest parent run of the study ours; if this worker created a later one
        (workers starting together), move its trial runs to the earliest and delete it."""
        parents = self._parents()
        if not parents or parents[0].info.run_id == self.run_id:
            return
        earliest = parents[0].info.run_id
        for child in self._children:
            self.client.set_tag(child, PARENT_RUN_TAG, earliest)
        if self._created == self.run_id:
            self.client.delete_run(self._created)
            self._created = None
        self.run_id = earliest
        self._write_worker_tags(earliest)

    def _parents(self) -> list[Any]:
        """The study's parent runs, earliest first (start time, then run id)."""
        identity = self.identity_tags().items()
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=" and ".join(f"tags.`{k}` = {filter_literal(v)}" for k, v in identity),
        )
        return sorted(runs, key=lambda run: (run.info.start_time, run.info.run_id))
