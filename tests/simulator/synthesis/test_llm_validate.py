"""Stage output checks: each problem is found and phrased so the LLM can fix it."""

from __future__ import annotations

from llm_helpers import QUESTIONS, small_config

from evolve.simulator.synthesis.signatures import (
    ChangeDraft,
    EventDraft,
    QuestionDraft,
    VariableGroup,
    VariableOptions,
)
from evolve.simulator.synthesis.validate import (
    QuestionSpec,
    check_changes,
    check_events,
    check_groups,
    check_profile,
    check_questions,
    check_texts,
    check_unified,
    min_variables,
    normalize_identifier,
    quoted_identifiers,
)

CONFIG = small_config()


def specs() -> list[QuestionSpec]:
    result, problems = check_questions([QuestionDraft.model_validate(q) for q in QUESTIONS], CONFIG)
    assert problems == []
    return result


def test_identifiers_are_ascii_snake_case() -> None:
    assert normalize_identifier("Work Mode (2-3 days)") == "work_mode_2_3_days"
    assert normalize_identifier("Café-au-lait") == "cafe_au_lait"
    assert normalize_identifier("工作方式") == ""


def test_profile_needs_a_short_name_matching_a_known_one() -> None:
    assert check_profile(" Ada  Lovelace ", "Math.", "Ada Lovelace") == (
        ("Ada Lovelace", "Math."),
        [],
    )
    assert check_profile("", "x", None)[1]
    assert check_profile("Ada is a mathematician who likes long walks by the sea", "x", None)[1]
    assert "not the one written" in check_profile("Bob", "x", "Ada Lovelace")[1][0]
    assert "summary is empty" in check_profile("Ada", " ", None)[1][0]


def test_questions_count_items_and_options() -> None:
    drafts = [QuestionDraft.model_validate(q) for q in QUESTIONS]
    result, problems = check_questions(drafts + drafts[:1], CONFIG)
    assert problems == [] and len(result) == 2  # extra questions are dropped
    assert "exactly 2 are needed" in check_questions(drafts[:1], CONFIG)[1][0]

    one_info = QuestionDraft(question="Q?", required_info=drafts[0].required_info[:1])
    assert "exactly 2" in check_questions([one_info, drafts[1]], CONFIG)[1][0]

    many = drafts[0].model_copy(deep=True)
    many.required_info[1].info_choices = ["a", "b", "c", "d"]
    assert "needs 2 to 3" in " ".join(check_questions([many, drafts[1]], CONFIG)[1])

    chinese = drafts[0].model_copy(deep=True)
    chinese.required_info[0].info_type = "工作方式"
    assert "English snake_case" in " ".join(check_questions([chinese, drafts[1]], CONFIG)[1])

    same = drafts[0].model_copy(deep=True)
    same.required_info[1].info_type = "Work Mode"
    assert "repeat" in " ".join(check_questions([same, drafts[1]], CONFIG)[1])
    assert "repeats an earlier" in " ".join(check_questions([drafts[0], drafts[0]], CONFIG)[1])


def test_groups_partition_info_types_and_keep_a_questions_facts_apart() -> None:
    questions = specs()
    good = [
        VariableGroup(name="Work Setup", merges=["work_mode", "remote_work"]),
        VariableGroup(name="budget", merges=["budget_level"]),
        VariableGroup(name="fitness", merges=["fitness_level"]),
    ]
    mapping, problems = check_groups(good, questions, CONFIG)
    assert problems == []
    assert mapping["remote_work"] == "work_setup" and mapping["budget_level"] == "budget"

    missing, problems = check_groups(good[:2], questions, CONFIG)
    assert "['fitness_level'] are in no variable" in problems[0]

    twice = [*good, VariableGroup(name="money", merges=["budget_level"])]
    assert "in both 'budget' and 'money'" in " ".join(check_groups(twice, questions, CONFIG)[1])

    together = [
        VariableGroup(name="work_and_money", merges=["work_mode", "budget_level", "remote_work"]),
        good[2],
    ]
    problems = check_groups(together, questions, CONFIG)[1]
    assert "question 1 needs ['work_mode', 'budget_level'] as separate facts" in problems[0]

    unknown = [*good, VariableGroup(name="x", merges=["salary"])]
    assert "not one of the info types" in " ".join(check_groups(unknown, questions, CONFIG)[1])


def test_too_few_variables_for_the_horizon_is_refused() -> None:
    config = small_config(num_periods=6, changes_per_period=[2, 2], max_changes_per_state=2)
    assert min_variables(config) == 6
    groups = [
        VariableGroup(name="work_setup", merges=["work_mode", "remote_work"]),
        VariableGroup(name="budget", merges=["budget_level"]),
        VariableGroup(name="fitness", merges=["fitness_level"]),
    ]
    assert "need 6; merge less" in check_groups(groups, specs(), config)[1][0]


def test_unified_options() -> None:
    unified, problems = check_unified(
        [VariableOptions(name="work_setup", options=["Office", "Hybrid", "Remote"])],
        ["work_setup"],
        CONFIG,
    )
    assert problems == [] and unified == {"work_setup": ["office", "hybrid", "remote"]}
    assert "no options were given" in check_unified([], ["work_setup"], CONFIG)[1][0]
    one = [VariableOptions(name="work_setup", options=["office"])]
    assert "needs 2 to 3" in check_unified(one, ["work_setup"], CONFIG)[1][0]


SCHEMA = {
    "work_setup": ["office", "hybrid", "remote"],
    "budget": ["tight", "moderate", "generous"],
    "fitness": ["beginner", "active"],
}
STATE = {"work_setup": "office", "budget": "tight", "fitness": "beginner"}


def changes(*pairs: tuple[str, str]) -> list[ChangeDraft]:
    return [ChangeDraft(variable=var, new_value=value) for var, value in pairs]


def test_state_changes_keys_values_counts_and_budgets() -> None:
    counts = dict.fromkeys(SCHEMA, 0)
    result, problems = check_changes(
        changes(("Budget", "Moderate")), SCHEMA, STATE, counts, CONFIG, 1
    )
    assert problems == [] and result == {"budget": "moderate"}

    def problem(drafts, counts=counts, period=1, config=CONFIG) -> str:
        return " ".join(check_changes(drafts, SCHEMA, STATE, counts, config, period)[1])

    assert "'salary' is not a variable" in problem(changes(("salary", "high")))
    assert "not an option of 'budget'" in problem(changes(("budget", "rich")))
    assert "already 'tight'" in problem(changes(("budget", "tight")))
    assert "changed twice" in problem(changes(("budget", "moderate"), ("budget", "generous")))
    assert "0 variables changed; this period needs 1 to 2" in problem([])
    three = changes(("budget", "moderate"), ("fitness", "active"), ("work_setup", "remote"))
    assert "3 variables changed" in problem(three)
    spent = {"work_setup": 0, "budget": 2, "fitness": 0}
    assert "the maximum" in problem(changes(("budget", "moderate")), counts=spent)


def test_changes_that_starve_later_periods_are_refused() -> None:
    config = small_config(num_periods=3, changes_per_period=[2, 2], max_changes_per_state=2)
    counts = {"work_setup": 1, "budget": 1, "fitness": 0}
    # After changing work_setup and budget again only fitness has budget left (2 changes),
    # but one more period needs 2 different variables.
    drafts = changes(("work_setup", "hybrid"), ("budget", "moderate"))
    problems = check_changes(drafts, SCHEMA, STATE, counts, config, 2)[1]
    assert "too few possible changes for the 1 later periods" in problems[0]
    assert check_changes(drafts, SCHEMA, STATE, counts, config, 3)[1] == []


def test_events_partition_the_changes() -> None:
    changed, unchanged = ["budget", "fitness"], ["work_setup"]
    good = [EventDraft(variables=["fitness", "Budget"], event="Joined a rowing club.")]
    events, problems = check_events(good, changed, unchanged)
    assert problems == [] and events == [(["budget", "fitness"], "Joined a rowing club.")]

    def problem(drafts) -> str:
        return " ".join(check_events(drafts, changed, unchanged)[1])

    assert "['fitness'] are explained by no event" in problem(
        [EventDraft(variables=["budget"], event="Got a raise.")]
    )
    assert "'work_setup', which did not change" in problem(
        [*good, EventDraft(variables=["work_setup"], event="Moved desks.")]
    )
    assert "more than one event" in problem([*good, EventDraft(variables=["budget"], event="x")])
    assert "no description" in problem([EventDraft(variables=changed, event=" ")])
    assert "lists no variables" in problem([*good, EventDraft(variables=[], event="Nothing.")])


def test_texts_and_quoted_identifiers() -> None:
    assert check_texts(["a", "b"], 2, "answers") == (["a", "b"], [])
    assert "exactly 3" in check_texts(["a", "b"], 3, "answers")[1][0]
    assert "identical" in check_texts(["Same  text", "same text"], 2, "answers")[1][0]
    assert "empty" in check_texts(["a", " "], 2, "answers")[1][0]
    assert quoted_identifiers("My work_setup is remote", ["work_setup", "budget"]) == ["work_setup"]
    assert quoted_identifiers("my budget is tight", ["budget"]) == []
