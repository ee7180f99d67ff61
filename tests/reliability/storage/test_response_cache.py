"""DSPy's response cache keeps only answers that parsed, keyed by who answered.

The end-to-end test runs `evolve eval` with the response cache on against a stub server whose
answers are not JSON, then against a healthy stub on another port under the same model name:
the healthy server must be asked, and the upper bound must come out of its answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dspy
import pytest
from stub_server import StubServer

from evolve.cli import main
from evolve.simulator.environment import save_environment
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset


@pytest.fixture
def response_cache(tmp_path: Path) -> Iterator[Path]:
    """A private DSPy response cache (memory and disk) for one test; the previous one after."""
    previous = dspy.cache
    directory = tmp_path / "dspy-cache"
    dspy.configure_cache(
        enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(directory)
    )
    try:
        yield directory
    finally:
        dspy.cache = previous


def _eval(stub: StubServer, env_file: Path, out: Path, ub_cache: Path, *extra: str) -> int:
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
            "2",
            "--out",
            str(out),
            "--upper-bound-cache",
            str(ub_cache),
            "--model",
            "stub",
            "--base-url",
            stub.base_url,
            "--no-progress",
            *extra,
        ]
    )


def _summary(out: Path) -> dict:
    report = json.loads((out / "in_context" / "report.json").read_text(encoding="utf-8"))
    return report["summary"]


@pytest.mark.parametrize("rerun", [["--refresh-upper-bound"], []], ids=["refresh", "rerun"])
def test_a_broken_server_is_never_replayed_to_a_healthy_one(
    tmp_path, response_cache, capsys, rerun
):
    env = synthesize_environment(get_preset("tiny"), 0, 1)
    env_file = tmp_path / "env.json"
    save_environment(env, env_file)
    variants = sum(len(qa.answer_choices) for item in env.items for qa in item.qas)
    ub_cache = tmp_path / "ub"
    with StubServer(latency=0.0, fault="non_json") as broken:
        assert _eval(broken, env_file, tmp_path / "broken", ub_cache) == 0
        summary = _summary(tmp_path / "broken")
        assert summary["parse_failures"]["upper_bound"] == summary["n_items"]
        assert broken.stats()["chat_requests"] > 0
    capsys.readouterr()

    # Another server (another port) under the same model name, answering properly.
    with StubServer(latency=0.0) as healthy:
        out = tmp_path / "healthy"
        assert _eval(healthy, env_file, out, ub_cache, *rerun) == 0
        asked = healthy.stats()["chat_requests"]
        assert asked >= variants, f"the healthy server got {asked} requests"
        summary = _summary(out)
        # (The stub's generic replies do not answer the policy's questions, so only the
        # upper bound, asked with the state given, is checked for parsed answers.)
        assert summary["parse_failures"]["upper_bound"] == 0
        # The paper policies parse with their own adapter; their broken writes are not
        # replayed either.
        assert summary["parse_failures"]["policy"] == 0
        assert summary["upper_bound_score"] is not None and summary["upper_bound_score"] > 0
        assert "upper bound: 0.000" not in capsys.readouterr().out

        # Valid answers are still replayed: the same run again, upper bound refreshed, asks
        # the server nothing (episodes resume from disk, the upper bound from the cache).
        before = healthy.stats()["chat_requests"]
        assert _eval(healthy, env_file, out, ub_cache, "--refresh-upper-bound") == 0
        assert healthy.stats()["chat_requests"] == before
