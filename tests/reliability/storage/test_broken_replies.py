"""No reply of a broken server reaches a healthy run through the response cache.

A run against a stub whose every reply is not JSON (free-text turns "parse" anyway), then a
run against a healthy stub sharing that response cache, must give exactly the results of a
cold run against the healthy stub: for `evolve eval` and `evolve run`, on both LM clients.
A rerun into the broken run's own directory keeps its finished units and says so in one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest
from reliability.process_helpers import run_in_process, write_small_environment, write_tiny_spec
from stub_server import StubServer

# What differs between two runs of the same work: spend, timing and locations.
VOLATILE = frozenset(
    {"wall_time_s", "usage", "llm_calls", "tokens", "cache_hits", "run_dir", "latency_s"}
    | {"prompt_eval_s", "decode_s", "toolkit_share"}
)


@pytest.fixture
def fresh_cache(tmp_path: Path) -> Iterator[Any]:
    """`use(name)` points DSPy's response cache (memory and disk) at its own directory."""
    previous = dspy.cache

    def use(name: str) -> None:
        dspy.configure_cache(
            enable_disk_cache=True,
            enable_memory_cache=True,
            disk_cache_dir=str(tmp_path / f"dspy-{name}"),
        )

    try:
        yield use
    finally:
        dspy.cache = previous


def _normalized(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _normalized(v) for k, v in data.items() if k not in VOLATILE}
    if isinstance(data, list):
        return [_normalized(v) for v in data]
    return data


def results(root: Path) -> dict[str, Any]:
    """Every result file under `root` (reports, unit results, run records), normalized."""
    found = {}
    for path in sorted(root.rglob("*.json")):
        if path.name in {"report.json", "result.json", "policy.json"}:
            text = path.read_text(encoding="utf-8").replace(str(root), "<root>")
            found[str(path.relative_to(root))] = _normalized(json.loads(text))
    assert found, f"no result files under {root}"
    return found


def invoke(
    kind: str, home: Path, client: str, stub: StubServer, out: Path, concurrency: int = 2
) -> int:
    flags = ["--model", "stub", "--base-url", stub.base_url, "--client", client, "--no-progress"]
    # The upper-bound cache is the home's (`<home>/cache`), shared by its phases like the
    # response cache: it may keep only parsed answers too.
    if kind == "eval":
        env_file = home / "env.json"
        if not env_file.exists():
            write_small_environment(env_file, users=2)
        args = ["eval", "--env", str(env_file), "--policy", "in_context"]
        args += ["--concurrency", str(concurrency)]
        return run_in_process(home, *args, "--out", str(out), *flags)
    spec = home / "broken-replies.toml"
    if not spec.exists():
        write_tiny_spec(home, "broken-replies")
        # The paper protocol's free-text turns (its policies chat in plain text) are what a
        # broken server's text would slip through as.
        spec.write_text('protocol = "paper"\n' + spec.read_text(encoding="utf-8"), "utf-8")
    args = ["run", str(spec), "--runs-dir", str(out), "--no-tracking"]
    return run_in_process(home, *args, *flags)


@pytest.mark.parametrize("client", ["openai", "litellm"])
@pytest.mark.parametrize("kind", ["eval", "run"])
def test_a_healthy_run_after_a_broken_one_equals_a_cold_run(tmp_path, fresh_cache, kind, client):
    fresh_cache("cold")
    with StubServer(latency=0.0) as healthy:
        assert invoke(kind, tmp_path / "cold", client, healthy, tmp_path / "cold" / "out") == 0
    cold = results(tmp_path / "cold" / "out")

    fresh_cache("shared")
    home = tmp_path / "shared"
    with StubServer(latency=0.0, fault="non_json") as broken:
        invoke(kind, home, client, broken, home / "broken-out")  # its exit code is not the point
        assert broken.stats()["chat_requests"] > 0
    with StubServer(latency=0.0) as healthy:
        assert invoke(kind, home, client, healthy, home / "out") == 0
    assert results(home / "out") == cold


@pytest.mark.parametrize("kind", ["eval", "run"])
def test_a_rerun_in_a_broken_runs_directory_says_it_kept_the_failed_units(
    tmp_path, fresh_cache, capsys, kind
):
    fresh_cache("shared")
    out = tmp_path / "out"
    with StubServer(latency=0.0, fault="non_json") as broken:
        invoke(kind, tmp_path, "openai", broken, out)
    capsys.readouterr()
    with StubServer(latency=0.0) as healthy:
        assert invoke(kind, tmp_path, "openai", healthy, out) == 0
    lines = [
        line for line in capsys.readouterr().err.splitlines() if line.startswith("evolve: kept")
    ]
    assert len(lines) == 1, lines
    assert "unparseable" in lines[0] and "delete" in lines[0] and str(out) in lines[0]
    assert "\n" not in lines[0]


def test_probe_replies_that_do_not_parse_are_not_replayed(tmp_path, fresh_cache):
    # Only the diagnosis probes are broken: the answers parse, so the run is not declared
    # broken, and its probe replies (free text the adapter accepts, JSON to our reading)
    # must be kept out of the cache by that reading alone. The scripted stub answers as each
    # role expects (so answers parse), in request order: one call at a time.
    fresh_cache("cold")
    with StubServer(latency=0.0, scripted=True) as healthy:
        assert (
            invoke("eval", tmp_path / "cold", "openai", healthy, tmp_path / "cold" / "out", 1) == 0
        )
    cold = results(tmp_path / "cold" / "out")

    fresh_cache("shared")
    home = tmp_path / "shared"
    with StubServer(latency=0.0, scripted=True, fault="non_json_probes") as broken:
        assert invoke("eval", home, "openai", broken, home / "broken-out", 1) == 0
    report = json.loads(next((home / "broken-out").rglob("report.json")).read_text("utf-8"))
    assert report["summary"]["parse_failures"]["probe"] > 0  # the fault did break the probes
    assert report["summary"]["unreliable"] is None
    with StubServer(latency=0.0, scripted=True) as healthy:
        assert invoke("eval", home, "openai", healthy, home / "out", 1) == 0
    assert results(home / "out") == cold
