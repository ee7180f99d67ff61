"""The process-wide stop, in a leaf module: the commands set it on SIGINT / SIGTERM
(`evolve.commands.interrupt`), the LM clients when a call fails for good
(`stop_for_endpoint_failure`); the runner checks it before each unit and LLM call, and the
LM clients' transports before sending each HTTP request (`evolve.llm.attempts`).

A leaf so that the command layer can own the signal handling without importing the LM
clients at start-up, and the LM layer can obey it without importing the command layer.

Why an endpoint failure stops everything: the first call that fails after its retries ends
the command (exit 3), but at concurrency > 1 other workers are mid-call and queued units wait;
if they kept sending, the server would receive requests after the spend journal closed, and a
stalled server would hold the process for every worker's retries. Stopping as a signal does
ends all of them at their next request.
"""

from __future__ import annotations

import threading

STOP = threading.Event()

_lock = threading.Lock()
_endpoint_failure: list[BaseException] = []  # the first call that failed for good, if any


def stop_for_endpoint_failure(error: BaseException) -> None:
    """Stop every worker because `error` ended an LM call for good (after its retries).

    Only the first failure is kept, and none once the process is already stopping (a signal,
    or an earlier failure): calls refused by the stop fail too, and are not the cause.
    """
    with _lock:
        if not STOP.is_set():
            _endpoint_failure.append(error)
            STOP.set()


def endpoint_failure() -> BaseException | None:
    """The LM error that stopped the process, or None (running, or stopped by a signal)."""
    with _lock:
        return _endpoint_failure[0] if _endpoint_failure else None


def stop_reason() -> str:
    """Why requests are refused now, for the refusal's message."""
    failure = endpoint_failure()
    if failure is not None:
        return "an LLM call failed after its retries, which stops every worker"
    return "SIGINT or SIGTERM received"


def reset_stop() -> None:
    """Start a new command (or API call) with no stop and no recorded failure."""
    with _lock:
        _endpoint_failure.clear()
        STOP.clear()


def clear_endpoint_failure() -> None:
    """Forget a stop caused by an endpoint failure (new LMs are opened: a new session of
    calls); a stop caused by a signal stays."""
    with _lock:
        if _endpoint_failure:
            _endpoint_failure.clear()
            STOP.clear()
