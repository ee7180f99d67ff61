"""`tests/` mirrors the packages: the tests of a package of `evolve/` (or of `memory_policies`)
live in the test folder named after it. A top-level test file is project-wide (layers,
module sizes, documented commands, benchmarks' scripts, the quickstart's records)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def packages() -> set[str]:
    """The packages of `evolve/`, and `memory_policies`."""
    found = {path.parent.name for path in (ROOT / "evolve").glob("*/__init__.py")}
    return found | {"memory_policies"}


def misplaced(tests: Path, names: set[str]) -> list[str]:
    """Top-level test files named after a package that has its own test folder."""
    folders = {path.name for path in tests.iterdir() if path.is_dir()} & names
    return sorted(
        path.name
        for path in tests.glob("test_*.py")
        if any(
            path.stem == f"test_{name}" or path.stem.startswith(f"test_{name}_") for name in folders
        )
    )


def test_no_top_level_test_belongs_in_a_package_folder():
    assert misplaced(TESTS, packages()) == []


def test_the_package_folders_mirror_packages():
    folders = {
        path.name for path in TESTS.iterdir() if path.is_dir() and any(path.glob("test_*.py"))
    }
    # Besides the packages: packaging (installs) and reliability (faults across commands).
    assert folders - packages() <= {"packaging", "reliability"}, folders - packages()


def test_a_misplaced_file_is_found(tmp_path):
    (tmp_path / "tracking").mkdir()
    (tmp_path / "test_tracking_uri.py").write_text("")
    (tmp_path / "test_hygiene.py").write_text("")
    assert misplaced(tmp_path, {"tracking", "spec"}) == ["test_tracking_uri.py"]
