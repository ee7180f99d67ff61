"""The loop's view of tracking: what a tracker is told about the experiment, and the hooks
it is called through (no-ops here; `MLflowTracker` logs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evolve.llm.usage import Usage
    from evolve.results.records import CandidateRecord, ExperimentResult, GenerationRecord
    from evolve.simulator.evaluation import ProgressSink
    from evolve.spec.config import ExperimentSpec
    from evolve.stores.tracking_uri import TrackingLocation


@dataclass(frozen=True)
class TrackingContext:
    """What a tracker needs to know about the experiment it tracks."""

    name: str
    config_hash: str
    spec: ExperimentSpec
    run_dir: Path
    model_names: dict[str, str]
    environment: str
    train_users: list[str] = field(default_factory=list)
    heldout_users: list[str] = field(default_factory=list)
    registered_model: str | None = None


class ExperimentTracker:
    """The loop's view of tracking; every hook is a no-op here (see `MLflowTracker`)."""

    # Where runs are logged and why there (printed at start); None when tracking is off.
    location: TrackingLocation | None = None
    # The MLflow experiment's id once started (the UI's address names it).
    experiment_id: str | None = None

    def start(self, context: TrackingContext) -> None:
        """The experiment starts or resumes."""

    def log_candidate(
        self,
        record: CandidateRecord,
        *,
        split: str,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        """`record` was evaluated on `split` ("train" or "heldout")."""

    def log_proposal(
        self,
        record: CandidateRecord,
        *,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
        reason: str | None = None,
        evaluation_dir: Path | None = None,
        scores: dict[str, float] | None = None,
    ) -> None:
        """A proposal was made: accepted (it will be evaluated), rejected, invalid or a
        duplicate (`record.status`), with the `reason` when one is known. A proposal that is
        never evaluated on every train user is complete here: `evaluation_dir` holds what was
        played of it (GEPA's minibatch), `scores` what that scored (e.g. `minibatch_score`)."""

    def log_generation(self, record: GenerationRecord, *, spent: Usage) -> None:
        """A generation finished."""

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        record: CandidateRecord | None = None,
        fingerprint: str | None = None,
    ) -> ProgressSink | None:
        """The runner's progress sink for an evaluation on `split` ("train" or "heldout") of
        `record` (or of a policy known by `fingerprint` only, e.g. inside GEPA): `inner` (the
        CLI's progress), or a sink that forwards to it and records traces."""
        return inner

    def finish(self, result: ExperimentResult, *, report: str = "") -> None:
        """The invocation ended (complete, or stopped on the budget).

        `report` is the compare table and lineage as text, formatted by the engine (tracking
        depends on the records only, never on the engine's modules).
        """

    def fail(self) -> None:
        """The invocation was interrupted by an error or Ctrl-C."""


class NullTracker(ExperimentTracker):
    """Tracking disabled."""
