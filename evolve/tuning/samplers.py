"""Samplers and pruners built from a study spec, and the grid queue, safe for several workers.

- Grid: every point once, in a seeded order, through Optuna's trial queue
  (`enqueue_grid_points` -> `study.enqueue_trial`); the worker pops queued trials, so
  concurrent workers never take the same point, and a point whose trial failed is queued
  again. Optuna's `GridSampler` is not used: it may evaluate a point twice when workers race.
- `TrialSeededSampler`: TPE or random sampling seeded per trial number. A sampler seeded
  once per process would make two workers started with the same spec propose the same
  parameters; keyed on the trial number, a single worker is reproducible and concurrent
  workers differ.
"""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from evolve.core.seeds import derive_seed
from evolve.tuning.records import GRID_POINT_ATTR
from evolve.tuning.spec import IntRange, TuningSpec

_HOLDING = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)

PointKey = tuple[tuple[str, int], ...]


def distributions(tuning: TuningSpec) -> dict[str, BaseDistribution]:
    """Optuna distributions of the search space (lists are categorical, ranges integer)."""
    result: dict[str, BaseDistribution] = {}
    for name, space in tuning.parameters.items():
        if isinstance(space, IntRange):
            result[name] = IntDistribution(space.low, space.high, step=space.step)
        else:
            result[name] = CategoricalDistribution(tuple(space))
    return result


def grid_order(space: Mapping[str, Sequence[int]], seed: int) -> list[dict[str, int]]:
    """Every point of the grid once, in a seeded order that spreads early trials over it."""
    names = list(space)
    points = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*space.values())
    ]
    random.Random(seed).shuffle(points)
    return points


def point_key(point: Mapping[str, Any]) -> PointKey:
    return tuple(sorted((name, int(value)) for name, value in point.items()))


def trial_point_key(trial: FrozenTrial) -> PointKey | None:
    """The grid point a trial holds: queued for it, or evaluated (a trial of another sampler)."""
    point = trial.user_attrs.get(GRID_POINT_ATTR)
    if point is not None:
        return point_key(point)
    return point_key(trial.params) if trial.params else None


def enqueue_grid_points(
    study: optuna.Study, space: Mapping[str, Sequence[int]], seed: int, requested: int
) -> int:
    """Queue grid points, in the seeded order, that no finished, running or queued trial holds,
    until those trials number `requested`; returns how many were queued.

    Two workers calling this at once may queue a point twice (Optuna's queue has no
    uniqueness); the worker discards the later copy before evaluating it.
    """
    holding = study.get_trials(deepcopy=False, states=_HOLDING)
    held = {trial_point_key(t) for t in holding}
    missing = requested - len(holding)
    queued = 0
    for point in grid_order(space, seed):
        if queued >= missing:
            break
        if point_key(point) in held:
            continue
        study.enqueue_trial(point, user_attrs={GRID_POINT_ATTR: point})
        queued += 1
    return queued


class TrialSeededSampler(BaseSampler):
    """Delegates each trial to a fresh sampler seeded from (seed, trial number).

    TPE and random sampling keep no state between trials but their random generator (TPE
    reads the history from the storage), so a fresh instance per trial loses nothing.
    """

    def __init__(self, factory: Callable[[int], BaseSampler], seed: int) -> None:
        self._factory = factory
        self._seed = seed
        self._by_trial: dict[int, BaseSampler] = {}

    def _for(self, trial: FrozenTrial) -> BaseSampler:
        sampler = self._by_trial.get(trial.number)
        if sampler is None:
            sampler = self._factory(derive_seed(self._seed, "trial", trial.number))
            self._by_trial[trial.number] = sampler
        return sampler

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        sampler = self._by_trial.pop(trial.number, None) or self._factory(self._seed)
        sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Seeds derive from trial numbers; nothing to reseed."""


def build_sampler(tuning: TuningSpec, seed: int) -> BaseSampler:
    if tuning.sampler == "grid":
        # Grid trials come from the queue (`enqueue_grid_points`) with fixed parameters; a
        # trial this sampler would fill is discarded before evaluation.
        return optuna.samplers.RandomSampler(seed=seed)
    if tuning.sampler == "random":
        return TrialSeededSampler(lambda s: optuna.samplers.RandomSampler(seed=s), seed)
    startup = tuning.tpe_startup_trials
    return TrialSeededSampler(
        lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=startup), seed
    )


def build_pruner(tuning: TuningSpec) -> optuna.pruners.BasePruner:
    spec = tuning.pruner
    if tuning.multi_objective or spec.kind == "none":
        return optuna.pruners.NopPruner()
    if spec.kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=spec.n_startup_trials,
            n_warmup_steps=spec.n_warmup_steps,
            interval_steps=spec.interval_steps,
            n_min_trials=spec.n_min_trials,
        )
    if spec.kind == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=spec.min_resource,
            reduction_factor=spec.reduction_factor,
            min_early_stopping_rate=spec.min_early_stopping_rate,
            bootstrap_count=spec.bootstrap_count,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.pruners.WilcoxonPruner(
            p_threshold=spec.p_threshold, n_startup_steps=spec.n_startup_steps
        )
