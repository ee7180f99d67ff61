"""Per-role accounting of every LM call (tokens, latency, cache hits, failures) and of every
HTTP request sent for it (a call retried by its client is several requests)."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, model_validator

# Request ids unique across the processes that append to one journal: a random per-process
# prefix (pids are reused across reruns) and a counter.
_PROCESS_TAG = f"{os.getpid():x}{secrets.token_hex(3)}"
_request_numbers = itertools.count(1)


def new_request_id() -> str:
    return f"{_PROCESS_TAG}-{next(_request_numbers)}"  # count's next() is atomic under the GIL


class Usage(BaseModel):
    """LLM work and what it cost: the one usage record, for a role, a unit of an episode, a
    synthesis stage or a whole run (a breakdown is a mapping name -> `Usage`). Add with `+`.

    A producer fills the counts it can see and leaves the others at 0: DSPy's per-thread usage
    tracker (episode units, synthesis stages) sees no cache hits and no HTTP requests, a spend
    journal sees requests and tokens but no latency.
    """

    # LM calls (one `lm(...)` each), cache hits and failed calls included. Where cache hits
    # are invisible to the producer (DSPy's usage tracker), the calls the server answered.
    calls: int = 0
    # Of `calls`, those answered from DSPy's response cache: they cost nothing.
    cache_hits: int = 0
    # Of `calls`, those that raised (an error status, a timeout, a broken connection).
    failures: int = 0
    # Replies that did not parse, and replies that parsed but the caller's check rejected.
    parse_failures: int = 0
    rejected: int = 0
    # HTTP requests sent to the endpoint, retries included: what the server counts and bills
    # (and what a budget's `max_llm_calls` limits). For an LM whose requests are not seen one
    # by one (a scripted test LM; litellm under a `client_session` of the user's own), each
    # call that was not a cache hit counts as one.
    requests: int = 0
    # Of `requests`, those journaled as started with no outcome after: in flight when the
    # process was killed (or still in flight now). Counted as spent: the server may have
    # received and billed them.
    unknown_outcome: int = 0
    prompt_tokens: int = 0
    # Of prompt_tokens, those the server reused from its prompt cache (llama-server, OpenAI:
    # usage.prompt_tokens_details.cached_tokens) instead of evaluating them again.
    prompt_tokens_cached: int = 0
    completion_tokens: int = 0
    # Seconds the server spent evaluating prompts and decoding completions, as it reports
    # them (llama-server's `timings`); 0 from endpoints that report none. Summed over slots.
    prompt_eval_s: float = 0.0
    decode_s: float = 0.0
    # Summed duration of the calls (concurrent calls overlap) ...
    latency_s: float = 0.0
    # ... and the elapsed time of the run that made them (summed over its invocations).
    wall_time_s: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _stored_shapes(cls, data: Any) -> Any:
        """Records stored before there was one usage type load silently (users cannot edit a
        run folder): an episode unit's `llm_calls`, a synthesis stage's `billed_calls`, a
        spend ledger's `llm_calls` (requests) and `tokens` (a total without its split: counted
        as prompt tokens; every reader of a spend uses the total)."""
        if not isinstance(data, Mapping) or not _STORED_KEYS.intersection(data):
            return data
        moved = dict(data)
        spend_shape = "tokens" in moved
        if "llm_calls" in moved:
            moved.setdefault("requests" if spend_shape else "calls", moved.pop("llm_calls"))
        if spend_shape:
            moved.setdefault("prompt_tokens", moved.pop("tokens"))
        if "billed_calls" in moved:
            billed = moved.pop("billed_calls")
            moved.setdefault("cache_hits", max(int(moved.get("calls", 0)) - int(billed), 0))
        return moved

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def plus(self, other: Usage) -> Usage:
        return Usage(
            **{name: getattr(self, name) + getattr(other, name) for name in Usage.model_fields}
        )

    def minus(self, other: Usage) -> Usage:
        return Usage(
            **{name: getattr(self, name) - getattr(other, name) for name in Usage.model_fields}
        )

    __add__ = plus
    __sub__ = minus

    def describe(self) -> str:
        """One line for reports of spend: requests (and those whose outcome is unknown),
        tokens."""
        unknown = (
            f" ({self.unknown_outcome} started, outcome unknown: in flight at a kill)"
            if self.unknown_outcome
            else ""
        )
        return f"{self.requests} LLM calls{unknown}, {self.tokens} tokens"


_STORED_KEYS = frozenset({"llm_calls", "tokens", "billed_calls"})


def response_usage(usage: Mapping[str, object] | None) -> Usage:
    """The tokens of one LM response, from the usage DSPy reports for it (OpenAI's names or
    Anthropic's); no call is counted."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=_as_int(usage.get("prompt_tokens", usage.get("input_tokens"))),
        prompt_tokens_cached=(
            _as_int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
        ),
        completion_tokens=_as_int(usage.get("completion_tokens", usage.get("output_tokens"))),
    )


def server_seconds(response: object) -> tuple[float, float]:
    """Prompt-evaluation and decoding seconds a response reports: llama-server's `timings`
    (`prompt_ms`, `predicted_ms`); (0, 0) for a server that reports none."""
    timings = response.get("timings") if isinstance(response, Mapping) else None
    if not isinstance(timings, Mapping):
        return 0.0, 0.0
    return _as_ms(timings.get("prompt_ms")) / 1000, _as_ms(timings.get("predicted_ms")) / 1000


def tracked_usage(tracker: Any) -> Usage:
    """The LM calls a `dspy.track_usage()` block saw, in the calling thread (so per user and
    unit even when they run concurrently). DSPy's tracker sees only the calls the server
    answered: `calls` counts those, and `cache_hits` stays 0. The tokens a server reused from
    its prompt cache are left out: they depend on how calls were scheduled, and a unit's record
    must be the same at any concurrency (the per-role tracker has them)."""
    entries = [entry for found in tracker.usage_data.values() for entry in found]
    total = sum((response_usage(entry) for entry in entries), Usage(calls=len(entries)))
    return total.model_copy(update={"prompt_tokens_cached": 0})


def add_usage(target: dict[str, Usage], source: Mapping[str, Usage]) -> None:
    """Add a breakdown (name -> `Usage`) into another, in place."""
    for name, usage in source.items():
        target[name] = target.get(name, Usage()) + usage


# Printed under every usage table: what each column counts, in which unit.
USAGE_LEGEND = (
    "calls: LM calls made; cached: of them, answered from the response cache (free); sent: "
    "HTTP requests sent, retries included (what `spent` counts); failed: calls that raised",
    "tokens: evaluated = prompt tokens the server computed, reused = prompt tokens it took "
    "from its prompt cache, decoded = completion tokens",
    "slot time: the calls' summed durations; concurrent calls overlap, so it can exceed the "
    "wall time by up to the number of slots; prompt s / decode s: of the server's time, "
    "evaluating prompts and decoding, as it reports them (llama-server; 0 where not reported)",
)


class UsageSummary(BaseModel):
    """Usage per role (role -> `Usage`)."""

    roles: dict[str, Usage] = {}
    # Seconds since the tracker began, and of them those with at least one HTTP request in
    # flight: the rest is the toolkit's own time (or idle), nothing for the server to do.
    elapsed_s: float = 0.0
    endpoint_busy_s: float = 0.0

    def total(self) -> Usage:
        return sum(self.roles.values(), Usage())

    @property
    def total_calls(self) -> int:
        return sum(usage.calls for usage in self.roles.values())

    @property
    def total_tokens(self) -> int:
        return sum(usage.tokens for usage in self.roles.values())

    @property
    def cache_hits(self) -> int:
        return sum(usage.cache_hits for usage in self.roles.values())

    @property
    def total_requests(self) -> int:
        return sum(usage.requests for usage in self.roles.values())

    def minus(self, other: UsageSummary) -> UsageSummary:
        return UsageSummary(
            roles={
                role: usage.minus(other.roles.get(role, Usage()))
                for role, usage in self.roles.items()
            },
            elapsed_s=self.elapsed_s - other.elapsed_s,
            endpoint_busy_s=self.endpoint_busy_s - other.endpoint_busy_s,
        )

    def plus(self, other: UsageSummary) -> UsageSummary:
        roles = dict(self.roles)
        add_usage(roles, other.roles)
        return UsageSummary(
            roles=roles,
            elapsed_s=self.elapsed_s + other.elapsed_s,
            endpoint_busy_s=self.endpoint_busy_s + other.endpoint_busy_s,
        )

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat name -> number mapping for MLflow and tables."""
        metrics: dict[str, float] = {
            f"{prefix}llm_calls": self.total_calls,
            f"{prefix}tokens": self.total_tokens,
            f"{prefix}cache_hits": self.cache_hits,
            f"{prefix}requests": self.total_requests,
        }
        for role, usage in self.roles.items():
            metrics[f"{prefix}{role}_calls"] = usage.calls
            metrics[f"{prefix}{role}_prompt_tokens"] = usage.prompt_tokens
            metrics[f"{prefix}{role}_prompt_tokens_cached"] = usage.prompt_tokens_cached
            metrics[f"{prefix}{role}_completion_tokens"] = usage.completion_tokens
            metrics[f"{prefix}{role}_latency_s"] = round(usage.latency_s, 3)
            metrics[f"{prefix}{role}_prompt_eval_s"] = round(usage.prompt_eval_s, 3)
            metrics[f"{prefix}{role}_decode_s"] = round(usage.decode_s, 3)
        share = self.toolkit_share()
        if share is not None:
            metrics[f"{prefix}toolkit_share"] = round(share, 4)
        return metrics

    def toolkit_share(self) -> float | None:
        """Share of the elapsed time with no request in flight: the toolkit's own work (None
        when no request was seen in flight: every call was cached, or the LM's requests are
        not observed one by one, as a scripted LM's)."""
        if self.endpoint_busy_s <= 0 or self.elapsed_s <= 0:
            return None
        return max(0.0, 1.0 - self.endpoint_busy_s / self.elapsed_s)

    def bill(self) -> str:
        """One line: the server's prompt-evaluation and decoding seconds (summed over its
        slots) and the share of the elapsed time that was the toolkit's own."""
        total = self.total()
        share = self.toolkit_share()
        server = (
            f"server time {total.prompt_eval_s:.0f} s evaluating prompts, "
            f"{total.decode_s:.0f} s decoding (summed over slots)"
            if total.prompt_eval_s or total.decode_s
            else "server time not reported by the endpoint"
        )
        toolkit = (
            f"; no request in flight for {share:.0%} of {self.elapsed_s:.0f} s "
            "(the toolkit's own share)"
            if share is not None
            else ""
        )
        return f"bill: {server}{toolkit}"

    def table(self) -> str:
        """Per role: calls (cached ones included), cache hits, requests sent, failures,
        prompt tokens evaluated and reused, completion tokens, and slot time; then the
        legend (`USAGE_LEGEND`)."""
        lines = [f"{'role':<10} {'calls':>6} {'cached':>6} {'sent':>6} {'failed':>6} "
                 f"{'evaluated':>9} {'reused':>8} {'decoded':>8} {'slot time':>10} "
                 f"{'prompt s':>9} {'decode s':>9}"]  # fmt: skip
        for role, usage in self.roles.items():
            lines.append(
                f"{role:<10} {usage.calls:>6} {usage.cache_hits:>6} {usage.requests:>6} "
                f"{usage.failures:>6} {usage.prompt_tokens - usage.prompt_tokens_cached:>9} "
                f"{usage.prompt_tokens_cached:>8} {usage.completion_tokens:>8} "
                f"{usage.latency_s:>9.1f}s {usage.prompt_eval_s:>8.1f}s {usage.decode_s:>8.1f}s"
            )
        return "\n".join([*lines, *USAGE_LEGEND])

    def per_question(self, questions: int) -> str | None:
        """Tokens per scored question over every role (None without questions)."""
        if questions <= 0:
            return None
        prompt = sum(u.prompt_tokens for u in self.roles.values())
        reused = sum(u.prompt_tokens_cached for u in self.roles.values())
        decoded = sum(u.completion_tokens for u in self.roles.values())
        calls = sum(u.calls for u in self.roles.values())
        return (
            f"per scored question ({questions}): {calls / questions:.1f} calls, "
            f"{(prompt - reused) / questions:.0f} prompt tokens evaluated, "
            f"{reused / questions:.0f} reused ({reused / prompt if prompt else 0:.0%}), "
            f"{decoded / questions:.0f} decoded"
        )


@dataclass(frozen=True)
class CompletedCall:
    """One finished LM call, as passed to the tracker's listeners (e.g. a spend journal)."""

    role: str
    prompt_tokens: int
    completion_tokens: int
    cache_hit: bool
    failed: bool
    latency_s: float
    # HTTP requests this record stands for: 0 when its requests are recorded one by one as
    # `RequestEvent`s (or it was a cache hit), else 1.
    requests: int = 1
    # The server's seconds for it, as it reports them (`server_seconds`).
    prompt_eval_s: float = 0.0
    decode_s: float = 0.0


class RequestState(StrEnum):
    STARTED = "started"  # about to be sent; without a later event its outcome is unknown
    FINISHED = "finished"  # the server answered with a success status
    FAILED = "failed"  # an error status, a timeout or a broken connection


@dataclass(frozen=True)
class RequestEvent:
    """One HTTP request to an endpoint: `STARTED` before it is sent, then `FINISHED` or
    `FAILED` (same `request_id`), as passed to the tracker's listeners."""

    role: str
    request_id: str
    state: RequestState
    status: int | None = None


UsageEvent = CompletedCall | RequestEvent
CallListener = Callable[[UsageEvent], None]


class UsageTracker:
    """Thread-safe counters, one `Usage` per role, and listeners told of every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[str, Usage] = {}
        self._listeners: list[CallListener] = []
        # Time with requests in flight: their count, since when it was above 0, and the sum
        # of the closed stretches.
        self._started = time.perf_counter()
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy_s = 0.0

    def add_listener(self, listener: CallListener) -> None:
        """Call `listener` with each event, in the calling thread: a `RequestEvent` before a
        request is sent and after it ends, a `CompletedCall` after each LM call."""
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove_listener(self, listener: CallListener) -> None:
        with self._lock:
            self._listeners = [known for known in self._listeners if known != listener]

    def record(
        self,
        role: str,
        usage: Mapping[str, object] | None,
        latency_s: float,
        *,
        failed: bool = False,
        requests_recorded: bool = False,
        server_s: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        """Record one finished LM call; `requests_recorded`: its HTTP requests were recorded
        one by one (`request_started` / `request_ended`), so the call adds none; `server_s`:
        the server's prompt-evaluation and decoding seconds for it (`server_seconds`)."""
        tokens = response_usage(usage)
        prompt_eval_s, decode_s = server_s if usage else (0.0, 0.0)  # a cache hit cost none
        prompt, completion = tokens.prompt_tokens, tokens.completion_tokens
        reused = tokens.prompt_tokens_cached
        # DSPy reports empty usage exactly for responses served from its cache.
        cache_hit = not failed and not usage
        requests = 0 if requests_recorded or cache_hit else 1
        with self._lock:
            current = self._roles.setdefault(role, Usage())
            current.calls += 1
            current.requests += requests
            current.latency_s += latency_s
            if failed:
                current.failures += 1
            elif cache_hit:
                current.cache_hits += 1
            current.prompt_tokens += prompt
            current.prompt_tokens_cached += reused
            current.completion_tokens += completion
            current.prompt_eval_s += prompt_eval_s
            current.decode_s += decode_s
            listeners = self._listeners
        if listeners:
            call = CompletedCall(
                role,
                prompt,
                completion,
                cache_hit,
                failed,
                latency_s,
                requests,
                prompt_eval_s=prompt_eval_s,
                decode_s=decode_s,
            )
            self._tell(listeners, call)

    def request_started(self, role: str) -> RequestEvent:
        """Count a request about to be sent; listeners (spend journals) record it first."""
        event = RequestEvent(role, new_request_id(), RequestState.STARTED)
        with self._lock:
            self._roles.setdefault(role, Usage()).requests += 1
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
            listeners = self._listeners
        self._tell(listeners, event)
        return event

    def request_ended(self, started: RequestEvent, *, failed: bool, status: int | None) -> None:
        state = RequestState.FAILED if failed else RequestState.FINISHED
        with self._lock:
            self._in_flight = max(0, self._in_flight - 1)
            if self._in_flight == 0:
                self._busy_s += time.perf_counter() - self._busy_since
            listeners = self._listeners
        self._tell(listeners, RequestEvent(started.role, started.request_id, state, status))

    @staticmethod
    def _tell(listeners: list[CallListener], event: UsageEvent) -> None:
        for listener in listeners:
            listener(event)

    def snapshot(self) -> UsageSummary:
        with self._lock:
            now = time.perf_counter()
            busy = self._busy_s + (now - self._busy_since if self._in_flight else 0.0)
            return UsageSummary(
                roles={role: usage.model_copy() for role, usage in self._roles.items()},
                elapsed_s=now - self._started,
                endpoint_busy_s=busy,
            )


def _as_ms(value: object) -> float:
    return float(value) if isinstance(value, int | float) and value > 0 else 0.0


def _as_int(value: object) -> int:
    # Floats too: some servers report token counts as JSON numbers with a fraction part.
    return int(value) if isinstance(value, int | float) else 0
