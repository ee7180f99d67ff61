"""The operators a spec names, built once per run for either schedule.

Both schedules mutate through the operator registry (`evolve.optimize.operators`): the
population schedule hands the operators to GEPA's adapter, the per-period chain asks the
first operator that owns the step's component. So an operator added in one file (see
docs/extending.md) works in both.
"""

from __future__ import annotations

from typing import Any

from evolve.optimize.context import EvolutionContext
from evolve.optimize.gepa_adapter import candidate_policy
from evolve.optimize.operators import MutationOperator, build_operator
from evolve.spec.config import ExperimentSpec


def operator_names(spec: ExperimentSpec) -> list[str]:
    """Operators in ownership order (the first that owns a component mutates it):
    `optimizer.operators` when the spec names them, else tuned (its generations only),
    parameter, reflective."""
    optimizer = spec.optimizer
    if optimizer.operators is not None:
        return list(optimizer.operators)
    return [
        *(["tuned"] if optimizer.tune_every is not None else []),
        *(["parameter"] if optimizer.tunable_parameters() else []),
        "reflective",
    ]


# Keyword arguments every operator factory is offered (`build_operators`); a factory takes
# those it needs.
OPERATOR_CONTEXT_KEYS = (
    "reflector",
    "proposer_factory",
    "bounds",
    "policy_of",
    "environment",
    "lms",
    "episode",
    "work_dir",
    "every",
    "trials",
    "sampler",
    "objective",
    "upper_bound",
)


def build_operators(context: EvolutionContext, base_policy: Any) -> list[MutationOperator]:
    """The spec's operators, each built from one shared set of keyword arguments (an
    operator's factory takes what it needs). Operators that call the reflector are left out
    when `feedback = "none"` (no reflective proposal)."""
    optimizer = context.optimizer
    bounds = {name: optimizer.parameters[name] for name in optimizer.tunable_parameters()}
    available = {
        "reflector": context.reflector,
        "proposer_factory": context.proposer_factory,
        "bounds": bounds,
        "policy_of": lambda candidate: candidate_policy(base_policy, candidate),
        "environment": context.resolved.train,
        "lms": context.lms,
        "episode": context.resolved.episode,
        "work_dir": context.experiment_dir.root / "tuning",
        "every": optimizer.tune_every,
        "trials": optimizer.tune_trials,
        "sampler": optimizer.tune_sampler,
        "objective": optimizer.objective,
        "upper_bound": context.upper_bound,
    }
    assert set(available) == set(OPERATOR_CONTEXT_KEYS)
    operators = [build_operator(name, **available) for name in operator_names(context.spec)]
    if not optimizer.reflective_enabled():
        operators = [operator for operator in operators if not operator.reflective]
    return operators


def operators_for_ownership(spec: ExperimentSpec) -> list[MutationOperator]:
    """The spec's operators built without a run (no reflector, LMs or users): enough to ask
    which components they own before anything is opened or called. Never used to propose."""
    empty = {**dict.fromkeys(OPERATOR_CONTEXT_KEYS), "bounds": {}}
    return [build_operator(name, **empty) for name in operator_names(spec)]


def owner_of(
    operators: list[MutationOperator], component: str, generation: int
) -> MutationOperator | None:
    """The operator that mutates `component` in `generation`: the first that owns it."""
    return next((op for op in operators if op.owns(component, generation)), None)
