"""Per-role accounting of every LM call (tokens, latency, cache hits, failures) and of every
HTTP request sent for it (a call retried by its client is several requests)."""

from __future__ import annotations

import itertools
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

# Request ids unique across the processes that append to one journal: a random per-process
# prefix (pids are reused across reruns) and a counter.
_PROCESS_TAG = f"{os.getpid():x}{secrets.token_hex(3)}"
_request_numbers = itertools.count(1)


def new_request_id() -> str:
    return f"{_PROCESS_TAG}-{next(_request_numbers)}"  # count's next() is atomic under the GIL


class RoleUsage(BaseModel):
    calls: int = 0
    # HTTP requests sent to the endpoint, retries included: what the server counts and bills.
    # For an LM whose requests are not seen one by one (a scripted test LM; litellm under a
    # `client_session` of the user's own), each call that was not a cache hit counts as one.
    requests: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    # Of prompt_tokens, those the server reused from its prompt cache (llama-server, OpenAI:
    # usage.prompt_tokens_details.cached_tokens) instead of evaluating them again.
    prompt_tokens_cached: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def minus(self, other: RoleUsage) -> RoleUsage:
        return RoleUsage(
            **{name: getattr(self, name) - getattr(other, name) for name in RoleUsage.model_fields}
        )

    def plus(self, other: RoleUsage) -> RoleUsage:
        return RoleUsage(
            **{name: getattr(self, name) + getattr(other, name) for name in RoleUsage.model_fields}
        )


class UsageSummary(BaseModel):
    roles: dict[str, RoleUsage] = {}

    @property
    def total_calls(self) -> int:
        return sum(usage.calls for usage in self.roles.values())

    @property
    def total_tokens(self) -> int:
        return sum(usage.total_tokens for usage in self.roles.values())

    @property
    def cache_hits(self) -> int:
        return sum(usage.cache_hits for usage in self.roles.values())

    @property
    def total_requests(self) -> int:
        return sum(usage.requests for usage in self.roles.values())

    def minus(self, other: UsageSummary) -> UsageSummary:
        return UsageSummary(
            roles={
                role: usage.minus(other.roles.get(role, RoleUsage()))
                for role, usage in self.roles.items()
            }
        )

    def plus(self, other: UsageSummary) -> UsageSummary:
        roles = dict(self.roles)
        for role, usage in other.roles.items():
            roles[role] = roles.get(role, RoleUsage()).plus(usage)
        return UsageSummary(roles=roles)

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
        return metrics

    def table(self) -> str:
        # "cached": calls answered from DSPy's response cache; "reused": prompt tokens the
        # server took from its prompt cache rather than evaluating them.
        lines = [f"{'role':<10} {'calls':>6} {'cached':>6} {'failed':>6} {'prompt':>8} "
                 f"{'reused':>8} {'completion':>10} {'latency':>9}"]  # fmt: skip
        for role, usage in self.roles.items():
            lines.append(
                f"{role:<10} {usage.calls:>6} {usage.cache_hits:>6} {usage.failures:>6} "
                f"{usage.prompt_tokens:>8} {usage.prompt_tokens_cached:>8} "
                f"{usage.completion_tokens:>10} {usage.latency_s:>8.1f}s"
            )
        return "\n".join(lines)


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
    """Thread-safe counters, one `RoleUsage` per role, and listeners told of every call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[str, RoleUsage] = {}
        self._listeners: list[CallListener] = []

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
    ) -> None:
        """Record one finished LM call; `requests_recorded`: its HTTP requests were recorded
        one by one (`request_started` / `request_ended`), so the call adds none."""
        prompt = _as_int((usage or {}).get("prompt_tokens", (usage or {}).get("input_tokens")))
        completion = _as_int(
            (usage or {}).get("completion_tokens", (usage or {}).get("output_tokens"))
        )
        details = (usage or {}).get("prompt_tokens_details") or {}
        reused = _as_int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
        # DSPy reports empty usage exactly for responses served from its cache.
        cache_hit = not failed and not usage
        requests = 0 if requests_recorded or cache_hit else 1
        with self._lock:
            current = self._roles.setdefault(role, RoleUsage())
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
            listeners = self._listeners
        if listeners:
            call = CompletedCall(role, prompt, completion, cache_hit, failed, latency_s, requests)
            self._tell(listeners, call)

    def request_started(self, role: str) -> RequestEvent:
        """Count a request about to be sent; listeners (spend journals) record it first."""
        event = RequestEvent(role, new_request_id(), RequestState.STARTED)
        with self._lock:
            self._roles.setdefault(role, RoleUsage()).requests += 1
            listeners = self._listeners
        self._tell(listeners, event)
        return event

    def request_ended(self, started: RequestEvent, *, failed: bool, status: int | None) -> None:
        state = RequestState.FAILED if failed else RequestState.FINISHED
        with self._lock:
            listeners = self._listeners
        self._tell(listeners, RequestEvent(started.role, started.request_id, state, status))

    @staticmethod
    def _tell(listeners: list[CallListener], event: UsageEvent) -> None:
        for listener in listeners:
            listener(event)

    def snapshot(self) -> UsageSummary:
        with self._lock:
            return UsageSummary(
                roles={role: usage.model_copy() for role, usage in self._roles.items()}
            )


def _as_int(value: object) -> int:
    return value if isinstance(value, int) else 0
