"""A scripted LM for unit tests: its reply depends on the prompt, never on a network.

`respond(call)` returns the predictor's output fields as a dict (serialized as JSON, which
DSPy's JSONAdapter parses) or a raw string (sent as is, e.g. to provoke a parse failure).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.callback import BaseCallback
from dspy.utils.dummies import DummyLM


@dataclass(frozen=True)
class ScriptedCall:
    messages: list[dict[str, str]]
    system: str = ""
    user: str = ""
    model: str = "scripted"
    # The call's LM settings: the LM's own kwargs overridden by the caller's (e.g. max_tokens).
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(message["content"] for message in self.messages)


Responder = Callable[[ScriptedCall], "dict[str, Any] | str"]


_LEAN_REQUEST = re.compile(r'\n\nAnswer with [^\n]*, as JSON \{"(\w+)": n\}\.$')


def _lean_choice_headings() -> dict[str, str]:
    """Heading -> input name of every context input a choose signature shows in the lean
    multiple-choice layout (`memory_policies.choice`)."""
    from memory_policies.choice import QUESTION_INPUTS
    from memory_policies.common import MemoryChoose
    from memory_policies.native import NativeChoose

    return {
        f"{field.json_schema_extra['desc'].capitalize()}:\n": name
        for signature in (MemoryChoose, NativeChoose)
        for name, field in signature.input_fields.items()
        if name not in QUESTION_INPUTS
    }


def dspy_layout(messages: list[dict[str, str]]) -> tuple[str, str] | None:
    """A call in the lean multiple-choice layout restated in DSPy's field layout (output fields
    listed in the system text, inputs under `[[ ## name ## ]]` in the user text), so that every
    responder reads one layout; None for any other call. The raw messages stay on the call."""
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    request = _LEAN_REQUEST.search(user)
    if request is None or "\n\nOptions:\n" not in user:
        return None
    question, options = user[: request.start()].rsplit("\n\nOptions:\n", 1)
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    headings = _lean_choice_headings()
    found = sorted(
        (system.find("\n\n" + heading), heading)
        for heading in headings
        if "\n\n" + heading in system
    )
    instructions = system[: found[0][0]] if found else system
    inputs: dict[str, str] = {}
    for index, (start, heading) in enumerate(found):
        end = found[index + 1][0] if index + 1 < len(found) else len(system)
        inputs[headings[heading]] = system[start + 2 + len(heading) : end]
    inputs.update(question=question, options=options)
    output = request.group(1)
    fields_text = f"Your output fields are:\n1. `{output}` (int)\nAll interactions"
    fields_text += f"\n\n{instructions}"
    user_text = "\n\n".join(f"[[ ## {name} ## ]]\n{value}" for name, value in inputs.items())
    return fields_text, user_text


class _ScriptedEngine(DummyEngine):
    def _complete_messages(self, messages):
        owner: ScriptedLM = self.owner
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        system, user = dspy_layout(messages) or (system, user)
        settings = dict(getattr(owner.pending, "settings", {}))
        call = ScriptedCall(
            messages=list(messages), system=system, user=user, model=owner.model, settings=settings
        )
        reply = owner.respond(call)
        text = reply if isinstance(reply, str) else json.dumps(reply)
        with owner.lock:
            owner.calls.append(call)
        prompt_tokens = sum(len(m["content"].split()) for m in messages)
        completion_tokens = len(text.split())
        usage = Usage(
            input_tokens=prompt_tokens,
            output_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        return Response(
            id=None,
            model=owner.model,
            message=Message.assistant([TextPart(text)]),
            finish_reason="stop",
            usage=usage,
        )


class _SettingsRecorder(BaseCallback):
    """Notes a call's settings (the LM's kwargs overridden by the caller's) for the engine,
    which sees only the messages; the callback runs in the calling thread just before it."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        instance.pending.settings = {**instance.kwargs, **inputs.get("kwargs", {})}


class ScriptedLM(DummyLM):
    """DSPy LM whose reply is computed by `respond` from the prompt; records every call."""

    def __init__(self, respond: Responder, model: str = "scripted"):
        super().__init__(answers={})
        self.model = model
        self.respond = respond
        self.calls: list[ScriptedCall] = []
        self.lock = threading.Lock()
        self.pending = threading.local()  # this thread's call settings, read by the engine
        self.callbacks = [*self.callbacks, _SettingsRecorder()]
        self._engine_spec = _ScriptedEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def copy(self, **kwargs):
        copied = super().copy(**kwargs)
        copied.pending = threading.local()
        copied._engine_spec = _ScriptedEngine(copied)
        copied._async_engine_spec = AsyncDummyEngine(copied._engine_spec)
        return copied


def echo_fields(**fixed: Any) -> Responder:
    """A responder that always returns the same output fields."""
    return lambda call: dict(fixed)


def user_turn(text: str) -> dict[str, str]:
    """A simulated user's scripted follow-up saying `text`, valid for both follow-up
    signatures: the state-aware one asks a reaction and a question (joined into the message),
    the paper one a message."""
    return {"reaction": "", "question": text, "message": text}


@dataclass
class CallCounter:
    counts: dict[str, int] = field(default_factory=dict)


def scripted_role_lms(
    simulator: Responder | ScriptedLM | None = None,
    agent: Responder | ScriptedLM | None = None,
    reflector: Responder | ScriptedLM | None = None,
):
    """`RoleLMs` whose three roles are scripted LMs (each defaults to a generic replier)."""
    from evolve.llm import RoleLMs

    def as_lm(value: Responder | ScriptedLM | None, role: str) -> ScriptedLM:
        if isinstance(value, ScriptedLM):
            return value
        return ScriptedLM(value or _generic_responder, model=f"scripted-{role}")

    return RoleLMs.from_lms(
        simulator=as_lm(simulator, "simulator"),
        agent=as_lm(agent, "agent"),
        reflector=as_lm(reflector, "reflector"),
    )


def _generic_responder(call: ScriptedCall) -> dict[str, Any]:
    """Fill every requested output field with a plausible value (1 for integers)."""
    fields = _requested_output_fields(call.system)
    return {name: (1 if kind == "integer" else f"scripted {name}") for name, kind in fields.items()}


def _requested_output_fields(system: str) -> dict[str, str]:
    """Parse the JSONAdapter's system prompt for output field names and their JSON types."""
    fields: dict[str, str] = {}
    section = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    for match in re.finditer(r"\d+\. `(\w+)` \(([^)]*)\)", section):
        name, type_text = match.group(1), match.group(2).lower()
        fields[name] = "integer" if "int" in type_text else "string"
    return fields
