"""Progress events of an evolution run: every hook is optional (the CLI draws tqdm bars)."""

from __future__ import annotations

from evolve.results.records import CandidateRecord
from evolve.simulator.evaluation import ProgressSink


class LoopProgress:
    """Progress events of the loop; every hook is optional (the CLI draws tqdm bars)."""

    def stage(self, text: str) -> None:
        """A preparatory step started (e.g. computing the upper bound)."""

    def stage_step(self, text: str, done: int) -> None:
        """The stage under way made `done` steps so far (e.g. upper-bound answers): for a
        progress line where no bar shows the work (called from worker threads)."""

    def generation_started(self, generation: int, total: int) -> None:
        """`total` is the number of generations (periods for the per_period schedule)."""

    def candidate_proposed(self, record: CandidateRecord) -> None:
        """A candidate was proposed (or loaded from disk), possibly a duplicate/invalid."""

    def evaluation_started(self, record: CandidateRecord, split: str) -> ProgressSink | None:
        """An evaluation starts; the returned sink receives the runner's events."""
        return None

    def unrecorded_evaluation_started(self, label: str) -> ProgressSink | None:
        """An evaluation of a policy that has no record yet starts (GEPA scores a proposal
        before the toolkit stores it); `label` names it."""
        return None

    def evaluation_finished(self, record: CandidateRecord, split: str) -> None:
        """The evaluation is stored (`record` carries its scores)."""
