"""The self-evolution loop: P_{k+1} = G(P_k, F_k), with a population, held-out users and lineage.

This module holds what both schedules share (the store, the budget, the upper bound,
evaluations and scores, the experiment result); the schedules are mixins in their own
modules, `population` (GEPA) and `chain` (the paper's per-period chain). Two schedules:

- ``population`` (default): GEPA (`gepa.optimize`, see `gepa_engine`) evolves the base
  policy's mutable components (text instructions and numeric parameters). One GEPA iteration
  is one generation: GEPA selects a parent (`candidate_selection`), the component(s) to mutate
  (`module_selector`), one of our operators proposes the child (reflective, parameter,
  tuned), GEPA tries it on a minibatch of train users and keeps it if it is better
  (`acceptance`), then scores it on all train users. Each new best is evaluated on the
  held-out users (never shown to GEPA). Our frozen records (candidates with lineage, one
  generation record per iteration) are built from GEPA's state at each iteration's end.
- ``per_period`` (the paper's setup, AMemGym Table 3): one on-policy train run with one
  evolving chain per user: after each period, the reflector rewrites a mutable component of
  each user's policy from that user's feedback of the period, and the user's episode
  continues with the new instructions and the same memory (see `chain`). Each step is a
  candidate (generation = the period from which it is in effect); with held-out users, the
  base and the final policies (or every step) are also evaluated on them from scratch.

The reflector: the `reflector` role at `reflector_temperature`; under `protocol = "paper"`,
as in the paper, the agent's own model at temperature 0 unless `[llm.reflector]` names
another model (or `reflector_temperature` is set). Which one answered is in the run's
identity (`reflector`).

Optuna in the population schedule: `parameter_proposer = "optuna"` makes the parameter
operator ask an Optuna TPE sampler told every candidate's train score; `tune_every = N` makes
the tuned operator run a short study on the parent in every N-th generation.

What GEPA does for us: parent selection (Pareto front over train users), minibatch
acceptance, merge, the metric-call budget and its run_dir checkpoints. What stays ours: the
adapter (episodes, per-user scores, feedback), the operators, the records/MLflow lineage,
the budget over LLM calls/tokens/wall time (a GEPA stop callback) and the per-period chain.

The simulated user is never mutated: it is not part of a policy. Every unit (a candidate's
proposal, its evaluation on a split, a generation) is stored when finished and never
recomputed (`store`); the budget is checked before each unit and at every period barrier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evolve.budget import Budget, BudgetExhausted
from evolve.config import ExperimentSpec, ResolvedExperiment, resolve
from evolve.llm import RoleLMs
from evolve.objective import objective_used, objective_value
from evolve.optimize.chain import ChainSchedule
from evolve.optimize.gepa_engine import (
    AMemGymAdapter,
)
from evolve.optimize.parameters import ParameterProposer
from evolve.optimize.population import PopulationSchedule, default_proposer
from evolve.optimize.reflect import Reflector
from evolve.optimize.report import format_lineage, format_table
from evolve.optimize.store import ExperimentStore
from evolve.protocol import rules_for
from evolve.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    ExperimentResult,
    Mutation,
    best_of,
    candidate_id,
    candidate_record,
)
from evolve.simulator.environment import Environment
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.runner import ProgressSink, run_evaluation
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
    proposer_factory: Callable[[], ParameterProposer] | None = None,
    upper_bound_cache: str | Path | None = None,
    refresh_upper_bound: bool = False,
    stop: threading.Event | None = None,
) -> ExperimentResult:
    """Run (or resume) an experiment; returns its records. Stops cleanly on the budget.

    `refresh_upper_bound` asks every upper-bound question again instead of using the cache.
    `stop` (the CLI's interrupt event) makes in-flight evaluations stop at their next unit.
    """
    resolved = experiment if isinstance(experiment, ResolvedExperiment) else resolve(experiment)
    evolution = _Evolution(
        resolved,
        lms,
        runs_dir=Path(runs_dir),
        tracker=tracker or NullTracker(),
        progress=progress or LoopProgress(),
        proposer_factory=proposer_factory or (lambda: default_proposer(resolved.spec)),
        upper_bound_cache=Path(upper_bound_cache) if upper_bound_cache else None,
    )
    evolution.refresh_upper_bound = refresh_upper_bound
    evolution.stop = stop
    return evolution.run()


def reflector_setup(spec: ExperimentSpec) -> tuple[str, float]:
    """(LM role, temperature) of the reflector: under the paper's protocol the agent's own
    model at temperature 0, unless the spec names a reflector model or temperature."""
    temperature = spec.optimizer.reflector_temperature
    if spec.protocol != "paper":
        return "reflector", temperature
    if "reflector_temperature" not in spec.optimizer.model_fields_set:
        temperature = 0.0
    return ("reflector" if spec.llm.reflector is not None else "agent"), temperature


class _Evolution(PopulationSchedule, ChainSchedule):
    def __init__(
        self,
        resolved: ResolvedExperiment,
        lms: RoleLMs,
        *,
        runs_dir: Path,
        tracker: ExperimentTracker,
        progress: LoopProgress,
        proposer_factory: Callable[[], ParameterProposer],
        upper_bound_cache: Path | None,
    ) -> None:
        self.resolved = resolved
        self.spec = resolved.spec
        self.optimizer = resolved.spec.optimizer
        self.lms = lms
        self.store = ExperimentStore(runs_dir / resolved.spec.name)
        self.tracker = tracker
        self.progress = progress
        # A fresh proposer per parameter proposal, told the history (exact on resume).
        self.proposer_factory = proposer_factory
        self.adapter: AMemGymAdapter
        self.final_heldout: set[int] = set()
        self.stop: threading.Event | None = None
        self.upper_bound_cache = upper_bound_cache
        self.reflector_role, temperature = reflector_setup(resolved.spec)
        rules = rules_for(resolved.spec.protocol)
        # The reference caps no reflector text: under its prompt, only a length the spec
        # sets explicitly applies.
        length_set = "max_instruction_chars" in self.optimizer.model_fields_set
        self.reflector = Reflector(
            lms,
            temperature=temperature,
            max_chars=self.optimizer.max_instruction_chars
            if rules.reflector_prompt == "hinted" or length_set
            else None,
            role=self.reflector_role,
            # Proposal checks and structured edits are ours; the paper's reflector is unchecked.
            check_proposals=rules.structured_edits,
            prompt=rules.reflector_prompt,
        )
        self.records: dict[str, CandidateRecord] = {}
        self.upper_bound: Any = None
        self.refresh_upper_bound = False
        self.chain_summary: MetricSummary | None = None

    # ----- top level ------------------------------------------------------------------------

    def run(self) -> ExperimentResult:
        model_names = self.lms.model_names()
        identity = self.resolved.identity(model_names)
        if self.spec.protocol == "paper":  # recorded (added only here: older runs keep hashes)
            identity["reflector"] = {
                "role": self.reflector_role,
                "model": model_names.get(self.reflector_role),
                "temperature": self.reflector.temperature,
            }
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
                # The model that actually reflects (the agent's, under the paper's protocol).
                model_names={**model_names, "reflector": model_names[self.reflector_role]},
                environment=self.resolved.environment_description,
                train_users=[item.id for item in self.resolved.train.items],
                heldout_users=[item.id for item in self.resolved.heldout.items],
                registered_model=self.spec.registered_model_name(),
            )
        )
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
            max_tokens={
                "simulator": self.lms.identity("simulator").get("max_tokens"),
                "agent": self.lms.identity("agent").get("max_tokens"),
                "reflector": self.lms.identity(self.reflector_role).get("max_tokens"),
            },
            protocol=self.spec.protocol,
        )

    def _prepare_upper_bound(self) -> None:
        from evolve.paths import cache_dir
        from evolve.simulator.baselines import compute_upper_bound

        self.progress.stage("upper bound")
        # One table for train + held-out users (the runner accepts a superset).
        users = Environment(items=[*self.resolved.train.items, *self.resolved.heldout.items])
        self.upper_bound = compute_upper_bound(
            users,
            self.lms,
            self.upper_bound_cache or cache_dir() / "upper_bound",
            concurrency=self.spec.concurrency,
            refresh=self.refresh_upper_bound,
            protocol=self.spec.protocol,
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
        record = candidate_record(
            base_id,
            generation=0,
            policy=policy,
            mutation=Mutation(kind="base"),
            seed=self.spec.seed,
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
        sink = self.tracker.evaluation_sink(
            split, self.progress.evaluation_started(record, split), record=record
        )
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
