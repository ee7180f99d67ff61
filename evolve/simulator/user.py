"""The simulated user: a DSPy program run in the `simulator` role, and the session loop.

A session opens with the environment's query (prefixed with its time stamp, as in the
original code); the user then follows up after each assistant reply until the planned number
of rounds is reached. What the follow-up prompt shows is a `UserView`, chosen by the protocol
(`ProtocolRules.user_view`, built with `user_view_for`):

- ``state_aware`` (protocol ``evolve``, ours; `StateAwareUserView`): the user is told the
  period's current state so that its follow-ups stay consistent with it; it may talk about
  what the session exposes and must keep every other tracked value to itself.
- ``state_hidden`` (protocol ``paper``, the reference code's information flow; `PaperUserView`): the
  user sees only the profile (as of the environment's start), the period's end date, the
  session's opening message, the last two messages and the state schema it must keep to
  itself. It is blind to every state value: the prompt is the same whatever the current or
  exposed state is.

The simulated user belongs to the environment, never to a policy: an optimizer that mutates a
policy's modules must not be able to reach it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.core.seeds import derive_seed
from evolve.llm.response_cache import held_until_parsed
from evolve.simulator.conversation_health import echo_of
from evolve.simulator.records import SessionTranscript, TranscriptMessage
from memory_policies.common import capped_call_config
from memory_policies.messages import strip_time_header

if TYPE_CHECKING:
    from evolve.llm import RoleLMs
    from evolve.simulator.environment import EnvironmentItem, Period, Session
    from memory_policies.base import MemoryPolicy
    from memory_policies.messages import MemoryState

# The small model pays for every prompt token; this bounds what one follow-up call reads.
_PERSONA_CHARS = 1500
# Of the assistant's reply the follow-up sees its first sentences, at most this many characters:
# enough to react to, and little to copy (shown whole, the bundled models copied it).
_REPLY_SENTENCES = 2
_REPLY_CHARS = 300
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# Written for small models, and measured on them (benchmarks/follow_up_echoes.py): asked for
# "the user's next message" after the whole latest exchange, the bundled 1.5B continued as the
# assistant and copied its reply in a third of follow-ups; asked as the person, for a reaction
# and a question in two fields, shown the reply's first sentences, it copied none.
FOLLOW_UP_INSTRUCTIONS = (
    "You are the person described in `persona`, chatting with an AI assistant that is helping "
    "you. Write your next turn as that person: a short reaction and one new question. Speak "
    "only as yourself, in the first person; do not give advice and do not repeat the "
    "assistant's words."
)


class UserFollowUp(dspy.Signature):
    """Write the simulated user's next turn (instructions: FOLLOW_UP_INSTRUCTIONS)."""

    persona: str = dspy.InputField(desc="who you are")
    your_request: str = dspy.InputField(desc="what you asked the assistant")
    facts_you_may_mention: str = dspy.InputField()
    facts_to_keep_private: str = dspy.InputField(
        desc="also true now: never mention or hint at them"
    )
    assistant_reply: str = dspy.InputField(desc="the assistant's answer to you")
    reaction: str = dspy.OutputField(
        # The example is copied now and then: it must state nothing about the user (an earlier
        # one, "That might work, but I rarely have time in the mornings.", was filed as a fact).
        desc="your short first-person reaction to the answer, under 15 words, e.g. 'Sounds "
        "useful, thanks.'"
    )
    question: str = dspy.OutputField(
        desc="your next question to the assistant, about your own situation, ending with '?'"
    )


# Under `paper` the user is shown what the reference simulator is shown (nothing else, and no
# truncation): the wording is ours, the inputs and constraints are the original's.
PAPER_FOLLOW_UP_INSTRUCTIONS = (
    "Play the user described by `profile` (as they were on `profile_date`) in an ongoing chat "
    "with an AI assistant; today is `current_date`. Write the user's next message. The chat "
    "must go on: never wrap it up or say goodbye. If the assistant asked you something, answer "
    "it with details that are not tracked, and volunteer no personal details it did not ask "
    "for. Never restate what `opening_message` already said. If your opening request looks "
    "handled, carry on with a natural related question (a detail, an alternative, how to do "
    "it, or a point to clarify). Stay in character and sound natural. `tracked_schema` lists "
    "the tracked attributes and their possible values: never disclose or hint at which value "
    "applies to you. Other details about your life are fine only if they give no clue about a "
    "tracked attribute. Give only the message text, no formatting or commentary."
)


class PaperUserFollowUp(dspy.Signature):
    """Write the simulated user's next message (instructions: PAPER_FOLLOW_UP_INSTRUCTIONS)."""

    profile: str = dspy.InputField(desc="who the user is")
    profile_date: str = dspy.InputField(desc="the date the profile describes")
    current_date: str = dspy.InputField(desc="today's date")
    opening_message: str = dspy.InputField(desc="the user's first message of this chat")
    recent_messages: str = dspy.InputField(desc="the last two messages, the latest reply last")
    tracked_schema: str = dspy.InputField(
        desc="tracked attributes and their possible values: keep them to yourself"
    )
    message: str = dspy.OutputField(desc="the user's next message")


class UserView(TypingProtocol):
    """What the simulated user may see besides the conversation, for one session; it writes
    the user's next message from that and the latest exchange."""

    # A follow-up that copies an earlier message is asked once more at this temperature
    # (another seed); None: never asked again (the reference asks once).
    echo_retry_temperature: float | None

    def next_message(
        self,
        user: SimulatedUser,
        *,
        opening: str,
        last_user: str,
        last_assistant: str,
        seed: int,
        temperature: float | None = None,
    ) -> str:
        """One follow-up (`temperature` None: the role's own); raises AdapterParseError when
        the output cannot be parsed."""
        ...


@dataclass(frozen=True)
class StateAwareUserView:
    """Ours: the persona, the facts the session is about and the period's other current facts
    (to keep consistent with and to itself)."""

    persona: str
    shared_facts: Mapping[str, str]
    private_facts: Mapping[str, str]
    # At temperature 0 (the embedded default) the same prompt copies again; sampling may not.
    echo_retry_temperature: float | None = 0.7

    @classmethod
    def of(
        cls,
        *,
        persona: str,
        exposed_states: Mapping[str, Any],
        current_state: Mapping[str, Any],
    ) -> StateAwareUserView:
        """The view of a session exposing `exposed_states` while `current_state` holds."""
        shared = {name: str(value) for name, value in exposed_states.items()}
        private = {name: str(v) for name, v in current_state.items() if name not in shared}
        return cls(persona, shared, private)

    def next_message(
        self,
        user: SimulatedUser,
        *,
        opening: str,
        last_user: str,
        last_assistant: str,
        seed: int,
        temperature: float | None = None,
    ) -> str:
        return user.next_message(
            persona=self.persona,
            shared_facts=self.shared_facts,
            private_facts=self.private_facts,
            last_user=last_user,
            last_assistant=last_assistant,
            seed=seed,
            temperature=temperature,
        )


@dataclass(frozen=True)
class PaperUserView:
    """What the reference code's simulated user sees besides the conversation itself."""

    profile: str
    profile_date: str
    current_date: str
    state_schema: Mapping[str, Sequence[str]]
    echo_retry_temperature: float | None = None  # the reference asks once

    def schema_text(self) -> str:
        return json.dumps(
            {name: list(values) for name, values in self.state_schema.items()},
            indent=2,
            ensure_ascii=False,
        )

    def next_message(
        self,
        user: SimulatedUser,
        *,
        opening: str,
        last_user: str,
        last_assistant: str,
        seed: int,
        temperature: float | None = None,
    ) -> str:
        return user.paper_next_message(
            view=self,
            opening=opening,
            last_user=last_user,
            last_assistant=last_assistant,
            seed=seed,
        )


def _state_hidden_view(item: EnvironmentItem, period: Period, session: Session) -> UserView:
    # The reference user sees the full profile as of the start and the period's END date.
    return PaperUserView(
        profile=item.profile_text(),
        profile_date=str(item.start_time or ""),
        current_date=str(period.period_end or ""),
        state_schema=item.state_schema,
    )


def _state_aware_view(item: EnvironmentItem, period: Period, session: Session) -> UserView:
    return StateAwareUserView.of(
        persona=format_persona(item.profile_text()),
        exposed_states=session.exposed_values(),
        current_state={k: str(v) for k, v in period.state.items()},
    )


# The user-view factory of each `ProtocolRules.user_view`: the view a protocol's simulated
# user gets in one session.
USER_VIEWS: dict[str, Callable[[EnvironmentItem, Period, Session], UserView]] = {
    "state_hidden": _state_hidden_view,
    "state_aware": _state_aware_view,
}


def user_view_for(style: str, item: EnvironmentItem, period: Period, session: Session) -> UserView:
    """The view a protocol's simulated user gets in one session (`ProtocolRules.user_view`)."""
    return USER_VIEWS[style](item, period, session)


def format_persona(profile: Any) -> str:
    """The original data stores the profile as a dict with a `formatted_str`; accept text too."""
    if isinstance(profile, str):
        text = profile
    elif isinstance(profile, Mapping) and isinstance(profile.get("formatted_str"), str):
        text = profile["formatted_str"]
    else:
        text = json.dumps(profile, ensure_ascii=False, default=str)
    return text if len(text) <= _PERSONA_CHARS else text[: _PERSONA_CHARS - 3] + "..."


def reply_opening(reply: str) -> str:
    """The first `_REPLY_SENTENCES` sentences of an assistant reply, at most `_REPLY_CHARS`
    characters (what the state-aware follow-up reacts to)."""
    opening = " ".join(_SENTENCE_END.split(reply.strip())[:_REPLY_SENTENCES])
    return opening if len(opening) <= _REPLY_CHARS else opening[: _REPLY_CHARS - 3] + "..."


def _facts(values: Mapping[str, str]) -> str:
    return "\n".join(f"- {name}: {value}" for name, value in values.items()) or "(none)"


def opening_message(session_time: str, query: str) -> str:
    """The first user message of a session, exactly as the original code builds it."""
    return f"[Current Time: {session_time}]\n{query}"


class SimulatedUser(dspy.Module):
    """Writes the user's follow-up messages; holds no state between calls."""

    def __init__(self) -> None:
        super().__init__()
        # Set explicitly: a docstring would reach the prompt with its indentation.
        self.follow_up = dspy.Predict(UserFollowUp.with_instructions(FOLLOW_UP_INSTRUCTIONS))
        self.paper_follow_up = dspy.Predict(
            PaperUserFollowUp.with_instructions(PAPER_FOLLOW_UP_INSTRUCTIONS)
        )

    def next_message(
        self,
        *,
        persona: str,
        shared_facts: Mapping[str, str],
        private_facts: Mapping[str, str],
        last_user: str,
        last_assistant: str,
        seed: int,
        temperature: float | None = None,
    ) -> str:
        """One follow-up: the reaction, then the question; raises AdapterParseError when the
        output cannot be parsed."""
        prediction = self.follow_up(
            persona=persona,
            your_request=strip_time_header(last_user),
            facts_you_may_mention=_facts(shared_facts),
            facts_to_keep_private=_facts(private_facts),
            assistant_reply=reply_opening(last_assistant),
            # Forwarded to the endpoint: sampled follow-ups are reproducible where supported.
            # A reaction and a question fit the policies' reply cap, which bounds what a small
            # model's repetition loop costs (under `paper` the endpoint's own max_tokens applies).
            config={
                "seed": seed,
                **capped_call_config(),
                **({} if temperature is None else {"temperature": temperature}),
            },
        )
        parts = (str(prediction.reaction).strip(), str(prediction.question).strip())
        return " ".join(part for part in parts if part)

    def paper_next_message(
        self,
        *,
        view: PaperUserView,
        opening: str,
        last_user: str,
        last_assistant: str,
        seed: int,
        temperature: float | None = None,
    ) -> str:
        """One follow-up under `paper`: no state value and only the last two messages, in
        full (the reference truncates nothing); raises AdapterParseError when unparseable."""
        prediction = self.paper_follow_up(
            profile=view.profile,
            profile_date=view.profile_date,
            current_date=view.current_date,
            opening_message=opening,
            recent_messages=f"User: {last_user}\nAssistant: {last_assistant}",
            tracked_schema=view.schema_text(),
            config={"seed": seed, **({} if temperature is None else {"temperature": temperature})},
        )
        return str(prediction.message).strip()


def _ask_follow_up(
    view: UserView,
    user: SimulatedUser,
    call_slot: Callable[[], AbstractContextManager[Any]],
    lms: RoleLMs,
    opening: str,
    last_user: str,
    last_assistant: str,
    seed: int,
    temperature: float | None = None,
) -> str:
    with held_until_parsed() as held, call_slot(), lms.context("simulator"):
        message = view.next_message(
            user,
            opening=opening,
            last_user=last_user,
            last_assistant=last_assistant,
            seed=seed,
            temperature=temperature,
        )
        if message:  # an empty follow-up ends the session: never replayed
            held.accept()
    return message


def play_session(
    *,
    policy: MemoryPolicy,
    state: MemoryState,
    user: SimulatedUser,
    lms: RoleLMs,
    session_index: int,
    session_time: str,
    query: str,
    exposed_states: Mapping[str, str],
    view: UserView,
    rounds: int,
    seed: int,
    call_slot: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> tuple[SessionTranscript, MemoryState]:
    """Run one on-policy session: policy replies live, the simulated user follows up.

    With rounds=1 the session is the opening query and the reply, and the simulator is never
    called. An unparseable or empty follow-up ends the session early; it is counted in
    `simulator_parse_failures` and explained in `ended_early`, never replaced by a canned text.
    Every LM-backed call is made inside `call_slot()` (the runner bounds calls in flight).
    The follow-ups see `view` and the conversation only; `exposed_states` is recorded in the
    transcript (what the session is about), whatever the view shows.
    """
    shared = {name: str(value) for name, value in exposed_states.items()}
    opening = opening_message(session_time, query)
    messages: list[TranscriptMessage] = []
    user_message = opening
    failures = 0
    echo_retries = 0
    ended_early: str | None = None
    completed = 0
    for round_index in range(rounds):
        # Kept out of the response cache if the policy counted an output it could not use
        # (a memory write the adapter parsed but the policy refused).
        failed_before = sum(state.parse_failures.values())
        with held_until_parsed() as held, call_slot(), lms.context("agent"):
            reply, state = policy.respond(state, user_message)
            if sum(state.parse_failures.values()) == failed_before:
                held.accept()
        messages.append(TranscriptMessage(role="user", content=user_message))
        messages.append(TranscriptMessage(role="assistant", content=reply))
        completed += 1
        if round_index == rounds - 1:
            break
        try:
            # A follow-up that only copies the assistant's reply (or the user's own last
            # message) is asked once more with another seed; a second copy is kept and counted
            # by the conversation-health report.
            follow_up = _ask_follow_up(
                view, user, call_slot, lms, opening, user_message, reply,
                derive_seed(seed, session_index, round_index),
            )  # fmt: skip
            retry_temperature = view.echo_retry_temperature
            if retry_temperature is not None and echo_of(
                follow_up, last_assistant=reply, last_user=user_message
            ):
                echo_retries += 1
                follow_up = _ask_follow_up(
                    view, user, call_slot, lms, opening, user_message, reply,
                    derive_seed(seed, session_index, round_index, "echo-retry"),
                    temperature=retry_temperature,
                )  # fmt: skip
            user_message = follow_up
        except AdapterParseError as exc:
            failures += 1
            ended_early = "simulator output unparseable: " + " ".join(str(exc).split())[:200]
            break
        if not user_message:
            failures += 1
            ended_early = "simulator returned an empty message"
            break
    transcript = SessionTranscript(
        session_index=session_index,
        session_time=session_time,
        query=query,
        exposed_states=shared,
        messages=messages,
        rounds_planned=rounds,
        rounds_completed=completed,
        simulator_parse_failures=failures,
        simulator_echo_retries=echo_retries,
        ended_early=ended_early,
    )
    return transcript, state
