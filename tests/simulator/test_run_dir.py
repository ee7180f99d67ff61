"""Run directory layout and the config hash that guards resumption."""

from __future__ import annotations

import json

import pytest

from evolve.core.errors import DamagedRunFileError, ResumeMismatchError
from evolve.llm.usage import Usage
from evolve.simulator.run_dir import (
    RunLayout,
    config_differences,
    config_hash,
    read_json,
    read_object,
    read_record,
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


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"requests": 3, "prompt_tok', "not valid JSON"),
        (b"\x00\xff{garbage", "not a UTF-8 text file"),
        (b"", "not valid JSON"),
        (b'{"requests": "many"}', "not a Usage record"),
        (b"[1, 2]", "not a Usage record"),
    ],
    ids=["truncated", "garbled", "empty", "wrong field", "wrong shape"],
)
def test_a_damaged_run_file_is_one_line_naming_it(tmp_path, content, problem):
    path = tmp_path / "ledger.json"
    path.write_bytes(content)
    with pytest.raises(DamagedRunFileError) as damaged:
        read_record(path, Usage)
    message = str(damaged.value)
    assert "\n" not in message and str(path) in message and problem in message
    assert damaged.value.path == path and "delete it and rerun" in damaged.value.fix


def test_readers_say_what_they_expected(tmp_path):
    path = tmp_path / "report.json"
    path.write_text("[]", encoding="utf-8")
    assert read_json(path) == []
    with pytest.raises(DamagedRunFileError, match="expected a JSON object, found a list"):
        read_object(path)
    path.write_text('{"requests": 2}', encoding="utf-8")
    assert read_record(path, Usage).requests == 2


def test_a_damaged_unit_is_set_aside_with_the_later_ones(tmp_path):
    layout = RunLayout(tmp_path / "run")
    for period in range(3):
        layout.save_checkpoint("u", period, '{"memory": []}')
    layout.save_checkpoint("v", 0, '{"memory": []}')
    moved = layout.set_aside("u", 1)
    assert [path.name for path in moved] == ["damaged-period_01", "damaged-period_02"]
    assert layout.load_checkpoint("u", 0) is not None
    assert layout.load_checkpoint("u", 1) is None and layout.load_checkpoint("v", 0)
    # Set aside again later: the earlier copies are kept beside the new ones.
    layout.save_checkpoint("u", 1, '{"memory": []}')
    assert layout.set_aside("u", 1)[0].name == "damaged-period_01-2"
    # Gathering a run's units never finds what was set aside.
    assert not list((layout.root / "set_aside").glob("**/period_*/checkpoint.json"))


def test_a_checkpoint_must_be_a_json_object(tmp_path):
    layout = RunLayout(tmp_path)
    layout.save_checkpoint("u", 0, '{"memory": [')
    with pytest.raises(DamagedRunFileError, match="checkpoint.json"):
        layout.load_checkpoint("u", 0)
