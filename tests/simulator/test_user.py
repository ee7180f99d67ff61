"""The simulated user and the session loop, with scripted LMs."""

from __future__ import annotations

import json

from scripted_lm import ScriptedLM, scripted_role_lms, user_turn
from simulator.eval_helpers import (
    agent_responder,
    make_environment,
    output_fields,
    sections,
    simulator_responder,
)

from evolve.simulator.user import (
    PaperUserView,
    SimulatedUser,
    StateAwareUserView,
    derive_seed,
    format_persona,
    opening_message,
    play_session,
    reply_opening,
    user_view_for,
)
from memory_policies import NativePolicy
from memory_policies.common import REPLY_MAX_TOKENS


def state_aware_view(
    exposed_states=None, current_state=None, persona="Ana, a 34-year-old nurse."
) -> StateAwareUserView:
    return StateAwareUserView.of(
        persona=persona,
        exposed_states=exposed_states or {"diet": "keto"},
        current_state=current_state or {"diet": "keto", "city": "Paris", "pet": "cat"},
    )


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
        view=state_aware_view(),
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


def distinct_follow_ups():
    """A simulated user whose follow-ups differ each round (the same one twice is a
    self-repeat, which is asked again)."""
    follow_ups = iter(
        ["Thanks. Any other tips about keto breakfasts?", "Could I prepare them the night before?"]
    )
    return lambda call: user_turn(next(follow_ups))


def test_follow_ups_alternate_and_the_simulator_sees_profile_and_current_state():
    transcript, _, simulator_lm, agent_lm = play(rounds=3, simulator=distinct_follow_ups())
    assert len(simulator_lm.calls) == 2 and len(agent_lm.calls) == 3
    assert [m.role for m in transcript.messages] == ["user", "assistant"] * 3
    assert transcript.messages[2].content.startswith("Thanks. Any other tips")
    inputs = sections(simulator_lm.calls[0].user)
    assert "Ana, a 34-year-old nurse." in inputs["persona"]
    assert "diet: keto" in inputs["facts_you_may_mention"]
    # The rest of the current state is given (for consistency) as private, not as shared.
    private = inputs["facts_to_keep_private"]
    assert "city: Paris" in private and "pet: cat" in private and "diet" not in private
    # The user's own request without its time header, and the assistant's reply.
    assert inputs["your_request"] == "I switched to keto. Breakfast ideas?"
    assert inputs["assistant_reply"] == "Noted, thanks."
    assert "never mention or hint" in simulator_lm.calls[0].system
    # The second follow-up reacts to the latest exchange, not the first one.
    assert sections(simulator_lm.calls[1].user)["your_request"] == transcript.messages[2].content


def test_the_follow_up_is_the_reaction_then_the_question():
    simulator = lambda call: {"reaction": "Eggs bore me.", "question": "Anything sweet?"}  # noqa: E731
    transcript, _, _, _ = play(rounds=2, simulator=simulator)
    assert transcript.messages[2].content == "Eggs bore me. Anything sweet?"


def test_the_follow_up_sees_only_the_opening_of_a_long_reply():
    # Shown whole, a long reply was copied by the bundled models; its first sentences suffice
    # to react to.
    long_reply = "Try eggs. Or chia pudding. Avocado toast is keto too. " + "More ideas. " * 60
    agent = ScriptedLM(lambda call: {"reply": long_reply}, model="agent")
    simulator_lm = ScriptedLM(simulator_responder, model="sim")
    play(rounds=2, lms=scripted_role_lms(simulator=simulator_lm, agent=agent))
    assert sections(simulator_lm.calls[0].user)["assistant_reply"] == "Try eggs. Or chia pudding."
    assert reply_opening("x" * 500).endswith("...") and len(reply_opening("x" * 500)) == 300


def test_evolve_follow_ups_are_capped_like_replies_and_paper_ones_are_not():
    _, _, simulator_lm, _ = play(rounds=2)
    assert simulator_lm.calls[0].settings["max_tokens"] == REPLY_MAX_TOKENS
    assert simulator_lm.calls[0].settings["seed"] == derive_seed(7, 0, 0)  # still sent with it
    _, paper_simulator = paper_play(rounds=2)
    assert paper_simulator.calls[0].settings["max_tokens"] == paper_simulator.kwargs["max_tokens"]
    assert paper_simulator.kwargs["max_tokens"] > REPLY_MAX_TOKENS


def test_unparseable_follow_up_ends_the_session_and_is_counted():
    transcript, _, simulator_lm, _ = play(rounds=3, simulator=lambda call: "not json")
    assert len(simulator_lm.calls) == 1
    assert transcript.rounds_completed == 1 and transcript.rounds_planned == 3
    assert transcript.simulator_parse_failures == 1
    assert "unparseable" in transcript.ended_early
    assert len(transcript.messages) == 2  # no canned follow-up was invented


def test_empty_follow_up_ends_the_session_and_is_counted():
    transcript, _, _, _ = play(rounds=2, simulator=lambda call: user_turn("  "))
    assert transcript.simulator_parse_failures == 1
    assert transcript.ended_early == "simulator returned an empty message"


def test_helpers():
    assert opening_message("t", "q") == "[Current Time: t]\nq"
    assert derive_seed(1, "u", 2) == derive_seed(1, "u", 2) != derive_seed(1, "u", 3)
    assert format_persona({"formatted_str": "Ana"}) == "Ana"
    assert len(format_persona("x" * 5000)) <= 1500


# ----- protocol = "paper": the reference code's information flow ------------------------------

PAPER_SCHEMA = {"diet": ["vegan", "keto"], "city": ["Paris", "Oslo"], "pet": ["cat", "dog"]}
PAPER_VIEW = PaperUserView(
    profile="Ana, a 34-year-old nurse who likes hiking.",
    profile_date="2024-01-01",
    current_date="2024-03-31",
    state_schema=PAPER_SCHEMA,
)


def numbered_agent():
    """An agent whose n-th reply is 'Reply number n.' (to tell the messages apart)."""
    count = 0

    def respond(call):
        nonlocal count
        count += 1
        fields = output_fields(call.system)
        return {name: f"Reply number {count}." for name in fields}

    return respond


def paper_play(rounds: int, **overrides):
    simulator_lm = ScriptedLM(lambda call: user_turn("And what about lunch?"), model="sim")
    agent_lm = ScriptedLM(numbered_agent(), model="agent")
    lms = scripted_role_lms(simulator=simulator_lm, agent=agent_lm)
    policy = NativePolicy()
    arguments = dict(
        policy=policy,
        state=policy.initial_state(),
        user=SimulatedUser(),
        lms=lms,
        session_index=0,
        session_time="2024-03-02",
        query="I need new breakfast ideas.",
        exposed_states={"diet": "keto"},
        view=PAPER_VIEW,
        rounds=rounds,
        seed=7,
    )
    arguments.update(overrides)
    transcript, _ = play_session(**arguments)
    return transcript, simulator_lm


def test_paper_user_sees_profile_end_date_opening_last_two_messages_and_the_schema_only():
    transcript, simulator_lm = paper_play(rounds=3)
    assert len(simulator_lm.calls) == 2
    first, second = (sections(call.user) for call in simulator_lm.calls)
    assert set(first) == {
        "profile",
        "profile_date",
        "current_date",
        "opening_message",
        "recent_messages",
        "tracked_schema",
    }
    assert first["profile"].strip() == PAPER_VIEW.profile
    assert first["profile_date"].strip() == "2024-01-01"
    assert first["current_date"].strip() == "2024-03-31"  # the period's end, not the session's
    opening = "[Current Time: 2024-03-02]\nI need new breakfast ideas."
    assert first["opening_message"].strip() == opening
    assert json.loads(first["tracked_schema"]) == PAPER_SCHEMA
    # Only the last two messages: the second follow-up sees round 2, never round 1's reply.
    assert first["recent_messages"].strip() == (
        "User: [Current Time: 2024-03-02]\nI need new breakfast ideas.\nAssistant: Reply number 1."
    )
    assert second["recent_messages"].strip() == (
        "User: And what about lunch?\nAssistant: Reply number 2."
    )
    assert "Reply number 1." not in simulator_lm.calls[1].text
    instructions = simulator_lm.calls[0].system
    assert "never disclose or hint" in instructions
    assert "Never restate what `opening_message` already said" in instructions
    assert [m.role for m in transcript.messages] == ["user", "assistant"] * 3


def test_paper_user_prompt_is_blind_to_the_state_values():
    _, keto = paper_play(rounds=2)
    _, vegan = paper_play(rounds=2, exposed_states={"diet": "vegan", "city": "Oslo"})
    # The same prompt whatever the current and exposed state: no state value reaches it.
    assert [call.messages for call in keto.calls] == [call.messages for call in vegan.calls]
    outside_schema = sections(keto.calls[0].user)
    del outside_schema["tracked_schema"]
    for value in ("keto", "Paris", "cat"):
        assert all(value not in text for text in outside_schema.values())
    assert "shared_facts" not in keto.calls[0].text and "private_facts" not in keto.calls[0].text


def test_state_aware_view_shares_the_exposed_facts_and_keeps_the_rest_private():
    view = state_aware_view(
        exposed_states={"diet": "vegan"}, current_state={"diet": "vegan", "city": "Oslo"}
    )
    assert view.shared_facts == {"diet": "vegan"}
    assert view.private_facts == {"city": "Oslo"}


def test_the_state_hidden_view_gets_the_period_end_and_the_state_aware_view_the_state():
    env = make_environment(users=1)
    item = env.items[0]
    period = item.periods[0]
    session = period.sessions[0]
    hidden = user_view_for("state_hidden", item, period, session)
    assert isinstance(hidden, PaperUserView)
    assert hidden.current_date == str(period.period_end)
    assert hidden.profile_date == str(item.start_time)
    aware = user_view_for("state_aware", item, period, session)
    assert isinstance(aware, StateAwareUserView)
    assert {**aware.shared_facts, **aware.private_facts} == {
        k: str(v) for k, v in period.state.items()
    }


# ----- echoes: a follow-up that copies the assistant is asked once more ------------------------


def echo_first_then(second: str):
    """A simulated user that copies the assistant's reply on its first try of each round."""

    def respond(call):
        if call.settings.get("temperature") == StateAwareUserView.echo_retry_temperature:
            return user_turn(second)
        reply = sections(call.user)["assistant_reply"]
        return user_turn(reply)

    return respond


def test_an_echoing_follow_up_is_asked_again_once_with_sampling_and_another_seed():
    transcript, _, simulator_lm, _ = play(
        rounds=2, simulator=echo_first_then("Which of them has the most protein?")
    )
    assert len(simulator_lm.calls) == 2
    first, retry = simulator_lm.calls
    assert first.settings.get("temperature") != StateAwareUserView.echo_retry_temperature
    assert retry.settings["temperature"] == StateAwareUserView.echo_retry_temperature
    assert retry.settings["seed"] != first.settings["seed"]
    assert transcript.messages[2].content == "Which of them has the most protein?"
    assert transcript.simulator_echo_retries == 1


def test_a_second_echo_is_kept_and_counted_not_asked_a_third_time():
    transcript, _, simulator_lm, _ = play(rounds=2, simulator=echo_first_then("Noted, thanks."))
    assert len(simulator_lm.calls) == 2  # one retry, no more
    assert transcript.messages[2].content == "Noted, thanks."  # the copy stays in the record
    assert transcript.simulator_echo_retries == 1


def test_a_fresh_follow_up_is_not_asked_again():
    transcript, _, simulator_lm, _ = play(rounds=3, simulator=distinct_follow_ups())
    assert len(simulator_lm.calls) == 2
    assert transcript.simulator_echo_retries == 0


def test_the_paper_user_is_asked_once_even_when_it_echoes():
    simulator_lm = ScriptedLM(lambda call: user_turn("Reply number 1."), model="sim")
    transcript, paper_simulator = paper_play(rounds=2, lms=scripted_role_lms(
        simulator=simulator_lm, agent=ScriptedLM(numbered_agent(), model="agent")
    ))  # fmt: skip
    assert len(simulator_lm.calls) == 1  # the reference asks once
    assert transcript.simulator_echo_retries == 0
