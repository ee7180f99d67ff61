"""Off-policy replay: recorded sessions fed to the policy through `observe`.

Transcripts are looked up in a run directory of this toolkit, its `original/` export or the
reference code's output; their content hash is part of the run's identity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from evolve.core.errors import EnvironmentDataError
from evolve.llm import call_events
from evolve.simulator.records import SessionTranscript, TranscriptMessage
from evolve.simulator.run_dir import canonical_json, read_json
from evolve.simulator.user import opening_message

if TYPE_CHECKING:
    from evolve.simulator.evaluation.context import RunContext, UserRun
    from memory_policies.messages import MemoryState


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


def recorded_transcripts_hash(off_dir: Path, users: Sequence[UserRun]) -> str:
    """Content hash of every transcript to replay (also fails fast when one is missing)."""
    digest = hashlib.sha256()
    for user in users:
        for period_index in range(len(user.item.periods)):
            sessions = load_recorded_sessions(off_dir, user.item.id, user.dir_name, period_index)
            digest.update(canonical_json([user.item.id, period_index, sessions]).encode("utf-8"))
    return digest.hexdigest()


def replay_period(
    run: RunContext, user: UserRun, period_index: int, state: MemoryState
) -> tuple[list[SessionTranscript], MemoryState]:
    """Feed recorded sessions to the policy through `observe`, one round at a time (as the
    original feeds `add_msgs` a user/assistant pair)."""
    from memory_policies.messages import Message

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
            with run.slot(), run.lms.context("agent"), call_events.step(f"session {session_index}"):
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
