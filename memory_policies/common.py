"""Pieces shared by several policies: non-LLM steps and the fixed (non-mutable) field texts.

Field descriptions carry the output-format requirements. They are not exposed as mutable
components, so an optimizer rewriting an instruction cannot break parsing or reply length.
"""

from __future__ import annotations

from typing import Annotated, Any

import dspy
from pydantic import BeforeValidator, Field

REPLY_DESC = "your reply to the user: plain text, at most 3 sentences"
# Output cap of an on-policy reply under the `evolve` variant: 3 sentences plus the adapter's
# field markers fit well inside it. Small models sometimes repeat a phrase until max_tokens;
# the cap bounds what such a loop costs in decoding and in every later prompt that shows it.
REPLY_MAX_TOKENS = 128
# Longest memory text one write may store under the `evolve` variant (an in_context value, an
# external fact), in characters. A stored text is in every later prompt that shows the memory;
# small models sometimes ramble or loop until max_tokens there (1,000+ characters of one
# repeated clause). The JSON schema's maxLength makes constrained decoding close the string;
# text from an endpoint without constrained decoding is clipped rather than rejected.
MEMORY_TEXT_MAX_CHARS = 200
MEMORY_LABEL_MAX_CHARS = 60


def _clipped(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda value: value[:limit] if isinstance(value, str) else value)


MemoryText = Annotated[
    str, _clipped(MEMORY_TEXT_MAX_CHARS), Field(max_length=MEMORY_TEXT_MAX_CHARS)
]
MemoryLabel = Annotated[
    str, _clipped(MEMORY_LABEL_MAX_CHARS), Field(max_length=MEMORY_LABEL_MAX_CHARS)
]
CHOICE_DESC = "the number of the single best option"
QUESTION_DESC = "the user's question"
OPTIONS_DESC = "numbered answer options"
USER_MESSAGE_DESC = "the user's new message"
CONVERSATION_DESC = "recent messages, oldest first"


class PassThrough(dspy.Module):
    """A step that does nothing: kept as a module so every policy has write/read/use."""

    def forward(self, **inputs: Any) -> dspy.Prediction:
        return dspy.Prediction(**inputs)


MEMORY_DESC = "what you remember about the user, oldest first"

DEFAULT_MEMORY_USE = (
    "You are a helpful personal assistant with a long-term memory about your user. "
    "Personalise your reply using what you remember about the user's current situation and "
    "preferences; when remembered facts conflict, trust the most recent one."
)


class MemoryReply(dspy.Signature):
    memory: str = dspy.InputField(desc=MEMORY_DESC)
    conversation: str = dspy.InputField(desc=CONVERSATION_DESC)
    user_message: str = dspy.InputField(desc=USER_MESSAGE_DESC)
    reply: str = dspy.OutputField(desc=REPLY_DESC)


class MemoryChoose(dspy.Signature):
    memory: str = dspy.InputField(desc=MEMORY_DESC)
    conversation: str = dspy.InputField(desc=CONVERSATION_DESC)
    question: str = dspy.InputField(desc=QUESTION_DESC)
    options: str = dspy.InputField(desc=OPTIONS_DESC)
    choice: int = dspy.OutputField(desc=CHOICE_DESC)


def capped_call_config(max_tokens: int = REPLY_MAX_TOKENS) -> dict[str, int]:
    """Per-call LM settings that cap the output at `max_tokens`, or at the current endpoint's
    own max_tokens when that is smaller: a cap never raises the configured limit."""
    configured = getattr(dspy.settings.lm, "kwargs", {}).get("max_tokens")
    if isinstance(configured, int) and configured < max_tokens:
        return {"max_tokens": configured}
    return {"max_tokens": max_tokens}


def latest_time(times: list[str | None]) -> str | None:
    """The write time of a batch: the latest session time among its messages."""
    known = [t for t in times if t is not None]
    return known[-1] if known else None


def timed_line(time: str | None, text: str) -> str:
    return f"- [{time}] {text}" if time else f"- {text}"
