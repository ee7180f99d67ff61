"""One environment seed of an arms run: the experiment the evolving arms run (train users to
reflect on, validation users to choose on, no held-out users) and the test users (drawn after
both, never seen by any arm until the end). Users are synthesized one by one from
(seed, index), so the first users of the test world are the experiment's own."""

from __future__ import annotations

from dataclasses import dataclass

from evolve.arms.spec import ArmsSpec
from evolve.core.errors import ConfigError
from evolve.core.seeds import derive_seed
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig
from evolve.spec.config import ExperimentSpec, ResolvedExperiment, resolve


@dataclass(frozen=True)
class SeedWorld:
    seed: int
    experiment: ExperimentSpec  # replicate 0's spec; `replicate_spec` gives the others
    resolved: ResolvedExperiment
    test: Environment
    episode: EpisodeConfig  # the same for every arm: the base is scored once per seed


def seed_world(spec: ArmsSpec, experiment: ExperimentSpec, seed: int) -> SeedWorld:
    environment = experiment.environment
    if environment.preset is None or not isinstance(environment.train_users, int):
        raise ConfigError(
            f"arms spec {spec.name}: the experiment must synthesize its users (a preset) and "
            "give train_users as a count: each seed's world is drawn from the preset"
        )
    train = environment.train_users
    # The simulated user's seed is pinned: every arm and replicate meets the same users.
    episode = experiment.episode.model_copy(
        update={"seed": experiment.episode.seed if experiment.episode.seed is not None
                else experiment.seed}
    )  # fmt: skip
    evolving = experiment.model_copy(
        update={
            "environment": environment.model_copy(
                update={
                    "seed": seed,
                    "users": train + spec.validation_users,
                    "validation_users": spec.validation_users,
                    "heldout_users": 0,
                }
            ),
            "episode": episode,
            "budget": spec.run_budget,
        }
    )
    with_test = evolving.model_copy(
        update={
            "environment": evolving.environment.model_copy(
                update={
                    "users": train + spec.validation_users + spec.test_users,
                    "heldout_users": spec.test_users,
                }
            )
        }
    )
    resolved = resolve(evolving)
    tested = resolve(with_test)
    return SeedWorld(
        seed=seed,
        experiment=evolving,
        resolved=resolved,
        test=tested.heldout,
        episode=tested.episode,
    )


def replicate_spec(world: SeedWorld, arms_name: str, arm_name: str, replicate: int,
                   spec: ExperimentSpec) -> ExperimentSpec:  # fmt: skip
    """An evolving arm's experiment for one replicate: its own name and, past the first
    replicate, its own optimizer and reflector seed (so the reflector's requests, and their
    cache keys, differ); the simulated users stay the same."""
    seed = spec.seed if replicate == 0 else derive_seed(spec.seed, "replicate", replicate)
    return spec.model_copy(
        update={"name": f"{arms_name}-{arm_name}-s{world.seed}-r{replicate}", "seed": seed}
    )
