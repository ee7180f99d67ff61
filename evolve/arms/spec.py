"""The arms spec: one TOML file describes a controlled comparison of memory-policy designs.

An arms run takes an experiment spec and runs it as several **arms** (the spec's own
evolution, the blind control, the capacity control, the base) on several **environment
seeds**, each evolving arm in several **replicates** (its own optimizer and reflector seed),
then scores every arm once on each seed's **test users**, drawn after the users that evolved
(train) and chose (validation) the policies. It prints and logs one table with intervals.

    name = "crafts-arms"
    experiment = "quickstart.toml"     # relative to this file
    seeds = [101, 102, 103, 104]        # environment seeds; never scored before: the test
    replicates = 2
    validation_users = 2
    test_users = 6
    arms = ["evolved", "blind", "capacity", "base"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from evolve.core.errors import ConfigError
from evolve.core.files import folder_name_problem, read_toml_file
from evolve.core.spec_base import StrictTable, format_validation_error
from evolve.spec.experiment_spec import BudgetSpec

DEFAULT_ARMS = ("evolved", "blind", "capacity", "base")


class ArmsSpec(StrictTable):
    name: str = Field(description="Directory name under the runs directory; MLflow run name.")
    description: str = ""
    experiment: Path = Field(description="The experiment spec every arm derives from.")
    seeds: list[int] = Field(min_length=1, description="Environment seeds (one world each).")
    replicates: int = Field(
        default=2, ge=1, description="Runs of each evolving arm per seed, each its own seed."
    )
    validation_users: int = Field(
        default=2, ge=1, description="Per seed, after the train users: where the best is chosen."
    )
    test_users: int = Field(
        default=6, ge=1, description="Per seed, after the validation users: scored once, to report."
    )
    arms: list[str] = Field(default_factory=lambda: list(DEFAULT_ARMS), min_length=1)
    run_budget: BudgetSpec = Field(
        default_factory=BudgetSpec,
        description="Limits of each arm's experiment, replacing the experiment spec's (none by "
        "default: an arm is compared only once it has run all its generations).",
    )
    transfer: bool = Field(
        default=False,
        description="Also table the test questions about facts no train user of the seed was "
        "asked about: does what evolution learnt transfer, or only name the train users' facts?",
    )
    resamples: int = Field(default=2000, ge=200, description="Bootstrap resamples per interval.")
    statistics_seed: int = Field(default=0, description="Seed of every resampling.")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("name")
    @classmethod
    def _folder_name(cls, value: str) -> str:
        problem = folder_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"a seed is listed twice: {value}")
        return value

    @field_validator("arms")
    @classmethod
    def _known_arms(cls, value: list[str]) -> list[str]:
        from evolve.arms.registry import ARMS

        unknown = [arm for arm in value if arm not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {unknown}; known arms: {', '.join(ARMS)}")
        if len(set(value)) != len(value):
            raise ValueError(f"an arm is listed twice: {value}")
        if "base" not in value:
            raise ValueError("the arms must include 'base': every difference is to the base")
        return value

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    def experiment_path(self) -> Path:
        path = self.experiment
        return path if path.is_absolute() else self._base_dir / path

    def identity(self) -> dict[str, Any]:
        """What the design is: changing any of it makes another design (see the ledger)."""
        # How the table is computed (resamples, seed, which questions) is not the design: the same
        # runs and test users, re-tabled, are the same test.
        return self.model_dump(
            mode="json",
            exclude={"description", "name", "resamples", "statistics_seed", "transfer"},
        )


def load_arms_spec(path: str | Path) -> ArmsSpec:
    path = Path(path)
    data = read_toml_file(path, what="arms spec")
    try:
        spec = ArmsSpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(f"arms spec {path}", error, ArmsSpec)) from None
    spec._base_dir = path.resolve().parent
    if not spec.experiment_path().is_file():
        raise ConfigError(
            f"arms spec {path}: experiment = {str(spec.experiment)!r}: no such file "
            f"({spec.experiment_path()}); give an experiment spec path relative to {path.name}"
        )
    return spec
