"""The `evolve` command: parse arguments, dispatch to a command module, report errors.

Each command lives in `evolve/commands/<name>.py` and exposes `register(subparsers)`, which
adds its parser and sets `handler` to a function taking the parsed namespace and returning
an exit code. Adding a command means adding its module name to `COMMAND_MODULES`.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from dspy.utils.exceptions import LMError
from pydantic import ValidationError

from evolve.commands import interrupt
from evolve.core.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_LLM_FAILURE,
    EXIT_STORAGE,
    Interrupted,
    StorageError,
    ToolkitError,
)
from evolve.core.paths import use_toolkit_caches
from evolve.core.spec_base import format_validation_error
from evolve.core.stopping import endpoint_failure, reset_stop
from memory_policies.errors import PolicyError

COMMAND_MODULES = [
    "doctor",
    "env",
    "eval",
    "run",
    "compare",
    "export",
    "tune",
    "arms",
    "ui",
    "schema",
]


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


# errno values that mean "this storage cannot be written", whatever the file.
_STORAGE_ERRNOS = {errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO}


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code (`evolve.core.errors`; docs/reliability.md's table).

    Called without `argv` (as the `evolve` program), an interrupted command exits the process
    here, within a bounded time and without interpreter teardown (see
    `evolve.commands.interrupt`).
    """
    # The command owns its process: caches go under the toolkit's cache directory.
    use_toolkit_caches()
    parser = build_parser()
    args = parser.parse_args(argv)
    reset_stop()
    with interrupt.stop_on_signals():
        code = _run_handler(args)
        stopped = code == EXIT_INTERRUPTED or endpoint_failure() is not None
        if stopped and argv is None:
            # Inside: a second signal during the grace exits at once. After an endpoint
            # failure too: other workers may sit in a call to a stalled server.
            interrupt.exit_interrupted(code)
    return code


def _run_handler(args: argparse.Namespace) -> int:
    try:
        return int(_call_handler(args) or 0)
    except (KeyboardInterrupt, Interrupted):
        failure = endpoint_failure()
        if failure is not None:
            # Another worker's refused call surfaced first; the failure is what stopped it.
            return _llm_failure(failure)
        print(interrupt.INTERRUPTED_MESSAGE, file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ToolkitError, PolicyError) as error:
        # Our own messages end with the fix: one line, never cut.
        print(f"evolve: error: {_one_line(error, limit=None)}", file=sys.stderr)
        return getattr(error, "exit_code", EXIT_BAD_INPUT)
    except LMError as error:
        return _llm_failure(error)
    except OSError as error:
        code, message = _os_error(error)
        print(f"evolve: error: {message}", file=sys.stderr)
        return code
    except ValidationError as error:  # a value no command-level check caught
        # Which model failed is not known here: no valid keys to list, only the problems.
        message = format_validation_error("invalid value", error, None)
        print(f"evolve: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RecursionError:
        print(
            "evolve: error: an input is nested too deeply to read; check the files passed",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT


def _llm_failure(error: BaseException) -> int:
    print(
        f"evolve: error: an LLM call failed after its retries: {_one_line(error)}; check the "
        f"endpoint (evolve doctor) and rerun to resume",
        file=sys.stderr,
    )
    return EXIT_LLM_FAILURE


def _call_handler(args: argparse.Namespace) -> int | None:
    """The command's handler; a full or failing disk met inside a library (MLflow's or
    Optuna's database, SQLAlchemy) becomes our `StorageError`, whatever wraps it."""
    try:
        return args.handler(args)
    except (ToolkitError, PolicyError, OSError, LMError):
        raise  # ours, the OS's and the endpoint's (its text may quote a server's own disk)
    except Exception as error:
        storage = storage_failure(error)
        if storage is None:
            raise
        raise storage from None


# What sqlite (SQLITE_FULL, SQLITE_IOERR, SQLITE_READONLY) and the OS say when the disk under
# a database is full, failing or read-only, in any library's wrapping of it.
_STORAGE_MARKERS = (
    "database or disk is full",
    "disk i/o error",
    "attempt to write a readonly database",
    "no space left on device",
    "disk quota exceeded",
    "read-only file system",
)


def storage_failure(error: BaseException) -> StorageError | None:
    """A one-line `StorageError` when `error` (or what it wraps) is a full, failing or
    read-only disk; None for anything else."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = " ".join(str(current).split())
        lowered = text.lower()
        full = isinstance(current, OSError) and current.errno in _STORAGE_ERRNOS
        if full or any(marker in lowered for marker in _STORAGE_MARKERS):
            detail = text.split(" [SQL:")[0][:200]  # not the statement and its parameters
            return StorageError(
                f"storage failed in {_storage_owner(error)}: {detail}; free disk space or make "
                "it writable (or choose another location), then rerun to resume"
            )
        current = current.__cause__ or current.__context__
    return None


def _storage_owner(error: BaseException) -> str:
    """Which store failed, from the library whose code raised it: a hint, never an address.

    Read from the traceback's frames, not the error's type: MLflow lets SQLAlchemy's own
    errors through, which name no store."""
    libraries = [type(error).__module__]
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        trace = current.__traceback__
        while trace is not None:
            libraries.append(str(trace.tb_frame.f_globals.get("__name__", "")))
            trace = trace.tb_next
        current = current.__cause__ or current.__context__
    if any(name.startswith(("mlflow", "evolve.tracking")) for name in libraries):
        return "the MLflow tracking store (--tracking-uri / [tracking] tracking_uri)"
    if any(name.startswith("optuna") for name in libraries):
        return "the study storage (--storage / [tuning] storage)"
    return "a database of this run"


def _os_error(error: OSError) -> tuple[int, str]:
    """An exit code and one line for an operating-system error nobody below turned into ours."""
    where = f" {error.filename}" if error.filename else ""
    reason = error.strerror or _one_line(error)
    if isinstance(error, FileNotFoundError | NotADirectoryError | IsADirectoryError):
        return EXIT_BAD_INPUT, f"cannot use{where}: {reason}; check the path"
    if isinstance(error, ConnectionError | TimeoutError):
        return EXIT_LLM_FAILURE, f"connection failed: {reason}; check the endpoint (evolve doctor)"
    if error.errno in _STORAGE_ERRNOS:
        storage = StorageError(
            f"storage refused{where}: {reason}; free space or make it writable (or choose "
            "another --out / --runs-dir), then rerun to resume"
        )
        return storage.exit_code, str(storage)
    return EXIT_STORAGE, f"storage failed{where}: {reason}; rerun to resume once fixed"


def _one_line(error: BaseException, limit: int | None = 300) -> str:
    """The message on one line; foreign messages (a client's, a driver's) are cut at `limit`."""
    text = " ".join(str(error).split())
    return text if limit is None else text[:limit]


if __name__ == "__main__":
    sys.exit(main())
