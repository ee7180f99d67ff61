"""The offline synthesis config (the shape of a generated environment) and its presets.

A preset names one shape: the paper's v1.base and v1.extra, `tiny` for tests, and the recall
worlds for small models (`recall` over the everyday catalog domains, `recall_crafts` over the
craft hobbies), each of which pins the catalog domains it draws from.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)

from evolve.core.errors import ConfigError

# Users one synthesis makes: far above any benchmark (v1.base publishes 20), far below what
# fills a disk (a user is tens of kB); a larger value is a typo, refused in one line.
MAX_USERS = 10_000


def _as_span(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return value


def _check_span(span: tuple[int, int]) -> tuple[int, int]:
    low, high = span
    if low > high:
        raise ValueError(f"range [{low}, {high}] has its minimum above its maximum")
    return span


# An inclusive [min, max] range; a single integer n means [n, n].
Span = Annotated[tuple[int, int], BeforeValidator(_as_span), AfterValidator(_check_span)]


class OfflineSynthesisConfig(BaseModel):
    """Shape of a generated environment (the original's env config, plus episode rounds).

    `rounds_initial` / `rounds_update` are episode defaults for the runner; they are not
    written into the environment file, which keeps the original format.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    num_periods: int = Field(ge=1, description="Periods after the initial one (period 0).")
    num_questions: int = Field(ge=1)
    states_per_question: int = Field(ge=1, description="Variables each question depends on.")
    choices_per_state: Span = Field(description="Values per schema variable, [min, max].")
    changes_per_period: Span = Field(description="State changes per period, [min, max].")
    max_changes_per_state: int = Field(ge=1, description="Changes of one variable in total.")
    min_state_variants: int = Field(ge=2, description="Answer choices per question, at least.")
    changes_per_event: Span = Field(default=(1, 2), description="Changes one session reveals.")
    variables_per_initial_session: Span = Field(
        default=(1, 3), description="Initial values one period-0 session reveals."
    )
    start_date: date = date(2020, 10, 1)
    period_length: int = Field(default=3, ge=1)
    period_unit: Literal["months", "days"] = "months"
    rounds_initial: int = Field(default=1, ge=1, description="Episode rounds per period-0 session.")
    rounds_update: int = Field(default=1, ge=1, description="Episode rounds per later session.")
    num_users: int = Field(
        default=20, ge=1, le=MAX_USERS, description="Users generated when not given."
    )
    question_kind: Literal["advice", "recall"] = Field(
        default="advice",
        description="advice: AMemGym's questions (advice that depends on the state); recall: "
        "direct questions about one variable's current value (a small-model world).",
    )
    domains: tuple[str, ...] | None = Field(
        default=None,
        description="recall only: the catalog domains the users' variables are drawn from "
        "(default: every domain with recall questions).",
    )

    @model_validator(mode="after")
    def _check_consistency(self) -> OfflineSynthesisConfig:
        if self.question_kind == "recall" and self.states_per_question != 1:
            raise ValueError(
                "recall questions ask about one variable each: set states_per_question = 1, "
                f"got {self.states_per_question}"
            )
        if self.domains is not None and self.question_kind != "recall":
            raise ValueError("domains only apply to recall questions (question_kind = recall)")
        if self.choices_per_state[0] < 2:
            raise ValueError("choices_per_state must be at least 2 (a variable needs a choice)")
        if self.changes_per_period[0] < 1:
            raise ValueError("changes_per_period must be at least 1 (every period has a session)")
        for name in ("changes_per_event", "variables_per_initial_session"):
            if getattr(self, name)[0] < 1:
                raise ValueError(f"{name} must be at least 1")
        combinations = self.choices_per_state[0] ** self.states_per_question
        if self.min_state_variants > combinations:
            raise ValueError(
                f"min_state_variants={self.min_state_variants} exceeds the {combinations} value "
                f"combinations of {self.states_per_question} variables with "
                f"{self.choices_per_state[0]} values; lower it or raise choices_per_state"
            )
        shortest = 28 * self.period_length if self.period_unit == "months" else self.period_length
        if self.changes_per_period[1] > shortest:
            raise ValueError(
                f"up to {self.changes_per_period[1]} sessions must fit on separate evenings of a "
                f"{shortest}-day period; lengthen the period or allow fewer changes"
            )
        return self


# The recall worlds' domains (catalog files of the same names); pinned, so that a catalog file
# added later changes no existing world's draws.
EVERYDAY_DOMAINS = (
    "diet",
    "family",
    "finances",
    "fitness",
    "health",
    "hobbies",
    "housing",
    "learning",
    "travel",
    "work",
)
CRAFT_DOMAINS = (
    "bookbinding",
    "calligraphy",
    "candle_making",
    "jewellery_making",
    "knitting",
    "leatherwork",
    "pottery",
    "stained_glass",
    "weaving",
    "woodturning",
)


def _recall_world(name: str, domains: tuple[str, ...]) -> OfflineSynthesisConfig:
    return OfflineSynthesisConfig(
        name=name,
        num_periods=2,
        num_questions=8,
        states_per_question=1,
        choices_per_state=3,
        changes_per_period=(3, 4),
        max_changes_per_state=2,
        min_state_variants=3,
        period_length=1,
        rounds_initial=1,
        rounds_update=1,
        num_users=4,
        question_kind="recall",
        domains=domains,
    )


PRESETS: dict[str, OfflineSynthesisConfig] = {
    # The paper's v1.base: 4 changes per period, accepted within +-1 as the original does.
    "v1.base": OfflineSynthesisConfig(
        name="v1.base",
        num_periods=10,
        num_questions=10,
        states_per_question=2,
        choices_per_state=3,
        changes_per_period=(3, 5),
        max_changes_per_state=3,
        min_state_variants=4,
        rounds_initial=1,
        rounds_update=2,
        num_users=20,
    ),
    "v1.extra": OfflineSynthesisConfig(
        name="v1.extra",
        num_periods=20,
        num_questions=10,
        states_per_question=3,
        choices_per_state=3,
        changes_per_period=(3, 5),
        max_changes_per_state=3,
        min_state_variants=4,
        rounds_initial=2,
        rounds_update=5,
        num_users=20,
    ),
    # Small enough for a 0.5B model on 2 CPU cores: a handful of sessions per user.
    "tiny": OfflineSynthesisConfig(
        name="tiny",
        num_periods=2,
        num_questions=2,
        states_per_question=2,
        choices_per_state=(2, 3),
        changes_per_period=(1, 2),
        max_changes_per_state=2,
        min_state_variants=3,
        period_length=1,
        rounds_initial=1,
        rounds_update=1,
        num_users=4,
    ),
    # The reference fixture's world (benchmarks/cross_check.py --preset fidelity): 8 questions
    # a user, so that the margin rule defines a memory score in most user-periods; 4 periods
    # with at least 2 options a question, so questions have 2, 3 and 4 options (every state
    # the trajectory visits is one); run with 3-round later sessions, so that memory stores
    # outgrow the paper's top_k of 30.
    "fidelity": OfflineSynthesisConfig(
        name="fidelity",
        num_periods=3,
        num_questions=8,
        states_per_question=2,
        choices_per_state=(2, 3),
        changes_per_period=(4, 6),
        max_changes_per_state=2,
        min_state_variants=2,
        period_length=1,
        rounds_initial=1,
        rounds_update=3,
        num_users=3,
    ),
    # Not AMemGym's questions: direct questions about one variable's current value, so that a
    # 0.5B model's memory is measurable (it answers them well when told the state, at chance
    # otherwise). 8 variables from 8 of the 10 everyday domains (4 variables each); about half
    # of them change in each period.
    "recall": _recall_world("recall", EVERYDAY_DOMAINS),
    # The same world over 10 craft hobbies, one variable each (catalog/crafts.json): a user has
    # 8 of them, so users share most of their facts, and a general types list ("Hobbies",
    # "Crafts") puts them all under one type. What a memory must keep apart here is not what a
    # model guesses for "a user" with no feedback.
    "recall_crafts": _recall_world("recall_crafts", CRAFT_DOMAINS),
}


def get_preset(name: str) -> OfflineSynthesisConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown synthesis preset {name!r}; choose one of {', '.join(PRESETS)}"
        ) from None
