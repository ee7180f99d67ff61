"""`evolve doctor`: one-line errors before any call (unit), real calls and process hygiene
(integration: each test starts its own embedded server through the CLI)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolve.cli import main
from evolve.llm.server import free_loopback_port

PROJECT = Path(__file__).resolve().parents[2]


def run_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run(
        [sys.executable, "-m", "evolve.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=PROJECT,
        env={**os.environ, **(env or {})},
    )


def llama_server_pids(port: int | None = None, model: Path | None = None) -> set[int]:
    """llama.cpp server processes on `port` or serving `model` (other test runs may have
    servers of their own, so never count them all)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        wanted = f"--port {port} " if port is not None else f"--model {model} "
        is_llama_server = command.split(b" ", 1)[0].endswith(b"llama-server")
        if is_llama_server and wanted.encode() in command + b" ":
            pids.add(int(entry.name))
    return pids


def server_port(output: str) -> int:
    match = re.search(r"base_url=http://127\.0\.0\.1:(\d+)/v1", output)
    assert match, f"no embedded server address in the output:\n{output[-2000:]}"
    return int(match.group(1))


def wait_until_gone(pids: set[int], timeout: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        remaining = pids & llama_server_pids()
        if not remaining:
            return set()
        time.sleep(0.2)
    return pids & llama_server_pids()


def test_missing_key_for_hosted_endpoint_is_one_line(monkeypatch, capsys):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code = main(["doctor", "--model", "gpt-4.1-mini", "--base-url", "https://api.example.com/v1",
                 "--api-key-env", "NO_SUCH_KEY_VAR"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.count("\n") == 0 and "NO_SUCH_KEY_VAR is not set" in err


def test_unreachable_endpoint_is_one_line(capsys):
    port = free_loopback_port()
    code = main(["doctor", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.count("\n") == 0 and "cannot reach" in err and str(port) in err


def test_not_a_gguf_file_is_one_line(tmp_path, capsys):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("hello")
    code = main(["doctor", "--model-path", str(bogus)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and err.count("\n") == 0 and "not a GGUF file" in err


@pytest.mark.integration
def test_doctor_answers_on_the_embedded_model_and_leaves_no_server():
    result = run_cli("doctor")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "doctor: all roles answered" in result.stdout
    for role in ("simulator", "agent", "reflector"):
        assert f"{role}" in result.stdout
    assert result.stdout.count("structured") >= 3
    assert not wait_until_gone(llama_server_pids(server_port(result.stdout)))


@pytest.mark.integration
def test_corrupted_model_file_is_one_line_and_leaves_no_server(tmp_path):
    corrupted = tmp_path / "broken.gguf"
    corrupted.write_bytes(b"GGUF" + os.urandom(4096))
    result = run_cli("doctor", "--model-path", str(corrupted), timeout=300)
    assert result.returncode != 0
    # Another test's llama-server may run beside this one (two pytest workers): its one-line
    # contention warning is not part of the error, which must still be one line.
    error_lines = [
        line for line in result.stderr.strip().splitlines()
        if not line.startswith("warning: another llama-server is running")
    ]  # fmt: skip
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith("evolve: error:"), result.stderr
    assert "could not load model file" in result.stderr or "llama.cpp" in result.stderr
    assert not wait_until_gone(llama_server_pids(model=corrupted.resolve()))


@pytest.mark.integration
def test_doctor_against_another_openai_compatible_server(embedded_server):
    result = run_cli(
        "doctor", "--base-url", embedded_server.base_url, "--model", embedded_server.model_name,
        "--structured-output", "llama_cpp",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert embedded_server.base_url in result.stdout
    assert "embedded llama.cpp" not in result.stdout


def _start_doctor_and_wait_for_server() -> tuple[subprocess.Popen[str], set[int]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "evolve.cli", "doctor"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=PROJECT,
    )
    assert process.stdout is not None
    output = ""
    for line in process.stdout:
        output += line
        if "base_url=http://127.0.0.1" in line:  # printed once the server answers
            break
    started = llama_server_pids(server_port(output))
    assert started, "the doctor did not start a llama.cpp server"
    return process, started


@pytest.mark.integration
def test_sigint_stops_the_server():
    process, started = _start_doctor_and_wait_for_server()
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    assert process.returncode == 130
    assert not wait_until_gone(started)


@pytest.mark.integration
def test_killed_parent_takes_the_server_down():
    process, started = _start_doctor_and_wait_for_server()
    process.kill()  # SIGKILL: no cleanup code runs in the parent
    process.wait(timeout=30)
    assert not wait_until_gone(started)


def _can_unshare_network() -> bool:
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.integration
@pytest.mark.skipif(not _can_unshare_network(), reason="needs `unshare -n` (root)")
def test_embedded_path_needs_no_network():
    """In a network namespace with only loopback, any attempt to reach the internet fails."""
    command = f"ip link set lo up && {sys.executable} -m evolve.cli doctor"
    result = subprocess.run(
        ["unshare", "-n", "bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=PROJECT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "doctor: all roles answered" in result.stdout


def test_the_configuration_names_the_model_serving_each_role():
    from evolve.commands.doctor import describe_config
    from evolve.llm.config import EmbeddedModelConfig, EndpointConfig, LLMConfig

    # The 0.5b: `install.sh --test` installs only the model the tests run on, and describing a
    # bundled model resolves its file.
    config = LLMConfig(
        embedded=EmbeddedModelConfig(model_size="0.5b"),
        reflector=EndpointConfig(model="gpt-4.1-mini", base_url="http://127.0.0.1:9/v1"),
    )
    by_role = {line.split()[0]: line for line in describe_config(config)[:3]}
    for role in ("simulator", "agent"):
        assert "embedded llama.cpp: Qwen2.5-Coder-0.5B-Instruct" in by_role[role]
        assert "model size 0.5b" in by_role[role]
    assert "gpt-4.1-mini" in by_role["reflector"] and "embedded" not in by_role["reflector"]


@pytest.mark.parametrize(
    ("installed", "flags", "expected"),
    [
        ({"0.5b": True, "1.5b": True}, [], "1.5b"),  # a full install: the quickstart's model
        ({"0.5b": True, "1.5b": False}, [], "0.5b"),  # `install.sh --test`: the tests' model
        ({"0.5b": True, "1.5b": True}, ["--model-size", "0.5b"], None),  # named: kept
        ({"0.5b": True, "1.5b": True}, ["--model", "m", "--base-url", "http://h/v1"], None),
        ({"0.5b": False, "1.5b": False}, [], None),
    ],
)
def test_doctor_checks_the_largest_installed_bundled_model_unless_told(
    monkeypatch, installed, flags, expected
):
    from evolve.cli import build_parser
    from evolve.commands import doctor

    monkeypatch.setattr(doctor, "installed_model_sizes", lambda: installed)
    args = build_parser().parse_args(["doctor", *flags])
    assert doctor.default_model_size(args) == expected
