"""The paper's per-period schedule (AMemGym Table 3, `schedule = "per_period"`): one evolving
chain per train user.

One on-policy train run over all train users. After each period p (a barrier: every user
has finished p), each user's reflector step rewrites one mutable component of the policy in
effect for that user, from that user's period-p feedback only; the user's episode continues
in period p+1 with the new instructions and the same memory. The runner plays each
user-period with the policy its chain has in effect (`PerUserChains`, a
`runner.PolicySchedule`), so no proxy policy stands in for the chains. How one step is
proposed (the user's feedback, the reflector's attempts, the candidate it becomes) is
`chain_step`; this module decides which candidate is in effect when, and scores and records
the chains.

Records: the base is `g00-c0`, shared by every chain; the step of train user number i in
effect from period p+1 on is `g{p+1}-c{i}` (its `user_id` names the chain). A step is scored on
the user-periods during which it was in effect. The paper's number is the memory score of
the evolving run over all users and periods (`chain_summary`). Each user's final policy is
saved as a bundle under `chain/final/<user>/` (index: `chain/final_policies.json`). With
held-out users, the base and the final policies (or every step) are also evaluated on them
from scratch; the paper has none (`heldout_users = 0`).

Resumption: steps are stored when proposed and user-periods when played, so a rerun after
a kill replays neither; the chains are rebuilt from the stored steps at each barrier.

Hand-written on purpose: GEPA has no notion of a policy that changes inside an episode.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from typing import Any

from evolve.core.files import atomic_write_json
from evolve.optimize.chain_step import propose_chain_step, refuse_unowned_components
from evolve.optimize.context import EvolutionContext, Schedule
from evolve.optimize.experiment_dir import HELDOUT_STAGE, ExperimentDir
from evolve.optimize.operator_set import build_operators, operators_for_ownership
from evolve.results.objective import load_period_results, objective_value
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    candidate_id,
)
from evolve.simulator.evaluation import EvaluationReport, run_evaluation
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.run_dir import safe_name


class PerUserChains:
    """Which candidate each user's chain has in effect in each period (a PolicySchedule).

    `assign` runs on the loop's thread at period barriers and loads the policy there, so
    `policy_for` (called from the runner's workers) only reads.
    """

    def __init__(self, identity: Mapping[str, Any], load: Callable[[str], Any]) -> None:
        self._identity = dict(identity)
        self._load = load
        self._policies: dict[str, Any] = {}
        self.in_effect: dict[str, dict[int, str]] = {}

    def assign(self, user_id: str, period_index: int, candidate: str) -> None:
        if candidate not in self._policies:
            self._policies[candidate] = self._load(candidate)
        self.in_effect.setdefault(user_id, {})[period_index] = candidate

    def policy_for(self, user_id: str, period_index: int) -> Any:
        return self._policies[self.in_effect[user_id][period_index]]

    def identity(self) -> dict[str, Any]:
        return dict(self._identity)

    def final(self, user_id: str) -> str:
        periods = self.in_effect[user_id]
        return periods[max(periods)]


def save_final_policies(
    experiment_dir: ExperimentDir, items: list[Any], chains: PerUserChains
) -> None:
    """Each user's final policy as a bundle (a copy of its candidate's bundle)."""
    root = experiment_dir.root / "chain" / "final"
    index: dict[str, dict[str, str]] = {}
    for item in items:
        cid = chains.final(item.id)
        target = root / safe_name(str(item.id))
        if target.exists():
            shutil.rmtree(target)  # a rerun may extend the chain (more periods on disk)
        shutil.copytree(experiment_dir.policy_dir(cid), target)
        index[item.id] = {
            "candidate": cid,
            "bundle": str(target.relative_to(experiment_dir.root)),
        }
    atomic_write_json(experiment_dir.root / "chain" / "final_policies.json", index)


class ChainSchedule(Schedule):
    """The per-user chains: which step is in effect when (each step proposed by
    `propose_chain_step`), and the scores and records of the chains."""

    name = "per_period"

    @classmethod
    def check_spec(cls, spec: Any) -> None:
        refuse_unowned_components(operators_for_ownership(spec), spec.optimizer.mutate_components)

    def run(self, context: EvolutionContext) -> None:
        base = context.base()
        items = list(context.resolved.train.items)
        periods = max(len(item.periods) for item in items)
        run_dir = context.experiment_dir.root / "chain" / "train"
        operators = build_operators(context, context.policy(base))
        chains = PerUserChains(
            {
                "schedule": "per_user_chains",
                "base": base.fingerprint,
                "feedback": context.optimizer.feedback,
                "mutate_components": list(context.optimizer.mutate_components),
                "operators": [operator.name for operator in operators],
            },
            lambda cid: context.policy(context.records[cid]),
        )
        for item in items:
            chains.assign(item.id, 0, base.id)
        context.progress.generation_started(0, periods - 1)

        def on_period_end(period: int, _summary: MetricSummary) -> None:
            announced = False
            results: list[PeriodResult] | None = None
            for index, item in enumerate(items):
                if len(item.periods) <= period + 1:
                    continue  # this user's chain has ended
                current = context.records[chains.in_effect[item.id][period]]
                step = context.records.get(candidate_id(period + 1, index))
                if step is None and context.optimizer.reflective_enabled():
                    context.budget.check()
                    if not announced:
                        context.progress.generation_started(period + 1, periods - 1)
                        announced = True
                    if results is None:
                        results = load_period_results(run_dir, periods=[period])
                    own = [r for r in results if r.user_id == item.id]
                    step = propose_chain_step(
                        context, operators, period, index, item.id, current, own
                    )
                chains.assign(item.id, period + 1, self._successor(context, current, step).id)

        sink = context.progress.evaluation_started(base, "train")
        report = run_evaluation(
            context.resolved.train,
            context.policy(base),
            context.lms,
            run_dir,
            context.resolved.episode,
            on_period_end=on_period_end,
            progress=sink,
            upper_bound=context.upper_bound,
            policy_schedule=chains,
        )
        self.summary = report.summary
        self._score_chain(context, report, run_dir, chains)
        save_final_policies(context.experiment_dir, items, chains)
        if context.resolved.heldout.items:
            finals = [chains.final(item.id) for item in items]
            if context.optimizer.heldout == "final":
                finalists = [base.id, *finals]
            else:
                finalists = [cid for item in items for cid in chains.in_effect[item.id].values()]
            with context.experiment_dir.spend_stage(HELDOUT_STAGE, context.budget.spent):
                for cid in dict.fromkeys(finalists):
                    context.evaluate(context.records[cid], "heldout")
        for generation in range(periods):
            self._store_chain_generation(context, generation, items, chains, report)

    def _successor(
        self, context: EvolutionContext, current: CandidateRecord, step: CandidateRecord | None
    ) -> CandidateRecord:
        """The candidate in effect after a step: the step if usable, else the current one."""
        if step is None:
            return current
        if step.status in (CandidateStatus.PROPOSED, CandidateStatus.EVALUATED):
            return step
        if step.status == CandidateStatus.DUPLICATE:
            return context.records[step.duplicate_of or current.id]
        return current

    def _score_chain(
        self,
        context: EvolutionContext,
        report: EvaluationReport,
        run_dir: Any,
        chains: PerUserChains,
    ) -> None:
        """Each step's train score: the user-periods during which it was in effect."""
        in_effect: dict[str, dict[str, set[int]]] = {}
        for user_id, periods in chains.in_effect.items():
            for period, cid in periods.items():
                in_effect.setdefault(cid, {}).setdefault(user_id, set()).add(period)
        for cid, by_user in in_effect.items():
            record = context.records[cid]
            users = [
                UserResult(
                    user_id=user.user_id,
                    periods=[p for p in user.periods if p.period_index in by_user[user.user_id]],
                )
                for user in report.users
                if user.user_id in by_user
            ]
            periods = sorted(set().union(*by_user.values()))
            scores = context.scores(users, run_dir, report.wall_time_s, periods)
            if record.train is not None and record.train == scores.model_copy(
                update={"wall_time_s": record.train.wall_time_s}
            ):
                continue  # already scored (a resumed, finished chain)
            record = context.save(
                record.model_copy(update={"train": scores, "status": CandidateStatus.EVALUATED})
            )
            context.log_candidate(record, "train")

    def _store_chain_generation(
        self,
        context: EvolutionContext,
        generation: int,
        items: list[Any],
        chains: PerUserChains,
        report: EvaluationReport,
    ) -> None:
        """Generation g: period g of every chain (the steps proposed after period g-1)."""
        objective = context.optimizer.objective
        periods = {
            user.user_id: next((p for p in user.periods if p.period_index == generation), None)
            for user in report.users
        }
        played = [item for item in items if periods.get(item.id) is not None]
        active = list(dict.fromkeys(chains.in_effect[item.id][generation] for item in played))
        if generation == 0:
            proposed = [active[0]] if active else []
        else:
            proposed = [
                candidate_id(generation, index)
                for index in range(len(items))
                if candidate_id(generation, index) in context.records
            ]
        per_user = {
            item.id: objective_value(
                summarize_periods([periods[item.id]], context.upper_bound), objective
            )
            for item in played
        }
        summary = summarize_periods([periods[item.id] for item in played], context.upper_bound)
        scored = {user: score for user, score in per_user.items() if score is not None}
        best_user = max(scored, key=lambda user: scored[user]) if scored else None
        best_id = chains.in_effect[best_user][generation] if best_user is not None else None
        heldout = [
            context.records[cid].heldout.score
            for cid in active
            if context.records[cid].heldout is not None
        ]
        context.store_generation(
            generation=generation,
            candidate_ids=proposed,
            evaluated_ids=active,
            population=active,
            best_id=best_id,
            best_train_score=scored[best_user] if best_user is not None else None,
            mean_train_score=objective_value(summary, objective),
            best_heldout_score=max(heldout) if heldout else None,
            llm_calls=sum(context.records[cid].reflection_calls for cid in proposed if generation)
            + summary.llm_calls,
            tokens=sum(context.records[cid].reflection_tokens for cid in proposed if generation)
            + summary.tokens,
        )
