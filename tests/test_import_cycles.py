"""No import cycle between evolve packages.

The graph is built from the source with `ast`, so it sees every import a module can make:
module-level and function-level imports count; imports under `if TYPE_CHECKING:` do not (they
never run). A "package" is the first level under `evolve` (`evolve.optimize`,
`evolve.tracking`, ...); imports inside one package are its own business.
"""

from __future__ import annotations

import ast
from pathlib import Path

EVOLVE = Path(__file__).resolve().parent.parent / "evolve"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(EVOLVE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module `module` may import at run time (TYPE_CHECKING blocks skipped)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "evolve" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the modules whose imports make that edge."""
    known = {_module_name(p) for p in EVOLVE.rglob("*.py")}
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(EVOLVE.rglob("*.py")):
        module = _module_name(path)
        source = _package(module)
        if source is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in _imports(tree, module, path.name == "__init__.py"):
            if target not in known:
                continue
            destination = _package(target)
            if destination is None or destination == source:
                continue
            graph.setdefault(source, {}).setdefault(destination, []).append(module)
    return graph


def find_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_the_walker_sees_function_level_imports_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from evolve.a import x\n"
        "def f():\n    from evolve.b import y\n"
    )
    found = _imports(ast.parse(source), "evolve.c", is_package=False)
    assert "evolve.b" in found and "evolve.a" not in found


def test_the_cycle_finder_reports_a_two_package_cycle() -> None:
    graph = {"evolve.a": {"evolve.b": ["evolve.a.m"]}, "evolve.b": {"evolve.a": ["evolve.b.n"]}}
    assert find_cycles(graph) == [["evolve.a", "evolve.b"]]
    assert find_cycles({"evolve.a": {"evolve.b": ["evolve.a.m"]}}) == []


def test_no_import_cycle_between_evolve_packages() -> None:
    graph = package_graph()
    cycles = find_cycles(graph)
    detail = [
        f"{' <-> '.join(cycle)}: "
        + "; ".join(
            f"{src}->{dst} via {sorted(set(graph[src][dst]))}"
            for src in cycle
            for dst in graph.get(src, {})
            if dst in cycle
        )
        for cycle in cycles
    ]
    assert not cycles, "import cycles between evolve packages:\n" + "\n".join(detail)
