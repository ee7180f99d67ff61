"""Reflective mutation: the `reflector` LM rewrites one policy component from feedback.

Two prompts, chosen by the protocol (`ProtocolRules.reflector_prompt`):

- ``hinted`` (protocol evolve): a DSPy signature whose instructions say that the failures
  must not happen again, to store facts that changed, to stay general, and to use at most
  120 words;
- ``reference`` (protocol paper): the reference code's content in our words: an empty system
  message, then one user message with the current text, the feedback and the request to
  improve the text from the feedback in a similar format, answered as a JSON object read as
  the reference reads it (a json fence, else the whole text); no length cap.

Diversity: at temperature 0 with DSPy's response cache, two proposals for the same parent,
component and feedback would be the same text. Each proposal therefore carries its own
`rollout_id` (part of DSPy's cache key) and a nonzero temperature, passed per call through
the predictor's `config`, plus a `seed` derived from the experiment seed so that endpoints
that honour it sample reproducibly. Callers also vary the component and the feedback subset.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

from evolve.llm import RoleLMs, call_events
from evolve.optimize.edits import proposal_problem
from memory_policies.paper import load_reference_json

REFLECT_INSTRUCTIONS = (
    "You improve the long-term memory of a personal AI assistant. `current_text` is one part "
    "of its instructions; `feedback` shows how the assistant did when later asked questions "
    "about its user. Rewrite `current_text` so these failures do not happen again: keep what "
    "works, add what is missing (e.g. kinds of facts it failed to store or to keep up to "
    "date when they changed), and stay general - never copy one user's facts. Return the "
    "complete new text."
)

# What each component controls, in the reflector's words.
COMPONENT_ROLES = {
    "write": "how the assistant turns new conversation messages into long-term memory entries",
    "write.types_to_remember": "the list of types of information about the user that the "
    "memory writer must store and keep up to date (a numbered list)",
    "read": "how the assistant selects the memories relevant to the current message",
    "use": "how the assistant uses its memory to reply and to answer questions about the user",
}


class ProposeInstruction(dspy.Signature):
    part: str = dspy.InputField(desc="what this text controls")
    current_text: str = dspy.InputField(desc="the current text of that part")
    feedback: str = dspy.InputField(desc="how the assistant did")
    new_text: str = dspy.OutputField(
        desc="the complete improved text: plain text, at most 120 words"
    )


# What each component is, named as the reference's reflector request names its section.
REFERENCE_PART_NAMES = {
    "write.types_to_remember": "the section of the memory writer's prompt that lists the "
    "types of information to remember",
}


def reference_reflect_message(component: str, part: str, current_text: str, feedback: str) -> str:
    """The user message of the reference-style reflector request (our wording; the
    reference's content: the current text, the feedback, improve it in a similar format)."""
    name = REFERENCE_PART_NAMES.get(component, f"the instruction text that controls {part}")
    return (
        f"Here is {name}:\n\n{current_text}\n\n"
        f"Feedback from its recent use:\n{feedback}\n\n"
        "Revise it using the feedback. Keep a similar format, with a clear description of "
        "each entry.\n"
        "Reply with only this JSON object:\n"
        '```json\n{"new_text": "<the revised text>", "changes": ["<one short line per '
        'change>"]}\n```'
    )


class ReferenceReflectAdapter(dspy.Adapter):
    """Sends a `ProposeInstruction` call as the reference's reflector request: an empty
    system message and one user message; reads `new_text` from the JSON reply."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, signature, demos, inputs):
        message = reference_reflect_message(
            self.component, inputs["part"], inputs["current_text"], inputs["feedback"]
        )
        return [{"role": "system", "content": ""}, {"role": "user", "content": message}]

    def parse(self, signature, completion):
        try:
            data = load_reference_json(completion)
            text = data.get("new_text") if isinstance(data, dict) else None
            if not isinstance(text, str):
                raise ValueError('expected a JSON object with a string "new_text"')
        except (ValueError, json.JSONDecodeError) as error:
            raise AdapterParseError(
                adapter_name=type(self).__name__,
                signature=signature,
                lm_response=completion,
                message=" ".join(str(error).split())[:300],
            ) from None
        return {"new_text": text}


@dataclass(frozen=True)
class ReflectorPrompt:
    """How the reflector is asked: the adapter that sends its request (None: the role's own
    adapter) and whether the prompt holds a proposal to `max_instruction_chars`."""

    adapter: Callable[[str], dspy.Adapter] | None
    caps_length: bool


# By `ProtocolRules.reflector_prompt`: the reference's content (an empty system message, no
# length cap) or ours (the hinted instructions, at most 120 words).
REFLECTOR_PROMPTS: dict[str, ReflectorPrompt] = {
    "reference": ReflectorPrompt(adapter=ReferenceReflectAdapter, caps_length=False),
    "hinted": ReflectorPrompt(adapter=None, caps_length=True),
}


@dataclass(frozen=True)
class Proposal:
    """A reflector output: the new text, or why there is none (counted, never replaced)."""

    text: str | None
    error: str | None = None
    parse_failed: bool = False


def proposal_feedback(records: Sequence[Mapping[str, Any]]) -> str:
    """The feedback one proposal shows: its records' feedback texts, in order."""
    return "\n\n".join(str(r.get("Feedback", "")) for r in records if r.get("Feedback"))


class Reflector:
    """Proposes a new text for one component; stateless apart from the fixed predictor."""

    def __init__(
        self,
        lms: RoleLMs,
        *,
        temperature: float,
        max_chars: int | None,
        role: str = "reflector",
        check_proposals: bool = True,
        prompt: ReflectorPrompt = REFLECTOR_PROMPTS["hinted"],
    ) -> None:
        """`role` is the LM role that answers: "reflector", or "agent" under the paper's
        protocol (its reflector is the agent's own model). `check_proposals` refuses texts
        that are not valid for their component (`edits.proposal_problem`). `max_chars` None:
        no length limit. `prompt`: the protocol's (see the module docstring)."""
        self.lms = lms
        self.role = role
        self.temperature = temperature
        self.max_chars = max_chars
        self.check_proposals = check_proposals
        self.prompt = prompt
        self.predictor = dspy.Predict(ProposeInstruction.with_instructions(REFLECT_INSTRUCTIONS))

    def propose(
        self, component: str, current_text: str, feedback: str, *, rollout_id: int, seed: int
    ) -> Proposal:
        part = COMPONENT_ROLES.get(component, f"the '{component}' instruction")
        config = {"rollout_id": rollout_id, "temperature": self.temperature, "seed": seed}
        try:
            with (
                call_events.purpose("reflection"),
                self.lms.context(self.role),
                self._adapter(component),
            ):
                prediction = self.predictor(
                    part=part,
                    current_text=current_text,
                    feedback=feedback or "(no feedback)",
                    config=config,
                )
        except AdapterParseError as error:
            message = " ".join(str(error).split())[:200]
            return Proposal(
                text=None, error=f"unparseable reflector output: {message}", parse_failed=True
            )
        text = str(prediction.new_text or "").strip()
        if not text:
            return Proposal(text=None, error="the reflector returned an empty text")
        if self.max_chars is not None and len(text) > self.max_chars:
            return Proposal(
                text=None,
                error=f"the reflector's text has {len(text)} characters, more than "
                f"max_instruction_chars = {self.max_chars}",
            )
        problem = self.problem(component, text, feedback)
        if problem is not None:
            return Proposal(text=None, error=f"refused proposal: {problem}")
        return Proposal(text=text)

    def _adapter(self, component: str):
        """The reference-style request under the paper's prompt; else the role's own adapter."""
        if self.prompt.adapter is None:
            return contextlib.nullcontext()
        return dspy.context(adapter=self.prompt.adapter(component))

    def problem(self, component: str, text: str, feedback: str) -> str | None:
        """Why `text` may not replace `component` (None: it may, or checks are off)."""
        if not self.check_proposals:
            return None
        return proposal_problem(component, text, feedback)
