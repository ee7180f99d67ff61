"""Running GEPA (`gepa.optimize`) over the `AMemGymAdapter` (see `gepa_adapter`).

What stays ours and why: iteration-seeded parent/minibatch selection (gepa 0.1.4 rebuilds
`Random(seed)` on every call and does not persist its batch sampler, so a resumed run would
otherwise choose differently), the tie rule of `improvement_or_equal` acceptance, the
held-out evaluation of each new best (held-out users are never shown to GEPA) and the budget
stopper over our spend (LLM calls / tokens / wall time). What GEPA does: Pareto (or other)
candidate selection, minibatch acceptance, merge, metric-call budget, run_dir checkpoints.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gepa import optimize as gepa_optimize
from gepa.core.callbacks import GEPACallback
from gepa.strategies.candidate_selector import (
    CurrentBestCandidateSelector,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    TopKParetoCandidateSelector,
)
from pydantic import BaseModel, ConfigDict, Field

from evolve.core.seeds import derive_seed
from evolve.feedback import feedback_kind
from evolve.optimize.edits import says_less
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.optimize.gepa_checkpoint import GEPA_STATE_FILE, check_gepa_state
from evolve.optimize.gepa_lineage import GepaLineage
from evolve.optimize.operators import is_parameter
from evolve.results.budget import Budget
from evolve.results.objective import format_score

CANDIDATE_SELECTIONS = ("pareto", "current_best", "epsilon_greedy", "top_k_pareto")


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


class GepaEvents(GEPACallback):
    """GEPA's callbacks, recording only: what each iteration did, into the run's lineage
    (the event log GEPA does not keep). Nothing here plays a user, tells an operator or
    writes a record: the schedule does that between iterations (`run_gepa`), from GEPA's
    returned outcome and this log. Reading the spend and announcing progress are allowed.
    gepa documents callbacks as observers; acting inside one would hide LLM calls and
    writes in GEPA's control flow."""

    def __init__(
        self,
        lineage: GepaLineage,
        spent: Callable[[], Any] | None = None,
        announce: Callable[[int], None] | None = None,
    ) -> None:
        # `spent` reads the budget's spend; `announce` shows progress (neither acts).
        self.lineage, self.spent, self.announce = lineage, spent, announce
        self._started: Any = None
        self._rejected: dict[str, Any] | None = None

    def on_iteration_start(self, event: Any) -> None:
        self.lineage.current_iteration = int(event["iteration"])
        if self.announce is not None:
            self.announce(int(event["iteration"]))
        self._started = self.spent() if self.spent else None
        self._rejected = None

    def on_candidate_selected(self, event: Any) -> None:
        self.lineage.current_parent = int(event["candidate_idx"])

    def on_valset_evaluated(self, event: Any) -> None:
        # gepa re-announces the seed on every resume: the first announcement is the one.
        self.lineage.discovered.setdefault(int(event["candidate_idx"]), int(event["iteration"]))

    def on_candidate_rejected(self, event: Any) -> None:
        new, old = float(event["new_score"]), float(event["old_score"])
        self._rejected = {
            "minibatch_score": new,
            "minibatch_parent_score": old,
            "reason": rejection_in_words(new, old, str(event["reason"])),
        }

    def on_iteration_end(self, event: Any) -> None:
        entry: dict[str, Any] = {
            "iteration": int(event["iteration"]),
            "accepted": bool(event["proposal_accepted"]),
            "rejected": self._rejected,
        }
        if self.spent is not None:
            end = self.spent()
            start = self._started or end
            entry.update(
                llm_calls_start=start.requests,
                llm_calls_end=end.requests,
                tokens_start=start.tokens,
                tokens_end=end.tokens,
                wall_time_s=end.wall_time_s - start.wall_time_s,
            )
        self.lineage.iterations.append(entry)


def rejection_in_words(new: float, old: float, gepa_reason: str) -> str:
    """GEPA's rejection text (`... (old_sum=-0.33333333333333187, new_sum=...)`) as the
    reason a reader sees: the two minibatch sums, rounded, and what they mean."""
    scores = f"{format_score(new)} vs its parent's {format_score(old)}"
    if "not selected" in gepa_reason:  # passed the check, another proposal was chosen
        return (
            f"passed the minibatch check ({scores}, summed over the minibatch users) but "
            "another proposal of the same step was selected"
        )
    verdict = "below its parent" if new < old - 1e-9 else "no better than its parent"
    return f"{verdict} on the minibatch: {scores} (the score summed over the minibatch users)"


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
    if texts and not feedback_kind(feedback).proposes:
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
    """What a GEPA run has produced so far: every candidate with lineage, and held-out
    scores of the new bests. `run_gepa` hands one to its caller after every iteration."""

    candidates: list[dict[str, str]]
    parents: list[list[int | None]]
    train_scores: list[float]
    best_idx: int
    heldout: list[HeldoutScore]
    proposals: list[dict[str, Any]]
    score_units: dict[str, str]
    metric_calls: int | None
    # GEPA iterations finished (generation numbers run 1..iterations) and the pool
    # indices on its valset Pareto front.
    iterations: int = 0
    pareto_front: list[int] = Field(default_factory=list)

    def new_bests(self) -> list[int]:
        """Pool indices that beat every earlier candidate's score when they joined (the
        seed first): the candidates a held-out check follows."""
        bests, best = [], float("-inf")
        for index, score in enumerate(self.train_scores):
            if score > best:
                bests.append(index)
                best = score
        return bests

    def best_by_score(self) -> int:
        """The pool's best by GEPA's score; a tie goes to the earlier candidate."""
        return max(range(len(self.train_scores)), key=lambda i: (self.train_scores[i], -i))


def run_gepa(
    adapter: AMemGymAdapter,
    *,
    train_users: Sequence[str],
    heldout_users: Sequence[str],
    seed_candidate: dict[str, str],
    validation_users: Sequence[str] = (),
    settings: GepaSettings,
    run_dir: Path,
    seed: int,
    stop_when: Callable[[], bool] | None = None,
    spent: Callable[[], Any] | None = None,
    before_iteration: Callable[[int], None] | None = None,
    after_iteration: Callable[[GepaOutcome], None] | None = None,
) -> GepaOutcome:
    """Run (or resume from `run_dir`) GEPA one iteration at a time. Between iterations,
    this function acts on what GEPA returned: ask/tell operators learn each new candidate's
    score, each new best is played on the held-out users, and `after_iteration` (the
    schedule's records) sees the outcome. GEPA's callbacks only record (`GepaEvents`).
    GEPA's valset is `validation_users` when given (the best is chosen on users nobody
    reflected on), else the train users.

    Stepping costs no LLM call: each step resumes GEPA's checkpoint, whose seed evaluation
    is read back from its runner directories, and the iteration-seeded selector and
    sampler make a stepped run choose as one uninterrupted run would."""
    refuse_text_without_feedback(adapter.feedback, seed_candidate)
    if heldout_users and not (Path(run_dir) / GEPA_STATE_FILE).exists():
        # A fresh start: GEPA first evaluates the seed on every valset user, and the seed is
        # always the first new best, so its held-out check follows for certain. Both run at
        # once here; GEPA and the held-out check then read them back from their runner
        # directories (no LLM call), with the same results and in the same order.
        adapter.run_jobs(
            [(seed_candidate, user, "train") for user in train_users]
            + [(seed_candidate, user, "validation") for user in validation_users]
            + [(seed_candidate, user, "heldout") for user in heldout_users]
        )
    heldout: dict[int, HeldoutScore] = {}
    limit = settings.max_generations
    target = 0  # step 0 evaluates the seed only, so operators learn it before proposing
    while True:
        outcome = _gepa_iterations(
            adapter,
            until=target,
            train_users=train_users,
            validation_users=validation_users,
            seed_candidate=seed_candidate,
            settings=settings,
            run_dir=run_dir,
            seed=seed,
            stop_when=stop_when,
            spent=spent,
            before_iteration=before_iteration,
        )
        # Ask/tell operators (Optuna) learn every candidate's score (the one GEPA selects
        # by), in pool order; children rejected on their minibatch are not told.
        for index in range(len(adapter.observed), len(outcome.candidates)):
            adapter.observe(outcome.candidates[index], outcome.train_scores[index])
        for index in outcome.new_bests():
            if heldout_users and index not in heldout:
                heldout[index] = _heldout_score(adapter, index, outcome, heldout_users)
        outcome = outcome.model_copy(update={"heldout": sorted(heldout.values(), key=_by_index)})
        if after_iteration is not None:
            after_iteration(outcome)
        stopped = outcome.iterations < target or (stop_when is not None and stop_when())
        if stopped or (limit is not None and outcome.iterations >= limit):
            return outcome
        target = outcome.iterations + 1


def _by_index(score: HeldoutScore) -> int:
    return score.candidate_idx


def _heldout_score(
    adapter: AMemGymAdapter, index: int, outcome: GepaOutcome, users: Sequence[str]
) -> HeldoutScore:
    played = adapter.run_users(outcome.candidates[index], users, split="heldout")
    scores = [adapter.user_scores(user) for user in played]
    return HeldoutScore(
        candidate_idx=index,
        score=sum(s["score"] for s in scores) / len(scores),
        accuracy=sum(s["accuracy"] for s in scores) / len(scores),
    )


def _gepa_iterations(
    adapter: AMemGymAdapter,
    *,
    until: int,
    train_users: Sequence[str],
    validation_users: Sequence[str],
    seed_candidate: dict[str, str],
    settings: GepaSettings,
    run_dir: Path,
    seed: int,
    stop_when: Callable[[], bool] | None,
    spent: Callable[[], Any] | None,
    before_iteration: Callable[[int], None] | None,
) -> GepaOutcome:
    """One `gepa.optimize` call that resumes `run_dir` and stops once `until` iterations
    have finished (or earlier: the budget, an interrupt, GEPA's metric-call limit)."""

    def should_stop(state: Any) -> bool:
        # state.i is the last finished iteration (-1 before the first).
        if state.i + 1 >= until:
            return True
        return stop_when is not None and stop_when()

    check_gepa_state(run_dir)  # GEPA unpickles it: nothing but builtins may be in it
    result = gepa_optimize(
        seed_candidate=seed_candidate,
        trainset=list(train_users),
        valset=list(validation_users) or list(train_users),
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
        callbacks=[GepaEvents(adapter.lineage, spent, before_iteration)],
        skip_perfect_score=False,
        seed=seed,
        display_progress_bar=False,
        logger=_RunLog(Path(run_dir) / "run_log.txt"),
    )
    front = sorted({i for ids in result.per_val_instance_best_candidates.values() for i in ids})
    return GepaOutcome(
        candidates=[dict(c) for c in result.candidates],
        parents=[list(p) for p in result.parents],
        train_scores=list(result.val_aggregate_scores),
        best_idx=result.best_idx,
        heldout=[],
        proposals=adapter.lineage.proposals,
        score_units=adapter.score_units,
        metric_calls=result.total_metric_calls,
        iterations=len(adapter.lineage.iterations),
        pareto_front=front,
    )
