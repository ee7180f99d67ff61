"""Two rules for the tests themselves, checked on their syntax trees:

- no test module imports another test module (`test_*.py`): shared fixtures go in a
  `conftest.py`, shared helpers in a module that is not a test file (`*_helpers.py`,
  `*_world.py`), so that running or moving one test file never depends on another;
- no test patches a private name (`monkeypatch.setattr(obj, "_name", ...)`,
  `mock.patch("pkg.mod._name")`, `patch.object(cls, "_name")`): a test that replaces a
  private method is tied to how the code is written today, not to what it does. Use a public
  seam (an argument, a registry, a public attribute) or drive the behaviour from outside.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# Functions that replace an attribute named by a string: monkeypatch's setattr/delattr (also
# the builtins), unittest.mock's patch(...) and patch.object(...).
_PATCHERS = {"setattr", "delattr", "patch", "object"}
# Python source held in a string (e.g. a child process's script) importing a test module.
_SOURCE_IMPORT = re.compile(
    r"^\s*(?:from\s+[\w.]*\s+import\s+[\w, ]*\btest_\w+|import\s+[\w.]*\btest_\w+"
    r"|from\s+[\w.]*\btest_\w+\s+import)",
    re.M,
)


def _is_test_module(dotted: str) -> bool:
    return any(part.startswith("test_") for part in dotted.split("."))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _patched_names(call: ast.Call) -> list[str]:
    """The attribute names a patching call replaces (last part of a dotted target)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in _PATCHERS:
        return []
    if name == "object" and not (
        isinstance(func, ast.Attribute) and "patch" in ast.unparse(func.value)
    ):
        return []
    names = []
    for argument in call.args[:2]:
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.append(argument.value.rsplit(".", 1)[-1])
    return names


def _breaks_in(tree: ast.AST, root: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"imports the test module {alias.name}")
                for alias in node.names
                if _is_test_module(alias.name)
            ]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _is_test_module(module):
                found.append((node.lineno, f"imports from the test module {module}"))
            # `from pkg import test_x` imports a module only when that file exists.
            package = root.joinpath(*module.split("."))
            found += [
                (node.lineno, f"imports the test module {module}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("test_") and (package / f"{alias.name}.py").exists()
            ]
        elif isinstance(node, ast.Call):
            found += [
                (node.lineno, f"patches the private name {name}")
                for name in _patched_names(node)
                if _is_private(name)
            ]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _SOURCE_IMPORT.search(node.value)
        ):
            found.append((node.lineno, "source in a string imports a test module"))
    return sorted(found)


def rule_breaks(root: Path) -> list[str]:
    """`path:line: what` for every import of a test module and every private patch."""
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(root).as_posix()
        found += [f"{where}:{line}: {what}" for line, what in _breaks_in(tree, root)]
    return found


def test_no_test_imports_a_test_module_or_patches_a_private_name():
    assert rule_breaks(TESTS) == []


def test_the_scan_finds_each_kind_of_break(tmp_path):
    """The rules' control: a tree with one break of each kind, and allowed look-alikes."""
    other = "test_" + "other"  # spelled apart: this file's own strings must not break a rule
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / f"{other}.py").write_text("VALUE = 1\n")
    (tmp_path / "pkg" / "shared_helpers.py").write_text("VALUE = 1\n")
    (tmp_path / "test_breaks.py").write_text(
        f"import pkg.{other}\n"
        f"from pkg.{other} import VALUE\n"
        f"from pkg import {other}\n"
        "from pkg.shared_helpers import VALUE as FINE\n"
        "from pkg import shared_helpers\n"
        f"CHILD = 'from pkg import {other}'\n"
        "def test_x(monkeypatch):\n"
        "    monkeypatch.setattr(module, '_private', 1)\n"
        "    monkeypatch.setattr(module, 'public', 1)\n"
        "    monkeypatch.setattr(module, '__dunder__', 1)\n"
        "    monkeypatch.setattr('pkg.mod._hidden', 1)\n"
        "    monkeypatch.delattr(module, '_gone')\n"
        "    with mock.patch('pkg.mod._helper'), mock.patch.object(Cls, '_method'):\n"
        "        pass\n"
    )
    breaks = [line.split(": ", 1)[1] for line in rule_breaks(tmp_path)]
    assert breaks == [
        "imports the test module pkg.test_other",
        "imports from the test module pkg.test_other",
        "imports the test module pkg.test_other",
        "source in a string imports a test module",
        "patches the private name _private",
        "patches the private name _hidden",
        "patches the private name _gone",
        "patches the private name _helper",
        "patches the private name _method",
    ]
