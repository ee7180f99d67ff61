"""State is explicit data: JSON round-trips, `answer` is read-only, failures are counted."""

from __future__ import annotations

import json

import pytest
from mp_helpers import CountingEmbedder, Raw, agent, agent_context, calls_for, section

from memory_policies import Message, PolicyError, build_policy
from memory_policies.common import MEMORY_LABEL_MAX_CHARS, MEMORY_TEXT_MAX_CHARS

ALL_KINDS = ["native", "in_context", "external", "raw_rag"]


def _updates(call):
    last = section(call.user, "messages").splitlines()[0]
    return [{"label": last.split()[-1], "value": last}]


def _ops(call):
    return [{"action": "add", "id": 0, "text": section(call.user, "messages").splitlines()[0]}]


def _busy_state(policy, lm, turns: int = 5):
    state = policy.initial_state()
    with agent_context(lm):
        for i in range(turns):
            prefix = f"[Current Time: 2024-03-0{i + 1} 10:00]\n" if i % 2 == 0 else ""
            _, state = policy.respond(state, f"{prefix}I like topic{i}")
    return state


def _policy(kind: str, embedder=None):
    return build_policy(
        {"kind": kind}
        if kind == "native"
        else {"kind": kind, "update_every": 2, "short_term_len": 2},
        embedder=embedder or CountingEmbedder(),
    )


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_state_json_round_trip_continues_identically(kind: str) -> None:
    embedder = CountingEmbedder()
    policy = _policy(kind, embedder)
    lm = agent(updates=_updates, operations=_ops)
    state = _busy_state(policy, lm)
    if kind != "native":
        assert policy.describe_memory(state) != "(empty)"

    restored = policy.state_from_json(state.model_dump_json())
    assert restored == state
    assert policy.state_from_json(json.loads(state.model_dump_json())) == state

    embedded_before = len(embedder.texts)
    with agent_context(lm):
        reply_a, next_a = policy.respond(state, "what do I like?")
        reply_b, next_b = policy.respond(restored, "what do I like?")
    assert (reply_a, next_a) == (reply_b, next_b)
    if kind in ("external", "raw_rag"):
        # The queries and the newly written batch were embedded, never a stored memory again.
        new_texts = embedder.texts[embedded_before:]
        assert new_texts.count("what do I like?") == 2
        assert not set(new_texts) & {m.text for m in state.memories}


def test_state_of_another_kind_is_refused() -> None:
    native, in_context = _policy("native"), _policy("in_context")
    with pytest.raises(PolicyError, match="kind 'native' cannot be used with a 'in_context'"):
        in_context.state_from_json(native.initial_state().model_dump_json())
    with pytest.raises(PolicyError, match="needs a InContextState"):
        in_context.respond(native.initial_state(), "hi")
    with pytest.raises(PolicyError, match="not valid JSON"):
        in_context.state_from_json("{")


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_answer_is_read_only(kind: str) -> None:
    policy = _policy(kind)
    lm = agent(updates=_updates, operations=_ops, choice=2)
    state = _busy_state(policy, lm)
    snapshot = state.model_dump_json()
    with agent_context(lm):
        free = policy.answer(state, "what do I like?")
        chosen = policy.answer(state, "pick one", ["a", "b", "c"])
    assert free.text == "re: what do I like?" and free.choice is None and free.parse_error is None
    assert chosen.choice == 2 and chosen.parse_error is None
    assert state.model_dump_json() == snapshot

    # Even failures, which `respond` would count, leave the caller's state alone.
    broken = agent(reply=Raw("not json"), choice=Raw("nope"))
    with agent_context(broken):
        assert policy.answer(state, "what?").parse_error
        assert policy.answer(state, "pick", ["a", "b"]).parse_error
    assert state.model_dump_json() == snapshot


def test_respond_never_mutates_the_passed_state() -> None:
    policy = _policy("in_context")
    lm = agent(updates=_updates)
    state = policy.initial_state()
    with agent_context(lm):
        _, new_state = policy.respond(state, "hello")
    assert state.short_term == [] and len(new_state.short_term) == 2


@pytest.mark.parametrize(
    ("choice", "expected", "error"),
    [(3, 3, None), (0, None, "1..3"), (4, None, "1..3"), (Raw('{"choice": "x"}'), None, "parse")],
)
def test_multiple_choice_answers(choice, expected, error) -> None:
    policy = _policy("in_context")
    lm = agent(choice=choice)
    with agent_context(lm):
        result = policy.answer(policy.initial_state(), "which?", ["red", "green", "blue"])
    assert result.choice == expected
    if error is None:
        assert result.parse_error is None
    else:
        assert error in result.parse_error.lower()
    (call,) = calls_for(lm, "choice")
    assert section(call.user, "options") == "1. red\n2. green\n3. blue"


def test_parse_failures_are_counted_and_memory_kept() -> None:
    policy = _policy("in_context")
    good = agent(updates=[{"label": "food", "value": "pasta"}])
    state = policy.initial_state()
    with agent_context(good):
        state = policy.observe(state, [Message(role="user", content="x")] * 4)
    assert [e.value for e in state.memory] == ["pasta"]

    bad = agent(updates=Raw("I cannot do JSON"), reply=Raw("plain words, no json"))
    with agent_context(bad):
        reply, state = policy.respond(state, "hi")
        reply2, state = policy.respond(state, "hi again")
    assert reply == "" and reply2 == ""
    assert state.parse_failures == {"use": 2, "write": 2}
    assert [e.value for e in state.memory] == ["pasta"]
    # The failed reply still happened in the conversation.
    assert state.short_term[-1] == Message(role="assistant", content="")


@pytest.mark.parametrize("kind", ["in_context", "external"])
def test_long_memory_texts_are_clipped_not_rejected(kind: str) -> None:
    # A small model looping inside a value, from an endpoint without constrained decoding:
    # the write still lands, clipped to the schema's maxLength, and is no parse failure.
    rambling = "It is a great way to relax and unwind. " * 40
    policy = _policy(kind)
    lm = agent(
        updates=[{"label": "relaxation " * 20, "value": rambling}],
        operations=[{"action": "add", "id": 0, "text": rambling}],
    )
    state = policy.initial_state()
    with agent_context(lm):
        state = policy.observe(state, [Message(role="user", content="x")] * 4)
    stored = (
        [e.value for e in state.memory]
        if kind == "in_context"
        else [m.text for m in state.memories]
    )
    assert stored == [rambling[:MEMORY_TEXT_MAX_CHARS]]
    assert state.parse_failures == {}
    if kind == "in_context":
        assert len(state.memory[0].label) <= MEMORY_LABEL_MAX_CHARS
