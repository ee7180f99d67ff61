"""DSPy's JSON adapter with JSON-schema constrained decoding in each server's dialect
(`evolve.llm.dialects`).

DSPy only asks for a schema when litellm knows the model supports one, which it cannot know
for a model served under an arbitrary name by vLLM or llama.cpp. Our endpoints declare their
dialect instead (`EndpointConfig.structured_output`), so even a 0.5B model is forced to emit
exactly the output fields, with the right types.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Hashable
from typing import Any

import dspy
import pydantic
from dspy.adapters.json_adapter import (
    _get_structured_outputs_response_format,
    _has_open_ended_mapping,
)

from evolve.llm.dialects import StructuredOutputDialect, dialect_named

STRUCTURED_OUTPUT_ATTRIBUTE = "evolve_structured_output"


def response_format_for(signature: type[dspy.Signature], dialect: str) -> Any:
    """The `response_format` of a structured call in `dialect` (a `DIALECTS` name)."""
    chosen = dialect_named(dialect)
    if not chosen.uses_schema:
        return chosen.response_format(None)
    # Building the schema creates a pydantic model: ~1 ms a call, and policies derive a new
    # signature class per call (`with_instructions`), so the cache is keyed by what the
    # schema is made of (the output fields), not by the class.
    key = _output_fields_key(signature)
    if key is None:
        return chosen.response_format(_output_schema(signature))
    # Stored as JSON text: each caller gets its own copy (json.loads is ~10x cheaper than
    # a deepcopy of the schema), so no request can change another's.
    return json.loads(_cached_response_format(key, chosen, signature))


def _output_fields_key(signature: type[dspy.Signature]) -> Hashable | None:
    """What the schema is built from: (name, annotation, default) of each output field;
    None when an annotation is unhashable (then the schema is built afresh)."""
    key = tuple(
        (name, field.annotation, repr(getattr(field, "default", None)))
        for name, field in signature.output_fields.items()
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


_FORMATS: dict[tuple[Hashable, str], str] = {}
_FORMATS_LOCK = threading.Lock()
_FORMATS_MAX = 512  # distinct output-field sets; a process uses a handful


def _cached_response_format(
    key: Hashable, dialect: StructuredOutputDialect, signature: type[dspy.Signature]
) -> str:
    with _FORMATS_LOCK:
        if (key, dialect.name) in _FORMATS:
            return _FORMATS[(key, dialect.name)]
    built = json.dumps(dialect.response_format(_output_schema(signature)))
    with _FORMATS_LOCK:
        if len(_FORMATS) >= _FORMATS_MAX:
            _FORMATS.clear()
        _FORMATS[(key, dialect.name)] = built
    return built


def _output_schema(signature: type[dspy.Signature]) -> dict[str, Any] | None:
    """The JSON schema of the output fields; None where they have none (open-ended
    mappings, types pydantic cannot describe): the dialects fall back to JSON mode."""
    if _has_open_ended_mapping(signature):
        return None
    try:
        model = _get_structured_outputs_response_format(signature)
    except (
        ValueError,
        pydantic.PydanticInvalidForJsonSchema,
        pydantic.PydanticSchemaGenerationError,
    ):
        return None
    return model.model_json_schema()


def _fields_key(signature: type[dspy.Signature]) -> Hashable | None:
    """(kind, name, annotation) of every field; None when an annotation is unhashable."""
    key = tuple(
        (kind, name, field.annotation)
        for kind, fields in (("in", signature.input_fields), ("out", signature.output_fields))
        for name, field in fields.items()
    )
    try:
        hash(key)
    except TypeError:
        return None
    return key


_STRUCTURES: dict[Hashable, str] = {}


class StructuredJSONAdapter(dspy.JSONAdapter):
    """JSONAdapter that honours the structured-output dialect declared on the LM."""

    def format_field_structure(self, signature: type[dspy.Signature]) -> str:
        # The system message's field layout (names and type notes, some with a JSON schema)
        # is rebuilt by DSPy on every call, ~1 ms; it depends on the fields only, and
        # policies derive a new signature class per call, hence a key by content.
        key = _fields_key(signature)
        if key is None:
            return super().format_field_structure(signature)
        with _FORMATS_LOCK:
            cached = _STRUCTURES.get(key)
        if cached is None:
            cached = super().format_field_structure(signature)
            with _FORMATS_LOCK:
                if len(_STRUCTURES) >= _FORMATS_MAX:
                    _STRUCTURES.clear()
                _STRUCTURES[key] = cached
        return cached

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        dialect = getattr(lm, STRUCTURED_OUTPUT_ATTRIBUTE, None)
        if dialect is None:  # an LM we did not build (e.g. a test double): DSPy's own rule
            return super()._prepare_response_format(lm, lm_kwargs, signature)
        response_format = response_format_for(signature, dialect)
        if response_format is not None:
            lm_kwargs["response_format"] = response_format
