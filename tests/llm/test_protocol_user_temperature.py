"""The paper protocol samples the simulated user at the reference's 0.2 unless the user sets a
temperature; the agent, the reflector and the evolve protocol keep theirs."""

from __future__ import annotations

import pytest

from evolve.core.protocol import EVOLVE, PAPER
from evolve.llm import EndpointConfig, LLMConfig, build_lm
from evolve.llm.config import protocol_llm_config


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # build_lm resolves it; nothing is sent


def temperatures(config: LLMConfig) -> dict[str, float]:
    return {
        role: build_lm(config.endpoint_for(role)).kwargs["temperature"]
        for role in ("simulator", "agent", "reflector")
    }


def test_paper_samples_the_simulated_user_at_the_references_temperature():
    config = LLMConfig(default=EndpointConfig(model="m"))
    assert temperatures(protocol_llm_config(config, PAPER)) == {
        "simulator": 0.2,
        "agent": 0.0,
        "reflector": 0.0,
    }
    assert set(temperatures(protocol_llm_config(config, EVOLVE)).values()) == {0.0}


def test_a_temperature_the_user_sets_wins():
    named = LLMConfig(simulator=EndpointConfig(model="m", temperature=0.7))
    assert protocol_llm_config(named, PAPER).simulator.temperature == 0.7


def test_the_embedded_server_plays_the_user_at_the_references_temperature():
    assert protocol_llm_config(LLMConfig(), PAPER).embedded.simulator_temperature == 0.2
    assert protocol_llm_config(LLMConfig(), EVOLVE).embedded.simulator_temperature is None
    set_by_user = LLMConfig.model_validate({"embedded": {"temperature": 0.5}})
    assert protocol_llm_config(set_by_user, PAPER).embedded.simulator_temperature is None
