"""Writes as strategies: each kind's write procedure is chosen once, when the policy is built,
from the variant's `VariantRules.writes`; no kind reads the variant while it writes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memory_policies
from memory_policies.external import CuratedWrites, Mem0Writes
from memory_policies.in_context import JSONObjectWrites, LabelledWrites
from memory_policies.raw_rag import ChunkWrites, MessageWrites

PACKAGE = Path(memory_policies.__file__).parent


@pytest.mark.parametrize(
    ("kind", "own", "reference"),
    [
        ("in_context", LabelledWrites, JSONObjectWrites),
        ("raw_rag", ChunkWrites, MessageWrites),
        ("external", CuratedWrites, Mem0Writes),
    ],
)
def test_the_variant_chooses_the_write_strategy_once(kind, own, reference):
    embedder = memory_policies.HashingEmbedder()
    evolve = memory_policies.create_policy(kind, embedder=embedder)
    paper = memory_policies.create_policy(kind, embedder=embedder, variant="paper")
    assert isinstance(evolve.writes, own) and isinstance(paper.writes, reference)
    # A copy (an evolved child) shares its parent's strategy.
    child = evolve.with_components({})
    assert child.writes is evolve.writes


def rules_reads(root: Path) -> list[str]:
    """`<anything>.rules.writes` read anywhere but where the strategy is chosen (base.py)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "base.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "writes"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "rules"
            ):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_kind_branches_on_the_variant_s_writes():
    assert rules_reads(PACKAGE) == []


def test_the_scan_finds_a_branch(tmp_path):
    (tmp_path / "kind.py").write_text(
        "def _write(self):\n    if self.rules.writes == 'reference':\n        pass\n"
    )
    assert rules_reads(tmp_path) == ["kind.py:2"]
