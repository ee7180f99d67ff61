"""No module of `evolve/` or `memory_policies/` over 600 lines, and no class over 250.

A number, not a judgement: no paragraph at a module's top buys an exemption. A module that
grows past the limit is split by concept (see the README's layout); a class past it has more
than one job. Data that is not Python (the JSON catalogs of the LLM synthesis) is not
counted; benchmarks and scripts are not covered.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evolve", "memory_policies")
MODULE_LIMIT = 600
CLASS_LIMIT = 250


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def line_count(text: str) -> int:
    return len(text.splitlines())


def long_classes(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, lines) of every class, nested ones included, longer than `CLASS_LIMIT`."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > CLASS_LIMIT
    ]


def oversized() -> list[str]:
    found = []
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = line_count(text)
        if lines > MODULE_LIMIT:
            found.append(f"module {relative}: {lines} lines (limit {MODULE_LIMIT})")
        for name, length in long_classes(ast.parse(text, filename=relative)):
            found.append(f"class {relative}::{name}: {length} lines (limit {CLASS_LIMIT})")
    return found


def test_the_class_measure_counts_a_class_from_its_line_to_its_last() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(CLASS_LIMIT))
    assert long_classes(ast.parse(f"class Long:\n{body}")) == [("Long", CLASS_LIMIT + 1)]
    assert long_classes(ast.parse(f"class Short:\n{body[: body.rindex('    x')]}")) == []
    nested = "class Outer:\n    class Inner:\n" + body.replace("    ", "        ")
    assert ("Inner", CLASS_LIMIT + 1) in long_classes(ast.parse(nested))


def test_the_walk_covers_both_packages() -> None:
    covered = {path.relative_to(ROOT).parts[0] for path in _sources()}
    assert covered == {"evolve", "memory_policies"}


def test_no_module_or_class_over_the_limits() -> None:
    found = oversized()
    assert not found, "split these (one concept per module, one job per class):\n" + "\n".join(
        found
    )


def test_the_readme_states_these_limits():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"No module over {MODULE_LIMIT} lines, no class over {CLASS_LIMIT}" in readme
