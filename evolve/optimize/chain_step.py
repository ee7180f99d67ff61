"""One step of the paper's per-period chain: a train user's proposal after a period.

After period p, the step of train user number i (`g{p+1}-c{i}`) rewrites one mutable
component of the policy in effect for that user (the components take turns, one per period)
from that user's period-p feedback only. The rewrite is made by the first of the spec's
operators that owns the component (`optimizer.operators`; by default `reflective`, the
paper's reflector), through the same registry as the population schedule's. The operator is
asked again, with a fresh seed and feedback subset, up to `proposal_attempts` times while it
makes no usable text. The outcome is stored as a candidate whatever it is (proposed,
duplicate of a known policy, or invalid with its reason), with the feedback it was shown and
the reflector calls it cost; which candidate then comes into effect is the schedule's
decision (`chain.ChainSchedule`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from evolve.core.errors import ConfigError
from evolve.feedback import Feedback, build_feedback, feedback_kind, reflective_record
from evolve.optimize.context import EvolutionContext
from evolve.optimize.operator_set import owner_of
from evolve.optimize.operators import MutationOperator
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    Mutation,
    candidate_id,
    candidate_record,
    fingerprint,
)
from evolve.simulator.records import PeriodResult
from evolve.simulator.user import derive_seed
from evolve.spec.config import ExperimentSpec


def refuse_unowned_components(
    operators: Sequence[MutationOperator], components: Sequence[str]
) -> None:
    """Refuse, before any LLM call, a chain in which no operator rewrites some component."""
    names = [operator.name for operator in operators]
    orphans = [c for c in components if owner_of(operators, c, generation=1) is None]
    if orphans:
        raise ConfigError(
            f"optimizer: no operator of {names} rewrites {orphans} in the per_period chain; "
            'add one that does (e.g. "reflective", which rewrites any text component) to '
            "optimizer.operators, or remove them from mutate_components"
        )


def propose_chain_step(
    context: EvolutionContext,
    operators: Sequence[MutationOperator],
    period: int,
    index: int,
    user_id: str,
    current: CandidateRecord,
    results: list[PeriodResult],
) -> CandidateRecord:
    """One user's step after `period`, from that user's period feedback, by the operator
    that owns the step's component."""
    optimizer = context.optimizer
    if not feedback_kind(optimizer.feedback).proposes:
        # The caller checks `reflective_enabled()`; this keeps such a kind meaning "no
        # reflective proposal" even if a new caller forgets to.
        raise ValueError(
            f"feedback = {optimizer.feedback!r} makes no reflective proposal, but a chain step "
            f"was asked for user {user_id!r} after period {period}; check "
            'OptimizerSpec.reflective_enabled() before proposing, or use feedback = "blind"'
        )
    generation = period + 1
    cid = candidate_id(generation, index)
    components = optimizer.mutate_components
    component = components[period % len(components)]
    operator = owner_of(operators, component, generation)
    if operator is None:  # `refuse_unowned_components` ran before the first call
        raise ValueError(f"no operator owns {component!r} in generation {generation}")
    usage_before = context.lms.usage.snapshot()
    current_policy = context.policy(current)
    parse_failures = 0
    outcome: dict[str, Any] = {}
    feedback_text = ""
    mutation = Mutation(kind=operator.name, component=component, feedback=optimizer.feedback)
    for attempt in range(optimizer.proposal_attempts):
        seed = derive_seed(context.spec.seed, "candidate", generation, index, attempt)
        feedback = build_feedback(
            results,
            optimizer.feedback,
            component=component,
            max_failures=optimizer.max_feedback_failures,
            max_chars=feedback_char_cap(context.spec),
            rng=random.Random(seed),
            periods=[period],
        )
        feedback_text = feedback.text
        outcome = operator_step(operator, current_policy, current, component, feedback, seed)
        mutation = Mutation(
            kind=operator.name,
            component=component,
            feedback=optimizer.feedback,
            feedback_failures=feedback.failures_shown,
            rollout_id=seed,
            temperature=context.reflector.temperature if operator.reflective else None,
            attempts=attempt + 1,
            edits=outcome.pop("edits", {}),
        )
        parse_failures += outcome.pop("parse_failed", 0)
        if not outcome.get("invalid"):
            break
    usage = context.lms.usage.snapshot().minus(usage_before)
    policy = outcome.get("policy")
    status = CandidateStatus.INVALID if policy is None else CandidateStatus.PROPOSED
    key = (
        fingerprint(policy.kind, policy.components(), policy.parameters())
        if policy is not None
        else ""
    )
    duplicate_of = context.seen().get(key) if policy is not None else None
    if duplicate_of is not None:
        status = CandidateStatus.DUPLICATE
    record = candidate_record(
        cid,
        generation=generation,
        parent_ids=(current.id,),
        mutation=mutation,
        seed=outcome.get("seed", 0),
        policy=policy,
        like=current,
        status=status,
        duplicate_of=duplicate_of,
        invalid_reason=outcome.get("invalid"),
        reflection_calls=usage.total_requests,
        reflection_tokens=usage.total_tokens,
        reflection_parse_failures=parse_failures,
        user_id=user_id,
    )
    context.experiment_dir.save_feedback(cid, feedback_text)
    if status == CandidateStatus.PROPOSED:
        policy.save(context.experiment_dir.policy_dir(cid), provenance=context.provenance(record))
    return context.record_proposal(record)


def operator_step(
    operator: MutationOperator,
    parent_policy: Any,
    parent: CandidateRecord,
    component: str,
    feedback: Feedback,
    seed: int,
) -> dict[str, Any]:
    """One operator proposal turned into a policy, or the reason it cannot be one. The
    period's feedback is the component's one feedback record (what the population schedule's
    reflective dataset holds per component)."""
    from memory_policies.errors import PolicyError

    records = {component: [reflective_record(feedback)]}
    proposal = operator.propose(dict(parent.components), [component], records, seed=seed)
    edits = {
        name: dict(applied)
        for name, applied in proposal.detail.items()
        if isinstance(applied, dict) and {"added", "removed"} <= set(applied)
    }
    if proposal.invalid is not None or not proposal.components:
        return {
            "invalid": proposal.invalid or f"{operator.name} changed nothing",
            "parse_failed": int(proposal.parse_failed),
            "seed": seed,
            "edits": edits,
        }
    try:
        policy = parent_policy.with_components(proposal.components)
    except PolicyError as error:
        return {"invalid": f"the proposed text was refused: {error}", "seed": seed}
    return {"policy": policy, "seed": seed, "edits": edits}


def feedback_char_cap(spec: ExperimentSpec) -> int | None:
    """The chain's feedback length cap: `max_feedback_chars`, except that under a protocol
    whose feedback is not capped by default (paper: the reference caps none) only a value the
    spec sets applies."""
    optimizer = spec.optimizer
    if not spec.rules.feedback_capped_by_default and (
        "max_feedback_chars" not in optimizer.model_fields_set
    ):
        return None
    return optimizer.max_feedback_chars
