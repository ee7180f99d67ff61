"""The scheduler: which units run when, the period barriers, the report.

For each period the runner plays the period's sessions (policy <-> simulated user, or a replay
of recorded transcripts in off-policy mode), checkpoints the policy's memory, asks every
question as multiple choice and probes what the memory recalls (the unit of work:
`run.unit`; its probes: `run.probes`). It talks to the policy only through the
`memory_policies` interface, and evaluation never changes the memory carried to the next
period: the next period always starts from the stored checkpoint.

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
A hash of the resolved configuration guards the directory (`run.identity`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from evolve.core.errors import DamagedRunFileError, EnvironmentDataError
from evolve.core.files import warn_damaged
from evolve.core.protocol import DEFAULT_PROTOCOL, Protocol
from evolve.core.stopping import endpoint_failure
from evolve.llm.response_cache import recording_writes
from evolve.simulator.evaluation.context import RunContext, RunOptions, UnitFiles, UserRun
from evolve.simulator.evaluation.episode import EpisodeConfig
from evolve.simulator.evaluation.identity import (
    assign_dir_names,
    missing_upper_bound_entries,
    run_identity,
)
from evolve.simulator.evaluation.unit import finish_unit, set_aside_damaged
from evolve.simulator.metrics import (
    MetricSummary,
    summarize,
    summarize_by_period,
    summarize_by_user,
    summarize_periods,
)
from evolve.simulator.records import UserResult
from evolve.simulator.run_dir import (
    RunLayout,
    atomic_write_json,
    export_original_layout,
    read_json,
    read_object,
)

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import Environment
    from memory_policies.base import MemoryPolicy


class EvaluationReport(BaseModel):
    run_dir: Path
    config_hash: str
    protocol: Protocol = Field(
        default=DEFAULT_PROTOCOL, description="The information flow that produced these results."
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


# The roles an evaluation calls (the reflector plays no part in one).
EPISODE_ROLES = ("simulator", "agent")


def run_evaluation(
    env: Environment,
    policy: MemoryPolicy,
    lms: RoleLMs,
    run_dir: Path,
    config: EpisodeConfig,
    options: RunOptions | None = None,
    **option_fields: Any,
) -> EvaluationReport:
    """Evaluate `policy` on `env`, storing everything under `run_dir`; resumes by default.

    The optional parts are a `RunOptions`, passed whole or as its fields
    (``run_evaluation(..., upper_bound=table)``):

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

    A broken endpoint leaves nothing to replay: when the evaluation ends in an LLM call that
    failed for good, or with most answers unparseable (`summary.unreliable`), every response
    it stored in the response cache is evicted (free-text turns parse whatever the server
    sent, so only the run as a whole tells a broken reply from a healthy one).
    """
    with recording_writes() as written:
        try:
            result = _run_evaluation(env, policy, lms, run_dir, config, options, **option_fields)
        except BaseException:
            if endpoint_failure() is not None:
                written.evict_all()
            raise
        if result.summary.unreliable is not None:
            written.evict_all()
    return result


def _run_evaluation(
    env: Environment,
    policy: MemoryPolicy,
    lms: RoleLMs,
    run_dir: Path,
    config: EpisodeConfig,
    options: RunOptions | None = None,
    **option_fields: Any,
) -> EvaluationReport:
    """`run_evaluation` without the response-cache bookkeeping."""
    if options is not None and option_fields:
        raise TypeError("pass either options=RunOptions(...) or its fields, not both")
    options = options or RunOptions(**option_fields)
    started = time.perf_counter()
    usage_start = lms.usage.snapshot()
    layout = RunLayout(Path(run_dir))
    items = list(env.items[: config.max_users] if config.max_users else env.items)
    users = assign_dir_names(items)
    digest = layout.open_run(run_identity(env, policy, lms, users, config, options))
    if _stored_copy(layout.environment_file) is None:
        atomic_write_json(layout.environment_file, [item.to_original() for item in items])
    upper_bound = options.upper_bound
    upper_bound_changed = False
    if upper_bound is not None:
        missing = missing_upper_bound_entries(upper_bound, items)
        if missing:
            raise EnvironmentDataError(
                f"the upper-bound table (environment {upper_bound.environment_hash[:12]}, model "
                f"{upper_bound.agent_model}) has no entry for {len(missing)} question variant(s) "
                f"of this environment, e.g. {missing[0]}; compute it with "
                "compute_upper_bound(env, lms, cache_dir) for the environment evaluated"
            )
        table = upper_bound.model_dump(mode="json")
        # Rewritten only when it changed: a resumed run's copy is the same table, maybe in
        # another order.
        if _stored_copy(layout.upper_bound_file) != table:
            upper_bound_changed = True
            atomic_write_json(layout.upper_bound_file, table)

    run = RunContext(policy, lms, layout, config, options)
    finished = _load_finished(layout, users)
    failed_answers = [
        sum(item.parse_failed for item in result.items) for user in users for result in user.results
    ]
    if any(failed_answers):
        run.progress.kept_failed_units(
            units=sum(1 for count in failed_answers if count),
            answers=sum(failed_answers),
            run_dir=layout.root,
        )
    period_count = max((len(user.item.periods) for user in users), default=0)
    run.progress.run_started(users=len(users), periods=period_count, finished_units=finished)
    # A run finished by an earlier invocation keeps the report that invocation wrote: its
    # usage is what the evaluation cost, where this one's (nothing) would replace it. A new
    # upper bound changes its scores: then it is written again.
    keep_written_report = (
        finished == sum(len(u.item.periods) for u in users)
        and not upper_bound_changed
        and _written_report_is_complete(layout)
    )
    # The original layout is written with the report; kept with it, it is checked.
    repair_original = keep_written_report and _original_layout_damaged(layout)

    def report(complete: bool) -> EvaluationReport:
        user_results = [UserResult(user_id=u.item.id, periods=list(u.results)) for u in users]
        result = EvaluationReport(
            run_dir=layout.root,
            config_hash=digest,
            protocol=config.protocol,
            policy={
                "kind": policy.kind,
                "variant": policy.variant,
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
        if keep_written_report:  # also at barriers: the file says complete, and it is
            if repair_original:
                export_original_layout(
                    layout, user_results, {u.item.id: u.dir_name for u in users}, upper_bound
                )
            return result
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
        if options.on_period_end is None and config.concurrency > 1:
            _run_pipelined(run, users, period_count)
        else:
            latest = _run_with_barriers(run, users, period_count, options, report)
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


def _stored_copy(path: Path) -> Any:
    """A file the run writes again from what it holds in memory (None when absent); a
    damaged copy is reported and reads as None, so it is written again."""
    if not path.exists():
        return None
    try:
        return read_json(path)
    except DamagedRunFileError as damaged:
        warn_damaged(damaged.path, damaged.problem, "writing it again")
        return None


def _written_report_is_complete(layout: RunLayout) -> bool:
    report = _stored_copy(layout.report_file)  # damaged: written again
    return isinstance(report, dict) and report.get("complete") is True


def _original_layout_damaged(layout: RunLayout) -> bool:
    """Whether any file of the original layout cannot be read back (each one is named)."""
    damaged = False
    for path in sorted(layout.original_dir.rglob("*.json")):
        damaged = _stored_copy(path) is None or damaged
    return damaged


def _load_finished(files: UnitFiles, users: Sequence[UserRun]) -> int:
    """Load each user's finished periods (in order, up to the first missing); their count.
    A finished unit whose result, transcript or checkpoint cannot be read back is set
    aside with the user's later units, and they are recomputed (with a warning)."""
    finished = 0
    for user in users:
        for period_index in range(len(user.item.periods)):
            try:
                stored = files.load_period_result(user.dir_name, period_index)
                if stored is not None:  # what the next period and a report read back
                    files.load_transcript(user.dir_name, period_index)
                    files.load_checkpoint(user.dir_name, period_index)
            except DamagedRunFileError as damaged:
                set_aside_damaged(files, user.dir_name, period_index, damaged)
                stored = None
            if stored is None:
                break
            user.results.append(stored)
            finished += 1
    return finished


def _run_with_barriers(
    run: RunContext,
    users: Sequence[UserRun],
    period_count: int,
    options: RunOptions,
    report: Callable[[bool], EvaluationReport],
) -> EvaluationReport | None:
    """Period by period, every user finishing a period before the next starts; the last
    report written (at each barrier a callback sees, and after the last period)."""
    latest: EvaluationReport | None = None
    on_period_end = options.on_period_end
    for period_index in range(period_count):
        todo = [u for u in users if len(u.item.periods) > period_index]
        for user in todo:
            if len(user.results) > period_index:
                run.progress.unit_finished(user.item.id, period_index, resumed=True)
        pending = [u for u in todo if len(u.results) <= period_index]
        _run_units(run, pending, period_index)
        last = period_index == period_count - 1
        if on_period_end is not None or last:
            # Written at every barrier a callback sees: a pruned run leaves a report.
            latest = report(last)
        # Periods up to this one only: a resumed run has later ones on disk already,
        # and a pruner must see the value an uninterrupted run reports here.
        summary = summarize(
            [UserResult(user_id=u.item.id, periods=u.results[: period_index + 1]) for u in users],
            run.upper_bound,
        )
        run.progress.period_finished(period_index, summary)
        if on_period_end is not None:
            on_period_end(period_index, summary)
    return latest


def _run_units(run: RunContext, users: Sequence[UserRun], period_index: int) -> None:
    """One period for many users; the first failure stops the rest and is re-raised."""
    if not users:
        return
    if run.config.concurrency <= 1 or len(users) == 1:
        for user in users:
            finish_unit(run, user, period_index)
        return
    with _unit_pool(run, len(users)) as pool:
        futures = [pool.submit(finish_unit, run, user, period_index) for user in users]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]


def _run_pipelined(run: RunContext, users: Sequence[UserRun], period_count: int) -> None:
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
            run.progress.period_finished(index, summarize_periods(periods, run.upper_bound))

    def run_user(user: UserRun) -> None:
        for index in range(len(user.item.periods)):
            if len(user.results) > index:
                run.progress.unit_finished(user.item.id, index, resumed=True)
            else:
                finish_unit(run, user, index)
            period_done(index)

    with _unit_pool(run, len(users)) as pool:
        futures = [pool.submit(run_user, user) for user in users]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]


@contextlib.contextmanager
def _unit_pool(run: RunContext, users: int) -> Iterator[ThreadPoolExecutor]:
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


def load_report(run_dir: Path) -> dict[str, Any]:
    """The stored report of a run (metrics only) as a dict (`evolve compare` reads it)."""
    return read_object(RunLayout(Path(run_dir)).report_file)
