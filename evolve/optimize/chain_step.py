"""One step of the paper's per-period chain: a train user's reflector proposal after a period.

After period p, the step of train user number i (`g{p+1}-c{i}`) rewrites one mutable
component of the policy in effect for that user (the components take turns, one per period)
from that user's period-p feedback only. The reflector is asked again, with a fresh seed and
feedback subset, up to `proposal_attempts` times while its reply is not a usable text. The
outcome is stored as a candidate whatever it is (proposed, duplicate of a known policy, or
invalid with its reason), with the feedback it was shown and the reflector calls it cost;
which candidate then comes into effect is the schedule's decision (`chain.ChainSchedule`).
"""

from __future__ import annotations

import random
from typing import Any

from evolve.optimize.context import EvolutionContext
from evolve.optimize.feedback import build_feedback
from evolve.optimize.reflect import Reflector
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    Mutation,
    candidate_id,
    fingerprint,
)
from evolve.simulator.records import PeriodResult
from evolve.simulator.user import derive_seed
from evolve.spec.config import ExperimentSpec


def propose_chain_step(
    context: EvolutionContext,
    period: int,
    index: int,
    user_id: str,
    current: CandidateRecord,
    results: list[PeriodResult],
) -> CandidateRecord:
    """One user's reflector step after `period`, from that user's period feedback."""
    optimizer = context.optimizer
    if optimizer.feedback == "none":
        # The caller checks `reflective_enabled()`; this keeps "none" meaning "no
        # reflective proposal" even if a new caller forgets to.
        raise ValueError(
            'feedback = "none" makes no reflective proposal, but a chain step was asked '
            f"for user {user_id!r} after period {period}; check "
            'OptimizerSpec.reflective_enabled() before proposing, or use feedback = "blind"'
        )
    generation = period + 1
    cid = candidate_id(generation, index)
    components = optimizer.mutate_components
    component = components[period % len(components)]
    usage_before = context.lms.usage.snapshot()
    current_policy = context.policy(current)
    parse_failures = 0
    outcome: dict[str, Any] = {}
    feedback_text = ""
    mutation = Mutation(kind="reflective", component=component, feedback=optimizer.feedback)
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
        mutation = Mutation(
            kind="reflective",
            component=component,
            feedback=optimizer.feedback,
            feedback_failures=feedback.failures_shown,
            rollout_id=seed,
            temperature=context.reflector.temperature,
            attempts=attempt + 1,
        )
        outcome = reflect_step(
            context.reflector, current_policy, current, component, feedback.text, seed
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
        reflection_calls=usage.total_requests,
        reflection_tokens=usage.total_tokens,
        reflection_parse_failures=parse_failures,
        user_id=user_id,
    )
    context.store.save_feedback(cid, feedback_text)
    if status == CandidateStatus.PROPOSED:
        policy.save(context.store.policy_dir(cid), provenance=context.provenance(record))
    return context.record_proposal(record)


def reflect_step(
    reflector: Reflector,
    parent_policy: Any,
    parent: CandidateRecord,
    component: str,
    feedback: str,
    seed: int,
) -> dict[str, Any]:
    """One reflector call turned into a policy, or the reason it cannot be one."""
    from memory_policies.errors import PolicyError

    proposal = reflector.propose(
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
