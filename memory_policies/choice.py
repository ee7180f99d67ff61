"""The `evolve` variant's multiple-choice prompt: lean, for small models.

DSPy's JSON adapter frames every call with a field-structure preamble (input and output
headings, type notes, an "All interactions will be structured..." paragraph) and repeats the
inputs under `[[ ## name ## ]]` markers. On the bundled 1.5B that framing costs answers: from
the same ideal memories it chose the right option 0.618 of the time, against 0.708 with the
plain layout below (`benchmarks/answer_from_memory.py`, 144 questions), in about half the
time. The layout:

- system message: the `use` instruction (an evolvable component), then each context input
  (memory, recent messages) under its field description;
- user message: the question, its numbered options and the output request;
- the reply constrained by the ambient adapter's structured-output rule (a JSON schema with
  one integer on the embedded server), parsed as JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dspy

# Inputs that form the question itself (the user message); every other input is context.
QUESTION_INPUTS = ("question", "options")
NO_MESSAGES = "(no messages)"


class LeanChoiceAdapter(dspy.JSONAdapter):
    """Formats a choose signature (inputs incl. `question` and `options`, one int output) as
    two plain messages; asks for the output the way the `ambient` adapter would."""

    def __init__(self, ambient: dspy.Adapter | None = None) -> None:
        super().__init__()
        self._ambient = ambient

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        # The ambient adapter knows the endpoint's structured-output dialect (the toolkit's
        # own adapter reads it from the LM); DSPy's rule otherwise.
        if isinstance(self._ambient, dspy.JSONAdapter):
            return self._ambient._prepare_response_format(lm, lm_kwargs, signature)
        return super()._prepare_response_format(lm, lm_kwargs, signature)

    def format(self, signature, demos, inputs) -> list[dict[str, Any]]:
        context = [signature.instructions.strip()]
        for name, field in signature.input_fields.items():
            value = str(inputs.get(name, "")).strip()
            if name in QUESTION_INPUTS or not value or value == NO_MESSAGES:
                continue
            context.append(f"{_description(field, name).capitalize()}:\n{value}")
        (output_name, output_field) = next(iter(signature.output_fields.items()))
        request = (
            f"{inputs.get('question', '')}\n\nOptions:\n{inputs.get('options', '')}\n\n"
            f"Answer with {_description(output_field, output_name)}, as JSON "
            f'{{"{output_name}": n}}.'
        )
        return [
            {"role": "system", "content": "\n\n".join(context)},
            {"role": "user", "content": request},
        ]


def _description(field: Any, name: str) -> str:
    extra = getattr(field, "json_schema_extra", None) or {}
    return str(extra.get("desc") or name)


@contextmanager
def lean_choice() -> Iterator[None]:
    """Run the enclosed multiple-choice calls with the lean layout (the LM stays the ambient
    one, and so does the structured-output rule)."""
    with dspy.context(adapter=LeanChoiceAdapter(dspy.settings.adapter)):
        yield
