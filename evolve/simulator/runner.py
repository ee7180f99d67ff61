"""The episode runner: sessions, checkpoint, questions and diagnosis probes, per user-period.

Why one module: the per-unit order (sessions, checkpoint, questions, probes) and its resume
rules are one invariant (the next period starts from the checkpoint on disk); the scheduling
and the unit are kept together so that the invariant is visible. Next split candidate: the
probes (both protocols) into their own module.

For each period the runner plays the period's sessions (policy <-> simulated user, or a replay
of recorded transcripts in off-policy mode), checkpoints the policy's memory, asks every
question as multiple choice and probes what the memory recalls: under protocol "evolve" the
current value of every variable the questions need (each variable once per period; with
probes = "wrong_only" only those of wrongly answered questions), under "paper" one structured
probe per question over its required variables, as the reference code does. Both diagnoses
(ours and the original's, see `metrics`) are derived from whichever probe ran. It talks to
the policy only through the `memory_policies` interface, and evaluation never changes the
memory carried to the next period: the next period always starts from the checkpoint on disk.

Users are independent and run concurrently. With an `on_period_end` callback periods form
barriers: after period p is done for every user, `on_period_end(p, summary)` is called before
period p+1 starts, so a tuner can prune there (the callback may raise; everything finished so
far stays on disk). Without one, each user runs all its periods back to back (no waiting for
the slowest user of each period); results are identical either way.

Per-user policies: with a `policy_schedule` (see `PolicySchedule`) each user-period is played
and questioned with the policy the schedule returns for it; the policy may change only at
period barriers (the schedule's identity is part of the run's, so a resumed run must declare
the same schedule). The paper's per-user evolution chains use it.

Resumption: a user-period whose `result.json` exists is loaded, not recomputed; one whose
transcript and checkpoint exist but whose questions were interrupted skips its sessions.
A hash of the resolved configuration guards the directory (see `storage.RunLayout.open_run`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, runtime_checkable
from typing import Protocol as TypingProtocol

import dspy
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.errors import EnvironmentDataError, Interrupted
from evolve.protocol import Protocol
from evolve.simulator.baselines import UpperBoundTable, random_score
from evolve.simulator.metrics import (
    MetricSummary,
    Recall,
    check_variables,
    diagnose,
    summarize,
    summarize_by_period,
    summarize_by_user,
    summarize_periods,
)
from evolve.simulator.records import (
    CallUsage,
    ItemResult,
    PeriodResult,
    ProbeResult,
    QuestionProbeResult,
    SessionTranscript,
    TranscriptMessage,
    UserResult,
    VariableRecall,
)
from evolve.simulator.storage import (
    RunLayout,
    atomic_write_json,
    canonical_json,
    export_original_layout,
    read_json,
    safe_name,
)
from evolve.simulator.user import (
    PaperUserView,
    SimulatedUser,
    derive_seed,
    format_persona,
    opening_message,
    play_session,
)

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import Environment, EnvironmentItem
    from memory_policies.base import MemoryPolicy, MemoryState

# Appended to every question, as the original prompt asks for the answer fitting the user's
# *current* situation (not whichever the conversation mentioned first).
QUESTION_HINT = "(Choose the option that fits my current situation and preferences.)"

ProbeScope = Literal["all", "wrong_only"]


def probe_scope_problem(protocol: Protocol, probes: ProbeScope) -> str | None:
    """Why a probe scope cannot be used under a protocol (None when it can)."""
    if protocol == "paper" and probes == "wrong_only":
        return (
            "probes = 'wrong_only' is refused under protocol 'paper': the original's diagnosis "
            "probes every question whether answered right or not; use probes = 'all' or "
            "protocol = 'evolve'"
        )
    return None


class EpisodeConfig(BaseModel):
    """How episodes are played. `concurrency` changes speed only, never results."""

    model_config = ConfigDict(extra="forbid")

    protocol: Protocol = Field(
        default="evolve", description="Information flow: 'paper' (the reference code's) or ours."
    )
    rounds_initial: int = Field(default=1, ge=1, description="Rounds per session in period 0.")
    rounds_update: int = Field(default=1, ge=1, description="Rounds per session afterwards.")
    concurrency: int = Field(default=4, ge=1, description="Users evaluated at the same time.")
    seed: int = 0
    max_users: int | None = Field(default=None, ge=1, description="First N users only.")
    probes: ProbeScope = Field(
        default="all",
        description="wrong_only (evolve only): probe only the variables of wrongly answered "
        "items. A variable not probed at its last write period then counts as not recalled.",
    )

    @model_validator(mode="after")
    def _probes_for_protocol(self) -> EpisodeConfig:
        problem = probe_scope_problem(self.protocol, self.probes)
        if problem:
            raise ValueError(problem)
        return self

    def rounds_for(self, period_index: int) -> int:
        return self.rounds_initial if period_index == 0 else self.rounds_update

    def identity(self) -> dict[str, Any]:
        """The settings that determine results (what the config hash covers)."""
        return self.model_dump(exclude={"concurrency"})


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


class EvaluationReport(BaseModel):
    run_dir: Path
    config_hash: str
    protocol: Protocol = Field(
        default="evolve", description="The information flow that produced these results."
    )
    policy: dict[str, Any] = Field(default_factory=dict)
    users: list[UserResult]
    summary: MetricSummary
    per_user: dict[str, MetricSummary]
    per_period: list[MetricSummary]
    usage: dict[str, Any] = Field(
        default_factory=dict, description="UsageSummary of this invocation (all roles)."
    )
    wall_time_s: float
    complete: bool = True
    max_tokens: dict[str, int | None] = Field(
        default_factory=dict,
        description="Completion limit used per role (simulator, agent): under the paper "
        "protocol the reference's 8192 unless the user set one.",
    )

    def without_records(self) -> dict[str, Any]:
        """JSON-ready report minus the per-item records (those live in the unit files)."""
        return self.model_dump(mode="json", exclude={"users"})


@dataclass
class _User:
    item: EnvironmentItem
    dir_name: str
    results: list[PeriodResult]


class _Run:
    """Shared, read-only context of one evaluation (plus a lock for progress ticks)."""

    def __init__(
        self,
        env_hash: str,
        policy: MemoryPolicy,
        lms: RoleLMs,
        layout: RunLayout,
        config: EpisodeConfig,
        off_policy_dir: Path | None,
        progress: ProgressSink,
        upper_bound: UpperBoundTable | None,
        stop: threading.Event | None = None,
        policy_schedule: PolicySchedule | None = None,
        call_slots: threading.Semaphore | None = None,
    ):
        self.env_hash = env_hash
        self.policy = policy
        self.policy_schedule = policy_schedule
        self.lms = lms
        self.layout = layout
        self.config = config
        self.off_policy_dir = off_policy_dir
        self.progress = progress
        self.upper_bound = upper_bound
        self.simulated_user = SimulatedUser()
        self._lock = threading.Lock()
        # `concurrency` bounds the LM calls in flight, whoever makes them: sessions of
        # different users, and the read-only questions of one unit, which fan out. A caller
        # running several evaluations at once passes one semaphore to all of them, so the
        # limit holds across them (a server is never sent more than it was sized for).
        self._slots = call_slots or threading.BoundedSemaphore(config.concurrency)
        self.question_pool: ThreadPoolExecutor | None = None
        # Set when the evaluation fails or is interrupted: no unit or LLM call starts after.
        self.cancelled = threading.Event()
        self._stop = stop

    def check_stop(self) -> None:
        """Raise `Interrupted` once the caller asked to stop or the evaluation is failing."""
        if self.cancelled.is_set() or (self._stop is not None and self._stop.is_set()):
            raise Interrupted(
                "evaluation stopped on request; finished user-periods are saved and a rerun resumes"
            )

    def for_unit(self, user_id: str, period_index: int) -> _Run:
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
        return [future.result() for future in [self.question_pool.submit(t) for t in tasks]]


def run_evaluation(
    env: Environment,
    policy: MemoryPolicy,
    lms: RoleLMs,
    run_dir: Path,
    config: EpisodeConfig,
    *,
    off_policy_dir: Path | None = None,
    on_period_end: Callable[[int, MetricSummary], None] | None = None,
    progress: ProgressSink | None = None,
    upper_bound: UpperBoundTable | None = None,
    stop: threading.Event | None = None,
    policy_schedule: PolicySchedule | None = None,
    call_slots: threading.Semaphore | None = None,
) -> EvaluationReport:
    """Evaluate `policy` on `env`, storing everything under `run_dir`; resumes by default.

    With `policy_schedule`, `policy` is the base (its kind and memory format) and each
    user-period runs with `policy_schedule.policy_for(user, period)`; pass `on_period_end`
    to change the schedule between periods.

    `call_slots` bounds the LM calls in flight instead of a semaphore of `concurrency`
    slots of this evaluation's own: pass one to evaluations that run at the same time.

    Without `upper_bound` the memory score is None (see `metrics`); pass the table from
    `baselines.compute_upper_bound`, which is cached per environment and agent model.

    Stopping: once `stop` is set (e.g. by a signal handler of the caller), or when the calling
    thread is interrupted (`KeyboardInterrupt`), no new unit or LLM call starts, queued work
    is cancelled and calls in flight are not waited for; `Interrupted` (or the interrupt) is
    raised and a rerun resumes from the finished units.
    """
    started = time.perf_counter()
    usage_start = lms.usage.snapshot()
    progress = progress or ProgressSink()
    layout = RunLayout(Path(run_dir))
    items = list(env.items[: config.max_users] if config.max_users else env.items)
    users = _assign_dir_names(items)
    off_dir = Path(off_policy_dir) if off_policy_dir is not None else None
    env_hash = env.content_hash()
    resolved = _resolved_for(policy, env_hash, users, config, lms, off_dir)
    if policy_schedule is not None:
        resolved["policy_schedule"] = policy_schedule.identity()
    digest = layout.open_run(resolved)
    if not layout.environment_file.exists():
        atomic_write_json(layout.environment_file, [item.to_original() for item in items])
    if upper_bound is not None:
        missing = _missing_upper_bound_entries(upper_bound, items)
        if missing:
            raise EnvironmentDataError(
                f"the upper-bound table (environment {upper_bound.environment_hash[:12]}, model "
                f"{upper_bound.agent_model}) has no entry for {len(missing)} question variant(s) "
                f"of this environment, e.g. {missing[0]}; compute it with "
                "compute_upper_bound(env, lms, cache_dir) for the environment evaluated"
            )
        atomic_write_json(layout.upper_bound_file, upper_bound.model_dump(mode="json"))

    finished = 0
    for user in users:
        for period_index in range(len(user.item.periods)):
            stored = layout.load_period_result(user.dir_name, period_index)
            if stored is None:
                break
            user.results.append(stored)
            finished += 1
    period_count = max((len(user.item.periods) for user in users), default=0)
    progress.run_started(users=len(users), periods=period_count, finished_units=finished)
    run = _Run(
        env_hash,
        policy,
        lms,
        layout,
        config,
        off_dir,
        progress,
        upper_bound,
        stop,
        policy_schedule,
        call_slots,
    )

    def report(complete: bool) -> EvaluationReport:
        user_results = [UserResult(user_id=u.item.id, periods=list(u.results)) for u in users]
        result = EvaluationReport(
            run_dir=layout.root,
            config_hash=digest,
            protocol=config.protocol,
            policy={
                "kind": policy.kind,
                "preset": policy.preset,
                "parameters": policy.parameters(),
            },
            users=user_results,
            summary=summarize(user_results, upper_bound),
            per_user=summarize_by_user(user_results, upper_bound),
            per_period=summarize_by_period(user_results, upper_bound),
            usage=lms.usage.snapshot().minus(usage_start).model_dump(mode="json"),
            wall_time_s=time.perf_counter() - started,
            complete=complete,
            max_tokens={role: lms.identity(role).get("max_tokens") for role in EPISODE_ROLES},
        )
        atomic_write_json(layout.report_file, result.without_records())
        export_original_layout(
            layout, user_results, {u.item.id: u.dir_name for u in users}, upper_bound
        )
        return result

    if config.concurrency > 1:
        run.question_pool = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="evolve-questions"
        )
    latest: EvaluationReport | None = None
    failed = False
    try:
        if on_period_end is None and config.concurrency > 1:
            _run_pipelined(run, users, period_count, upper_bound)
        else:
            for period_index in range(period_count):
                todo = [u for u in users if len(u.item.periods) > period_index]
                for user in todo:
                    if len(user.results) > period_index:
                        progress.unit_finished(user.item.id, period_index, resumed=True)
                pending = [u for u in todo if len(u.results) <= period_index]
                _run_units(run, pending, period_index)
                last = period_index == period_count - 1
                if on_period_end is not None or last:
                    # Written at every barrier a callback sees: a pruned run leaves a report.
                    latest = report(complete=last)
                # Periods up to this one only: a resumed run has later ones on disk already,
                # and a pruner must see the value an uninterrupted run reports here.
                summary = summarize(
                    [
                        UserResult(user_id=u.item.id, periods=u.results[: period_index + 1])
                        for u in users
                    ],
                    upper_bound,
                )
                progress.period_finished(period_index, summary)
                if on_period_end is not None:
                    on_period_end(period_index, summary)
    except BaseException:
        failed = True
        run.cancelled.set()
        with contextlib.suppress(Exception):  # best effort: the unit files are the truth
            report(complete=False)
        raise
    finally:
        if run.question_pool is not None:
            # After a failure, calls in flight are not waited for (they may hang).
            run.question_pool.shutdown(wait=not failed, cancel_futures=True)
    return latest if latest is not None and latest.complete else report(complete=True)


# The roles an evaluation calls (the reflector plays no part in one).
EPISODE_ROLES = ("simulator", "agent")


def check_resumable(
    env: Environment,
    policy: MemoryPolicy,
    lms: RoleLMs,
    run_dir: Path,
    config: EpisodeConfig,
    *,
    off_policy_dir: Path | None = None,
    policy_schedule: PolicySchedule | None = None,
) -> None:
    """Refuse now, before any LLM call (the upper bound included), to resume a run directory
    made with another environment, policy, episode settings or model.

    Raises ResumeMismatchError naming each difference; writes nothing. `run_evaluation`
    makes the same check (and creates the header of a new run).
    """
    layout = RunLayout(Path(run_dir))
    if not layout.run_file.exists():
        return
    items = list(env.items[: config.max_users] if config.max_users else env.items)
    users = _assign_dir_names(items)
    off_dir = Path(off_policy_dir) if off_policy_dir is not None else None
    resolved = _resolved_for(policy, env.content_hash(), users, config, lms, off_dir)
    if policy_schedule is not None:
        resolved["policy_schedule"] = policy_schedule.identity()
    layout.open_run(resolved)


def _resolved_for(
    policy: MemoryPolicy,
    env_hash: str,
    users: Sequence[_User],
    config: EpisodeConfig,
    lms: RoleLMs,
    off_dir: Path | None,
) -> dict[str, Any]:
    off_policy_hash = _recorded_transcripts_hash(off_dir, users) if off_dir else None
    return resolved_config(policy, env_hash, users, config, lms, off_policy_hash)


def _missing_upper_bound_entries(
    table: UpperBoundTable, items: Sequence[EnvironmentItem]
) -> list[str]:
    """Keys the evaluated users need but the table lacks (a table may cover a superset)."""
    return [
        table.key(item.id, qi, ci)
        for item in items
        for qi, qa in enumerate(item.qas)
        for ci in range(len(qa.answer_choices))
        if table.entry(item.id, qi, ci) is None
    ]


def resolved_config(
    policy: MemoryPolicy,
    env_hash: str,
    users: Sequence[_User],
    config: EpisodeConfig,
    lms: RoleLMs,
    off_policy_hash: str | None,
) -> dict[str, Any]:
    """What the results depend on; its hash guards resumption.

    Model names cover the two roles an evaluation uses (the reflector plays no part here).
    """
    models = lms.model_names()
    return {
        # kind, preset, parameters, instructions and embedder name
        "policy": policy.identity(),
        "environment": env_hash,
        "users": [user.item.id for user in users],
        "episode": config.identity(),
        "models": {role: models.get(role) for role in ("simulator", "agent")},
        "off_policy_transcripts": off_policy_hash,
    }


def _assign_dir_names(items: Sequence[EnvironmentItem]) -> list[_User]:
    users: list[_User] = []
    taken: set[str] = set()
    for index, item in enumerate(items):
        name = safe_name(str(item.id))
        if name in taken:
            name = f"{name}_{index}"
        taken.add(name)
        users.append(_User(item=item, dir_name=name, results=[]))
    return users


def _run_units(run: _Run, users: Sequence[_User], period_index: int) -> None:
    """One period for many users; the first failure stops the rest and is re-raised."""
    if not users:
        return
    if run.config.concurrency <= 1 or len(users) == 1:
        for user in users:
            _finish_unit(run, user, period_index)
        return
    with _unit_pool(run, len(users)) as pool:
        futures = [pool.submit(_finish_unit, run, user, period_index) for user in users]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]


def _run_pipelined(
    run: _Run, users: Sequence[_User], period_count: int, upper_bound: UpperBoundTable | None
) -> None:
    """Every user runs all its periods in order, with no barrier between periods.

    Used when nobody needs to act between periods (no `on_period_end`): a period no longer
    waits for its slowest user, so workers stay busy. Results are the same as with barriers,
    since users are independent; `period_finished` fires once every user is past a period.
    """
    lock = threading.Lock()
    remaining = [sum(len(u.item.periods) > index for u in users) for index in range(period_count)]

    def period_done(index: int) -> None:
        with lock:
            remaining[index] -= 1
            if remaining[index]:
                return
            periods = [p for u in users for p in list(u.results) if p.period_index <= index]
            # Under the lock: periods are reported in order.
            run.progress.period_finished(index, summarize_periods(periods, upper_bound))

    def run_user(user: _User) -> None:
        for index in range(len(user.item.periods)):
            if len(user.results) > index:
                run.progress.unit_finished(user.item.id, index, resumed=True)
            else:
                _finish_unit(run, user, index)
            period_done(index)

    with _unit_pool(run, len(users)) as pool:
        futures = [pool.submit(run_user, user) for user in users]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]


@contextlib.contextmanager
def _unit_pool(run: _Run, users: int) -> Iterator[ThreadPoolExecutor]:
    """A pool for the units of many users whose shutdown never waits after a failure.

    `ThreadPoolExecutor`'s own `with` waits for every queued unit on the way out, even after
    Ctrl-C; here a failure (or `KeyboardInterrupt` in the waiting thread) cancels what has
    not started, stops new LLM calls (`run.cancelled`: a worker raises `Interrupted` at its
    next call) and returns without waiting for calls in flight, which may hang.
    """
    pool = ThreadPoolExecutor(
        max_workers=min(run.config.concurrency, users), thread_name_prefix="evolve-units"
    )
    try:
        yield pool
    except BaseException:
        run.cancelled.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _finish_unit(run: _Run, user: _User, period_index: int) -> None:
    run.check_stop()
    run.progress.unit_started(user.item.id, period_index)
    result = run_unit(run.for_unit(user.item.id, period_index), user, period_index)
    run.layout.save_period_result(user.dir_name, result)
    user.results.append(result)
    run.progress.unit_result(result)
    run.progress.unit_finished(user.item.id, period_index, resumed=False)


def run_unit(run: _Run, user: _User, period_index: int) -> PeriodResult:
    """Sessions, checkpoint, questions and probes for one user in one period."""
    started = time.perf_counter()
    item, layout, policy = user.item, run.layout, run.policy
    period = item.periods[period_index]
    if period_index == 0:
        # The schema is for policies that remember the user's own variables (the oracle).
        state_in = policy.initial_state(state_schema=item.state_schema)
    else:
        previous = layout.load_checkpoint(user.dir_name, period_index - 1)
        if previous is None:
            raise EnvironmentDataError(
                f"{layout.checkpoint_file(user.dir_name, period_index - 1)} is missing although "
                f"period {period_index - 1} is marked finished; delete "
                f"{layout.period_dir(user.dir_name, period_index - 1)} to recompute it"
            )
        state_in = policy.state_from_json(previous)

    stored = layout.load_transcript(user.dir_name, period_index)
    checkpoint = layout.load_checkpoint(user.dir_name, period_index)
    if stored is not None and checkpoint is not None:
        # Interrupted after the sessions: they cost nothing now, their usage was recorded.
        sessions, session_usage = stored
    else:
        with dspy.track_usage() as tracker:
            if run.off_policy_dir is not None:
                sessions, state = _replay_period(run, user, period_index, state_in)
            else:
                sessions, state = _play_period(run, user, period_index, state_in)
        session_usage = _tracked_usage(tracker)
        layout.save_transcript(user.dir_name, period_index, sessions, session_usage)
        checkpoint = state.model_dump_json()
        layout.save_checkpoint(user.dir_name, period_index, checkpoint)
    # Continue from exactly what was stored, as a resumed run would.
    state = policy.state_from_json(checkpoint)

    # Questions and probes are read-only: each gets its own copy of the checkpoint and they
    # run concurrently; a copy that comes back changed flags the policy (the copies are
    # discarded, so no question can see another's mutation and the next period starts from
    # the checkpoint on disk). Only wrong_only must wait for the answers before probing.
    questions = [
        functools.partial(_answer_question, run, item, qi, checkpoint)
        for qi in range(len(item.qas))
    ]
    probes: list[ProbeResult] = []
    question_probes: list[QuestionProbeResult] = []
    if run.config.protocol == "paper":
        tasks = questions + [
            functools.partial(_probe_question, run, item, period_index, qi, checkpoint)
            for qi in range(len(item.qas))
        ]
        outcomes = run.map(tasks)
        answers = [answer for answer, _, _ in outcomes[: len(questions)]]
        question_probes = [probe for probe, _, _ in outcomes[len(questions) :]]
    elif run.config.probes == "wrong_only":
        answered = run.map(questions)
        answers = [answer for answer, _, _ in answered]
        wrong = [
            qa
            for qi, (qa, answer) in enumerate(zip(item.qas, answers, strict=True))
            if not _answered_correctly(item, period_index, qi, answer)
        ]
        variables = list(dict.fromkeys(v for qa in wrong for v in qa.required_info))
        probed = run.map(
            [
                functools.partial(_probe_variable, run, item, period_index, v, checkpoint)
                for v in variables
            ]
        )
        probes = [probe for probe, _, _ in probed]
        outcomes = answered + probed
    else:
        variables = required_variables(item)
        tasks = [
            functools.partial(_probe_variable, run, item, period_index, v, checkpoint)
            for v in variables
        ]
        outcomes = run.map(tasks + questions)
        probes = [probe for probe, _, _ in outcomes[: len(variables)]]
        answers = [answer for answer, _, _ in outcomes[len(variables) :]]
    mutated = any(changed for _, changed, _ in outcomes)
    usage = session_usage
    for _, _, task_usage in outcomes:
        usage = usage.plus(task_usage)
    earlier_periods = list(user.results)
    items = [
        _item_result(
            run,
            item,
            period_index,
            qi,
            answer,
            [
                *(_recalls(p.probes, p.question_probes, qi) for p in earlier_periods),
                _recalls(probes, question_probes, qi),
            ],
        )
        for qi, answer in enumerate(answers)
    ]

    before = state_in.parse_failures
    after = policy.state_from_json(checkpoint).parse_failures
    policy_failures = {
        key: after.get(key, 0) - before.get(key, 0)
        for key in after
        if after.get(key, 0) - before.get(key, 0)
    }
    exposed: dict[str, str] = {}
    for session in period.sessions:
        exposed.update(session.exposed_values())
    return PeriodResult(
        user_id=item.id,
        period_index=period_index,
        period_start=str(period.period_start or ""),
        period_end=str(period.period_end or ""),
        state={k: str(v) for k, v in period.state.items()},
        state_updates={
            name: {"old": _opt_str(update.old), "new": _opt_str(update.new)}
            for name, update in (period.updates or {}).items()
        },
        exposed_states=exposed,
        sessions=sessions,
        off_policy=run.off_policy_dir is not None,
        memory_description=policy.describe_memory(state),
        items=items,
        probes=probes,
        question_probes=question_probes,
        probe_scope="all" if run.config.protocol == "paper" else run.config.probes,
        policy_parse_failures=policy_failures,
        evaluation_mutated_state=mutated,
        usage=usage,
        wall_time_s=time.perf_counter() - started,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _tracked_usage(tracker: Any) -> CallUsage:
    usage = CallUsage()
    for entries in tracker.usage_data.values():
        for entry in entries:
            prompt = entry.get("prompt_tokens", entry.get("input_tokens", 0)) or 0
            completion = entry.get("completion_tokens", entry.get("output_tokens", 0)) or 0
            usage = usage.plus(
                CallUsage(
                    llm_calls=1,
                    prompt_tokens=int(prompt) if isinstance(prompt, int | float) else 0,
                    completion_tokens=int(completion) if isinstance(completion, int | float) else 0,
                )
            )
    return usage


# ----- sessions --------------------------------------------------------------------------------


def _play_period(
    run: _Run, user: _User, period_index: int, state: MemoryState
) -> tuple[list[SessionTranscript], MemoryState]:
    item = user.item
    period = item.periods[period_index]
    persona = format_persona(item.profile_text())
    current = {k: str(v) for k, v in period.state.items()}
    # The reference user sees the full profile as of the start and the period's END date.
    paper_view = PaperUserView(
        profile=item.profile_text(),
        profile_date=str(item.start_time or ""),
        current_date=str(period.period_end or ""),
        state_schema=item.state_schema,
    )
    sessions = []
    for session_index, session in enumerate(period.sessions):
        transcript, state = play_session(
            policy=run.policy,
            state=state,
            user=run.simulated_user,
            lms=run.lms,
            session_index=session_index,
            session_time=str(session.session_time),
            query=session.query,
            exposed_states=session.exposed_values(),
            current_state=current,
            persona=persona,
            rounds=run.config.rounds_for(period_index),
            seed=derive_seed(run.config.seed, item.id, period_index),
            call_slot=run.slot,
            protocol=run.config.protocol,
            paper_view=paper_view,
        )
        sessions.append(transcript)
    return sessions, state


def recorded_sessions_path(off_dir: Path, user_id: str, dir_name: str, period_index: int) -> Path:
    """Where recorded transcripts of a user-period are looked for, first match wins:
    a run directory of this toolkit, its `original/` export, or the original code's output
    (`<dir>/<user id>/interactions/period_NN.json`)."""
    name = f"period_{period_index:02d}"
    candidates = [
        off_dir / "users" / dir_name / name / "transcript.json",
        off_dir / user_id / "interactions" / f"{name}.json",
        off_dir / dir_name / "interactions" / f"{name}.json",
        off_dir / "original" / dir_name / "interactions" / f"{name}.json",
    ]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    return candidates[1]


def load_recorded_sessions(
    off_dir: Path, user_id: str, dir_name: str, period_index: int
) -> list[list[dict[str, str]]]:
    """Recorded sessions of one user-period as lists of {role, content} messages."""
    path = recorded_sessions_path(off_dir, user_id, dir_name, period_index)
    if not path.exists():
        raise EnvironmentDataError(
            f"off-policy replay needs recorded transcripts for user {user_id!r} period "
            f"{period_index}, but none exist under {off_dir} (looked for {path} and the run "
            f"layout users/{dir_name}/period_{period_index:02d}/transcript.json); pass the "
            "directory of a finished run of the same environment"
        )
    data = read_json(path)
    if isinstance(data, Mapping) and "sessions" in data:  # this toolkit's transcript.json
        data = data["sessions"]
    if not isinstance(data, list):
        raise EnvironmentDataError(
            f"{path}: expected a list of sessions, got {type(data).__name__}"
        )
    sessions = []
    for index, session in enumerate(data):
        messages = session.get("messages") if isinstance(session, Mapping) else session
        if not isinstance(messages, list) or not all(
            isinstance(m, Mapping) and {"role", "content"} <= m.keys() for m in messages
        ):
            raise EnvironmentDataError(
                f"{path}: session {index} must be a list of {{role, content}} messages"
            )
        sessions.append([{"role": str(m["role"]), "content": str(m["content"])} for m in messages])
    return sessions


def _recorded_transcripts_hash(off_dir: Path, users: Sequence[_User]) -> str:
    """Content hash of every transcript to replay (also fails fast when one is missing)."""
    digest = hashlib.sha256()
    for user in users:
        for period_index in range(len(user.item.periods)):
            sessions = load_recorded_sessions(off_dir, user.item.id, user.dir_name, period_index)
            digest.update(canonical_json([user.item.id, period_index, sessions]).encode("utf-8"))
    return digest.hexdigest()


def _replay_period(
    run: _Run, user: _User, period_index: int, state: MemoryState
) -> tuple[list[SessionTranscript], MemoryState]:
    """Feed recorded sessions to the policy through `observe`, one round at a time (as the
    original feeds `add_msgs` a user/assistant pair)."""
    from memory_policies.base import Message

    item = user.item
    period = item.periods[period_index]
    recorded = load_recorded_sessions(run.off_policy_dir, item.id, user.dir_name, period_index)
    if len(recorded) != len(period.sessions):
        raise EnvironmentDataError(
            f"recorded transcripts of user {item.id!r} period {period_index} have "
            f"{len(recorded)} sessions, the environment has {len(period.sessions)}; they were "
            "recorded on a different environment"
        )
    transcripts = []
    pairs = zip(period.sessions, recorded, strict=True)
    for session_index, (session, messages) in enumerate(pairs):
        expected = opening_message(str(session.session_time), session.query)
        if not messages or messages[0]["content"] != expected:
            raise EnvironmentDataError(
                f"recorded session {session_index} of user {item.id!r} period {period_index} "
                f"does not start with this environment's query ({expected[:60]!r}...); the "
                "transcripts were recorded on a different environment"
            )
        for start in range(0, len(messages), 2):
            chunk = [Message(**m) for m in messages[start : start + 2]]
            with run.slot(), run.lms.context("agent"):
                state = run.policy.observe(state, chunk)
        rounds = len(messages) // 2
        transcripts.append(
            SessionTranscript(
                session_index=session_index,
                session_time=str(session.session_time),
                query=session.query,
                exposed_states=session.exposed_values(),
                messages=[TranscriptMessage(**m) for m in messages],
                rounds_planned=run.config.rounds_for(period_index),
                rounds_completed=rounds,
                replayed=True,
            )
        )
    return transcripts, state


# ----- questions and probes --------------------------------------------------------------------


def probe_question(variable: str) -> str:
    return f"What is my current {variable.replace('_', ' ')}?"


def required_variables(item: EnvironmentItem) -> list[str]:
    """Distinct variables required by any question, in first-appearance order."""
    seen: dict[str, None] = {}
    for qa in item.qas:
        for variable in qa.required_info:
            seen.setdefault(variable, None)
    return list(seen)


def _read_only_answer(
    run: _Run, checkpoint: str, question: str, options: list[str]
) -> tuple[Any, bool, CallUsage]:
    """One policy.answer on a private copy of the checkpoint: (answer, mutated, usage)."""
    state = run.policy.state_from_json(checkpoint)
    with dspy.track_usage() as tracker, run.slot(), run.lms.context("agent"):
        answer = run.policy.answer(state, question, options=options)
    return answer, state.model_dump_json() != checkpoint, _tracked_usage(tracker)


def _probe_variable(
    run: _Run, item: EnvironmentItem, period_index: int, variable: str, checkpoint: str
) -> tuple[ProbeResult, bool, CallUsage]:
    options = [str(value) for value in item.state_schema[variable]]
    question = probe_question(variable)
    answer, mutated, usage = _read_only_answer(run, checkpoint, question, options)
    chosen, error = _checked_choice(answer, len(options))
    gold = str(item.periods[period_index].state[variable])
    value = options[chosen - 1] if chosen else None
    probe = ProbeResult(
        variable=variable,
        question=question,
        options=options,
        chosen=chosen,
        value=value,
        gold=gold,
        correct=value == gold,
        parse_failed=error is not None,
        parse_error=error,
        raw_answer=answer.text,
        retrieved=list(answer.retrieved),
    )
    return probe, mutated, usage


def _recalls(
    probes: Sequence[ProbeResult],
    question_probes: Sequence[QuestionProbeResult],
    question_index: int,
) -> dict[str, Recall]:
    """What one period's probe recalled for a question's variables: the question's own probe
    under paper (the original reads the same question's probe at the write period), the
    per-variable probes otherwise."""
    if question_probes:
        own = next((p for p in question_probes if p.question_index == question_index), None)
        return {} if own is None else {r.variable: r for r in own.recalls}
    return {probe.variable: probe for probe in probes}


def last_update_period(item: EnvironmentItem, variable: str, period_index: int) -> int:
    """The original's write_pos: the last period <= `period_index` whose updates set the
    variable (exposure in a session does not count); 0 when none does."""
    for index in range(period_index, -1, -1):
        if variable in (item.periods[index].updates or {}):
            return index
    return 0


def structured_probe_prompt(item: EnvironmentItem, question_index: int) -> str:
    """The paper protocol's diagnosis probe, in this toolkit's words: the question's required
    variables with their possible values, one JSON object back."""
    variables = item.qas[question_index].required_info
    schema = {v: [str(value) for value in item.state_schema[v]] for v in variables}
    example = json.dumps({variables[0]: "..."}, ensure_ascii=False) if variables else "{}"
    return (
        "From what you know about me, what is true for me right now? Each name below lists "
        f"the values it can take:\n{json.dumps(schema, indent=2, ensure_ascii=False)}\n\n"
        "Reply with only a JSON object that has every name above as a key and, as its value, "
        f"the one listed value that fits me now, copied exactly, e.g. {example}."
    )


def parse_recalled_values(text: str) -> tuple[dict[str, Any], str | None]:
    """The JSON object of a structured probe reply (a fenced block, the whole text, or its
    outermost braces), or ({}, why it could not be read)."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, flags=re.DOTALL)
    candidates = [fenced.group(1)] if fenced else []
    candidates.append(text)
    if "{" in text and "}" in text:
        candidates.append(text[text.index("{") : text.rindex("}") + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate.strip())
        except ValueError:
            continue
        if isinstance(value, dict):
            return value, None
    return {}, f"no JSON object in the probe reply {text[:80]!r}"


def _probe_question(
    run: _Run, item: EnvironmentItem, period_index: int, question_index: int, checkpoint: str
) -> tuple[QuestionProbeResult, bool, CallUsage]:
    query = structured_probe_prompt(item, question_index)
    state = run.policy.state_from_json(checkpoint)
    with dspy.track_usage() as tracker, run.slot(), run.lms.context("agent"):
        answer = run.policy.answer(state, query)
    mutated = state.model_dump_json() != checkpoint
    values, error = (
        ({}, answer.parse_error) if answer.parse_error else parse_recalled_values(answer.text)
    )
    gold_state = item.periods[period_index].state
    recalls = []
    for variable in item.qas[question_index].required_info:
        gold = str(gold_state[variable])
        present = variable in values
        recalls.append(
            VariableRecall(
                variable=variable,
                gold=gold,
                value=values.get(variable),
                missing=not present,
                correct=present and values[variable] == gold,
            )
        )
    probe = QuestionProbeResult(
        question_index=question_index,
        query=query,
        raw_answer=answer.text,
        parse_error=error,
        recalls=recalls,
        retrieved=list(answer.retrieved),
    )
    return probe, mutated, _tracked_usage(tracker)


def _answered_correctly(
    item: EnvironmentItem, period_index: int, question_index: int, answer: Any
) -> bool:
    options = item.qas[question_index].answer_choices
    chosen, _ = _checked_choice(answer, len(options))
    gold_index = item.gold_choice_index(period_index, question_index)
    return chosen is not None and [str(v) for v in options[chosen - 1].state] == [
        str(v) for v in options[gold_index].state
    ]


def _answer_question(
    run: _Run, item: EnvironmentItem, question_index: int, checkpoint: str
) -> tuple[Any, bool, CallUsage]:
    qa = item.qas[question_index]
    options = [choice.answer for choice in qa.answer_choices]
    # A paper-preset policy's own prompt already asks for the option fitting the current
    # situation (as the reference's does); the hint would say it twice.
    question = qa.query if run.policy.preset == "paper" else f"{qa.query}\n{QUESTION_HINT}"
    return _read_only_answer(run, checkpoint, question, options)


def _checked_choice(answer: Any, option_count: int) -> tuple[int | None, str | None]:
    """The 1-based choice, or None with the reason; out-of-range counts as unparseable."""
    choice = answer.choice
    if answer.parse_error:
        return None, answer.parse_error
    if isinstance(choice, bool) or not isinstance(choice, int):
        return None, f"no option number in the answer {answer.text[:80]!r}"
    if not 1 <= choice <= option_count:
        return None, f"choice {choice} is not an option number in 1..{option_count}"
    return choice, None


def _item_result(
    run: _Run,
    item: EnvironmentItem,
    period_index: int,
    question_index: int,
    answer: Any,
    probes_by_period: Sequence[Mapping[str, Recall]],
) -> ItemResult:
    qa = item.qas[question_index]
    period = item.periods[period_index]
    options = [choice.answer for choice in qa.answer_choices]
    option_states = [[str(v) for v in choice.state] for choice in qa.answer_choices]
    gold_index = item.gold_choice_index(period_index, question_index)
    gold_state = option_states[gold_index]
    chosen, error = _checked_choice(answer, len(options))
    correct = chosen is not None and option_states[chosen - 1] == gold_state
    current = {k: str(v) for k, v in period.state.items()}
    checks = check_variables(
        qa.required_info,
        current,
        {v: item.last_write_period(v, period_index) for v in qa.required_info},
        probes_by_period,
        {v: last_update_period(item, v, period_index) for v in qa.required_info},
    )
    ub = (
        run.upper_bound.correct(item.id, question_index, gold_index)
        if run.upper_bound is not None
        else None
    )
    return ItemResult(
        question_index=question_index,
        question=qa.query,
        required_info=list(qa.required_info),
        options=options,
        option_states=option_states,
        gold=gold_index + 1,
        gold_state=gold_state,
        chosen=chosen,
        chosen_state=option_states[chosen - 1] if chosen else None,
        correct=correct,
        parse_failed=error is not None,
        parse_error=error,
        raw_answer=answer.text,
        retrieved=list(answer.retrieved),
        random_score=random_score(option_states, gold_state),
        upper_bound_correct=ub,
        variables=checks,
        diagnosis=diagnose(correct, checks),
    )


def load_report(run_dir: Path) -> dict[str, Any]:
    """The stored report of a run (metrics only) as a dict (`evolve compare` reads it)."""
    return read_json(RunLayout(Path(run_dir)).report_file)
