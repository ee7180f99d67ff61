"""No import cycle: neither between the packages of `evolve` nor between any two modules of
`evolve` and `memory_policies`.

The graph is built from the source with `ast`, so it sees every import a module can make:
module-level and function-level imports count, and so do imports under `if TYPE_CHECKING:`
(a module naming another's types depends on it, even if the import never runs). A
function-level import is how a cycle hides (it only breaks the import-time error), so it
counts like any other: a cycle is broken by moving the shared piece down into a lower module.

Two graphs:

- packages: a "package" is the first level under `evolve` (`evolve.optimize`,
  `evolve.tuning`, ...); this is the layer rule of the README.
- modules: every module of `evolve` and `memory_policies`, packages' `__init__` included. An
  import of `a.b.c` is an edge to `a.b.c` only: Python runs the parents' `__init__` first, but
  a package that re-exports its modules would otherwise be in a cycle with each of them.
  `from a.b import c` is an edge to the module `a.b.c` when there is one, else to `a.b` (the
  name is an attribute of the package).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVOLVE = ROOT / "evolve"
PACKAGES = (EVOLVE, ROOT / "memory_policies")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, type_checking: bool = False) -> set[str]:
    """Every name `module` may import at run time (TYPE_CHECKING blocks skipped unless
    `type_checking`): for `from x import y`, both `x` and `x.y` (`_module_edges` decides
    which one is a module)."""
    return {target for target, _ in _import_targets(tree, module, is_package, type_checking)}


def _import_targets(
    tree: ast.AST, module: str, is_package: bool, type_checking: bool = False
) -> list[tuple[str, str]]:
    """(imported name, the module it is imported from) pairs; for `import x.y`, (`x.y`, `x.y`);
    for `from x import y`, (`x`, `x`) and (`x.y`, `x`). Imports under `if TYPE_CHECKING:`
    count only with `type_checking`."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, target))
            found.extend((f"{target}.{alias.name}", target) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in package.rglob("*.py"))


def _parse(path: Path) -> tuple[str, ast.AST, bool]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _module_name(path), tree, path.name == "__init__.py"


def _package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "evolve" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def package_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the modules whose imports make that edge. Type-only
    imports count here: a lower layer naming a higher one's types depends on it all the same
    (the layer rule), though it runs no import."""
    known = {_module_name(p) for p in EVOLVE.rglob("*.py")}
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(EVOLVE.rglob("*.py")):
        module, tree, is_package = _parse(path)
        source = _package(module)
        if source is None:
            continue
        for target in _imports(tree, module, is_package, type_checking=True):
            if target not in known:
                continue
            destination = _package(target)
            if destination is None or destination == source:
                continue
            graph.setdefault(source, {}).setdefault(destination, []).append(module)
    return graph


def _module_edges(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that `module` imports (see the module docstring)."""
    edges: set[str] = set()
    imported_from: dict[str, set[str]] = {}
    for target, origin in _import_targets(tree, module, is_package, type_checking=True):
        imported_from.setdefault(origin, set()).add(target)
    for origin, targets in imported_from.items():
        names = targets - {origin}
        if not names:  # `import x.y`
            if origin in known:
                edges.add(origin)
            continue
        submodules = {name for name in names if name in known}
        edges.update(submodules)
        if names - submodules:  # at least one attribute of `origin` itself
            while origin and origin not in known:  # `from x.y.z import w` where z is a name
                origin = origin.rpartition(".")[0]
            if origin:
                edges.add(origin)
    edges.discard(module)
    return edges


def module_graph() -> dict[str, dict[str, list[str]]]:
    """module -> imported module -> [module] (the shape `find_cycles` and `_describe` take)."""
    parsed = [_parse(path) for path in _sources()]
    known = {module for module, _, _ in parsed}
    return {
        module: {target: [module] for target in _module_edges(tree, module, is_package, known)}
        for module, tree, is_package in parsed
    }


def find_cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
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


def _describe(graph: dict[str, dict[str, list[str]]], cycles: list[list[str]]) -> str:
    return "\n".join(
        f"{' <-> '.join(cycle)}: "
        + "; ".join(
            f"{src}->{dst} via {sorted(set(graph[src][dst]))}"
            for src in cycle
            for dst in graph.get(src, {})
            if dst in cycle
        )
        for cycle in cycles
    )


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


def test_module_edges_go_to_submodules_not_to_their_parent_package() -> None:
    known = {"evolve.p", "evolve.p.a", "evolve.p.b", "evolve.p.c"}
    source = (
        "from evolve.p import a\n"  # a submodule: an edge to it, not to `evolve.p`
        "from evolve.p.b import thing\n"  # a name of a module: an edge to that module
        "def later():\n    from evolve.p import helper\n"  # a name of the package itself
    )
    edges = _module_edges(ast.parse(source), "evolve.p.c", False, known)
    assert edges == {"evolve.p.a", "evolve.p.b", "evolve.p"}
    relative = _module_edges(ast.parse("from . import a\n"), "evolve.p.c", False, known)
    assert relative == {"evolve.p.a"}


def test_the_module_graph_sees_a_function_level_cycle() -> None:
    first = "def f():\n    from evolve.p.b import g\n"
    second = "from evolve.p.a import h\n"
    known = {"evolve.p.a", "evolve.p.b"}
    graph = {
        "evolve.p.a": dict.fromkeys(_module_edges(ast.parse(first), "evolve.p.a", False, known)),
        "evolve.p.b": dict.fromkeys(_module_edges(ast.parse(second), "evolve.p.b", False, known)),
    }
    assert find_cycles(graph) == [["evolve.p.a", "evolve.p.b"]]


def test_no_import_cycle_between_evolve_packages() -> None:
    graph = package_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between evolve packages:\n" + _describe(graph, cycles)


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    assert "memory_policies.base" in graph and "evolve.simulator.run_dir" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles between modules:\n" + _describe(graph, cycles)


def readme_layers() -> list[str]:
    """The packages of the README's "What is where" block, top to bottom."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## What is where", 1)[1].split("```", 2)[1]
    return [
        "evolve." + line.split("/")[1]
        for line in block.splitlines()
        if line.startswith("evolve/") and line.split("/")[1] and " " not in line.split("/")[1]
    ]


def layer_violations(layers: list[str], graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Each edge that points up the list (a package importing one listed above it)."""
    position = {package: index for index, package in enumerate(layers)}
    return [
        f"{source} (row {position[source] + 1}) imports {target} (row {position[target] + 1}) "
        f"in {', '.join(modules[:2])}"
        for source, targets in graph.items()
        if source in position
        for target, modules in targets.items()
        if target in position and position[target] < position[source]
    ]


def test_the_readme_lists_the_packages_in_the_code_s_layer_order() -> None:
    layers = readme_layers()
    packages = {_package(_module_name(p)) for p in EVOLVE.rglob("*/__init__.py")}
    assert set(layers) == packages, "the README's layout and evolve/'s packages differ"
    violations = layer_violations(layers, package_graph())
    assert not violations, "the README's layout is not the import order:\n" + "\n".join(violations)


def test_a_layout_out_of_order_is_found() -> None:
    graph = {"evolve.optimize": {"evolve.tuning": ["evolve.optimize.population"]}}
    assert layer_violations(["evolve.tuning", "evolve.optimize"], graph)
    assert not layer_violations(["evolve.optimize", "evolve.tuning"], graph)
