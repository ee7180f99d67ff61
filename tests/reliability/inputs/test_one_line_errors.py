"""Bad files, bad flags and failing storage give one line and the README's
exit code, never a traceback (and never minutes of retries first)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from pathlib import Path

import pytest
from reliability.process_helpers import write_tiny_spec

from evolve.cli import main
from evolve.core.errors import EXIT_BAD_INPUT, EXIT_STORAGE, ConfigError
from evolve.llm.model_source import model_source_setting

UNREACHABLE = ["--base-url", "http://127.0.0.1:9/v1", "--model", "stub"]
BINARY = bytes(range(256)) * 4


def error_line(capsys, code: int, result: int) -> str:
    """The one `evolve: error:` line of a failed command (and nothing like a traceback)."""
    err = capsys.readouterr().err
    assert result == code, err[-3000:]
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("evolve: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
    return errors[0]


@pytest.fixture
def immutable():
    """Make a file or directory read-only even for root (`chattr +i`); undone afterwards."""
    marked: list[Path] = []

    def mark(path: Path) -> Path:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"chattr +i is not supported here: {done.stderr!r}")
        marked.append(path)
        return path

    yield mark
    for path in marked:
        subprocess.run(["chattr", "-i", str(path)], check=False)


# ----- unreadable input files ------------------------------------------------------------------


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


HUGE_NUMBER = '[{"id": ' + "7" * 5000 + "}]"
DEEP_JSON = "[" * 100_000 + "]" * 100_000
# A lone surrogate escape parses but no character stands for it: every encode fails later.
LONE_SURROGATE = '[{"id": "u1\\ud800", "start_time": "2024-01-01"}]'


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (BINARY, "UTF-8"),
        (HUGE_NUMBER, "digits"),
        (DEEP_JSON, "nested"),
        (LONE_SURROGATE, "lone surrogate escape (e.g. \\ud800, no character) at [0].id"),
    ],
    ids=["binary", "5000-digit-number", "100k-deep", "lone-surrogate"],
)
def test_unreadable_environment_file(tmp_path, capsys, content, expected):
    env = write(tmp_path / "env.json", content)
    line = error_line(capsys, EXIT_BAD_INPUT, main(["env", "validate", str(env)]))
    assert str(env) in line and expected in line
    args = ["eval", "--env", str(env), "--policy", "in_context", "--out", str(tmp_path / "o")]
    line = error_line(capsys, EXIT_BAD_INPUT, main([*args, *UNREACHABLE]))
    assert str(env) in line and expected in line


@pytest.mark.parametrize(
    ("content", "expected"),
    [(BINARY, "UTF-8"), ("a = " + "[" * 100_000 + "]" * 100_000, "nested")],
    ids=["binary", "100k-deep"],
)
@pytest.mark.parametrize("command", ["run", "tune"])
def test_unreadable_spec_file(tmp_path, capsys, content, expected, command):
    spec = write(tmp_path / "spec.toml", content)
    line = error_line(capsys, EXIT_BAD_INPUT, main([command, str(spec), *UNREACHABLE]))
    assert str(spec) in line and expected in line


@pytest.mark.parametrize(
    ("content", "expected"),
    [(BINARY, "UTF-8"), ('{"a": ' + "7" * 5000 + "}", "digits"), (DEEP_JSON, "nested")],
    ids=["binary", "5000-digit-number", "100k-deep"],
)
def test_unreadable_policy_bundle(tmp_path, capsys, content, expected):
    bundle = write(tmp_path / "bundle" / "policy.json", content)
    args = ["eval", "--preset", "tiny", "--policy", str(bundle.parent), *UNREACHABLE]
    line = error_line(capsys, EXIT_BAD_INPUT, main([*args, "--out", str(tmp_path / "o")]))
    assert str(bundle) in line and expected in line


# ----- command-line values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--concurrency", "0"), ("--concurrency", "-2"), ("--rounds-update", "-1")],
)
def test_eval_refuses_out_of_range_numbers_in_one_line(tmp_path, capsys, flag, value):
    args = ["eval", "--preset", "tiny", "--policy", "in_context", flag, value, *UNREACHABLE]
    line = error_line(capsys, EXIT_BAD_INPUT, main([*args, "--out", str(tmp_path / "o")]))
    assert flag in line and value in line and "at least" in line


def test_long_values_are_cut_in_messages(tmp_path, capsys, monkeypatch):
    args = ["eval", "--preset", "tiny", "--policy", "in_context", *UNREACHABLE]
    args += ["--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--seed", "9" * 5000])
    assert exited.value.code == EXIT_BAD_INPUT
    printed = capsys.readouterr().err
    assert "5000 characters" in printed.splitlines()[-1] and len(printed) < 2000
    monkeypatch.setenv("EVOLVE_MODEL_SOURCE", "x" * 100_000)
    with pytest.raises(ConfigError) as refused:
        model_source_setting()
    assert "EVOLVE_MODEL_SOURCE" in str(refused.value) and len(str(refused.value)) < 400


# ----- storage ---------------------------------------------------------------------------------


def test_disk_full_while_writing_is_a_storage_error(tmp_path, capsys, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "env.json"
    line = error_line(capsys, EXIT_STORAGE, main(["env", "synthesize", "--out", str(out)]))
    assert "No space left on device" in line and str(out) in line  # which file it was


def test_read_only_output_directory_is_a_storage_error(tmp_path, capsys, immutable):
    read_only = immutable(write(tmp_path / "ro" / "keep", "").parent)
    out = read_only / "env.json"
    line = error_line(capsys, EXIT_STORAGE, main(["env", "synthesize", "--out", str(out)]))
    assert str(read_only) in line
    args = ["eval", "--preset", "tiny", "--policy", "in_context", "--out", str(read_only)]
    line = error_line(capsys, EXIT_STORAGE, main([*args, *UNREACHABLE]))
    assert str(read_only) in line


def test_read_only_tracking_db_fails_fast(tmp_path, capsys, immutable, stub):
    spec = write_tiny_spec(tmp_path, tracking=True)
    db = immutable(write(tmp_path / "mlruns" / "mlflow.db", b""))
    started = time.monotonic()
    args = ["run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]
    args += ["--tracking-uri", f"sqlite:///{db}", "--base-url", stub.base_url, "--model", "stub"]
    line = error_line(capsys, EXIT_STORAGE, main(args))
    assert time.monotonic() - started < 20
    assert str(db) in line and "--no-tracking" in line
    assert stub.stats()["chat_requests"] == 0


def test_tracking_db_under_a_missing_directory_is_refused_not_created(tmp_path, capsys, stub):
    spec = write_tiny_spec(tmp_path, tracking=True)
    missing = tmp_path / "no" / "such"
    args = ["run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--no-progress"]
    args += ["--tracking-uri", f"sqlite:///{missing}/store/mlflow.db"]
    line = error_line(
        capsys, EXIT_STORAGE, main([*args, "--base-url", stub.base_url, "--model", "stub"])
    )
    assert "does not exist" in line and "mkdir -p" in line
    assert not (tmp_path / "no").exists()
    assert stub.stats()["chat_requests"] == 0


def test_export_of_a_spec_never_run(tmp_path, capsys):
    spec = write_tiny_spec(tmp_path)
    with contextlib.chdir(tmp_path):
        result = main(["export", str(spec), "--out", "bundle", "--no-register"])
    line = error_line(capsys, EXIT_BAD_INPUT, result)
    assert "has not been run" in line and "evolve run" in line
