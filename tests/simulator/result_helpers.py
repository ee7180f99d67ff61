"""Hand-made result records for metric and diagnosis tests (no LLM)."""

from __future__ import annotations

from evolve.simulator.baselines import random_score
from evolve.simulator.records import Diagnosis, ItemResult, PeriodResult


def item(
    qi: int,
    correct: bool,
    diagnosis: Diagnosis,
    n_options: int = 4,
    ub: bool | None = True,
    parse_failed: bool = False,
) -> ItemResult:
    states = [[f"s{i}"] for i in range(n_options)]
    return ItemResult(
        question_index=qi,
        question=f"q{qi}",
        required_info=["v"],
        options=[f"o{i}" for i in range(n_options)],
        option_states=states,
        gold=1,
        gold_state=states[0],
        chosen=None if parse_failed else (1 if correct else 2),
        chosen_state=None if parse_failed else states[0 if correct else 1],
        correct=correct,
        parse_failed=parse_failed,
        random_score=random_score(states, states[0]),
        upper_bound_correct=ub,
        diagnosis=diagnosis,
    )


def period(index: int, items: list[ItemResult], user: str = "u", **extra) -> PeriodResult:
    return PeriodResult(user_id=user, period_index=index, state={"v": "s0"}, items=items, **extra)
