"""The LLM pipeline end to end on the embedded 0.5B model (slow; run by the lead).

A model this small often fails a classifier check; the pipeline must then exclude the user
and say where and why. Either way the outcome must be reported consistently.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_helpers import small_config

from evolve.simulator.synthesis import Stage, catalog_personas, synthesize_environment_llm
from evolve.simulator.synthesis.report import sum_usage

pytestmark = pytest.mark.integration

UNIT_PREFIX = {
    Stage.PROFILE: "profile",
    Stage.QUESTIONS: "questions",
    Stage.SCHEMA: "schema",
    Stage.INITIAL_STATE: "initial_state",
    Stage.UPDATES: "updates_p",
    Stage.EVENTS: "events_p",
    Stage.ANSWERS: "answers_q",
    Stage.QUERIES: "queries_p",
    Stage.ASSEMBLE: "item",
}


def test_one_user_two_periods_two_questions_is_generated_or_excluded_with_a_reason(
    role_lms_embedded, tmp_path: Path
) -> None:
    config = small_config(
        num_users=1,
        workers=1,
        answer_sentences="1",
        profile_chars=600,
        creative_temperature=0.7,
        retries={"stage_attempts": 2, "answer_refinements": 1, "query_refinements": 1},
    )
    before = role_lms_embedded.usage.snapshot()
    result = synthesize_environment_llm(
        config, role_lms_embedded, catalog_personas(1, seed=0), seed=0, work_dir=tmp_path
    )
    outcome = result.report.users[0]
    usage = sum_usage(outcome.usage)
    assert usage.calls >= 1
    assert usage.cache_hits == usage.calls or usage.prompt_tokens > 0  # a warm cache bills nothing
    spent = role_lms_embedded.usage.snapshot().minus(before).roles["simulator"]
    assert usage.calls == spent.calls
    if outcome.status == "included":
        assert outcome.stage is None and outcome.reason is None
        assert len(result.environment.items) == 1
        item = result.environment.items[0]
        assert item.problems() == []
        assert len(item.periods) == 3 and len(item.qas) == 2
        assert all(var.isascii() for var in item.state_schema)
    else:
        assert result.environment.items == []
        assert isinstance(outcome.stage, Stage) and outcome.reason
        assert outcome.unit.startswith(UNIT_PREFIX[outcome.stage])
        if outcome.stage is not Stage.ASSEMBLE:  # the failing stage's calls are accounted
            assert result.report.stage_totals()[outcome.stage.value].calls >= 1
    print(result.report.stage_table())
    print(result.report.user_table())
