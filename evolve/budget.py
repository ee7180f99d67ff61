"""Spend and budget limits shared by evolution (`evolve.optimize`) and tuning (`evolve.tuning`).

A leaf module: it imports nothing from evolve's packages at run time, so both engines can
depend on it without depending on each other (no optimize <-> tuning import cycle).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.llm.usage import CompletedCall
    from evolve.optimize.store import SpendJournal


class Spend(BaseModel):
    llm_calls: int = 0
    tokens: int = 0
    wall_time_s: float = 0.0

    def plus(self, other: Spend) -> Spend:
        return Spend(
            llm_calls=self.llm_calls + other.llm_calls,
            tokens=self.tokens + other.tokens,
            wall_time_s=self.wall_time_s + other.wall_time_s,
        )


class BudgetExhausted(Exception):
    """Raised inside an engine when a budget limit is reached; the engine stops cleanly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Budget:
    """Spend so far (earlier invocations + this one) against the spec's limits.

    With a `journal`, every completed call of every role is also appended to it as it
    completes, so a killed process leaves a ledger short only by its in-flight calls.
    Call `close()` when the run ends.
    """

    def __init__(
        self, limits: Any, lms: RoleLMs, before: Spend, journal: SpendJournal | None = None
    ) -> None:
        self.limits = limits
        self.lms = lms
        self.before = before
        self.journal = journal
        self._usage_start = lms.usage.snapshot()
        self._time_start = time.perf_counter()
        if journal is not None:
            lms.usage.add_listener(self._journal_call)

    def _journal_call(self, call: CompletedCall) -> None:
        assert self.journal is not None
        self.journal.record_call(
            role=call.role,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=call.completion_tokens,
            cache_hit=call.cache_hit,
            failed=call.failed,
            wall_time_s=self.before.wall_time_s + time.perf_counter() - self._time_start,
        )

    def close(self) -> None:
        """Stop journaling (the journal is closed; the tracker keeps counting)."""
        if self.journal is not None:
            self.lms.usage.remove_listener(self._journal_call)
            self.journal.close()

    def spent(self) -> Spend:
        delta = self.lms.usage.snapshot().minus(self._usage_start)
        return self.before.plus(
            Spend(
                # Responses served from DSPy's cache cost nothing.
                llm_calls=delta.total_calls - delta.cache_hits,
                tokens=delta.total_tokens,
                wall_time_s=time.perf_counter() - self._time_start,
            )
        )

    def exhausted(self) -> str | None:
        spent, limits = self.spent(), self.limits
        if limits.max_llm_calls is not None and spent.llm_calls >= limits.max_llm_calls:
            return f"max_llm_calls = {limits.max_llm_calls} reached ({spent.llm_calls} calls)"
        if limits.max_tokens is not None and spent.tokens >= limits.max_tokens:
            return f"max_tokens = {limits.max_tokens} reached ({spent.tokens} tokens)"
        if limits.max_wall_time_s is not None and spent.wall_time_s >= limits.max_wall_time_s:
            return (
                f"max_wall_time_s = {limits.max_wall_time_s:g} reached ({spent.wall_time_s:.0f} s)"
            )
        return None

    def check(self) -> None:
        reason = self.exhausted()
        if reason is not None:
            raise BudgetExhausted(reason)
