"""Every policy on the real embedded model (run by the lead: starts the llama.cpp server)."""

from __future__ import annotations

from typing import Any

import dspy
import pytest
from dspy.utils.callback import BaseCallback

from memory_policies import build_policy

pytestmark = pytest.mark.integration

TURNS = [
    "[Current Time: 2024-05-01 19:00]\nHi! I became vegetarian last month. Any quick dinner idea?",
    "Thanks. I also just started learning the piano, practising every evening.",
]


class WriteRecorder(BaseCallback):
    """Records the inputs and parsed output of every call of the policy's write predictor."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.calls: list[tuple[dict[str, Any], Any]] = []
        self._started: dict[str, dict[str, Any]] = {}

    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if instance is getattr(self.policy, "write", None):
            # DSPy passes the call's bound arguments: Predict's fields are in its **kwargs.
            self._started[call_id] = inputs.get("kwargs", inputs)

    def on_module_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        if call_id in self._started:
            self.calls.append((self._started.pop(call_id), None if exception else outputs))


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
def test_policy_converses_remembers_and_answers(role_lms_embedded, kind: str) -> None:
    spec = "native" if kind == "native" else f"{kind}:update_every=2,short_term_len=2"
    policy = build_policy(spec)
    writes = WriteRecorder(policy)
    state = policy.initial_state()
    with role_lms_embedded.context("agent"), dspy.context(callbacks=[writes]):
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
        return  # no long-term memory: its _write raises if a flush ever reaches it
    if kind == "raw_rag":
        # No LLM in the write: the first exchange is stored as it was said.
        assert "vegetarian" in policy.describe_memory(state)
        return
    # The first exchange left the buffer (4 messages = 2 + 2) and went to one write call,
    # and the memory holds exactly what the model's parsed write asked for: whether a 0.5B
    # model judges a fact worth keeping differs between CPUs; the plumbing must not.
    assert len(writes.calls) == 1
    inputs, prediction = writes.calls[0]
    assert "vegetarian" in inputs["messages"] and "piano" not in inputs["messages"]
    assert prediction is not None
    assert _stored_in(kind, state) == _stored_by(kind, prediction)
