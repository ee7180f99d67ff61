"""What one evaluation shares with its units: the options, the context, the unit files.

`RunOptions` holds the optional parts of an evaluation (replay directory, callbacks, progress,
upper bound, stop event, policy schedule, shared call slots). `RunContext` is the read-only
context every unit sees; `UnitFiles` is the only way a unit reads or writes its files, so the
simulation core does no I/O of its own (`run_dir.RunLayout` keeps them in the run directory; a
test may hand in one that keeps everything in memory).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, runtime_checkable
from typing import Protocol as TypingProtocol

from evolve.core.errors import Interrupted
from evolve.llm.usage import Usage
from evolve.simulator.evaluation.episode import EpisodeConfig
from evolve.simulator.records import PeriodResult, SessionTranscript
from evolve.simulator.user import SimulatedUser

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import EnvironmentItem
    from evolve.simulator.metrics import MetricSummary
    from evolve.simulator.upper_bound_table import UpperBoundTable
    from memory_policies.base import MemoryPolicy


@runtime_checkable
class PolicySchedule(TypingProtocol):
    """Which policy plays a user in a period (e.g. one evolving chain per user).

    `policy_for` is called once per unit, before the unit starts; it must return the same
    policy for a (user, period) on every call, including after a resume, and it may depend
    on what `on_period_end` saw for earlier periods (periods are barriers). `identity()`
    declares the schedule in the run's identity: a JSON-ready description that does not
    change while the schedule evolves (e.g. its kind, the base policy, the feedback kind).
    """

    def policy_for(self, user_id: str, period_index: int) -> MemoryPolicy: ...

    def identity(self) -> dict[str, Any]: ...


class ProgressSink:
    """Progress events from the runner; every hook is optional (the CLI draws tqdm bars).

    Hooks may be called from worker threads; implementations must be thread-safe.
    """

    def run_started(self, *, users: int, periods: int, finished_units: int) -> None:
        """`finished_units` user-periods were already on disk (a resumed run)."""

    def kept_failed_units(self, *, units: int, answers: int, run_dir: Path) -> None:
        """A resumed run kept `units` finished user-periods of an earlier invocation holding
        `answers` answers that failed to parse (e.g. from a broken endpoint); they are not
        asked again unless their files under `run_dir` are deleted."""

    def unit_finished(self, user_id: str, period_index: int, *, resumed: bool) -> None:
        """A user-period is done (`resumed`: loaded from disk, no LLM call)."""

    def unit_started(self, user_id: str, period_index: int) -> None:
        """A user-period starts playing (never called for one loaded from disk)."""

    def unit_result(self, result: PeriodResult) -> None:
        """A user-period played and stored: its sessions, the memory at its checkpoint, the
        answers and probes (called just before `unit_finished`; e.g. to record traces)."""

    def llm_calls(self, total: int) -> None:
        """Running total of LM calls made through the run's RoleLMs (all roles)."""

    def period_finished(self, period_index: int, summary: MetricSummary) -> None:
        """Every user finished `period_index`; `summary` covers all periods so far."""


class UnitFiles(TypingProtocol):
    """Where units keep their transcripts, checkpoints and results (`run_dir.RunLayout`
    in the run directory). A unit's usage is stored with its transcript and its result."""

    def load_period_result(self, user_dir_name: str, period_index: int) -> PeriodResult | None: ...

    def save_period_result(self, user_dir_name: str, result: PeriodResult) -> None: ...

    def load_transcript(
        self, user_dir_name: str, period_index: int
    ) -> tuple[list[SessionTranscript], Usage] | None: ...

    def save_transcript(
        self,
        user_dir_name: str,
        period_index: int,
        sessions: Sequence[SessionTranscript],
        usage: Usage,
    ) -> None: ...

    def load_checkpoint(self, user_dir_name: str, period_index: int) -> str | None: ...

    def save_checkpoint(self, user_dir_name: str, period_index: int, state_json: str) -> None: ...

    def checkpoint_file(self, user_dir_name: str, period_index: int) -> Path:
        """Where the checkpoint is (named in error messages)."""
        ...

    def period_dir(self, user_dir_name: str, period_index: int) -> Path:
        """Where the unit's files are (named in error messages)."""
        ...

    def set_aside(self, user_dir_name: str, from_period: int) -> list[Path]:
        """Move a damaged unit and the user's later units away, to be recomputed."""
        ...


@dataclass(frozen=True)
class RunOptions:
    """The optional parts of an evaluation (see `run_evaluation`)."""

    # Replay the transcripts recorded there through `observe` instead of playing sessions.
    off_policy_dir: Path | None = None
    # Called at each period barrier with the summary so far (it may raise to prune).
    on_period_end: Callable[[int, MetricSummary], None] | None = None
    progress: ProgressSink | None = None
    # Without it the memory score is None (see `metrics`).
    upper_bound: UpperBoundTable | None = None
    # Once set, no new unit or LLM call starts.
    stop: threading.Event | None = None
    # Which policy plays each user-period (default: the evaluated policy everywhere).
    policy_schedule: PolicySchedule | None = None
    # Bounds the LM calls in flight across evaluations running at once.
    call_slots: threading.Semaphore | None = None


@dataclass
class UserRun:
    """One user of an evaluation: its item, its directory name and its finished periods."""

    item: EnvironmentItem
    dir_name: str
    results: list[PeriodResult]


class RunContext:
    """Shared, read-only context of one evaluation (plus a lock for progress ticks)."""

    def __init__(
        self,
        policy: MemoryPolicy,
        lms: RoleLMs,
        files: UnitFiles,
        config: EpisodeConfig,
        options: RunOptions,
    ):
        self.policy = policy
        self.policy_schedule = options.policy_schedule
        self.lms = lms
        self.files = files
        self.config = config
        self.off_policy_dir = (
            Path(options.off_policy_dir) if options.off_policy_dir is not None else None
        )
        self.progress = options.progress or ProgressSink()
        self.upper_bound = options.upper_bound
        self.simulated_user = SimulatedUser()
        self._lock = threading.Lock()
        # `concurrency` bounds the LM calls in flight, whoever makes them: sessions of
        # different users, and the read-only questions of one unit, which fan out. A caller
        # running several evaluations at once passes one semaphore to all of them, so the
        # limit holds across them (a server is never sent more than it was sized for).
        self._slots = options.call_slots or threading.BoundedSemaphore(config.concurrency)
        self.question_pool: ThreadPoolExecutor | None = None
        # Set when the evaluation fails or is interrupted: no unit or LLM call starts after.
        self.cancelled = threading.Event()
        self._stop = options.stop

    def check_stop(self) -> None:
        """Raise `Interrupted` once the caller asked to stop or the evaluation is failing."""
        if self.cancelled.is_set() or (self._stop is not None and self._stop.is_set()):
            raise Interrupted(
                "evaluation stopped on request; finished user-periods are saved and a rerun resumes"
            )

    def for_unit(self, user_id: str, period_index: int) -> RunContext:
        """This run as seen by one unit: the scheduled policy in place of the base one (the
        copy shares the lock, the slots, the pools and the cancellation event)."""
        if self.policy_schedule is None:
            return self
        unit = copy.copy(self)
        unit.policy = self.policy_schedule.policy_for(user_id, period_index)
        return unit

    def tick(self) -> None:
        total = self.lms.usage.snapshot().total_calls
        with self._lock:
            self.progress.llm_calls(total)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Held for the duration of one policy or simulator call."""
        self.check_stop()
        with self._slots:
            self.check_stop()  # the wait for a slot may have been long
            yield
        self.tick()

    def map(self, tasks: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run independent tasks, concurrently when allowed; results in task order."""
        if self.question_pool is None or len(tasks) <= 1:
            return [task() for task in tasks]
        # Each task sees the unit's context variables (e.g. which episode a trace records).
        submitted = [self.question_pool.submit(contextvars.copy_context().run, t) for t in tasks]
        return [future.result() for future in submitted]
