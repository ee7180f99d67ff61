"""The `evolve` program: signals are handled from its first instant to its last.

Importing the command (DSPy, MLflow, pydantic, the command modules) takes seconds, and so
does the interpreter's teardown; `evolve.cli.main` handles Ctrl-C / SIGTERM only while a
command runs. Before and after, SIGTERM used to kill the process silently (exit -15) and
Ctrl-C to print an import traceback. Here both get one line and exit 130 at every stage.
Imports nothing heavy itself, so its handlers are in place before anything else loads.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

# What a signal interrupts, by stage (the command's own handler covers the run itself).
_STAGE_MESSAGES = {
    "start-up": "evolve: interrupted while starting; nothing was run",
    "teardown": "evolve: interrupted while finishing; the command's work is saved",
}
_stage = "start-up"


def _on_signal(signum: int, frame: FrameType | None) -> None:
    try:
        sys.stderr.write(_STAGE_MESSAGES[_stage] + "\n")
        sys.stderr.flush()
    finally:
        os._exit(130)  # EXIT_INTERRUPTED, not imported: nothing may load before the handler


def main() -> None:
    global _stage
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    from evolve.cli import main as run_command

    code = run_command()
    _stage = "teardown"
    sys.exit(code)


if __name__ == "__main__":
    main()
