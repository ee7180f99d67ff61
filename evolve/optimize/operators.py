"""Mutation operators: first-class, registered by name.

An operator proposes a child from a parent candidate and a context (feedback records per
component, a seed) and returns a frozen `OperatorProposal`: the changed components, or a
typed reason why there is no valid child. Adding an operator is one file: a class plus a
`register_operator` call (see docs/extending.md); the GEPA adapter
(`evolve.optimize.gepa_adapter`) routes each component GEPA asks to update to the operator
that owns it.

Candidates are GEPA's `dict[str, str]`: text components under their policy names
(`write.types_to_remember`, `use`, ...) and numeric parameters under `param.<name>` with the
integer as text. The reflective operator never sees a `param.` component.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.core.errors import ConfigError
from evolve.optimize.reflect import proposal_feedback

PARAMETER_PREFIX = "param."


def is_parameter(component: str) -> bool:
    return component.startswith(PARAMETER_PREFIX)


def parameter_component(name: str) -> str:
    return f"{PARAMETER_PREFIX}{name}"


def split_candidate(candidate: Mapping[str, str]) -> tuple[dict[str, str], dict[str, int]]:
    """(text components, numeric parameters) of a GEPA candidate."""
    texts = {k: v for k, v in candidate.items() if not is_parameter(k)}
    parameters = {
        k[len(PARAMETER_PREFIX) :]: int(v) for k, v in candidate.items() if is_parameter(k)
    }
    return texts, parameters


class OperatorProposal(BaseModel):
    """What an operator made of one parent: new component texts, or why there are none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    operator: str
    components: dict[str, str] = Field(default_factory=dict, description="Changed ones only.")
    invalid: str | None = Field(default=None, description="Why no valid child was made.")
    parse_failed: bool = False
    seed: int
    detail: dict[str, Any] = Field(default_factory=dict)


class MutationOperator:
    """Narrow base: `owns` says which components it mutates; `propose` mutates them."""

    name: str = ""
    # Whether proposals come from the reflector (left out when feedback = "none").
    reflective: bool = False

    def owns(self, component: str, generation: int = 0) -> bool:
        """Whether this operator mutates `component` in `generation` (first owner wins)."""
        raise NotImplementedError

    def propose(
        self,
        parent: Mapping[str, str],
        components: Sequence[str],
        records: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        seed: int,
    ) -> OperatorProposal:
        raise NotImplementedError

    def observe(self, candidate: Mapping[str, str], score: float) -> None:
        """An evaluated candidate and its score (ask/tell operators learn from it)."""


class ReflectiveOperator(MutationOperator):
    """Our reflector role rewrites a text component from the feedback records of its parent."""

    name = "reflective"
    reflective = True

    def __init__(self, reflector: Any) -> None:
        self.reflector = reflector

    def owns(self, component: str, generation: int = 0) -> bool:
        return not is_parameter(component)

    def propose(self, parent, components, records, *, seed):
        changed: dict[str, str] = {}
        for component in components:
            feedback = proposal_feedback(records.get(component, []))
            proposal = self.reflector.propose(
                component, parent[component], feedback, rollout_id=seed, seed=seed
            )
            if proposal.text is None:
                return OperatorProposal(
                    operator=self.name,
                    invalid=proposal.error,
                    parse_failed=proposal.parse_failed,
                    seed=seed,
                )
            changed[component] = proposal.text
        return OperatorProposal(operator=self.name, components=changed, seed=seed)


class ParameterOperator(MutationOperator):
    """Numeric parameters within bounds, by a `ParameterProposer` (random step or Optuna).

    `proposer_factory` builds a fresh proposer for every proposal, told the whole history
    first: a proposal depends only on (history, seed), so a run killed at any point and
    resumed (history replayed from GEPA's saved adapter state) proposes exactly the same.
    """

    name = "parameter"

    def __init__(self, proposer_factory: Callable[[], Any], bounds: Mapping[str, Any]) -> None:
        self.proposer_factory = proposer_factory
        self.bounds = dict(bounds)
        self.history: list[tuple[dict[str, int], float]] = []

    def owns(self, component: str, generation: int = 0) -> bool:
        return is_parameter(component)

    def propose(self, parent, components, records, *, seed):
        _, parameters = split_candidate(parent)
        proposer = self.proposer_factory()
        for told, score in self.history:
            proposer.observe(told, score)
        child = proposer.propose(parameters, self.bounds, random.Random(seed))
        changed = {
            parameter_component(name): str(int(value))
            for name, value in child.items()
            if parameter_component(name) in parent and int(value) != parameters.get(name)
        }
        if not changed:
            return OperatorProposal(
                operator=self.name, invalid="the bounds allow no other value", seed=seed
            )
        return OperatorProposal(operator=self.name, components=changed, seed=seed)

    def observe(self, candidate, score):
        _, parameters = split_candidate(candidate)
        self.history.append((parameters, float(score)))


class TunedOperator(MutationOperator):
    """Every `every`-th generation, a short Optuna study (`evolve.tuning`) tunes the numeric
    parameters of the parent; its best setting is the child. Other generations: not owned."""

    name = "tuned"

    def __init__(
        self,
        *,
        policy_of: Callable[[Mapping[str, str]], Any],
        environment: Any,
        lms: Any,
        episode: Any,
        work_dir: Any,
        bounds: Mapping[str, Any],
        every: int | None,
        trials: int = 4,
        sampler: str = "tpe",
        objective: str = "memory_score",
        upper_bound: Any = None,
    ) -> None:
        if every is None or every < 1:
            raise ValueError(
                f"the tuned operator runs every tune_every generations: set optimizer.tune_every "
                f"to 1 or more, got {every}"
            )
        self.policy_of, self.environment, self.lms = policy_of, environment, lms
        self.episode, self.work_dir, self.bounds = episode, work_dir, dict(bounds)
        self.every, self.trials, self.sampler = every, trials, sampler
        self.objective, self.upper_bound = objective, upper_bound

    def owns(self, component: str, generation: int = 0) -> bool:
        return is_parameter(component) and generation > 0 and generation % self.every == 0

    def propose(self, parent, components, records, *, seed):
        # Imported here: the Optuna study runner is only needed when this operator runs.
        from evolve.tuning.evolution import tune_best_candidate

        _, parameters = split_candidate(parent)
        outcome = tune_best_candidate(
            self.policy_of(parent),
            self.environment,
            self.lms,
            self.work_dir / f"tuned_{seed}",
            self.episode,
            parameters={k: v for k, v in self.bounds.items() if parameter_component(k) in parent},
            trials=self.trials,
            seed=seed,
            objective=self.objective,
            sampler=self.sampler,
            upper_bound=self.upper_bound,
        )
        best = outcome.best_parameters or {}
        changed = {
            parameter_component(name): str(int(value))
            for name, value in best.items()
            if parameter_component(name) in parent and int(value) != parameters.get(name)
        }
        if not changed:
            return OperatorProposal(
                operator=self.name, invalid="the study found nothing better", seed=seed
            )
        detail = {"best_value": outcome.best_value, "trials": len(outcome.trials)}
        return OperatorProposal(operator=self.name, components=changed, seed=seed, detail=detail)


OperatorFactory = Callable[..., MutationOperator]
# name -> factory. A factory is called with keyword arguments only and takes those it needs
# (`**_` swallows the rest): reflector, proposer_factory, bounds (numeric parameters that may
# mutate), policy_of (GEPA candidate -> policy), environment (train users), lms, episode,
# work_dir, every, trials, sampler (the tune_* keys), objective, upper_bound.
OPERATORS: dict[str, OperatorFactory] = {}
# An operator's own spec check: (the spec's `optimizer` table, the run's `ProtocolRules`) ->
# why this spec cannot use the operator, or None. Run for the operators a spec names, before
# any LLM call (`check_operators`).
OperatorCheck = Callable[[Any, Any], str | None]
OPERATOR_CHECKS: dict[str, OperatorCheck] = {}


def register_operator(
    name: str, factory: OperatorFactory, *, check: OperatorCheck | None = None
) -> None:
    """Make an operator available by name (`optimizer.operators` in a spec), with the check
    of what it needs from the spec, if any. A plugin module calls it when imported;
    `MEMORY_POLICIES_PLUGINS` imports such modules before a spec's policy is built, so
    `evolve run` knows their operators too."""
    OPERATORS[name] = factory
    if check is None:
        OPERATOR_CHECKS.pop(name, None)
    else:
        OPERATOR_CHECKS[name] = check


def check_operator_names(names: Sequence[str] | None) -> None:
    """Refuse names no operator is registered under (before any LLM call)."""
    unknown = [name for name in names or () if name not in OPERATORS]
    if unknown:
        raise ConfigError(
            f"unknown mutation operator {unknown[0]!r} in optimizer.operators; registered: "
            f"{', '.join(sorted(OPERATORS))} (a plugin registers more with register_operator)"
        )


def check_operators(optimizer: Any, rules: Any, *, label: str) -> None:
    """Refuse operator names nothing registered, then ask each named operator's own check
    whether the spec (`optimizer`, under the protocol's `rules`) gives it what it needs."""
    check_operator_names(optimizer.operators)
    for name in optimizer.operators or ():
        check = OPERATOR_CHECKS.get(name)
        problem = check(optimizer, rules) if check is not None else None
        if problem:
            raise ConfigError(f"{label}: optimizer.operators: {problem}")


def build_operator(name: str, **context: Any) -> MutationOperator:
    check_operator_names([name])
    return OPERATORS[name](**context)


register_operator("reflective", lambda *, reflector, **_: ReflectiveOperator(reflector))
register_operator(
    "parameter",
    lambda *, proposer_factory, bounds, **_: ParameterOperator(proposer_factory, bounds),
)
_TUNED_CONTEXT = (
    "policy_of",
    "environment",
    "lms",
    "episode",
    "work_dir",
    "bounds",
    "every",
    "trials",
    "sampler",
    "objective",
    "upper_bound",
)


def _tuned_check(optimizer: Any, rules: Any) -> str | None:
    if optimizer.tune_every is None:
        return "tuned runs every tune_every generations: set tune_every (e.g. 2) or remove tuned"
    return None


register_operator(
    "tuned",
    lambda **context: TunedOperator(**{k: context[k] for k in _TUNED_CONTEXT if k in context}),
    check=_tuned_check,
)
