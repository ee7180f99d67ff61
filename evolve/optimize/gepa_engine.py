"""The population schedule on GEPA (`gepa.optimize`) behind an `AMemGymAdapter`.

Why over 400 lines: the adapter is GEPA's whole integration point (evaluate, reflective
dataset, proposals, adapter state for an exact resume) in one class.

A GEPA data instance is one train user (its id). `evaluate(batch, candidate)` plays the
candidate's on-policy episodes with `evolve.simulator.runner.run_evaluation`, one runner
directory per (candidate fingerprint, user), so a killed run resumes without re-evaluating
a finished user. Per-user score = the spec's objective (`evolve.objective.objective_value`);
a user whose memory score is undefined at its first evaluation (the base candidate, which
GEPA evaluates first) is scored by accuracy for every candidate, recorded in `units`.

What stays ours and why: the adapter (episodes, scores, per-component feedback), the
operators (`evolve.optimize.operators`; GEPA's own proposer knows no numeric parameters nor
our reflector role), iteration-seeded parent/minibatch selection (gepa 0.1.4 rebuilds
`Random(seed)` on every call and does not persist its batch sampler, so a resumed run would
otherwise choose differently), the held-out evaluation of each new best (held-out users are
never shown to GEPA) and the budget stopper over our spend (LLM calls / tokens / wall time).
What GEPA does: Pareto (or other) candidate selection, minibatch acceptance, merge,
metric-call budget, run_dir checkpoints.

Size (~400 lines): the adapter, its seeded selectors and `run_gepa` are kept together
because they are the one integration point with GEPA; operators live in `operators`.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gepa import optimize as gepa_optimize
from gepa.core.adapter import EvaluationBatch
from gepa.core.callbacks import GEPACallback
from gepa.strategies.candidate_selector import (
    CurrentBestCandidateSelector,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    TopKParetoCandidateSelector,
)
from pydantic import BaseModel, ConfigDict, Field

from evolve.budget import Budget
from evolve.objective import objective_value
from evolve.optimize.edits import says_less
from evolve.optimize.feedback import FEEDBACK_KINDS, build_feedback
from evolve.optimize.operators import (
    MutationOperator,
    OperatorProposal,
    is_parameter,
    parameter_component,
    split_candidate,
)
from evolve.records import fingerprint
from evolve.seeds import derive_rng, derive_seed
from evolve.simulator.environment import Environment
from evolve.simulator.metrics import summarize_periods
from evolve.simulator.records import UserResult
from evolve.simulator.runner import run_evaluation

# GEPA's checkpoint in its run_dir (gepa.core.state): present once a run has started.
GEPA_STATE_FILE = "gepa_state.bin"
CANDIDATE_SELECTIONS = ("pareto", "current_best", "epsilon_greedy", "top_k_pareto")


def seed_candidate(
    policy: Any, mutable: Sequence[str], parameters: Sequence[str]
) -> dict[str, str]:
    """GEPA's seed: the mutable text components and numeric parameters of the base policy."""
    texts = policy.components()
    values = policy.parameters()
    candidate = {name: texts[name] for name in mutable}
    candidate.update({parameter_component(name): str(int(values[name])) for name in parameters})
    return candidate


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
    ) -> None:
        if feedback not in FEEDBACK_KINDS:
            # Checked here: GEPA logs and swallows errors raised while building a reflective
            # dataset, so an unknown kind would silently skip every proposal.
            raise ValueError(
                f"feedback = {feedback!r} is not a feedback kind; expected one of "
                f"{', '.join(FEEDBACK_KINDS)}"
            )
        self.base_policy = base_policy
        self.items = {item.id: item for item in environment.items}
        self.lms, self.episode, self.upper_bound = lms, episode, upper_bound
        self.work_dir = Path(work_dir)
        self.operators = list(operators)
        self.objective, self.feedback = objective, feedback
        self.max_feedback_failures = max_feedback_failures
        self.max_feedback_chars = max_feedback_chars
        self.seed, self.stop = seed, stop
        # (split, policy fingerprint) -> the runner's progress sink (the tracker's traces).
        self.progress_for: Callable[[str, str], Any] | None = None
        self.iteration = 0
        self.parent_idx: int | None = None  # GEPA's parent choice of the current iteration
        # user -> "memory_score" | "accuracy": fixed at the user's first (base) evaluation.
        self.units: dict[str, str] = {}
        # Every operator proposal in order: the lineage GEPA does not keep.
        self.proposals: list[dict[str, Any]] = []
        # Train score of the best candidate so far and held-out scores of each new best:
        # persisted with GEPA's state so a resumed run neither repeats nor forgets them.
        self.best_score = float("-inf")
        self.heldout: list[dict[str, Any]] = []
        # (candidate, train score) told to ask/tell operators, replayed into fresh operators
        # on resume so an Optuna sampler rebuilds the same history without any LLM call.
        self.observed: list[tuple[dict[str, str], float]] = []
        # candidate index -> the iteration (generation) that produced it; seed: 0.
        self.discovered: dict[int, int] = {}
        # One entry per finished iteration, written by the caller's callbacks (e.g. spend).
        self.iterations: list[dict[str, Any]] = []
        # ONE limit of LM calls in flight for every evaluation this adapter runs, however
        # many (candidate, user) pairs run at once: a server sized for `concurrency`
        # requests is never sent more.
        self.concurrency = max(1, int(getattr(episode, "concurrency", 1)))
        self.call_slots = threading.BoundedSemaphore(self.concurrency)

    # ----- GEPA state persistence (gepa_state.bin in run_dir) ----------------------------------
    def get_adapter_state(self) -> dict[str, Any]:
        return {
            "units": dict(self.units),
            "proposals": list(self.proposals),
            "best_score": self.best_score,
            "heldout": list(self.heldout),
            "observed": list(self.observed),
            "discovered": dict(self.discovered),
            "iterations": list(self.iterations),
        }

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        self.units = dict(state.get("units", {}))
        self.proposals = list(state.get("proposals", []))
        self.best_score = float(state.get("best_score", float("-inf")))
        self.heldout = list(state.get("heldout", []))
        self.discovered = {int(k): int(v) for k, v in state.get("discovered", {}).items()}
        self.iterations = list(state.get("iterations", []))
        self.observed = []
        for candidate, score in state.get("observed", []):
            self.observe(dict(candidate), float(score))

    def observe(self, candidate: dict[str, str], score: float) -> None:
        self.observed.append((candidate, score))
        for operator in self.operators:
            operator.observe(candidate, score)

    # ----- evaluation ---------------------------------------------------------------------------
    def policy(self, candidate: Mapping[str, str]) -> Any:
        texts, parameters = split_candidate(candidate)
        policy = self.base_policy.with_components(texts) if texts else self.base_policy
        return policy.with_parameters(**parameters) if parameters else policy

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
        if user.user_id not in self.units:
            defined = self.objective == "memory_score" and summary.memory_score is not None
            self.units[user.user_id] = "memory_score" if defined else "accuracy"
        return {
            "score": objective_value(summary, self.units[user.user_id]),
            "accuracy": float(summary.accuracy or 0.0),
            "memory_score": float(summary.memory_score or 0.0),
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

    def evaluate(
        self, batch: list[str], candidate: dict[str, str], capture_traces: bool = False
    ) -> EvaluationBatch:
        return self._evaluation_batch(self.run_users(candidate, batch), capture_traces)

    def batch_evaluate(
        self, items: list[tuple[dict[str, str], list[str]]]
    ) -> list[EvaluationBatch]:
        """GEPA's hook for the evaluations of one step that do not depend on each other
        (parents on their minibatches, children on theirs, programs on the valset): every
        (candidate, user) pair of every item runs at once under the one call limit."""
        pairs = [(candidate, user) for candidate, batch in items for user in batch]
        played = iter(self.run_pairs(pairs))
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
        """Per component, one record: the feedback on every user of the minibatch, built in
        one call so that `max_feedback_failures` and `max_feedback_chars` bound what the
        proposal shows (per-user records joined by the operator would show one limit per
        user). Its failure subset is drawn from (seed, iteration, component): children of
        one parent see different subsets, and a rerun with the same seed the same ones."""
        users: list[UserResult] = list(eval_batch.trajectories or [])
        periods = [period for user in users for period in user.periods]
        dataset: dict[str, list[dict[str, Any]]] = {}
        for component in components_to_update:
            feedback = build_feedback(
                periods,
                self.feedback,
                component=component,
                max_failures=self.max_feedback_failures,
                max_chars=self.max_feedback_chars,
                rng=derive_rng(self.seed, "feedback", self.iteration, component),
            )
            dataset[component] = [
                {
                    "users": [user.user_id for user in users],
                    "scores": list(eval_batch.scores),
                    "Feedback": feedback.text,
                    "failures_shown": feedback.failures_shown,
                    "failures_total": feedback.failures_total,
                }
            ]
        return dataset

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
        if self.feedback == "none":
            components_to_update = [c for c in components_to_update if is_parameter(c)]
        new_texts: dict[str, str] = {}
        seed = derive_seed(self.seed, "propose", self.iteration)
        claimed: set[str] = set()
        for operator in self.operators:
            owned = [
                c
                for c in components_to_update
                if c not in claimed and operator.owns(c, self.iteration)
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
            self.proposals.append(
                {
                    "iteration": self.iteration,
                    "parent": self.parent_idx,
                    "feedback": feedback,
                    "llm_calls": usage.total_requests,
                    "tokens": usage.total_tokens,
                    **proposal.model_dump(),
                }
            )
            new_texts.update(proposal.components)
        return new_texts


class IterationSeededSelector:
    """A GEPA candidate selector whose randomness is a function of (seed, iteration)."""

    def __init__(self, kind: str, seed: int) -> None:
        if kind not in CANDIDATE_SELECTIONS:
            raise ValueError(
                f"candidate_selection = {kind!r}; expected one of {', '.join(CANDIDATE_SELECTIONS)}"
            )
        self.kind, self.seed = kind, seed

    def select_candidate_idx(self, state: Any) -> int:
        rng = random.Random(derive_seed(self.seed, "select", state.i))
        selector = {
            "pareto": lambda: ParetoCandidateSelector(rng=rng),
            "current_best": CurrentBestCandidateSelector,
            "epsilon_greedy": lambda: EpsilonGreedyCandidateSelector(epsilon=0.1, rng=rng),
            "top_k_pareto": lambda: TopKParetoCandidateSelector(k=5, rng=rng),
        }[self.kind]()
        return selector.select_candidate_idx(state)


class IterationSeededBatchSampler:
    """Epoch-shuffled minibatches computed from (seed, epoch): nothing to persist for resume."""

    def __init__(self, minibatch_size: int, seed: int) -> None:
        self.minibatch_size, self.seed = minibatch_size, seed

    def next_minibatch_ids(self, loader: Any, state: Any) -> list[Any]:
        ids = list(loader.all_ids())
        size = min(self.minibatch_size, len(ids))
        start = (state.i + 1) * size
        epoch, offset = divmod(start, len(ids))
        order: list[Any] = []
        while len(order) < offset + 2 * size:
            shuffled = list(ids)
            random.Random(derive_seed(self.seed, "epoch", epoch)).shuffle(shuffled)
            order.extend(shuffled)
            epoch += 1
        # Distinct users: where an epoch ends mid-batch, skip repeats from the next one.
        return list(dict.fromkeys(order[offset:]))[:size]


class _Hooks(GEPACallback):
    def __init__(self, adapter: AMemGymAdapter, on_new_best: Callable[[int, dict[str, str]], None]):
        self.adapter, self.on_new_best = adapter, on_new_best

    def on_iteration_start(self, event: Any) -> None:
        self.adapter.iteration = int(event["iteration"])

    def on_candidate_selected(self, event: Any) -> None:
        self.adapter.parent_idx = int(event["candidate_idx"])

    def on_valset_evaluated(self, event: Any) -> None:
        score, candidate = float(event["average_score"]), dict(event["candidate"])
        index = int(event["candidate_idx"])
        if index in self.adapter.discovered:
            # gepa re-announces the seed on resume (after restoring our state): it was told
            # and checked already; telling it twice would change what Optuna proposes next.
            return
        self.adapter.discovered[index] = int(event["iteration"])
        # Ask/tell operators (Optuna) learn every candidate's train score (the one GEPA
        # selects by); children rejected on their minibatch are not told.
        self.adapter.observe(candidate, score)
        if score > self.adapter.best_score:
            self.adapter.best_score = score
            self.on_new_best(int(event["candidate_idx"]), candidate)


class _RunLog:
    """GEPA's progress lines go to `run_dir/run_log.txt`, not stdout (our CLI prints tables);
    gepa's own file logger would tee the whole process's stdout and stderr."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def log(self, message: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(f"{message}\n")


class TieKeepsContent:
    """GEPA acceptance for `improvement_or_equal`: a child better on its minibatch joins; a
    child that only ties joins only if it says no less than its parent (`edits.says_less`).

    On one user with a few coarse questions, ties are mostly noise: accepting every tied child
    let a small reflector's damaged texts replace good ones. A tie still lets a child that adds
    something (a new list item) join, which is the exploration the mode exists for.
    """

    def should_accept(self, proposal: Any, state: Any) -> bool:
        before = sum(proposal.subsample_scores_before or [])
        after = sum(proposal.subsample_scores_after or [])
        if after != before:
            return after > before
        parent = state.program_candidates[proposal.parent_program_ids[0]]
        return says_less(dict(parent), dict(proposal.candidate)) is None


class GepaSettings(BaseModel):
    """The GEPA options a spec exposes (`[optimizer]`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidate_selection: str = "pareto"
    use_merge: bool = False
    reflection_minibatch_size: int = Field(default=3, ge=1)
    acceptance: str = "strict_improvement"
    module_selector: str = "round_robin"
    max_metric_calls: int = Field(default=60, ge=1)
    max_generations: int | None = Field(default=None, ge=0, description="GEPA iterations.")


def refuse_text_without_feedback(feedback: str, candidate: Mapping[str, str]) -> None:
    """`feedback = "none"` means no reflective proposal on every path: a seed candidate
    with text components would have GEPA ask for text proposals it must never make."""
    texts = sorted(c for c in candidate if not is_parameter(c))
    if feedback == "none" and texts:
        raise ValueError(
            f'feedback = "none" makes no reflective proposal, but the seed candidate has the '
            f"text components {texts}; leave them out of the seed candidate (as `evolve run` "
            'does: only numeric parameters mutate), or use feedback = "blind" for reflective '
            "proposals without feedback (the selection-on-noise control)"
        )


def budget_stop(budget: Budget, stop: threading.Event | None = None) -> Callable[[], bool]:
    """GEPA stop callback over our limits (LLM calls, tokens, wall time) and the interrupt
    event; checked between generations (`max_metric_calls` counts user evaluations)."""
    return lambda: budget.exhausted() is not None or (stop is not None and stop.is_set())


class HeldoutScore(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidate_idx: int
    score: float
    accuracy: float


class GepaOutcome(BaseModel):
    """What a GEPA run produced: every candidate with lineage, and held-out scores of bests."""

    candidates: list[dict[str, str]]
    parents: list[list[int | None]]
    train_scores: list[float]
    best_idx: int
    heldout: list[HeldoutScore]
    proposals: list[dict[str, Any]]
    units: dict[str, str]
    metric_calls: int | None


def run_gepa(
    adapter: AMemGymAdapter,
    *,
    train_users: Sequence[str],
    heldout_users: Sequence[str],
    seed_candidate: dict[str, str],
    settings: GepaSettings,
    run_dir: Path,
    seed: int,
    stop_when: Callable[[], bool] | None = None,
    callbacks: Sequence[Any] = (),
) -> GepaOutcome:
    """Run (or resume from `run_dir`) GEPA; each new best is evaluated on the held-out users."""
    refuse_text_without_feedback(adapter.feedback, seed_candidate)

    def evaluate_heldout(idx: int, candidate: dict[str, str]) -> None:
        if not heldout_users:
            return
        users = adapter.run_users(candidate, heldout_users, split="heldout")
        scores = [adapter.user_scores(user) for user in users]
        adapter.heldout.append(
            HeldoutScore(
                candidate_idx=idx,
                score=sum(s["score"] for s in scores) / len(scores),
                accuracy=sum(s["accuracy"] for s in scores) / len(scores),
            ).model_dump()
        )

    fresh = not (Path(run_dir) / GEPA_STATE_FILE).exists()
    if heldout_users and fresh:
        # A fresh start: GEPA first evaluates the seed on every train user, and the seed is
        # always the first new best, so its held-out check follows for certain. Both run at
        # once here; GEPA and the held-out callback then read them back from their runner
        # directories (no LLM call), with the same results and in the same order. (A resumed
        # run has done both before GEPA first saved its state.)
        adapter.run_jobs(
            [(seed_candidate, user, "train") for user in train_users]
            + [(seed_candidate, user, "heldout") for user in heldout_users]
        )

    def should_stop(state: Any) -> bool:
        # state.i is the last finished iteration (-1 before the first): one generation each.
        if settings.max_generations is not None and state.i + 1 >= settings.max_generations:
            return True
        return stop_when is not None and stop_when()

    result = gepa_optimize(
        seed_candidate=seed_candidate,
        trainset=list(train_users),
        valset=list(train_users),
        adapter=adapter,
        candidate_selection_strategy=IterationSeededSelector(settings.candidate_selection, seed),
        batch_sampler=IterationSeededBatchSampler(settings.reflection_minibatch_size, seed),
        module_selector=settings.module_selector,
        use_merge=settings.use_merge,
        acceptance_criterion=(
            TieKeepsContent()
            if settings.acceptance == "improvement_or_equal"
            else settings.acceptance
        ),
        max_metric_calls=settings.max_metric_calls,
        stop_callbacks=[should_stop],
        run_dir=str(run_dir),
        callbacks=[_Hooks(adapter, evaluate_heldout), *callbacks],
        skip_perfect_score=False,
        seed=seed,
        display_progress_bar=False,
        logger=_RunLog(Path(run_dir) / "run_log.txt"),
    )
    return GepaOutcome(
        candidates=[dict(c) for c in result.candidates],
        parents=[list(p) for p in result.parents],
        train_scores=list(result.val_aggregate_scores),
        best_idx=result.best_idx,
        heldout=[HeldoutScore.model_validate(h) for h in adapter.heldout],
        proposals=adapter.proposals,
        units=adapter.units,
        metric_calls=result.total_metric_calls,
    )
