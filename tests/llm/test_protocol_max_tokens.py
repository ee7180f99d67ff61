"""The paper protocol's completion limit: the reference's 8192 for the agent and the
simulated user unless the user sets one (in the spec's [llm] tables or with --max-tokens)."""

from __future__ import annotations

import argparse
import contextlib

import pytest

import evolve.commands.llm_flags as llm_flags
from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.core.protocol import EVOLVE, PAPER, rules_for
from evolve.llm import EndpointConfig, LLMConfig, build_lm
from evolve.llm.config import protocol_llm_config


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # build_lm resolves it; nothing is sent


def limits(config: LLMConfig) -> dict[str, int]:
    return {
        role: build_lm(config.endpoint_for(role)).kwargs["max_tokens"]
        for role in ("simulator", "agent", "reflector")
    }


def test_paper_gives_the_agent_and_the_simulated_user_the_references_limit():
    config = LLMConfig(default=EndpointConfig(model="m"))
    assert limits(protocol_llm_config(config, PAPER)) == {
        "simulator": 8192,
        "agent": 8192,
        # Under paper the reflector is the agent's model; a named one keeps its own.
        "reflector": 512,
    }
    assert limits(protocol_llm_config(config, EVOLVE)) == dict.fromkeys(
        ("simulator", "agent", "reflector"), 512
    )


def test_a_limit_the_user_sets_wins():
    in_spec = LLMConfig(default=EndpointConfig(model="m", max_tokens=1024))
    assert limits(protocol_llm_config(in_spec, PAPER))["agent"] == 1024
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    flagged = llm_config_from_args(parser.parse_args(["--model", "m", "--max-tokens", "300"]))
    assert limits(protocol_llm_config(flagged, PAPER)) == dict.fromkeys(
        ("simulator", "agent", "reflector"), 300
    )


def test_the_embedded_server_gets_at_most_a_slots_context():
    config = protocol_llm_config(LLMConfig(), PAPER)
    assert config.embedded.max_tokens == min(8192, config.embedded.ctx_per_slot)
    big = LLMConfig.model_validate({"embedded": {"ctx_per_slot": 16384}})
    assert protocol_llm_config(big, PAPER).embedded.max_tokens == 8192
    assert protocol_llm_config(LLMConfig(), EVOLVE).embedded.max_tokens == 256
    set_by_user = LLMConfig.model_validate({"embedded": {"max_tokens": 64}})
    assert protocol_llm_config(set_by_user, PAPER).embedded.max_tokens == 64


def test_a_commands_protocol_flag_applies_its_limit(monkeypatch):
    opened: list[LLMConfig] = []

    @contextlib.contextmanager
    def fake_open(config):
        opened.append(config)
        yield None

    monkeypatch.setattr(llm_flags, "open_role_lms", fake_open)
    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    for protocol, expected in (("paper", 8192), ("evolve", 512)):
        args = parser.parse_args(["--model", "m"])
        with llm_flags.open_role_lms_from_args(args, rules=rules_for(protocol)):
            pass
        assert opened[-1].endpoint_for("agent").max_tokens == expected
