"""The thin LM client on the `openai` package, against the stub server."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.clients.cache import Cache
from dspy.utils.exceptions import LMServerError
from stub_server import StubServer

from evolve.core.errors import Interrupted
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.llm.adapter import StructuredJSONAdapter
from evolve.llm.openai_client import OpenAIChatLM, uses_max_completion_tokens


class _Choice(dspy.Signature):
    """Pick the option that answers the question."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField()
    choice: int = dspy.OutputField()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(latency=0.0) as server:
        yield server


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> None:
    disk = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=tmp_path)
    monkeypatch.setattr(dspy, "cache", disk)


def _lms(stub: StubServer, **settings) -> RoleLMs:
    endpoint = EndpointConfig(model="stub", base_url=stub.base_url, **settings)
    lm = build_lm(endpoint)
    assert isinstance(lm, OpenAIChatLM)
    return RoleLMs.from_lms(simulator=lm, agent=lm.copy(), reflector=lm.copy())


def _ask(lms: RoleLMs, question: str = "Which is a fruit?") -> int:
    with lms.context("agent"):
        return dspy.Predict(_Choice)(question=question, options=["carrot", "apple"]).choice


def test_structured_call_counts_usage_and_is_cached(stub, fresh_cache):
    lms = _lms(stub)
    assert isinstance(_ask(lms), int)
    usage = lms.usage.snapshot().roles["agent"]
    assert usage.calls == 1 and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert stub.stats()["chat_requests"] == 1
    assert isinstance(_ask(lms), int)  # served from DSPy's cache: no request, no tokens
    usage = lms.usage.snapshot().roles["agent"]
    assert usage.calls == 2 and usage.cache_hits == 1
    assert stub.stats()["chat_requests"] == 1


def test_prompt_tokens_the_server_reused_are_counted(stub, fresh_cache):
    # The stub reports the prefix shared with the previous prompt as cached_tokens, as a
    # one-slot llama-server does: the second question shares the instructions only.
    lms = _lms(stub)
    _ask(lms, "Which is a fruit?")
    first = lms.usage.snapshot().roles["agent"]
    _ask(lms, "Which is a vegetable?")
    second = lms.usage.snapshot().roles["agent"].minus(first)
    assert 0 < second.prompt_tokens_cached < second.prompt_tokens
    assert "reused" in lms.usage.snapshot().table()


def test_server_errors_are_retried_with_backoff_then_reported(stub, fresh_cache):
    lms = _lms(stub, retries=2, cache=False)
    stub.set_fault("http500", count=2)
    assert isinstance(_ask(lms), int)  # two 500s, then an answer
    assert stub.stats()["chat_requests"] == 3
    stub.set_fault("http500", count=5)
    with pytest.raises(LMServerError):
        _ask(lms, "Which is a vegetable?")
    assert stub.stats()["chat_requests"] == 3 + 3  # bounded: 1 try + 2 retries


def test_max_tokens_field_follows_the_server():
    assert not uses_max_completion_tokens("stub", "http://127.0.0.1:8080/v1")
    assert not uses_max_completion_tokens("gpt-4.1-mini", "https://api.openai.com/v1")
    assert uses_max_completion_tokens("o3-mini", "https://api.openai.com/v1")
    assert uses_max_completion_tokens("gpt-5", "https://api.openai.com/v1")


def test_each_dialect_reaches_the_server_and_parses(stub, fresh_cache):
    for dialect in ("json_schema", "llama_cpp", "json_object", "none"):
        lms = _lms(stub, structured_output=dialect, cache=False)
        with dspy.context(lm=lms.agent, adapter=StructuredJSONAdapter()):
            choice = dspy.Predict(_Choice)(question="q", options=["a", "b"]).choice
        assert isinstance(choice, int), dialect


def test_litellm_stays_available(stub, fresh_cache):
    lm = build_lm(EndpointConfig(model="stub", base_url=stub.base_url, client="litellm"))
    assert not isinstance(lm, OpenAIChatLM)
    lms = RoleLMs.from_lms(simulator=lm, agent=lm, reflector=lm)
    assert isinstance(_ask(lms), int)
    assert stub.stats()["chat_requests"] == 1


def _ask_in_threads(lms: RoleLMs, count: int) -> list[int]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: _ask(lms), range(count)))


def test_identical_requests_in_flight_at_once_are_asked_once(fresh_cache):
    # Two episodes reaching the same prompt in parallel: one request, one answer for both
    # (two requests could get two answers, and the cache would keep only one of them).
    with StubServer(latency=0.5) as slow:
        lms = _lms(slow)
        assert len(set(_ask_in_threads(lms, 3))) == 1
        assert slow.stats()["chat_requests"] == 1
        usage = lms.usage.snapshot().roles["agent"]
        assert usage.calls == 3 and usage.cache_hits == 2  # the followers cost nothing
        _ask(lms, "Which is a vegetable?")  # another request still reaches the server
        assert slow.stats()["chat_requests"] == 2


def test_who_waited_on_a_failed_request_stops_with_it(fresh_cache):
    # A request that fails for good stops every worker: who waited on it sends nothing.
    with StubServer(latency=0.5) as slow:
        slow.set_fault("http500", count=1)
        lms = _lms(slow, retries=0)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(_ask, lms) for _ in range(2)]
            errors = [future.exception() for future in futures]
        assert all(isinstance(error, LMServerError | Interrupted) for error in errors), errors
        assert slow.stats()["chat_requests"] == 1
