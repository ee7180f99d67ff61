"""Study specs: one TOML file (`StudySpec`) describes an Optuna study over a policy's numeric
parameters; its `[tuning]` table is a `TuningSpec`.

A study spec shares the experiment spec's tables (`[environment]`, `[episode]`, `[policy]`,
`[budget]`, `[tracking]`, `[llm]`, `seed`, `concurrency`; see `evolve.spec.config`) and adds a
`[tuning]` table: the search space, the number of trials, the sampler, the pruner, the
objective(s) and where the study is stored. `resolve_tuning()` checks everything that can be
checked without an LLM before the first call. See `experiments/tune_quick.toml`.

Why one module: the `[tuning]` table, its search space, pruner and storage checks and the
one `resolve_tuning()` that applies them are read together; messages name key paths across
them, and splitting would scatter one spec over several files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from evolve.core.errors import ConfigError, ToolkitError
from evolve.core.files import folder_name_problem, read_toml_file
from evolve.core.spec_base import (
    SKIP,
    IntRange,
    StrictTable,
    format_validation_error,
    value_problem,
)
from evolve.llm.config import LLMConfig
from evolve.results.objective import OBJECTIVES
from evolve.spec.config import (
    ExperimentSpec,
    OptimizerSpec,
    ResolvedExperiment,
    RunSpec,
    read_toml,
    resolve,
)
from evolve.tuning.storage import (
    DEFAULT_HEARTBEAT_GRACE_S,
    check_storage_url,
    normalize_storage_url,
    prepare_storage_directory,
)
from memory_policies.parameters import PARAMETER_RULES, parameter_problem, short_name

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
COST_OBJECTIVE = "tokens"
# Trials used by the non-grid samplers when `trials` is not given.
DEFAULT_TRIALS = 20


ParameterSpace = list[int] | IntRange


class NoPrunerSpec(StrictTable):
    kind: Literal["none"] = "none"


class MedianPrunerSpec(StrictTable):
    """Prune when the running score is below the median of earlier trials at that period."""

    kind: Literal["median"] = "median"
    # Optuna's default (5) never prunes a study of a handful of trials.
    n_startup_trials: int = Field(default=2, ge=0, description="Trials finished before pruning.")
    n_warmup_steps: int = Field(default=0, ge=0, description="Periods before pruning starts.")
    interval_steps: int = Field(default=1, ge=1)
    n_min_trials: int = Field(default=1, ge=1, description="Trials reported at a period, at least.")


class SuccessiveHalvingPrunerSpec(StrictTable):
    """Asynchronous successive halving: rungs at periods min_resource * reduction_factor^k."""

    kind: Literal["successive_halving"] = "successive_halving"
    min_resource: int | Literal["auto"] = Field(default=1)
    reduction_factor: int = Field(default=2, ge=2)
    min_early_stopping_rate: int = Field(default=0, ge=0)
    bootstrap_count: int = Field(default=0, ge=0)

    @field_validator("min_resource")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"min_resource must be at least 1 or 'auto', got {value}")
        return value


class WilcoxonPrunerSpec(StrictTable):
    """Wilcoxon signed-rank test of this trial's per-period scores against the best trial's.

    Each period is an "instance": the value reported at a period is that period's own score,
    not the running one (the test needs paired, per-instance values).
    """

    kind: Literal["wilcoxon"] = "wilcoxon"
    p_threshold: float = Field(default=0.1, gt=0.0, le=1.0)
    n_startup_steps: int = Field(default=2, ge=0)


PrunerSpec = Annotated[
    NoPrunerSpec | MedianPrunerSpec | SuccessiveHalvingPrunerSpec | WilcoxonPrunerSpec,
    Field(discriminator="kind"),
]
PRUNER_KINDS = ("none", "median", "successive_halving", "wilcoxon")


class TuningSpec(StrictTable):
    """The `[tuning]` table."""

    parameters: dict[str, ParameterSpace] = Field(
        description="Search space: a list of values (e.g. the paper's grid) or an integer "
        "range { low, high, step } per parameter."
    )
    trials: int | None = Field(
        default=None,
        ge=1,
        description=f"Finished trials wanted in the study; default: the grid size (grid), "
        f"else {DEFAULT_TRIALS}.",
    )
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    tpe_startup_trials: int = Field(
        default=4, ge=0, description="TPE: random trials before the model is used."
    )
    pruner: PrunerSpec = Field(default_factory=NoPrunerSpec)
    objectives: list[str] = Field(
        default_factory=lambda: ["memory_score"],
        description='"memory_score" or "accuracy" (maximized), optionally followed by "tokens" '
        "(minimized): a multi-objective study with a Pareto front.",
    )
    storage: str | None = Field(
        default=None,
        description=f"Optuna storage URL; default {DEFAULT_STORAGE} (relative to the cwd). "
        "Any RDB URL (postgresql://, mysql://), or journal:PATH for a journal file.",
    )
    create_storage_dir: bool = Field(
        default=False,
        description="Create a missing directory of a sqlite:/// or journal: storage; off, a "
        "missing directory (usually a typo) is refused. The default storage's is always made.",
    )
    heartbeat_grace_s: int = Field(
        default=DEFAULT_HEARTBEAT_GRACE_S,
        ge=2,
        le=86_400,
        description="Database storages: a RUNNING trial without a heartbeat for this many "
        "seconds (its worker was killed or lost) is failed and retried with the same "
        "parameters. Heartbeats are sent every grace/4 s (1 to 60 s).",
    )
    study_name: str | None = Field(default=None, description="Default: the spec's name.")
    load_if_exists: bool = Field(
        default=True, description="Resume (and share) an existing study of that name."
    )
    heldout: Literal["best", "best_and_base", "none"] = Field(
        default="best",
        description="Evaluate the best parameters (and the base policy's) on the held-out users.",
    )
    heldout_max_trials: int = Field(
        default=3, ge=1, description="Multi-objective: Pareto-front trials checked on held-out."
    )

    @model_validator(mode="before")
    @classmethod
    def _pruner_shorthand(cls, data: Any) -> Any:
        # `pruner = "median"` is the short form of `[tuning.pruner] kind = "median"`.
        if isinstance(data, dict) and isinstance(data.get("pruner"), str):
            data = {**data, "pruner": {"kind": data["pruner"]}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TuningSpec:
        if not self.parameters:
            raise ValueError(
                "parameters: name at least one parameter to tune, e.g. update_every = [2, 4, 8]"
            )
        for name, space in self.parameters.items():
            if isinstance(space, IntRange):
                ends = (space.low, space.high)  # checked before the range is listed
            elif space:
                ends = (min(space), max(space))
            else:
                raise ValueError(f"parameters.{name}: give at least one value")
            # A kind's own parameter is checked by its rule when the policy is known
            # (`resolve_tuning`); the shared ones here, before the range is listed.
            for value in ends if name in PARAMETER_RULES else ():
                if problem := parameter_problem(name, value):
                    raise ValueError(f"parameters.{name}: a value {problem}")
            if isinstance(space, list) and len(set(space)) != len(space):
                raise ValueError(f"parameters.{name}: a value is listed twice: {space}")
        if not 1 <= len(self.objectives) <= 2 or self.objectives[0] not in OBJECTIVES:
            choices = " or ".join(f'["{name}"]' for name in OBJECTIVES)
            raise ValueError(
                f'objectives must be {choices}, optionally followed by "{COST_OBJECTIVE}", '
                f"got {self.objectives}"
            )
        if len(self.objectives) == 2 and self.objectives[1] != COST_OBJECTIVE:
            raise ValueError(
                f'the second objective can only be "{COST_OBJECTIVE}" (minimized), '
                f"got {self.objectives[1]!r}"
            )
        if self.sampler == "grid" and self.trials is not None and self.trials > self.grid_size():
            raise ValueError(
                f"trials = {self.trials} exceeds the {self.grid_size()} points of the grid; "
                'lower trials (or leave it out: the whole grid) or use sampler = "tpe"'
            )
        return self

    def values(self, name: str) -> list[int]:
        space = self.parameters[name]
        return space.values() if isinstance(space, IntRange) else list(space)

    def grid(self) -> dict[str, list[int]]:
        return {name: self.values(name) for name in self.parameters}

    def grid_size(self) -> int:
        size = 1
        for values in self.grid().values():
            size *= len(values)
        return size

    def requested_trials(self) -> int:
        if self.trials is not None:
            return self.trials
        return self.grid_size() if self.sampler == "grid" else DEFAULT_TRIALS

    @property
    def objective(self) -> str:
        return self.objectives[0]

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) == 2


class StudySpec(RunSpec):
    """A tuning study's spec file (`evolve tune`): a run spec plus the `[tuning]` table."""

    tuning: TuningSpec

    def study_name(self) -> str:
        return self.tuning.study_name or self.name

    def storage_url(self) -> str:
        return self.tuning.storage or DEFAULT_STORAGE

    def as_experiment(self) -> ExperimentSpec:
        """The experiment spec with the same environment, episode and policy (no optimizer)."""
        experiment = ExperimentSpec(
            name=self.name,
            description=self.description,
            seed=self.seed,
            protocol=self.protocol,
            concurrency=self.concurrency,
            environment=self.environment,
            episode=self.episode,
            policy=self.policy,
            # Nothing to mutate: `resolve` then checks no component against the policy.
            optimizer=OptimizerSpec(mutate_components=[], feedback="none"),
            budget=self.budget,
            tracking=self.tracking,
            llm=self.llm,
        )
        experiment._source = self._source
        return experiment


def load_study_spec(path: str | Path) -> StudySpec:
    """Read and validate a TOML study spec; errors name the file and the key path."""
    path = Path(path)
    data = read_toml(path, "study spec", "experiments/tune_quick.toml")
    if "tuning" not in data and "optimizer" in data:
        raise ConfigError(
            f"{path} is an evolution spec ([optimizer], no [tuning] table); run it with "
            "`evolve run`, or add a [tuning] table (see experiments/tune_quick.toml)"
        )
    return study_spec_from_dict(data, source=path)


def study_spec_from_dict(data: dict[str, Any], source: Path | None = None) -> StudySpec:
    label = str(source) if source is not None else "study spec"
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError(
            format_validation_error(
                label, error, StudySpec, rule=_tuning_error_rule, extra_tags=PRUNER_KINDS
            )
        ) from None
    spec._source = source.resolve() if source is not None else None
    return spec


def is_study_spec(path: str | Path) -> bool:
    """Whether a TOML file is a study spec: it has a `[tuning]` table (for commands that accept
    both kinds)."""
    try:
        return "tuning" in read_toml_file(path, "spec")
    except ToolkitError:
        return False


_SPACE_EXPECTED = (
    "expected a list of integers (e.g. [2, 4, 8]) or a range table { low = 1, high = 8, step = 1 }"
)


def _tuning_error_rule(detail: Mapping[str, Any], loc: tuple[Any, ...]) -> str | None:
    """The search space and the pruner: what the generic rules cannot say well."""
    where = ".".join(map(str, loc))
    in_space = len(loc) >= 3 and loc[:2] == ("tuning", "parameters")
    if in_space and not isinstance(detail.get("input"), dict) and len(loc) == 3:
        # A parameter's value is a list or a range table; pydantic reports both failures.
        return f"{where}: {_SPACE_EXPECTED} (got {detail.get('input')!r})"
    if in_space and any(isinstance(p, str) and p.startswith("list[") for p in detail["loc"]):
        return SKIP  # the range-table alternative says what is wrong with the table
    if in_space and detail["type"] not in ("extra_forbidden", "missing"):
        return value_problem(where, detail)  # the table's own check (e.g. step) says it best
    if detail["type"] == "extra_forbidden":
        table = f"[{'.'.join(map(str, loc[:-1]))}]"
        if in_space:
            return (
                f"{where}: unknown key in {table}; valid keys: {', '.join(IntRange.model_fields)}"
            )
        if len(loc) == 3 and loc[:2] == ("tuning", "pruner"):
            return (
                f"{where}: unknown key in {table}; valid keys: kind and the options of that "
                "pruner (see evolve/tuning/spec.py)"
            )
    if detail["type"] == "union_tag_invalid":
        return f"{where}: kind must be one of {', '.join(PRUNER_KINDS)}"
    return None


# ----- resolution --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedTuning:
    """A validated study spec with its environment split and base policy built."""

    spec: StudySpec
    experiment: ResolvedExperiment
    space: dict[str, list[int]]
    trials: int
    study_name: str
    storage_url: str
    notes: list[str] = field(default_factory=list)

    @property
    def base_parameters(self) -> dict[str, int]:
        return dict(self.experiment.base_policy.parameters())


def resolve_tuning(
    spec: StudySpec,
    *,
    trials: int | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    create_storage_dir: bool = False,
) -> ResolvedTuning:
    """Load/synthesize the environment, split users, build the base policy, check the space.

    `trials`, `storage` and `study_name` override the spec (the command's flags). The
    directory of a sqlite or journal storage must exist, unless `create_storage_dir` (or the
    spec's `create_storage_dir`) asks for it, or the storage is the default one.
    """
    label = str(spec.source) if spec.source is not None else "study spec"
    experiment = resolve(spec.as_experiment())
    policy = experiment.base_policy
    tuning = spec.tuning
    rules = policy.parameter_table()
    for name, space in tuning.parameters.items():
        if name not in rules:
            raise ConfigError(
                f"{label}: tuning.parameters.{name}: not a parameter of a '{policy.kind}' policy; "
                f"valid: {list(rules) or 'none'}"
            )
        ends = (space.low, space.high) if isinstance(space, IntRange) else (min(space), max(space))
        for value in ends:
            if problem := parameter_problem(name, value, rules[name]):
                raise ConfigError(f"{label}: tuning.parameters.{name}: a value {problem}")
    requested = trials if trials is not None else tuning.requested_trials()
    if requested < 1:
        raise ConfigError(f"{label}: the number of trials must be at least 1, got {requested}")
    if tuning.sampler == "grid" and requested > tuning.grid_size():
        raise ConfigError(
            f"{label}: {requested} trials exceed the {tuning.grid_size()} points of the grid; "
            "ask for fewer trials or use the tpe sampler"
        )
    notes: list[str] = []
    if tuning.multi_objective and tuning.pruner.kind != "none":
        notes.append(
            f"pruner '{tuning.pruner.kind}' is ignored: Optuna does not prune multi-objective "
            f"studies (objectives {tuning.objectives}); every trial runs to the end"
        )
    if tuning.multi_objective and _cache_on(spec.llm):
        notes.append(
            "the tokens objective counts LLM calls actually made; responses served from the "
            "DSPy cache count 0 tokens, so set cache = false in [llm] (or --no-llm-cache) for a "
            "fair cost comparison"
        )
    storage_url = storage or spec.storage_url()
    # The default location is the toolkit's choice (as mlruns/ for MLflow): made when missing.
    # The default written out explicitly is still the default (same file, same rule).
    chosen_by_user = normalize_storage_url(storage_url) != normalize_storage_url(DEFAULT_STORAGE)
    create = create_storage_dir or spec.tuning.create_storage_dir or not chosen_by_user
    name = study_name or spec.study_name()
    problem = folder_name_problem(name)
    if problem:
        where = "--study-name" if study_name else "[tuning] study_name (default: the spec's name)"
        raise ConfigError(f"{label}: {where}: the study name {problem}; it names trial folders")
    try:
        check_storage_url(storage_url)
        prepare_storage_directory(storage_url, create=create)
    except ConfigError as error:
        raise ConfigError(f"{label}: {error}") from None
    space = {name: list(values) for name, values in tuning.grid().items()}
    return ResolvedTuning(
        spec=spec,
        experiment=experiment,
        space=space,
        trials=requested,
        study_name=name,
        storage_url=storage_url,
        notes=notes,
    )


def _cache_on(config: LLMConfig) -> bool:
    endpoints = [config.endpoint_for(role) for role in ("simulator", "agent")]
    return any(
        endpoint.cache if endpoint is not None else config.embedded.cache for endpoint in endpoints
    )


def parameter_slug(parameters: dict[str, int]) -> str:
    """A short, file-system-safe name for a parameter setting (e.g. ue4-stl0)."""
    return "-".join(f"{short_name(name)}{value}" for name, value in sorted(parameters.items()))
