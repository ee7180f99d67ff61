"""The spec building blocks shared by experiment and study specs (`evolve.core.spec_base`)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from evolve.core.errors import ConfigError
from evolve.core.spec_base import IntRange, format_validation_error
from evolve.optimize.parameters import RandomStepProposer
from evolve.spec.config import OptimizerSpec, spec_from_dict
from evolve.tuning.spec import TuningSpec


def test_one_range_type_serves_the_optimizer_bounds_and_the_tuning_space():
    bounds = OptimizerSpec.model_fields["parameters"].annotation.__args__[1]
    assert bounds is IntRange
    assert IntRange in TuningSpec.model_fields["parameters"].annotation.__args__[1].__args__


def test_range_values_and_membership_follow_the_step():
    span = IntRange(low=2, high=8, step=3)
    assert span.values() == [2, 5, 8]
    assert span.contains(5) and not span.contains(4) and not span.contains(11)
    with pytest.raises(ValidationError, match="multiple of step"):
        IntRange(low=1, high=8, step=3)


def test_random_step_proposals_stay_on_the_range_grid():
    bounds = {"update_every": IntRange(low=2, high=10, step=2)}
    proposer = RandomStepProposer(max_step=2)
    rng = random.Random(0)
    seen = {proposer.propose({"update_every": 6}, bounds, rng)["update_every"] for _ in range(50)}
    assert seen == {2, 4, 8, 10}


def test_the_formatter_names_the_key_and_the_valid_keys_of_its_root():
    with pytest.raises(ConfigError, match=r"optimizer\.bogus: unknown key in \[optimizer\]"):
        spec_from_dict({"optimizer": {"bogus": 1}})
    try:
        IntRange.model_validate({"low": 1, "hgh": 2})
    except ValidationError as error:
        text = format_validation_error("range", error, IntRange)
    assert text.startswith("range: ")
    assert "hgh: unknown key in the top level; valid keys: low, high, step" in text
    assert "high: required key is missing" in text


def test_every_pydantic_input_error_is_worded_by_the_one_formatter(tmp_path):
    """The LLM synthesis config, the catalogs and environment items use the spec wording:
    unknown keys answered with the valid ones, a wrong value shown with what was received."""
    from evolve.simulator.environment import Environment, InconsistentEnvironmentError
    from evolve.simulator.synthesis import synthesis_config_from_dict
    from evolve.simulator.synthesis.catalogs import load_catalog

    with pytest.raises(ConfigError) as caught:
        synthesis_config_from_dict({"preset": "tiny", "workerz": 2})
    assert "workerz: unknown key in the top level; valid keys: " in str(caught.value)
    assert "synthesize_llm.toml" in str(caught.value)

    (tmp_path / "broken.json").write_text('{"variables": 3}', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_catalog([tmp_path])
    assert "broken.json" in str(caught.value) and "(got 3)" in str(caught.value)

    with pytest.raises(InconsistentEnvironmentError) as caught:
        Environment.from_original([{"id": "u1", "start_time": 5}])
    assert any("start_time" in line and "(got 5)" in line for line in caught.value.problems)


def test_without_its_model_the_formatter_still_names_each_problem():
    try:
        IntRange.model_validate({"low": "one", "high": 2, "extra": 1})
    except ValidationError as error:
        text = format_validation_error("invalid value", error, None)
    assert "low: " in text and "(got 'one')" in text
    assert "extra: unknown key in the top level" in text and "valid keys" not in text
