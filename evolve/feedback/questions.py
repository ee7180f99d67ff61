"""What a feedback kind is given: every scored question as data, extracted once from the
stored evaluation records (no LLM). A kind renders its own text from these; an operator
that needs the failures (`list_edit`) reads them here, never from a kind's wording."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from evolve.simulator.records import Diagnosis, ItemResult, PeriodResult


class FactCheck(BaseModel):
    """One fact a question needed, as the diagnosis saw it."""

    model_config = ConfigDict(frozen=True)

    variable: str = Field(description="The fact's id (the environment's variable name).")
    gold: str = Field(description="Its true value in the question's period.")
    recalled: str | None = Field(description="What the memory probe recalled; None: nothing.")
    in_memory: bool = Field(description="The memory held the true value when asked.")
    changed_from: str | None = Field(
        default=None, description="Its previous value when it changed entering this period."
    )


class AnsweredQuestion(BaseModel):
    """One scored question with everything a reflector may be shown about it."""

    model_config = ConfigDict(frozen=True)

    user_id: str
    period: int
    question: str
    options: list[str]
    gold: int = Field(description="1-based index of the correct option.")
    chosen: int | None = Field(description="1-based; None when the answer was unparseable.")
    correct: bool
    diagnosis: Diagnosis
    required_facts: list[str]
    facts: list[FactCheck] = Field(default_factory=list)
    memory_held: str = Field(description="The policy's memory at the end of the period.")
    answered_from: str = Field(
        description="What the answer was given from: the retrieved memories, else all memory."
    )
    user_said: str | None = Field(
        default=None,
        description="The opening message of the session that last exposed a fact this "
        "question failed on (None when it answered right, or no session exposed one).",
    )

    def missing_facts(self) -> list[str]:
        """The facts the memory did not hold when asked."""
        return [fact.variable for fact in self.facts if not fact.in_memory]


def answered_questions(
    results: Sequence[PeriodResult], periods: Iterable[int] | None = None
) -> list[AnsweredQuestion]:
    """The questions of `results` (restricted to `periods` when given), in stored order.
    `results` may include earlier periods than those scored: they are where a failed fact's
    revealing message is found."""
    history = {(r.user_id, r.period_index): r for r in results}
    scored_periods = set(periods) if periods is not None else None
    return [
        _answered(result, item, history)
        for result in results
        if scored_periods is None or result.period_index in scored_periods
        for item in result.items
    ]


def _answered(
    result: PeriodResult, item: ItemResult, history: dict[tuple[str, int], PeriodResult]
) -> AnsweredQuestion:
    facts = []
    for check in item.variables:
        changed = result.state_updates.get(check.variable)
        facts.append(
            FactCheck(
                variable=check.variable,
                gold=check.gold,
                recalled=check.probed,
                in_memory=check.correct_now,
                changed_from=changed.get("old") if changed else None,
            )
        )
    return AnsweredQuestion(
        user_id=result.user_id,
        period=result.period_index,
        question=item.question,
        options=list(item.options),
        gold=item.gold,
        chosen=item.chosen,
        correct=item.correct,
        diagnosis=item.diagnosis,
        required_facts=list(item.required_info),
        facts=facts,
        memory_held=result.memory_description,
        answered_from=_answered_from(result, item),
        user_said=None if item.correct else _revealing_message(item, result, history),
    )


def _answered_from(result: PeriodResult, item: ItemResult) -> str:
    """What the policy answered from: its retrieved memories, else its whole memory."""
    if item.retrieved:
        return " | ".join(" ".join(str(entry).split()) for entry in item.retrieved)
    return " ".join((result.memory_description or "(empty)").split())


def _revealing_message(
    item: ItemResult, result: PeriodResult, history: dict[tuple[str, int], PeriodResult]
) -> str | None:
    """The opening message of the session that last exposed a failed fact."""
    for check in item.variables:
        if check.correct_now:
            continue
        source = history.get((result.user_id, check.last_write_period))
        if source is None:
            continue
        for session in source.sessions:
            if check.variable in session.exposed_states:
                return session.query
    return None
