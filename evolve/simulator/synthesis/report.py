"""Outcomes of an LLM synthesis run: who was included, who was excluded where and why, and
the tokens and estimated cost per stage and per user."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from evolve.llm.usage import Usage, add_usage
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


def sum_usage(usages: Mapping[str, Usage] | Iterable[Usage]) -> Usage:
    """The sum of a breakdown (stage -> `Usage`) or of a list."""
    return sum(usages.values() if isinstance(usages, Mapping) else usages, Usage())


def usage_cost(usage: Usage, prices: Prices) -> float:
    return prices.cost(usage.prompt_tokens, usage.completion_tokens)


class UserOutcome(BaseModel):
    user_id: str
    status: Literal["included", "excluded"]
    stage: Stage | None = Field(default=None, description="Stage an excluded user failed in.")
    unit: str | None = Field(
        default=None, description="The failed part of that stage, e.g. answers_q03 or updates_p02."
    )
    reason: str | None = None
    # LLM work per stage (stage -> `Usage`: `calls` are predictor calls, `cache_hits` those the
    # server never saw, `parse_failures` and `rejected` their outputs that did not parse or
    # failed validation), including units finished by earlier (resumed) runs.
    usage: dict[str, Usage] = Field(default_factory=dict)
    # Tokens spent by this run only; a fully resumed user has none.
    usage_this_run: dict[str, Usage] = Field(default_factory=dict)
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

    def stage_totals(self, *, this_run: bool = False) -> dict[str, Usage]:
        totals: dict[str, Usage] = {}
        for user in self.users:
            add_usage(totals, user.usage_this_run if this_run else user.usage)
        return {stage.value: totals[stage.value] for stage in Stage if stage.value in totals}

    def total(self, *, this_run: bool = False) -> Usage:
        return sum_usage(self.stage_totals(this_run=this_run))

    def cost_per_user(self) -> float:
        return usage_cost(self.total(), self.prices) / len(self.users) if self.users else 0.0

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
                f"{usage_cost(usage, self.prices):>9.4f}"
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
                f"{user.user_id:<{width}} {user.status:<9} {usage.tokens:>8} "
                f"{usage_cost(usage, self.prices):>8.4f}  {note}"
            )
        return "\n".join(lines)

    def cost_summary(self) -> str:
        prices = self.prices
        cost = usage_cost(self.total(), prices)
        return (
            f"estimated cost ${cost:.4f} for {len(self.users)} user(s), "
            f"${self.cost_per_user():.4f} per user at ${prices.input_per_million:g}/"
            f"${prices.output_per_million:g} per 1M input/output tokens; the paper reports "
            f"about ${PAPER_SYNTHESIS_COST_PER_USER:.2f} per user for data synthesis with gpt-4.1"
        )
