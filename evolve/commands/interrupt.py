"""Ctrl-C and SIGTERM for the `evolve` command: stop at once, exit 130, never hang on exit.

The first SIGINT or SIGTERM (or the first LLM call that fails after its retries, see
`evolve.core.stopping`) sets `STOP` (the process-wide stop event that commands pass to
the runner, which checks it before each new unit and LLM call, and that the LM clients check
before sending each HTTP request, retries included) and raises
`KeyboardInterrupt` in the main thread, so context managers unwind: worker pools cancel
their queued work, trackers mark the run interrupted, the embedded server is stopped.

Then the process leaves through `exit_interrupted`, never through the interpreter's
teardown: tearing down the libraries a command has loaded (MLflow, SQLAlchemy, litellm,
Optuna) takes seconds of C-level finalization on a loaded machine, and once it has begun no
Python thread can run, so no deadline could bound it. `exit_interrupted` gives the worker
threads still finishing an in-flight call up to `EXIT_GRACE_S` (threads blocked in an HTTP
call cannot be interrupted, and a call that hangs must not hold the process), flushes the
standard streams and calls `os._exit(130)`. Nothing is lost: finished units are already on
disk, every write is atomic, spend journals are flushed per call, the run lock is released
by the kernel, and a rerun resumes. A second signal exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import NoReturn

from evolve.core.errors import EXIT_INTERRUPTED
from evolve.core.stopping import STOP

# `STOP` (imported above) is the very event the LM clients' transports check before sending
# each HTTP request (`evolve.llm.attempts`): once set, no new request starts.
__all__ = ["EXIT_GRACE_S", "INTERRUPTED_MESSAGE", "STOP", "exit_interrupted", "stop_on_signals"]

# In-flight calls get this long to finish after the main thread is done; less than the
# "one call's latency + 2 s" a stop may take in all.
EXIT_GRACE_S = 1.5

INTERRUPTED_MESSAGE = "evolve: interrupted; rerun resumes (finished work is saved)"

_HANDLED = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if STOP.is_set():
        # Already stopping and asked again: the user wants out now.
        _exit_now()
    STOP.set()
    raise KeyboardInterrupt


def _exit_now(code: int = EXIT_INTERRUPTED) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # exiting anyway; a closed stream is fine
            stream.flush()
    os._exit(code)


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """Inside: SIGINT / SIGTERM set `STOP` and raise `KeyboardInterrupt` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    previous: dict[int, Callable | int | None] = {}
    for signum in _HANDLED:
        previous[signum] = signal.signal(signum, _on_signal)
    try:
        yield STOP
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def exit_interrupted(code: int = EXIT_INTERRUPTED, grace_s: float = EXIT_GRACE_S) -> NoReturn:
    """Exit with `code` (130, or 3 when an endpoint failure stopped the workers) once the
    other non-daemon threads (pool workers finishing an in-flight call) are done, or after
    `grace_s` whatever they are doing; skips interpreter teardown."""
    deadline = time.monotonic() + grace_s
    current = threading.current_thread()
    for thread in threading.enumerate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if thread is not current and not thread.daemon:
            thread.join(remaining)
    _exit_now(code)
