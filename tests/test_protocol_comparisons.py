"""No code outside the two rules modules decides anything by a protocol or variant name.

Every protocol-dependent choice is a field of `evolve.core.protocol.ProtocolRules`, every
policy-variant-dependent one a field of `memory_policies.variants.VariantRules`; code reads the
field.
This test parses (ast) every ``.py`` file under ``evolve/`` and ``memory_policies/`` except
those two modules and fails on:

1. a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``, ``is not``) with an operand that
   names a protocol or variant;
2. a ``match`` case whose pattern is such a name (``case "paper":``, ``case PAPER:``);
3. a lookup keyed by one: a subscript whose key names one (``x["paper"]``), a subscript of a
   dict display that has one as a key (``{"paper": a, "evolve": b}[name]``), or a ``.get``
   whose first argument names one.

An operand "names a protocol or variant" when it is

- the string literal ``"paper"`` or ``"evolve"``; or
- a name (or ``module.name`` attribute) imported from ``evolve.core.protocol`` or
  ``memory_policies.variants`` whose value there is such a string, a collection of them, or a
  rules instance (``PAPER``, ``EVOLVE``, ``DEFAULT_VARIANT``, ``PROTOCOLS``, ``VARIANTS``).

Names are resolved per file through its imports, so an unrelated ``PAPER`` of another module
is not flagged. Other strings ("blind", "per_question") are field values,
not protocol names, and may be compared.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

import evolve.core.protocol
import memory_policies.variants

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"paper", "evolve"}
RULES_MODULES = {
    "evolve.core.protocol": evolve.core.protocol,
    "memory_policies.variants": memory_policies.variants,
}
EXEMPT = {ROOT / "evolve" / "core" / "protocol.py", ROOT / "memory_policies" / "variants.py"}
RULES_TYPES = (evolve.core.protocol.ProtocolRules, memory_policies.variants.VariantRules)


def _stands_for_a_name(value: object) -> bool:
    if isinstance(value, str):
        return value in NAMES
    if isinstance(value, RULES_TYPES):
        return True
    if isinstance(value, tuple | list | set | frozenset):
        return bool(value) and all(_stands_for_a_name(v) for v in value)
    if isinstance(value, dict):
        return bool(value) and all(_stands_for_a_name(k) for k in value)
    return False


def _flagged_names(module: object) -> set[str]:
    return {
        name
        for name in dir(module)
        if not name.startswith("__") and _stands_for_a_name(getattr(module, name))
    }


FLAGGED = {name: _flagged_names(module) for name, module in RULES_MODULES.items()}
# Rules fields whose values are names (a probe style, a user view, ...): each names a table
# entry the code looks up, so a comparison with one is a switch put back in place.
STRING_FIELDS = {
    field.name
    for field in dataclasses.fields(evolve.core.protocol.ProtocolRules)
    if all(isinstance(getattr(rules, field.name), str) for rules in evolve.core.protocol.ALL_RULES)
} - {"name", "probe_scope_reason"}  # the name: see NAMES; the reason is a message


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()  # local names bound to a flagged value
        self.modules: dict[str, str] = {}  # local alias -> rules module
        self.problems: list[str] = []

    # ----- what names a protocol ---------------------------------------------------------

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            local = alias.asname or alias.name
            if module in FLAGGED and alias.name in FLAGGED[module]:
                self.names.add(local)
            if f"{module}.{alias.name}" in FLAGGED:
                self.modules[local] = f"{module}.{alias.name}"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in FLAGGED:
                self.modules[alias.asname or alias.name] = alias.name

    def names_a_protocol(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in NAMES
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            target = ast.unparse(node.value)
            module = self.modules.get(target, target)
            return module in FLAGGED and node.attr in FLAGGED[module]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(self.names_a_protocol(element) for element in node.elts)
        return False

    # ----- where it must not appear ------------------------------------------------------

    def flag(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {node.lineno}: {what}: {ast.unparse(node)[:100]}")

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        if any(self.names_a_protocol(operand) for operand in operands):
            self.flag(node, "comparison with a protocol or variant name")
        elif any(
            isinstance(operand, ast.Attribute) and operand.attr in STRING_FIELDS
            for operand in operands
        ):
            self.flag(node, "branch on a rules field's value (look its table up instead)")
        self.generic_visit(node)

    def visit_match_case(self, node: ast.match_case) -> None:
        for pattern in ast.walk(node.pattern):
            if isinstance(pattern, ast.MatchValue) and self.names_a_protocol(pattern.value):
                self.flag(pattern, "match case on a protocol or variant name")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.names_a_protocol(node.slice):
            self.flag(node, "lookup keyed by a protocol or variant name")
        elif isinstance(node.value, ast.Dict) and any(
            key is not None and self.names_a_protocol(key) for key in node.value.keys
        ):
            self.flag(node, "lookup in a dict keyed by protocol or variant names")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and node.args
            and self.names_a_protocol(node.args[0])
        ):
            self.flag(node, ".get keyed by a protocol or variant name")
        self.generic_visit(node)


def problems_in(source: str) -> list[str]:
    tree = ast.parse(source)
    finder = _Finder()
    # Imports first: a name imported at the bottom (or inside a function) still counts.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            finder.visit(node)
    finder.visit(tree)
    return finder.problems


def _sources() -> list[Path]:
    files = [
        *sorted((ROOT / "evolve").rglob("*.py")),
        *sorted((ROOT / "memory_policies").rglob("*.py")),
    ]
    return [path for path in files if path not in EXEMPT]


def test_the_rules_modules_are_importable_by_name():
    for name, module in RULES_MODULES.items():
        assert importlib.import_module(name) is module
    assert {"PAPER", "EVOLVE", "PROTOCOLS"} <= FLAGGED["evolve.core.protocol"]
    assert {"PAPER", "EVOLVE", "VARIANTS", "DEFAULT_VARIANT"} <= FLAGGED["memory_policies.variants"]


def test_no_code_compares_protocol_or_variant_names():
    found = {
        str(path.relative_to(ROOT)): problems
        for path in _sources()
        if (problems := problems_in(path.read_text(encoding="utf-8")))
    }
    assert found == {}, "ask a ProtocolRules / VariantRules field instead:\n" + "\n".join(
        f"{path}: {problem}" for path, problems in found.items() for problem in problems
    )


@pytest.mark.parametrize(
    "source",
    [
        'if protocol == "paper": pass',
        'ok = "evolve" != spec.protocol',
        'ok = name in ("paper", "x")',
        "from evolve.core.protocol import PAPER\nok = rules is PAPER",
        "from memory_policies.variants import DEFAULT_VARIANT as D\nok = variant == D",
        "from memory_policies import variants\nok = variant in variants.VARIANTS",
        "import evolve.core.protocol\nok = x == evolve.core.protocol.EVOLVE",
        'match protocol:\n    case "paper":\n        pass',
        'value = table["paper"]',
        'value = {"paper": 1, "evolve": 2}[protocol]',
        'value = table.get("evolve")',
        'if rules.user_view == "state_hidden": pass',
        'ok = config.rules.probe_style != "per_variable"',
        'ok = "reference" == spec.rules.reflector_prompt',
    ],
)
def test_each_kind_of_name_switch_is_caught(source):
    assert problems_in(source)


@pytest.mark.parametrize(
    "source",
    [
        "view = USER_VIEWS[rules.user_view]",
        # Same name as a rules module's, other module: not flagged.
        "from reference_code import PAPER\nok = preset == PAPER",
        'message = f"protocol {name!r} is not paper"',
        "from evolve.core.protocol import rules_for\nok = rules_for(protocol).chat_turns",
        'spec = {"protocol": "paper"}',
    ],
)
def test_field_reads_and_unrelated_names_pass(source):
    assert problems_in(source) == []


# ----- a protocol is resolved once: looked up only by the command layer -----------------------

# Where a protocol may be looked up by name (`rules_for`): the rules modules, and the command
# layer that reads a name from the command line or a stored run. A protocol or variant name
# is written as a literal in the rules modules only.
RULES_FILES = {ROOT / "evolve" / "core" / "protocol.py", ROOT / "memory_policies" / "variants.py"}
LOOKUP_ALLOWED = {
    *RULES_FILES,
    ROOT / "evolve" / "api.py",
    ROOT / "evolve" / "cli.py",
    *(ROOT / "evolve" / "commands").rglob("*.py"),
}


def lookups_in(source: str, *, lookups_allowed: bool = False) -> list[str]:
    """`rules_for(...)` calls (unless `lookups_allowed`) and whole "paper" / "evolve" string
    literals (a protocol or variant named in code) in `source`; the program's own name
    (`prog="evolve"`) is not a protocol."""
    tree = ast.parse(source)
    program_names = {
        id(keyword.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for keyword in node.keywords
        if keyword.arg == "prog"
    }
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not lookups_allowed:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "rules_for":
                problems.append(f"line {node.lineno}: looks rules up: {ast.unparse(node)[:80]}")
        elif (
            isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in program_names
        ):
            problems.append(f"line {node.lineno}: names a protocol: {node.value!r}")
    return problems


def test_below_the_command_layer_no_code_looks_a_protocol_up_or_names_one():
    files = [
        *sorted((ROOT / "evolve").rglob("*.py")),
        *sorted((ROOT / "memory_policies").rglob("*.py")),
    ]
    found = {
        str(path.relative_to(ROOT)): problems
        for path in files
        if path not in RULES_FILES
        and (
            problems := lookups_in(
                path.read_text(encoding="utf-8"), lookups_allowed=path in LOOKUP_ALLOWED
            )
        )
    }
    assert found == {}, "read the rules object you are handed (e.g. config.rules):\n" + "\n".join(
        f"{path}: {problem}" for path, problems in found.items() for problem in problems
    )


def test_the_command_layer_may_look_a_protocol_up_but_not_name_one():
    assert lookups_in("rules = rules_for(args.protocol)", lookups_allowed=True) == []
    assert lookups_in('rules = rules_for("paper")', lookups_allowed=True)
    assert lookups_in('parser = ArgumentParser(prog="evolve")') == []


@pytest.mark.parametrize(
    "source",
    [
        "rules = rules_for(spec.protocol)",
        "import evolve.core.protocol\nrules = evolve.core.protocol.rules_for(name)",
        'def run(protocol: str = "evolve"): ...',
        'compute(protocol="paper")',
    ],
)
def test_each_kind_of_lookup_is_caught(source):
    assert lookups_in(source)


@pytest.mark.parametrize(
    "source",
    ["rules = config.rules.probe_style", 'prog = "evolve-tool"', 'text = f"protocol {name}"'],
)
def test_reading_the_rules_object_passes(source):
    assert lookups_in(source) == []
