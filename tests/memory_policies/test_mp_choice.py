"""The `evolve` variant's multiple-choice prompt: two plain messages, no DSPy field framing,
the reply constrained and parsed as JSON."""

from __future__ import annotations

import dspy
from mp_helpers import agent, agent_context
from scripted_lm import ScriptedCall, ScriptedLM

from memory_policies import Message, build_policy
from memory_policies.choice import LeanChoiceAdapter
from memory_policies.common import DEFAULT_MEMORY_USE, MemoryChoose


def _format(**inputs: str) -> list[dict]:
    signature = MemoryChoose.with_instructions("Use what you remember.")
    return LeanChoiceAdapter().format(signature, [], inputs)


def test_system_holds_instruction_and_memory_user_holds_question_options_request():
    system, user = _format(
        memory="- [2020-10-01] Diet: I'm vegan now.",
        conversation="(no messages)",
        question="What should I cook tonight?",
        options="1. steak\n2. tofu stir-fry",
    )
    assert system == {
        "role": "system",
        "content": "Use what you remember.\n\nWhat you remember about the user, oldest first:\n"
        "- [2020-10-01] Diet: I'm vegan now.",
    }
    assert user["role"] == "user"
    assert user["content"] == (
        "What should I cook tonight?\n\nOptions:\n1. steak\n2. tofu stir-fry\n\n"
        'Answer with the number of the single best option, as JSON {"choice": n}.'
    )


def test_recent_messages_shown_when_there_are_some():
    system, _ = _format(
        memory="(empty)", conversation="User: I moved to Lisbon.", question="q", options="1. a"
    )
    assert system["content"].endswith("Recent messages, oldest first:\nUser: I moved to Lisbon.")


def test_policy_answer_sends_two_plain_messages_and_parses_the_json_choice():
    lm = agent(choice=2)
    policy = build_policy({"kind": "in_context", "update_every": 1, "short_term_len": 2})
    state = policy.initial_state()
    state.memory = []
    with agent_context(lm):
        answer = policy.answer(state, "Which breakfast?", ["eggs", "oats", "toast"])
    assert answer.choice == 2 and answer.parse_error is None
    (call,) = lm.calls
    assert [m["role"] for m in call.messages] == ["system", "user"]
    assert "[[ ##" not in call.text and "Your input fields" not in call.text
    assert call.messages[0]["content"].startswith(DEFAULT_MEMORY_USE)
    assert "1. eggs\n2. oats\n3. toast" in call.messages[1]["content"]


def test_an_unparseable_choice_is_counted_not_replaced():
    lm = ScriptedLM(lambda call: "I think oats")
    policy = build_policy({"kind": "in_context", "update_every": 1, "short_term_len": 2})
    with agent_context(lm):
        answer = policy.answer(policy.initial_state(), "Which breakfast?", ["eggs", "oats"])
    assert answer.choice is None and answer.parse_error
    assert answer.text == "I think oats"


def test_the_ambient_adapter_sets_the_response_format():
    seen: list[dict] = []

    class Ambient(dspy.JSONAdapter):
        def _prepare_response_format(self, lm, lm_kwargs, signature):
            lm_kwargs["response_format"] = {"type": "json_object", "marker": True}

    def respond(call: ScriptedCall) -> dict:
        seen.append(call.settings)
        return {"choice": 1}

    lm = ScriptedLM(respond)
    policy = build_policy({"kind": "in_context", "update_every": 1, "short_term_len": 2})
    state = policy.observe(policy.initial_state(), [Message(role="user", content="hi")])
    with dspy.context(lm=lm, adapter=Ambient()):
        assert policy.answer(state, "q?", ["a", "b"]).choice == 1
    assert seen[0]["response_format"] == {"type": "json_object", "marker": True}
