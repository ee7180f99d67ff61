"""Buffer rule: at update_every + short_term_len messages, the oldest update_every are written."""

from __future__ import annotations

import pytest
from mp_helpers import CountingEmbedder, agent, agent_context, calls_for, messages, section

from memory_policies import Message, build_policy

MEMORY_KINDS = ["in_context", "external", "raw_rag"]


def _written_batches(kind: str, lm, state) -> list[str]:
    """What went through `write`, as transcripts (raw_rag writes without an LLM)."""
    if kind == "raw_rag":
        return [m.text for m in state.memories]
    writes = calls_for(lm, "updates") + calls_for(lm, "operations")
    return [section(call.user, "messages") for call in writes]


def _updates(call):
    return [{"label": "topic", "value": section(call.user, "messages").replace("\n", " | ")}]


def _ops(call):
    return [{"action": "add", "id": 0, "text": section(call.user, "messages").replace("\n", " | ")}]


def _policy(kind: str, **params):
    spec = {"kind": kind, **params}
    return build_policy(spec, embedder=CountingEmbedder())


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_flush_exactly_at_update_every_plus_short_term_len(kind: str) -> None:
    policy = _policy(kind, update_every=2, short_term_len=3)
    lm = agent(updates=_updates, operations=_ops)
    state = policy.initial_state()
    with agent_context(lm):
        for message in messages(4):
            state = policy.observe(state, [message])
        assert _written_batches(kind, lm, state) == []
        assert [m.content for m in state.short_term] == ["m1", "m2", "m3", "m4"]

        state = policy.observe(state, messages(1, start=5))
    batches = _written_batches(kind, lm, state)
    assert batches == ["User: m1\nAssistant: m2"]
    assert [m.content for m in state.short_term] == ["m3", "m4", "m5"]
    assert len(state.short_term_times) == 3


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_short_term_len_zero_writes_every_batch(kind: str) -> None:
    policy = _policy(kind, update_every=1, short_term_len=0)
    lm = agent(updates=_updates, operations=_ops)
    state = policy.initial_state()
    with agent_context(lm):
        state = policy.observe(state, messages(3))
    assert state.short_term == []
    assert _written_batches(kind, lm, state) == ["User: m1", "Assistant: m2", "User: m3"]


@pytest.mark.parametrize("kind", MEMORY_KINDS)
def test_respond_adds_two_messages_and_flushes_in_order(kind: str) -> None:
    policy = _policy(kind, update_every=2, short_term_len=2)
    lm = agent(updates=_updates, operations=_ops)
    state = policy.initial_state()
    with agent_context(lm):
        reply, state = policy.respond(state, "hello")
        assert reply == "re: hello"
        assert [m.role for m in state.short_term] == ["user", "assistant"]
        _, state = policy.respond(state, "again")
    # 4 messages reached 2 + 2: the first exchange left the buffer.
    assert [m.content for m in state.short_term] == ["again", "re: again"]
    assert _written_batches(kind, lm, state) == ["User: hello\nAssistant: re: hello"]


def test_native_never_flushes_and_sees_whole_history() -> None:
    policy = build_policy("native")
    lm = agent()
    state = policy.initial_state()
    with agent_context(lm):
        for i in range(6):
            _, state = policy.respond(state, f"q{i}")
    assert len(state.short_term) == 12
    last = section(calls_for(lm, "reply")[-1].user, "conversation")
    assert last.startswith("User: q0\nAssistant: re: q0")
    assert "User: q4" in last
    assert "(no long-term memory" in policy.describe_memory(state)


def test_flushed_messages_keep_their_own_session_time() -> None:
    policy = _policy("in_context", update_every=2, short_term_len=2)
    lm = agent(updates=_updates)
    state = policy.initial_state()
    with agent_context(lm):
        state = policy.observe(
            state,
            [
                Message(role="user", content="[Current Time: 2024-01-01 09:00]\nfirst"),
                Message(role="assistant", content="ok"),
                Message(role="user", content="[Current Time: 2024-02-01 09:00]\nsecond"),
                Message(role="assistant", content="ok"),
            ],
        )
    assert state.current_time == "2024-02-01 09:00"
    # The batch pushed out by the February session was said in January.
    assert [e.time for e in state.memory] == ["2024-01-01 09:00"]
    assert state.short_term_times == ["2024-02-01 09:00", "2024-02-01 09:00"]
