"""The `evolve` command: parse arguments, dispatch to a command module, report errors.

Each command lives in `evolve/commands/<name>.py` and exposes `register(subparsers)`, which
adds its parser and sets `handler` to a function taking the parsed namespace and returning
an exit code. Adding a command means adding its module name to `COMMAND_MODULES`.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from dspy.utils.exceptions import LMError

from evolve.errors import ToolkitError
from memory_policies.errors import PolicyError

COMMAND_MODULES = ["doctor", "env", "eval", "run", "compare", "export", "tune"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evolve",
        description="Self-evolving memory policies for LLM assistants, judged on-policy by "
        "an AMemGym simulator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"evolve.commands.{name}").register(subparsers)
    return parser


def _terminate_gracefully(signum: int, frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C so that context managers stop the embedded server.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_gracefully)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        print("evolve: interrupted; finished work is saved and a rerun resumes", file=sys.stderr)
        return 130
    except (ToolkitError, PolicyError) as error:
        print(f"evolve: error: {error}", file=sys.stderr)
        return getattr(error, "exit_code", 2)
    except LMError as error:
        print(
            f"evolve: error: an LLM call failed after its retries: {_one_line(error)}; check the "
            f"endpoint (evolve doctor) and rerun to resume",
            file=sys.stderr,
        )
        return 3


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300]


if __name__ == "__main__":
    sys.exit(main())
