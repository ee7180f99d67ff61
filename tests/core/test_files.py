"""The one atomic writer (`evolve.core.files`): whole file or old file, fsynced, no leftovers."""

from __future__ import annotations

import json
import os

import pytest

import evolve.core.files
from evolve.core.files import atomic_write_json, atomic_write_text


def test_atomic_write_leaves_no_temporary_file_and_replaces_content(tmp_path):
    path = tmp_path / "deep" / "file.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(path.parent) == ["file.json"]


def test_atomic_write_keeps_the_old_file_when_serialization_fails(tmp_path):
    path = tmp_path / "file.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        atomic_write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["file.json"]


def test_atomic_write_fsyncs_the_data_before_the_rename(tmp_path, monkeypatch):
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        evolve.core.files.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        evolve.core.files.os,
        "replace",
        lambda source, target: (events.append("replace"), real_replace(source, target))[1],
    )
    atomic_write_text(tmp_path / "notes.txt", "ünïcode\n")
    assert events == ["fsync", "replace"]
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "ünïcode\n"


def test_atomic_write_json_layout_options_keep_each_writers_bytes(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"k": [1]})
    atomic_write_json(tmp_path / "b.json", {"k": [1]}, indent=1, final_newline=False)
    assert (tmp_path / "a.json").read_text() == '{\n  "k": [\n    1\n  ]\n}\n'
    assert (tmp_path / "b.json").read_text() == '{\n "k": [\n  1\n ]\n}'


def test_safe_name_is_one_rule_for_every_name_on_disk():
    from evolve.core.files import safe_name

    assert safe_name("a/b c:d") == "a_b_c_d"
    assert safe_name("..") == "user" and safe_name("") == "user"
    assert safe_name("_x.") == "x"  # never hidden, never a trailing dot
    assert safe_name("m" * 200) == "m" * 120  # under every file system's name limit
    # Cut first, then trimmed: a cut that ends on a dot still yields a clean name.
    assert safe_name("a" * 59 + "._b", fallback="model", max_length=60) == "a" * 59
    assert safe_name("///", fallback="model") == "model"


def test_the_synthesis_work_dir_names_users_by_the_same_rule(tmp_path):
    from evolve.simulator.synthesis.work_dir import WorkDir

    work = WorkDir(tmp_path, "key", {"config": 1})
    assert work.user("../u 1.").directory.name == "u_1"


def test_a_lone_surrogate_escape_is_refused_with_where_it_is():
    from evolve.core.errors import ConfigError
    from evolve.core.files import parse_json_text

    with pytest.raises(ConfigError, match=r"lone surrogate .* at users\[1\]\.name"):
        parse_json_text(
            '{"users": [{"name": "a"}, {"name": "b\\udc00"}]}', "f.json", "x", ConfigError
        )
    # An escaped pair is one character (U+1F600): accepted.
    assert parse_json_text('["\\ud83d\\ude00"]', "f.json", "x", ConfigError) == ["\U0001f600"]
