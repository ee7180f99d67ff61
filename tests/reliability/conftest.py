"""Fixtures for the fault tests: a stub OpenAI-compatible server in its own process."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from reliability.process_helpers import close_started_processes
from stub_server import StubServer


@pytest.fixture(autouse=True)
def _close_processes_after_each_test() -> Iterator[None]:
    yield
    close_started_processes()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(latency=0.01) as server:
        yield server
