"""Every policy on the real embedded model (run by the lead: starts the llama.cpp server)."""

from __future__ import annotations

from typing import Any

import pytest

from memory_policies import build_policy

pytestmark = pytest.mark.integration

TURNS = [
    "[Current Time: 2024-05-01 19:00]\nHi! I became vegetarian last month. Any quick dinner idea?",
    "Thanks. I also just started learning the piano, practising every evening.",
]


def _stored_by(kind: str, prediction: Any) -> set[str]:
    """What a write's parsed output asks the store to hold (the policy's own filtering)."""
    if kind == "in_context":
        return {
            u.label.strip().casefold()
            for u in prediction.updates
            if u.label.strip() and u.value.strip()
        }
    return {
        op.text.strip() for op in prediction.operations if op.action != "delete" and op.text.strip()
    }


def _stored_in(kind: str, state: Any) -> set[str]:
    if kind == "in_context":
        return {entry.label.casefold() for entry in state.memory}
    return {memory.text for memory in state.memories}


@pytest.mark.parametrize("kind", ["native", "in_context", "external", "raw_rag"])
def test_policy_converses_remembers_and_answers(
    role_lms_embedded, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = "native" if kind == "native" else f"{kind}:update_every=2,short_term_len=2"
    policy = build_policy(spec)
    writes: list[tuple[dict[str, Any], Any]] = []
    predict = policy._predict

    def record(state, component, predictor, **inputs):
        prediction = predict(state, component, predictor, **inputs)
        if component == "write":
            writes.append((inputs, prediction))
        return prediction

    monkeypatch.setattr(policy, "_predict", record)
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
    if kind == "native":
        assert writes == []
        return
    if kind == "raw_rag":
        # No LLM in the write: the first exchange is stored as it was said.
        assert "vegetarian" in policy.describe_memory(state)
        return
    # The first exchange left the buffer (4 messages = 2 + 2) and went to one write call,
    # and the memory holds exactly what the model's parsed write asked for: whether a 0.5B
    # model judges a fact worth keeping differs between CPUs; the plumbing must not.
    assert len(writes) == 1
    inputs, prediction = writes[0]
    assert "vegetarian" in inputs["messages"] and "piano" not in inputs["messages"]
    assert prediction is not None
    assert _stored_in(kind, state) == _stored_by(kind, prediction)
