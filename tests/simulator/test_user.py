"""The simulated user and the session loop, with scripted LMs."""

from __future__ import annotations

from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, sections, simulator_responder

from evolve.simulator.user import (
    SimulatedUser,
    derive_seed,
    format_persona,
    opening_message,
    play_session,
)
from memory_policies import NativePolicy


def play(rounds: int, simulator=simulator_responder, **overrides):
    simulator_lm = ScriptedLM(simulator, model="sim")
    agent_lm = ScriptedLM(agent_responder, model="agent")
    lms = scripted_role_lms(simulator=simulator_lm, agent=agent_lm)
    policy = NativePolicy()
    arguments = dict(
        policy=policy,
        state=policy.initial_state(),
        user=SimulatedUser(),
        lms=lms,
        session_index=0,
        session_time="2024-03-02",
        query="I switched to keto. Breakfast ideas?",
        exposed_states={"diet": "keto"},
        current_state={"diet": "keto", "city": "Paris", "pet": "cat"},
        persona="Ana, a 34-year-old nurse.",
        rounds=rounds,
        seed=7,
    )
    arguments.update(overrides)
    transcript, state = play_session(**arguments)
    return transcript, state, simulator_lm, agent_lm


def test_one_round_is_the_opening_query_and_the_reply_without_simulator_call():
    transcript, state, simulator_lm, agent_lm = play(rounds=1)
    assert simulator_lm.calls == []
    assert len(agent_lm.calls) == 1
    assert [m.role for m in transcript.messages] == ["user", "assistant"]
    assert (
        transcript.messages[0].content
        == "[Current Time: 2024-03-02]\nI switched to keto. Breakfast ideas?"
    )
    assert transcript.rounds_completed == transcript.rounds_planned == 1
    assert [m.content for m in state.short_term] == [m.content for m in transcript.messages]


def test_follow_ups_alternate_and_the_simulator_sees_profile_and_current_state():
    transcript, _, simulator_lm, agent_lm = play(rounds=3)
    assert len(simulator_lm.calls) == 2 and len(agent_lm.calls) == 3
    assert [m.role for m in transcript.messages] == ["user", "assistant"] * 3
    assert transcript.messages[2].content.startswith("Thanks. Any other tips")
    inputs = sections(simulator_lm.calls[0].user)
    assert "Ana, a 34-year-old nurse." in inputs["persona"]
    assert "diet: keto" in inputs["shared_facts"]
    # The rest of the current state is given (for consistency) as private, not as shared.
    assert "city: Paris" in inputs["private_facts"] and "pet: cat" in inputs["private_facts"]
    assert "diet" not in inputs["private_facts"]
    assert "Assistant: Noted, thanks." in inputs["last_exchange"]
    assert "never state or hint" in simulator_lm.calls[0].system
    # The second follow-up reacts to the latest exchange, not the first one.
    assert transcript.messages[2].content in sections(simulator_lm.calls[1].user)["last_exchange"]


def test_unparseable_follow_up_ends_the_session_and_is_counted():
    transcript, _, simulator_lm, _ = play(rounds=3, simulator=lambda call: "not json")
    assert len(simulator_lm.calls) == 1
    assert transcript.rounds_completed == 1 and transcript.rounds_planned == 3
    assert transcript.simulator_parse_failures == 1
    assert "unparseable" in transcript.ended_early
    assert len(transcript.messages) == 2  # no canned follow-up was invented


def test_empty_follow_up_ends_the_session_and_is_counted():
    transcript, _, _, _ = play(rounds=2, simulator=lambda call: {"message": "  "})
    assert transcript.simulator_parse_failures == 1
    assert transcript.ended_early == "simulator returned an empty message"


def test_helpers():
    assert opening_message("t", "q") == "[Current Time: t]\nq"
    assert derive_seed(1, "u", 2) == derive_seed(1, "u", 2) != derive_seed(1, "u", 3)
    assert format_persona({"formatted_str": "Ana"}) == "Ana"
    assert len(format_persona("x" * 5000)) <= 1500
