"""How episodes are played: the settings every unit reads (a leaf of the runner package)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.core.protocol import (
    ALL_RULES,
    DEFAULT_PROTOCOL,
    EVOLVE,
    Protocol,
    ProtocolRules,
    RulesField,
    with_rules,
)

ProbeScope = Literal["all", "wrong_only"]


def probe_scope_problem(rules: ProtocolRules, probes: ProbeScope) -> str | None:
    """Why a probe scope cannot be used under a protocol (None when it can)."""
    if probes in rules.probe_scopes:
        return None
    allowing = [other.name for other in ALL_RULES if probes in other.probe_scopes]
    alternatives = [f"probes = '{scope}'" for scope in rules.probe_scopes[:1]]
    alternatives += [f"protocol = '{name}'" for name in allowing]
    return (
        f"probes = '{probes}' is refused under protocol '{rules.name}': "
        f"{rules.probe_scope_reason}; use {' or '.join(alternatives)}"
    )


class EpisodeConfig(BaseModel):
    """How episodes are played. `concurrency` changes speed only, never results."""

    model_config = ConfigDict(extra="forbid")

    protocol: Protocol = Field(
        default=DEFAULT_PROTOCOL,
        description="Information flow: 'paper' (the reference code's) or ours.",
    )
    # What the protocol decides, resolved from `protocol` when the config is made (pass
    # `rules=` instead to hand the object down); every unit reads it.
    rules: RulesField = Field(default=EVOLVE, exclude=True, repr=False)
    rounds_initial: int = Field(default=1, ge=1, description="Rounds per session in period 0.")
    rounds_update: int = Field(default=1, ge=1, description="Rounds per session afterwards.")
    concurrency: int = Field(
        default=4,
        ge=1,
        description="LLM calls in flight (users, questions and probes share them; so at most "
        "this many users at once).",
    )
    seed: int = 0
    max_users: int | None = Field(default=None, ge=1, description="First N users only.")
    probes: ProbeScope = Field(
        default="all",
        description="wrong_only (evolve only): probe only the variables of wrongly answered "
        "items. A variable not probed at its last write period then counts as not recalled.",
    )

    @model_validator(mode="before")
    @classmethod
    def _rules_of_protocol(cls, data: Any) -> Any:
        return with_rules(data)

    @model_validator(mode="after")
    def _probes_for_protocol(self) -> EpisodeConfig:
        problem = probe_scope_problem(self.rules, self.probes)
        if problem:
            raise ValueError(problem)
        return self

    def rounds_for(self, period_index: int) -> int:
        return self.rounds_initial if period_index == 0 else self.rounds_update

    def identity(self) -> dict[str, Any]:
        """The settings that determine results (what the config hash covers)."""
        return self.model_dump(exclude={"concurrency"})
