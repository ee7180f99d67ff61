"""Outcomes of an LLM synthesis run: who was included, who was excluded where and why, and
the tokens and estimated cost per stage and per user."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from evolve.simulator.synthesis.config import Prices

# The paper's reported costs with gpt-4.1 (US dollars per user), shown beside our own counts.
PAPER_SYNTHESIS_COST_PER_USER = 0.40
PAPER_SIMULATED_USER_COST_PER_USER = 0.17


class Stage(StrEnum):
    """Pipeline stages, in order; an excluded user names the one it failed in."""

    PROFILE = "profile"
    QUESTIONS = "questions"
    SCHEMA = "schema"
    INITIAL_STATE = "initial_state"
    UPDATES = "updates"
    EVENTS = "events"
    ANSWERS = "answers"
    QUERIES = "queries"
    ASSEMBLE = "assemble"


class StageUsage(BaseModel):
    """LLM work of one stage (or a sum of stages). `billed_calls` excludes cache hits."""

    calls: int = 0
    billed_calls: int = 0
    parse_failures: int = 0
    rejected: int = Field(default=0, description="Outputs that parsed but failed validation.")
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, other: StageUsage) -> StageUsage:
        return StageUsage(
            **{name: getattr(self, name) + getattr(other, name) for name in StageUsage.model_fields}
        )

    def cost(self, prices: Prices) -> float:
        return prices.cost(self.prompt_tokens, self.completion_tokens)


def sum_usage(usages: dict[str, StageUsage] | list[StageUsage]) -> StageUsage:
    total = StageUsage()
    for usage in usages.values() if isinstance(usages, dict) else usages:
        total = total.plus(usage)
    return total


def add_usage(target: dict[str, StageUsage], source: dict[str, StageUsage]) -> None:
    for stage, usage in source.items():
        target[stage] = target.get(stage, StageUsage()).plus(usage)


class UserOutcome(BaseModel):
    user_id: str
    status: Literal["included", "excluded"]
    stage: Stage | None = Field(default=None, description="Stage an excluded user failed in.")
    unit: str | None = Field(
        default=None, description="The failed part of that stage, e.g. answers_q03 or updates_p02."
    )
    reason: str | None = None
    # Tokens of every stage, including units finished by earlier (resumed) runs.
    usage: dict[str, StageUsage] = Field(default_factory=dict)
    # Tokens spent by this run only; a fully resumed user has none.
    usage_this_run: dict[str, StageUsage] = Field(default_factory=dict)
    resumed_units: list[str] = Field(default_factory=list)
    refinements: dict[str, int] = Field(default_factory=dict)


class SynthesisReport(BaseModel):
    work_key: str
    seed: int
    simulator_model: str
    lang: str
    prices: Prices
    users: list[UserOutcome]

    @property
    def included(self) -> list[UserOutcome]:
        return [user for user in self.users if user.status == "included"]

    @property
    def excluded(self) -> list[UserOutcome]:
        return [user for user in self.users if user.status == "excluded"]

    def stage_totals(self, *, this_run: bool = False) -> dict[str, StageUsage]:
        totals: dict[str, StageUsage] = {}
        for user in self.users:
            add_usage(totals, user.usage_this_run if this_run else user.usage)
        return {stage.value: totals[stage.value] for stage in Stage if stage.value in totals}

    def total(self, *, this_run: bool = False) -> StageUsage:
        return sum_usage(self.stage_totals(this_run=this_run))

    def cost_per_user(self) -> float:
        return self.total().cost(self.prices) / len(self.users) if self.users else 0.0

    def stage_table(self) -> str:
        """Tokens and estimated cost per stage (all runs of this work dir), plus totals."""
        header = (
            f"{'stage':<14} {'calls':>6} {'parse':>6} {'reject':>6} {'prompt':>9} "
            f"{'completion':>10} {'cost $':>9}"
        )
        lines = [header]
        rows = list(self.stage_totals().items()) + [("total", self.total())]
        for stage, usage in rows:
            lines.append(
                f"{stage:<14} {usage.calls:>6} {usage.parse_failures:>6} {usage.rejected:>6} "
                f"{usage.prompt_tokens:>9} {usage.completion_tokens:>10} "
                f"{usage.cost(self.prices):>9.4f}"
            )
        return "\n".join(lines)

    def user_table(self) -> str:
        width = max([len(user.user_id) for user in self.users] + [4])
        lines = [f"{'user':<{width}} {'status':<9} {'tokens':>8} {'cost $':>8}  note"]
        for user in self.users:
            usage = sum_usage(user.usage)
            if user.status == "excluded":
                note = f"excluded at {user.stage} ({user.unit}): {user.reason}"
            elif user.resumed_units and not user.usage_this_run:
                note = "resumed (no new calls)"
            else:
                note = ""
            lines.append(
                f"{user.user_id:<{width}} {user.status:<9} {usage.total_tokens:>8} "
                f"{usage.cost(self.prices):>8.4f}  {note}"
            )
        return "\n".join(lines)

    def cost_summary(self) -> str:
        prices = self.prices
        return (
            f"estimated cost ${self.total().cost(prices):.4f} for {len(self.users)} user(s), "
            f"${self.cost_per_user():.4f} per user at ${prices.input_per_million:g}/"
            f"${prices.output_per_million:g} per 1M input/output tokens; the paper reports "
            f"about ${PAPER_SYNTHESIS_COST_PER_USER:.2f} per user for data synthesis with gpt-4.1"
        )
