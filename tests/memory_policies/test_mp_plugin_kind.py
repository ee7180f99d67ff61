"""A plugin policy kind in one file (examples/recent_facts_policy.py, shown in
docs/extending.md): its own numeric parameter is checked by the rule it declares, and the paper
variant it does not declare is refused when it is built, before any LLM call."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from mp_helpers import agent, agent_context, messages

import memory_policies.registry as registry
from evolve.core.errors import ConfigError
from evolve.spec.config import resolve, spec_from_dict
from memory_policies import MemoryPolicy, PolicyError, build_policy, load

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "recent_facts_policy.py"


@pytest.fixture(scope="module")
def plugin():
    spec = importlib.util.spec_from_file_location("recent_facts_policy", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["recent_facts_policy"] = module
    spec.loader.exec_module(module)
    yield module
    registry.POLICY_KINDS.pop("recent_facts", None)
    sys.modules.pop("recent_facts_policy", None)


def test_the_docs_show_exactly_the_tested_example():
    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert EXAMPLE.read_text(encoding="utf-8") in blocks


def test_its_own_parameter_is_built_checked_and_used(plugin):
    policy = build_policy("recent_facts:max_notes=3,update_every=1,short_term_len=0")
    assert policy.parameters() == {"update_every": 1, "short_term_len": 0, "max_notes": 3}
    state = policy.observe(policy.initial_state(), messages(10))
    assert state.notes == ["m5", "m7", "m9"]  # the last 3 user messages
    assert policy.with_parameters(max_notes=1).parameters()["max_notes"] == 1
    with agent_context(agent(choice=2)):
        assert policy.answer(state, "Which?", ["a", "b"]).choice == 2


@pytest.mark.parametrize(
    ("value", "problem"), [(0, "must be at least 1"), (51, "must be at most 50")]
)
def test_its_own_rule_refuses_a_value_out_of_range(plugin, value, problem):
    with pytest.raises(PolicyError, match=rf"'max_notes' of policy 'recent_facts' {problem}"):
        build_policy(f"recent_facts:max_notes={value}")
    with pytest.raises(PolicyError, match="valid parameters: .*max_notes \\(1..50: user"):
        build_policy("recent_facts:max_note=3")


def test_the_paper_variant_it_lacks_is_refused_when_built(plugin, tmp_path):
    refusal = r"policy kind 'recent_facts' has no paper variant \(it supports: evolve\)"
    with pytest.raises(PolicyError, match=refusal):
        build_policy("recent_facts:variant=paper")  # no LM is configured: nothing is called
    with pytest.raises(PolicyError, match=refusal):
        build_policy("recent_facts", default_variant="paper")  # a paper protocol's default
    policy = build_policy("recent_facts")
    assert policy.variant == "evolve"
    policy.save(tmp_path)
    assert load(tmp_path).parameters() == policy.parameters()


def test_an_experiment_bounds_its_own_parameter_by_its_rule(plugin):
    spec = spec_from_dict(
        {
            "name": "plugin",
            "protocol": "evolve",
            "environment": {"preset": "tiny", "users": 3, "train_users": 2, "heldout_users": 1},
            "policy": {"kind": "recent_facts"},
            "optimizer": {
                "mutate_components": ["use"],
                "parameters": {"max_notes": {"low": 2, "high": 80}},
            },
        }
    )
    with pytest.raises(
        ConfigError, match=r"optimizer\.parameters\.max_notes\.high must be at most 50"
    ):
        resolve(spec)


def test_a_parameter_without_a_rule_fails_where_the_class_is_written():
    with pytest.raises(PolicyError, match=r"declares parameter\(s\) \['depth'\] with no rule"):

        class _NoRule(MemoryPolicy):
            kind = "no_rule"
            parameter_names: ClassVar[tuple[str, ...]] = ("depth",)
