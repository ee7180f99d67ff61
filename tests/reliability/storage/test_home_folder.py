"""Nothing lands in the home folder: a tracked `evolve run` and `evolve compare --plot` write
only under the project (runs/, mlruns/, the cache directory)."""

from __future__ import annotations

import os
import subprocess
import sys

from reliability.process_helpers import REPO, llm_flags, write_tiny_spec
from stub_server import StubServer


def test_a_tracked_run_and_its_plot_write_nothing_in_the_home_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    project = tmp_path / "project"
    spec = write_tiny_spec(project, generations=0, tracking=True)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "MEM0_DIR")
        and not key.startswith("MLFLOW_")
    }
    env.update(HOME=str(home), PYTHONPATH=str(REPO), EVOLVE_CACHE_DIR=str(project / "cache"))
    with StubServer(latency=0.0) as stub:
        for args in (
            ["run", str(spec), "--no-progress", "--runs-dir", "runs", *llm_flags(stub)],
            ["compare", str(spec), "--runs-dir", "runs", "--plot", "evolution.png"],
        ):
            done = subprocess.run(
                [sys.executable, "-m", "evolve.cli", *args],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []
