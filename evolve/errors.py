"""One small error hierarchy for the toolkit.

Every error message says what was received, what was expected and how to fix it; the CLI
turns any `ToolkitError` into a one-line message and a non-zero exit, never a traceback.
"""

from __future__ import annotations


class ToolkitError(Exception):
    """Base class of every error the toolkit reports to a user."""

    exit_code: int = 2


class ConfigError(ToolkitError):
    """A configuration or experiment spec is invalid."""


class ModelFileError(ToolkitError):
    """The local GGUF model file is missing, incomplete or corrupted."""


class EndpointError(ToolkitError):
    """An LLM endpoint cannot be reached or keeps failing."""


class MissingAPIKeyError(ConfigError):
    """A configured hosted endpoint names an environment variable that is not set."""


class ServerStartError(ToolkitError):
    """The embedded llama.cpp server did not start."""


class EnvironmentDataError(ToolkitError):
    """An AMemGym environment file is inconsistent or malformed."""


class ResumeMismatchError(ToolkitError):
    """An output directory holds a run made with a different configuration."""
