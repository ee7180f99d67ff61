"""Each LM call as an event for whoever observes them (MLflow traces, when on).

The role's usage callback (`evolve.llm.usage_callback`) reports every call here: the role,
the messages sent, the completions, tokens, start and end, whether it failed or came from
the response cache. Never the endpoint, its address or its key: an observer cannot leak what
it is never given. With no observer, nothing is built (one check per call).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LMCall:
    call_id: str  # DSPy's id of the call
    role: str
    messages: list[dict[str, Any]]
    completions: list[Any]
    prompt_tokens: int
    completion_tokens: int
    started_ns: int
    ended_ns: int
    cached: bool  # answered from the response cache: no request, no tokens
    error: str | None = None
    purpose: str | None = None  # e.g. "reflection" (see `purpose`)
    # The steps the call was made in, outermost first, e.g. ("session 0", "write") (`step`).
    steps: tuple[str, ...] = ()


# What the calls made in this context are for, when the caller says (`purpose`).
_PURPOSE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "evolve_lm_call_purpose", default=None
)


@contextlib.contextmanager
def purpose(name: str) -> Iterator[None]:
    """Label the LM calls made inside the block (e.g. "reflection": the reflector proposing
    an instruction), so an observer can file calls made outside any episode."""
    token = _PURPOSE.set(name)
    try:
        yield
    finally:
        _PURPOSE.reset(token)


def current_purpose() -> str | None:
    return _PURPOSE.get()


# The steps of an episode the calls made in this context belong to (`step`).
_STEPS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "evolve_lm_call_steps", default=()
)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Label the LM calls made inside the block with one more step ("session 0", "question
    3", "write"), so a trace can show each call inside the step that made it. Labels nest;
    the runner's worker threads copy their context, so a question's calls keep its label."""
    token = _STEPS.set((*_STEPS.get(), name))
    try:
        yield
    finally:
        _STEPS.reset(token)


def current_steps() -> tuple[str, ...]:
    return _STEPS.get()


Observer = Callable[[LMCall], None]
_observers: list[Observer] = []
_lock = threading.Lock()


def add_observer(observer: Observer) -> None:
    """Call `observer` with every LM call from now on (once, however often it is added)."""
    with _lock:
        if observer not in _observers:
            _observers.append(observer)


def remove_observer(observer: Observer) -> None:
    with _lock:
        if observer in _observers:
            _observers.remove(observer)


def observed() -> bool:
    return bool(_observers)


# Ids of the calls notified lately: an LM given two usage callbacks (role LMs built twice
# from the same LM objects) reports each call twice, observers hear of it once.
_recent: collections.OrderedDict[str, None] = collections.OrderedDict()
_RECENT_MAX = 4096


def notify(call: LMCall) -> None:
    with _lock:
        if call.call_id in _recent:
            return
        _recent[call.call_id] = None
        if len(_recent) > _RECENT_MAX:
            _recent.popitem(last=False)
    for observer in list(_observers):
        observer(call)


def sent_messages(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a DSPy LM call's inputs (`prompt` as one user message); only
    roles and contents, so nothing else the call carried can reach an observer."""
    messages = inputs.get("messages") or [{"role": "user", "content": inputs.get("prompt")}]
    return [
        {"role": str(m.get("role", "")), "content": m.get("content")}
        for m in messages
        if isinstance(m, dict)
    ]
