"""Test helpers: a scripted agent that answers each policy predictor from its prompt."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dspy
import numpy as np
from scripted_lm import ScriptedCall, ScriptedLM

from memory_policies import HashingEmbedder, Message


@dataclass(frozen=True)
class Raw:
    """Send this text verbatim (e.g. to provoke a parse failure)."""

    text: str


def output_fields(system: str) -> list[str]:
    section = system.split("Your output fields are:", 1)[1].split("All interactions", 1)[0]
    return re.findall(r"\d+\. `(\w+)`", section)


def section(text: str, name: str) -> str:
    """The value of input field `name` in a JSONAdapter user message."""
    match = re.search(
        rf"\[\[ ## {name} ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", text, re.S
    )
    assert match, f"no field {name} in {text!r}"
    return match.group(1)


Handler = Any | Callable[[ScriptedCall], Any]


def agent(**handlers: Handler) -> ScriptedLM:
    """A scripted agent LM; `handlers[field]` is a value or `f(call)` for that output field.

    Defaults: reply echoes the user message, choice 1, no memory updates or operations.
    """
    defaults: dict[str, Handler] = {
        "reply": lambda call: "re: " + section(call.user, "user_message").splitlines()[-1],
        "choice": 1,
        "updates": [],
        "operations": [],
    }

    def respond(call: ScriptedCall) -> dict[str, Any] | str:
        (field,) = output_fields(call.system)
        handler = handlers.get(field, defaults[field])
        value = handler(call) if callable(handler) else handler
        return value.text if isinstance(value, Raw) else {field: value}

    return ScriptedLM(respond)


def calls_for(lm: ScriptedLM, field: str) -> list[ScriptedCall]:
    return [call for call in lm.calls if output_fields(call.system) == [field]]


def agent_context(lm: ScriptedLM):
    return dspy.context(lm=lm, adapter=dspy.JSONAdapter())


def messages(n: int, start: int = 1) -> list[Message]:
    """Alternating user/assistant messages 'm<i>' (odd i from the user)."""
    return [
        Message(role="user" if i % 2 else "assistant", content=f"m{i}")
        for i in range(start, start + n)
    ]


class CountingEmbedder(HashingEmbedder):
    """Hashing embedder that records every text it embeds."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__(dim)
        self.texts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return super().embed(texts)
