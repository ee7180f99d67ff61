"""Spend, its durable journal and budget limits: shared by evolution and tuning.

A leaf module: it imports nothing from evolve's packages at run time, so both engines can
depend on it without depending on each other (no optimize <-> tuning import cycle).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.llm.usage import UsageEvent


class Spend(BaseModel):
    # Requests sent to the endpoints, retries included (what a server counts and bills);
    # responses served from DSPy's cache cost nothing.
    llm_calls: int = 0
    tokens: int = 0
    wall_time_s: float = 0.0
    # Of `llm_calls`, those journaled as started with no outcome after: in flight when the
    # process was killed (or still in flight now). Counted as spent: the server may have
    # received and billed them.
    unknown_outcome: int = 0

    def plus(self, other: Spend) -> Spend:
        return Spend(
            llm_calls=self.llm_calls + other.llm_calls,
            tokens=self.tokens + other.tokens,
            wall_time_s=self.wall_time_s + other.wall_time_s,
            unknown_outcome=self.unknown_outcome + other.unknown_outcome,
        )

    def describe(self) -> str:
        """One line for reports: calls (and those whose outcome is unknown), tokens."""
        unknown = (
            f" ({self.unknown_outcome} started, outcome unknown: in flight at a kill)"
            if self.unknown_outcome
            else ""
        )
        return f"{self.llm_calls} LLM calls{unknown}, {self.tokens} tokens"


class BudgetExhausted(Exception):
    """Raised inside an engine when a budget limit is reached; the engine stops cleanly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Budget:
    """Spend so far (earlier invocations + this one) against the spec's limits.

    With a `journal`, every request of every role is also appended to it as started before it
    is sent and as finished or failed after (and every completed call with its tokens), so a
    killed process leaves at worst requests of unknown outcome, counted as spent.
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

    def _journal_call(self, event: UsageEvent) -> None:
        assert self.journal is not None
        self.journal.record(
            event, wall_time_s=self.before.wall_time_s + time.perf_counter() - self._time_start
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
                # Requests as they start (retries included); cache hits send none.
                llm_calls=delta.total_requests,
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


class SpendJournal:
    """Append-only JSON lines: HTTP requests, completed LLM calls and wall-time marks.

    Line kinds:

    - ``{"carried": {Spend}}``: spend recorded before the journal existed;
    - ``{"request": ID, "role", "state": "started", "wall_s"}``: written (flushed) before the
      request is sent; then ``{"request": ID, "state": "finished" | "failed", "status",
      "wall_s"}`` once it ends. Every started request counts as a call; one with no end line
      (the process was killed while it was in flight) is reported as of unknown outcome;
    - ``{"role", "prompt", "completion", "cache_hit", "failed", "requests", "wall_s"}``: a
      completed LLM call, for its tokens; `requests` is the number of requests it stands for
      (0 when they have their own lines; absent in older journals: 1 unless a cache hit);
    - ``{"wall_s"}``: a checkpoint.

    `wall_s` is the run's total wall time when the line was written, so the latest one is the
    wall time spent. A line torn by a crash is skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def open(self, carried: Spend | None = None) -> SpendJournal:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        if not new and self.path.stat().st_size and not self._ends_with_newline():
            self._file.write("\n")  # after a torn last line, start a fresh one
        if new and carried is not None and carried != Spend():
            self._write({"carried": carried.model_dump(mode="json")})
        self.sync()
        return self

    def record_call(
        self,
        *,
        role: str,
        prompt_tokens: int,
        completion_tokens: int,
        cache_hit: bool,
        failed: bool,
        wall_time_s: float,
    ) -> None:
        self._write(
            {
                "role": role,
                "prompt": prompt_tokens,
                "completion": completion_tokens,
                "cache_hit": cache_hit,
                "failed": failed,
                "wall_s": round(wall_time_s, 3),
            }
        )

    def record(self, event: UsageEvent, *, wall_time_s: float) -> None:
        """Journal a usage tracker event (see `evolve.llm.usage.UsageTracker.add_listener`)."""
        wall = round(wall_time_s, 3)
        request_id = getattr(event, "request_id", None)  # duck-typed: this module stays a leaf
        if request_id is None:
            self._write(
                {
                    "role": event.role,
                    "prompt": event.prompt_tokens,
                    "completion": event.completion_tokens,
                    "cache_hit": event.cache_hit,
                    "failed": event.failed,
                    "requests": event.requests,
                    "wall_s": wall,
                }
            )
        elif event.state == "started":
            self._write(
                {"request": request_id, "role": event.role, "state": "started", "wall_s": wall}
            )
        else:
            self._write(
                {
                    "request": request_id,
                    "state": str(event.state.value),
                    "status": event.status,
                    "wall_s": wall,
                }
            )

    def mark_wall_time(self, wall_time_s: float) -> None:
        self._write({"wall_s": round(wall_time_s, 3)})

    def sync(self) -> None:
        """Make the lines written so far survive an OS crash too (one fsync per unit)."""
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
                self._file = None

    def _write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file is None:
                return  # closed: the run is over and its ledger written
            # One write + flush per line: a killed process loses at most the call in flight.
            self._file.write(line)
            self._file.flush()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"

    def total(self) -> Spend:
        """The spend the journal records: every request started (failed ones and those of
        unknown outcome included), calls of older journals without request lines (cache hits
        cost nothing), the tokens of completed calls."""
        calls = tokens = 0
        carried = Spend()
        wall = 0.0
        open_requests: set[str] = set()
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # torn by a crash mid-write
                if not isinstance(entry, dict):
                    continue
                if "carried" in entry:
                    carried = carried.plus(Spend.model_validate(entry["carried"]))
                    continue
                wall = max(wall, float(entry.get("wall_s", 0.0)))
                if "request" in entry:
                    if entry.get("state") == "started":
                        calls += 1
                        open_requests.add(str(entry["request"]))
                    else:
                        open_requests.discard(str(entry["request"]))
                elif "role" in entry:
                    default = 0 if entry.get("cache_hit") else 1
                    calls += int(entry.get("requests", default))
                    tokens += int(entry.get("prompt", 0)) + int(entry.get("completion", 0))
        return Spend(
            llm_calls=carried.llm_calls + calls,
            tokens=carried.tokens + tokens,
            wall_time_s=max(wall, carried.wall_time_s),
            unknown_outcome=carried.unknown_outcome + len(open_requests),
        )
