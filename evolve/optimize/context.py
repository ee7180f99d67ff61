"""What the evolution schedules share: one explicit context, and the `Schedule` base.

A schedule (`population` on GEPA, the paper's `per_period` chain) is a class with
`run(context)`. Everything it may use is a field of `EvolutionContext` (the resolved spec,
the LMs, the experiment directory of results, the budget, the tracker, the progress hooks,
the reflector, the upper bound, the candidate records) or one of its methods (store a
proposal, evaluate a candidate on a split, score user results). The loop builds the context
once per run, after opening the experiment directory and computing the upper bound; a
schedule never reaches past it.

The seams other parts hook into:

- `record_proposal` is the one place where every proposal's outcome (proposed, duplicate,
  invalid, rejected) is known, whichever schedule made it;
- `evaluate` and `evaluation_logged` are the one place where an evaluation is stored,
  announced and logged to the tracker;
- `store_generation` is the one place where a generation record is made, stored and logged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.llm import RoleLMs
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.optimize.parameters import ParameterProposer
from evolve.optimize.progress import LoopProgress
from evolve.optimize.reflect import Reflector
from evolve.results.budget import Budget
from evolve.results.objective import objective_used, objective_value
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    GenerationRecord,
    Mutation,
    candidate_id,
    candidate_record,
)
from evolve.simulator.evaluation import run_evaluation
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.records import PeriodResult, UserResult
from evolve.spec.config import ExperimentSpec, OptimizerSpec, ResolvedExperiment
from evolve.stats import estimate, outcomes_from_periods
from evolve.tracking import ExperimentTracker


@dataclass
class EvolutionContext:
    """What a schedule may use: the run's inputs, its stores and its shared helpers."""

    resolved: ResolvedExperiment
    lms: RoleLMs
    experiment_dir: ExperimentDir
    budget: Budget
    tracker: ExperimentTracker
    progress: LoopProgress
    reflector: Reflector
    # A fresh parameter proposer per proposal, told the history (exact on resume).
    proposer_factory: Callable[[], ParameterProposer]
    # The upper-bound table of train + held-out users (the runner accepts a superset).
    upper_bound: Any
    # Every candidate record of the run by id, loaded from the experiment directory, in sync.
    records: dict[str, CandidateRecord] = field(default_factory=dict)
    # The CLI's interrupt event: in-flight GEPA evaluations stop at their next unit.
    stop: threading.Event | None = None

    @property
    def spec(self) -> ExperimentSpec:
        return self.resolved.spec

    @property
    def optimizer(self) -> OptimizerSpec:
        return self.resolved.spec.optimizer

    # ----- candidate records --------------------------------------------------------------

    def save(self, record: CandidateRecord) -> CandidateRecord:
        """Store a record (and the spend so far) and keep it in `records`."""
        self.records[record.id] = record
        self.experiment_dir.save_candidate(record)
        self.experiment_dir.save_spend(self.budget.spent())
        return record

    def record_proposal(self, record: CandidateRecord, **details: Any) -> CandidateRecord:
        """A proposal's outcome is known (its status says which): announce it, give it to the
        tracker (every proposal is an MLflow run, rejected and invalid ones included) and
        store it. `details`: what the schedule knows beyond the record (for one GEPA rejected
        on its minibatch: `reason`, `scores`, `evaluation_dir`)."""
        self.progress.candidate_proposed(record)
        self.tracker.log_proposal(
            record,
            parent=self.parent(record),
            policy_dir=self.experiment_dir.policy_dir(record.id),
            feedback=self.experiment_dir.load_feedback(record.id) or None,
            **details,
        )
        return self.save(record)

    def policy(self, record: CandidateRecord) -> Any:
        """The stored policy bundle of a candidate."""
        import memory_policies

        return memory_policies.load(self.experiment_dir.policy_dir(record.id))

    def seen(self) -> dict[str, str]:
        """fingerprint -> id of every proposed policy (duplicates and invalid ones excluded)."""
        return {
            r.fingerprint: r.id
            for r in sorted(self.records.values(), key=lambda r: (r.generation, r.id))
            if r.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATED)
        }

    def parent(self, record: CandidateRecord) -> CandidateRecord | None:
        return self.records.get(record.parent_ids[0]) if record.parent_ids else None

    def base(self) -> CandidateRecord:
        """The base candidate `g00-c0` (stored with its policy bundle on first use)."""
        base_id = candidate_id(0, 0)
        if base_id in self.records:
            return self.records[base_id]
        policy = self.resolved.base_policy
        record = candidate_record(
            base_id,
            generation=0,
            policy=policy,
            mutation=Mutation(kind="base"),
            seed=self.spec.seed,
        )
        policy.save(self.experiment_dir.policy_dir(base_id), provenance=self.provenance(record))
        return self.record_proposal(record)

    def provenance(self, record: CandidateRecord) -> dict[str, Any]:
        """What a candidate's policy bundle says about where it comes from."""
        return {
            "experiment": self.spec.name,
            "candidate": record.id,
            "generation": record.generation,
            "parents": list(record.parent_ids),
            "mutation": record.mutation.describe(),
            "seed": record.seed,
        }

    # ----- evaluations --------------------------------------------------------------------

    def evaluate(self, record: CandidateRecord, split: str) -> CandidateRecord:
        """Score a stored candidate on the train or held-out users (once: kept on disk)."""
        if getattr(record, split) is not None:
            return record
        self.budget.check()
        env = {
            "train": self.resolved.train,
            "validation": self.resolved.validation,
            "heldout": self.resolved.heldout,
        }[split]
        run_dir = self.experiment_dir.candidate_dir(record.id) / split
        sink = self.tracker.evaluation_sink(
            split, self.progress.evaluation_started(record, split), record=record
        )
        last_period = max(len(item.periods) for item in env.items) - 1
        report = run_evaluation(
            env,
            self.policy(record),
            self.lms,
            run_dir,
            self.resolved.episode,
            on_period_end=lambda period, _summary: self._barrier(period, last_period),
            progress=sink,
            upper_bound=self.upper_bound,
        )
        scores = self.scores(report.users, run_dir, report.wall_time_s)
        status = CandidateStatus.EVALUATED if split == "train" else record.status
        record = self.save(record.model_copy(update={split: scores, "status": status}))
        self.evaluation_logged(record, split)
        return record

    def _barrier(self, period: int, last_period: int) -> None:
        # Never stop after the last period: the evaluation is complete, keep its report.
        if period < last_period:
            self.budget.check()

    def store_generation(
        self, *, compare_without: Sequence[str] = (), **fields: Any
    ) -> GenerationRecord:
        """The one place a generation record is made, stored and logged, whichever schedule
        finished it. A record equal to the stored one is neither stored nor logged again
        (a resumed run replays no MLflow step); `compare_without` names the fields whose
        change alone does not count (the population schedule's current Pareto front)."""
        record = GenerationRecord(**fields)
        stored = self.experiment_dir.load_generation(record.generation)
        if stored is not None:
            same = {name: getattr(record, name) for name in compare_without}
            if stored.model_copy(update=same) == record:
                return stored
        self.experiment_dir.save_generation(record)
        self.tracker.log_generation(record, spent=self.budget.spent())
        return record

    def evaluation_logged(self, record: CandidateRecord, split: str) -> None:
        """A stored evaluation: announced to the progress hooks, logged to the tracker."""
        self.progress.evaluation_finished(record, split)
        self.log_candidate(record, split)

    def log_candidate(self, record: CandidateRecord, split: str) -> None:
        self.tracker.log_candidate(
            record,
            split=split,
            parent=self.parent(record),
            policy_dir=self.experiment_dir.policy_dir(record.id),
            feedback=self.experiment_dir.load_feedback(record.id),
        )

    def scores(
        self,
        users: Sequence[UserResult],
        run_dir: Path,
        wall_time_s: float,
        periods: Sequence[int] | None = None,
    ) -> EvaluationScores:
        """A candidate's scores over users' results (only `periods` of them when given)."""
        wanted = set(periods) if periods is not None else None

        def chosen(user: UserResult) -> list[PeriodResult]:
            return [p for p in user.periods if wanted is None or p.period_index in wanted]

        objective = self.optimizer.objective
        all_periods = [p for user in users for p in chosen(user)]
        summary = summarize_periods(all_periods, self.upper_bound)
        indices = sorted({p.period_index for p in all_periods})
        per_period = [
            summarize_periods([p for p in all_periods if p.period_index == i], self.upper_bound)
            for i in indices
        ]
        per_user = {
            user.user_id: objective_value(
                summarize_periods(chosen(user), self.upper_bound), objective
            )
            for user in users
        }
        return EvaluationScores(
            users=[user.user_id for user in users],
            score=objective_value(summary, objective),
            objective=objective,
            objective_used=objective_used(summary, objective),
            per_user=per_user,
            summary=summary,
            per_period=per_period,
            run_dir=str(run_dir.relative_to(self.experiment_dir.root)),
            periods=list(periods) if periods is not None else None,
            wall_time_s=wall_time_s,
            estimate=estimate(outcomes_from_periods(all_periods, upper_bound=self.upper_bound))
            if summary.n_items
            else None,
        )


class Schedule:
    """How candidates are proposed and scored over generations. One subclass per
    `optimizer.schedule` value; `run` may raise `BudgetExhausted` (the loop keeps what is
    stored), and everything a schedule uses comes from the context."""

    name: str = ""

    def __init__(self) -> None:
        # The run's own summary when the schedule has one (the chain's evolving run: the
        # paper's number); set as soon as it is known, so a budget stop keeps it.
        self.summary: MetricSummary | None = None

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        """Refuse, before any LLM call, a spec this schedule could not run (an
        `ExperimentSpec`; nothing to refuse by default)."""

    def run(self, context: EvolutionContext) -> None:
        raise NotImplementedError
