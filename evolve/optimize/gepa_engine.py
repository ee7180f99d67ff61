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
from evolve.optimize.edits import says_less
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.optimize.operators import is_parameter
from evolve.results.budget import Budget

# GEPA's checkpoint in its run_dir (gepa.core.state): present once a run has started.
GEPA_STATE_FILE = "gepa_state.bin"
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
        lineage = self.adapter.lineage
        if index in lineage.discovered:
            # gepa re-announces the seed on resume (after restoring our state): it was told
            # and checked already; telling it twice would change what Optuna proposes next.
            return
        lineage.discovered[index] = int(event["iteration"])
        # Ask/tell operators (Optuna) learn every candidate's train score (the one GEPA
        # selects by); children rejected on their minibatch are not told.
        self.adapter.observe(candidate, score)
        if score > lineage.best_score:
            lineage.best_score = score
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
    validation_users: Sequence[str] = (),
    settings: GepaSettings,
    run_dir: Path,
    seed: int,
    stop_when: Callable[[], bool] | None = None,
    callbacks: Sequence[Any] = (),
) -> GepaOutcome:
    """Run (or resume from `run_dir`) GEPA; each new best is evaluated on the held-out users.
    GEPA's valset is `validation_users` when given (the best is chosen on users nobody
    reflected on), else the train users."""
    valset = list(validation_users) or list(train_users)
    refuse_text_without_feedback(adapter.feedback, seed_candidate)

    def evaluate_heldout(idx: int, candidate: dict[str, str]) -> None:
        if not heldout_users:
            return
        users = adapter.run_users(candidate, heldout_users, split="heldout")
        scores = [adapter.user_scores(user) for user in users]
        adapter.lineage.heldout.append(
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
            + [(seed_candidate, user, "validation") for user in validation_users]
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
        valset=valset,
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
        heldout=[HeldoutScore.model_validate(h) for h in adapter.lineage.heldout],
        proposals=adapter.lineage.proposals,
        units=adapter.units,
        metric_calls=result.total_metric_calls,
    )
