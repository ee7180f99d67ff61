"""Building `memory-policies` writes only the wheel: no `build/` or `*.egg-info` in the
repository (setuptools would put them next to the pyproject.toml it builds)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = REPO / "dist" / "memory-policies"


def _tree(root: Path) -> set[str]:
    """Every path under `root`, bytecode caches aside (Python writes those anywhere)."""
    return {
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if "__pycache__" not in path.parts
    }


def test_building_the_wheel_leaves_the_source_tree_clean(tmp_path):
    watched = (DISTRIBUTION, REPO / "memory_policies")
    before = {root: _tree(root) for root in watched}
    done = subprocess.run(
        # No build isolation: setuptools and wheel come from this environment, so no network.
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "-q"]
        + ["--no-deps", "--no-build-isolation", str(DISTRIBUTION), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for root in watched:
        assert _tree(root) == before[root], f"the build wrote into {root}"
    (wheel,) = tmp_path.glob("memory_policies-*.whl")
    packaged = set(zipfile.ZipFile(wheel).namelist())
    modules = {f"memory_policies/{path.name}" for path in (REPO / "memory_policies").glob("*.py")}
    assert modules <= packaged
    assert "memory_policies/README.md" in packaged
