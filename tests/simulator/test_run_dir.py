"""Run directory layout and the config hash that guards resumption."""

from __future__ import annotations

import json

import pytest

from evolve.core.errors import ResumeMismatchError
from evolve.simulator.run_dir import (
    RunLayout,
    config_differences,
    config_hash,
    safe_name,
)


def test_config_hash_ignores_key_order_but_not_values():
    assert config_hash({"a": 1, "b": {"c": 2, "d": 3}}) == config_hash(
        {"b": {"d": 3, "c": 2}, "a": 1}
    )
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_config_differences_name_each_changed_leaf():
    old = {"policy": {"kind": "native", "parameters": {"top_k": 3}}, "episode": {"seed": 0}}
    new = {"policy": {"kind": "native", "parameters": {"top_k": 5}}, "episode": {"seed": 0}}
    assert config_differences(old, new) == ["policy.parameters.top_k: 3 -> 5"]
    assert config_differences({"a": 1}, {"b": 1}) == ["a: 1 -> '<absent>'", "b: '<absent>' -> 1"]


def test_open_run_creates_then_accepts_the_same_config_and_refuses_another(tmp_path):
    layout = RunLayout(tmp_path / "run")
    config = {"episode": {"rounds_update": 1}, "models": {"agent": "a"}}
    digest = layout.open_run(config)
    stored = json.loads(layout.run_file.read_text())
    assert stored["config_hash"] == digest and stored["config"] == config
    assert layout.open_run(dict(config)) == digest
    changed = {"episode": {"rounds_update": 2}, "models": {"agent": "b"}}
    with pytest.raises(ResumeMismatchError) as error:
        layout.open_run(changed)
    message = str(error.value)
    assert "episode.rounds_update: 1 -> 2" in message and "models.agent: 'a' -> 'b'" in message
    assert "another output directory" in message


def test_layout_paths_and_safe_user_names(tmp_path):
    layout = RunLayout(tmp_path)
    assert layout.result_file("u", 3) == tmp_path / "users" / "u" / "period_03" / "result.json"
    assert safe_name("a/b c:d") == "a_b_c_d"
    assert safe_name("..") == "user"
