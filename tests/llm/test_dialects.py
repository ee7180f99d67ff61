"""Structured-output dialects are registry entries: the config, the command line and the
adapter read `DIALECTS`, so a registered dialect is usable everywhere at once."""

from __future__ import annotations

import argparse

import dspy
import pytest
from pydantic import ValidationError

from evolve.commands.llm_flags import add_llm_arguments
from evolve.commands.spec_schema import SPEC_SCHEMAS
from evolve.llm.adapter import response_format_for
from evolve.llm.config import EndpointConfig
from evolve.llm.dialects import (
    BUILTIN_DIALECTS,
    DIALECTS,
    JSON_MODE,
    StructuredOutputDialect,
    register_dialect,
)


class Pick(dspy.Signature):
    question: str = dspy.InputField()
    choice: int = dspy.OutputField()


@pytest.fixture
def grammar_dialect():
    """A dialect registered the way a plugin would, removed again afterwards."""

    def as_grammar(schema):
        return JSON_MODE if schema is None else {"type": "grammar", "json_schema": schema}

    yield register_dialect(
        StructuredOutputDialect("grammar", "a server that takes a schema as a grammar", as_grammar)
    )
    DIALECTS.pop("grammar")


def test_the_builtin_dialects_are_the_registry_entries():
    assert BUILTIN_DIALECTS == ("json_schema", "llama_cpp", "json_object", "none")
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    (action,) = [a for a in parser._actions if a.dest == "structured_output"]
    assert list(action.choices) == list(DIALECTS)
    schema = SPEC_SCHEMAS["experiment"]()
    field = schema["$defs"]["EndpointConfig"]["properties"]["structured_output"]
    assert field["enum"] == list(BUILTIN_DIALECTS)


def test_each_dialect_shapes_the_response_format():
    strict = response_format_for(Pick, "json_schema")
    assert strict["type"] == "json_schema" and strict["json_schema"]["strict"] is True
    assert response_format_for(Pick, "llama_cpp")["schema"]["properties"]["choice"]
    assert response_format_for(Pick, "json_object") == JSON_MODE
    assert response_format_for(Pick, "none") is None


def test_a_registered_dialect_is_accepted_by_the_config_and_used_by_the_adapter(
    grammar_dialect,
):
    endpoint = EndpointConfig(model="m", structured_output="grammar")
    assert endpoint.structured_output == "grammar"
    built = response_format_for(Pick, "grammar")
    assert built["type"] == "grammar" and "choice" in built["json_schema"]["properties"]
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    assert parser.parse_args(["--structured-output", "grammar"]).structured_output == "grammar"


def test_an_unknown_dialect_is_refused_with_the_choices():
    with pytest.raises(ValidationError, match="unknown structured-output dialect 'xml'.*none"):
        EndpointConfig(model="m", structured_output="xml")
