import dspy
import pytest
from scripted_lm import ScriptedLM, scripted_role_lms

from evolve.llm.adapter import response_format_for


class Pick(dspy.Signature):
    """Pick an option."""

    question: str = dspy.InputField()
    choice: int = dspy.OutputField()


def test_usage_is_recorded_per_role():
    lms = scripted_role_lms(agent=lambda call: {"choice": 2})
    with lms.context("agent"):
        assert dspy.Predict(Pick)(question="q").choice == 2
        dspy.Predict(Pick)(question="r")
    usage = lms.usage.snapshot()
    assert usage.roles["agent"].calls == 2
    assert usage.roles["agent"].prompt_tokens > 0 and usage.roles["agent"].completion_tokens > 0
    assert "simulator" not in usage.roles
    later = lms.usage.snapshot().minus(usage)
    assert later.total_calls == 0


def test_failed_calls_are_counted():
    def broken(call):
        raise RuntimeError("server down")

    lms = scripted_role_lms(simulator=broken)
    with lms.context("simulator"), pytest.raises(Exception, match="server down"):
        dspy.Predict(Pick)(question="q")
    assert lms.usage.snapshot().roles["simulator"].failures == 1


def test_unparseable_output_raises_for_the_caller_to_count():
    lms = scripted_role_lms(agent=ScriptedLM(lambda call: "no json here"))
    with lms.context("agent"):
        try:
            dspy.Predict(Pick)(question="q")
            raised = False
        except Exception as error:  # DSPy's AdapterParseError
            raised = "parse" in type(error).__name__.lower()
    assert raised


def test_response_format_dialects():
    llama = response_format_for(Pick, "llama_cpp")
    assert llama["type"] == "json_object"
    assert llama["schema"]["properties"]["choice"]["type"] == "integer"
    openai = response_format_for(Pick, "json_schema")
    assert openai["type"] == "json_schema"
    assert openai["json_schema"]["schema"]["required"] == ["choice"]
    assert response_format_for(Pick, "json_object") == {"type": "json_object"}
    assert response_format_for(Pick, "none") is None
