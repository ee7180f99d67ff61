"""The experiment spec: one TOML file under `experiments/` describes a whole self-evolution run.

A spec names the environment (a generator preset + seed + user count, or a `data.json` file)
split into disjoint train and held-out users, the base policy, the LM per role (an `[llm]`
table parsed into `evolve.llm.LLMConfig`), the optimizer, the budget, the concurrency, the
seed and the MLflow experiment. Every table forbids unknown keys; what can only be checked
against the environment and the policy is checked by `evolve.spec.config.resolve` before the
first call. See `experiments/quickstart.toml` for an annotated example.

Paths inside a spec (`environment.file`, `policy.path`) are relative to the spec file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from evolve.core.errors import ConfigError
from evolve.core.files import folder_name_problem, read_toml_file
from evolve.core.protocol import DEFAULT_PROTOCOL, DEFAULT_RULES, Protocol, RulesField, with_rules
from evolve.core.spec_base import IntRange, format_validation_error, refuse_renamed_keys
from evolve.core.spec_base import StrictTable as _Strict
from evolve.feedback import BUILTIN_KINDS, feedback_kind
from evolve.llm.config import LLMConfig
from evolve.results.objective import Objective
from evolve.simulator.evaluation import ProbeScope, probe_scope_problem
from evolve.stores.mlflow_limits import description_problem, experiment_name_problem
from evolve.stores.registered_names import registered_model_name_problem
from evolve.stores.tracking_uri import DEFAULT_TRACKING_URI, resolve_tracking_uri

ScheduleName = Literal["population", "per_period"]
# The feedback kinds a spec accepts are those registered (evolve.feedback): built-in are
# complete / question_only (the paper's, no ground truth), diagnostic (ours, with the truth),
# blind (no feedback: the selection-on-noise control) and none (no evolution); a plugin module
# registers more. The JSON schema lists the built-in ones.


def known_kind(name: str) -> str:
    feedback_kind(name)  # raises ValueError naming the registered kinds
    return name


FeedbackKind = Annotated[
    str, WithJsonSchema({"type": "string", "enum": list(BUILTIN_KINDS)}), AfterValidator(known_kind)
]

# An experiment's MLflow experiment unless `[tracking] experiment_name` names one.
MLFLOW_EXPERIMENT_PREFIX = "amemgym-evolve/"


class EnvironmentSpec(_Strict):
    """Where the users come from and how they are split."""

    preset: str | None = Field(default=None, description="Generator preset: tiny, v1.base, ...")
    file: Path | None = Field(default=None, description="An environment in data.json format.")
    seed: int = Field(default=0, description="Generator seed (preset only).")
    users: int | None = Field(
        default=None,
        ge=1,
        description="Users to synthesize (preset only); default train + validation + held-out.",
    )
    train_users: int | list[str] = Field(
        default=2, description="The first N users, or a list of user ids."
    )
    validation_users: int | list[str] = Field(
        default=0,
        description="The next N users after the train users (or a list of ids): GEPA's "
        "valset, on which the best is chosen; 0: the train users choose (no validation split).",
    )
    heldout_users: int | list[str] = Field(
        default=1,
        description="The next N users after the train and validation users (or a list of "
        "ids): the test, scored only to report (never to choose); 0 only "
        'for schedule = "per_period" (the paper\'s per-user chains need no held-out users).',
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentSpec:
        if (self.preset is None) == (self.file is None):
            raise ValueError(
                "give exactly one of 'preset' (e.g. preset = \"tiny\") or 'file' "
                '(e.g. file = "data/env.json")'
            )
        if self.file is not None and {"seed", "users"} & self.model_fields_set:
            raise ValueError("'seed' and 'users' only apply to a generator 'preset', not 'file'")
        for name in ("train_users", "validation_users", "heldout_users"):
            value = getattr(self, name)
            minimum = 0 if name != "train_users" else 1
            if isinstance(value, int) and value < minimum:
                raise ValueError(f"'{name}' must be at least {minimum}, got {value}")
            if isinstance(value, list) and not value:
                raise ValueError(f"'{name}' must list at least one user id")
            if isinstance(value, list) and len(set(value)) != len(value):
                raise ValueError(f"'{name}' lists a user id twice: {value}")
        return self


class EpisodeSpec(_Strict):
    """Episode settings; unset rounds come from the preset, for a data file from the protocol
    (paper: 1 then 2, as the published v1.base; evolve: 1 and 1)."""

    rounds_initial: int | None = Field(default=None, ge=1)
    rounds_update: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, description="Simulated-user seed; default: `seed`.")
    probes: ProbeScope = Field(
        default="all",
        description="wrong_only: probe only the variables of wrongly answered items (fewer "
        "calls; protocol evolve only, the original's diagnosis needs every probe).",
    )


class PolicySpec(_Strict):
    """The base policy: a kind with parameters/components, or a saved bundle."""

    kind: str | None = None
    path: Path | None = None
    # The policy's information flow; unset follows the spec's protocol (a bundle keeps its own).
    variant: Protocol | None = Field(
        default=None,
        description="Policy variant (paper or evolve); unset: the protocol's (paper under "
        "protocol paper, else the kind's own).",
    )
    parameters: dict[str, int] = Field(default_factory=dict)
    components: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: object) -> object:
        return refuse_renamed_keys(data, {"preset": "variant"})

    @model_validator(mode="after")
    def _one_source(self) -> PolicySpec:
        if (self.kind is None) == (self.path is None):
            raise ValueError(
                "give exactly one of 'kind' (e.g. kind = \"in_context\") or 'path' (a bundle)"
            )
        if self.path is not None and (self.parameters or self.components or self.variant):
            raise ValueError(
                "a bundle 'path' takes no 'parameters', 'components' or 'variant' (the bundle "
                "records its own)"
            )
        return self


# Keys of the hand-written population loop that GEPA replaced, with what to write instead.
RETIRED_OPTIMIZER_KEYS = {
    "candidates_per_generation": "each generation (GEPA iteration) proposes one candidate; "
    "raise `generations` instead",
    "population_size": "GEPA keeps every accepted candidate; choose parents with "
    "`candidate_selection`",
    "selection": "use `candidate_selection` (pareto, current_best, epsilon_greedy, top_k_pareto)",
    "parameter_mutation_rate": "components (text and numeric) are mutated in turn; use "
    "`module_selector` (round_robin or all)",
}


class OptimizerSpec(_Strict):
    """How candidates are proposed, evaluated and selected (see `evolve.optimize`)."""

    schedule: ScheduleName = Field(
        default="population",
        description="population: generations of candidates over whole episodes; per_period: "
        "the paper's single chain, one mutation after each period of the train run.",
    )
    generations: int = Field(
        default=3,
        ge=0,
        description="GEPA iterations; each proposes (at most) one candidate. More than 100 "
        "need a [budget] limit.",
    )
    candidate_selection: Literal["pareto", "current_best", "epsilon_greedy", "top_k_pareto"] = (
        Field(
            default="pareto",
            description="How GEPA picks the parent: pareto = the per-user front over train users.",
        )
    )
    use_merge: bool = Field(default=False, description="GEPA merge proposals between lineages.")
    reflection_minibatch_size: int = Field(
        default=3, ge=1, description="Train users a child is first tried on (GEPA minibatch)."
    )
    acceptance: Literal["strict_improvement", "improvement_or_equal"] = Field(
        default="strict_improvement",
        description="A child joins the pool if its minibatch score beats (or equals) the parent's.",
    )
    module_selector: Literal["round_robin", "all"] = Field(
        default="round_robin",
        description="Which components a generation mutates: one in turn, or all at once.",
    )
    max_metric_calls: int | None = Field(
        default=None,
        ge=1,
        description="GEPA's budget of user evaluations; None: enough for `generations`.",
    )
    objective: Objective = "memory_score"
    feedback: FeedbackKind = Field(
        default="diagnostic",
        description="What the reflector is shown: complete / question_only (the paper's, no "
        "ground truth), diagnostic (ours: failures with the truth), blind (the control: the "
        "same reflective proposals and acceptance with no feedback, so a gain it also makes is "
        "selection on noise), none (no reflective proposal).",
    )
    operators: list[str] | None = Field(
        default=None,
        description="Mutation operators in ownership order (the first that owns a component "
        "mutates it), by registered name: reflective (free-text rewrite), list_edit (the "
        "reflector names list items to add or remove; for small models), parameter, tuned. "
        "None: tuned (with tune_every), parameter (with [optimizer.parameters]), reflective.",
    )
    mutate_components: list[str] = Field(
        default_factory=lambda: ["write.types_to_remember"],
        description="Policy components the reflector may rewrite.",
    )
    parameters: dict[str, IntRange] = Field(
        default_factory=dict, description="Numeric parameters that may mutate, with bounds."
    )
    max_feedback_failures: int = Field(default=4, ge=1, description="Failures shown per proposal.")
    max_feedback_chars: int = Field(
        default=1600,
        ge=200,
        description='Feedback length cap. Unset under protocol = "paper": the per-period '
        "chain's feedback is not cut (the reference's is not).",
    )
    max_instruction_chars: int = Field(default=1200, ge=50)
    reflector_temperature: float = Field(
        default=0.7,
        ge=0.0,
        le=2.0,
        description='Unset under protocol = "paper": 0, as the paper (the agent\'s own model).',
    )
    proposal_attempts: int = Field(
        default=2,
        ge=1,
        description="per_period: reflector tries per step when its output is unusable.",
    )
    heldout: Literal["every_generation", "final"] = Field(
        default="every_generation",
        description="Evaluate each generation's best on the held-out users, or only the "
        "base and the final best.",
    )
    parameter_proposer: Literal["random", "optuna"] = Field(
        default="random",
        description="Who proposes parameter mutations: random = a seeded step of +-1..2 in one "
        "parameter; optuna = an Optuna TPE sampler over `parameters` (ask/tell), told every "
        "evaluated candidate's train score, so later proposals follow what scored well.",
    )
    tune_every: int | None = Field(
        default=None,
        ge=1,
        description="After every N-th generation, run a short Optuna study over `parameters` "
        "on that generation's best candidate; a better setting becomes a 'tuned' candidate "
        "(parent: that candidate) that is evaluated and competes in selection. None: never.",
    )
    tune_trials: int = Field(
        default=4, ge=1, description="Trials of each tune_every study (each a train evaluation)."
    )
    tune_sampler: Literal["tpe", "random", "grid"] = Field(
        default="tpe", description="Sampler of each tune_every study."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_retired_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, replacement in RETIRED_OPTIMIZER_KEYS.items():
                if key in data:
                    raise ValueError(f"'{key}' no longer applies (GEPA engine): {replacement}")
        return data

    @model_validator(mode="after")
    def _schedule_fits(self) -> OptimizerSpec:
        if self.schedule == "per_period":
            misplaced = sorted(
                {
                    "generations",
                    "candidate_selection",
                    "use_merge",
                    "reflection_minibatch_size",
                    "acceptance",
                    "module_selector",
                    "max_metric_calls",
                    "parameters",
                    "parameter_proposer",
                    "tune_every",
                    "tune_trials",
                    "tune_sampler",
                }
                & self.model_fields_set
            )
            if misplaced:
                raise ValueError(
                    f'{misplaced} do not apply to schedule = "per_period" (one chain, one '
                    "instruction mutation after each period); remove them or use schedule = "
                    '"population"'
                )
        tunable = [name for name, bounds in self.parameters.items() if bounds.low < bounds.high]
        if self.tune_every is not None and not tunable:
            raise ValueError(
                f"tune_every = {self.tune_every} tunes numeric parameters, but "
                "[optimizer.parameters] has none with low < high; add one (e.g. update_every = "
                "{ low = 1, high = 8 }) or remove tune_every"
            )
        if self.parameter_proposer == "optuna" and not tunable:
            raise ValueError(
                'parameter_proposer = "optuna" proposes numeric parameters, but '
                "[optimizer.parameters] has none with low < high; add one (e.g. update_every = "
                "{ low = 1, high = 8 }) or remove parameter_proposer"
            )
        if self.operators is not None and (
            not self.operators or len(set(self.operators)) != len(self.operators)
        ):
            raise ValueError(
                f"'operators' must name each operator once and at least one, got {self.operators}"
            )
        if len(set(self.mutate_components)) != len(self.mutate_components):
            raise ValueError(
                f"'mutate_components' lists a component twice: {self.mutate_components}"
            )
        return self

    def reflective_enabled(self) -> bool:
        return feedback_kind(self.feedback).proposes and bool(self.mutate_components)

    def tunable_parameters(self) -> list[str]:
        """Numeric parameters a mutation can change (low < high)."""
        return [name for name, bounds in self.parameters.items() if bounds.low < bounds.high]


# More generations than this need a [budget]: each generation is a train evaluation (an hour
# or more on the bundled model), so a larger number is a typo or a run with no end.
GENERATIONS_WITHOUT_BUDGET = 100


class BudgetSpec(_Strict):
    """Limits over the whole experiment (cumulated across resumed invocations).

    LLM calls count requests sent to an endpoint, each retry its own and those whose outcome
    a kill left unknown included (DSPy cache hits are free); the loop
    checks before each unit of work and at every period barrier of an evaluation, and stops
    cleanly, keeping everything finished. Raise a limit and rerun to continue.
    """

    max_llm_calls: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_wall_time_s: float | None = Field(default=None, gt=0)


class TrackingSpec(_Strict):
    enabled: bool = True
    experiment_name: str | None = Field(
        default=None, description="MLflow experiment; default 'amemgym-evolve/<name>'."
    )
    tracking_uri: str | None = Field(
        default=None,
        description="Overridden by --tracking-uri; when unset, MLFLOW_TRACKING_URI, else "
        f"{DEFAULT_TRACKING_URI} (relative to the cwd).",
    )
    registered_model: str | None = Field(
        default=None, description="Model-registry name for `evolve export`; default '<name>'."
    )

    @field_validator("registered_model")
    @classmethod
    def _registrable(cls, value: str | None) -> str | None:
        problem = None if value is None else registered_model_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    traces: Literal["none", "heldout", "all"] = Field(
        default="none",
        description="MLflow traces of evaluations (one per user episode: its periods, sessions, "
        "memory at each checkpoint, questions): none, held-out evaluations only, or all.",
    )

    @field_validator("experiment_name")
    @classmethod
    def _mlflow_experiment_name(cls, value: str | None) -> str | None:
        problem = None if value is None else experiment_name_problem(value)
        if problem:
            raise ValueError(f"the MLflow experiment name {problem}; choose a shorter name")
        return value


class RunSpec(_Strict):
    """What every spec file shares (`evolve run` and `evolve tune`): the environment and its
    users, the policy, the episodes, the LMs, budget, tracking and seeds."""

    name: str = Field(description="Results go to runs/<name>/.")
    description: str = ""
    seed: int = 0
    protocol: Protocol = Field(
        default=DEFAULT_PROTOCOL,
        description="'paper': the reference AMemGym code's information flow (comparable with "
        "published numbers); 'evolve': this toolkit's (see the table of docs/protocols.md).",
    )
    concurrency: int = Field(
        default=0,
        ge=0,
        description="LLM calls in flight (users, questions, probes). Unset or 0: the embedded "
        "server's slot count when it serves a role, else 2.",
    )
    environment: EnvironmentSpec
    episode: EpisodeSpec = EpisodeSpec()
    policy: PolicySpec
    budget: BudgetSpec = BudgetSpec()
    tracking: TrackingSpec = TrackingSpec()
    llm: LLMConfig = LLMConfig()

    # What `protocol` decides, resolved from the name when the spec is read; not a key of
    # the spec file.
    rules: RulesField = Field(default=DEFAULT_RULES, exclude=True, repr=False)

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _rules_of_protocol(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rules" in data:
            raise ValueError("unknown key 'rules' at the top level; the protocol is 'protocol'")
        return with_rules(data)

    @model_validator(mode="after")
    def _default_concurrency(self) -> RunSpec:
        if self.concurrency == 0:
            # More calls in flight than slots would only queue at the server; fewer would
            # leave slots idle.
            default = self.llm.embedded.slots if self.llm.needs_embedded_server() else 2
            object.__setattr__(self, "concurrency", default)  # frozen model: set once, here
        return self

    @model_validator(mode="after")
    def _probes_for_protocol(self) -> RunSpec:
        problem = probe_scope_problem(self.rules, self.episode.probes)
        if problem:
            raise ValueError(f"episode.probes: {problem}")
        return self

    @field_validator("description")
    @classmethod
    def _mlflow_description(cls, value: str) -> str:
        problem = description_problem(value)
        if problem:
            raise ValueError(
                f"the description {problem}; shorten it (put long notes in a file next to the spec)"
            )
        return value

    @model_validator(mode="after")
    def _valid_name(self) -> RunSpec:
        problem = folder_name_problem(self.name)
        if problem:
            raise ValueError(f"name {problem} (it names the directory runs/<name>/)")
        return self

    @property
    def source(self) -> Path | None:
        """The spec file this spec was loaded from, if any."""
        return self._source

    @property
    def base_dir(self) -> Path:
        return self._source.parent if self._source is not None else Path.cwd()

    def mlflow_experiment_name(self) -> str:
        return self.tracking.experiment_name or f"{MLFLOW_EXPERIMENT_PREFIX}{self.name}"

    def registered_model_name(self) -> str:
        return self.tracking.registered_model or self.name

    def tracking_uri(self) -> str:
        """This spec's tracking URI: [tracking] tracking_uri, else MLFLOW_TRACKING_URI, else
        the default (a command's --tracking-uri overrides all: `resolve_tracking_uri`)."""
        return resolve_tracking_uri(None, self.tracking.tracking_uri).uri


class ExperimentSpec(RunSpec):
    """An evolution experiment (`evolve run`): a run spec plus the optimizer."""

    optimizer: OptimizerSpec = OptimizerSpec()

    @model_validator(mode="after")
    def _bounded(self) -> ExperimentSpec:
        budget = self.budget
        unbounded = all(
            limit is None
            for limit in (budget.max_llm_calls, budget.max_tokens, budget.max_wall_time_s)
        )
        if unbounded and self.optimizer.generations > GENERATIONS_WITHOUT_BUDGET:
            raise ValueError(
                f"optimizer.generations = {self.optimizer.generations} with no [budget]: on a "
                f"local model that runs for weeks; set a limit in [budget] (max_llm_calls, "
                f"max_tokens or max_wall_time_s: the run stops cleanly there and a rerun with "
                f"a higher one continues), or at most {GENERATIONS_WITHOUT_BUDGET} generations"
            )
        return self

    def identity(self) -> dict[str, Any]:
        """What results depend on: the resume guard hashes this.

        Budget, concurrency, tracking, the LLM endpoints (the models actually used are added
        by the loop) and the number of generations are left out, so a run can be continued
        with a larger budget or more generations.
        """
        # Defaults are left out so that adding an option (with a default) to the spec format
        # does not make every earlier experiment directory refuse to resume.
        data = self.model_dump(
            mode="json",
            exclude={"budget", "concurrency", "tracking", "llm", "description"},
            exclude_defaults=True,
        )
        data["protocol"] = self.protocol  # always: results differ by protocol
        policy = data.get("policy", {})
        if "variant" in policy:
            # Hashed under its old name "preset": renaming the key must not make earlier
            # experiment directories refuse to resume.
            policy["preset"] = policy.pop("variant")
        optimizer = data.pop("optimizer", {})
        optimizer.pop("generations", None)
        if optimizer:
            data["optimizer"] = optimizer
        return data


def read_toml(path: Path, what: str, example: str) -> dict[str, Any]:
    """A spec file's TOML table; errors name the file and say what to pass instead."""
    return read_toml_file(path, what, missing_hint=f"pass a TOML file such as {example}")


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a TOML experiment spec; errors name the file and the key path."""
    path = Path(path)
    data = read_toml(path, "experiment spec", "experiments/quickstart.toml")
    return spec_from_dict(data, source=path)


def spec_from_dict(data: dict[str, Any], source: Path | None = None) -> ExperimentSpec:
    label = str(source) if source is not None else "experiment spec"
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(label, error, ExperimentSpec)) from None
    spec._source = source.resolve() if source is not None else None
    return spec
