"""The LLM synthesis pipeline with a scripted simulator: every validation path (pass,
retry/refine then pass, exhaust then exclude-and-report), resume, and token attribution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_helpers import PipelinePlayer, input_fields, small_config, wrong_match
from scripted_lm import ScriptedLM, scripted_role_lms

from evolve.simulator.environment import CHOICE_EXPERIENCED, CHOICE_RANDOM, Environment
from evolve.simulator.synthesis import (
    Stage,
    SynthesisResult,
    catalog_personas,
    synthesize_environment_llm,
)
from evolve.simulator.synthesis.report import sum_usage, usage_cost


def run(
    player: PipelinePlayer, work_dir: Path, users: int = 1, seed: int = 7, **overrides
) -> SynthesisResult:
    config = small_config(**overrides)
    lms = scripted_role_lms(simulator=ScriptedLM(player, model="scripted-simulator"))
    personas = catalog_personas(users, seed)
    return synthesize_environment_llm(config, lms, personas, seed=seed, work_dir=work_dir)


def test_clean_run_produces_a_valid_environment_and_accounts_every_stage(tmp_path: Path) -> None:
    player = PipelinePlayer()
    result = run(player, tmp_path)
    env = result.environment
    assert len(env.items) == 1 and env.problems() == []
    item = env.items[0]
    # Merged info types: work_mode + remote_work became one variable with unified options.
    assert item.state_schema == {
        "work_setup": ["office", "hybrid", "remote"],
        "budget": ["tight", "moderate", "generous"],
        "fitness": ["beginner", "active", "athlete"],
    }
    assert [qa.required_info for qa in item.qas] == [
        ["work_setup", "budget"],
        ["work_setup", "fitness"],
    ]
    assert len(item.periods) == 3
    for qa in item.qas:
        assert len(qa.answer_choices) == 3
        assert {c.type for c in qa.answer_choices} == {CHOICE_EXPERIENCED, CHOICE_RANDOM}
    assert all(s.event for p in item.periods[1:] for s in p.sessions)
    profile = item.user_profile
    assert isinstance(profile, dict) and profile["name"] in profile["formatted_str"]
    # It round-trips through the original data.json format.
    assert Environment.from_original(env.to_original()).problems() == []

    assert player.counts["profile"] == 1 and player.counts["questions"] == 1
    assert player.counts["group"] == 1 and player.counts["unify"] == 1
    assert player.counts["update"] == 2 and player.counts["events"] == 2
    assert player.counts["answers"] == 2 and player.counts["match"] == 6
    assert player.counts["queries"] == 3
    assert player.counts["refine_answer"] == player.counts["refine_query"] == 0

    report = result.report
    outcome = report.users[0]
    assert outcome.status == "included" and outcome.stage is None
    stages = report.stage_totals()
    assert list(stages) == [s.value for s in Stage if s is not Stage.ASSEMBLE]
    assert all(usage.prompt_tokens > 0 and usage.completion_tokens > 0 for usage in stages.values())
    assert stages["answers"].calls == 2 + 6
    assert report.total().calls == sum(player.counts.values())
    assert usage_cost(report.total(), report.prices) > 0
    assert "answers" in report.stage_table() and "total" in report.stage_table()


def test_invalid_update_is_retried_with_the_problem_fed_back(tmp_path: Path) -> None:
    def unknown_variable(call, seen):
        if seen == 1:
            return {"period_summary": "x", "changes": [{"variable": "salary", "new_value": "high"}]}
        return None

    player = PipelinePlayer({"update": unknown_variable})
    result = run(player, tmp_path)
    assert result.environment.problems() == [] and len(result.environment.items) == 1
    assert player.counts["update"] == 3  # period 1 twice, period 2 once
    first, second = player.prompts("update")[:2]
    assert "none" in input_fields_of(first)["feedback"]
    assert "'salary' is not a variable" in input_fields_of(second)["feedback"]
    usage = result.report.users[0].usage["updates"]
    assert usage.rejected == 1 and usage.calls == 3


def input_fields_of(user_text: str) -> dict[str, str]:
    from scripted_lm import ScriptedCall

    return input_fields(ScriptedCall(messages=[], user=user_text))


def test_unparseable_output_is_counted_and_retried(tmp_path: Path) -> None:
    player = PipelinePlayer({"profile": lambda call, seen: "no json here" if seen == 1 else None})
    result = run(player, tmp_path)
    assert len(result.environment.items) == 1
    usage = result.report.users[0].usage["profile"]
    assert usage.parse_failures == 1 and usage.calls == 2
    assert "not valid JSON" in input_fields_of(player.prompts("profile")[1])["feedback"]


def test_answer_refined_once_then_passes(tmp_path: Path) -> None:
    player = PipelinePlayer(
        {"match": lambda call, seen: wrong_match(call, seen) if seen == 1 else None}
    )
    result = run(player, tmp_path)
    assert len(result.environment.items) == 1
    assert player.counts["refine_answer"] == 1
    outcome = result.report.users[0]
    assert outcome.refinements == {"answers_q00": 1}
    assert outcome.usage["answers"].rejected == 1


def test_answer_failing_after_refinements_excludes_the_user_with_stage_and_reason(
    tmp_path: Path,
) -> None:
    player = PipelinePlayer({"match": wrong_match})
    result = run(player, tmp_path)
    assert result.environment.items == []
    outcome = result.report.users[0]
    assert outcome.status == "excluded" and outcome.stage is Stage.ANSWERS
    assert outcome.unit == "answers_q00" and "classifier matched it to" in outcome.reason
    assert "after 1 refinement(s)" in outcome.reason
    assert outcome.refinements == {"answers_q00": 1}
    assert player.counts["refine_answer"] == 1 and player.counts["queries"] == 0
    # The exclusion is persisted: a rerun reports it again without any LLM call.
    again = PipelinePlayer()
    rerun = run(again, tmp_path)
    assert sum(again.counts.values()) == 0
    assert rerun.report.users[0].stage is Stage.ANSWERS
    assert rerun.report.users[0].reason == outcome.reason
    assert rerun.report.users[0].usage_this_run == {}
    assert sum_usage(rerun.report.users[0].usage).calls == sum(player.counts.values())


def test_query_not_recovered_after_refinement_excludes_at_queries(tmp_path: Path) -> None:
    def misread(call, seen):
        fields = input_fields(call)
        options = {}
        for line in fields["variables"].splitlines():
            var, values = line[2:].split(": ")
            options[var] = values.split(" | ")
        return {"inferred": {var: values[-1] for var, values in options.items()}}

    player = PipelinePlayer({"infer": misread})
    result = run(player, tmp_path)
    outcome = result.report.users[0]
    assert outcome.status == "excluded" and outcome.stage is Stage.QUERIES
    assert outcome.unit == "queries_p00"
    assert "session 1:" in outcome.reason and "read as" in outcome.reason
    assert player.counts["refine_query"] == 1


def test_stage_exhausting_its_attempts_excludes_the_user(tmp_path: Path) -> None:
    player = PipelinePlayer({"events": lambda call, seen: {"events": []}})
    result = run(player, tmp_path)
    outcome = result.report.users[0]
    assert outcome.stage is Stage.EVENTS
    assert outcome.unit == "events_p01"
    assert "still invalid after 2 attempt(s)" in outcome.reason
    assert "explained by no event" in outcome.reason


def test_identifiers_stay_ascii_in_another_language(tmp_path: Path) -> None:
    def chinese_first(call, seen):
        if seen > 1:
            return {"questions": [{**q, "question": f"问题 {i}"} for i, q in enumerate(QUESTIONS)]}
        bad = json.loads(json.dumps(QUESTIONS))
        bad[0]["required_info"][0]["info_type"] = "工作方式"
        return {"questions": bad}

    from llm_helpers import QUESTIONS

    player = PipelinePlayer({"questions": chinese_first})
    result = run(player, tmp_path, lang="zh")
    assert "English snake_case" in input_fields_of(player.prompts("questions")[1])["feedback"]
    assert input_fields_of(player.prompts("questions")[0])["language"] == "Chinese"
    item = result.environment.items[0]
    assert item.qas[0].query == "问题 0"
    assert all(var.isascii() for var in item.state_schema)


def test_crash_mid_pipeline_resumes_without_repeating_finished_stages(tmp_path: Path) -> None:
    def crash(call, seen):
        raise RuntimeError("endpoint went away")

    crashing = PipelinePlayer({"answers": crash})
    with pytest.raises(Exception, match="endpoint went away"):
        run(crashing, tmp_path / "work")
    assert crashing.counts["answers"] >= 1

    resumed_player = PipelinePlayer()
    resumed = run(resumed_player, tmp_path / "work")
    finished = ["profile", "questions", "group", "unify", "initial", "update", "events"]
    assert all(resumed_player.counts[stage] == 0 for stage in finished)
    assert resumed_player.counts["answers"] == 2 and resumed_player.counts["queries"] == 3
    outcome = resumed.report.users[0]
    assert outcome.status == "included"
    assert "profile" in outcome.resumed_units and "events_p02" in outcome.resumed_units
    assert set(outcome.usage_this_run) == {"answers", "queries"}
    # Identical to an uninterrupted run, and its token totals include the resumed stages.
    fresh = run(PipelinePlayer(), tmp_path / "fresh")
    assert resumed.environment.to_original() == fresh.environment.to_original()
    assert resumed.report.stage_totals()["questions"] == fresh.report.stage_totals()["questions"]


def test_changed_config_does_not_reuse_stage_outputs(tmp_path: Path) -> None:
    run(PipelinePlayer(), tmp_path)
    player = PipelinePlayer()
    run(player, tmp_path, answer_sentences="1")
    assert player.counts["profile"] == 1
    same = PipelinePlayer()
    run(same, tmp_path, workers=3)  # workers do not change content: fully resumed
    assert sum(same.counts.values()) == 0
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 2


def test_concurrent_users_get_their_own_tokens(tmp_path: Path) -> None:
    alone = {}
    for index in range(3):
        config = small_config(workers=1)
        persona = catalog_personas(3, 7)[index]
        lms = scripted_role_lms(simulator=ScriptedLM(PipelinePlayer(), model="scripted-simulator"))
        result = synthesize_environment_llm(
            config, lms, [persona], seed=7, work_dir=tmp_path / f"alone{index}"
        )
        alone[persona.user_id] = result.report.users[0].usage

    player = PipelinePlayer()
    lms = scripted_role_lms(simulator=ScriptedLM(player, model="scripted-simulator"))
    before = lms.usage.snapshot()
    result = synthesize_environment_llm(
        small_config(workers=3), lms, catalog_personas(3, 7), seed=7, work_dir=tmp_path / "together"
    )
    assert len(result.environment.items) == 3 and result.environment.problems() == []
    for outcome in result.report.users:
        assert outcome.usage == alone[outcome.user_id]
    delta = lms.usage.snapshot().minus(before).roles["simulator"]
    total = result.report.total()
    assert (total.prompt_tokens, total.completion_tokens) == (
        delta.prompt_tokens,
        delta.completion_tokens,
    )
    assert total.calls == delta.calls


def test_a_crashing_user_stops_the_others_and_all_resume(tmp_path: Path) -> None:
    def crash_for_one_user(call, seen):
        if "Hiroshi" in call.user:
            raise RuntimeError("endpoint went away")
        return None

    crashing = PipelinePlayer({"questions": crash_for_one_user})
    with pytest.raises(Exception, match="endpoint went away"):
        run(crashing, tmp_path, users=3, workers=3)
    resumed_player = PipelinePlayer()
    result = run(resumed_player, tmp_path, users=3, workers=3)
    assert len(result.environment.items) == 3 and result.environment.problems() == []
    # The crashed user's finished profile is not redone (the others' progress is racy).
    assert not any("Hiroshi" in prompt for prompt in resumed_player.prompts("profile"))
