"""The no-memory baseline: the agent answering each question knowing nothing about the user.

Random choice is the floor of the memory score, but a model can beat it without any memory:
some options are likelier a priori, and a question's wording can give its answer away. This
baseline measures that: the agent model is asked every question once, with no memory, no
conversation and no state, and its one answer is scored against the gold option of every
period. A memory policy that does no better than this has remembered nothing useful.

Answers are not cached here: with the response cache on, recomputing costs no LLM call, and
with it off the baseline is asked again, as the user asked. An unparseable answer counts as
wrong and is counted (`parse_failures`), as everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import dspy
from dspy.utils.exceptions import AdapterParseError
from pydantic import BaseModel

from evolve.simulator.baselines import choice_error

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import Environment


class AnswerWithoutMemory(dspy.Signature):
    """Nothing is known about the user. Pick the option that most likely answers their question."""

    question: str = dspy.InputField(desc="the user's question")
    options: str = dspy.InputField(desc="numbered answer options")
    choice: int = dspy.OutputField(desc="the number of the single best option")


class NoMemoryAnswer(BaseModel):
    item_id: str
    question_index: int
    chosen: int | None = None  # 1-based; None when unparseable
    parse_error: str | None = None


class NoMemoryResult(BaseModel):
    """One answer per (user, question), scored against every period's gold option."""

    answers: list[NoMemoryAnswer]
    # (user id, period index) -> accuracy over the user's questions at that period
    accuracy_by_period: dict[str, float]

    @property
    def accuracy(self) -> float:
        """Mean accuracy over user-periods (the memory score's unit)."""
        scores = list(self.accuracy_by_period.values())
        return sum(scores) / len(scores) if scores else 0.0

    @property
    def parse_failures(self) -> int:
        return sum(answer.chosen is None for answer in self.answers)


def _ask(
    predictor: dspy.Predict, lms: RoleLMs, item_id: str, qi: int, query: str, options: list[str]
) -> NoMemoryAnswer:
    numbered = "\n".join(f"{i}. {text}" for i, text in enumerate(options, start=1))
    try:
        with lms.context("agent"):
            choice = predictor(question=query, options=numbered).choice
        error = choice_error(choice, len(options))
    except AdapterParseError as exc:
        choice, error = None, " ".join(str(exc).split())[:300]
    if error is not None:
        return NoMemoryAnswer(item_id=item_id, question_index=qi, parse_error=error)
    return NoMemoryAnswer(item_id=item_id, question_index=qi, chosen=choice)


def compute_no_memory(
    env: Environment,
    lms: RoleLMs,
    *,
    concurrency: int = 1,
    on_answer: Callable[[NoMemoryAnswer], None] | None = None,
) -> NoMemoryResult:
    """Ask the agent every question of `env` once without memory; score every period."""
    predictor = dspy.Predict(AnswerWithoutMemory)
    tasks = [
        (item.id, qi, qa.query, [choice.answer for choice in qa.answer_choices])
        for item in env.items
        for qi, qa in enumerate(item.qas)
    ]

    def run(task: tuple[str, int, str, list[str]]) -> NoMemoryAnswer:
        answer = _ask(predictor, lms, *task)
        if on_answer is not None:
            on_answer(answer)
        return answer

    if concurrency <= 1:
        answers = [run(task) for task in tasks]
    else:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            answers = list(pool.map(run, tasks))
    chosen = {(a.item_id, a.question_index): a.chosen for a in answers}
    accuracy: dict[str, float] = {}
    for item in env.items:
        for period_index in range(len(item.periods)):
            if not item.qas:
                continue
            correct = sum(
                chosen[(item.id, qi)] == item.gold_choice_index(period_index, qi) + 1
                for qi in range(len(item.qas))
            )
            accuracy[f"{item.id}/{period_index}"] = correct / len(item.qas)
    return NoMemoryResult(answers=answers, accuracy_by_period=accuracy)
