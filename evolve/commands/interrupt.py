"""Ctrl-C and SIGTERM for the `evolve` command: stop at once, exit 130, never hang on exit.

The first SIGINT or SIGTERM sets `STOP` (the process-wide stop event that commands pass to
the runner, which checks it before each new unit and LLM call) and raises
`KeyboardInterrupt` in the main thread, so context managers unwind: worker pools cancel
their queued work, trackers mark the run interrupted, the embedded server is stopped.

Worker threads blocked in an HTTP call cannot be interrupted, and Python joins every pool
thread at exit (`concurrent.futures` registers that join), so a call that hangs would hold
the process forever. `arm_exit_deadline` bounds that wait: after `EXIT_GRACE_S` the process
exits with code 130 whatever its threads are doing (finished units are already on disk and
every write is atomic, so a rerun resumes). A second signal exits at once.
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

from evolve.errors import EXIT_INTERRUPTED

STOP = threading.Event()

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


def _exit_now() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # exiting anyway; a closed stream is fine
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


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


def arm_exit_deadline(grace_s: float = EXIT_GRACE_S) -> None:
    """Exit with 130 after `grace_s` even if worker threads are still blocked in calls."""

    def deadline() -> None:
        time.sleep(grace_s)
        _exit_now()

    threading.Thread(target=deadline, name="evolve-exit-deadline", daemon=True).start()
