"""Offline synthesis: catalog sanity, the paper's sampling constraints over many seeds,
determinism and per-user reproducibility."""

from __future__ import annotations

import itertools
import json
import re
import time
from datetime import date, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from evolve.core.errors import ConfigError
from evolve.simulator.environment import (
    CHOICE_EXPERIENCED,
    CHOICE_RANDOM,
    Environment,
    EnvironmentItem,
    dumps_environment,
)
from evolve.simulator.synthesis.catalogs import Catalog, load_catalog
from evolve.simulator.synthesis.offline import synthesize_environment, synthesize_user
from evolve.simulator.synthesis.presets import PRESETS, OfflineSynthesisConfig, get_preset


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


# --- catalog sanity ---------------------------------------------------------------------------


def test_catalog_size_and_shape(catalog: Catalog) -> None:
    assert len(catalog.variables) >= 40
    assert len(catalog.domains) >= 8
    assert len(catalog.questions) >= 25
    assert len(catalog.personas) >= 20
    assert catalog.problems() == []
    for variable in catalog.variables.values():
        assert len(variable.values) >= 3, variable.name
        assert len(variable.requests) >= 2, variable.name
        for value, paraphrases in variable.values.items():
            assert len(paraphrases) >= 2, (variable.name, value)
            assert len(set(paraphrases)) == len(paraphrases), (variable.name, value)
    for question in catalog.questions:
        assert 2 <= len(question.variables) <= 3, question.id
    for persona in catalog.personas:
        assert persona.name and persona.occupation and len(persona.profile) > 80


def test_every_question_answer_is_distinct_per_value_combination(catalog: Catalog) -> None:
    for question in catalog.questions:
        for size in range(2, len(question.variables) + 1):
            for subset in itertools.combinations(question.variables, size):
                answers = [
                    question.answer(dict(zip(subset, combination, strict=True)))
                    for combination in itertools.product(
                        *(catalog.variables[var].values for var in subset)
                    )
                ]
                assert len(set(answers)) == len(answers), (question.id, subset)


def test_paraphrases_and_requests_never_spell_out_any_value(catalog: Catalog) -> None:
    """Values are revealed indirectly, and no text names another variable's value."""
    values = {value.lower() for v in catalog.variables.values() for value in v.values}
    spelled = [value for value in values if len(value) >= 4]
    texts = [
        text
        for variable in catalog.variables.values()
        for text in [*variable.requests, *itertools.chain(*variable.values.values())]
    ] + [question.query for question in catalog.questions]
    offenders = [(text, value) for text in texts for value in spelled if value in text.lower()]
    assert offenders == []


def test_catalog_extension_directory(tmp_path: Path, catalog: Catalog) -> None:
    extra = {
        "variables": [
            {
                "name": "commute_length",
                "domain": "work",
                "label": "commute",
                "requests": ["Any audiobook ideas?", "How can I arrive less tired?"],
                "values": {
                    "short": ["Ten minutes door to door.", "I can be at my desk in no time."],
                    "long": ["Ninety minutes each way.", "Half my day is spent getting there."],
                },
            }
        ],
        "questions": [
            {
                "id": "commute_plan",
                "query": "How should I use my travel time?",
                "opening": "Try this.",
                "variables": ["commute_length", "reading_habit"],
                "advice": {
                    "commute_length": {"short": "Listen to one song.", "long": "Learn a skill."},
                    "reading_habit": {
                        value: f"Reading tip {index}."
                        for index, value in enumerate(catalog.variables["reading_habit"].values)
                    },
                },
            }
        ],
    }
    (tmp_path / "extra.json").write_text(json.dumps(extra), encoding="utf-8")
    merged = load_catalog([tmp_path])
    assert "commute_length" in merged.variables
    assert merged.question("commute_plan").variables == ["commute_length", "reading_habit"]
    assert len(merged.questions) == len(catalog.questions) + 1

    (tmp_path / "dup.json").write_text(
        json.dumps({"variables": extra["variables"]}), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="already defined"):
        load_catalog([tmp_path])


def test_catalog_format_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text('{"variables": [{"name": "x"}]}', encoding="utf-8")
    with pytest.raises(ConfigError, match="broken.json"):
        load_catalog([tmp_path])
    (tmp_path / "broken.json").write_text(
        json.dumps(
            {
                "questions": [
                    {
                        "id": "q",
                        "query": "Q?",
                        "opening": "",
                        "variables": ["diet_style", "no_such_variable"],
                        "advice": {"diet_style": {"vegan": "x"}},
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="no_such_variable"):
        load_catalog([tmp_path])


# --- synthesis invariants -----------------------------------------------------------------------

SESSION_TIME = re.compile(r"^\d{4}-\d{2}-\d{2} (19|20|21):\d{2}:\d{2}$")


def check_item(item: EnvironmentItem, config: OfflineSynthesisConfig, catalog: Catalog) -> None:
    assert item.problems() == []
    schema = item.state_schema
    # The schema is exactly the variables the questions require, in first-use order.
    required = list(dict.fromkeys(var for qa in item.qas for var in qa.required_info))
    assert list(schema) == required
    assert len(item.qas) == config.num_questions
    assert len(item.periods) == config.num_periods + 1
    low, high = config.choices_per_state
    for var, values in schema.items():
        assert low <= len(values) <= high
        assert set(values) <= set(catalog.variables[var].values)

    # Period 0 exposes every initial value, 1-3 variables per session.
    initial = item.periods[0]
    assert initial.period_start is None and initial.period_summary is None
    exposed = [var for s in initial.sessions for var in s.exposed_states]
    assert sorted(exposed) == sorted(schema)
    lo, hi = config.variables_per_initial_session
    for session in initial.sessions:
        assert lo <= len(session.exposed_states) <= hi and session.event is None
        assert session.exposed_values() == {v: initial.state[v] for v in session.exposed_states}
    assert {var: u.old for var, u in initial.updates.items()} == dict.fromkeys(schema)

    totals = dict.fromkeys(schema, 0)
    for index, period in enumerate(item.periods[1:], start=1):
        previous = item.periods[index - 1]
        changed = [var for var in schema if period.state[var] != previous.state[var]]
        assert sorted(changed) == sorted(period.updates)
        c_lo, c_hi = config.changes_per_period
        assert c_lo <= len(changed) <= c_hi
        for var in changed:
            totals[var] += 1
        assert period.update_cnts == totals  # cumulative counts
        revealed = [var for s in period.sessions for var in s.exposed_states]
        assert sorted(revealed) == sorted(changed)  # one session per change event
        e_lo, e_hi = config.changes_per_event
        for session in period.sessions:
            assert e_lo <= len(session.exposed_states) <= e_hi
            assert session.event and session.event[0].isupper()
        start = date.fromisoformat(period.period_start)
        end = date.fromisoformat(period.period_end)
        assert period.period_start == previous.period_end or index == 1
        for session in period.sessions:
            day = datetime.strptime(session.session_time, "%Y-%m-%d %H:%M:%S").date()
            assert start < day <= end
    assert max(totals.values()) <= config.max_changes_per_state
    assert item.periods[1].period_start == item.start_time == config.start_date.isoformat()

    for period in item.periods:
        times = [s.session_time for s in period.sessions]
        assert times == sorted(times) and len(set(times)) == len(times)
        assert all(SESSION_TIME.match(t) for t in times)
        for session in period.sessions:
            check_query(session.query, session.exposed_values(), schema, catalog)

    trajectory = [period.state for period in item.periods]
    for qa_index, qa in enumerate(item.qas):
        assert len(qa.required_info) == config.states_per_question
        seen = {tuple(state[var] for var in qa.required_info) for state in trajectory}
        states = [tuple(choice.state) for choice in qa.answer_choices]
        assert len(states) == max(len(seen), config.min_state_variants)
        for choice in qa.answer_choices:
            expected = CHOICE_EXPERIENCED if tuple(choice.state) in seen else CHOICE_RANDOM
            assert choice.type == expected
        assert seen <= set(states)
        assert len({choice.answer for choice in qa.answer_choices}) == len(states)
        for period_index in range(len(item.periods)):
            gold = item.gold_choice_index(period_index, qa_index)
            assert tuple(qa.answer_choices[gold].state) == item.gold_state(period_index, qa_index)
        for values in schema.values():  # asked without revealing any state
            for value in values:
                assert not re.search(rf"\b{re.escape(value)}\b", qa.query, re.IGNORECASE)


def check_query(
    query: str, exposed: dict[str, str], schema: dict[str, list[str]], catalog: Catalog
) -> None:
    """The opening message paraphrases exactly the exposed values and no other tracked one."""
    for var, value in exposed.items():
        assert any(p in query for p in catalog.variables[var].values[value]), (var, query)
    for var, values in schema.items():
        for value in values:
            if exposed.get(var) == value:
                continue
            for paraphrase in catalog.variables[var].values[value]:
                assert paraphrase not in query, (var, value, query)
    requests = [r for var in exposed for r in catalog.variables[var].requests]
    assert any(query.endswith(request) for request in requests)


@pytest.mark.parametrize("seed", range(40))
def test_tiny_invariants_over_seeds(seed: int, catalog: Catalog) -> None:
    config = PRESETS["tiny"]
    env = synthesize_environment(config, seed, catalog=catalog)
    assert len(env.items) == config.num_users == 4
    for item in env.items:
        check_item(item, config, catalog)
        # Small enough for a 0.5B model on 2 CPU cores.
        assert sum(len(p.sessions) for p in item.periods) <= 10


@pytest.mark.parametrize(("preset", "seeds"), [("v1.base", range(4)), ("v1.extra", range(2))])
def test_v1_invariants_over_seeds(preset: str, seeds: range, catalog: Catalog) -> None:
    config = PRESETS[preset]
    for seed in seeds:
        for item in synthesize_environment(config, seed, 5, catalog=catalog).items:
            check_item(item, config, catalog)


def test_random_padding_appears_when_the_trajectory_has_few_variants(catalog: Catalog) -> None:
    config = PRESETS["tiny"]
    env = synthesize_environment(config, 0, 20, catalog=catalog)
    types = [c.type for item in env.items for qa in item.qas for c in qa.answer_choices]
    assert CHOICE_RANDOM in types and CHOICE_EXPERIENCED in types


def test_choice_positions_are_shuffled(catalog: Catalog) -> None:
    """The gold choice must not sit at a fixed position (e.g. random padding always last)."""
    env = synthesize_environment(PRESETS["v1.base"], 3, 10, catalog=catalog)
    last_is_random = [
        qa.answer_choices[-1].type == CHOICE_RANDOM
        for item in env.items
        for qa in item.qas
        if any(c.type == CHOICE_RANDOM for c in qa.answer_choices)
    ]
    assert last_is_random and not all(last_is_random)


def test_presets_match_the_paper_settings() -> None:
    base, extra, tiny = PRESETS["v1.base"], PRESETS["v1.extra"], PRESETS["tiny"]
    assert (base.num_periods, base.num_questions, base.states_per_question) == (10, 10, 2)
    assert base.choices_per_state == (3, 3) and base.max_changes_per_state == 3
    assert base.changes_per_period[0] <= 4 <= base.changes_per_period[1]
    assert (base.rounds_initial, base.rounds_update, base.num_users) == (1, 2, 20)
    assert (extra.num_periods, extra.states_per_question) == (20, 3)
    assert (extra.rounds_initial, extra.rounds_update, extra.num_users) == (2, 5, 20)
    assert (tiny.num_periods, tiny.num_questions, tiny.states_per_question) == (2, 2, 2)
    assert tiny.choices_per_state == (2, 3) and tiny.changes_per_period == (1, 2)
    assert (tiny.rounds_initial, tiny.rounds_update, tiny.num_users) == (1, 1, 4)


# --- determinism ----------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_json(catalog: Catalog) -> None:
    config = PRESETS["v1.base"]
    first = dumps_environment(synthesize_environment(config, 7, 3, catalog=catalog))
    second = dumps_environment(synthesize_environment(config, 7, 3, catalog=load_catalog()))
    assert first == second


def test_different_seeds_differ(catalog: Catalog) -> None:
    config = PRESETS["tiny"]
    texts = {
        dumps_environment(synthesize_environment(config, s, catalog=catalog)) for s in range(5)
    }
    assert len(texts) == 5


def test_users_are_reproducible_individually(catalog: Catalog) -> None:
    config = PRESETS["v1.base"]
    env = synthesize_environment(config, 11, 6, catalog=catalog)
    alone = synthesize_user(config, 11, 4, catalog=catalog)
    assert alone.to_original() == env.items[4].to_original()
    fewer = synthesize_environment(config, 11, 2, catalog=catalog)
    assert fewer.to_original() == env.to_original()[:2]
    assert len({item.id for item in env.items}) == 6
    # The first len(personas) users all get different personas.
    many = synthesize_environment(PRESETS["tiny"], 0, len(catalog.personas), catalog=catalog)
    names = {item.user_profile["name"] for item in many.items}
    assert len(names) == len(catalog.personas)


def test_generated_file_round_trips(catalog: Catalog) -> None:
    env = synthesize_environment(PRESETS["tiny"], 5, catalog=catalog)
    text = dumps_environment(env)
    again = Environment.from_original(json.loads(text))
    assert dumps_environment(again) == text
    assert again.content_hash() == env.content_hash()
    profile = again.items[0].user_profile
    assert isinstance(profile, dict) and profile["formatted_str"].startswith("name: ")
    assert profile["uuid"] == again.items[0].id


def test_v1_base_twenty_users_generate_quickly(catalog: Catalog) -> None:
    started = time.perf_counter()
    env = synthesize_environment(PRESETS["v1.base"], 0, catalog=catalog)
    assert len(env.items) == 20
    assert time.perf_counter() - started < 5.0


# --- configuration errors -------------------------------------------------------------------------


def test_config_rejects_impossible_shapes() -> None:
    base = PRESETS["tiny"].model_dump()
    with pytest.raises(ValidationError, match="min_state_variants"):
        OfflineSynthesisConfig(**{**base, "choices_per_state": 2, "min_state_variants": 5})
    with pytest.raises(ValidationError, match="minimum above its maximum"):
        OfflineSynthesisConfig(**{**base, "changes_per_period": (3, 1)})
    with pytest.raises(ValidationError, match="evenings"):
        OfflineSynthesisConfig(**{**base, "period_unit": "days", "period_length": 1})
    days = OfflineSynthesisConfig(**{**base, "period_unit": "days", "period_length": 7})
    item = synthesize_user(days, 0, 0)
    assert item.periods[2].period_end == "2020-10-15"


def test_infeasible_change_budget_is_a_config_error(catalog: Catalog) -> None:
    config = OfflineSynthesisConfig(
        num_periods=20,
        num_questions=1,
        states_per_question=2,
        choices_per_state=3,
        changes_per_period=2,
        max_changes_per_state=1,
        min_state_variants=2,
    )
    with pytest.raises(ConfigError, match="max_changes_per_state"):
        synthesize_user(config, 0, 0, catalog=catalog)


def test_unknown_preset_and_too_many_questions(catalog: Catalog) -> None:
    with pytest.raises(ConfigError, match="v1.base"):
        get_preset("v2")
    config = PRESETS["tiny"].model_copy(update={"num_questions": len(catalog.questions) + 1})
    with pytest.raises(ConfigError, match="questions"):
        synthesize_environment(config, 0, 1, catalog=catalog)
