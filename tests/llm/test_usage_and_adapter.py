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


def test_the_usage_table_splits_evaluated_from_reused_prompt_tokens_and_gives_per_question():
    from evolve.llm.usage import Usage, UsageSummary

    usage = UsageSummary(
        roles={
            "agent": Usage(
                calls=30,
                prompt_tokens=9000,
                prompt_tokens_cached=6000,
                completion_tokens=1200,
                latency_s=50.0,
            ),
            "simulator": Usage(
                calls=10,
                prompt_tokens=3000,
                prompt_tokens_cached=0,
                completion_tokens=400,
                latency_s=20.0,
            ),
        }  # fmt: skip
    )
    agent_row = next(line for line in usage.table().splitlines() if line.startswith("agent"))
    assert agent_row.split()[5:8] == ["3000", "6000", "1200"]  # evaluated, reused, decoded
    # Every column is explained under the table.
    legend = usage.table().splitlines()[-3:]
    for column in (
        "calls:",
        "cached:",
        "sent:",
        "failed:",
        "evaluated =",
        "reused =",
        "slot time:",
    ):
        assert any(column in line for line in legend), column
    line = usage.per_question(20)
    assert line == (
        "per scored question (20): 2.0 calls, 300 prompt tokens evaluated, 300 reused (50%), "
        "80 decoded"
    )
    assert usage.per_question(0) is None
