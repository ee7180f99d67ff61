"""Instructions are plain, separately replaceable text; format requirements stay fixed."""

from __future__ import annotations

import pytest
from mp_helpers import agent, agent_context, calls_for

from memory_policies import PolicyError, build_policy
from memory_policies.in_context import DEFAULT_TYPES_TO_REMEMBER, TYPES_HEADER

EXPECTED_COMPONENTS = {
    "native": ["use"],
    "in_context": ["write", "write.types_to_remember", "use"],
    "external": ["write", "use"],
    "raw_rag": ["use"],
}


@pytest.mark.parametrize(("kind", "names"), EXPECTED_COMPONENTS.items())
def test_components_are_the_llm_backed_parts(kind: str, names: list[str]) -> None:
    policy = build_policy(kind)
    assert list(policy.components()) == names
    assert all(text.strip() for text in policy.components().values())
    predictors = dict(policy.named_predictors())
    assert set(predictors) == {name.split(".")[0] for name in names}
    # Sub-modules have distinct signatures so traces can tell write from use.
    if "write" in predictors:
        assert (
            predictors["write"].signature.output_fields.keys()
            != predictors["use"].signature.output_fields.keys()
        )


def test_types_to_remember_is_a_separate_part_of_the_write_instruction() -> None:
    policy = build_policy("in_context")
    assert policy.components()["write.types_to_remember"] == DEFAULT_TYPES_TO_REMEMBER
    mutated = policy.with_components({"write.types_to_remember": "1. Pets and their names."})

    assert mutated.components()["write"] == policy.components()["write"]
    assert mutated.components()["write.types_to_remember"] == "1. Pets and their names."
    assert policy.components()["write.types_to_remember"] == DEFAULT_TYPES_TO_REMEMBER
    instruction = mutated.write.signature.instructions
    assert (
        instruction == f"{policy.components()['write']}\n\n{TYPES_HEADER}\n1. Pets and their names."
    )
    # The output format lives in field descriptions, untouched by the mutation.
    fields = {n: f.json_schema_extra["desc"] for n, f in mutated.write.signature.fields.items()}
    assert fields == {
        n: f.json_schema_extra["desc"] for n, f in policy.write.signature.fields.items()
    }


def test_a_part_cannot_swallow_the_seam() -> None:
    policy = build_policy("in_context")
    with pytest.raises(PolicyError, match="must not contain the line"):
        policy.with_components({"write": f"Remember things.\n\n{TYPES_HEADER}\n1. all"})
    with pytest.raises(PolicyError, match="non-empty text"):
        policy.with_components({"use": "   "})


def test_use_instruction_drives_replies_and_choices() -> None:
    policy = build_policy("in_context").with_components({"use": "Always recommend tea."})
    lm = agent(choice=1)
    with agent_context(lm):
        _, state = policy.respond(policy.initial_state(), "drink?")
        policy.answer(state, "drink?", ["tea", "coffee"])
    (reply_call,) = calls_for(lm, "reply")
    (choice_call,) = calls_for(lm, "choice")
    assert "Always recommend tea." in reply_call.system
    assert "Always recommend tea." in choice_call.system
    assert "at most 3 sentences" in reply_call.system


def test_with_components_returns_an_independent_copy() -> None:
    policy = build_policy("external")
    copy = policy.with_components({"write": "Extract only dates."})
    assert policy.components()["write"] != "Extract only dates."
    assert copy.write is not policy.write
    assert copy.parameters() == policy.parameters()
