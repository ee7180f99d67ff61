"""Conversation health: is the simulated user still a user, and is the assistant answering?

An on-policy score is only as good as the conversation it was earned in. A simulated user
that copies the assistant's last reply (or its own last message) reveals nothing new, and an
assistant that refuses everyday requests gives the user nothing to react to; both were common
on the bundled 0.5B model and nothing reported them. These counts travel with every on-policy
score (run summary, `result.json`, the eval table, MLflow).

What is counted, per period (and summed over any set of periods):

- simulated-user follow-ups (the environment's opening messages are not the simulator's);
  of those, `user_echoes_assistant`: near-verbatim copies of the assistant's previous reply,
  and `user_repeats_self`: near-verbatim copies of the user's own previous message;
- assistant replies; of those, `assistant_refusals` ("I'm sorry, but I can't assist with
  that."), `assistant_empty` (nothing but white space), `assistant_echoes_user`: near-verbatim
  copies of the user's previous message, and `assistant_repeats_self`: near-verbatim copies of
  the assistant's own previous reply (both seen on the bundled 1.5B, whose assistant answered a
  role-confused follow-up by repeating it word for word).

"Near-verbatim": after case folding and dropping punctuation and the time header, one text's
words are at least `NEAR_COPY_RATIO` similar to the other's (difflib's ratio over word
sequences), or the shorter holds at least `NEAR_COPY_RATIO` of the longer and is contained
in it. A reply that merely quotes a few words of the other side is not a copy.

A set of periods is flagged (one warning line) when more than `FLAGGED_SHARE_LIMIT` of its
simulated-user follow-ups copy a message, or more than `FLAGGED_SHARE_LIMIT` of the assistant's
replies are refusals, empty or copies: past that, the conversation no longer looks like AMemGym's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import SequenceMatcher

from pydantic import BaseModel, ConfigDict

from evolve.simulator.records import PeriodResult, SessionTranscript

# Word-sequence similarity at or above which two messages count as the same message.
NEAR_COPY_RATIO = 0.85
# Share of flagged messages (per role) above which the conversation is reported as unhealthy.
FLAGGED_SHARE_LIMIT = 0.05

_TIME_HEADER = re.compile(r"^\s*\[Current Time:[^\]]*\]\s*")
_WORD = re.compile(r"[\w']+")
# Refusal openings seen from small instruction-tuned models, matched at the reply's start
# (a refusal is the whole reply; "I can't say for sure, but ..." later in a reply is advice).
_REFUSAL = re.compile(
    r"^\W*(?:i'?m\s+(?:really\s+)?sorry|i\s+apologi[sz]e|sorry)\W*(?:,\s*)?"
    r"(?:but\s+)?(?:i|as an ai)\b[^.]{0,60}?\b(?:can(?:'|no)?t|cannot|am unable|'m unable|"
    r"unable|not able|won'?t)\b"
    r"|^\W*(?:i\s+(?:can(?:'|no)?t|cannot|am unable to|'m unable to|won'?t)\s+"
    r"(?:assist|help|provide|do that|comply|answer))"
    r"|^\W*as an ai(?: language model)?,? i (?:can(?:'|no)?t|cannot|don'?t|do not)",
    re.IGNORECASE,
)


def _words(text: str) -> list[str]:
    return _WORD.findall(_TIME_HEADER.sub("", text).casefold())


def is_near_copy(message: str, earlier: str) -> bool:
    """True when `message` repeats `earlier` near-verbatim (see the module docstring)."""
    mine, theirs = _words(message), _words(earlier)
    if not mine or not theirs:
        return False
    shorter, longer = sorted((mine, theirs), key=len)
    if len(shorter) >= NEAR_COPY_RATIO * len(longer):
        joined_short, joined_long = " ".join(shorter), " ".join(longer)
        if joined_short in joined_long:
            return True
    return SequenceMatcher(None, mine, theirs, autojunk=False).ratio() >= NEAR_COPY_RATIO


def is_refusal(reply: str) -> bool:
    """True when an assistant reply opens by refusing to help."""
    return bool(_REFUSAL.search(reply))


def echo_of(message: str, *, last_assistant: str, last_user: str) -> str | None:
    """Which earlier message a simulated-user message copies: "assistant", "self" or None."""
    if is_near_copy(message, last_assistant):
        return "assistant"
    if is_near_copy(message, last_user):
        return "self"
    return None


class ConversationHealth(BaseModel):
    """Counts over a set of on-policy sessions (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    user_messages: int = 0
    user_echoes_assistant: int = 0
    user_repeats_self: int = 0
    user_echo_retries: int = 0
    assistant_messages: int = 0
    assistant_refusals: int = 0
    assistant_empty: int = 0
    assistant_echoes_user: int = 0
    assistant_repeats_self: int = 0

    def __add__(self, other: ConversationHealth) -> ConversationHealth:
        return ConversationHealth(
            **{
                name: getattr(self, name) + getattr(other, name)
                for name in ConversationHealth.model_fields
            }
        )

    @property
    def user_flagged(self) -> int:
        return self.user_echoes_assistant + self.user_repeats_self

    @property
    def assistant_flagged(self) -> int:
        return (
            self.assistant_refusals
            + self.assistant_empty
            + self.assistant_echoes_user
            + self.assistant_repeats_self
        )

    @property
    def user_flagged_share(self) -> float | None:
        return self.user_flagged / self.user_messages if self.user_messages else None

    @property
    def assistant_flagged_share(self) -> float | None:
        if not self.assistant_messages:
            return None
        return self.assistant_flagged / self.assistant_messages

    def describe(self) -> str:
        """One line: the counts, for the run's summary and the eval table."""
        return (
            f"simulated user: {self.user_echoes_assistant} of {self.user_messages} follow-ups "
            f"copy the assistant, {self.user_repeats_self} repeat themselves "
            f"({self.user_echo_retries} echoes retried); assistant: "
            f"{self.assistant_refusals} of {self.assistant_messages} replies refuse, "
            f"{self.assistant_empty} empty, {self.assistant_echoes_user} copy the user, "
            f"{self.assistant_repeats_self} repeat themselves"
        )

    def warning(self) -> str | None:
        """One line when either role passes `FLAGGED_SHARE_LIMIT`; None when healthy."""
        problems = []
        user_share = self.user_flagged_share
        if user_share is not None and user_share > FLAGGED_SHARE_LIMIT:
            problems.append(
                f"{self.user_flagged} of {self.user_messages} simulated-user follow-ups copy an "
                "earlier message"
            )
        assistant_share = self.assistant_flagged_share
        if assistant_share is not None and assistant_share > FLAGGED_SHARE_LIMIT:
            problems.append(
                f"{self.assistant_flagged} of {self.assistant_messages} assistant replies are "
                "refusals, empty or copies"
            )
        if not problems:
            return None
        return (
            f"conversation health: {'; '.join(problems)} (limit "
            f"{FLAGGED_SHARE_LIMIT:.0%} per role): on-policy scores from this conversation are "
            "suspect; read the transcripts"
        )

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat counts for MLflow."""
        return {
            f"{prefix}conversation_{name}": float(getattr(self, name))
            for name in ConversationHealth.model_fields
        }


def session_health(session: SessionTranscript) -> ConversationHealth:
    """Counts for one session transcript (messages alternate user, assistant)."""
    user_messages = echoes = repeats = assistant = refusals = empty = 0
    assistant_echoes = assistant_repeats = 0
    last_user = last_assistant = None
    for message in session.messages:
        if message.role == "assistant":
            assistant += 1
            if not message.content.strip():
                empty += 1
            elif is_refusal(message.content):
                refusals += 1
            elif is_near_copy(message.content, last_user or ""):
                assistant_echoes += 1
            elif is_near_copy(message.content, last_assistant or ""):
                assistant_repeats += 1
            last_assistant = message.content
            continue
        if message.role != "user":
            continue
        if last_assistant is not None:  # a follow-up, written by the simulated user
            user_messages += 1
            copied = echo_of(
                message.content, last_assistant=last_assistant, last_user=last_user or ""
            )
            echoes += copied == "assistant"
            repeats += copied == "self"
        last_user = message.content
    return ConversationHealth(
        user_messages=user_messages,
        user_echoes_assistant=echoes,
        user_repeats_self=repeats,
        user_echo_retries=session.simulator_echo_retries,
        assistant_messages=assistant,
        assistant_refusals=refusals,
        assistant_empty=empty,
        assistant_echoes_user=assistant_echoes,
        assistant_repeats_self=assistant_repeats,
    )


def conversation_health(periods: Iterable[PeriodResult]) -> ConversationHealth:
    """Counts over every session of `periods` (empty for off-policy periods)."""
    total = ConversationHealth()
    for period in periods:
        for session in period.sessions:
            if not session.replayed:  # a recorded conversation: no simulated user spoke
                total = total + session_health(session)
    return total
