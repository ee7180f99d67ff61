"""What one tuning invocation works with: the job it is given (`TuningJob`), where it reports
progress (`TuneProgress`), and the state its parts share (`StudyRun`): the trial loop
(`evolve.tuning.trials`), the held-out check (`evolve.tuning.heldout`) and the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from evolve.llm import RoleLMs
from evolve.results.budget import Budget, SpendListener
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig, ProgressSink
from evolve.simulator.run_dir import config_hash
from evolve.spec.config import BudgetSpec
from evolve.tuning.layout import TuningDir, storage_label
from evolve.tuning.records import (
    HeldoutRecord,
    TrialRecord,
    TuningResult,
    best_trial_numbers,
    trial_records,
)
from evolve.tuning.spec import ResolvedTuning, StudySpec, TuningSpec
from evolve.tuning.spend import StudySpendJournals

if TYPE_CHECKING:
    from evolve.tuning.tracking import StudyTracker

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


class TuneProgress:
    """Progress events of a tuning worker; every hook is optional (the CLI draws bars)."""

    def stage(self, text: str) -> None:
        """A preparatory step started (e.g. computing the upper bound)."""

    def study_opened(self, *, requested: int, finished: int, running: int) -> None:
        """The study holds `finished` finished and `running` running trials already."""

    def trial_started(self, number: int, parameters: Mapping[str, int]) -> None:
        """This worker starts trial `number`."""

    def evaluation_started(self, label: str) -> ProgressSink | None:
        """An evaluation starts; the returned sink receives the runner's events."""
        return None

    def trial_reported(self, number: int, period: int, value: float, objective: str) -> None:
        """Trial `number` reported `value` (of `objective`) after `period`."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial of this worker is complete, pruned or failed."""

    def study_progress(self, *, finished: int, requested: int) -> None:
        """The study holds `finished` finished trials of `requested`, every worker's counted
        (reported after each trial of this worker and while waiting for the others)."""

    def heldout_finished(self, record: HeldoutRecord) -> None:
        """A parameter setting was evaluated on the held-out users."""


@dataclass(frozen=True)
class TuningJob:
    """Everything a worker needs: built from a spec (`job_from`), or directly by callers that
    already hold an environment and a policy (`tune_best_candidate`)."""

    name: str
    tuning: TuningSpec
    trials: int
    study_name: str
    storage_url: str | None  # None: an in-memory study (no resume, no sharing)
    seed: int
    concurrency: int
    budget: BudgetSpec
    train: Environment
    heldout: Environment | None
    episode: EpisodeConfig
    base_policy: Any
    environment_description: str
    base_identity: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    spec: StudySpec | None = None

    @property
    def space(self) -> dict[str, list[int]]:
        return self.tuning.grid()

    @property
    def base_parameters(self) -> dict[str, int]:
        return dict(self.base_policy.parameters())

    def identity(self, model_names: dict[str, str]) -> dict[str, Any]:
        """What trial values depend on (see `ResolvedTuning.identity`)."""
        return {
            **self.base_identity,
            "protocol": self.episode.protocol,  # always, as in ExperimentSpec.identity
            "environment": self.train.content_hash(),
            "train_users": [item.id for item in self.train.items],
            "episode": self.episode.identity(),
            "base_policy": {
                "kind": self.base_policy.kind,
                "parameters": self.base_parameters,
                "components": self.base_policy.components(),
            },
            "models": {role: model_names.get(role) for role in ("simulator", "agent")},
            "seed": self.seed,
            "objectives": list(self.tuning.objectives),
            "space": self.space,
        }

    def config_hash(self, model_names: dict[str, str]) -> str:
        return config_hash(self.identity(model_names))


def job_from(resolved: ResolvedTuning) -> TuningJob:
    experiment = resolved.experiment
    spec = resolved.spec
    return TuningJob(
        name=spec.name,
        tuning=spec.tuning,
        trials=resolved.trials,
        study_name=resolved.study_name,
        storage_url=resolved.storage_url,
        seed=spec.seed,
        concurrency=spec.concurrency,
        budget=spec.budget,
        train=experiment.train,
        heldout=experiment.heldout,
        episode=experiment.episode,
        base_policy=experiment.base_policy,
        environment_description=experiment.environment_description,
        notes=list(resolved.notes),
        spec=spec,
    )


@dataclass
class StudyRun:
    """One invocation's state on its opened study, handed to each part of the worker."""

    job: TuningJob
    lms: RoleLMs
    study_dir: TuningDir
    tracker: StudyTracker
    progress: TuneProgress
    study: optuna.Study
    digest: str  # the job's config hash, recorded on the study and in every result
    budget: Budget
    # Spend journals of a stored study; an in-memory one (inside `evolve run`) has none: it
    # cannot resume, and the experiment journals the calls itself.
    journals: StudySpendJournals | None
    spend_listener: SpendListener | None
    upper_bound: Any = None
    notes: list[str] = field(default_factory=list)
    heldout: list[HeldoutRecord] = field(default_factory=list)

    @property
    def tuning(self) -> TuningSpec:
        return self.job.tuning

    def count(self, states: tuple[TrialState, ...]) -> int:
        return len(self.study.get_trials(deepcopy=False, states=states))

    def finished(self) -> int:
        """Finished trials of the study, every worker's counted."""
        return self.count(FINISHED)

    def result(self, stopped: str | None = None) -> TuningResult:
        if self.journals is not None:
            records = trial_records(self.study, self.journals.trial_spend())
            spent = self.journals.total(records)
        else:
            records = trial_records(self.study)
            spent = self.budget.spent()
        notes = list(self.notes)
        objective = self.tuning.objective
        if objective == "memory_score" and any(
            r.objective_used == "accuracy" for r in records if r.finished
        ):
            notes.append(
                "the memory score is undefined here (the agent's upper bound is no better than "
                "random on these users, common with a small model): accuracy is the objective"
            )
        surplus = sum(r.state == "surplus" for r in records)
        if surplus:
            notes.append(
                f"{surplus} trial(s) created in a race between workers beyond the requested "
                "number were discarded before evaluation (state surplus)"
            )
        finished = sum(r.finished for r in records)
        return TuningResult(
            name=self.job.name,
            study_name=self.job.study_name,
            storage=storage_label(self.job.storage_url),
            config_hash=self.digest,
            objectives=list(self.tuning.objectives),
            sampler=self.tuning.sampler,
            pruner=self.tuning.pruner.kind if not self.tuning.multi_objective else "none",
            requested_trials=self.job.trials,
            space=self.job.space,
            base_parameters=self.job.base_parameters,
            trials=records,
            best=best_trial_numbers(self.study),
            heldout=list(self.heldout),
            notes=notes,
            complete=finished >= self.job.trials and stopped is None,
            stopped=stopped,
            llm_calls=spent.requests,
            tokens=spent.tokens,
        )
