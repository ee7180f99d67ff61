"""DSPy's response cache under the toolkit's rules: only replies that parsed, keyed by the
answering model's fingerprint and the cache format, never by the endpoint's address."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import dspy
import pytest
from dspy.clients.cache import Cache
from dspy.utils.exceptions import AdapterParseError
from stub_server import StubServer

from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.core.errors import ConfigError
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.llm.openai_client import OpenAIChatLM
from evolve.llm.response_cache import NAMESPACE_FIELD, held_until_parsed
from evolve.simulator.baselines import compute_upper_bound
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset
from evolve.simulator.user import play_session
from memory_policies.messages import MemoryState


class _Choice(dspy.Signature):
    """Pick the option that answers the question."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField()
    choice: int = dspy.OutputField()


class CannedLM(OpenAIChatLM):
    """The toolkit's client with the server replaced by `reply(messages)`: the real cache
    path, no network. `sent` counts the requests that would have reached a server."""

    def __init__(self, reply: Callable[[list[dict[str, Any]]], str], **kwargs: Any) -> None:
        super().__init__("openai/canned", base_url="http://127.0.0.1:9/v1", api_key="k", **kwargs)
        self.reply = reply
        self.sent = 0

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.sent += 1
        content = self.reply(body["messages"])
        return {
            "model": "canned",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> Cache:
    cache = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=tmp_path)
    monkeypatch.setattr(dspy, "cache", cache)
    return cache


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(latency=0.0) as server:
        yield server


def _lms(lm: dspy.BaseLM) -> RoleLMs:
    return RoleLMs.from_lms(simulator=lm, agent=lm, reflector=lm)


def _stub_lms(stub: StubServer, client: str, **settings: Any) -> RoleLMs:
    return _lms(
        build_lm(EndpointConfig(model="stub", base_url=stub.base_url, client=client, **settings))
    )


def _ask(lms: RoleLMs) -> int:
    with lms.context("agent"):
        return dspy.Predict(_Choice)(
            question="Which is a fruit?", options=["carrot", "apple"]
        ).choice


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_an_unparseable_reply_is_not_stored_and_the_next_call_asks_again(stub, fresh_cache, client):
    lms = _stub_lms(stub, client)
    stub.set_fault("non_json", count=1)
    with pytest.raises(AdapterParseError):
        _ask(lms)
    assert isinstance(_ask(lms), int)  # asked again, and this reply parses
    assert stub.stats()["chat_requests"] == 2
    assert isinstance(_ask(lms), int)  # a parsed reply is replayed
    assert stub.stats()["chat_requests"] == 2


def _spy_on_puts(cache: Cache) -> list[tuple[dict, Any, Any]]:
    """What `cache.put` stores from now on (request, value, ignored arguments)."""
    stored: list[tuple[dict, Any, Any]] = []
    put = cache.put

    def spy(request, value, ignored=None, *args, **kwargs):
        stored.append((request, value, ignored))
        put(request, value, ignored, *args, **kwargs)

    cache.put = spy
    return stored


def _broken(value: Any) -> Any:
    """A copy of a stored response whose reply text is not JSON (dict or litellm object)."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str) and '"choice"' in item:
                value[key] = "not JSON"
            else:
                value[key] = _broken(item)
    elif isinstance(value, list):
        return [_broken(item) for item in value]
    elif hasattr(value, "choices"):
        value.choices[0].message.content = "not JSON"
    return value


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_a_cached_reply_that_does_not_parse_is_evicted(stub, fresh_cache, client):
    lms = _stub_lms(stub, client)
    stored = _spy_on_puts(fresh_cache)
    assert isinstance(_ask(lms), int)
    ((request, value, ignored),) = stored
    # A reply stored before the rules existed, or by a call no adapter parsed.
    fresh_cache.put(request, _broken(value), ignored)
    with pytest.raises(AdapterParseError):
        _ask(lms)  # served from the cache, fails to parse: evicted
    assert stub.stats()["chat_requests"] == 1
    assert isinstance(_ask(lms), int)
    assert stub.stats()["chat_requests"] == 2


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_the_fingerprint_keys_the_cache_and_the_address_does_not(fresh_cache, client):
    with StubServer(latency=0.0) as first, StubServer(latency=0.0) as second:
        assert isinstance(_ask(_stub_lms(first, client, cache_fingerprint="vllm q4 v1")), int)
        # Another address, the same model and fingerprint: the same answers.
        assert isinstance(_ask(_stub_lms(second, client, cache_fingerprint="vllm q4 v1")), int)
        assert second.stats()["chat_requests"] == 0
        # Another fingerprint, or none, at the same address: another model's answers.
        assert isinstance(_ask(_stub_lms(second, client, cache_fingerprint="vllm q8 v2")), int)
        assert second.stats()["chat_requests"] == 1
        assert isinstance(_ask(_stub_lms(second, client)), int)
        assert second.stats()["chat_requests"] == 2


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_entries_of_the_earlier_format_are_never_served(stub, fresh_cache, client):
    stored = _spy_on_puts(fresh_cache)
    assert isinstance(_ask(_stub_lms(stub, client)), int)
    ((request, value, ignored),) = stored
    assert request[NAMESPACE_FIELD]["answered_by"] is None

    # The same request as written before answers were namespaced, in a cache of its own.
    earlier = Cache(enable_disk_cache=False, enable_memory_cache=True, disk_cache_dir=None)
    earlier.put({k: v for k, v in request.items() if k != NAMESPACE_FIELD}, value, ignored)
    dspy.cache = earlier
    assert isinstance(_ask(_stub_lms(stub, client)), int)
    assert stub.stats()["chat_requests"] == 2, "an entry of the earlier format was served"


def test_a_scope_that_rejects_what_parsed_keeps_it_out_of_the_cache(fresh_cache):
    lm = CannedLM(lambda messages: json.dumps({"choice": 2}))
    lms = _lms(lm)
    with held_until_parsed():  # never accepted, e.g. a call site's own check failed
        assert _ask(lms) == 2
    assert _ask(lms) == 2
    assert lm.sent == 2
    with held_until_parsed() as held:
        _ask(lms)
        held.accept()
    assert lm.sent == 2  # served; accepting a served reply keeps it


class _RefusingPolicy:
    """A policy turn whose LM call parses but whose output the policy then refuses (counted
    in `state.parse_failures`, as a memory write it cannot apply)."""

    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    def respond(self, state: MemoryState, message: str) -> tuple[str, MemoryState]:
        choice = dspy.Predict(_Choice)(question=message, options=["a", "b"]).choice
        if self.refuse:
            state.parse_failures["write"] = state.parse_failures.get("write", 0) + 1
        return str(choice), state


@pytest.mark.parametrize("refuse", [True, False], ids=["refused", "used"])
def test_a_policy_turn_the_policy_refused_is_asked_again(fresh_cache, refuse):
    lm = CannedLM(lambda messages: json.dumps({"choice": 2}))
    for _ in range(2):
        play_session(
            policy=_RefusingPolicy(refuse),
            state=MemoryState(kind="test"),
            user=None,
            lms=_lms(lm),
            session_index=0,
            session_time="2024-01-01",
            query="Which is a fruit?",
            exposed_states={},
            view=None,
            rounds=1,  # the simulated user is never called
            seed=0,
        )
    assert lm.sent == (2 if refuse else 1)  # the control: a used turn is replayed


def test_an_upper_bound_choice_out_of_range_is_asked_of_the_server_again(tmp_path, fresh_cache):
    env = synthesize_environment(get_preset("tiny"), 0, 1)
    variants = sum(len(qa.answer_choices) for item in env.items for qa in item.qas)
    lm = CannedLM(lambda messages: json.dumps({"choice": 99}))
    first = compute_upper_bound(env, _lms(lm), tmp_path / "ub")
    assert first.parse_failures == variants and lm.sent == variants
    lm.reply = lambda messages: json.dumps({"choice": 1})
    second = compute_upper_bound(env, _lms(lm), tmp_path / "ub")
    assert lm.sent == 2 * variants, "the unparseable choices were replayed from the cache"
    assert second.parse_failures == 0


def test_the_fingerprint_is_in_the_upper_bound_identity_only_when_set():
    plain = _lms(build_lm(EndpointConfig(model="m", base_url="http://127.0.0.1:8765/v1")))
    assert "cache_fingerprint" not in plain.identity("agent")
    endpoint = EndpointConfig(
        model="m", base_url="http://127.0.0.1:8765/v1", cache_fingerprint="v2"
    )
    assert _lms(build_lm(endpoint)).identity("agent")["cache_fingerprint"] == "v2"


def test_cache_fingerprint_flag_needs_a_model():
    import argparse

    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    config = llm_config_from_args(parser.parse_args(["--model", "m", "--cache-fingerprint", "f1"]))
    assert config.default is not None and config.default.cache_fingerprint == "f1"
    with pytest.raises(ConfigError, match="--cache-fingerprint 'f1' was given without --model"):
        llm_config_from_args(parser.parse_args(["--cache-fingerprint", "f1"]))


def test_the_embedded_server_fingerprints_its_model_kind_slots_and_file(tmp_path, monkeypatch):
    import evolve.llm.roles as roles
    from evolve.llm import LLMConfig, open_role_lms

    model_file = tmp_path / "tiny-model.gguf"
    model_file.write_bytes(b"0" * 1234)

    class FakeServer:
        """`EmbeddedServer` without the process: its names and file only."""

        def __init__(self, config: Any) -> None:
            self.model_name = f"tiny-model@llama-server-{config.slots}slots"
            self.base_url = "http://127.0.0.1:9/v1"
            self.model_path = model_file
            self.model_file_name = model_file.name

        def __enter__(self) -> FakeServer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(roles, "EmbeddedServer", FakeServer)
    with open_role_lms(LLMConfig()) as lms:
        fingerprint = lms.agent.cache_fingerprint
    assert fingerprint == "tiny-model@llama-server-4slots tiny-model.gguf (1234 bytes)"
    assert "127.0.0.1" not in fingerprint
