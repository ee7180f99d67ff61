"""The AMemGym adapter for GEPA (`gepa.core.adapter.GEPAAdapter`): users are data instances,
episodes are rollouts, our mutation operators propose.

A GEPA data instance is one train user (its id). `evaluate(batch, candidate)` plays the
candidate's on-policy episodes with `evolve.simulator.evaluation.run_evaluation`, one runner
directory per (candidate fingerprint, user), so a killed run resumes without re-evaluating
a finished user. Per-user score = the spec's objective (`evolve.results.objective.objective_value`);
a user whose memory score is undefined at its first evaluation (the base candidate, which
GEPA evaluates first) is scored by accuracy for every candidate, recorded in `score_units`.

Hand-written because GEPA's default adapters know neither episodes nor our operators: the
reflective dataset is our per-component feedback (`evolve.feedback`), and
`propose_new_texts` routes each component to the operator that owns it
(`evolve.optimize.operators`; GEPA's own proposer knows no numeric parameters nor our
reflector role). The adapter also holds the lineage GEPA does not keep (`gepa_lineage`:
every operator proposal, the iteration that discovered each candidate, each iteration's
verdict and spend) and persists it with GEPA's state, so a resumed run neither repeats nor
forgets it. Running GEPA over it is `evolve.optimize.gepa_engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gepa.core.adapter import EvaluationBatch

from evolve.core.seeds import derive_rng, derive_seed
from evolve.feedback import build_feedback, feedback_kind, reflective_record
from evolve.optimize.gepa_lineage import GepaLineage
from evolve.optimize.operators import (
    MutationOperator,
    OperatorProposal,
    is_parameter,
    parameter_component,
    split_candidate,
)
from evolve.results.objective import objective_value
from evolve.results.records import fingerprint
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import run_evaluation
from evolve.simulator.metrics import summarize_periods
from evolve.simulator.records import UserResult


def seed_candidate(
    policy: Any, mutable: Sequence[str], parameters: Sequence[str]
) -> dict[str, str]:
    """GEPA's seed: the mutable text components and numeric parameters of the base policy."""
    texts = policy.components()
    values = policy.parameters()
    candidate = {name: texts[name] for name in mutable}
    candidate.update({parameter_component(name): str(int(values[name])) for name in parameters})
    return candidate


def candidate_policy(base_policy: Any, candidate: Mapping[str, str]) -> Any:
    """The policy a GEPA candidate stands for: the base policy with its texts and numbers."""
    texts, parameters = split_candidate(candidate)
    policy = base_policy.with_components(texts) if texts else base_policy
    return policy.with_parameters(**parameters) if parameters else policy


def build_reflective_dataset(
    users: Sequence[UserResult],
    scores: Sequence[float],
    components: Sequence[str],
    *,
    kind: str,
    max_failures: int,
    max_chars: int,
    seed: int,
    iteration: int,
) -> dict[str, list[dict[str, Any]]]:
    """GEPA's reflective dataset of a minibatch: per component, one record with the feedback
    on every user, built in one call so that `max_failures` and `max_chars` bound what the
    proposal shows (per-user records joined by the operator would show one limit per user).
    Its failure subset is drawn from (seed, iteration, component): children of one parent
    see different subsets, and a rerun with the same seed the same ones."""
    periods = [period for user in users for period in user.periods]
    dataset: dict[str, list[dict[str, Any]]] = {}
    for component in components:
        feedback = build_feedback(
            periods,
            kind,
            component=component,
            max_failures=max_failures,
            max_chars=max_chars,
            rng=derive_rng(seed, "feedback", iteration, component),
        )
        dataset[component] = [
            {
                "users": [user.user_id for user in users],
                "scores": list(scores),
                **reflective_record(feedback),
            }
        ]
    return dataset


class AMemGymAdapter:
    """GEPA adapter: users are data instances, episodes are rollouts, operators propose."""

    def __init__(
        self,
        *,
        base_policy: Any,
        environment: Environment,
        lms: Any,
        episode: Any,
        work_dir: Path,
        operators: Sequence[MutationOperator],
        objective: str = "memory_score",
        feedback: str = "diagnostic",
        max_feedback_failures: int = 6,
        max_feedback_chars: int = 4000,
        upper_bound: Any = None,
        seed: int = 0,
        stop: threading.Event | None = None,
        validation_users: Sequence[str] = (),
    ) -> None:
        # Looked up here: GEPA logs and swallows errors raised while building a reflective
        # dataset, so an unknown kind would silently skip every proposal.
        self.feedback_kind = feedback_kind(feedback)
        self.base_policy = base_policy
        self.items = {item.id: item for item in environment.items}
        self.lms, self.episode, self.upper_bound = lms, episode, upper_bound
        self.work_dir = Path(work_dir)
        self.operators = list(operators)
        self.objective, self.feedback = objective, feedback
        self.max_feedback_failures = max_feedback_failures
        self.max_feedback_chars = max_feedback_chars
        self.seed, self.stop = seed, stop
        # GEPA's valset when it is not its trainset: their runs are stored as "validation".
        self.validation_users = frozenset(validation_users)
        # (split, policy fingerprint) -> the runner's progress sink (the tracker's traces).
        self.progress_for: Callable[[str, str], Any] | None = None
        # user -> "memory_score" | "accuracy", the unit a user is scored in: fixed at the
        # user's first (base) evaluation.
        self.score_units: dict[str, str] = {}
        # What GEPA does not keep (proposals, discoveries, iterations); GEPA's callbacks
        # record the current iteration and parent here, which proposals read.
        self.lineage = GepaLineage()
        # (candidate, train score) told to ask/tell operators, replayed into fresh operators
        # on resume so an Optuna sampler rebuilds the same history without any LLM call.
        self.observed: list[tuple[dict[str, str], float]] = []
        # ONE limit of LM calls in flight for every evaluation this adapter runs, however
        # many (candidate, user) pairs run at once: a server sized for `concurrency`
        # requests is never sent more.
        self.concurrency = max(1, int(getattr(episode, "concurrency", 1)))
        self.call_slots = threading.BoundedSemaphore(self.concurrency)

    # ----- GEPA state persistence (gepa_state.bin in run_dir) ----------------------------------
    def get_adapter_state(self) -> dict[str, Any]:
        return {
            "score_units": dict(self.score_units),
            "observed": list(self.observed),
            **self.lineage.state(),
        }

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        """GEPA restores its checkpoint at every (re)entry: `run_gepa` resumes it between
        iterations, so what this adapter already knows is kept and only what it has not
        seen (a resumed process) is replayed into its operators."""
        # ("units": checkpoints written before the name said what unit it means.)
        stored = state.get("score_units", state.get("units", {}))
        self.score_units = {**stored, **self.score_units}
        self.lineage.restore(state)
        for candidate, score in state.get("observed", [])[len(self.observed) :]:
            self.observe(dict(candidate), float(score))

    def observe(self, candidate: dict[str, str], score: float) -> None:
        self.observed.append((candidate, score))
        for operator in self.operators:
            operator.observe(candidate, score)

    # ----- evaluation ---------------------------------------------------------------------------
    def policy(self, candidate: Mapping[str, str]) -> Any:
        return candidate_policy(self.base_policy, candidate)

    def fingerprint(self, candidate: Mapping[str, str]) -> str:
        policy = self.policy(candidate)
        return fingerprint(policy.kind, policy.components(), policy.parameters())

    def run_user(
        self, candidate: Mapping[str, str], user_id: str, split: str = "train"
    ) -> UserResult:
        policy_fingerprint = self.fingerprint(candidate)
        run_dir = self.work_dir / split / policy_fingerprint[:16] / user_id
        env = Environment(items=[self.items[user_id]])
        progress = self.progress_for(split, policy_fingerprint) if self.progress_for else None
        report = run_evaluation(
            env, self.policy(candidate), self.lms, run_dir, self.episode,
            upper_bound=self.upper_bound, stop=self.stop, progress=progress,
            call_slots=self.call_slots,
        )  # fmt: skip
        return report.users[0]

    def user_scores(self, user: UserResult) -> dict[str, float]:
        summary = summarize_periods(user.periods, self.upper_bound)
        if user.user_id not in self.score_units:
            defined = self.objective == "memory_score" and summary.memory_score is not None
            self.score_units[user.user_id] = "memory_score" if defined else "accuracy"
        # No separate memory score: an undefined one must not enter GEPA's frontier as 0.
        return {
            "score": objective_value(summary, self.score_units[user.user_id]),
            "accuracy": float(summary.accuracy or 0.0),
        }

    def run_users(
        self, candidate: Mapping[str, str], users: Sequence[str], split: str = "train"
    ) -> list[UserResult]:
        return self.run_pairs([(candidate, user) for user in users], split)

    def run_pairs(
        self, pairs: Sequence[tuple[Mapping[str, str], str]], split: str = "train"
    ) -> list[UserResult]:
        """Play (candidate, user) pairs of one split concurrently; results in order."""
        return self.run_jobs([(candidate, user, split) for candidate, user in pairs])

    def run_jobs(self, jobs: Sequence[tuple[Mapping[str, str], str, str]]) -> list[UserResult]:
        """Play (candidate, user, split) evaluations concurrently, under the adapter's one
        call limit; results in the order given. Each evaluation is a function of its
        (candidate, user) alone, so the results are those of playing them one by one."""
        keys = [(self.fingerprint(candidate), user, split) for candidate, user, split in jobs]
        # Each distinct job once: two threads must never play one runner directory.
        distinct = dict(zip(keys, jobs, strict=True))
        # As many evaluations in progress as calls may be in flight: one between calls (its
        # sessions are sequential) leaves its slot to another's call.
        workers = max(1, min(len(distinct), self.concurrency))
        if workers == 1:
            played = {key: self.run_user(*job) for key, job in distinct.items()}
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evolve-pairs") as pool:
                futures = {key: pool.submit(self.run_user, *job) for key, job in distinct.items()}
                played = {key: future.result() for key, future in futures.items()}
        return [played[key] for key in keys]

    def _evaluation_batch(
        self, users: Sequence[UserResult], capture_traces: bool
    ) -> EvaluationBatch:
        # Scored in the order GEPA gave: which unit a user is scored in is fixed at its
        # first scoring, so the order must not depend on which evaluation finished first.
        objective_scores = [self.user_scores(user) for user in users]
        return EvaluationBatch(
            outputs=[{"user_id": u.user_id} for u in users],
            scores=[s["score"] for s in objective_scores],
            trajectories=list(users) if capture_traces else None,
            objective_scores=objective_scores,
        )

    def split_of(self, user_id: str) -> str:
        """Where GEPA's own evaluation of a user is stored: its split."""
        return "validation" if user_id in self.validation_users else "train"

    def evaluate(
        self, batch: list[str], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch:
        jobs = [(candidate, user, self.split_of(user)) for user in batch]
        return self._evaluation_batch(self.run_jobs(jobs), capture_traces)

    def batch_evaluate(
        self, items: list[tuple[dict[str, str], list[str]]]
    ) -> list[EvaluationBatch]:
        """GEPA's hook for the evaluations of one step that do not depend on each other
        (parents on their minibatches, children on theirs, programs on the valset): every
        (candidate, user) pair of every item runs at once under the one call limit."""
        jobs = [
            (candidate, user, self.split_of(user)) for candidate, batch in items for user in batch
        ]
        played = iter(self.run_jobs(jobs))
        return [
            self._evaluation_batch([next(played) for _ in batch], capture_traces=True)
            for _, batch in items
        ]

    # ----- reflection -----------------------------------------------------------------------
    def make_reflective_dataset(
        self,
        candidate: dict[str, str],
        eval_batch: EvaluationBatch,
        components_to_update: list[str],
    ) -> dict[str, list[dict[str, Any]]]:
        """The minibatch's feedback per component (`build_reflective_dataset`), its failure
        subset drawn for this iteration."""
        return build_reflective_dataset(
            list(eval_batch.trajectories or []),
            eval_batch.scores,
            components_to_update,
            kind=self.feedback,
            max_failures=self.max_feedback_failures,
            max_chars=self.max_feedback_chars,
            seed=self.seed,
            iteration=self.lineage.current_iteration,
        )

    def propose_new_texts(
        self,
        candidate: dict[str, str],
        reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
        components_to_update: list[str],
    ) -> dict[str, str]:
        """Each component goes to the operator owning it; an invalid proposal keeps the parent.

        Under `feedback = "none"` no text component is proposed (no reflective proposal, as
        `evolve run` means it): `run_gepa` refuses such a seed candidate, and a direct call
        gets no text back, so GEPA skips the proposal without evaluating anything."""
        if not self.feedback_kind.proposes:
            components_to_update = [c for c in components_to_update if is_parameter(c)]
        new_texts: dict[str, str] = {}
        iteration = self.lineage.current_iteration
        seed = derive_seed(self.seed, "propose", iteration)
        claimed: set[str] = set()
        for operator in self.operators:
            owned = [
                c for c in components_to_update if c not in claimed and operator.owns(c, iteration)
            ]
            if not owned:
                continue
            claimed.update(owned)
            usage_before = self.lms.usage.snapshot()
            proposal: OperatorProposal = operator.propose(
                candidate, owned, reflective_dataset, seed=seed
            )
            # Proposals run one at a time between evaluations, so the difference is theirs.
            usage = self.lms.usage.snapshot().minus(usage_before)
            feedback = {
                c: "\n\n".join(str(r.get("Feedback", "")) for r in reflective_dataset.get(c, []))
                for c in owned
            }
            self.lineage.proposals.append(
                {
                    "iteration": iteration,
                    "parent": self.lineage.current_parent,
                    "feedback": feedback,
                    "llm_calls": usage.total_requests,
                    "tokens": usage.total_tokens,
                    **proposal.model_dump(),
                }
            )
            new_texts.update(proposal.components)
        return new_texts
