"""Environment data model: lossless original-format import/export, gold lookups, validation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evolve.core.errors import EnvironmentDataError
from evolve.simulator.environment import (
    Environment,
    EnvironmentItem,
    InconsistentEnvironmentError,
    dumps_environment,
    load_environment,
    save_environment,
)

FIXTURE = Path(__file__).parent / "data" / "original_small.json"
ITEM_ID = "0b6f3a52-9d1e-4c57-8f0a-2d6c1e9b7a10"


def raw_fixture() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def problems_of(data: list[dict[str, Any]]) -> list[str]:
    return Environment.from_original(data).problems()


# --- lossless import / export -------------------------------------------------------------


def test_original_file_loads_and_saves_back_to_equal_json_with_key_order(tmp_path: Path) -> None:
    original = raw_fixture()
    env = load_environment(FIXTURE)
    out = tmp_path / "saved.json"
    save_environment(env, out)
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved == original
    # Equal as text when both are dumped without sorting: key order survived at every level.
    assert json.dumps(saved, ensure_ascii=False) == json.dumps(original, ensure_ascii=False)


def test_unknown_keys_and_both_profile_shapes_are_kept() -> None:
    env = load_environment(FIXTURE)
    first, second = env.items
    assert first.to_original()["lang"] == "en"
    assert first.periods[0].sessions[0].to_original()["messages"] == []
    assert isinstance(first.user_profile, dict)
    assert first.profile_text().startswith("name: Renée Dubois")
    assert second.user_profile == "A retired teacher who enjoys crosswords."
    assert second.profile_text() == "A retired teacher who enjoys crosswords."
    # Absent keys stay absent (the second item's sessions have no "messages").
    assert "messages" not in second.periods[0].sessions[0].to_original()


def test_exposed_values_unwrap_one_element_lists_but_export_keeps_them() -> None:
    env = load_environment(FIXTURE)
    session = env.items[0].periods[0].sessions[1]
    assert session.exposed_values() == {"diet_preference": "no restrictions"}
    assert session.to_original()["exposed_states"] == {"diet_preference": ["no restrictions"]}


def test_constructed_item_exports_in_original_key_order() -> None:
    item = EnvironmentItem.model_validate(raw_fixture()[1])
    rebuilt = EnvironmentItem(
        qas=item.qas,
        periods=item.periods,
        state_schema=item.state_schema,
        user_profile=item.user_profile,
        start_time=item.start_time,
        id=item.id,
    )
    assert list(rebuilt.to_original()) == [
        "id",
        "start_time",
        "user_profile",
        "state_schema",
        "periods",
        "qas",
    ]


def test_content_hash_ignores_formatting_and_key_order_but_not_content() -> None:
    data = raw_fixture()
    env = Environment.from_original(data)
    reordered = [dict(reversed(list(item.items()))) for item in data]
    assert Environment.from_original(reordered).content_hash() == env.content_hash()
    changed = copy.deepcopy(data)
    changed[0]["qas"][0]["query"] += "?"
    assert Environment.from_original(changed).content_hash() != env.content_hash()
    assert len(env.content_hash()) == 64


def test_save_is_atomic_and_overwrites(tmp_path: Path) -> None:
    env = load_environment(FIXTURE)
    out = tmp_path / "nested" / "env.json"
    out.parent.mkdir()
    out.write_text("old content", encoding="utf-8")
    save_environment(env, out)
    assert out.read_text(encoding="utf-8") == dumps_environment(env)
    assert sorted(p.name for p in out.parent.iterdir()) == ["env.json"]  # no temp leftovers


# --- gold lookups ---------------------------------------------------------------------------


def test_gold_state_and_choice_per_period() -> None:
    item = load_environment(FIXTURE).items[0]
    assert item.gold_state(0, 0) == ("light walking", "no restrictions")
    assert [item.gold_choice_index(p, 0) for p in range(3)] == [1, 2, 0]


def test_last_write_period_is_the_latest_set_or_exposure() -> None:
    item = load_environment(FIXTURE).items[0]
    assert item.last_write_period("diet_preference", 0) == 0
    assert item.last_write_period("diet_preference", 1) == 0
    assert item.last_write_period("diet_preference", 2) == 2
    assert item.last_write_period("exercise_routine", 1) == 1
    assert item.last_write_period("exercise_routine", 2) == 1


def test_gold_choice_missing_raises_naming_item_period_question() -> None:
    data = raw_fixture()
    del data[0]["qas"][0]["answer_choices"][0]
    item = Environment.from_original(data).items[0]
    with pytest.raises(EnvironmentDataError, match=rf"item '{ITEM_ID}' period 2: question 0"):
        item.gold_choice_index(2, 0)


# --- validation: one test per kind of inconsistency -------------------------------------------


def assert_one_problem(problems: list[str], *fragments: str) -> None:
    matching = [p for p in problems if all(fragment in p for fragment in fragments)]
    assert matching, f"no problem mentions {fragments}: {problems}"


def test_fixture_is_consistent() -> None:
    assert problems_of(raw_fixture()) == []


def test_state_value_outside_schema() -> None:
    data = raw_fixture()
    data[0]["periods"][1]["state"]["exercise_routine"] = "yoga"
    data[0]["periods"][1]["updates"]["exercise_routine"]["new"] = "yoga"
    assert_one_problem(
        problems_of(data), f"item '{ITEM_ID}' period 1", "'exercise_routine'", "'yoga'", "schema"
    )


def test_exposed_value_disagreeing_with_period_state() -> None:
    data = raw_fixture()
    data[0]["periods"][2]["sessions"][0]["exposed_states"]["diet_preference"] = "vegetarian"
    assert_one_problem(
        problems_of(data),
        f"item '{ITEM_ID}' period 2 session 0",
        "'diet_preference'",
        "'vegetarian'",
        "'low-carb'",
    )


def test_exposed_value_outside_schema() -> None:
    data = raw_fixture()
    data[0]["periods"][0]["sessions"][0]["exposed_states"]["exercise_routine"] = "jogging"
    assert_one_problem(
        problems_of(data), f"item '{ITEM_ID}' period 0 session 0", "'exercise_routine'", "jogging"
    )


def test_question_without_a_choice_for_some_period_gold_state() -> None:
    data = raw_fixture()
    del data[0]["qas"][0]["answer_choices"][0]  # the gold choice of period 2
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' question 0 period 2", "no answer choice")
    assert not any("period 1: no answer choice" in p for p in problems)


def test_duplicate_choice_states() -> None:
    data = raw_fixture()
    choices = data[0]["qas"][0]["answer_choices"]
    choices[3]["state"] = list(choices[1]["state"])
    assert_one_problem(
        problems_of(data), f"item '{ITEM_ID}' question 0 choice 3", "duplicate choice state"
    )


def test_unknown_variables_in_state_exposure_question_and_updates() -> None:
    data = raw_fixture()
    item = data[0]
    item["periods"][1]["state"]["mood"] = "happy"
    item["periods"][1]["sessions"][0]["exposed_states"]["sleep"] = "good"
    item["qas"][0]["required_info"].append("budget")
    item["periods"][2]["update_cnts"]["hobby"] = 1
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' period 1", "unknown variable 'mood'")
    assert_one_problem(problems, f"item '{ITEM_ID}' period 1 session 0", "'sleep'")
    assert_one_problem(problems, f"item '{ITEM_ID}' question 0", "unknown variable 'budget'")
    assert_one_problem(problems, f"item '{ITEM_ID}' period 2", "update_cnts", "'hobby'")


def test_missing_state_value_and_unexposed_initial_value() -> None:
    data = raw_fixture()
    del data[0]["periods"][0]["sessions"][1]  # diet_preference never revealed in period 0
    del data[0]["periods"][1]["state"]["diet_preference"]
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' period 0", "'diet_preference'", "no session")
    assert_one_problem(problems, f"item '{ITEM_ID}' period 1", "no value", "'diet_preference'")


def test_updates_that_disagree_with_the_trajectory() -> None:
    data = raw_fixture()
    data[0]["periods"][2]["updates"]["diet_preference"]["old"] = "vegetarian"
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' period 2", "'diet_preference'", "starts from")
    data = raw_fixture()
    data[0]["periods"][2]["state"]["exercise_routine"] = "none"  # changes without an update
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' period 2", "'exercise_routine'", "without")


def test_choice_state_with_wrong_length_and_duplicate_ids() -> None:
    data = raw_fixture()
    data[0]["qas"][0]["answer_choices"][3]["state"] = ["none"]
    data[1]["id"] = data[0]["id"]
    problems = problems_of(data)
    assert_one_problem(problems, f"item '{ITEM_ID}' question 0 choice 3", "1 values")
    assert_one_problem(problems, f"item '{ITEM_ID}'", "duplicate id")


def test_structural_errors_name_the_item_and_field() -> None:
    data = raw_fixture()
    del data[1]["qas"][0]["query"]
    data[0]["periods"][0]["update_cnts"]["exercise_routine"] = "one"
    with pytest.raises(InconsistentEnvironmentError) as caught:
        Environment.from_original(data)
    problems = caught.value.problems
    assert_one_problem(problems, "item #1 ('plain-profile-user')", "qas.0.query")
    assert_one_problem(problems, f"item #0 ('{ITEM_ID}')", "update_cnts.exercise_routine")


def test_load_rejects_inconsistent_files_unless_unchecked(tmp_path: Path) -> None:
    data = raw_fixture()
    data[0]["periods"][1]["state"]["exercise_routine"] = "yoga"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InconsistentEnvironmentError) as caught:
        load_environment(path)
    assert "'yoga'" in str(caught.value) and str(path) in str(caught.value)
    assert len(caught.value.problems) >= 1
    assert load_environment(path, check=False).items[0].id == ITEM_ID


def test_load_errors_for_missing_file_bad_json_and_wrong_top_level(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentDataError, match="does not exist"):
        load_environment(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"id": 1,', encoding="utf-8")
    with pytest.raises(EnvironmentDataError, match="not valid JSON.*line 1"):
        load_environment(broken)
    single = tmp_path / "single.json"
    single.write_text(json.dumps(raw_fixture()[0]), encoding="utf-8")
    with pytest.raises(EnvironmentDataError, match="expected a JSON list"):
        load_environment(single)
