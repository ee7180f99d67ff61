"""The unit of work: one user in one period (sessions, checkpoint, questions, probes).

The per-unit order is one invariant: the sessions (played on-policy with the protocol's view
of the simulated user, or replayed off-policy) end in a checkpoint, and the questions and
probes run on private copies of the checkpoint as stored, so evaluation never changes the
memory carried to the next period: the next period always starts from the stored checkpoint.
A unit reads and writes only through the `UnitFiles` it is handed (no I/O of its own), and
resumes from what those files hold: one whose transcript and checkpoint exist skips its
sessions.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any

import dspy

from evolve.core.errors import DamagedRunFileError, EnvironmentDataError
from evolve.core.files import warn_damaged
from evolve.llm import call_events
from evolve.llm.usage import tracked_usage
from evolve.llm.usage_callback import label_predictor_calls
from evolve.simulator.evaluation.context import RunContext, UnitFiles, UserRun
from evolve.simulator.evaluation.probes import (
    PROBE_STRATEGIES,
    answer_question,
    item_result,
    recalls_for,
)
from evolve.simulator.evaluation.replay import replay_period
from evolve.simulator.records import PeriodResult, SessionTranscript
from evolve.simulator.user import derive_seed, play_session, user_view_for

if TYPE_CHECKING:
    from memory_policies.messages import MemoryState


def finish_unit(run: RunContext, user: UserRun, period_index: int) -> None:
    run.check_stop()
    run.progress.unit_started(user.item.id, period_index)
    result = run_unit(run.for_unit(user.item.id, period_index), user, period_index)
    run.files.save_period_result(user.dir_name, result)
    user.results.append(result)
    run.progress.unit_result(result)
    run.progress.unit_finished(user.item.id, period_index, resumed=False)


def set_aside_damaged(
    files: UnitFiles, user_dir_name: str, period_index: int, damaged: DamagedRunFileError
) -> None:
    """Move a unit with a damaged file (and the user's later units, which continued from
    its memory) away, and say so: they are recomputed."""
    moved = files.set_aside(user_dir_name, period_index)
    where = moved[0].parent if moved else files.period_dir(user_dir_name, period_index)
    warn_damaged(
        damaged.path,
        damaged.problem,
        f"recomputing {user_dir_name} from period {period_index} (the damaged files are kept "
        f"under {where})",
    )


def run_unit(run: RunContext, user: UserRun, period_index: int) -> PeriodResult:
    """Sessions, checkpoint, questions and probes for one user in one period."""
    started = time.perf_counter()
    item, files, policy = user.item, run.files, run.policy
    label_predictor_calls(policy)  # a traced call shows which predictor made it
    period = item.periods[period_index]
    if period_index == 0:
        # The schema is for policies that remember the user's own variables (the oracle).
        state_in = policy.initial_state(state_schema=item.state_schema)
    else:
        previous = files.load_checkpoint(user.dir_name, period_index - 1)
        if previous is None:
            raise EnvironmentDataError(
                f"{files.checkpoint_file(user.dir_name, period_index - 1)} is missing although "
                f"period {period_index - 1} is marked finished; delete "
                f"{files.period_dir(user.dir_name, period_index - 1)} to recompute it"
            )
        state_in = policy.state_from_json(previous)

    try:
        stored = files.load_transcript(user.dir_name, period_index)
        checkpoint = files.load_checkpoint(user.dir_name, period_index)
    except DamagedRunFileError as damaged:  # a unit stopped after its sessions
        set_aside_damaged(files, user.dir_name, period_index, damaged)
        stored, checkpoint = None, None
    if stored is not None and checkpoint is not None:
        # Interrupted after the sessions: they cost nothing now, their usage was recorded.
        sessions, session_usage = stored
    else:
        with dspy.track_usage() as tracker:
            if run.off_policy_dir is not None:
                sessions, state = replay_period(run, user, period_index, state_in)
            else:
                sessions, state = _play_period(run, user, period_index, state_in)
        session_usage = tracked_usage(tracker)
        files.save_transcript(user.dir_name, period_index, sessions, session_usage)
        checkpoint = state.model_dump_json()
        files.save_checkpoint(user.dir_name, period_index, checkpoint)
    # Continue from exactly what was stored, as a resumed run would.
    state = policy.state_from_json(checkpoint)

    # Questions and probes are read-only: each gets its own copy of the checkpoint and they
    # run concurrently; a copy that comes back changed flags the policy (the copies are
    # discarded, so no question can see another's mutation and the next period starts from
    # the checkpoint on disk). Only wrong_only must wait for the answers before probing.
    questions = [
        functools.partial(answer_question, run, item, qi, checkpoint) for qi in range(len(item.qas))
    ]
    probing = PROBE_STRATEGIES[run.config.rules.probe_style]
    probed = probing.run(run, item, period_index, checkpoint, questions)
    answers, probes, question_probes = probed.answers, probed.probes, probed.question_probes
    outcomes = probed.outcomes
    mutated = any(changed for _, changed, _ in outcomes)
    usage = session_usage
    for _, _, task_usage in outcomes:
        usage = usage.plus(task_usage)
    earlier_periods = list(user.results)
    items = [
        item_result(
            run,
            item,
            period_index,
            qi,
            answer,
            [
                *(recalls_for(p.probes, p.question_probes, qi) for p in earlier_periods),
                recalls_for(probes, question_probes, qi),
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
        probe_scope=probing.scope(run.config),
        policy_parse_failures=policy_failures,
        evaluation_mutated_state=mutated,
        usage=usage,
        wall_time_s=time.perf_counter() - started,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _play_period(
    run: RunContext, user: UserRun, period_index: int, state: MemoryState
) -> tuple[list[SessionTranscript], MemoryState]:
    item = user.item
    period = item.periods[period_index]
    view_style = run.config.rules.user_view
    sessions = []
    for session_index, session in enumerate(period.sessions):
        with call_events.step(f"session {session_index}"):  # its calls, in its trace span
            transcript, state = play_session(
                policy=run.policy,
                state=state,
                user=run.simulated_user,
                lms=run.lms,
                session_index=session_index,
                session_time=str(session.session_time),
                query=session.query,
                exposed_states=session.exposed_values(),
                view=user_view_for(view_style, item, period, session),
                rounds=run.config.rounds_for(period_index),
                seed=derive_seed(run.config.seed, item.id, period_index),
                call_slot=run.slot,
            )
        sessions.append(transcript)
    return sessions, state
