"""The upper bound's answers as stored: one entry per (user, question, answer variant).

A leaf (pydantic and the protocol names only): the metrics and the run directory read a table
without importing how it is computed (`evolve.simulator.baselines`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from evolve.core.protocol import DEFAULT_PROTOCOL, Protocol

# Bump when what a stored table holds changes: older tables are then computed again.
UPPER_BOUND_FORMAT_VERSION = 2


class UpperBoundEntry(BaseModel):
    item_id: str
    question_index: int
    variant_index: int = Field(description="0-based answer option whose state was given.")
    chosen: int | None = Field(description="1-based; None when unparseable.")
    correct: bool
    parse_failed: bool
    parse_error: str | None = None


class UpperBoundTable(BaseModel):
    """Upper-bound answers per (user, question, variant) for one environment and agent model."""

    format_version: int = UPPER_BOUND_FORMAT_VERSION
    environment_hash: str
    protocol: Protocol = Field(
        default=DEFAULT_PROTOCOL, description="Which prompt layout asked the questions."
    )
    agent_model: str
    agent_identity: dict[str, Any] = Field(
        default_factory=dict,
        description="What the agent's answers depend on (endpoint address, dialect, "
        "temperature, max_tokens), without credentials.",
    )
    cache_key: str = Field(default="", description="Hash of everything the cache is keyed by.")
    entries: dict[str, UpperBoundEntry] = Field(default_factory=dict)

    @staticmethod
    def key(item_id: str, question_index: int, variant_index: int) -> str:
        return f"{item_id}/{question_index}/{variant_index}"

    def entry(
        self, item_id: str, question_index: int, variant_index: int
    ) -> UpperBoundEntry | None:
        return self.entries.get(self.key(item_id, question_index, variant_index))

    def correct(self, item_id: str, question_index: int, variant_index: int) -> bool | None:
        """None when the variant is not in the table (an incomplete or foreign table)."""
        found = self.entry(item_id, question_index, variant_index)
        return found.correct if found else None

    def parse_failed(self, item_id: str, question_index: int, variant_index: int) -> bool:
        found = self.entry(item_id, question_index, variant_index)
        return bool(found and found.parse_failed)

    @property
    def parse_failures(self) -> int:
        return sum(entry.parse_failed for entry in self.entries.values())
