"""Experiment specs, resolved: `resolve()` checks everything that can be checked without an
LLM (environment, users, policy, components and parameter bounds) before the first call.

The spec tables themselves are `evolve.spec.experiment_spec`; they are importable from here too,
as they always were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from evolve.core.errors import ConfigError, EnvironmentDataError, shown_value
from evolve.core.protocol import ProtocolRules
from evolve.feedback import feedback_kind
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig
from evolve.simulator.run_dir import config_hash
from evolve.spec.experiment_spec import (
    RETIRED_OPTIMIZER_KEYS,
    BudgetSpec,
    EnvironmentSpec,
    EpisodeSpec,
    ExperimentSpec,
    FeedbackKind,
    OptimizerSpec,
    PolicySpec,
    RunSpec,
    ScheduleName,
    TrackingSpec,
    load_spec,
    read_toml,
    spec_from_dict,
)

__all__ = [
    "RETIRED_OPTIMIZER_KEYS",
    "BudgetSpec",
    "EnvironmentSpec",
    "EpisodeSpec",
    "ExperimentSpec",
    "FeedbackKind",
    "OptimizerSpec",
    "PolicySpec",
    "ResolvedExperiment",
    "RunSpec",
    "ScheduleName",
    "TrackingSpec",
    "load_spec",
    "read_toml",
    "resolve",
    "spec_from_dict",
]


# ----- resolution: everything checked before the first LLM call ---------------------------------


@dataclass(frozen=True)
class ResolvedExperiment:
    """A validated spec with its environment split and its base policy built."""

    spec: ExperimentSpec
    environment: Environment
    train: Environment
    heldout: Environment
    episode: EpisodeConfig
    base_policy: Any  # memory_policies.MemoryPolicy
    environment_description: str
    # GEPA's valset when not empty (the best is chosen there); else the train users.
    validation: Environment = field(default_factory=lambda: Environment(items=[]))

    def evaluated_items(self) -> list[Any]:
        """Every user an experiment plays: train, validation, held-out."""
        return [*self.train.items, *self.validation.items, *self.heldout.items]

    @property
    def rules(self) -> ProtocolRules:
        """What the experiment's protocol decides (resolved once, with the spec)."""
        return self.spec.rules

    def identity(self, model_names: dict[str, str]) -> dict[str, Any]:
        return {
            "spec": self.spec.identity(),
            "environment": self.environment.content_hash(),
            "train_users": [item.id for item in self.train.items],
            # Recorded only when used: earlier runs keep their hashes.
            **(
                {"validation_users": [item.id for item in self.validation.items]}
                if self.validation.items
                else {}
            ),
            "heldout_users": [item.id for item in self.heldout.items],
            "episode": self.episode.identity(),
            "base_policy": self.base_policy.identity(),
            "models": dict(sorted(model_names.items())),
        }

    def config_hash(self, model_names: dict[str, str]) -> str:
        return config_hash(self.identity(model_names))


def spec_label(spec: ExperimentSpec) -> str:
    """How errors name the spec: its file, when it has one."""
    return str(spec.source) if spec.source is not None else "experiment spec"


def resolve(spec: ExperimentSpec) -> ResolvedExperiment:
    """Load/synthesize the environment, split users, build the base policy, check the optimizer.

    Raises `ConfigError` / `EnvironmentDataError` / `PolicyError` naming the spec file.
    """
    label = spec_label(spec)
    environment, description, (rounds_initial, rounds_update) = _environment(spec, label)
    train_items, validation_items, heldout_items = _split_users(
        label, environment, spec.environment
    )
    if not heldout_items and not validation_items and spec.optimizer.schedule != "per_period":
        raise ConfigError(
            f"{label}: environment.heldout_users = 0: the population schedule checks its best "
            "on users it did not evolve on; give held-out users (or validation users, when "
            'the test is scored elsewhere, as `evolve arms` does), or use schedule = "per_period"'
        )
    if validation_items and spec.optimizer.schedule != "population":
        raise ConfigError(
            f"{label}: environment.validation_users = {spec.environment.validation_users!r}: "
            f"only the population schedule chooses its best on validation users; set it to 0 "
            f'or use schedule = "population"'
        )
    if not spec.rules.complete_feedback_allowed and spec.optimizer.feedback == "complete":
        raise ConfigError(
            f'{label}: optimizer.feedback = "complete" was renamed: write feedback = '
            '"diagnostic" for the failure feedback with ground truth, or set protocol = '
            '"paper" for the paper\'s complete feedback (no ground truth)'
        )
    episode = EpisodeConfig(
        rounds_initial=spec.episode.rounds_initial or rounds_initial,
        rounds_update=spec.episode.rounds_update or rounds_update,
        concurrency=spec.concurrency,
        seed=spec.seed if spec.episode.seed is None else spec.episode.seed,
        rules=spec.rules,
        probes=spec.episode.probes,
    )
    base_policy = _base_policy(spec, label)
    _check_optimizer(spec.optimizer, base_policy, label)
    return ResolvedExperiment(
        spec=spec,
        environment=environment,
        train=Environment(items=train_items),
        validation=Environment(items=validation_items),
        heldout=Environment(items=heldout_items),
        episode=episode,
        base_policy=base_policy,
        environment_description=description,
    )


def _environment(spec: ExperimentSpec, label: str) -> tuple[Environment, str, tuple[int, int]]:
    """The spec's environment, how to describe it, and its (initial, update) session rounds."""
    env_spec = spec.environment
    rounds = spec.rules.data_file_rounds
    if env_spec.preset is not None:
        from evolve.simulator.synthesis.offline import synthesize_users
        from evolve.simulator.synthesis.presets import MAX_USERS, get_preset

        try:
            preset = get_preset(env_spec.preset)
        except ConfigError as error:
            raise ConfigError(f"{label}: environment.preset: {error}") from None
        rounds = (preset.rounds_initial, preset.rounds_update)
        needed = _users_needed(env_spec)
        count = env_spec.users if env_spec.users is not None else needed
        if needed is not None and count is not None and count < needed:
            raise ConfigError(
                f"{label}: environment.users = {count} but train_users + heldout_users need "
                f"{needed}; raise users or lower the splits"
            )
        if count is None:
            raise ConfigError(
                f"{label}: environment.users is required when train/held-out users are given "
                "as id lists with a preset (how many users to synthesize?)"
            )
        if count > MAX_USERS:
            raise ConfigError(
                f"{label}: environment.users = {shown_value(count)}; at most {MAX_USERS} are "
                "synthesized (a larger number is usually a typo); lower it"
            )
        # Only the users the splits use: the others would cost time and memory for nothing.
        indices = _used_indices(env_spec, count)
        environment = synthesize_users(preset, env_spec.seed, indices)
        return environment, f"preset {env_spec.preset} seed {env_spec.seed} ({count} users)", rounds
    from evolve.simulator.environment import load_environment

    path = env_spec.file if env_spec.file.is_absolute() else spec.base_dir / env_spec.file
    if spec.rules.data_file_is_published and not path.exists():
        raise EnvironmentDataError(
            f"{label}: environment.file: {path} does not exist; download the published "
            "AMemGym data.json there (docs/environments.md, 'Published data') or name "
            "another data.json"
        )
    try:
        environment = load_environment(path)
    except EnvironmentDataError as error:
        raise EnvironmentDataError(f"{label}: environment.file: {error}") from None
    return environment, f"file {path} ({len(environment.items)} users)", rounds


def _base_policy(spec: ExperimentSpec, label: str) -> Any:
    """The spec's base policy, built (a `memory_policies.MemoryPolicy`); never a
    memory system, which has no instructions to evolve or tune."""
    from memory_policies import build_policy
    from memory_policies.errors import PolicyError
    from memory_policies.memory_system import MemorySystemPolicy

    try:
        if spec.policy.path is not None:
            path = spec.policy.path
            path = path if path.is_absolute() else spec.base_dir / path
            base_policy = build_policy({"path": path})
        else:
            base_policy = build_policy(
                {
                    "kind": spec.policy.kind,
                    "variant": spec.policy.variant,
                    "parameters": dict(spec.policy.parameters),
                    "components": dict(spec.policy.components) or None,
                },
                # Under the paper protocol a policy naming no variant gets the paper variant.
                default_variant=spec.rules.policy_variant,
            )
    except PolicyError as error:
        raise ConfigError(f"{label}: policy: {error}") from None
    if isinstance(base_policy, MemorySystemPolicy):
        raise ConfigError(
            f"{label}: policy: '{base_policy.kind}' is a memory system, a fixed "
            "baseline with no instructions to evolve or tune; evaluate it instead: "
            f"evolve eval --policy {base_policy.kind} --policy <your policy>"
        )
    return base_policy


def _check_optimizer(optimizer: OptimizerSpec, base_policy: Any, label: str) -> None:
    """What the optimizer mutates must exist in the base policy, within bounds it can move in."""
    from memory_policies.parameters import parameter_problem

    components = base_policy.components()
    unknown = [name for name in optimizer.mutate_components if name not in components]
    if unknown:
        raise ConfigError(
            f"{label}: optimizer.mutate_components: {unknown} are not components of a "
            f"'{base_policy.kind}' policy; valid: {list(components)}"
        )
    parameters = base_policy.parameters()
    rules = base_policy.parameter_table()
    for name, bounds in optimizer.parameters.items():
        if name not in parameters:
            raise ConfigError(
                f"{label}: optimizer.parameters.{name}: not a parameter of a "
                f"'{base_policy.kind}' policy; valid: {list(parameters) or 'none'}"
            )
        for end, value in (("low", bounds.low), ("high", bounds.high)):
            if problem := parameter_problem(name, value, rules[name]):
                raise ConfigError(f"{label}: optimizer.parameters.{name}.{end} {problem}")
        if bounds.low == bounds.high:
            raise ConfigError(
                f"{label}: optimizer.parameters.{name}: low == high ({bounds.low}) leaves "
                "nothing to mutate; widen the range or remove the parameter"
            )
        if not bounds.low <= parameters[name] <= bounds.high:
            raise ConfigError(
                f"{label}: the base policy's {name} = {parameters[name]} is outside "
                f"optimizer.parameters.{name} = [{bounds.low}, {bounds.high}]; set "
                f"policy.parameters.{name} within the bounds or widen them"
            )
    if (
        optimizer.schedule == "per_period"
        and feedback_kind(optimizer.feedback).proposes
        and not optimizer.mutate_components
    ):
        raise ConfigError(
            f"{label}: optimizer.mutate_components is empty: the per_period schedule "
            "rewrites instructions; name at least one component"
        )


def _used_indices(env_spec: EnvironmentSpec, count: int) -> list[int]:
    """The synthesis indices of the users the splits name: the first train + held-out ones,
    or those whose ids (`u<index>-<persona>`) the lists give; every user when an id does not
    have that form (the split then names it as unknown)."""
    needed = _users_needed(env_spec)
    if needed is not None:
        return list(range(needed))
    indices: set[int] = set()
    for value in (env_spec.train_users, env_spec.validation_users, env_spec.heldout_users):
        if isinstance(value, int) and value == 0:
            continue
        if isinstance(value, int):
            return list(range(count))  # "the next N" needs every user before them
        for user_id in value:
            found = re.match(r"u(\d+)-", user_id)
            if found is None or int(found.group(1)) >= count:
                return list(range(count))
            indices.add(int(found.group(1)))
    return sorted(indices)


def _users_needed(env_spec: EnvironmentSpec) -> int | None:
    splits = (env_spec.train_users, env_spec.validation_users, env_spec.heldout_users)
    if all(isinstance(count, int) for count in splits):
        return sum(splits)  # type: ignore[arg-type]
    return None


def _split_users(label: str, environment: Environment, env_spec: EnvironmentSpec):
    items = list(environment.items)
    ids = [item.id for item in items]
    by_id = {item.id: item for item in items}
    train_spec, heldout_spec = env_spec.train_users, env_spec.heldout_users

    def pick(name: str, value: int | list[str], start: int, taken: set[str]) -> list:
        if isinstance(value, int):
            remaining = [item for item in items[start:] if item.id not in taken]
            if len(remaining) < value:
                raise ConfigError(
                    f"{label}: environment.{name} = {value} but only {len(remaining)} user(s) "
                    f"remain of {len(items)} in the environment; lower it or add users"
                )
            return remaining[:value]
        missing = [user_id for user_id in value if user_id not in by_id]
        if missing:
            raise ConfigError(
                f"{label}: environment.{name}: no user(s) {missing} in the environment; "
                f"known ids include {ids[:5]}"
            )
        return [by_id[user_id] for user_id in value]

    validation_spec = env_spec.validation_users
    listed = set(train_spec if isinstance(train_spec, list) else []) | set(
        validation_spec if isinstance(validation_spec, list) else []
    )
    if isinstance(train_spec, list) and isinstance(heldout_spec, int):
        train = pick("train_users", train_spec, 0, set())
        validation = pick("validation_users", validation_spec, 0, listed)
        heldout = pick("heldout_users", heldout_spec, 0, listed | {i.id for i in validation})
    else:
        train = pick("train_users", train_spec, 0, set())
        start = len(train) if isinstance(train_spec, int) else 0
        validation = pick("validation_users", validation_spec, start, {i.id for i in train})
        if isinstance(validation_spec, int):
            start += len(validation)
        taken = {item.id for item in [*train, *validation]}
        heldout = pick("heldout_users", heldout_spec, start, taken)
    splits = {"train": train, "validation": validation, "held-out": heldout}
    pairs = (("train", "validation"), ("train", "held-out"), ("validation", "held-out"))
    for first, second in pairs:
        overlap = sorted({i.id for i in splits[first]} & {i.id for i in splits[second]})
        if overlap:
            raise ConfigError(
                f"{label}: environment: users {overlap} are both {first} and {second} users; "
                "train, validation and held-out users must be disjoint"
            )
    return train, validation, heldout
