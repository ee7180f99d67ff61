"""Fixtures for the fault tests: a stub OpenAI-compatible server in its own process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stub_server import StubServer


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(latency=0.01) as server:
        yield server
