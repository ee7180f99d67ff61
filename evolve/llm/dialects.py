"""Structured-output dialects: how a request asks a server to hold its reply to a JSON schema.

Servers differ in where the schema goes (OpenAI's strict `json_schema`, llama-cpp-python's
`json_object` with a `schema`, plain JSON mode, nothing). Each dialect is one entry in
`DIALECTS`; `EndpointConfig.structured_output`, the `--structured-output` choices and the
adapter all read that registry, so a new dialect is one function and one
`register_dialect(...)` line (see docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evolve.core.errors import ConfigError

JSON_MODE: dict[str, Any] = {"type": "json_object"}


@dataclass(frozen=True)
class StructuredOutputDialect:
    """`response_format(schema)` builds the request's `response_format` from the JSON schema
    of a signature's output fields; `schema` is None when those fields have none (an
    open-ended mapping), and a None result sends no `response_format` at all."""

    name: str
    description: str
    response_format: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    # False: the schema is never built for this dialect (building one costs ~1 ms).
    uses_schema: bool = True


DIALECTS: dict[str, StructuredOutputDialect] = {}


def register_dialect(dialect: StructuredOutputDialect) -> StructuredOutputDialect:
    existing = DIALECTS.get(dialect.name)
    if existing is not None and existing != dialect:
        raise ConfigError(f"structured-output dialect {dialect.name!r} is already registered")
    DIALECTS[dialect.name] = dialect
    return dialect


def dialect_named(name: str) -> StructuredOutputDialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown structured-output dialect {name!r}; choose one of {', '.join(DIALECTS)}"
        ) from None


def _openai_json_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        return JSON_MODE
    # OpenAI's strict mode rejects string length keywords; the prompt still shows them and
    # the parsed value is still validated (memory texts are clipped there).
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "outputs",
            "schema": _without_string_lengths(schema),
            "strict": True,
        },
    }


def _llama_cpp_python(schema: dict[str, Any] | None) -> dict[str, Any]:
    if schema is None:
        return JSON_MODE
    # llama-cpp-python's server reads a schema only from this (Anyscale-style) shape;
    # llama.cpp's grammars enforce string lengths (e.g. memory texts' maxLength).
    return {"type": "json_object", "schema": schema}


def _without_string_lengths(node: Any) -> Any:
    """A copy of a JSON schema without minLength/maxLength on string nodes."""
    if isinstance(node, list):
        return [_without_string_lengths(item) for item in node]
    if not isinstance(node, dict):
        return node
    is_string = node.get("type") == "string"
    return {
        key: _without_string_lengths(value)
        for key, value in node.items()
        if not (is_string and key in ("minLength", "maxLength"))
    }


register_dialect(
    StructuredOutputDialect(
        "json_schema", "OpenAI, vLLM, llama-server: strict json_schema", _openai_json_schema
    )
)
register_dialect(
    StructuredOutputDialect(
        "llama_cpp", "llama-cpp-python's server: json_object with a schema", _llama_cpp_python
    )
)
register_dialect(
    StructuredOutputDialect(
        "json_object", "plain JSON mode, no schema", lambda schema: JSON_MODE, uses_schema=False
    )
)
register_dialect(
    StructuredOutputDialect(
        "none", "no response_format: the prompt alone", lambda schema: None, uses_schema=False
    )
)
# The built-in names, in the order the config schema and --help list them.
BUILTIN_DIALECTS: tuple[str, ...] = tuple(DIALECTS)
