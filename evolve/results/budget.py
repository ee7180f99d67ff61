"""Spend (a `Usage`), its durable journal, the one listener that journals it, and budget
limits: shared by evolution and tuning.

A leaf of the engines: at run time it imports only `evolve.llm.usage` (the lowest package), so
both engines can depend on it without depending on each other (no optimize <-> tuning import
cycle).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from evolve.core.files import unused_path, warn_damaged
from evolve.llm.usage import Usage

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.llm.usage import UsageEvent, UsageTracker


class BudgetExhausted(Exception):
    """Raised inside an engine when a budget limit is reached; the engine stops cleanly."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Budget:
    """Spend so far (earlier invocations + this one) against the spec's limits.

    With a `journal`, a `SpendListener` appends every request of every role to it as started
    before it is sent and as finished or failed after (and every completed call with its
    tokens), so a killed process leaves at worst requests of unknown outcome, counted as spent.
    Call `close()` when the run ends.
    """

    def __init__(
        self, limits: Any, lms: RoleLMs, before: Usage, journal: SpendJournal | None = None
    ) -> None:
        self.limits = limits
        self.lms = lms
        self.before = before
        self.journal = journal
        self._usage_start = lms.usage.snapshot()
        self._time_start = time.perf_counter()
        self._listener = (
            SpendListener(lms.usage, journal, wall_before=before.wall_time_s)
            if journal is not None
            else None
        )

    def close(self) -> None:
        """Stop journaling (the journal is closed; the tracker keeps counting)."""
        if self._listener is not None:
            self._listener.close()

    def spent(self) -> Usage:
        delta = self.lms.usage.snapshot().minus(self._usage_start).total()
        return self.before + spend_of(delta, wall_time_s=time.perf_counter() - self._time_start)

    def exhausted(self) -> str | None:
        spent, limits = self.spent(), self.limits
        if limits.max_llm_calls is not None and spent.requests >= limits.max_llm_calls:
            return f"max_llm_calls = {limits.max_llm_calls} reached ({spent.requests} calls)"
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

    - ``{"carried": {Usage}}``: spend recorded before the journal existed;
    - ``{"request": ID, "role", "state": "started", "wall_s"}``: written (flushed) before the
      request is sent; then ``{"request": ID, "state": "finished" | "failed", "status",
      "wall_s"}`` once it ends. Every started request counts as a call; one with no end line
      (the process was killed while it was in flight) is reported as of unknown outcome;
    - ``{"role", "prompt", "completion", "cache_hit", "failed", "requests", "wall_s"}``: a
      completed LLM call, for its tokens; `requests` is the number of requests it stands for
      (0 when they have their own lines; absent in older journals: 1 unless a cache hit);
      `prompt_s` and `decode_s` when the server reported its seconds for the call;
    - ``{"wall_s"}``: a checkpoint.

    `wall_s` is the run's total wall time when the line was written, so the latest one is the
    wall time spent. A line torn by a crash is skipped.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.unreadable_lines = 0  # by the last `total()`; a torn last line is not counted
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def open(self, carried: Usage | None = None) -> SpendJournal:
        new = not self.path.exists()
        if not new:
            self._cut_torn_line()
            spent = self.total()
            if self.unreadable_lines:
                # Set the damaged journal aside; the new one starts from what it could read.
                aside = unused_path(self.path.with_name(f"{self.path.name}.damaged"))
                os.replace(self.path, aside)
                warn_damaged(
                    self.path,
                    f"{self.unreadable_lines} line(s) cannot be read",
                    "the spend it records is short by what they held; continuing from the rest "
                    f"(the damaged journal is kept as {aside.name})",
                )
                new, carried = True, spent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        if new and carried is not None and carried != Usage():
            self._write({"carried": spend_json(carried)})
        self.sync()
        return self

    def _cut_torn_line(self) -> None:
        """Drop a last line torn by a crash mid-write (it was never counted), so that the
        journal goes on from a whole line and no torn line is ever inside it."""
        with open(self.path, "rb+") as handle:
            data = handle.read()
            if data and not data.endswith(b"\n"):
                handle.truncate(data.rfind(b"\n") + 1)

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
            entry = {
                "role": event.role,
                "prompt": event.prompt_tokens,
                "completion": event.completion_tokens,
                "cache_hit": event.cache_hit,
                "failed": event.failed,
                "requests": event.requests,
                "wall_s": wall,
            }
            if event.prompt_eval_s or event.decode_s:
                entry["prompt_s"] = round(event.prompt_eval_s, 4)
                entry["decode_s"] = round(event.decode_s, 4)
            self._write(entry)
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
            try:
                self._file.write(line)
                self._file.flush()
            except OSError as error:  # a full disk: say which file
                error.filename = error.filename or str(self.path)
                raise

    def total(self) -> Usage:
        """The spend the journal records: every request started (failed ones and those of
        unknown outcome included), calls of older journals without request lines (cache hits
        cost nothing), the tokens of completed calls."""
        requests = prompt = completion = 0
        prompt_eval_s = decode_s = 0.0
        carried = Usage()
        wall = 0.0
        open_requests: set[str] = set()
        self.unreadable_lines = 0
        with open(self.path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().split("\n")
        # The last piece is "" after a final newline; anything else there is a line torn
        # by a crash mid-write, expected and skipped. Any other line that cannot be read
        # is damage, counted.
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                if not isinstance(entry, dict):
                    raise TypeError(type(entry).__name__)
                if "carried" in entry:
                    carried = carried + Usage.model_validate(entry["carried"])
                    continue
                wall = max(wall, float(entry.get("wall_s", 0.0)))
                if "request" in entry:
                    if entry.get("state") == "started":
                        requests += 1
                        open_requests.add(str(entry["request"]))
                    else:
                        open_requests.discard(str(entry["request"]))
                elif "role" in entry:
                    default = 0 if entry.get("cache_hit") else 1
                    requests += int(entry.get("requests", default))
                    prompt += int(entry.get("prompt", 0))
                    completion += int(entry.get("completion", 0))
                    prompt_eval_s += float(entry.get("prompt_s", 0.0))
                    decode_s += float(entry.get("decode_s", 0.0))
            except (ValueError, TypeError, AttributeError):  # ValidationError is a ValueError
                if number < len(lines) - 1:
                    self.unreadable_lines += 1
        return Usage(
            requests=carried.requests + requests,
            prompt_tokens=carried.prompt_tokens + prompt,
            completion_tokens=carried.completion_tokens + completion,
            prompt_eval_s=carried.prompt_eval_s + prompt_eval_s,
            decode_s=carried.decode_s + decode_s,
            wall_time_s=max(wall, carried.wall_time_s),
            unknown_outcome=carried.unknown_outcome + len(open_requests),
        )


def spend_json(spend: Usage) -> dict[str, Any]:
    """A spend as stored (`ledger.json`, a journal's carried line): the fields of `Usage`, plus
    the two an older reader knows it by (`llm_calls` = requests, `tokens`); `Usage` reads
    either."""
    return {**spend.model_dump(mode="json"), "llm_calls": spend.requests, "tokens": spend.tokens}


def spend_of(usage: Usage, *, wall_time_s: float) -> Usage:
    """The part of `usage` a budget counts (requests, retries included: cache hits send none;
    tokens), with the wall time given."""
    return Usage(
        requests=usage.requests,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        prompt_eval_s=usage.prompt_eval_s,
        decode_s=usage.decode_s,
        wall_time_s=wall_time_s,
    )


class SpendListener:
    """The one usage listener that journals spend (`UsageTracker.add_listener`): each request
    as started before it is sent and as finished or failed after, each completed call with its
    tokens. Durability comes from the order: the tracker tells its listeners before a request
    is sent, and `SpendJournal` writes and flushes each line before `record` returns.

    Events go to `journal` (an open journal, or a function that opens one on the first event,
    so that no empty file is left), unless a `redirect` block sends them to another journal
    (a tuning trial's own file). A request's end goes to the journal that holds its start, even
    if the block ended meanwhile (then that file is closed and the outcome stays unknown).

    `wall_s` of a line is `wall_before` + seconds since the listener was attached (since the
    block began, for a redirect). `close()` detaches it and closes `journal`: requests ending
    afterwards stay of unknown outcome.
    """

    def __init__(
        self,
        usage: UsageTracker,
        journal: SpendJournal | Callable[[], SpendJournal],
        *,
        wall_before: float = 0.0,
    ) -> None:
        self.usage = usage
        self._lock = threading.Lock()
        # A journal's wall clock: wall_s = time.perf_counter() - origin.
        self._origin = time.perf_counter() - wall_before
        self._opener = None if isinstance(journal, SpendJournal) else journal
        self.journal: SpendJournal | None = journal if isinstance(journal, SpendJournal) else None
        self._redirected: tuple[SpendJournal, float] | None = None
        self._open_requests: dict[str, tuple[SpendJournal, float]] = {}
        self._closed = False
        # One bound-method object: the tracker removes a listener by identity.
        self._listener = self._record
        usage.add_listener(self._listener)

    def wall_time_s(self) -> float:
        """`wall_before` + seconds since the listener was attached."""
        return time.perf_counter() - self._origin

    @contextmanager
    def redirect(self, journal: SpendJournal) -> Iterator[None]:
        """Journal the events inside the block to `journal` (its wall clock starts now)."""
        with self._lock:
            self._redirected = (journal, time.perf_counter())
        try:
            yield
        finally:
            with self._lock:
                self._redirected = None

    def close(self, *, mark_wall_time: bool = False) -> None:
        """Detach from the tracker and close the journal (after a last wall-time line when
        `mark_wall_time`)."""
        self.usage.remove_listener(self._listener)
        with self._lock:
            self._closed = True
            journal, self.journal = self.journal, None
        if journal is not None:
            if mark_wall_time:
                journal.mark_wall_time(self.wall_time_s())
            journal.close()

    def _record(self, event: UsageEvent) -> None:
        request_id = getattr(event, "request_id", None)  # duck-typed: usage stays type-only
        with self._lock:
            if self._closed:
                return
            if request_id is not None and request_id in self._open_requests:
                journal, origin = self._open_requests.pop(request_id)
            elif self._redirected is not None:
                journal, origin = self._redirected
            else:
                if self.journal is None:
                    assert self._opener is not None
                    self.journal = self._opener()
                journal, origin = self.journal, self._origin
            if request_id is not None and getattr(event, "state", None) == "started":
                self._open_requests[request_id] = (journal, origin)
        journal.record(event, wall_time_s=time.perf_counter() - origin)
