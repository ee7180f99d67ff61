"""The embedded llama-server: its command line, binary lookup, slot settings and the
concurrency they imply (unit: nothing is started)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from strict_warnings import no_warnings

from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.core.errors import ServerStartError
from evolve.llm.config import EmbeddedModelConfig, LLMConfig
from evolve.llm.server import (
    LLAMA_SERVER_ENV,
    EmbeddedServer,
    contention_warning,
    llama_server_binary,
    other_llama_servers,
)
from evolve.spec.config import spec_from_dict


def option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_command_serves_slots_on_loopback_with_a_context_per_slot(tmp_path):
    server = EmbeddedServer(EmbeddedModelConfig(slots=3, ctx_per_slot=2048, threads=2))
    server.model_path, server.port = tmp_path / "m.gguf", 8123
    command = server.command(Path("/opt/llama-server"))
    assert command[0] == "/opt/llama-server"
    assert option(command, "--host") == "127.0.0.1"
    assert option(command, "--port") == "8123"
    assert option(command, "--parallel") == "3"
    assert option(command, "--ctx-size") == str(3 * 2048)
    assert option(command, "--threads") == "2"
    # Threads sleep while they wait: a busy neighbour process stalls a spinning server.
    assert option(command, "--poll") == "0"
    assert {"--cont-batching", "--cache-prompt", "--no-kv-unified"} <= set(command)
    assert option(command, "--alias") == server.model_name


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("off", None),
        ("ngram", "ngram-simple"),
        ("draft", "draft-simple"),
    ],
)
def test_speculative_decoding_flags(tmp_path, mode, expected):
    server = EmbeddedServer(EmbeddedModelConfig(speculative=mode, draft_tokens=6, threads=2))
    server.model_path, server.port = tmp_path / "m.gguf", 8123
    server.draft_path = tmp_path / "draft.gguf"
    command = server.command(Path("/opt/llama-server"))
    if expected is None:
        assert not any(flag.startswith("--spec") or "draft" in flag for flag in command)
        return
    assert option(command, "--spec-type") == expected
    if mode == "draft":
        assert option(command, "--model-draft") == str(tmp_path / "draft.gguf")
        assert option(command, "--spec-draft-n-max") == "6"
        assert option(command, "--threads-draft") == "2"
    else:
        assert "--model-draft" not in command


def test_the_speculative_flag_reaches_the_embedded_config():
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    config = llm_config_from_args(parser.parse_args(["--speculative", "draft"]))
    assert config.embedded.speculative == "draft"
    assert llm_config_from_args(parser.parse_args([])).embedded.speculative == "off"
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative", "eagle"])


def test_served_name_records_server_kind_and_slot_count():
    one = EmbeddedServer(EmbeddedModelConfig(slots=1)).model_name
    four = EmbeddedServer(EmbeddedModelConfig()).model_name
    large = EmbeddedServer(EmbeddedModelConfig(model_size="1.5b")).model_name
    assert one == "qwen2.5-coder-0.5b-instruct@llama-server-1slots"
    assert four == "qwen2.5-coder-0.5b-instruct@llama-server-4slots"
    assert large == "qwen2.5-coder-1.5b-instruct@llama-server-4slots"
    # Speculative decoding can change greedy outputs too: its results get their own name.
    draft = EmbeddedServer(EmbeddedModelConfig(speculative="draft", draft_tokens=2)).model_name
    ngram = EmbeddedServer(EmbeddedModelConfig(speculative="ngram")).model_name
    assert draft == "qwen2.5-coder-0.5b-instruct@llama-server-4slots-draft2"
    assert ngram == "qwen2.5-coder-0.5b-instruct@llama-server-4slots-ngram"


def test_missing_binary_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(tmp_path / "nowhere" / "llama-server"))
    with pytest.raises(ServerStartError, match="missing.*scripts/install.sh") as error:
        llama_server_binary()
    assert "\n" not in str(error.value)
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv(LLAMA_SERVER_ENV, str(binary))
    assert llama_server_binary() == binary


def test_context_is_slots_times_context_per_slot():
    assert EmbeddedModelConfig().context_tokens == 4 * 4096
    assert EmbeddedModelConfig(slots=2, ctx_per_slot=1024).context_tokens == 2048


def test_slot_and_model_size_flags():
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    with no_warnings():  # the new flag is silent
        config = llm_config_from_args(parser.parse_args(["--slots", "2", "--model-size", "1.5b"]))
    assert config.embedded.slots == 2 and config.embedded.model_size == "1.5b"
    config = llm_config_from_args(parser.parse_args(["--slots", "2", "--ctx-per-slot", "12288"]))
    assert config.embedded.context_tokens == 2 * 12288
    with pytest.raises(SystemExit):
        parser.parse_args(["--slots", "0"])


def spec(**overrides):
    return spec_from_dict(
        {
            "name": "x",
            "environment": {"preset": "tiny", "users": 2, "train_users": 1, "heldout_users": 1},
            "policy": {"kind": "in_context"},
            **overrides,
        }
    )


def test_default_concurrency_is_the_embedded_slot_count():
    assert spec().concurrency == 4
    assert spec(llm={"embedded": {"slots": 2}}).concurrency == 2
    assert spec(concurrency=3).concurrency == 3
    hosted = {"default": {"model": "gpt-4.1-mini"}}
    assert spec(llm=hosted).concurrency == 2


def test_a_second_server_that_would_oversubscribe_the_cores_is_warned_about():
    warning = contention_warning([4242], threads=2, cores=2)
    assert warning is not None
    assert "pid 4242" in warning and "--base-url" in warning and "threads" in warning
    assert contention_warning([], threads=2, cores=2) is None  # alone
    assert contention_warning([4242], threads=1, cores=2) is None  # one core each


def test_other_servers_are_found_by_process_name(tmp_path):
    if not Path("/proc/self/comm").exists():
        pytest.skip("needs Linux /proc")
    fake = tmp_path / "llama-server"  # a process whose name is llama-server
    shutil.copy("/bin/sleep", fake)
    process = subprocess.Popen([str(fake), "30"])
    try:
        deadline = time.monotonic() + 5
        while process.pid not in other_llama_servers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.pid in other_llama_servers()
    finally:
        process.kill()
        process.wait()
    assert process.pid not in other_llama_servers()


def test_a_server_pinned_to_other_cores_is_not_a_competitor(tmp_path):
    if not Path("/proc/self/comm").exists() or not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs Linux /proc and CPU affinity")
    mine = os.sched_getaffinity(0)
    elsewhere = set(range(os.cpu_count() or 1)) - mine
    if not elsewhere and len(mine) < 2:
        pytest.skip("needs two cores")
    fake = tmp_path / "llama-server"
    shutil.copy("/bin/sleep", fake)
    process = subprocess.Popen([str(fake), "30"])  # on this process's cores, as inherited
    try:
        deadline = time.monotonic() + 5
        while process.pid not in other_llama_servers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.pid in other_llama_servers()
        if not elsewhere:  # every core is ours: keep one, give the server the others
            first, *rest = sorted(mine)
            os.sched_setaffinity(0, {first})
            elsewhere = set(rest)
        os.sched_setaffinity(process.pid, elsewhere)
        assert process.pid not in other_llama_servers()
    finally:
        os.sched_setaffinity(0, mine)
        process.kill()
        process.wait()


def test_threads_default_to_the_cores_this_process_may_use(monkeypatch):
    """Under taskset or a cpuset, all of the machine's cores would put several spinning
    llama.cpp threads on one allowed core."""
    from evolve.llm import server as server_module

    monkeypatch.setattr(server_module.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(server_module.os, "cpu_count", lambda: 8)
    assert server_module.usable_cores() == 1


def test_the_old_model_preset_flag_is_an_error_naming_the_new_one_and_is_hidden(capsys):
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--model-preset", "1.5b"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.endswith("--model-preset is now called --model-size: use --model-size 1.5b")
    assert "--model-preset" not in parser.format_help()
    assert "--model-size" in parser.format_help()


def test_the_old_model_preset_key_is_an_error_naming_the_new_one():
    with pytest.raises(ValueError, match="the key 'model_preset' is now called 'model_size'"):
        LLMConfig.model_validate({"embedded": {"model_preset": "1.5b"}})
    assert LLMConfig.model_validate({"embedded": {"model_size": "1.5b"}}).embedded.model_size
