"""Every benchmark script imports: a rename elsewhere must not leave one broken until somebody
needs its figures (parallel_users.py once imported a module that had moved)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_benchmark_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"benchmark_{script.stem}"
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # imports and definitions; the `__main__` part does not run
