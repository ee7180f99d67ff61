"""Every policy on the real embedded model (run by the lead: starts the llama.cpp server)."""

from __future__ import annotations

import pytest

from memory_policies import build_policy

pytestmark = pytest.mark.integration

TURNS = [
    "[Current Time: 2024-05-01 19:00]\nHi! I became vegetarian last month. Any quick dinner idea?",
    "Thanks. I also just started learning the piano, practising every evening.",
]


@pytest.mark.parametrize("kind", ["native", "in_context", "external", "raw_rag"])
def test_policy_converses_remembers_and_answers(role_lms_embedded, kind: str) -> None:
    spec = "native" if kind == "native" else f"{kind}:update_every=2,short_term_len=2"
    policy = build_policy(spec)
    state = policy.initial_state()
    with role_lms_embedded.context("agent"):
        for message in TURNS:
            reply, state = policy.respond(state, message)
            assert reply.strip(), f"empty reply; parse failures: {state.parse_failures}"
            assert len(reply.split()) < 150  # the fixed "at most 3 sentences" guidance
        result = policy.answer(
            state, "What should I cook for dinner tonight?", ["A beef steak", "A vegetable curry"]
        )
        free = policy.answer(state, "Which instrument am I learning?")
    assert result.parse_error is None and result.choice in (1, 2)
    assert free.text.strip()
    assert state.parse_failures.get("write", 0) == 0
    if kind != "native":
        # The first exchange left the buffer (4 messages = 2 + 2) and was written.
        assert policy.describe_memory(state) != "(empty)"
