"""Moved: `evolve.llm.usage.tracked_usage` (the one usage record lives there)."""

from __future__ import annotations

from evolve.llm.usage import tracked_usage
from memory_policies.deprecation import warn_renamed

warn_renamed("evolve.simulator.run.usage", "evolve.llm.usage")

__all__ = ["tracked_usage"]
