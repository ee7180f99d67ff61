"""The DSPy callback that feeds a `UsageTracker`: each LM call's latency, usage and failure,
and, for a transport shared by every role, who is calling (`evolve.llm.attempts.CALLER`)."""

from __future__ import annotations

import threading
import time
from contextlib import suppress
from contextvars import Token
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from evolve.llm import call_events
from evolve.llm.attempts import CALLER
from evolve.llm.usage import UsageTracker, server_seconds


class UsageCallback(BaseCallback):
    """Times each LM call and records its usage (read from the history entry DSPy writes)."""

    def __init__(self, role: str, tracker: UsageTracker, *, requests_recorded: bool = False):
        self.role = role
        self.tracker = tracker
        # Its HTTP requests are recorded one by one (its own transport, or litellm's session).
        self.requests_recorded = requests_recorded
        self._local = threading.local()

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        # The caller, for a transport shared by every role (litellm's session): this thread
        # makes the call's requests (DSPy retries in the calling thread).
        token = CALLER.set((self.role, self.tracker))
        self._starts()[call_id] = (time.perf_counter(), token)
        self._local.usage = None
        self._local.server_s = (0.0, 0.0)
        if call_events.observed():  # e.g. traces are on: the call becomes a span
            self._sent()[call_id] = (time.time_ns(), call_events.sent_messages(inputs))

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        started, token = self._starts().pop(call_id, (None, None))
        if token is not None:
            with suppress(ValueError):  # set in another context: nothing of ours to undo
                CALLER.reset(token)
        latency = time.perf_counter() - started if started is not None else 0.0
        usage = getattr(self._local, "usage", None)
        self.tracker.record(
            self.role,
            usage,
            latency,
            failed=exception is not None,
            requests_recorded=self.requests_recorded,
            server_s=getattr(self._local, "server_s", (0.0, 0.0)),
        )
        sent = self._sent().pop(call_id, None)
        if sent is not None:
            call_events.notify(
                call_events.LMCall(
                    call_id=call_id,
                    role=self.role,
                    messages=sent[1],
                    completions=list(outputs) if isinstance(outputs, list) else [outputs],
                    prompt_tokens=int((usage or {}).get("prompt_tokens") or 0),
                    completion_tokens=int((usage or {}).get("completion_tokens") or 0),
                    started_ns=sent[0],
                    ended_ns=time.time_ns(),
                    cached=not usage,  # a cached response reports no usage
                    error=None if exception is None else type(exception).__name__,
                    purpose=call_events.current_purpose(),
                    steps=call_events.current_steps(),
                )
            )

    def note_history_entry(self, entry: dict[str, Any]) -> None:
        self._local.usage = dict(entry.get("usage") or {})
        self._local.server_s = server_seconds(entry.get("response"))

    def _sent(self) -> dict[str, tuple[int, list[dict[str, Any]]]]:
        if not hasattr(self._local, "sent"):
            self._local.sent = {}
        return self._local.sent

    def _starts(self) -> dict[str, tuple[float, Token[Any]]]:
        if not hasattr(self._local, "starts"):
            self._local.starts = {}
        return self._local.starts


def track_usage(
    lm: dspy.BaseLM, role: str, tracker: UsageTracker, *, requests_recorded: bool
) -> dspy.BaseLM:
    """Add a `UsageCallback` to `lm` (and read its usage from the history entries DSPy
    writes); `requests_recorded`: its HTTP requests are recorded one by one elsewhere."""
    callback = UsageCallback(role, tracker, requests_recorded=requests_recorded)
    lm.callbacks = [*(getattr(lm, "callbacks", None) or []), callback]
    record_history = lm.update_history

    def update_history(entry: dict[str, Any]) -> None:
        callback.note_history_entry(entry)
        record_history(entry)

    lm.update_history = update_history  # type: ignore[method-assign]
    return lm


class _PredictorLabel(BaseCallback):
    """Labels the LM calls a policy's predictor makes with the predictor's name ("write",
    "use"), as one more `call_events.step`: a trace then shows each write as its own span."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._local = threading.local()

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        label = call_events.step(self.name)
        label.__enter__()
        self._open()[call_id] = label

    def on_module_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        label = self._open().pop(call_id, None)
        if label is not None:
            with suppress(ValueError):  # ended in another context: nothing of ours to undo
                label.__exit__(None, None, None)

    def _open(self) -> dict[str, Any]:
        if not hasattr(self._local, "open"):
            self._local.open = {}
        return self._local.open


def label_predictor_calls(module: dspy.Module) -> None:
    """Label the LM calls of each of `module`'s predictors with its name (once per module:
    labelling it again changes nothing). The callbacks hold no LM, endpoint or key."""
    for name, predictor in module.named_predictors():
        callbacks = list(getattr(predictor, "callbacks", None) or [])
        if not any(isinstance(callback, _PredictorLabel) for callback in callbacks):
            predictor.callbacks = [*callbacks, _PredictorLabel(name)]
