"""Samplers and pruners built from a tuning spec, safe for several workers on one study.

- `OrderedGridSampler`: every grid point once, in a seeded order. Unlike Optuna's
  `GridSampler` it retries a point whose trial failed (an interrupted worker), and concurrent
  workers never take the same point: a trial picks the first point not held by any live
  trial with a smaller number, after those trials have picked theirs.
- `TrialSeededSampler`: TPE or random sampling seeded per trial number. A sampler seeded
  once per process would make two workers started with the same spec propose the same
  parameters; keyed on the trial number, a single worker is reproducible and concurrent
  workers differ.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from evolve.simulator.user import derive_seed
from evolve.tuning.spec import IntRange, TuningSpec

GRID_POINT_ATTR = "evolve.grid_point"
# How long a new grid trial waits for older trials (created a moment earlier by another
# worker) to pick their point; a trial that never does is a worker killed in between.
_GRID_WAIT_S = 30.0
_LIVE_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


def distributions(tuning: TuningSpec) -> dict[str, BaseDistribution]:
    """Optuna distributions of the search space (lists are categorical, ranges integer)."""
    result: dict[str, BaseDistribution] = {}
    for name, space in tuning.parameters.items():
        if isinstance(space, IntRange):
            result[name] = IntDistribution(space.low, space.high, step=space.step)
        else:
            result[name] = CategoricalDistribution(tuple(space))
    return result


class OrderedGridSampler(BaseSampler):
    def __init__(self, space: Mapping[str, Sequence[int]], seed: int = 0) -> None:
        import itertools

        self.names = list(space)
        points = [tuple(values) for values in itertools.product(*space.values())]
        random.Random(seed).shuffle(points)  # spread early trials over the whole space
        self.points: list[tuple[int, ...]] = points
        self._assigned: dict[int, int] = {}

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if "fixed_params" in trial.system_attrs:
            return
        held = self._held_by_older_trials(study, trial.number)
        free = [index for index in range(len(self.points)) if index not in held]
        # No free point only happens to a surplus trial of a race (the grid is the limit of
        # trials); it is discarded before evaluation, any point will do.
        index = free[0] if free else 0
        study._storage.set_trial_system_attr(trial._trial_id, GRID_POINT_ATTR, index)
        self._assigned[trial._trial_id] = index

    def _held_by_older_trials(self, study: optuna.Study, number: int) -> set[int]:
        deadline = time.monotonic() + _GRID_WAIT_S
        while True:
            held: set[int] = set()
            pending = 0
            for t in study._storage.get_all_trials(
                study._study_id, deepcopy=False, states=_LIVE_STATES
            ):
                if t.number >= number:
                    continue
                index = self._point_of(t)
                if index is not None:
                    held.add(index)
                elif not t.state.is_finished():
                    pending += 1  # created a moment ago by another worker, no point yet
            if not pending or time.monotonic() > deadline:
                return held
            time.sleep(0.05)

    def _point_of(self, trial: FrozenTrial) -> int | None:
        if GRID_POINT_ATTR in trial.system_attrs:
            return int(trial.system_attrs[GRID_POINT_ATTR])
        # A trial made by another sampler of the same study holds the point it evaluated.
        if set(self.names) <= set(trial.params):
            point = tuple(trial.params[name] for name in self.names)
            if point in self.points:
                return self.points.index(point)
        return None

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        index = self._assigned.get(trial._trial_id)
        if index is None:
            index = int(study._storage.get_trial_system_attrs(trial._trial_id)[GRID_POINT_ATTR])
        value = self.points[index][self.names.index(param_name)]
        if not param_distribution._contains(param_distribution.to_internal_repr(value)):
            raise ValueError(f"grid value {param_name}={value} is outside {param_distribution}")
        return value

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._assigned.pop(trial._trial_id, None)


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
        return OrderedGridSampler(tuning.grid(), seed=seed)
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
