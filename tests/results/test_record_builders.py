"""Each frozen record of an evolution is made in one place: `candidate_record` builds every
`CandidateRecord`, and `EvolutionContext.store_generation` every `GenerationRecord`, so the
schedules cannot drift in how they fill, compare, store or log them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "evolve"

BUILDERS = {
    "CandidateRecord": ("results/records.py", "candidate_record"),
    "GenerationRecord": ("optimize/context.py", "store_generation"),
}


def construction_sites(class_name: str, root: Path = PACKAGE) -> list[tuple[str, str]]:
    """(module, enclosing function) of every `ClassName(...)` call under `root`."""
    sites = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == class_name
                ):
                    sites.append((path.relative_to(root).as_posix(), function.name))
    return sites


def test_each_record_has_one_builder():
    for class_name, builder in BUILDERS.items():
        assert construction_sites(class_name) == [builder], class_name


def test_the_scan_finds_a_record_made_by_hand(tmp_path):
    """The scan can fail: a record made by hand in a function is found."""
    (tmp_path / "chain.py").write_text(
        "def finish():\n    return GenerationRecord(generation=0)\n", encoding="utf-8"
    )
    assert construction_sites("GenerationRecord", tmp_path) == [("chain.py", "finish")]
