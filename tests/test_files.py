"""The one atomic writer (`evolve.files`): whole file or old file, fsynced, no leftovers."""

from __future__ import annotations

import json
import os

import pytest

import evolve.files
from evolve.files import atomic_write_json, atomic_write_text


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
        evolve.files.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1]
    )
    monkeypatch.setattr(
        evolve.files.os,
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
