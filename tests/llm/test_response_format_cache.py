"""The structured-output schema is built once per set of output fields:
policies derive a new signature class per call, which must not rebuild the schema."""

from __future__ import annotations

import json
from typing import Literal

import dspy

from evolve.llm import adapter
from evolve.llm.adapter import response_format_for


class Choose(dspy.Signature):
    """Pick an option."""

    question: str = dspy.InputField()
    choice: int = dspy.OutputField()


class Label(dspy.Signature):
    """Label the text."""

    text: str = dspy.InputField()
    label: Literal["a", "b"] = dspy.OutputField()


def test_same_output_fields_share_one_schema_build(monkeypatch):
    built = []
    original = adapter._output_schema
    monkeypatch.setattr(adapter, "_output_schema", lambda sig: built.append(sig) or original(sig))
    monkeypatch.setattr(adapter, "_FORMATS", {})
    first = response_format_for(Choose.with_instructions("one"), "json_schema")
    second = response_format_for(Choose.with_instructions("two"), "json_schema")
    assert len(built) == 1
    assert first == second
    assert first["json_schema"]["schema"] == original(Choose)
    # Callers get their own copy: changing one leaves the next untouched.
    first["json_schema"]["schema"]["properties"].clear()
    assert response_format_for(Choose, "json_schema") == second


def test_different_output_fields_or_dialects_get_their_own_schema():
    label = response_format_for(Label, "json_schema")
    assert label["json_schema"]["schema"]["properties"]["label"]["enum"] == ["a", "b"]
    assert response_format_for(Choose, "json_schema") != label
    llama = response_format_for(Label, "llama_cpp")
    assert llama == {"type": "json_object", "schema": label["json_schema"]["schema"]}
    assert response_format_for(Label, "none") is None


def test_field_structure_is_dspy_own_and_built_once_per_field_set(monkeypatch):
    monkeypatch.setattr(adapter, "_STRUCTURES", {})
    built = []
    original = dspy.JSONAdapter.format_field_structure

    def counting(self, signature):
        built.append(signature)
        return original(self, signature)

    monkeypatch.setattr(dspy.JSONAdapter, "format_field_structure", counting)
    structured = adapter.StructuredJSONAdapter()
    one = structured.format_field_structure(Choose.with_instructions("one"))
    two = structured.format_field_structure(Choose.with_instructions("two"))
    assert one == two == original(dspy.JSONAdapter(), Choose)
    assert len(built) == 1
    label = structured.format_field_structure(Label)
    assert label == original(dspy.JSONAdapter(), Label) != one
    assert len(built) == 2


def test_string_lengths_reach_llama_cpp_but_not_strict_json_schema():
    # llama.cpp's grammar enforces maxLength; OpenAI's strict mode rejects the keyword.
    from memory_policies.in_context import InContextWrite

    llama = json.dumps(response_format_for(InContextWrite, "llama_cpp"))
    strict = json.dumps(response_format_for(InContextWrite, "json_schema"))
    assert '"maxLength": 200' in llama
    assert "maxLength" not in strict and '"value"' in strict
