import argparse

import pytest
from pydantic import ValidationError

from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.core.errors import ConfigError, MissingAPIKeyError
from evolve.llm.config import LOCAL_PLACEHOLDER_KEY, EndpointConfig, LLMConfig


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    return parser.parse_args(list(argv))


def test_hosted_endpoint_without_key_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.delenv("MY_KEY", raising=False)
    endpoint = EndpointConfig(
        model="gpt-4.1-mini", base_url="https://api.example.com/v1", api_key_env="MY_KEY"
    )
    with pytest.raises(MissingAPIKeyError, match=r"\$MY_KEY is not set") as error:
        LLMConfig(agent=endpoint).check_keys()
    assert "\n" not in str(error.value)


def test_local_endpoint_gets_a_placeholder_key(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    endpoint = EndpointConfig(model="qwen", base_url="http://127.0.0.1:8080/v1")
    assert endpoint.is_local()
    assert endpoint.resolve_api_key() == LOCAL_PLACEHOLDER_KEY


def test_openai_environment_variables_work_as_in_amemgym(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "https://proxy.example.org/v1/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    endpoint = EndpointConfig(model="gpt-4.1")
    assert endpoint.resolved_base_url() == "https://proxy.example.org/v1"
    assert endpoint.resolve_api_key() == "sk-test-0123456789abcdef"


def test_describe_masks_the_key(monkeypatch):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    text = EndpointConfig(model="gpt-4.1").describe()
    assert secret not in text and "$OPENAI_API_KEY" in text


def test_a_key_in_place_of_a_variable_name_is_rejected():
    with pytest.raises(ValidationError, match="NAME of an environment variable"):
        EndpointConfig(model="m", api_key_env="sk-live-abc123-def")


def test_roles_fall_back_to_default_then_embedded():
    default = EndpointConfig(model="shared")
    config = LLMConfig(default=default, reflector=EndpointConfig(model="strong"))
    assert config.endpoint_for("agent") is default
    assert config.endpoint_for("reflector").model == "strong"
    assert not config.needs_embedded_server()
    assert LLMConfig(agent=default).needs_embedded_server()


def test_unknown_config_keys_are_errors():
    with pytest.raises(ValidationError):
        EndpointConfig(model="m", api_key="sk-oops")


def test_cli_flags_overlay_config():
    config = llm_config_from_args(
        parse("--model", "m1", "--base-url", "http://127.0.0.1:9/v1", "--agent-model", "m2")
    )
    assert config.default.model == "m1"
    assert config.agent.model == "m2" and config.agent.base_url == "http://127.0.0.1:9/v1"
    assert llm_config_from_args(parse()).needs_embedded_server()


def test_max_tokens_flag_reaches_every_endpoint_in_play_and_the_embedded_server():
    spec_config = LLMConfig(reflector=EndpointConfig(model="r", base_url="http://127.0.0.1:9/v1"))
    config = llm_config_from_args(
        parse("--model", "m1", "--base-url", "http://127.0.0.1:9/v1", "--max-tokens", "200"),
        base=spec_config,
    )
    assert config.default.max_tokens == 200
    assert config.reflector.max_tokens == 200  # configured in the spec, not on the line
    assert config.agent is None  # unset roles still fall back to default
    assert config.embedded.max_tokens == 200
    assert llm_config_from_args(parse()).embedded.max_tokens == 256  # unchanged without it
    with pytest.raises(SystemExit):
        parse("--max-tokens", "0")


def test_timeout_and_retries_flags_reach_every_endpoint_in_play_and_the_embedded_server():
    spec_config = LLMConfig(reflector=EndpointConfig(model="r", base_url="http://127.0.0.1:9/v1"))
    flags = ("--model", "m1", "--base-url", "http://127.0.0.1:9/v1")
    config = llm_config_from_args(
        parse(*flags, "--timeout", "2.5", "--retries", "0"), base=spec_config
    )
    for endpoint in (config.default, config.reflector, config.embedded):
        assert (endpoint.timeout, endpoint.retries) == (2.5, 0)
    unchanged = llm_config_from_args(parse(*flags))
    assert (unchanged.default.timeout, unchanged.default.retries) == (120.0, 3)
    for bad in (("--timeout", "0"), ("--timeout", "nan"), ("--retries", "-1")):
        with pytest.raises(SystemExit):
            parse(*bad)


def test_base_url_without_model_is_a_clear_error():
    with pytest.raises(ConfigError, match="without --model"):
        llm_config_from_args(parse("--base-url", "http://127.0.0.1:9/v1"))


def test_the_llm_package_reads_no_command_line():
    """Flags are the command layer's (`evolve.commands.llm_flags`): the library is configured
    by `LLMConfig` alone, so an app embedding it never meets argparse."""
    import ast
    from pathlib import Path

    import evolve.llm

    package = Path(evolve.llm.__file__).parent
    importing = sorted(
        path.name
        for path in package.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Import) and any(a.name == "argparse" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and node.module == "argparse")
    )
    assert importing == [], f"evolve/llm modules importing argparse: {importing}"
