"""Credentials in an endpoint URL never reach output, logs or caches.

A `user:password@` URL is refused in one line (the key goes in the variable named by
`api_key_env`), with the password redacted; DSPy's response cache keeps no endpoint
address, even for URLs without credentials.
"""

from __future__ import annotations

import dspy
import pytest
from dspy.clients.cache import Cache

from evolve.cli import main
from evolve.core.errors import ConfigError
from evolve.spec.config import load_spec

PASSWORD = "pa55word"


def _userinfo_url(base_url: str) -> str:
    return base_url.replace("http://", f"http://user:{PASSWORD}@")


@pytest.mark.parametrize("command", ["doctor", "eval"])
def test_base_url_with_credentials_is_refused_in_one_line_without_the_password(
    stub, command, capsys
):
    argv = [command, "--base-url", _userinfo_url(stub.base_url), "--model", "stub"]
    if command == "eval":
        argv += ["--preset", "tiny", "--users", "1", "--policy", "native", "--no-upper-bound"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert PASSWORD not in output
    assert "user:***" not in output and "***@127.0.0.1" in output
    assert "carries credentials" in output
    assert len(captured.err.strip().splitlines()) == 1
    assert stub.stats()["chat_requests"] == 0


def test_base_url_without_model_error_is_redacted(capsys):
    assert main(["doctor", "--base-url", f"http://u:{PASSWORD}@127.0.0.1:9/v1"]) == 2
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err


def test_openai_base_url_with_credentials_is_refused(stub, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_BASE_URL", _userinfo_url(stub.base_url))
    assert main(["doctor", "--model", "stub"]) == 2
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err
    assert "$OPENAI_BASE_URL" in captured.err


def test_spec_base_url_with_credentials_is_refused_without_the_password(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "x"\n[environment]\npreset = "tiny"\n[policy]\nkind = "native"\n'
        f'[llm.default]\nmodel = "stub"\nbase_url = "http://me:{PASSWORD}@127.0.0.1:9/v1"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_spec(spec)
    assert PASSWORD not in str(refused.value)
    assert "carries credentials" in str(refused.value)


def test_response_cache_holds_no_endpoint_address(stub, tmp_path, monkeypatch):
    """A real eval fills DSPy's disk cache; no file in it names the endpoint."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(cache))
    disk = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=cache / "dspy")
    monkeypatch.setattr(dspy, "cache", disk)
    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "native"]
    argv += ["--rounds-init", "1", "--rounds-update", "1", "--out", str(tmp_path / "out")]
    assert main([*argv, "--base-url", stub.base_url, "--model", "stub"]) == 0
    assert stub.stats()["chat_requests"] > 0
    address = stub.base_url.removeprefix("http://").split("/")[0].encode()
    files = [path for path in (cache / "dspy").rglob("*") if path.is_file()]
    assert any(path.name == "cache.db" for path in files)
    for path in files:
        content = path.read_bytes()
        assert address not in content, f"{path} stores the endpoint address {address!r}"
        assert b"api_base" not in content, f"{path} stores api_base"


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t",  # not a name at all: refused before, but echoed
        "sk_live_Ab3dEf6hIj9kLm2nOp5qRs8t",  # shaped like a variable name: accepted before
        "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0f",  # 40 characters, no known prefix
    ],
)
def test_a_key_given_as_the_key_variable_is_refused_without_echoing_it(key, capsys):
    argv = ["doctor", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main([*argv, "--api-key-env", key]) == 2
    captured = capsys.readouterr()
    assert key not in captured.out + captured.err
    assert key[:8] not in captured.out + captured.err
    assert "looks like a key itself" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_a_variable_name_that_is_not_a_key_is_still_shown_when_refused(capsys):
    assert main(["doctor", "--model", "m", "--api-key-env", "MY-KEY"]) == 2
    assert "'MY-KEY'" in capsys.readouterr().err
