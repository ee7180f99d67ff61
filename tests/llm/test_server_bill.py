"""The bill of a run: the server's prompt-evaluation and decoding seconds, as llama-server
reports them per response (`timings`), and the share of the wall time with no request in
flight (the toolkit's own work)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dspy
import pytest
from dspy.clients.cache import Cache
from stub_server import StubServer

from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.llm.usage import Usage, UsageSummary, server_seconds
from evolve.results.budget import SpendJournal, SpendListener

LATENCY_S = 0.2


class _Choice(dspy.Signature):
    """Pick the option that answers the question."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField()
    choice: int = dspy.OutputField()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer(latency=LATENCY_S) as server:
        yield server


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch) -> None:
    disk = Cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=tmp_path)
    monkeypatch.setattr(dspy, "cache", disk)


def _lms(stub: StubServer) -> RoleLMs:
    lm = build_lm(EndpointConfig(model="stub", base_url=stub.base_url))
    return RoleLMs.from_lms(simulator=lm, agent=lm.copy(), reflector=lm.copy())


def _ask(lms: RoleLMs, question: str) -> None:
    with lms.context("agent"):
        dspy.Predict(_Choice)(question=question, options=["carrot", "apple"])


@pytest.mark.parametrize(
    ("response", "seconds"),
    [
        ({"timings": {"prompt_ms": 250.0, "predicted_ms": 1500}}, (0.25, 1.5)),
        ({"timings": {"prompt_ms": "soon", "predicted_ms": -3}}, (0.0, 0.0)),
        ({"timings": None}, (0.0, 0.0)),
        ({}, (0.0, 0.0)),  # an endpoint that reports no timings (OpenAI, vLLM)
        (None, (0.0, 0.0)),
    ],
)
def test_server_seconds_are_read_from_llama_servers_timings(response, seconds):
    assert server_seconds(response) == pytest.approx(seconds)


def test_each_answered_call_adds_its_server_seconds_and_a_cached_one_none(stub, fresh_cache):
    lms = _lms(stub)
    _ask(lms, "Which is a fruit?")
    _ask(lms, "Which is a vegetable?")
    answered = lms.usage.snapshot().roles["agent"]
    # The stub's timings split its latency between the prompt and decoding.
    assert answered.prompt_eval_s + answered.decode_s == pytest.approx(2 * LATENCY_S, abs=1e-3)
    assert answered.prompt_eval_s > 0 and answered.decode_s > 0
    _ask(lms, "Which is a fruit?")  # from DSPy's cache: the server spent nothing
    cached = lms.usage.snapshot().roles["agent"]
    assert cached.cache_hits == 1
    assert (cached.prompt_eval_s, cached.decode_s) == (answered.prompt_eval_s, answered.decode_s)
    table = lms.usage.snapshot().table()
    assert "prompt s" in table and "decode s" in table


def test_the_toolkit_share_is_the_time_with_no_request_in_flight(stub, fresh_cache):
    lms = _lms(stub)
    _ask(lms, "Which is a fruit?")
    time.sleep(3 * LATENCY_S)  # the toolkit's own work: nothing in flight
    _ask(lms, "Which is a vegetable?")
    summary = lms.usage.snapshot()
    share = summary.toolkit_share()
    assert share is not None
    busy = summary.endpoint_busy_s
    assert busy >= 2 * LATENCY_S  # both requests were in flight at least the stub's latency
    assert summary.elapsed_s - busy >= 3 * LATENCY_S  # the pause counts as the toolkit's
    assert share == pytest.approx(1 - busy / summary.elapsed_s)
    bill = summary.bill()
    assert "evaluating prompts" in bill and "decoding" in bill and f"{share:.0%}" in bill


def test_without_a_request_seen_in_flight_no_share_is_claimed():
    """A scripted LM counts a request per call but none is seen in flight: no share."""
    summary = UsageSummary(roles={"agent": Usage(calls=3, requests=3)}, elapsed_s=10.0)
    assert summary.toolkit_share() is None
    assert "not reported" in summary.bill() and "share" not in summary.bill()


def test_the_spend_journal_carries_server_seconds_across_invocations(stub, fresh_cache, tmp_path):
    journal_path = tmp_path / "spend.jsonl"
    spent = []
    for question in ("Which is a fruit?", "Which is a vegetable?"):  # two invocations
        lms = _lms(stub)
        listener = SpendListener(lms.usage, SpendJournal(journal_path).open())
        _ask(lms, question)
        listener.close(mark_wall_time=True)
        spent.append(lms.usage.snapshot().total())
    total = SpendJournal(journal_path).total()
    assert total.prompt_eval_s == pytest.approx(sum(u.prompt_eval_s for u in spent), abs=1e-3)
    assert total.decode_s == pytest.approx(sum(u.decode_s for u in spent), abs=1e-3)
    assert total.prompt_eval_s + total.decode_s == pytest.approx(2 * LATENCY_S, abs=1e-3)
