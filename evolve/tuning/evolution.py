"""Optuna inside the evolution loop: an ask/tell parameter proposer and short tuning studies.

- `OptunaParameterProposer` has the shape of `evolve.optimize.parameters.ParameterProposer`
  (duck-typed: tuning sits below optimize and never imports it): each
  parameter mutation is a trial asked from an Optuna sampler (TPE by default) over the
  configured bounds, and each evaluated candidate's train score is told back (`observe`).
  Candidates the loop loads from disk when resuming are observed in the same order and added
  as finished trials, so the sampler's history is rebuilt without any LLM call.
- `tune_best_candidate` runs a short study (a few trials, pruned per period) over the
  numeric parameters of one policy, e.g. the best candidate every N generations, and returns
  the best parameters with their train score.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState
from pydantic import BaseModel, Field

from evolve.core.spec_base import on_grid
from evolve.llm import RoleLMs
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig
from evolve.spec.config import BudgetSpec
from evolve.tuning.records import TrialRecord
from evolve.tuning.samplers import TrialSeededSampler
from evolve.tuning.spec import IntRange, ParameterSpace, TuningSpec
from evolve.tuning.study import TuneProgress, TuningJob, run_study

# Asks per proposal before giving up on proposing something other than the parent.
_MAX_ASKS = 8


class OptunaParameterProposer:
    """Parameter mutations proposed by an Optuna sampler (ask/tell) within `bounds`.

    The search space is fixed at construction (the loop's `optimizer.parameters`); values of
    observed candidates outside it (e.g. a base policy's default) are not told. A proposal
    equal to the parent is answered with the parent's known score without evaluation and
    the sampler asked again, so the loop rarely gets a duplicate.
    """

    def __init__(
        self,
        bounds: Mapping[str, IntRange],
        *,
        sampler: str = "tpe",
        seed: int = 0,
        startup_trials: int = 4,
        storage: str | None = None,
        study_name: str | None = None,
    ) -> None:
        if sampler not in ("tpe", "random"):
            raise ValueError(f"sampler must be 'tpe' or 'random', got {sampler!r}")
        self.distributions = {
            name: IntDistribution(int(b.low), int(b.high), step=int(b.step))
            for name, b in sorted(bounds.items())
            if b.low < b.high
        }
        self.sampler_kind = sampler
        self.startup_trials = startup_trials
        from evolve.tuning.storage import open_study

        self.study = open_study(
            storage,
            study_name or "evolution-parameters",
            directions=["maximize"],
            sampler=self._sampler(seed),
            pruner=optuna.pruners.NopPruner(),
            load_if_exists=True,
            # Ask/tell without `study.optimize`: no heartbeat (Optuna sends it from there).
            heartbeat_grace_s=None,
        )
        self._pending: list[tuple[tuple[int, ...], optuna.Trial]] = []
        self._scores: dict[tuple[int, ...], float] = {}

    def _sampler(self, seed: int) -> optuna.samplers.BaseSampler:
        if self.sampler_kind == "random":
            return TrialSeededSampler(lambda s: optuna.samplers.RandomSampler(seed=s), seed)
        startup = self.startup_trials
        return TrialSeededSampler(
            lambda s: optuna.samplers.TPESampler(seed=s, n_startup_trials=startup), seed
        )

    def _key(self, values: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(values[name]) for name in self.distributions)

    def propose(
        self, parent: Mapping[str, int], bounds: Mapping[str, IntRange], rng: random.Random
    ) -> dict[str, int]:
        if not self.distributions:
            return dict(parent)
        # Seeded from the loop's per-candidate generator: proposals are reproducible.
        self.study.sampler = self._sampler(rng.getrandbits(31))
        parent_key = self._key(parent) if all(n in parent for n in self.distributions) else None
        child: dict[str, int] = dict(parent)
        for attempt in range(_MAX_ASKS):
            trial = self.study.ask(dict(self.distributions))
            values = {name: int(trial.params[name]) for name in self.distributions}
            key = self._key(values)
            child = {**parent, **values}
            if key != parent_key or attempt == _MAX_ASKS - 1:
                self._pending.append((key, trial))
                return child
            if key in self._scores:
                self.study.tell(trial, self._scores[key])
            else:
                self.study.tell(trial, state=TrialState.FAIL)
        return child

    def observe(self, parameters: Mapping[str, int], score: float) -> None:
        if not self.distributions or not all(n in parameters for n in self.distributions):
            return
        values = {name: int(parameters[name]) for name in self.distributions}
        if not all(
            on_grid(values[name], dist.low, dist.high, dist.step)
            for name, dist in self.distributions.items()
        ):
            return  # outside the searched space: the sampler cannot use it
        key = self._key(values)
        self._scores[key] = float(score)
        for index, (pending_key, trial) in enumerate(self._pending):
            if pending_key == key:
                del self._pending[index]
                self.study.tell(trial, float(score))
                return
        self.study.add_trial(
            optuna.trial.create_trial(
                params=values, distributions=dict(self.distributions), value=float(score)
            )
        )


class CandidateTuning(BaseModel):
    """Outcome of `tune_best_candidate`."""

    best_parameters: dict[str, int] | None = Field(
        description="Full parameter mapping of the best trial; None if no trial completed."
    )
    best_value: float | None = None
    objective_used: str | None = None
    best_run_dir: Path | None = Field(
        default=None, description="Runner directory of the best trial's train evaluation."
    )
    trials: list[TrialRecord] = Field(default_factory=list)
    llm_calls: int = 0
    tokens: int = 0


def tune_best_candidate(
    policy: Any,
    train: Environment,
    lms: RoleLMs,
    run_dir: str | Path,
    episode: EpisodeConfig,
    *,
    parameters: Mapping[str, ParameterSpace],
    trials: int = 4,
    seed: int = 0,
    objective: str = "memory_score",
    sampler: str = "tpe",
    pruner: str | Mapping[str, Any] = "median",
    upper_bound: Any = None,
    budget: BudgetSpec | None = None,
    progress: TuneProgress | None = None,
) -> CandidateTuning:
    """A short in-memory study over `policy`'s numeric `parameters` on the train users.

    `parameters`: per name a list of values or an `IntRange` (the optimizer's bounds). Trial
    directories go under `run_dir` (resumable through the runner); `upper_bound` is the table
    the loop already computed (recomputed from the disk cache when None). Returns the best
    full parameter mapping and its train score.
    """
    space: dict[str, ParameterSpace] = dict(parameters)
    tuning = TuningSpec.model_validate(
        {
            "parameters": space,
            "trials": trials,
            "sampler": sampler,
            "tpe_startup_trials": min(trials, 4),
            "pruner": pruner if isinstance(pruner, str) else dict(pruner),
            "objectives": [objective],
            "heldout": "none",
        }
    )
    if sampler == "grid":
        trials = min(trials, tuning.grid_size())
    run_dir = Path(run_dir)
    job = TuningJob(
        name=run_dir.name,
        tuning=tuning,
        trials=trials,
        study_name="candidate",
        storage_url=None,
        seed=seed,
        concurrency=episode.concurrency,
        budget=budget or BudgetSpec(),
        train=train,
        heldout=None,
        episode=episode,
        base_policy=policy,
        environment_description=f"{len(train.items)} train users",
    )
    usage_before = lms.usage.snapshot()
    result = run_study(
        job,
        lms,
        runs_dir=run_dir.parent,
        progress=progress,
        upper_bound_cache=None,
        upper_bound=upper_bound,
    )
    spent = lms.usage.snapshot().minus(usage_before)
    if not result.best:
        return CandidateTuning(
            best_parameters=None,
            trials=result.trials,
            llm_calls=spent.total_requests,
            tokens=spent.total_tokens,
        )
    best = result.trial(result.best[0])
    return CandidateTuning(
        best_parameters={**policy.parameters(), **best.parameters},
        best_value=best.values[0] if best.values else None,
        objective_used=best.objective_used,
        best_run_dir=run_dir / best.run_dir if best.run_dir else None,
        trials=result.trials,
        llm_calls=spent.total_requests,
        tokens=spent.total_tokens,
    )
