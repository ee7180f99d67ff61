"""The self-evolution loop: P_{k+1} = G(P_k, F_k), with a population, held-out users and lineage.

Two schedules:

- ``population`` (default): GEPA (`gepa.optimize`, see `gepa_engine`) evolves the base
  policy's mutable components (text instructions and numeric parameters). One GEPA iteration
  is one generation: GEPA selects a parent (`candidate_selection`), the component(s) to mutate
  (`module_selector`), one of our operators proposes the child (reflective, parameter,
  tuned), GEPA tries it on a minibatch of train users and keeps it if it is better
  (`acceptance`), then scores it on all train users. Each new best is evaluated on the
  held-out users (never shown to GEPA). Our frozen records (candidates with lineage, one
  generation record per iteration) are built from GEPA's state at each iteration's end.
- ``per_period`` (the paper's setup, AMemGym Table 3): one on-policy train run in which, after
  each period, the reflector rewrites the mutable component(s) from that period's feedback
  and the episode continues with the new instructions and the same memory. Each step is a
  candidate (generation = the period from which it is in effect); the base and the final
  policy (or every step) are also evaluated on held-out users from scratch.

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

import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gepa.core.callbacks import GEPACallback

from evolve.budget import Budget, BudgetExhausted
from evolve.config import ExperimentSpec, ResolvedExperiment, resolve
from evolve.llm import RoleLMs
from evolve.objective import load_period_results, objective_used, objective_value
from evolve.optimize.feedback import build_feedback
from evolve.optimize.gepa_engine import (
    AMemGymAdapter,
    GepaSettings,
    budget_stop,
    run_gepa,
    seed_candidate,
)
from evolve.optimize.operators import MutationOperator, build_operator, is_parameter
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.optimize.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    ExperimentResult,
    GenerationRecord,
    Mutation,
    best_of,
    candidate_id,
    candidate_record,
    fingerprint,
)
from evolve.optimize.reflect import Reflector
from evolve.optimize.report import format_lineage, format_table
from evolve.optimize.store import ExperimentStore
from evolve.simulator.environment import Environment
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.runner import EvaluationReport, ProgressSink, run_evaluation
from evolve.simulator.user import derive_seed
from evolve.tracking import ExperimentTracker, NullTracker, TrackingContext

# Under runs/<experiment>/: GEPA's run_dir (state, resumable) and the runner directories of
# every (candidate, user) evaluation, keyed by the candidate's fingerprint.
GEPA_DIR = "gepa"
EVALUATIONS_DIR = "evaluations"


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
        proposer_factory=proposer_factory or (lambda: default_proposer(resolved.spec)),
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


class _GenerationSync(GEPACallback):
    """One GEPA iteration = one generation: its spend is logged and our records are synced
    from GEPA's state at its end (so MLflow steps follow iterations as they finish)."""

    def __init__(self, evolution: _Evolution, total: int) -> None:
        self.evolution, self.total = evolution, total
        self.start: Any = None
        self.final_state: Any = None

    def on_iteration_start(self, event: Any) -> None:
        self.evolution.progress.generation_started(int(event["iteration"]), self.total)
        self.start = self.evolution.budget.spent()

    def on_iteration_end(self, event: Any) -> None:
        end = self.evolution.budget.spent()
        start = self.start or end
        self.evolution.adapter.iterations.append(
            {
                "iteration": int(event["iteration"]),
                "accepted": bool(event["proposal_accepted"]),
                "llm_calls_start": start.llm_calls,
                "llm_calls_end": end.llm_calls,
                "tokens_start": start.tokens,
                "tokens_end": end.tokens,
                "wall_time_s": end.wall_time_s - start.wall_time_s,
            }
        )
        self.evolution._sync_gepa(event["state"])

    def on_optimization_end(self, event: Any) -> None:
        self.final_state = event["final_state"]


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

    # ----- population schedule: GEPA -------------------------------------------------------

    def _operators(self) -> list[MutationOperator]:
        """Operators in ownership order: tuned (its generations only), parameter, reflective."""
        optimizer = self.optimizer
        bounds = {name: optimizer.parameters[name] for name in optimizer.tunable_parameters()}
        operators: list[MutationOperator] = []
        if optimizer.tune_every is not None:
            operators.append(
                build_operator(
                    "tuned",
                    policy_of=lambda candidate: self.adapter.policy(candidate),
                    environment=self.resolved.train,
                    lms=self.lms,
                    episode=self.resolved.episode,
                    work_dir=self.store.root / "tuning",
                    bounds=bounds,
                    every=optimizer.tune_every,
                    trials=optimizer.tune_trials,
                    sampler=optimizer.tune_sampler,
                    objective=optimizer.objective,
                    upper_bound=self.upper_bound,
                )
            )
        if bounds:
            operators.append(
                build_operator("parameter", proposer_factory=self.proposer_factory, bounds=bounds)
            )
        if optimizer.reflective_enabled():
            operators.append(build_operator("reflective", reflector=self.reflector))
        return operators

    def _run_population(self) -> None:
        optimizer = self.optimizer
        base = self._base()
        base_policy = self._policy(base)
        train = [item.id for item in self.resolved.train.items]
        heldout = [item.id for item in self.resolved.heldout.items]
        self.adapter = AMemGymAdapter(
            base_policy=base_policy,
            environment=Environment(
                items=[*self.resolved.train.items, *self.resolved.heldout.items]
            ),
            lms=self.lms,
            episode=self.resolved.episode,
            work_dir=self.store.root / EVALUATIONS_DIR,
            operators=self._operators(),
            objective=optimizer.objective,
            feedback=optimizer.feedback,
            max_feedback_failures=optimizer.max_feedback_failures,
            max_feedback_chars=optimizer.max_feedback_chars,
            upper_bound=self.upper_bound,
            seed=self.spec.seed,
        )
        # feedback = "none": no reflective mutation (the unevolved-instructions control).
        texts = optimizer.mutate_components if optimizer.reflective_enabled() else []
        start = seed_candidate(base_policy, texts, optimizer.tunable_parameters())
        if not start:
            self._evaluate_base_only(base)
            return
        generations = optimizer.generations
        minibatch = min(optimizer.reflection_minibatch_size, len(train))
        settings = GepaSettings(
            candidate_selection=optimizer.candidate_selection,
            use_merge=optimizer.use_merge,
            reflection_minibatch_size=optimizer.reflection_minibatch_size,
            acceptance=optimizer.acceptance,
            module_selector=optimizer.module_selector,
            # Enough user evaluations for every generation: parent and child on a minibatch,
            # an accepted child on all train users (finished ones are read back, not replayed).
            max_metric_calls=optimizer.max_metric_calls
            or len(train) + generations * (2 * minibatch + len(train)),
            max_generations=generations,
        )
        every_generation = optimizer.heldout == "every_generation"
        self.progress.generation_started(0, generations)
        sync = _GenerationSync(self, generations)
        run_gepa(
            self.adapter,
            train_users=train,
            heldout_users=heldout if every_generation else [],
            seed_candidate=start,
            settings=settings,
            run_dir=self.store.root / GEPA_DIR,
            seed=self.spec.seed,
            stop_when=budget_stop(self.budget),
            callbacks=[sync],
        )
        state = sync.final_state
        if not every_generation and heldout and state is not None:
            best = max(
                range(len(state.program_candidates)),
                key=lambda i: (state.program_full_scores_val_set[i], -i),
            )
            self.final_heldout = {0, best}
        if state is not None:
            self._sync_gepa(state)
        if self.budget.exhausted() is not None:
            raise BudgetExhausted(self.budget.exhausted() or "budget exhausted")

    def _evaluate_base_only(self, base: CandidateRecord) -> None:
        """Nothing may mutate (feedback = "none" and no numeric parameter): GEPA needs at
        least one component, so the base is scored directly, as generation 0."""
        self.progress.generation_started(0, 0)
        base = self._evaluate(base, "train")
        if self.resolved.heldout.items:
            base = self._evaluate(base, "heldout")
        assert base.train is not None
        spent = [s for s in (base.train, base.heldout) if s is not None]
        record = GenerationRecord(
            generation=0,
            candidate_ids=[base.id],
            evaluated_ids=[base.id],
            population=[base.id],
            best_id=base.id,
            best_train_score=base.train.score,
            mean_train_score=base.train.score,
            best_heldout_score=base.heldout.score if base.heldout is not None else None,
            llm_calls=sum(s.summary.llm_calls for s in spent),
            tokens=sum(s.summary.tokens for s in spent),
        )
        if self.store.load_generation(0) != record:
            self.store.save_generation(record)
            self.tracker.log_generation(record, spent=self.budget.spent())

    def _gepa_id(self, index: int) -> str:
        generation = self.adapter.discovered.get(index, 0)
        return candidate_id(generation, 0)

    def _sync_gepa(self, state: Any) -> None:
        """Our frozen records from GEPA's state: every pool candidate (train scores, held-out
        scores of each new best) and every finished generation; stored once, logged once."""
        adapter = self.adapter
        train = [item.id for item in self.resolved.train.items]
        heldout_users = [item.id for item in self.resolved.heldout.items]
        heldout_idx = {entry["candidate_idx"] for entry in adapter.heldout} | self.final_heldout
        for index, candidate in enumerate(state.program_candidates):
            cid = self._gepa_id(index)
            record = self.records.get(cid)
            if record is None:
                record = self._gepa_candidate(index, candidate, state)
            if record.train is None:
                users = adapter.run_users(candidate, train)
                scores = self._scores(users, self._gepa_dir("train", candidate), 0.0)
                record = self._save(
                    record.model_copy(update={"train": scores, "status": CandidateStatus.EVALUATED})
                )
                self._log(record, "train")
            if record.heldout is None and index in heldout_idx and heldout_users:
                users = adapter.run_users(candidate, heldout_users, split="heldout")
                scores = self._scores(users, self._gepa_dir("heldout", candidate), 0.0)
                record = self._save(record.model_copy(update={"heldout": scores}))
                self._log(record, "heldout")
        pooled = {self.adapter.discovered.get(i, 0) for i in range(len(state.program_candidates))}
        for entry in adapter.iterations:
            generation = int(entry["iteration"])
            if generation not in pooled and candidate_id(generation, 0) not in self.records:
                self._gepa_outside_pool(generation, state)
        front = sorted(
            {self._gepa_id(i) for ids in state.program_at_pareto_front_valset.values() for i in ids}
        )
        entries = [{"iteration": 0}, *adapter.iterations]
        for entry in entries:
            self._store_gepa_generation(int(entry["iteration"]), entry, front, state)

    def _gepa_dir(self, split: str, candidate: Mapping[str, str]) -> Path:
        return self.adapter.work_dir / split / self.adapter.fingerprint(candidate)[:16]

    def _gepa_candidate(
        self, index: int, candidate: Mapping[str, str], state: Any
    ) -> CandidateRecord:
        """The record of a candidate in GEPA's pool (index 0: the base)."""
        generation = self.adapter.discovered.get(index, 0)
        parents = [p for p in state.parent_program_for_candidate[index] if p is not None]
        return self._gepa_record(
            generation, candidate, [self._gepa_id(p) for p in parents], CandidateStatus.PROPOSED
        )

    def _gepa_outside_pool(self, generation: int, state: Any) -> CandidateRecord | None:
        """A generation whose proposal did not join GEPA's pool: rejected on its minibatch,
        or invalid (no usable text). None: nothing was proposed (e.g. a skipped merge)."""
        proposals = [p for p in self.adapter.proposals if p["iteration"] == generation]
        if not proposals or proposals[0].get("parent") is None:
            return None
        parent_idx = int(proposals[0]["parent"])
        candidate = dict(state.program_candidates[parent_idx])
        for proposal in proposals:
            candidate.update(proposal["components"])
        usable = any(p["components"] for p in proposals)
        status = CandidateStatus.REJECTED if usable else CandidateStatus.INVALID
        reason = None if usable else next((p["invalid"] for p in proposals if p["invalid"]), None)
        return self._gepa_record(
            generation, candidate, [self._gepa_id(parent_idx)], status, invalid_reason=reason
        )

    def _gepa_record(
        self,
        generation: int,
        candidate: Mapping[str, str],
        parent_ids: Sequence[str],
        status: CandidateStatus,
        invalid_reason: str | None = None,
    ) -> CandidateRecord:
        cid = candidate_id(generation, 0)
        policy = self.adapter.policy(candidate)
        proposals = [p for p in self.adapter.proposals if p["iteration"] == generation]
        if generation == 0:
            mutation, seed = Mutation(kind="base"), self.spec.seed
        else:
            parent = self.records[parent_ids[0]]
            changes = {
                name: (parent.parameters[name], value)
                for name, value in policy.parameters().items()
                if name in parent.parameters and value != parent.parameters[name]
            }
            # No operator proposal in a generation that made a candidate: GEPA merged two.
            kind = proposals[0]["operator"] if proposals else "merge"
            texts = [
                c for c in (proposals[0]["feedback"] if proposals else {}) if not is_parameter(c)
            ]
            mutation = Mutation(
                kind=kind,
                component=texts[0] if texts else None,
                feedback=self.optimizer.feedback if kind == "reflective" else None,
                temperature=self.optimizer.reflector_temperature if kind == "reflective" else None,
                parameter_changes=changes,
                rollout_id=proposals[0]["seed"] if proposals else None,
            )
            seed = (
                proposals[0]["seed"]
                if proposals
                else derive_seed(self.spec.seed, "propose", generation)
            )
        record = candidate_record(
            cid,
            generation=generation,
            policy=policy,
            mutation=mutation,
            seed=seed,
            parent_ids=parent_ids,
            status=status,
            invalid_reason=invalid_reason,
            reflection_parse_failures=sum(int(p.get("parse_failed", False)) for p in proposals),
        )
        feedback = "\n\n".join(
            text for p in proposals for text in p.get("feedback", {}).values() if text
        )
        if feedback:
            self.store.save_feedback(cid, feedback)
        if status != CandidateStatus.INVALID and not self.store.policy_dir(cid).exists():
            policy.save(self.store.policy_dir(cid), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        return self._save(record)

    def _store_gepa_generation(
        self, generation: int, entry: Mapping[str, Any], front: Sequence[str], state: Any
    ) -> None:
        known = [
            self.records[self._gepa_id(i)]
            for i in range(len(state.program_candidates))
            if self.adapter.discovered.get(i, 0) <= generation and self._gepa_id(i) in self.records
        ]
        new = [r.id for r in known if r.generation == generation]
        proposed = (
            [candidate_id(generation, 0)] if candidate_id(generation, 0) in self.records else []
        )
        best = best_of(known, "train")
        scores = [r.train.score for r in known if r.train is not None]
        if generation == 0:
            base = self.records[candidate_id(0, 0)]
            calls = sum(s.summary.llm_calls for s in (base.train, base.heldout) if s is not None)
            tokens = sum(s.summary.tokens for s in (base.train, base.heldout) if s is not None)
        else:
            calls = int(entry["llm_calls_end"] - entry["llm_calls_start"])
            tokens = int(entry["tokens_end"] - entry["tokens_start"])
        record = GenerationRecord(
            generation=generation,
            candidate_ids=proposed,
            evaluated_ids=new,
            population=list(front),
            best_id=best.id if best is not None else None,
            best_train_score=best.train.score if best is not None and best.train else None,
            mean_train_score=sum(scores) / len(scores) if scores else None,
            best_heldout_score=best.heldout.score if best is not None and best.heldout else None,
            llm_calls=calls,
            tokens=tokens,
            wall_time_s=float(entry.get("wall_time_s", 0.0)),
        )
        stored = self.store.load_generation(generation)
        if stored is not None and (
            stored.model_copy(update={"population": record.population}) == record
        ):
            return
        self.store.save_generation(record)
        self.tracker.log_generation(record, spent=self.budget.spent())

    def _log(self, record: CandidateRecord, split: str) -> None:
        self.progress.evaluation_finished(record, split)
        self.tracker.log_candidate(
            record,
            split=split,
            parent=self.records.get(record.parent_ids[0]) if record.parent_ids else None,
            policy_dir=self.store.policy_dir(record.id),
            feedback=self.store.load_feedback(record.id),
        )

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
