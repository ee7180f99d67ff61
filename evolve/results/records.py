"""Frozen records of an evolution: candidates with lineage, generations, the experiment.

A leaf module (only `evolve.simulator` below it), like `evolve.results.budget` and
`evolve.results.objective`: tracking, export and tuning read these records without depending
on `evolve.optimize`.

Everything here is JSON on disk under `runs/<experiment>/` and is what `evolve compare`,
`evolve export` and MLflow read; no record holds an LM, an endpoint or a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.core.protocol import DEFAULT_PROTOCOL
from evolve.llm.usage import Usage
from evolve.simulator.metrics import MetricSummary
from evolve.simulator.run_dir import canonical_json
from evolve.stats import PairedComparison, ScoreEstimate

# tuned: the best parameters of a short Optuna study on the parent (optimizer.tune_every).
# merge: GEPA's merge of two lineages (optimizer.use_merge).
# "base", "merge", or the name of the registered operator that proposed the candidate
# (reflective, list_edit, parameter, tuned, or a plugin's).
MutationKind = str


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Mutation(_Frozen):
    """How a candidate was made from its parent(s)."""

    kind: MutationKind
    component: str | None = Field(default=None, description="Rewritten component (reflective).")
    feedback: str | None = Field(
        default=None, description="complete, question_only, diagnostic, blind or none."
    )
    feedback_failures: int = Field(default=0, description="Failures shown to the reflector.")
    rollout_id: int | None = None
    temperature: float | None = None
    parameter_changes: dict[str, tuple[int, int]] = Field(
        default_factory=dict, description="name -> (old, new)."
    )
    attempts: int = Field(default=1, description="Proposals tried (duplicates are retried).")
    edits: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict,
        description=(
            "Structured edits applied per component: {'added': [...], 'removed': [...]}, and "
            "'beyond_limit': items offered past the per-edit limit, not applied."
        ),
    )

    def describe(self) -> str:
        if self.component is not None and not self.parameter_changes:
            return f"{self.kind}({self.component})"
        if self.kind in ("parameter", "tuned"):
            changes = ", ".join(f"{n} {a}->{b}" for n, (a, b) in self.parameter_changes.items())
            return f"{self.kind}({changes})"
        return self.kind


class CandidateStatus(StrEnum):
    PROPOSED = "proposed"  # stored, not yet evaluated on the train users
    EVALUATED = "evaluated"
    DUPLICATE = "duplicate"  # identical to an earlier candidate: never evaluated
    INVALID = "invalid"  # the reflector's output could not be used (counted, not replaced)
    REJECTED = "rejected"  # GEPA tried it on a minibatch; not better than its parent


class EvaluationScores(_Frozen):
    """One candidate on one user split."""

    users: list[str]
    score: float = Field(
        description="The objective (the memory score; accuracy where it is undefined)."
    )
    objective: str
    objective_used: str | None = Field(
        default=None,
        description="What `score` is: memory_score or accuracy (None: older records).",
    )
    per_user: dict[str, float] = Field(description="The objective per user (Pareto selection).")
    summary: MetricSummary
    per_period: list[MetricSummary] = Field(default_factory=list)
    run_dir: str = Field(description="Runner directory, relative to the experiment directory.")
    periods: list[int] | None = Field(
        default=None, description="Periods scored (per_period schedule); None: all."
    )
    wall_time_s: float = 0.0
    estimate: ScoreEstimate | None = Field(
        default=None,
        description="Accuracy and memory score with their intervals (None: older records).",
    )


class CandidateRecord(_Frozen):
    id: str
    generation: int
    parent_ids: tuple[str, ...] = ()
    mutation: Mutation
    seed: int
    fingerprint: str
    kind: str
    components: dict[str, str]
    parameters: dict[str, int]
    status: CandidateStatus
    duplicate_of: str | None = None
    invalid_reason: str | None = None
    user_id: str | None = Field(
        default=None, description="per_period schedule: the train user whose chain proposed it."
    )
    reflection_calls: int = Field(default=0, description="Reflector calls made to propose it.")
    reflection_tokens: int = 0
    reflection_parse_failures: int = Field(
        default=0, description="Reflector outputs that could not be parsed (retried or invalid)."
    )
    train: EvaluationScores | None = None
    validation: EvaluationScores | None = Field(
        default=None,
        description="On the validation users (GEPA's valset): what chooses the best policy.",
    )
    heldout: EvaluationScores | None = Field(
        default=None, description="On the held-out (test) users: reported, never chosen on."
    )

    @property
    def train_score(self) -> float | None:
        return self.train.score if self.train is not None else None

    @property
    def heldout_score(self) -> float | None:
        return self.heldout.score if self.heldout is not None else None


class GenerationRecord(_Frozen):
    """A finished generation: its candidates, the population kept, and its best."""

    generation: int
    candidate_ids: list[str] = Field(default_factory=list, description="Proposed this generation.")
    evaluated_ids: list[str] = Field(default_factory=list)
    population: list[str] = Field(default_factory=list, description="Kept after selection.")
    best_id: str | None = Field(default=None, description="Best train score this generation.")
    best_train_score: float | None = None
    mean_train_score: float | None = None
    best_heldout_score: float | None = None
    llm_calls: int = Field(default=0, description="Calls spent in this generation.")
    tokens: int = 0
    wall_time_s: float = 0.0


class ExperimentResult(_Frozen):
    name: str
    config_hash: str
    schedule: str
    candidates: list[CandidateRecord]
    generations: list[GenerationRecord]
    best_id: str | None = Field(
        default=None,
        description="Best validation score (train where no validation users): the held-out "
        "users never choose it.",
    )
    stopped: str | None = Field(default=None, description="Why the loop stopped early, if it did.")
    complete: bool = True
    chain_summary: MetricSummary | None = Field(
        default=None, description="per_period schedule: the whole evolving train run."
    )
    llm_calls: int = 0
    tokens: int = 0
    wall_time_s: float = 0.0
    prompt_eval_s: float = Field(
        default=0.0,
        description="Server seconds evaluating prompts over the run, summed over its slots, "
        "as the endpoint reports them (llama-server's timings; 0 where not reported).",
    )
    decode_s: float = Field(
        default=0.0, description="Server seconds decoding over the run, likewise."
    )
    toolkit_share: float | None = Field(
        default=None,
        description="Of the wall time of the invocation that wrote this result, the share with "
        "no LLM request in flight: the toolkit's own work (None: no request was seen in flight).",
    )
    reflection_parse_failures: int = 0
    max_tokens: dict[str, int | None] = Field(
        default_factory=dict,
        description="Completion limit used per role (simulator, agent, reflector): under the "
        "paper protocol the reference's 8192 unless the user set one.",
    )
    protocol: str = Field(
        default=DEFAULT_PROTOCOL,  # records written before protocols were recorded
        description="The information flow that produced the results (paper or evolve); it "
        "chooses which memory score is the per-period chain's headline.",
    )

    stage_spend: dict[str, Usage] = Field(
        default_factory=dict,
        description="Spend outside the generations, by stage (upper bound, held-out tests), "
        "in the unit of `llm_calls` and `tokens`: with the generations' it adds up to them.",
    )
    heldout_comparison: PairedComparison | None = Field(
        default=None,
        description="The best minus the base on the held-out users: paired, clustered by "
        "user, with its interval, McNemar's counts and the verdict (None: not both scored).",
    )

    def candidate(self, candidate_id: str) -> CandidateRecord:
        for record in self.candidates:
            if record.id == candidate_id:
                return record
        raise KeyError(candidate_id)

    def lineage(self, candidate_id: str) -> list[CandidateRecord]:
        """The candidate, its first parent, that one's first parent, ... back to the base."""
        chain: list[CandidateRecord] = []
        by_id = {record.id: record for record in self.candidates}
        current = by_id.get(candidate_id)
        while current is not None and current not in chain:
            chain.append(current)
            current = by_id.get(current.parent_ids[0]) if current.parent_ids else None
        return chain


def fingerprint(kind: str, components: Mapping[str, str], parameters: Mapping[str, int]) -> str:
    """Identity of a policy for de-duplication: kind + instructions + parameters."""
    payload: dict[str, Any] = {
        "kind": kind,
        "components": {name: text.strip() for name, text in components.items()},
        "parameters": dict(parameters),
    }
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()[:16]


def candidate_id(generation: int, index: int) -> str:
    return f"g{generation:02d}-c{index}"


def candidate_record(
    candidate_id: str,
    *,
    generation: int,
    mutation: Mutation,
    seed: int,
    policy: Any = None,
    like: CandidateRecord | None = None,
    parent_ids: Sequence[str] = (),
    status: CandidateStatus = CandidateStatus.PROPOSED,
    **fields: Any,
) -> CandidateRecord:
    """The one way a candidate record is made. Its identity (kind, components, parameters,
    fingerprint) is read from `policy`; a proposal with no usable policy (invalid) shows
    the identity of `like` (its parent) under an empty fingerprint, and a record rebuilt
    from elsewhere (an MLflow run) passes `kind`, `components`, `parameters` and
    `fingerprint` itself."""
    if policy is not None:
        components, parameters = policy.components(), policy.parameters()
        identity: dict[str, Any] = {
            "fingerprint": fingerprint(policy.kind, components, parameters),
            "kind": policy.kind,
            "components": components,
            "parameters": parameters,
        }
    elif like is not None:
        identity = {
            "fingerprint": "",
            "kind": like.kind,
            "components": dict(like.components),
            "parameters": dict(like.parameters),
        }
    else:
        identity = {}
    return CandidateRecord(
        id=candidate_id,
        generation=generation,
        parent_ids=tuple(parent_ids),
        mutation=mutation,
        seed=seed,
        status=status,
        **identity,
        **fields,
    )


def select_best(candidates: Sequence[CandidateRecord]) -> CandidateRecord | None:
    """The policy an experiment reports and exports: the best on the validation users, or on
    the train users where none were held for validation. Never chosen on the held-out (test)
    users: they only report, so their score of the chosen policy stays unbiased."""
    return best_of(candidates, "validation") or best_of(candidates, "train")


def best_of(candidates: Sequence[CandidateRecord], split: str = "train") -> CandidateRecord | None:
    """Highest score on `split` ("train", "validation" or "heldout"); ties: train score, then
    older id."""

    def key(record: CandidateRecord) -> tuple:
        scores = getattr(record, split)
        train = record.train.score if record.train is not None else float("-inf")
        return (-scores.score, -train, record.generation, record.id)

    scored = [record for record in candidates if getattr(record, split) is not None]
    return min(scored, key=key) if scored else None
