"""`in_context_quotes`: the write sorts the user's statements by the types list; each is kept
verbatim under its type, one entry per write and type, each type keeping its newest."""

from __future__ import annotations

import json

import pytest
from mp_helpers import agent, agent_context, calls_for, section

from evolve.llm.adapter import response_format_for
from memory_policies import Message, PolicyError, build_policy
from memory_policies.in_context_quotes import (
    ENTRIES_PER_TYPE,
    _sort_signature,
    sentence_key,
    type_names,
    user_sentences,
)

TYPES = "1. Diet and eating habits\n2. Pets (animals at home)"


def _policy():
    policy = build_policy({"kind": "in_context_quotes", "update_every": 1, "short_term_len": 0})
    return policy.with_components({"write.types_to_remember": TYPES})


def _sorted(*types: str) -> dict[str, str]:
    """The write's reply: the type of each sentence, in order."""
    return {sentence_key(i): kind for i, kind in enumerate(types, start=1)}


def _said(text: str) -> Message:
    return Message(role="user", content=f"[Current Time: 2020-10-01 20:00:00]\n{text}")


def test_type_names_and_sentences():
    assert type_names(TYPES) == ["Diet and eating habits", "Pets"]
    assert type_names("- sleep\n* sleep\n3) budget: money\n") == ["sleep", "budget"]
    assert user_sentences(
        [_said("We adopted a cat. Any tips?"), Message(role="assistant", content="Sure. Do X.")]
    ) == ["We adopted a cat."]


def test_greetings_and_thanks_are_not_statements():
    said = _said("Hi! Thanks a lot! We adopted a cat last week. Thank you for the tips!")
    assert user_sentences([said]) == ["We adopted a cat last week.", "Thank you for the tips!"]
    # A short fact is a statement.
    assert user_sentences([_said("Hello! I'm vegan now.")]) == ["I'm vegan now."]


def test_the_schema_asks_one_listed_type_per_sentence():
    schema = response_format_for(_sort_signature(("Diet", "Pets"), 3), "llama_cpp")["schema"]
    (per_sentence,) = schema["$defs"].values()
    assert per_sentence["required"] == ["sentence_1", "sentence_2", "sentence_3"]
    assert per_sentence["additionalProperties"] is False
    for key in per_sentence["required"]:
        assert per_sentence["properties"][key]["enum"] == ["Diet", "Pets"]


def test_sorted_sentences_are_kept_verbatim_and_each_type_keeps_its_newest_entries():
    replies = iter(
        [
            _sorted("Pets", "Diet and eating habits", "Diet and eating habits"),
            _sorted("Pets"),
            _sorted("Pets"),
        ]
    )
    lm = agent(types=lambda call: next(replies))
    policy = _policy()
    state = policy.initial_state()
    with agent_context(lm):
        state = policy.observe(
            state, [_said("We adopted a cat. I sleep badly these days. I eat no meat.")]
        )
        state = policy.observe(state, [Message(role="assistant", content="Nice cat!")])
        state = policy.observe(state, [_said("The cat went to my sister. Dinner ideas?")])
        state = policy.observe(state, [_said("Thanks for the tips!")])  # misfiled small talk
    first, second, _ = calls_for(lm, "types")
    assert section(first.user, "sentences") == (
        "1. We adopted a cat.\n2. I sleep badly these days.\n3. I eat no meat."
    )
    # A type keeps its ENTRIES_PER_TYPE newest entries: the misfiled small talk did not push
    # out the fact it came after, and the oldest pets entry went.
    assert ENTRIES_PER_TYPE == 2
    assert [(e.label, e.value) for e in state.memory] == [
        # One entry per write and type.
        ("Diet and eating habits", "I sleep badly these days. I eat no meat."),
        ("Pets", "The cat went to my sister."),
        ("Pets", "Thanks for the tips!"),
    ]
    assert len(calls_for(lm, "types")) == 3  # the assistant's message alone: no write


def test_an_unparseable_sort_is_counted_and_memory_unchanged():
    from mp_helpers import Raw

    lm = agent(types=Raw("not json"))
    policy = _policy()
    with agent_context(lm):
        state = policy.observe(policy.initial_state(), [_said("We adopted a cat.")])
    assert state.memory == [] and state.parse_failures.get("write") == 1
    assert json.dumps(state.model_dump())  # still a JSON-serializable state


def test_a_reply_that_leaves_a_sentence_unsorted_is_a_counted_parse_failure():
    lm = agent(types=_sorted("Pets"))  # two statements, one type
    policy = _policy()
    with agent_context(lm):
        state = policy.observe(
            policy.initial_state(), [_said("We adopted a cat. I eat fish every day.")]
        )
    assert state.memory == [] and state.parse_failures.get("write") == 1


def test_no_paper_variant():
    with pytest.raises(PolicyError, match="no paper variant"):
        build_policy("in_context_quotes:variant=paper")
