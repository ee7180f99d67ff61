"""Conversation health: echoes, self-repeats, refusals and empty replies are counted, a
healthy conversation is not flagged, and the counts reach the summary and its metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolve.simulator.conversation_health import (
    FLAGGED_SHARE_LIMIT,
    ConversationHealth,
    conversation_health,
    is_near_copy,
    is_refusal,
    session_health,
)
from evolve.simulator.metrics import summarize_periods
from evolve.simulator.records import PeriodResult, SessionTranscript, TranscriptMessage

REFUSAL = "I'm sorry, but I can't assist with that."

# Shaped like the quickstart's sessions on the bundled 0.5B model: the assistant refuses an
# everyday request, and every follow-up of the simulated user copies the assistant's reply.
DEGENERATE = [
    ("user", "[Current Time: 2025-03-02]\nCan you suggest a weekly meal plan? I went vegan."),
    ("assistant", REFUSAL),
    ("user", "I'm sorry, but I can't assist with that."),
    ("assistant", "Sure! Here is a plan: oatmeal with berries, lentil soup, tofu stir-fry."),
    ("user", "Sure! Here is a plan: oatmeal with berries, lentil soup, tofu stir-fry."),
    ("assistant", ""),
]
HEALTHY = [
    ("user", "[Current Time: 2025-03-02]\nCan you suggest a weekly meal plan? I went vegan."),
    ("assistant", "Sure! Start with oatmeal with berries, lentil soup and a tofu stir-fry."),
    ("user", "Thanks. Could the lunches be quick? I only get half an hour at the office."),
    ("assistant", "Yes: overnight oats, a chickpea wrap and leftover soup all take minutes."),
    ("user", "I'm sorry, I forgot to say I also avoid soy. What would replace the tofu?"),
    ("assistant", "Tempeh is soy too, so try seitan, beans or lentils instead."),
]


def transcript(messages: list[tuple[str, str]], **fields: object) -> SessionTranscript:
    return SessionTranscript(
        session_index=0,
        session_time="2025-03-02",
        query=messages[0][1],
        messages=[TranscriptMessage(role=role, content=text) for role, text in messages],
        rounds_planned=len(messages) // 2,
        rounds_completed=len(messages) // 2,
        **fields,
    )


def period(*sessions: SessionTranscript) -> PeriodResult:
    return PeriodResult(user_id="u0", period_index=0, state={}, sessions=list(sessions))


def test_the_degenerate_session_counts_every_echo_refusal_and_empty_reply() -> None:
    health = session_health(transcript(DEGENERATE))
    assert health == ConversationHealth(
        user_messages=2,
        user_echoes_assistant=2,
        user_repeats_self=0,
        assistant_messages=3,
        assistant_refusals=1,
        assistant_empty=1,
    )
    warning = health.warning()
    assert warning is not None
    assert "2 of 2 simulated-user follow-ups" in warning
    assert "2 of 3 assistant replies" in warning


def test_a_healthy_session_is_not_flagged_even_with_an_apology_inside() -> None:
    health = session_health(transcript(HEALTHY))
    assert health.user_messages == 2
    assert health.user_flagged == 0
    assert health.assistant_flagged == 0
    assert health.warning() is None


# From the recorded 1.5B transcripts (benchmarks/records/types_list_room/sort-every-statement,
# seed 13, ideal, u000 period 2): the user's follow-up speaks as the assistant, and the
# assistant answers by repeating it word for word, or by repeating its own first reply.
ASSISTANT_COPIES = [
    ("user", "[Current Time: 2020-11-29]\nI have four people reporting to me now. Any tips?"),
    ("assistant", "Focus on your strengths and network with your colleagues and leaders."),
    ("user", "Could you say more about networking with the leaders in my company, please?"),
    ("assistant", "Focus on your strengths and network with your colleagues and leaders!"),
    ("user", "I appreciate your response. I'll focus on my strengths and network with leaders."),
    (
        "assistant",
        "I appreciate your response. I'll focus on my strengths and network with leaders.",
    ),
]


def test_an_assistant_copying_the_user_or_itself_is_flagged() -> None:
    health = session_health(transcript(ASSISTANT_COPIES))
    assert (health.assistant_echoes_user, health.assistant_repeats_self) == (1, 1)
    assert (health.assistant_refusals, health.assistant_empty) == (0, 0)
    assert health.user_flagged == 0  # the user's follow-ups are its own words
    assert health.assistant_flagged == 2
    warning = health.warning()
    assert warning is not None and "2 of 3 assistant replies are refusals, empty or copies" in (
        warning
    )
    assert "1 copy the user, 1 repeat themselves" in health.describe()


def test_a_user_repeating_its_own_opening_is_a_self_repeat() -> None:
    opening = "[Current Time: 2025-03-02]\nCan you suggest a weekly meal plan? I went vegan."
    messages = [
        ("user", opening),
        ("assistant", "Here is a plan with oats, soup and stir-fry."),
        ("user", "Can you suggest a weekly meal plan? I went vegan!"),
        ("assistant", "As above: oats, soup and stir-fry."),
    ]
    health = session_health(transcript(messages))
    assert (health.user_repeats_self, health.user_echoes_assistant) == (1, 0)


@pytest.mark.parametrize(
    ("text", "earlier", "copied"),
    [
        ("Sure! Here is a plan.", "sure here is a plan", True),  # case and punctuation
        # the whole reply quoted with one word changed is still a copy
        (
            "Great, a plan: oats in the morning, soup at noon and a stir-fry at night.",
            "Great, a plan: oats in the morning, soup at noon and a stir fry at night.",
            True,
        ),
        # a few quoted words inside a new message are not
        ("You said lentil soup, but I dislike lentils. Any other idea?", "Try lentil soup.", False),
        ("", "anything", False),
    ],
)
def test_near_copy(text: str, earlier: str, copied: bool) -> None:
    assert is_near_copy(text, earlier) is copied


@pytest.mark.parametrize(
    ("reply", "refusal"),
    [
        (REFUSAL, True),
        ("I'm sorry, but I cannot help with that request.", True),
        ("I can't assist with that.", True),
        ("As an AI language model, I cannot provide medical advice.", True),
        ("Sorry to hear that! Here are three ways to sleep better: ...", False),
        ("I can't wait to help: here is your plan.", False),
        ("Here is a plan. I'm sorry, I can't promise results.", False),
    ],
)
def test_refusal(reply: str, refusal: bool) -> None:
    assert is_refusal(reply) is refusal


def test_replayed_sessions_are_not_counted_and_sums_add_up() -> None:
    periods = [
        period(transcript(DEGENERATE), transcript(HEALTHY)),
        period(transcript(DEGENERATE, replayed=True)),
    ]
    total = conversation_health(periods)
    assert total == session_health(transcript(DEGENERATE)) + session_health(transcript(HEALTHY))
    assert total.user_messages == 4


def test_the_summary_carries_the_counts_into_its_metrics() -> None:
    summary = summarize_periods([period(transcript(DEGENERATE, simulator_echo_retries=2))])
    assert summary.conversation.user_echoes_assistant == 2
    assert summary.conversation.user_echo_retries == 2
    metrics = summary.flat_metrics("heldout/")
    assert metrics["heldout/conversation_user_echoes_assistant"] == 2.0
    assert metrics["heldout/conversation_assistant_refusals"] == 1.0


def test_the_limit_is_a_share_per_role() -> None:
    messages_per_flag = int(1 / FLAGGED_SHARE_LIMIT)
    at_limit = ConversationHealth(user_messages=messages_per_flag, user_echoes_assistant=1)
    over = ConversationHealth(user_messages=messages_per_flag - 1, user_echoes_assistant=1)
    assert at_limit.warning() is None
    assert over.warning() is not None


RECORDED = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/records/types_list_room/two-per-type/seed13/ideal/users"
)
# Read by hand in the recorded 1.5B transcripts (user, period, session): these follow-ups
# repeat the assistant's reply word for word or with "You" turned into "I"; every other
# follow-up there is the user's own text (some thank, some ask, none copies).
HAND_LABELLED_COPIES = {
    ("u000-aisha-rahman", 2, 1),
    ("u000-aisha-rahman", 2, 2),
    ("u001-tom-oconnell", 1, 2),
    ("u001-tom-oconnell", 2, 0),
    ("u001-tom-oconnell", 2, 1),
}


def test_recorded_transcripts_of_the_bundled_model_flag_exactly_the_copies_read_by_hand():
    flagged, follow_ups = set(), 0
    for path in sorted(RECORDED.glob("*/period_*/transcript.json")):
        user, period = path.parts[-3], int(path.parts[-2].removeprefix("period_"))
        for index, session in enumerate(json.loads(path.read_text("utf-8"))["sessions"]):
            health = session_health(SessionTranscript.model_validate(session))
            follow_ups += health.user_messages
            if health.user_echoes_assistant:
                flagged.add((user, period, index))
    assert follow_ups == 10
    assert flagged == HAND_LABELLED_COPIES
