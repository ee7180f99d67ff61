"""Resume identity: what an evaluation's results depend on, whose hash guards its directory.

A run directory is resumed only by the same environment, users, policy (kind, variant,
parameters, instructions, embedder), episode settings, models, recorded transcripts (off-policy)
and policy schedule; `run_dir.RunLayout.open_run` names each difference otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.simulator.evaluation.context import PolicySchedule, RunOptions, UserRun
from evolve.simulator.evaluation.episode import EpisodeConfig
from evolve.simulator.evaluation.replay import recorded_transcripts_hash
from evolve.simulator.run_dir import RunLayout, safe_name

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import Environment, EnvironmentItem
    from evolve.simulator.upper_bound_table import UpperBoundTable
    from memory_policies.base import MemoryPolicy


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
    options = RunOptions(off_policy_dir=off_policy_dir, policy_schedule=policy_schedule)
    layout.open_run(run_identity(env, policy, lms, assign_dir_names(items), config, options))


def run_identity(
    env: Environment,
    policy: MemoryPolicy,
    lms: RoleLMs,
    users: Sequence[UserRun],
    config: EpisodeConfig,
    options: RunOptions,
) -> dict[str, Any]:
    """The resolved configuration of an evaluation (`resolved_config`), with the content hash
    of the transcripts replayed off-policy and the policy schedule's identity, if any."""
    off_dir = options.off_policy_dir
    off_policy_hash = recorded_transcripts_hash(Path(off_dir), users) if off_dir else None
    resolved = resolved_config(policy, env.content_hash(), users, config, lms, off_policy_hash)
    if options.policy_schedule is not None:
        resolved["policy_schedule"] = options.policy_schedule.identity()
    return resolved


def missing_upper_bound_entries(
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
    users: Sequence[UserRun],
    config: EpisodeConfig,
    lms: RoleLMs,
    off_policy_hash: str | None,
) -> dict[str, Any]:
    """What the results depend on; its hash guards resumption.

    Model names cover the two roles an evaluation uses (the reflector plays no part here).
    """
    models = lms.model_names()
    return {
        # kind, variant (under its old key "preset"), parameters, instructions and embedder name
        "policy": policy.identity(),
        "environment": env_hash,
        "users": [user.item.id for user in users],
        "episode": config.identity(),
        "models": {role: models.get(role) for role in ("simulator", "agent")},
        "off_policy_transcripts": off_policy_hash,
    }


def assign_dir_names(items: Sequence[EnvironmentItem]) -> list[UserRun]:
    users: list[UserRun] = []
    taken: set[str] = set()
    for index, item in enumerate(items):
        name = safe_name(str(item.id))
        if name in taken:
            name = f"{name}_{index}"
        taken.add(name)
        users.append(UserRun(item=item, dir_name=name, results=[]))
    return users
