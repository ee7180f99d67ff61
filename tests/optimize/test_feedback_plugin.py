"""The feedback door: one file registers a kind (examples/missed_facts_feedback.py), the
spec's `optimizer.feedback` selects it, and both schedules (population on GEPA, the
per-period chain) show the reflector its text; nothing outside the file names it."""

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
from evolve.feedback import BUILTIN_KINDS, FEEDBACK_KINDS
from evolve.optimize import evolve_policy
from evolve.spec.config import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "missed_facts_feedback.py"
TITLE = "Facts the memory did not hold when asked:"


@pytest.fixture
def missed_facts() -> Iterator[None]:
    """The example module, imported as a plugin would be (and unregistered after)."""
    spec = importlib.util.spec_from_file_location("missed_facts_feedback", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["missed_facts_feedback"] = module
    spec.loader.exec_module(module)
    yield
    FEEDBACK_KINDS.pop("missed_facts", None)
    sys.modules.pop("missed_facts_feedback", None)


def test_the_population_schedule_shows_the_plugin_kind(tmp_path, missed_facts):
    world = World()
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 2
            reflection_minibatch_size = 2
            feedback = "missed_facts"
            mutate_components = ["use"]
        """,
    )
    result = evolve_policy(
        load_spec(spec), world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    children = [record for record in result.candidates if record.generation > 0]
    assert children and all(child.mutation.feedback == "missed_facts" for child in children)
    shown = [reflector_inputs(call) for call in world.reflector.calls]
    assert any(inputs is not None and TITLE in inputs["feedback"] for inputs in shown)


def test_the_per_period_chain_shows_the_plugin_kind(tmp_path, missed_facts):
    spec = write_world(tmp_path, feedback="missed_facts")
    world = ChainWorld()
    result = evolve_policy(
        load_spec(spec), world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    steps = [record for record in result.candidates if record.generation > 0]
    assert steps and all(step.mutation.feedback == "missed_facts" for step in steps)
    shown = [reflector_inputs(call) for call in world.agent.calls]
    assert any(inputs is not None and TITLE in inputs["feedback"] for inputs in shown)


def test_the_docs_show_the_example_file_as_it_is():
    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


def test_an_unregistered_kind_is_refused_with_the_registered_ones(tmp_path):
    spec = write_spec(tmp_path, optimizer='feedback = "missed_facts"')
    with pytest.raises(
        ConfigError, match="missed_facts.*expected one of 'complete', 'question_only'"
    ):
        load_spec(spec)


def test_the_schema_lists_the_built_in_kinds_from_the_registry():
    from evolve.spec.experiment_spec import OptimizerSpec

    schema = OptimizerSpec.model_json_schema()
    assert schema["properties"]["feedback"]["enum"] == BUILTIN_KINDS
    assert BUILTIN_KINDS == ["complete", "question_only", "diagnostic", "blind", "none"]
