"""DSPy's JSON adapter with JSON-schema constrained decoding in each server's dialect.

DSPy only asks for a schema when litellm knows the model supports one, which it cannot know
for a model served under an arbitrary name by vLLM or llama.cpp. Our endpoints declare their
dialect instead (`EndpointConfig.structured_output`), so even a 0.5B model is forced to emit
exactly the output fields, with the right types.
"""

from __future__ import annotations

from typing import Any, Literal

import dspy
import pydantic
from dspy.adapters.json_adapter import (
    _get_structured_outputs_response_format,
    _has_open_ended_mapping,
)

StructuredOutput = Literal["json_schema", "llama_cpp", "json_object", "none"]
STRUCTURED_OUTPUT_ATTRIBUTE = "evolve_structured_output"


def response_format_for(signature: type[dspy.Signature], dialect: StructuredOutput) -> Any:
    if dialect == "none":
        return None
    if dialect == "json_object" or _has_open_ended_mapping(signature):
        return {"type": "json_object"}
    try:
        model = _get_structured_outputs_response_format(signature)
    except (
        ValueError,
        pydantic.PydanticInvalidForJsonSchema,
        pydantic.PydanticSchemaGenerationError,
    ):
        return {"type": "json_object"}
    schema = model.model_json_schema()
    if dialect == "llama_cpp":
        # llama-cpp-python's server reads a schema only from this (Anyscale-style) shape.
        return {"type": "json_object", "schema": schema}
    return {
        "type": "json_schema",
        "json_schema": {"name": "outputs", "schema": schema, "strict": True},
    }


class StructuredJSONAdapter(dspy.JSONAdapter):
    """JSONAdapter that honours the structured-output dialect declared on the LM."""

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        dialect = getattr(lm, STRUCTURED_OUTPUT_ATTRIBUTE, None)
        if dialect is None:  # an LM we did not build (e.g. a test double): DSPy's own rule
            return super()._prepare_response_format(lm, lm_kwargs, signature)
        response_format = response_format_for(signature, dialect)
        if response_format is not None:
            lm_kwargs["response_format"] = response_format
