"""Eval with a partly filled response cache at concurrency > 1.

Worker threads used to race through the LM client's lazy imports (litellm through
importlib's LazyLoader, litellm's own lazy attributes, and unpickling cached responses
that import `litellm.types.utils`), failing with "partially initialized module 'litellm'",
`KeyError: 'litellm'` or an import deadlock, reported as an endpoint failure. The race is
on the litellm route (`--client litellm`; the default client caches plain data). Each eval
is a fresh process: import races only happen where litellm has not been imported yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dspy
from dspy.clients.cache import Cache

from evolve.cli import main

REPO = Path(__file__).resolve().parents[3]


def _eval(stub, tmp_path: Path, out: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EVOLVE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop("DSPY_CACHEDIR", None)
    argv = [sys.executable, "-m", "evolve.cli", "eval", "--preset", "tiny", "--policy", "native"]
    argv += ["--rounds-init", "1", "--rounds-update", "1", "--out", str(tmp_path / out)]
    argv += ["--base-url", stub.base_url, "--model", "stub", *extra]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)


def test_eval_with_a_partly_filled_cache_at_high_concurrency(stub, tmp_path, monkeypatch):
    # User 0's responses and upper bound are cached by this process (where litellm is
    # loaded already), into the cache directory the fresh process below will use. Before the
    # fix, this one fresh run failed in 4 tries out of 4 (and passed with a full cache).
    cache = tmp_path / "cache"
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(cache))
    disk = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=cache / "dspy")
    monkeypatch.setattr(dspy, "cache", disk)
    argv = ["eval", "--preset", "tiny", "--policy", "native", "--rounds-init", "1"]
    argv += ["--rounds-update", "1", "--out", str(tmp_path / "one"), "--users", "1"]
    argv += ["--base-url", stub.base_url, "--model", "stub", "--client", "litellm"]
    assert main([*argv, "--concurrency", "1"]) == 0
    # The fresh process unpickles user 0's cached responses in worker threads while the
    # other users' calls import litellm in others.
    done = _eval(
        stub, tmp_path, "four", "--users", "4", "--concurrency", "8", "--client", "litellm"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "partially initialized" not in done.stderr
    assert "KeyError" not in done.stderr


def test_a_client_failure_is_not_reported_as_an_endpoint_failure(
    stub, tmp_path, monkeypatch, capsys
):
    """A bug inside the client (here: a cache read failing) names itself, not the endpoint."""

    def broken_get(*args, **kwargs):
        raise KeyError("litellm")

    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "native", "--no-upper-bound"]
    argv += ["--base-url", stub.base_url, "--model", "stub", "--concurrency", "2"]
    argv += ["--out", str(tmp_path / "out")]
    monkeypatch.setattr(dspy.cache, "get", broken_get)
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 3, err
    assert "not an endpoint failure" in err and "KeyError" in err
    assert "check the endpoint" not in err
