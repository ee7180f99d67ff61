"""`in_context_quotes`: the write files the user's new statements, verbatim, under the most
similar listed type (no LLM call), one entry per write and type, each type keeping its newest."""

from __future__ import annotations

import json

import pytest
from mp_helpers import CountingEmbedder, agent, agent_context

from memory_policies import Message, PolicyError, build_policy
from memory_policies.in_context_quotes import (
    ENTRIES_PER_SLOT,
    filing_slots,
    repeats,
    type_items,
    user_sentences,
)

# Lexical test embedder: a sentence goes to the type whose line shares its words. Each line
# describes one fact (no list after the name), so each is one slot.
TYPES = "1. Diet: meals food cooking\n2. Pets (cat dog animals at home)"


def _policy(embedder: CountingEmbedder | None = None):
    policy = build_policy(
        {"kind": "in_context_quotes", "update_every": 1, "short_term_len": 0},
        embedder=embedder or CountingEmbedder(dim=512),
    )
    return policy.with_components({"write.types_to_remember": TYPES})


def _said(text: str) -> Message:
    return Message(role="user", content=f"[Current Time: 2020-10-01 20:00:00]\n{text}")


def _filed(state) -> list[tuple[str, str]]:
    return [(entry.label, entry.value) for entry in state.memory]


def test_type_names_items_and_sentences():
    assert list(type_items(TYPES)) == ["Diet", "Pets"]
    assert type_items(TYPES)["Pets"] == "Pets (cat dog animals at home)"
    assert list(type_items("- sleep\n* sleep\n3) budget: money\n")) == ["sleep", "budget"]
    assert user_sentences(
        [_said("We adopted a cat. Any tips?"), Message(role="assistant", content="Sure. Do X.")]
    ) == ["We adopted a cat."]


def test_a_line_listing_facts_is_one_slot_per_fact():
    listed = "1. Family: children, pets and partner\n2. Travel (style; how often)\n3. Work"
    assert filing_slots(listed) == {
        "Family (children)": "Family: children",
        "Family (pets and partner)": "Family: pets and partner",
        "Travel (style)": "Travel: style",
        "Travel (how often)": "Travel: how often",
        "Work": "Work",
    }
    # One description is one slot, named by the line's name and matched by the whole line.
    assert filing_slots("- Diet: what I eat") == {"Diet": "Diet: what I eat"}
    assert filing_slots("1. Health: sleep, and stress") == {
        "Health (sleep)": "Health: sleep",
        "Health (stress)": "Health: stress",
    }


def test_each_listed_fact_keeps_its_own_entries():
    # Under one "Pets" line, the cat's statements would push the dog's out; one slot per fact
    # keeps both.
    policy = _policy().with_components({"write.types_to_remember": "1. Pets: cat, dog"})
    state = policy.initial_state()
    for said in ("Our dog is old.", "The cat sleeps.", "The cat hunts."):
        state = policy.observe(state, [_said(said)])
    assert _filed(state) == [("Pets (dog)", "Our dog is old."), ("Pets (cat)", "The cat hunts.")]


def test_greetings_thanks_and_reactions_are_not_statements():
    said = _said("Hi! Thanks a lot! We adopted a cat last week. Thank you for the tips!")
    assert user_sentences([said]) == ["We adopted a cat last week."]
    # The simulated user's reactions to advice (as the bundled 1.5B writes them).
    reactions = (
        "I appreciate your advice. That sounds like a good plan. I'll definitely try those "
        "snacks. I'm glad you found that helpful! Sounds useful, thanks. Quick update on my "
        "side. A few things have changed lately."
    )
    assert user_sentences([_said(reactions)]) == []
    # A short fact is a statement, and so is a long sentence opening like a reaction.
    assert user_sentences([_said("Hello! I'm vegan now.")]) == ["I'm vegan now."]
    long = "Thanks, but I have been vegan since my doctor told me so last spring."
    assert user_sentences([_said(long)]) == [long]


def test_statements_go_verbatim_under_the_nearest_type_without_an_llm_call():
    lm = agent()
    policy = _policy()
    with agent_context(lm):
        state = policy.observe(
            policy.initial_state(), [_said("We adopted a cat. I cook all my meals. Any tips?")]
        )
    assert _filed(state) == [("Pets", "We adopted a cat."), ("Diet", "I cook all my meals.")]
    assert lm.calls == []


def test_each_slot_keeps_its_newest_entry_and_one_write_is_one_entry():
    policy = _policy()
    state = policy.initial_state()
    for said in ("We adopted a cat.", "The cat sleeps all day.", "A dog joined the cat."):
        state = policy.observe(state, [_said(said)])
    assert ENTRIES_PER_SLOT == 1
    assert _filed(state) == [("Pets", "A dog joined the cat.")]
    state = policy.observe(state, [_said("The dog barks. The cat hides.")])
    assert _filed(state) == [("Pets", "The dog barks. The cat hides.")]


def test_a_statement_repeating_the_previous_reply_or_memory_is_not_filed():
    policy = _policy()
    state = policy.observe(policy.initial_state(), [_said("We adopted a cat.")])
    reply = "Cook simple meals with fresh food and keep the cat away from the kitchen."
    state = policy.observe(state, [Message(role="assistant", content=reply)])
    # The next write holds the role-confused follow-up: it copies the reply, and repeats a
    # sentence memory holds; only the new fact is filed.
    state = policy.observe(
        state,
        [_said("Cook simple meals with fresh food. We adopted a cat. I eat no meat at meals.")],
    )
    assert _filed(state) == [("Pets", "We adopted a cat."), ("Diet", "I eat no meat at meals.")]
    assert repeats("I'll cook simple meals with fresh food.", reply)
    assert not repeats("I cook every meal from scratch.", reply)


def test_the_previous_reply_survives_a_checkpoint():
    policy = _policy()
    state = policy.observe(policy.initial_state(), [Message(role="assistant", content="Eat fish.")])
    restored = type(state).model_validate(json.loads(json.dumps(state.model_dump())))
    assert restored.previous_reply == "Eat fish."
    assert _filed(policy.observe(restored, [_said("Eat fish.")])) == []


def test_the_read_shows_the_top_k_entries_nearest_the_query_in_memory_order():
    lm = agent()
    policy = _policy()
    state = policy.initial_state()
    for said in ("We adopted a cat.", "I cook all my meals."):
        state = policy.observe(state, [_said(said)])
    assert policy.top_k == 1
    with agent_context(lm):
        answer = policy.answer(state, "Which animals: a cat or a dog?", ["cat", "dog"])
        wide = policy.with_parameters(top_k=2).answer(state, "Which animals?", ["cat", "dog"])
    assert answer.retrieved == ["Pets: We adopted a cat."]
    assert "We adopted a cat." in lm.calls[0].text
    assert "I cook all my meals." not in lm.calls[0].text
    # Shown every entry when top_k reaches their number, oldest write first.
    assert wide.retrieved == ["Pets: We adopted a cat.", "Diet: I cook all my meals."]


def test_the_options_are_part_of_the_reads_query():
    lm = agent()
    policy = _policy()
    state = policy.initial_state()
    for said in ("We adopted a cat.", "I cook all my meals."):
        state = policy.observe(state, [_said(said)])
    with agent_context(lm):
        # The question alone names neither entry; its options name the cook's.
        answer = policy.answer(state, "Which fits me now?", ["cook all my meals", "eat out"])
    assert answer.retrieved == ["Diet: I cook all my meals."]


def test_the_types_list_and_use_are_the_components():
    policy = _policy()
    assert set(policy.components()) == {"write.types_to_remember", "use"}
    narrowed = policy.with_components({"write.types_to_remember": "1. Pets: cat"})
    state = narrowed.observe(narrowed.initial_state(), [_said("I cook all my meals.")])
    assert _filed(state) == [("Pets", "I cook all my meals.")]  # the only listed type
    with pytest.raises(PolicyError):
        policy.with_components({"write": "Remember everything."})


def test_no_paper_variant():
    with pytest.raises(PolicyError, match="no paper variant"):
        build_policy("in_context_quotes:variant=paper")
