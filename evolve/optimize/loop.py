"""The self-evolution loop: P_{k+1} = G(P_k, F_k), with a population, held-out users and lineage.

Two schedules:

- ``population`` (default): generation 0 evaluates the base policy on-policy on the train
  users. Each later generation proposes `candidates_per_generation` children, each from a
  parent drawn from the population (see `selection`), by one mutation operator:
  *reflective* (the reflector rewrites one component's instruction from diagnostic feedback
  on the parent's own train episodes) or *parameter* (a `ParameterProposer` changes a numeric
  parameter within bounds). Exact duplicates of earlier candidates (same kind, instructions
  and parameters) are retried, then recorded as duplicates and never evaluated. Children are
  evaluated on the train users; the population is re-selected; the generation's best child
  is evaluated on the held-out users, so overfitting to the train users shows.
- ``per_period`` (the paper's setup, AMemGym Table 3): one on-policy train run in which, after
  each period, the reflector rewrites the mutable component(s) from that period's feedback
  and the episode continues with the new instructions and the same memory. Each step is a
  candidate (generation = the period from which it is in effect); the base and the final
  policy (or every step) are also evaluated on held-out users from scratch.

Optuna in the population schedule (spec options): with `parameter_proposer = "optuna"` the
parameter mutations are asked from an Optuna sampler told every evaluated candidate's score
(`evolve.tune.OptunaParameterProposer`); with `tune_every = N`, after every N-th generation a
short study (`evolve.tune.tune_best_candidate`, `tune_trials` trials) tunes the numeric
parameters of the generation's best child, and a better setting becomes a *tuned* candidate of
that generation, evaluated and selected like the others. The study's trials live under
`tuning/gen_NN/` (resumable); its outcome is stored there (`outcome.json`) once finished and
never recomputed.

The simulated user is never mutated: it is not part of a policy. Every unit (a candidate's
proposal, its evaluation on a split, a generation) is stored when finished and never
recomputed (`store`); the budget is checked before each unit and at every period barrier.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.budget import Budget, BudgetExhausted
from evolve.config import BudgetSpec, ExperimentSpec, ResolvedExperiment, resolve
from evolve.llm import RoleLMs
from evolve.objective import load_period_results, objective_used, objective_value
from evolve.optimize.feedback import build_feedback
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.optimize.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    ExperimentResult,
    GenerationRecord,
    Mutation,
    candidate_id,
    fingerprint,
)
from evolve.optimize.reflect import Reflector
from evolve.optimize.report import format_lineage, format_table
from evolve.optimize.selection import best_of, sample_parent, select_population
from evolve.optimize.store import ExperimentStore
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.runner import EvaluationReport, ProgressSink, run_evaluation
from evolve.simulator.storage import atomic_write_json, atomic_write_text, read_json
from evolve.simulator.user import derive_seed
from evolve.tracking import ExperimentTracker, NullTracker, TrackingContext


class LoopProgress:
    """Progress events of the loop; every hook is optional (the CLI draws tqdm bars)."""

    def stage(self, text: str) -> None:
        """A preparatory step started (e.g. computing the upper bound)."""

    def generation_started(self, generation: int, total: int) -> None:
        """`total` is the number of generations (periods for the per_period schedule)."""

    def candidate_proposed(self, record: CandidateRecord) -> None:
        """A candidate was proposed (or loaded from disk), possibly a duplicate/invalid."""

    def evaluation_started(self, record: CandidateRecord, split: str) -> ProgressSink | None:
        """An evaluation starts; the returned sink receives the runner's events."""
        return None

    def evaluation_finished(self, record: CandidateRecord, split: str) -> None:
        """The evaluation is stored (`record` carries its scores)."""


def run_experiment(
    experiment: ExperimentSpec | ResolvedExperiment,
    lms: RoleLMs,
    *,
    runs_dir: str | Path = "runs",
    tracker: ExperimentTracker | None = None,
    progress: LoopProgress | None = None,
    proposer: ParameterProposer | None = None,
    upper_bound_cache: str | Path | None = None,
    refresh_upper_bound: bool = False,
) -> ExperimentResult:
    """Run (or resume) an experiment; returns its records. Stops cleanly on the budget.

    `refresh_upper_bound` asks every upper-bound question again instead of using the cache.
    """
    resolved = experiment if isinstance(experiment, ResolvedExperiment) else resolve(experiment)
    evolution = _Evolution(
        resolved,
        lms,
        runs_dir=Path(runs_dir),
        tracker=tracker or NullTracker(),
        progress=progress or LoopProgress(),
        proposer=proposer or default_proposer(resolved.spec),
        upper_bound_cache=Path(upper_bound_cache) if upper_bound_cache else None,
    )
    evolution.refresh_upper_bound = refresh_upper_bound
    return evolution.run()


def default_proposer(spec: ExperimentSpec) -> ParameterProposer:
    """The parameter proposer the spec asks for (`optimizer.parameter_proposer`)."""
    if spec.optimizer.parameter_proposer == "optuna":
        # Imported here: evolve.tuning builds on this module (Budget, objective_value).
        from evolve.tuning.evolution import OptunaParameterProposer

        return OptunaParameterProposer(spec.optimizer.parameters, seed=spec.seed)
    return RandomStepProposer()


class TuningOutcome(BaseModel):
    """A finished `tune_every` study of one generation, stored so it is never rerun."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    generation: int
    tuned_from: str = Field(description="The candidate whose parameters were tuned.")
    seed: int
    sampler: str
    requested_trials: int
    best_parameters: dict[str, int] | None = Field(
        default=None, description="Full parameter mapping of the best trial; None: none completed."
    )
    best_value: float | None = None
    objective_used: str | None = None
    best_run_dir: str | None = Field(
        default=None, description="The best trial's runner directory, relative to the experiment."
    )
    llm_calls: int = 0
    tokens: int = 0
    trials: list[dict[str, Any]] = Field(default_factory=list, description="TrialRecord dumps.")


def _record_order(record: CandidateRecord) -> tuple[int, int, str]:
    """Generation, then the candidate index as a number (g01-c10 after g01-c2)."""
    _, _, index = record.id.rpartition("-c")
    return (record.generation, int(index) if index.isdigit() else -1, record.id)


class _ChainPolicy:
    """What the runner evaluates in the per_period schedule: the step policy in effect.

    The runner hashes `components()` once, at the start, to guard its directory; they are the
    base policy's here, constant across resumptions, while every call is delegated to the
    current step's policy (switched only at period barriers, when no worker runs).
    """

    def __init__(self, base: Any) -> None:
        self._base_components = base.components()
        self.current = base

    def switch(self, policy: Any) -> None:
        self.current = policy

    def components(self) -> dict[str, str]:
        return dict(self._base_components)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


class _Evolution:
    def __init__(
        self,
        resolved: ResolvedExperiment,
        lms: RoleLMs,
        *,
        runs_dir: Path,
        tracker: ExperimentTracker,
        progress: LoopProgress,
        proposer: ParameterProposer,
        upper_bound_cache: Path | None,
    ) -> None:
        self.resolved = resolved
        self.spec = resolved.spec
        self.optimizer = resolved.spec.optimizer
        self.lms = lms
        self.store = ExperimentStore(runs_dir / resolved.spec.name)
        self.tracker = tracker
        self.progress = progress
        self.proposer = proposer
        self.upper_bound_cache = upper_bound_cache
        self.reflector = Reflector(
            lms,
            temperature=self.optimizer.reflector_temperature,
            max_chars=self.optimizer.max_instruction_chars,
        )
        self.records: dict[str, CandidateRecord] = {}
        self.upper_bound: Any = None
        self.refresh_upper_bound = False
        self.chain_summary: MetricSummary | None = None

    # ----- top level ------------------------------------------------------------------------

    def run(self) -> ExperimentResult:
        model_names = self.lms.model_names()
        identity = self.resolved.identity(model_names)
        digest = self.store.open(identity)
        for record in self.store.load_candidates():
            self.records[record.id] = record
        journal = self.store.open_journal()
        self.budget = Budget(self.spec.budget, self.lms, self.store.load_spend(), journal)
        self.tracker.start(
            TrackingContext(
                name=self.spec.name,
                config_hash=digest,
                spec=self.spec,
                run_dir=self.store.root.resolve(),
                model_names=model_names,
                environment=self.resolved.environment_description,
                train_users=[item.id for item in self.resolved.train.items],
                heldout_users=[item.id for item in self.resolved.heldout.items],
                registered_model=self.spec.registered_model_name(),
            )
        )
        # Replayed in evaluation order, so a stateful proposer (an Optuna study) rebuilds the
        # history it had when the run stopped.
        for record in sorted(self.records.values(), key=_record_order):
            if record.train is not None:
                self.proposer.observe(record.parameters, record.train.score)
        stopped: str | None = None
        try:
            self.budget.check()
            self._prepare_upper_bound()
            if self.optimizer.schedule == "per_period":
                self._run_chain()
            else:
                self._run_population()
        except BudgetExhausted as exhausted:
            stopped = exhausted.reason
        except BaseException:
            self.tracker.fail()
            raise
        finally:
            self.store.save_spend(self.budget.spent())
            self.budget.close()
        result = self._result(digest, stopped)
        self.store.save_result(result)
        self.tracker.finish(
            result, report=format_table(result) + "\n\n" + format_lineage(result) + "\n"
        )
        return result

    def _result(self, digest: str, stopped: str | None) -> ExperimentResult:
        records = sorted(self.records.values(), key=lambda r: (r.generation, r.id))
        best = best_of(records, "heldout") or best_of(records, "train")
        spend = self.budget.spent()
        return ExperimentResult(
            name=self.spec.name,
            config_hash=digest,
            schedule=self.optimizer.schedule,
            candidates=records,
            generations=self.store.load_generations(),
            best_id=best.id if best is not None else None,
            stopped=stopped,
            complete=stopped is None,
            chain_summary=self.chain_summary,
            llm_calls=spend.llm_calls,
            tokens=spend.tokens,
            wall_time_s=spend.wall_time_s,
            reflection_parse_failures=sum(r.reflection_parse_failures for r in records),
        )

    def _prepare_upper_bound(self) -> None:
        from evolve.paths import cache_dir
        from evolve.simulator.baselines import compute_upper_bound
        from evolve.simulator.environment import Environment

        self.progress.stage("upper bound")
        # One table for train + held-out users (the runner accepts a superset).
        users = Environment(items=[*self.resolved.train.items, *self.resolved.heldout.items])
        self.upper_bound = compute_upper_bound(
            users,
            self.lms,
            self.upper_bound_cache or cache_dir() / "upper_bound",
            concurrency=self.spec.concurrency,
            refresh=self.refresh_upper_bound,
        )
        self.store.save_spend(self.budget.spent())

    def _save(self, record: CandidateRecord) -> CandidateRecord:
        self.records[record.id] = record
        self.store.save_candidate(record)
        self.store.save_spend(self.budget.spent())
        return record

    def _policy(self, record: CandidateRecord) -> Any:
        import memory_policies

        return memory_policies.load(self.store.policy_dir(record.id))

    def _seen(self) -> dict[str, str]:
        """fingerprint -> id of every proposed policy (duplicates and invalid ones excluded)."""
        return {
            r.fingerprint: r.id
            for r in sorted(self.records.values(), key=lambda r: (r.generation, r.id))
            if r.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATED)
        }

    def _base(self) -> CandidateRecord:
        base_id = candidate_id(0, 0)
        if base_id in self.records:
            return self.records[base_id]
        policy = self.resolved.base_policy
        record = CandidateRecord(
            id=base_id,
            generation=0,
            mutation=Mutation(kind="base"),
            seed=self.spec.seed,
            fingerprint=fingerprint(policy.kind, policy.components(), policy.parameters()),
            kind=policy.kind,
            components=policy.components(),
            parameters=policy.parameters(),
            status=CandidateStatus.PROPOSED,
        )
        policy.save(self.store.policy_dir(base_id), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        return self._save(record)

    def _provenance(self, record: CandidateRecord) -> dict[str, Any]:
        return {
            "experiment": self.spec.name,
            "candidate": record.id,
            "generation": record.generation,
            "parents": list(record.parent_ids),
            "mutation": record.mutation.describe(),
            "seed": record.seed,
        }

    # ----- evaluation ----------------------------------------------------------------------

    def _evaluate(self, record: CandidateRecord, split: str) -> CandidateRecord:
        if getattr(record, split) is not None:
            return record
        self.budget.check()
        env = self.resolved.train if split == "train" else self.resolved.heldout
        run_dir = self.store.candidate_dir(record.id) / split
        sink = self.progress.evaluation_started(record, split)
        last_period = max(len(item.periods) for item in env.items) - 1
        report = run_evaluation(
            env,
            self._policy(record),
            self.lms,
            run_dir,
            self.resolved.episode,
            on_period_end=lambda period, _summary: self._barrier(period, last_period),
            progress=sink,
            upper_bound=self.upper_bound,
        )
        scores = self._scores(report.users, run_dir, report.wall_time_s)
        status = CandidateStatus.EVALUATED if split == "train" else record.status
        record = self._save(record.model_copy(update={split: scores, "status": status}))
        if split == "train":
            self.proposer.observe(record.parameters, scores.score)
        self.progress.evaluation_finished(record, split)
        self.tracker.log_candidate(
            record,
            split=split,
            parent=self.records.get(record.parent_ids[0]) if record.parent_ids else None,
            policy_dir=self.store.policy_dir(record.id),
            feedback=self.store.load_feedback(record.id),
        )
        return record

    def _barrier(self, period: int, last_period: int) -> None:
        # Never stop after the last period: the evaluation is complete, keep its report.
        if period < last_period:
            self.budget.check()

    def _scores(
        self,
        users: Sequence[UserResult],
        run_dir: Path,
        wall_time_s: float,
        periods: Sequence[int] | None = None,
    ) -> EvaluationScores:
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
            run_dir=str(run_dir.relative_to(self.store.root)),
            periods=list(periods) if periods is not None else None,
            wall_time_s=wall_time_s,
        )

    # ----- population schedule --------------------------------------------------------------

    def _run_population(self) -> None:
        optimizer = self.optimizer
        total = optimizer.generations
        self.progress.generation_started(0, total)
        base = self._evaluate(self._base(), "train")
        if optimizer.heldout == "every_generation":
            base = self._evaluate(base, "heldout")
        population = [base]
        self._finish_generation(0, [base.id], population, [base])
        can_mutate = optimizer.reflective_enabled() or optimizer.parameter_rate() > 0
        for generation in range(1, total + 1) if can_mutate else range(0):
            stored = self.store.load_generation(generation)
            if stored is not None:
                population = [self.records[cid] for cid in stored.population]
                continue
            self.progress.generation_started(generation, total)
            proposed = [
                self._propose(generation, index, population)
                for index in range(optimizer.candidates_per_generation)
            ]
            evaluated = [
                self._evaluate(record, "train")
                for record in proposed
                if record.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATED)
            ]
            if optimizer.tune_every is not None and generation % optimizer.tune_every == 0:
                target = best_of(evaluated, "train") or best_of(population, "train")
                tuned = self._tuned(generation, target) if target is not None else None
                if tuned is not None:
                    proposed.append(tuned)
                    if tuned.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATED):
                        evaluated.append(self._evaluate(tuned, "train"))
            population = select_population(
                [*(self.records[r.id] for r in population), *evaluated],
                optimizer.population_size,
                optimizer.selection,
            )
            best = best_of(evaluated, "train")
            if best is not None and optimizer.heldout == "every_generation":
                best = self._evaluate(best, "heldout")
            self._finish_generation(generation, [r.id for r in proposed], population, evaluated)
        if optimizer.heldout == "final":
            finalists = [base, best_of(list(self.records.values()), "train")]
            for record in finalists:
                if record is not None:
                    self._evaluate(self.records[record.id], "heldout")
            self._refresh_generations()

    def _finish_generation(
        self,
        generation: int,
        proposed_ids: Sequence[str],
        population: Sequence[CandidateRecord],
        evaluated: Sequence[CandidateRecord],
    ) -> None:
        record = self._generation_record(
            generation, proposed_ids, [r.id for r in population], [r.id for r in evaluated]
        )
        if self.store.load_generation(generation) == record:
            return
        self.store.save_generation(record)
        self.tracker.log_generation(record, spent=self.budget.spent())

    def _generation_record(
        self,
        generation: int,
        proposed_ids: Sequence[str],
        population_ids: Sequence[str],
        evaluated_ids: Sequence[str],
    ) -> GenerationRecord:
        evaluated = [self.records[cid] for cid in evaluated_ids]
        proposed = [self.records[cid] for cid in proposed_ids if cid in self.records]
        best = best_of(evaluated, "train")
        scores = [r.train.score for r in evaluated if r.train is not None]
        calls = sum(r.reflection_calls for r in proposed)
        tokens = sum(r.reflection_tokens for r in proposed)
        wall = 0.0
        for r in evaluated:
            for split, split_scores in (("train", r.train), ("heldout", r.heldout)):
                if split_scores is None:
                    continue
                wall += split_scores.wall_time_s
                if split == "train" and self._reused_trial_file(r.id).exists():
                    continue  # its train run is the tuning study's best trial, counted below
                calls += split_scores.summary.llm_calls
                tokens += split_scores.summary.tokens
        outcome = self._load_tuning(generation)
        if outcome is not None:
            calls += outcome.llm_calls
            tokens += outcome.tokens
        return GenerationRecord(
            generation=generation,
            candidate_ids=list(proposed_ids),
            evaluated_ids=list(evaluated_ids),
            population=list(population_ids),
            best_id=best.id if best is not None else None,
            best_train_score=best.train.score if best is not None and best.train else None,
            mean_train_score=sum(scores) / len(scores) if scores else None,
            best_heldout_score=best.heldout.score if best is not None and best.heldout else None,
            llm_calls=calls,
            tokens=tokens,
            wall_time_s=wall,
        )

    def _refresh_generations(self) -> None:
        """Held-out scores computed after a generation was stored (heldout = "final")."""
        for stored in self.store.load_generations():
            if stored.best_id is None:
                continue
            best = self.records[stored.best_id]
            if best.heldout is not None and stored.best_heldout_score is None:
                self.store.save_generation(
                    stored.model_copy(update={"best_heldout_score": best.heldout.score})
                )

    # ----- tune_every: a short Optuna study on a generation's best --------------------------

    def _tuning_dir(self, generation: int) -> Path:
        return self.store.root / "tuning" / f"gen_{generation:02d}"

    def _load_tuning(self, generation: int) -> TuningOutcome | None:
        path = self._tuning_dir(generation) / "outcome.json"
        return TuningOutcome.model_validate(read_json(path)) if path.exists() else None

    def _reused_trial_file(self, cid: str) -> Path:
        return self.store.candidate_dir(cid) / "train_from_trial.txt"

    def _tuned(self, generation: int, target: CandidateRecord) -> CandidateRecord | None:
        """The tuned candidate of `generation` (stored, not yet evaluated), or None when the
        study found nothing better than `target`'s own parameters."""
        outcome = self._load_tuning(generation) or self._run_tuning(generation, target)
        best = outcome.best_parameters
        parent = self.records[outcome.tuned_from]
        if best is None or best == parent.parameters:
            return None
        cid = candidate_id(generation, self.optimizer.candidates_per_generation)
        record = self.records.get(cid)
        if record is None:
            record = self._record_tuned(cid, generation, parent, outcome)
        self._reuse_best_trial(record, outcome)
        return record

    def _run_tuning(self, generation: int, target: CandidateRecord) -> TuningOutcome:
        from evolve.tuning.evolution import tune_best_candidate

        self.budget.check()
        optimizer = self.optimizer
        seed = derive_seed(self.spec.seed, "tune", generation)
        run_dir = self._tuning_dir(generation)
        self.progress.stage(f"tuning {target.id} (generation {generation})")
        tuning = tune_best_candidate(
            self._policy(target),
            self.resolved.train,
            self.lms,
            run_dir,
            self.resolved.episode,
            parameters=optimizer.parameters,
            trials=optimizer.tune_trials,
            seed=seed,
            objective=optimizer.objective,
            sampler=optimizer.tune_sampler,
            upper_bound=self.upper_bound,
            budget=self._remaining_budget(),
            progress=self._tune_progress(target),
        )
        requested = optimizer.tune_trials
        if optimizer.tune_sampler == "grid":
            grid = 1
            for bounds in optimizer.parameters.values():
                grid *= bounds.high - bounds.low + 1
            requested = min(requested, grid)
        if sum(trial.finished for trial in tuning.trials) < requested:
            # Only the budget stops a study early (failed trials raise): keep its trials on
            # disk, store no outcome, and let the next invocation resume the study.
            raise BudgetExhausted(
                self.budget.exhausted()
                or f"the budget ran out during the tuning study of generation {generation}"
            )
        best_run_dir = None
        if tuning.best_run_dir is not None:
            best_run_dir = os.path.relpath(tuning.best_run_dir, self.store.root)
        outcome = TuningOutcome(
            generation=generation,
            tuned_from=target.id,
            seed=seed,
            sampler=optimizer.tune_sampler,
            requested_trials=requested,
            best_parameters=tuning.best_parameters,
            best_value=tuning.best_value,
            objective_used=tuning.objective_used,
            best_run_dir=best_run_dir,
            llm_calls=tuning.llm_calls,
            tokens=tuning.tokens,
            trials=[trial.model_dump(mode="json") for trial in tuning.trials],
        )
        atomic_write_json(run_dir / "outcome.json", outcome.model_dump(mode="json"))
        self.store.save_spend(self.budget.spent())
        return outcome

    def _tune_progress(self, target: CandidateRecord) -> Any:
        """The study's events shown through the loop's progress hooks (the CLI's bars)."""
        from evolve.tuning.study import TuneProgress

        progress = self.progress

        class Bridge(TuneProgress):
            def evaluation_started(self, label: str) -> ProgressSink | None:
                return progress.evaluation_started(target, f"tuning {label}")

            def trial_finished(self, record: Any) -> None:
                shown = " ".join(f"{k}={v}" for k, v in sorted(record.parameters.items()))
                value = f" {record.values[0]:.3f}" if record.values else ""
                progress.stage(f"tuning trial {record.number} {record.state}: {shown}{value}")

        return Bridge()

    def _remaining_budget(self) -> BudgetSpec:
        """The experiment's budget left now, as the study's own limits."""
        limits, spent = self.spec.budget, self.budget.spent()

        def left(limit: float | None, used: float) -> float | None:
            # check() passed, so every limit still has something left.
            return None if limit is None else max(limit - used, 1)

        calls = left(limits.max_llm_calls, spent.llm_calls)
        tokens = left(limits.max_tokens, spent.tokens)
        wall = limits.max_wall_time_s
        return BudgetSpec(
            max_llm_calls=int(calls) if calls is not None else None,
            max_tokens=int(tokens) if tokens is not None else None,
            max_wall_time_s=max(wall - spent.wall_time_s, 1e-3) if wall is not None else None,
        )

    def _record_tuned(
        self, cid: str, generation: int, parent: CandidateRecord, outcome: TuningOutcome
    ) -> CandidateRecord:
        assert outcome.best_parameters is not None
        policy = self._policy(parent).with_parameters(**outcome.best_parameters)
        key = fingerprint(policy.kind, policy.components(), policy.parameters())
        duplicate_of = self._seen().get(key)
        status = CandidateStatus.PROPOSED if duplicate_of is None else CandidateStatus.DUPLICATE
        changes = {
            name: (parent.parameters[name], value)
            for name, value in policy.parameters().items()
            if name in parent.parameters and value != parent.parameters[name]
        }
        record = CandidateRecord(
            id=cid,
            generation=generation,
            parent_ids=(parent.id,),
            mutation=Mutation(kind="tuned", parameter_changes=changes),
            seed=outcome.seed,
            fingerprint=key,
            kind=parent.kind,
            components=policy.components(),
            parameters=policy.parameters(),
            status=status,
            duplicate_of=duplicate_of,
        )
        if status == CandidateStatus.PROPOSED:
            policy.save(self.store.policy_dir(cid), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        return self._save(record)

    def _reuse_best_trial(self, record: CandidateRecord, outcome: TuningOutcome) -> None:
        """Start the tuned candidate's train run from the study's best trial.

        That trial evaluated exactly this policy (the target with the best parameters) on the
        same users with the same episode settings, and the runner guards the directory with
        that identity; resuming from a copy scores the candidate without repeating its most
        expensive unit, a whole train evaluation.
        """
        train_dir = self.store.candidate_dir(record.id) / "train"
        if record.status != CandidateStatus.PROPOSED or record.train is not None:
            return
        if train_dir.exists() or outcome.best_run_dir is None:
            return
        source = self.store.root / outcome.best_run_dir
        if not (source / "report.json").is_file():
            return
        partial = train_dir.with_name("train.partial")
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted copy
        shutil.copytree(source, partial)
        atomic_write_text(self._reused_trial_file(record.id), outcome.best_run_dir + "\n")
        os.replace(partial, train_dir)

    def _propose(
        self, generation: int, index: int, population: Sequence[CandidateRecord]
    ) -> CandidateRecord:
        cid = candidate_id(generation, index)
        if cid in self.records:
            return self.records[cid]
        self.budget.check()
        optimizer = self.optimizer
        rng = random.Random(derive_seed(self.spec.seed, "propose", generation, index))
        parent = sample_parent(population, optimizer.selection, rng)
        use_parameters = rng.random() < optimizer.parameter_rate()
        component_offset = generation + index
        usage_before = self.lms.usage.snapshot()
        parent_policy = self._policy(parent)
        seen = self._seen()
        feedback_text: str | None = None
        parse_failures = 0
        outcome: dict[str, Any] = {}
        for attempt in range(optimizer.proposal_attempts):
            seed = derive_seed(self.spec.seed, "candidate", generation, index, attempt)
            if use_parameters:
                values = self.proposer.propose(
                    parent.parameters, optimizer.parameters, random.Random(seed)
                )
                changes = {
                    name: (parent.parameters[name], value)
                    for name, value in values.items()
                    if value != parent.parameters.get(name)
                }
                policy = parent_policy.with_parameters(**values)
                mutation = Mutation(
                    kind="parameter", parameter_changes=changes, attempts=attempt + 1
                )
                outcome = {"policy": policy, "mutation": mutation, "seed": seed}
            else:
                components = optimizer.mutate_components
                component = components[(component_offset + attempt) % len(components)]
                parent_dir = self.store.root / parent.train.run_dir  # type: ignore[union-attr]
                feedback, mutation = self._reflective_mutation(
                    load_period_results(parent_dir), component, seed, attempt
                )
                feedback_text = feedback.text
                outcome = self._reflect(parent_policy, parent, component, feedback.text, seed)
                outcome["mutation"] = mutation
                parse_failures += outcome.pop("parse_failed", 0)
                if outcome.get("invalid"):
                    continue
            policy = outcome["policy"]
            key = fingerprint(policy.kind, policy.components(), policy.parameters())
            outcome["fingerprint"] = key
            if key in seen:
                outcome["duplicate_of"] = seen[key]
                continue
            outcome.pop("duplicate_of", None)
            break
        usage = self.lms.usage.snapshot().minus(usage_before)
        status = CandidateStatus.PROPOSED
        if outcome.get("invalid"):
            status = CandidateStatus.INVALID
        elif outcome.get("duplicate_of"):
            status = CandidateStatus.DUPLICATE
        policy = outcome.get("policy")
        record = CandidateRecord(
            id=cid,
            generation=generation,
            parent_ids=(parent.id,),
            mutation=outcome["mutation"],
            seed=outcome.get("seed", derive_seed(self.spec.seed, "candidate", generation, index)),
            fingerprint=outcome.get("fingerprint", ""),
            kind=parent.kind,
            components=policy.components() if policy is not None else dict(parent.components),
            parameters=policy.parameters() if policy is not None else dict(parent.parameters),
            status=status,
            duplicate_of=(
                outcome.get("duplicate_of") if status == CandidateStatus.DUPLICATE else None
            ),
            invalid_reason=outcome.get("invalid") if status == CandidateStatus.INVALID else None,
            reflection_calls=usage.total_calls - usage.cache_hits,
            reflection_tokens=usage.total_tokens,
            reflection_parse_failures=parse_failures,
        )
        if feedback_text is not None:
            self.store.save_feedback(cid, feedback_text)
        if status == CandidateStatus.PROPOSED:
            policy.save(self.store.policy_dir(cid), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        return self._save(record)

    def _reflective_mutation(
        self,
        results: Any,
        component: str,
        seed: int,
        attempt: int,
        periods: list[int] | None = None,
    ) -> tuple[Any, Mutation]:
        """The reflector's feedback on a parent's period results, and the mutation record of
        a proposal made from it (both schedules propose this way)."""
        optimizer = self.optimizer
        feedback = build_feedback(
            results,
            optimizer.feedback,
            component=component,
            max_failures=optimizer.max_feedback_failures,
            max_chars=optimizer.max_feedback_chars,
            rng=random.Random(seed),
            periods=periods,
        )
        mutation = Mutation(
            kind="reflective",
            component=component,
            feedback=optimizer.feedback,
            feedback_failures=feedback.failures_shown,
            rollout_id=seed,
            temperature=optimizer.reflector_temperature,
            attempts=attempt + 1,
        )
        return feedback, mutation

    def _reflect(
        self, parent_policy: Any, parent: CandidateRecord, component: str, feedback: str, seed: int
    ) -> dict[str, Any]:
        """One reflector call turned into a policy, or the reason it cannot be one."""
        from memory_policies.errors import PolicyError

        proposal = self.reflector.propose(
            component,
            parent.components[component],
            feedback,
            rollout_id=seed,
            seed=seed,
        )
        if proposal.text is None:
            return {
                "invalid": proposal.error,
                "parse_failed": int(proposal.parse_failed),
                "seed": seed,
            }
        try:
            policy = parent_policy.with_components({component: proposal.text})
        except PolicyError as error:
            return {"invalid": f"the proposed text was refused: {error}", "seed": seed}
        return {"policy": policy, "seed": seed}

    # ----- per_period schedule (the paper's chain) -------------------------------------------

    def _run_chain(self) -> None:
        base = self._base()
        train = self.resolved.train
        periods = max(len(item.periods) for item in train.items)
        run_dir = self.store.root / "chain" / "train"
        chain = _ChainPolicy(self._policy(base))
        in_effect: dict[int, str] = {0: base.id}
        self.progress.generation_started(0, periods - 1)

        def on_period_end(period: int, _summary: MetricSummary) -> None:
            if period >= periods - 1:
                return
            current = self.records[in_effect[period]]
            step = self.records.get(candidate_id(period + 1, 0))
            if step is None and self.optimizer.reflective_enabled():
                self.budget.check()
                self.progress.generation_started(period + 1, periods - 1)
                step = self._propose_step(period, current, run_dir)
            successor = current
            if step is not None and step.status in (
                CandidateStatus.PROPOSED,
                CandidateStatus.EVALUATED,
            ):
                successor = step
            elif step is not None and step.status == CandidateStatus.DUPLICATE:
                successor = self.records[step.duplicate_of or current.id]
            in_effect[period + 1] = successor.id
            if successor.id != current.id:
                chain.switch(self._policy(successor))

        sink = self.progress.evaluation_started(base, "train")
        report = run_evaluation(
            train,
            chain,
            self.lms,
            run_dir,
            self.resolved.episode,
            on_period_end=on_period_end,
            progress=sink,
            upper_bound=self.upper_bound,
        )
        self.chain_summary = report.summary
        self._score_chain(report, run_dir, in_effect, periods)
        finalists = list(dict.fromkeys(in_effect.values()))
        if self.optimizer.heldout == "final":
            finalists = list(dict.fromkeys([base.id, in_effect[periods - 1]]))
        for cid in finalists:
            self._evaluate(self.records[cid], "heldout")
        for generation in range(periods):
            self._store_chain_generation(generation, in_effect)

    def _propose_step(
        self, period: int, current: CandidateRecord, run_dir: Path
    ) -> CandidateRecord:
        optimizer = self.optimizer
        generation = period + 1
        cid = candidate_id(generation, 0)
        components = optimizer.mutate_components
        component = components[period % len(components)]
        results = load_period_results(run_dir, periods=range(period + 1))
        usage_before = self.lms.usage.snapshot()
        current_policy = self._policy(current)
        parse_failures = 0
        outcome: dict[str, Any] = {}
        feedback_text = ""
        mutation = Mutation(kind="reflective", component=component, feedback=optimizer.feedback)
        for attempt in range(optimizer.proposal_attempts):
            seed = derive_seed(self.spec.seed, "candidate", generation, 0, attempt)
            feedback, mutation = self._reflective_mutation(
                results, component, seed, attempt, periods=[period]
            )
            feedback_text = feedback.text
            outcome = self._reflect(current_policy, current, component, feedback.text, seed)
            parse_failures += outcome.pop("parse_failed", 0)
            if not outcome.get("invalid"):
                break
        usage = self.lms.usage.snapshot().minus(usage_before)
        policy = outcome.get("policy")
        status = CandidateStatus.INVALID if policy is None else CandidateStatus.PROPOSED
        key = (
            fingerprint(policy.kind, policy.components(), policy.parameters())
            if policy is not None
            else ""
        )
        duplicate_of = self._seen().get(key) if policy is not None else None
        if duplicate_of is not None:
            status = CandidateStatus.DUPLICATE
        record = CandidateRecord(
            id=cid,
            generation=generation,
            parent_ids=(current.id,),
            mutation=mutation,
            seed=outcome.get("seed", 0),
            fingerprint=key,
            kind=current.kind,
            components=policy.components() if policy is not None else dict(current.components),
            parameters=policy.parameters() if policy is not None else dict(current.parameters),
            status=status,
            duplicate_of=duplicate_of,
            invalid_reason=outcome.get("invalid"),
            reflection_calls=usage.total_calls - usage.cache_hits,
            reflection_tokens=usage.total_tokens,
            reflection_parse_failures=parse_failures,
        )
        self.store.save_feedback(cid, feedback_text)
        if status == CandidateStatus.PROPOSED:
            policy.save(self.store.policy_dir(cid), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        return self._save(record)

    def _score_chain(
        self,
        report: EvaluationReport,
        run_dir: Path,
        in_effect: Mapping[int, str],
        periods: int,
    ) -> None:
        """Each step's train score: the periods during which it was the policy in effect."""
        by_record: dict[str, list[int]] = {}
        for period in range(periods):
            by_record.setdefault(in_effect[period], []).append(period)
        for cid, record_periods in by_record.items():
            record = self.records[cid]
            scores = self._scores(report.users, run_dir, report.wall_time_s, record_periods)
            if record.train is not None and record.train == scores.model_copy(
                update={"wall_time_s": record.train.wall_time_s}
            ):
                continue  # already scored (a resumed, finished chain)
            record = self._save(
                record.model_copy(update={"train": scores, "status": CandidateStatus.EVALUATED})
            )
            self.tracker.log_candidate(
                record,
                split="train",
                parent=self.records.get(record.parent_ids[0]) if record.parent_ids else None,
                policy_dir=self.store.policy_dir(record.id),
                feedback=self.store.load_feedback(record.id),
            )

    def _store_chain_generation(self, generation: int, in_effect: Mapping[int, str]) -> None:
        active = self.records[in_effect[generation]]
        proposed = [candidate_id(generation, 0)] if generation > 0 else [active.id]
        proposed = [cid for cid in proposed if cid in self.records]
        score = None
        if active.train is not None and active.train.periods is not None:
            index = active.train.periods.index(generation)
            score = objective_value(active.train.per_period[index], self.optimizer.objective)
        calls = sum(self.records[cid].reflection_calls for cid in proposed)
        tokens = sum(self.records[cid].reflection_tokens for cid in proposed)
        if active.train is not None and active.train.periods is not None:
            index = active.train.periods.index(generation)
            calls += active.train.per_period[index].llm_calls
            tokens += active.train.per_period[index].tokens
        record = GenerationRecord(
            generation=generation,
            candidate_ids=proposed,
            evaluated_ids=[active.id],
            population=[active.id],
            best_id=active.id,
            best_train_score=score,
            mean_train_score=score,
            best_heldout_score=active.heldout.score if active.heldout is not None else None,
            llm_calls=calls,
            tokens=tokens,
        )
        if self.store.load_generation(generation) == record:
            return
        self.store.save_generation(record)
        self.tracker.log_generation(record, spent=self.budget.spent())
