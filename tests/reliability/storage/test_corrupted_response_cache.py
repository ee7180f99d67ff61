"""A corrupted DSPy disk cache is moved aside with one warning line, and caching goes on.

DSPy's own lazy build falls back to a memory-only cache when a shard's sqlite file is not a
database: every response would be asked again in every later run, silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import diskcache
import dspy
import pytest
from stub_server import StubServer

from evolve.cli import main
from evolve.llm.disk_cache import check_response_cache
from evolve.simulator.environment import save_environment
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset


def _forget_cache() -> None:
    """What a new process starts with: DSPy builds `dspy.cache` on its first read."""
    vars(dspy).pop("cache", None)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    previous = vars(dspy).get("cache")
    directory = tmp_path / "dspy-cache"
    monkeypatch.setenv("DSPY_CACHEDIR", str(directory))
    _forget_cache()
    try:
        yield directory
    finally:
        if previous is not None:
            dspy.cache = previous
        else:
            _forget_cache()


def _corrupt(directory: Path) -> None:
    diskcache.FanoutCache(str(directory), shards=16).close()
    (directory / "000" / "cache.db").write_bytes(b"not a database, garbage " * 200)


def _eval(stub: StubServer, env_file: Path, out: Path, ub_cache: Path) -> int:
    return main(
        [
            "eval",
            "--env",
            str(env_file),
            "--policy",
            "in_context",
            "--users",
            "1",
            "--concurrency",
            "1",
            "--out",
            str(out),
            "--upper-bound-cache",
            str(ub_cache),
            "--model",
            "stub",
            "--base-url",
            stub.base_url,
            "--no-progress",
        ]
    )


def test_a_corrupted_cache_is_moved_aside_and_responses_are_cached_again(
    tmp_path, cache_dir, capsys
):
    env_file = tmp_path / "env.json"
    save_environment(synthesize_environment(get_preset("tiny"), 0, 1), env_file)
    _corrupt(cache_dir)
    with StubServer(latency=0.0) as stub:
        assert _eval(stub, env_file, tmp_path / "first", tmp_path / "ub1") == 0
        asked = stub.stats()["chat_requests"]
        assert asked > 0
        warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
        cache_lines = [line for line in warnings if "response cache" in line]
        assert len(cache_lines) == 1, warnings
        line = cache_lines[0]
        assert f"the response cache at {cache_dir} was corrupted" in line
        asides = list(cache_dir.parent.glob(f"{cache_dir.name}.broken-*"))
        assert len(asides) == 1 and f"moved it to {asides[0]}" in line
        assert (asides[0] / "000" / "cache.db").read_bytes().startswith(b"not a database")

        # A new process, a fresh output directory: the responses that parsed come from the
        # disk cache (the stub's generic replies do not parse for every role, and those are
        # never cached, so some are asked again; a memory-only cache would ask all again).
        _forget_cache()
        assert _eval(stub, env_file, tmp_path / "second", tmp_path / "ub2") == 0
        asked_again = stub.stats()["chat_requests"] - asked
        assert asked_again < asked
        assert "response cache" not in capsys.readouterr().err


def test_a_configured_cache_that_breaks_is_rebuilt(cache_dir, capsys):
    dspy.configure_cache(
        enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir)
    )
    before = dspy.cache
    before.disk_cache.close()
    for shard in cache_dir.glob("*/cache.db"):
        shard.write_bytes(b"\0garbage" * 512)
    check_response_cache()
    assert "was corrupted" in capsys.readouterr().err
    assert dspy.cache is not before and dspy.cache.enable_disk_cache
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    dspy.cache.put(request, "answer")
    dspy.cache.reset_memory_cache()
    assert dspy.cache.get(request) == "answer"


def test_a_working_cache_is_left_alone(cache_dir, capsys):
    dspy.configure_cache(
        enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir)
    )
    before = dspy.cache
    check_response_cache()
    assert dspy.cache is before
    assert capsys.readouterr().err == ""
    assert not list(cache_dir.parent.glob("*.broken-*"))
