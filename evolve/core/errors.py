"""One small error hierarchy for the toolkit.

Every error message says what was received, what was expected and how to fix it; the CLI
turns any `ToolkitError` into a one-line message and a non-zero exit, never a traceback.

Exit codes (the table of docs/reliability.md is written from this one):

| code | meaning |
|---|---|
| 0 | success |
| 1 | internal error: a toolkit bug (e.g. the LM client failed inside this process) |
| 2 | bad input: a config, spec, environment, bundle, run file or command-line value was refused |
| 3 | LLM failure after retries: endpoint unreachable or failing, or outputs failing checks |
| 4 | another evolve process is running the same run directory |
| 5 | storage failed: read-only or full disk, unreachable or refused database |
| 130 | interrupted (Ctrl-C / SIGTERM); finished work is saved and a rerun resumes |
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_LLM_FAILURE = 3
EXIT_RUN_BUSY = 4
EXIT_STORAGE = 5
EXIT_INTERRUPTED = 130


class ToolkitError(Exception):
    """Base class of every error the toolkit reports to a user."""

    exit_code: int = EXIT_BAD_INPUT


class ConfigError(ToolkitError):
    """A configuration or experiment spec is invalid."""


class LLMOutputError(ToolkitError):
    """An LLM answered, but its outputs kept failing their checks after every retry (e.g. no
    user of an LLM synthesis passed validation): a model or retry-budget problem."""

    exit_code = EXIT_LLM_FAILURE


class ModelFileError(ToolkitError):
    """The local GGUF model file is missing, incomplete or corrupted."""


class EndpointError(ToolkitError):
    """An LLM endpoint cannot be reached or keeps failing."""

    exit_code = EXIT_LLM_FAILURE


class LMClientError(ToolkitError):
    """The LM client failed inside this process (not the endpoint): a toolkit bug."""

    exit_code = EXIT_INTERNAL


class RunBusyError(ToolkitError):
    """Another live evolve process holds the lock of this run directory."""

    exit_code = EXIT_RUN_BUSY


class StorageError(ToolkitError):
    """Results, caches or a database cannot be written or read (read-only, full, refused)."""

    exit_code = EXIT_STORAGE


class MissingAPIKeyError(ConfigError):
    """A configured hosted endpoint names an environment variable that is not set."""


class ServerStartError(ToolkitError):
    """The embedded llama.cpp server did not start."""


class EnvironmentDataError(ToolkitError):
    """An AMemGym environment file is inconsistent or malformed."""


class DamagedRunFileError(ToolkitError):
    """A file evolve wrote into a run directory cannot be read back: truncated, garbled, or
    not the record evolve writes there. `fix` says what to do about it."""

    def __init__(self, path: object, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"damaged run file {path}: {problem}; {fix}")


class ResumeMismatchError(ToolkitError):
    """An output directory holds a run made with a different configuration."""


class Interrupted(ToolkitError):
    """The work was stopped on request (Ctrl-C / SIGTERM) before it finished; a rerun resumes."""

    exit_code = EXIT_INTERRUPTED


def shown_value(value: object, limit: int = 80) -> str:
    """The value's repr for an error line, cut to `limit` characters: a pasted file or a
    thousand-digit number must not become the message."""
    text = repr(value)
    if len(text) <= limit:
        return text
    length = len(value) if isinstance(value, str) else len(text)
    return f"{text[: limit - 3]}... ({length} characters)"
