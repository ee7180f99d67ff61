"""The paper's per-period chain (AMemGym Table 3, `schedule = "per_period"`): one on-policy
train run in which, after each period, the reflector rewrites the mutable component(s) from
that period's feedback and the episode continues with the new instructions and the same
memory. Each step is a candidate (generation = the period from which it is in effect); the
base and the final policy (or every step) are also evaluated on held-out users from scratch.
A mixin of the loop's `_Evolution` (it shares the store, records and evaluation helpers).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evolve.objective import load_period_results, objective_value
from evolve.optimize.feedback import build_feedback
from evolve.records import (
    CandidateRecord,
    CandidateStatus,
    GenerationRecord,
    Mutation,
    candidate_id,
    fingerprint,
)
from evolve.simulator.metrics import MetricSummary
from evolve.simulator.runner import EvaluationReport, run_evaluation
from evolve.simulator.user import derive_seed


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


class ChainSchedule:
    """The per-period chain and the reflective proposals it makes. Mixed into the loop's
    `_Evolution`, which provides the store, records, budget, tracker and evaluation helpers."""

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
