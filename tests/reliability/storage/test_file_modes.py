"""Every file the toolkit writes gets the mode the umask allows (0644 under 022, 0600 under 077):
a shared environment or an exported policy must be readable by whom the user's umask says."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from reliability.process_helpers import cli_env, llm_flags, write_tiny_spec
from stub_server import StubServer

from evolve.core.files import atomic_write_json
from memory_policies import build_policy

# What the commands below write, relative to their working directory.
OUTPUTS = ("envs", "runs", "bundle", "mlruns", "cache")


def _evolve(home: Path, mask: int, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "evolve.cli", *args],
        cwd=home,
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        umask=mask,
    )
    assert done.returncode == 0, (args, done.stderr[-2000:])


def _modes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(file -> mode, directory -> mode) of everything under OUTPUTS."""
    files, directories = {}, {}
    for top in OUTPUTS:
        for path in [root / top, *(root / top).rglob("*")]:
            if path.is_symlink() or not path.exists():
                continue
            found = directories if path.is_dir() else files
            found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return files, directories


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_files_of_generate_run_and_export_follow_the_umask(tmp_path, mask):
    # `run` writes what `eval` does (environment, reports, upper-bound cache) and more.
    spec = write_tiny_spec(tmp_path, tracking=True)
    with StubServer(latency=0.0) as stub:
        _evolve(tmp_path, mask, "env", "synthesize", "--users", "2", "--out", "envs/env.json")
        run = ["run", str(spec), "--runs-dir", "runs", "--no-progress", *llm_flags(stub)]
        _evolve(tmp_path, mask, *run)
    _evolve(tmp_path, mask, "export", "tiny", "--runs-dir", "runs", "--out", "bundle")

    files, directories = _modes(tmp_path)
    wanted = 0o666 & ~mask
    for must_exist in (
        "envs/env.json",
        "runs/tiny/experiment.json",
        "bundle/policy.json",
        "mlruns/mlflow.db",
    ):
        assert must_exist in files, sorted(files)
    assert any(name.startswith("runs/tiny/") and name.endswith("report.json") for name in files)
    assert any(name.startswith("runs/tiny/") and name.endswith("policy.json") for name in files)
    wrong = {name: oct(mode) for name, mode in files.items() if mode != wanted}
    assert wrong == {}, f"expected {oct(wanted)} under umask {oct(mask)}"
    wrong = {name: oct(mode) for name, mode in directories.items() if mode != 0o777 & ~mask}
    assert wrong == {}, f"expected directories {oct(0o777 & ~mask)} under umask {oct(mask)}"


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask022", "umask077"])
def test_atomic_writers_follow_the_umask_in_process(tmp_path, mask):
    previous = os.umask(mask)
    try:
        atomic_write_json(tmp_path / "report.json", {"a": 1})
        build_policy("in_context").save(tmp_path / "policy")
    finally:
        os.umask(previous)
    wanted = 0o666 & ~mask
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == wanted
    assert stat.S_IMODE((tmp_path / "policy" / "policy.json").stat().st_mode) == wanted
