"""GEPA's state into our frozen records: candidates with lineage and one generation record
per GEPA iteration, stored once and logged to MLflow as iterations finish.

Why hand-written: GEPA keeps no operator, seed or held-out score per candidate, and it
does not record the proposals that never joined its pool (rejected on their minibatch, or
invalid). The adapter keeps those (`AMemGymAdapter.lineage`, see `gepa_lineage`); this
module turns them, with GEPA's pool, into `CandidateRecord`s and `GenerationRecord`s in one
place, so that lineage, statuses and held-out checks cannot drift between two files.

Two classes: `GepaProposalRecords` makes the record of each candidate as proposed (parents,
mutation, seed, status, its policy bundle and feedback); `GepaRecords`, called by the
schedule after each GEPA iteration, completes those records with their evaluations and
writes the generation records. Neither is a GEPA callback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.core.seeds import derive_seed
from evolve.optimize.context import EvolutionContext
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.optimize.gepa_engine import GepaOutcome
from evolve.optimize.operators import is_parameter
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    Mutation,
    candidate_id,
    candidate_record,
    select_best,
)


class GepaRecords:
    """Our frozen records from what GEPA returned (`GepaOutcome`) and the lineage its
    callbacks recorded; called by the schedule after every GEPA iteration, so MLflow steps
    follow iterations as they finish. Every evaluation a record still needs is played here,
    outside GEPA's callbacks."""

    def __init__(self, context: EvolutionContext, adapter: AMemGymAdapter) -> None:
        self.context, self.adapter = context, adapter
        self.proposed = GepaProposalRecords(context, adapter)
        # Pool indices evaluated on the held-out users besides GEPA's new bests (heldout =
        # "final": the base and the final best), set by the schedule before the last sync.
        self.final_heldout: set[int] = set()

    def sync(self, outcome: GepaOutcome) -> None:
        """Every pool candidate (train scores, held-out scores of each new best) and every
        finished generation; stored once, logged once."""
        context, adapter, lineage = self.context, self.adapter, self.adapter.lineage
        pool = outcome.candidates
        train = [item.id for item in context.resolved.train.items]
        validation = [item.id for item in context.resolved.validation.items]
        heldout_users = [item.id for item in context.resolved.heldout.items]
        heldout_idx = {entry.candidate_idx for entry in outcome.heldout} | self.final_heldout
        # Every evaluation the records below still need, played at once under the one call
        # limit (e.g. the final held-out checks of the base and the best).
        needed: list[tuple[int, str, list[str]]] = []
        for index in range(len(pool)):
            record = context.records.get(lineage.record_id(index))
            if record is None or record.train is None:
                needed.append((index, "train", train))
            if validation and (record is None or record.validation is None):
                needed.append((index, "validation", validation))
            missing_heldout = record is None or record.heldout is None
            if missing_heldout and index in heldout_idx and heldout_users:
                needed.append((index, "heldout", heldout_users))
        results = iter(
            adapter.run_jobs(
                [(pool[index], user, split) for index, split, users in needed for user in users]
            )
        )
        played = {(i, split): [next(results) for _ in users] for i, split, users in needed}
        for index, candidate in enumerate(pool):
            record = context.records.get(lineage.record_id(index))
            if record is None:
                record = self.proposed.pool_candidate(index, candidate, outcome)
            for split in ("train", "validation", "heldout"):
                if (index, split) in played and getattr(record, split) is None:
                    record = self._scored(record, split, played[(index, split)], candidate)
        pooled = {lineage.generation_of(i) for i in range(len(pool))}
        for entry in lineage.iterations:
            generation = int(entry["iteration"])
            if generation not in pooled and candidate_id(generation, 0) not in context.records:
                self.proposed.outside_pool(generation, outcome)
        front = sorted({lineage.record_id(i) for i in outcome.pareto_front})
        for entry in [{"iteration": 0}, *lineage.iterations]:
            self._store_generation(int(entry["iteration"]), entry, front, len(pool))

    def _scored(
        self, record: CandidateRecord, split: str, users: list[Any], candidate: Mapping[str, str]
    ) -> CandidateRecord:
        """`record` with its scores on `split` (saved and logged)."""
        context = self.context
        scores = context.scores(users, evaluation_dir(self.adapter, split, candidate), 0.0)
        update: dict[str, Any] = {split: scores}
        if split == "train":
            update["status"] = CandidateStatus.EVALUATED
        record = context.save(record.model_copy(update=update))
        context.evaluation_logged(record, split)
        return record

    def _store_generation(
        self, generation: int, entry: Mapping[str, Any], front: Sequence[str], pool_size: int
    ) -> None:
        context, lineage = self.context, self.adapter.lineage
        known = [
            context.records[lineage.record_id(i)]
            for i in range(pool_size)
            if lineage.generation_of(i) <= generation and lineage.record_id(i) in context.records
        ]
        new = [r.id for r in known if r.generation == generation]
        proposed = (
            [candidate_id(generation, 0)] if candidate_id(generation, 0) in context.records else []
        )
        best = select_best(known)
        scores = [r.train.score for r in known if r.train is not None]
        if generation == 0:
            # GEPA's start: the base on the train and validation users, and on the held-out
            # users where they are scored every generation; a final held-out test is spent
            # in its own stage (`HELDOUT_STAGE`), never counted twice.
            base = context.records[candidate_id(0, 0)]
            splits = [base.train, base.validation]
            if context.optimizer.heldout == "every_generation":
                splits.append(base.heldout)
            spent = [s for s in splits if s is not None]
            calls = sum(s.summary.llm_calls for s in spent)
            tokens = sum(s.summary.tokens for s in spent)
            wall = sum(s.wall_time_s for s in spent)
        else:
            calls = int(entry["llm_calls_end"] - entry["llm_calls_start"])
            tokens = int(entry["tokens_end"] - entry["tokens_start"])
            wall = float(entry.get("wall_time_s", 0.0))
        context.store_generation(
            compare_without=("population",),
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
            wall_time_s=wall,
        )


class GepaProposalRecords:
    """The record of each candidate a GEPA run proposed, made once, when first seen: its
    parents, mutation, seed and status from GEPA's pool and the adapter's lineage, stored
    with its policy bundle and the feedback its reflector saw (scores come later)."""

    def __init__(self, context: EvolutionContext, adapter: AMemGymAdapter) -> None:
        self.context, self.adapter = context, adapter

    def pool_candidate(
        self, index: int, candidate: Mapping[str, str], outcome: GepaOutcome
    ) -> CandidateRecord:
        """The record of a candidate in GEPA's pool (index 0: the base)."""
        lineage = self.adapter.lineage
        parents = [p for p in outcome.parents[index] if p is not None]
        return self._record(
            lineage.generation_of(index),
            candidate,
            [lineage.record_id(p) for p in parents],
            CandidateStatus.PROPOSED,
        )

    def outside_pool(self, generation: int, outcome: GepaOutcome) -> CandidateRecord | None:
        """A generation whose proposal did not join GEPA's pool: rejected on its minibatch,
        or invalid (no usable text). None: nothing was proposed (e.g. a skipped merge)."""
        lineage = self.adapter.lineage
        proposals = lineage.proposals_in(generation)
        if not proposals or proposals[0].get("parent") is None:
            return None
        parent_idx = int(proposals[0]["parent"])
        candidate = dict(outcome.candidates[parent_idx])
        for proposal in proposals:
            candidate.update(proposal["components"])
        usable = any(p["components"] for p in proposals)
        status = CandidateStatus.REJECTED if usable else CandidateStatus.INVALID
        reason = None if usable else next((p["invalid"] for p in proposals if p["invalid"]), None)
        return self._record(
            generation,
            candidate,
            [lineage.record_id(parent_idx)],
            status,
            invalid_reason=reason,
        )

    def _mutation(
        self, generation: int, policy: Any, parent_ids: Sequence[str], proposals: list[dict]
    ) -> tuple[Mutation, int]:
        """How generation `generation`'s candidate was made, and its seed."""
        context = self.context
        if generation == 0:
            return Mutation(kind="base"), context.spec.seed
        parent = context.records[parent_ids[0]]
        changes = {
            name: (parent.parameters[name], value)
            for name, value in policy.parameters().items()
            if name in parent.parameters and value != parent.parameters[name]
        }
        # No operator proposal in a generation that made a candidate: GEPA merged two.
        kind = proposals[0]["operator"] if proposals else "merge"
        texts = [c for c in (proposals[0]["feedback"] if proposals else {}) if not is_parameter(c)]
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
            feedback=context.optimizer.feedback if reflected else None,
            temperature=context.reflector.temperature if reflected else None,
            parameter_changes=changes,
            rollout_id=proposals[0]["seed"] if proposals else None,
            edits=edits,
        )
        seed = (
            proposals[0]["seed"]
            if proposals
            else derive_seed(context.spec.seed, "propose", generation)
        )
        return mutation, seed

    def _record(
        self,
        generation: int,
        candidate: Mapping[str, str],
        parent_ids: Sequence[str],
        status: CandidateStatus,
        invalid_reason: str | None = None,
    ) -> CandidateRecord:
        context = self.context
        cid = candidate_id(generation, 0)
        policy = self.adapter.policy(candidate)
        proposals = self.adapter.lineage.proposals_in(generation)
        mutation, seed = self._mutation(generation, policy, parent_ids, proposals)
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
            context.experiment_dir.save_feedback(cid, feedback)
        if (
            status != CandidateStatus.INVALID
            and not context.experiment_dir.policy_dir(cid).exists()
        ):
            policy.save(
                context.experiment_dir.policy_dir(cid), provenance=context.provenance(record)
            )
        return context.record_proposal(record, **self._rejection_details(record, candidate))

    def _rejection_details(
        self, record: CandidateRecord, candidate: Mapping[str, str]
    ) -> dict[str, Any]:
        """For a proposal GEPA rejected on its minibatch: where that was played, the scores
        and GEPA's reason (the tracker's run of a candidate never evaluated in full)."""
        if record.status != CandidateStatus.REJECTED:
            return {}
        entry = self.adapter.lineage.iteration_entry(record.generation)
        verdict = dict(entry.get("rejected") or {})
        return {
            "reason": verdict.pop("reason", None),
            "scores": verdict,
            "evaluation_dir": evaluation_dir(self.adapter, "train", candidate),
        }


def evaluation_dir(adapter: AMemGymAdapter, split: str, candidate: Mapping[str, str]) -> Path:
    """The runner directory where the adapter played `candidate` on `split` (all users)."""
    return adapter.work_dir / split / adapter.fingerprint(candidate)[:16]
