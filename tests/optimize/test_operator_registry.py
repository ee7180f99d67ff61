"""The operator door: one file registers an operator, the spec's `optimizer.operators` selects
it, and either schedule (population on GEPA, the per-period chain) records what it proposed
(the example of docs/extending.md)."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from optimize.chain_world import World as ChainWorld
from optimize.chain_world import write_world
from optimize.evolve_helpers import World, reflector_inputs, write_spec

from evolve.core.errors import ConfigError
from evolve.optimize import CandidateStatus, evolve_policy
from evolve.optimize.operators import OPERATOR_CHECKS, OPERATORS, register_operator
from evolve.spec.config import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "drop_line_operator.py"
LIST = "write.types_to_remember"


@pytest.fixture
def drop_line() -> Iterator[None]:
    """The example operator module, imported as a plugin would be (and unregistered after)."""
    spec = importlib.util.spec_from_file_location("drop_line_operator", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["drop_line_operator"] = module
    spec.loader.exec_module(module)
    yield
    OPERATORS.pop("drop_line", None)
    sys.modules.pop("drop_line_operator", None)


def operator_spec(tmp_path: Path, operators: str) -> Path:
    return write_spec(
        tmp_path,
        optimizer=f"""
            generations = 2
            reflection_minibatch_size = 2
            operators = {operators}
            mutate_components = ["{LIST}"]
        """,
    )


def test_the_docs_show_the_example_file_as_it_is():
    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


def test_a_registered_operator_is_selected_by_the_spec_and_its_proposals_recorded(
    tmp_path, drop_line
):
    world = World()
    result = evolve_policy(
        load_spec(operator_spec(tmp_path, '["drop_line"]')),
        world.lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
    )
    children = [record for record in result.candidates if record.generation > 0]
    assert children, "the operator proposed nothing"
    for child in children:
        assert child.mutation.kind == "drop_line" and child.mutation.component == LIST
        assert child.status in (CandidateStatus.EVALUATED, CandidateStatus.REJECTED)
        parent = result.candidate(child.parent_ids[0]).components[LIST].splitlines()
        lines = child.components[LIST].splitlines()
        # One line fewer, the others kept in order.
        assert len(lines) == len(parent) - 1
        assert any(parent[:index] + parent[index + 1 :] == lines for index in range(len(parent)))
    # The operator makes no reflector call: nothing reached the reflector role.
    assert world.calls()["reflector"] == 0


def test_an_unknown_operator_is_refused_before_any_llm_call(tmp_path):
    world = World()
    spec = load_spec(operator_spec(tmp_path, '["no_such_operator", "reflective"]'))
    with pytest.raises(ConfigError, match="no_such_operator.*registered: .*reflective"):
        evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path)
    assert world.calls() == {"agent": 0, "reflector": 0, "simulator": 0}
    assert not (tmp_path / "runs").exists()


def idle_spec(tmp_path: Path, optimizer: str) -> Path:
    return write_spec(
        tmp_path, optimizer=f"generations = 2\nreflection_minibatch_size = 2\n{optimizer}"
    )


@pytest.mark.parametrize(
    ("optimizer", "said"),
    [
        ('operators = ["list_edit"]\nmutate_components = ["use"]', "list_edit edits list"),
        (
            f'operators = ["list_edit"]\nfeedback = "none"\nmutate_components = ["{LIST}"]',
            "feedback = 'none' turns off",
        ),
        (
            f'operators = ["reflective", "list_edit"]\nmutate_components = ["{LIST}"]',
            "would never propose",
        ),
        (
            f'operators = ["list_edit"]\nmutate_components = ["{LIST}", "use"]',
            "no operator rewrites ['use']",
        ),
    ],
    ids=["non-list-component", "feedback-none", "shadowed", "orphan-component"],
)
def test_operators_that_would_propose_nothing_are_refused_before_any_llm_call(
    tmp_path, optimizer, said
):
    world = World()
    spec = load_spec(idle_spec(tmp_path, optimizer))
    with pytest.raises(ConfigError) as raised:
        evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert world.calls() == {"agent": 0, "reflector": 0, "simulator": 0}


def test_list_edit_on_its_list_component_is_accepted(tmp_path):
    # The control: the quickstart's own operator setup passes the check and proposes.
    world = World()
    spec = load_spec(
        idle_spec(tmp_path, f'operators = ["list_edit"]\nmutate_components = ["{LIST}"]')
    )
    evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub")
    assert world.calls()["reflector"] > 0


def test_an_operator_carries_its_own_spec_check(tmp_path):
    """A registered operator refuses a spec it cannot work with, in its own words, before any
    LLM call; the spec and config modules know nothing of it."""

    def needs_five(optimizer, rules) -> str | None:
        return None if optimizer.generations >= 5 else "needs_five needs generations >= 5"

    register_operator("needs_five", lambda **_: None, check=needs_five)
    try:
        world = World()
        spec = load_spec(operator_spec(tmp_path, '["needs_five", "reflective"]'))
        with pytest.raises(
            ConfigError, match=r"exp\.toml: optimizer\.operators: needs_five needs generations"
        ):
            evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path)
        assert world.calls() == {"agent": 0, "reflector": 0, "simulator": 0}
    finally:
        OPERATORS.pop("needs_five", None)
        OPERATOR_CHECKS.pop("needs_five", None)


@pytest.mark.parametrize(
    ("body", "operators", "problem"),
    [
        (
            'protocol = "paper"',
            '["list_edit", "reflective"]',
            "list_edit .* is not part of protocol 'paper'",
        ),
        ("", '["tuned", "reflective"]', "tuned runs every tune_every generations"),
    ],
    ids=["list_edit-under-paper", "tuned-without-tune_every"],
)
def test_the_built_in_operators_check_what_they_need(tmp_path, body, operators, problem):
    world = World()
    path = write_spec(
        tmp_path,
        body,
        optimizer=f"""
            generations = 2
            operators = {operators}
            mutate_components = ["{LIST}"]
        """,
    )
    with pytest.raises(ConfigError, match=rf"optimizer\.operators: {problem}"):
        evolve_policy(
            load_spec(path), world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path
        )
    assert world.calls() == {"agent": 0, "reflector": 0, "simulator": 0}


def chain_spec(tmp_path: Path, operators: str) -> Path:
    """The per-user chain world (schedule = "per_period") with `optimizer.operators` set."""
    spec = write_world(tmp_path)
    text = spec.read_text(encoding="utf-8")
    spec.write_text(text.replace("[optimizer]\n", f"[optimizer]\noperators = {operators}\n"))
    return spec


def test_a_registered_operator_makes_the_steps_of_the_per_period_chain(tmp_path, drop_line):
    world = ChainWorld()
    result = evolve_policy(
        load_spec(chain_spec(tmp_path, '["drop_line"]')),
        world.lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
    )
    steps = [record for record in result.candidates if record.generation > 0]
    assert steps, "the chain made no step"
    assert {step.user_id for step in steps} == {"user-0", "user-1"}
    for step in steps:
        assert step.mutation.kind == "drop_line" and step.mutation.component == LIST
        parent = result.candidate(step.parent_ids[0]).components[LIST].splitlines()
        if step.status == CandidateStatus.INVALID:
            assert len(parent) < 2 and "single line" in (step.invalid_reason or "")
            continue
        lines = step.components[LIST].splitlines()
        assert len(lines) == len(parent) - 1
        assert any(parent[:index] + parent[index + 1 :] == lines for index in range(len(parent)))
    # The chain asked the operator, not the reflector (the agent's model under paper).
    assert world.reflector.calls == []
    assert not [call for call in world.agent.calls if reflector_inputs(call) is not None]


def test_a_chain_whose_component_no_operator_rewrites_is_refused_before_any_llm_call(tmp_path):
    world = ChainWorld()
    spec = load_spec(chain_spec(tmp_path, '["parameter"]'))
    with pytest.raises(ConfigError, match=r"no operator of \['parameter'\] rewrites"):
        evolve_policy(spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path)
    assert world.agent.calls == [] and world.reflector.calls == []
