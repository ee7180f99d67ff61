"""The population schedule on GEPA: `run_gepa` drives the generations; this mixin of the
loop turns GEPA's state into our frozen records (candidates with lineage, one generation
record per GEPA iteration), logs them to MLflow as iterations finish, and evaluates the
held-out users of each new best (from the adapter's callback) or of the final best.

Why one module: GEPA's state is translated into our records in one place, so that lineage,
statuses and held-out checks cannot drift between two files.

What GEPA does here: parent selection, component selection, minibatch acceptance, merge,
the metric-call budget and run_dir checkpoints. What stays ours and why: records and MLflow
lineage (GEPA keeps no operator, seed or held-out score per candidate), the budget over LLM
calls/tokens/wall time (a GEPA stop callback) and the interrupt event (GEPA knows neither).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gepa.core.callbacks import GEPACallback

from evolve.budget import BudgetExhausted
from evolve.config import ExperimentSpec
from evolve.optimize.gepa_engine import (
    AMemGymAdapter,
    GepaSettings,
    budget_stop,
    run_gepa,
    seed_candidate,
)
from evolve.optimize.operators import MutationOperator, build_operator, is_parameter
from evolve.optimize.parameters import ParameterProposer, RandomStepProposer
from evolve.records import (
    CandidateRecord,
    CandidateStatus,
    GenerationRecord,
    Mutation,
    best_of,
    candidate_id,
    candidate_record,
)
from evolve.seeds import derive_seed
from evolve.simulator.environment import Environment

# Under runs/<experiment>/: GEPA's run_dir (state, resumable) and the runner directories of
# every (candidate, user) evaluation, keyed by the candidate's fingerprint.
GEPA_DIR = "gepa"
EVALUATIONS_DIR = "evaluations"


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

    def __init__(self, evolution: Any, total: int) -> None:
        self.evolution, self.total = evolution, total
        self.start: Any = None
        self.final_state: Any = None
        self.rejected: dict[str, Any] | None = None  # this iteration's minibatch verdict

    def on_iteration_start(self, event: Any) -> None:
        self.evolution.progress.generation_started(int(event["iteration"]), self.total)
        self.start = self.evolution.budget.spent()
        self.rejected = None

    def on_candidate_rejected(self, event: Any) -> None:
        self.rejected = {
            "minibatch_score": float(event["new_score"]),
            "minibatch_parent_score": float(event["old_score"]),
            "reason": str(event["reason"]),
        }

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
                "rejected": self.rejected,
            }
        )
        self.evolution._sync_gepa(event["state"])

    def on_optimization_end(self, event: Any) -> None:
        self.final_state = event["final_state"]


class PopulationSchedule:
    """GEPA generations and their records. Mixed into the loop's `_Evolution`, which provides
    spec, optimizer, resolved, lms, store, records, budget, tracker, progress, reflector,
    upper_bound, stop and the helpers _base, _policy, _evaluate, _scores, _save, _provenance."""

    # ----- population schedule: GEPA -------------------------------------------------------

    def _operators(self) -> list[MutationOperator]:
        """Operators in ownership order (the first that owns a component mutates it):
        `optimizer.operators` when the spec names them, else tuned (its generations only),
        parameter, reflective. Operators that call the reflector are left out when
        `feedback = "none"` (no reflective proposal)."""
        optimizer = self.optimizer
        bounds = {name: optimizer.parameters[name] for name in optimizer.tunable_parameters()}
        names = optimizer.operators
        if names is None:
            names = [
                *(["tuned"] if optimizer.tune_every is not None else []),
                *(["parameter"] if bounds else []),
                "reflective",
            ]
        context = {
            "reflector": self.reflector,
            "proposer_factory": self.proposer_factory,
            "bounds": bounds,
            "policy_of": lambda candidate: self.adapter.policy(candidate),
            "environment": self.resolved.train,
            "lms": self.lms,
            "episode": self.resolved.episode,
            "work_dir": self.store.root / "tuning",
            "every": optimizer.tune_every,
            "trials": optimizer.tune_trials,
            "sampler": optimizer.tune_sampler,
            "objective": optimizer.objective,
            "upper_bound": self.upper_bound,
        }
        operators = [build_operator(name, **context) for name in names]
        if not optimizer.reflective_enabled():
            operators = [operator for operator in operators if not operator.reflective]
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
            stop=self.stop,
        )
        # Traces of GEPA's own evaluations (before a candidate has a record: by fingerprint).
        self.adapter.progress_for = lambda split, fingerprint: self.tracker.evaluation_sink(
            split, None, fingerprint=fingerprint
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
            stop_when=budget_stop(self.budget, self.stop),
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
        # Every evaluation the records below still need, played at once under the one call
        # limit (e.g. the final held-out checks of the base and the best).
        needed: list[tuple[int, str, list[str]]] = []
        for index in range(len(state.program_candidates)):
            record = self.records.get(self._gepa_id(index))
            if record is None or record.train is None:
                needed.append((index, "train", train))
            missing_heldout = record is None or record.heldout is None
            if missing_heldout and index in heldout_idx and heldout_users:
                needed.append((index, "heldout", heldout_users))
        results = iter(
            adapter.run_jobs(
                [
                    (state.program_candidates[index], user, split)
                    for index, split, users in needed
                    for user in users
                ]
            )
        )
        played = {(i, split): [next(results) for _ in users] for i, split, users in needed}
        for index, candidate in enumerate(state.program_candidates):
            cid = self._gepa_id(index)
            record = self.records.get(cid)
            if record is None:
                record = self._gepa_candidate(index, candidate, state)
            if record.train is None:
                users = played[(index, "train")]
                scores = self._scores(users, self._gepa_dir("train", candidate), 0.0)
                record = self._save(
                    record.model_copy(update={"train": scores, "status": CandidateStatus.EVALUATED})
                )
                self._log(record, "train")
            if record.heldout is None and index in heldout_idx and heldout_users:
                users = played[(index, "heldout")]
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
            # Text components are proposed by the reflector (reflective, list_edit, plugins).
            reflected = bool(texts)
            edits = {
                component: dict(applied)
                for p in proposals
                for component, applied in p.get("detail", {}).items()
                if isinstance(applied, dict) and {"added", "removed"} <= set(applied)
            }
            mutation = Mutation(
                kind=kind,
                component=texts[0] if texts else None,
                feedback=self.optimizer.feedback if reflected else None,
                temperature=self.reflector.temperature if reflected else None,
                parameter_changes=changes,
                rollout_id=proposals[0]["seed"] if proposals else None,
                edits=edits,
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
            reflection_calls=sum(int(p.get("llm_calls", 0)) for p in proposals),
            reflection_tokens=sum(int(p.get("tokens", 0)) for p in proposals),
        )
        feedback = "\n\n".join(
            text for p in proposals for text in p.get("feedback", {}).values() if text
        )
        if feedback:
            self.store.save_feedback(cid, feedback)
        if status != CandidateStatus.INVALID and not self.store.policy_dir(cid).exists():
            policy.save(self.store.policy_dir(cid), provenance=self._provenance(record))
        self.progress.candidate_proposed(record)
        self.tracker.log_proposal(record, **self._proposal_details(record, candidate))
        return self._save(record)

    def _proposal_details(
        self, record: CandidateRecord, candidate: Mapping[str, str]
    ) -> dict[str, Any]:
        """What the tracker is told of a proposal: its parent, files, and for one GEPA
        rejected on its minibatch, where that was played, the scores and GEPA's reason."""
        details: dict[str, Any] = {
            "parent": self.records.get(record.parent_ids[0]) if record.parent_ids else None,
            "policy_dir": self.store.policy_dir(record.id),
            "feedback": self.store.load_feedback(record.id),
        }
        if record.status == CandidateStatus.REJECTED:
            entry = next(
                (e for e in self.adapter.iterations if e["iteration"] == record.generation), {}
            )
            verdict = dict(entry.get("rejected") or {})
            details["reason"] = verdict.pop("reason", None)
            details["scores"] = verdict
            details["evaluation_dir"] = self._gepa_dir("train", candidate)
        return details

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
