"""`in_context` under evolve: the types list decides what memory keeps, and the write reads
the user's own messages."""

from __future__ import annotations

import json

from mp_helpers import agent, agent_context, calls_for, section

from evolve.llm.adapter import response_format_for
from memory_policies import Message, build_policy
from memory_policies.in_context import (
    DEFAULT_TYPES_TO_REMEMBER,
    split_write_instruction,
    type_names,
    typed_write_signature,
)

TYPES = "1. Diet and eating habits\n2. Pets"


def _policy():
    policy = build_policy({"kind": "in_context", "update_every": 2, "short_term_len": 0})
    return policy.with_components({"write.types_to_remember": TYPES})


def test_type_names_are_the_items_short_names():
    assert type_names(TYPES) == ["Diet and eating habits", "Pets"]
    assert type_names(DEFAULT_TYPES_TO_REMEMBER)[:2] == ["Preferences", "Personal details"]
    assert type_names("- sleep\n* sleep\n3) budget (money)\n\nother") == ["sleep", "budget"]


def test_the_write_schema_lists_the_types_and_requires_one():
    policy = _policy()
    _, types = split_write_instruction(policy.write.signature.instructions)
    schema = response_format_for(typed_write_signature(policy.write.signature, types), "llama_cpp")
    entry = next(iter(schema["schema"]["$defs"].values()))
    assert entry["properties"]["type"]["enum"] == ["Diet and eating habits", "Pets", "other"]
    assert "type" in entry["required"]
    assert "null" not in json.dumps(entry["properties"]["type"])


def test_facts_of_no_listed_type_are_not_kept_and_the_write_reads_user_messages():
    updates = [
        {"type": "Pets", "label": "pets", "value": "a cat"},
        {"type": "other", "label": "sleep", "value": "insomnia"},
        {"label": "job", "value": "nurse"},  # no type stated: kept (older replies)
    ]
    lm = agent(updates=updates)
    policy = _policy()
    state = policy.initial_state()
    with agent_context(lm):
        state = policy.observe(
            state,
            [
                Message(role="user", content="We adopted a cat; I can't sleep."),
                Message(role="assistant", content="I've been tossing and turning too."),
            ],
        )
    (call,) = calls_for(lm, "updates")
    assert section(call.user, "messages") == "User: We adopted a cat; I can't sleep."
    assert [(e.label, e.value) for e in state.memory] == [("pets", "a cat"), ("job", "nurse")]
