"""The data a policy exchanges: messages, its per-user state, its answers, and how a
conversation and a question's options are rendered for its predictors."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_TIME_PATTERN = re.compile(r"\[Current Time:\s*([^\]\n]+?)\s*\]")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str


class MemoryState(BaseModel):
    """Everything a policy remembers about one user; JSON-serializable, passed in and returned."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    short_term: list[Message] = Field(default_factory=list)
    # Aligned with `short_term`: the session time in effect when each message arrived, so
    # messages flushed after a session boundary are written with their own time, not the
    # time of the session that pushed them out.
    short_term_times: list[str | None] = Field(default_factory=list)
    current_time: str | None = None
    parse_failures: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _align_times(self) -> MemoryState:
        missing = len(self.short_term) - len(self.short_term_times)
        if missing < 0:
            raise ValueError(
                f"short_term_times has {len(self.short_term_times)} entries but short_term has "
                f"{len(self.short_term)} messages; they must be aligned"
            )
        # States built by hand may omit the times: unknown times are older than the known ones.
        if missing:
            self.short_term_times = [None] * missing + self.short_term_times
        return self


class PolicyAnswer(BaseModel):
    text: str
    choice: int | None = None
    parse_error: str | None = None
    retrieved: list[str] = Field(default_factory=list)


def parse_current_time(text: str) -> str | None:
    """The time in a ``[Current Time: ...]`` header, or None when the message has none."""
    match = _TIME_PATTERN.search(text)
    return match.group(1) if match else None


def strip_time_header(text: str) -> str:
    """The message without its ``[Current Time: ...]`` header (noise for a similarity search)."""
    stripped = _TIME_PATTERN.sub("", text, count=1).strip()
    return stripped or text


def render_conversation(messages: Sequence[Message]) -> str:
    """Compact transcript: the small model pays for every token of it on every call."""
    if not messages:
        return "(no messages)"
    names = {"user": "User", "assistant": "Assistant"}
    return "\n".join(f"{names[m.role]}: {m.content}" for m in messages)


def render_options(options: Sequence[str]) -> str:
    return "\n".join(f"{i}. {option}" for i, option in enumerate(options, start=1))


def checked_choice(
    choice: Any, text: str, options: Sequence[str], retrieved: list[str]
) -> PolicyAnswer:
    if not isinstance(choice, int) or isinstance(choice, bool) or not 1 <= choice <= len(options):
        return PolicyAnswer(
            text=text,
            parse_error=f"choice {choice!r} is not an option number in 1..{len(options)}",
            retrieved=retrieved,
        )
    return PolicyAnswer(text=text, choice=choice, retrieved=retrieved)


def short_error(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:300]
