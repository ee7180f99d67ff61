"""Every HTTP request on the books: journaled as started before it is sent and as finished or
failed after, each retry its own request; none sent once the process is told to stop."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dspy
import pytest
from dspy.utils.exceptions import LMServerError
from stub_server import StubServer

from evolve.commands import interrupt
from evolve.core.errors import Interrupted
from evolve.core.stopping import reset_stop
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.llm.usage import RequestEvent, RequestState, Usage
from evolve.results.budget import Budget, SpendJournal
from evolve.spec.config import BudgetSpec


class _Choice(dspy.Signature):
    """Pick the option that answers the question."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField()
    choice: int = dspy.OutputField()


@pytest.fixture(autouse=True)
def _stop_cleared() -> Iterator[None]:
    interrupt.STOP.clear()
    yield
    interrupt.STOP.clear()  # a test that stops must not stop the next one's calls


def _journaled_lms(stub: StubServer, path: Path, **settings) -> tuple[RoleLMs, SpendJournal]:
    endpoint = EndpointConfig(model="stub", base_url=stub.base_url, cache=False, **settings)
    lm = build_lm(endpoint)
    lms = RoleLMs.from_lms(simulator=lm, agent=lm.copy(), reflector=lm.copy())
    journal = SpendJournal(path).open()
    lms.usage.add_listener(lambda event: journal.record(event, wall_time_s=0.0))
    return lms, journal


def _ask(lms: RoleLMs, question: str) -> int:
    with lms.context("agent"):
        return dspy.Predict(_Choice)(question=question, options=["carrot", "apple"]).choice


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_each_retry_of_a_failing_server_is_its_own_journaled_request(tmp_path, client):
    with StubServer(latency=0.0, fault="http500") as stub:
        # One retry: each call is two requests (the backoff before it is the test's cost).
        lms, journal = _journaled_lms(stub, tmp_path / "spend.jsonl", retries=1, client=client)
        budget = Budget(BudgetSpec(max_llm_calls=4), lms, Usage())
        for question in ("Which is a fruit?", "Which is a vegetable?"):
            # A call that fails for good stops the process's later calls (`evolve.core.stopping`);
            # each question stands for a command of its own here.
            reset_stop()
            with pytest.raises(LMServerError):
                _ask(lms, question)
        served = stub.stats()["chat_requests"]
    journal.close()
    # DSPy's adapter may try again after a failed structured call: at least one call per
    # question, each of them 1 try + 1 retry.
    assert served >= 2 * 2 and served % 2 == 0
    assert journal.total() == Usage(requests=served)
    lines = _lines(tmp_path / "spend.jsonl")
    ended = [line for line in lines if line.get("state") in ("finished", "failed")]
    assert len(ended) == served
    assert {(line["state"], line["status"]) for line in ended} == {("failed", 500)}
    # The in-process budget counts the same requests: every one was paid for.
    assert lms.usage.snapshot().total_requests == served
    assert budget.exhausted() == f"max_llm_calls = 4 reached ({served} calls)"


def test_a_request_without_an_outcome_counts_as_spent_and_unknown(tmp_path):
    journal = SpendJournal(tmp_path / "spend.jsonl").open()
    started = RequestEvent("agent", "p-1", RequestState.STARTED)
    journal.record(started, wall_time_s=1.0)
    journal.record(RequestEvent("agent", "p-2", RequestState.STARTED), wall_time_s=1.0)
    journal.record(RequestEvent("agent", "p-1", RequestState.FINISHED, 200), wall_time_s=2.0)
    journal.close()  # the process was killed while p-2 was in flight
    spend = SpendJournal(tmp_path / "spend.jsonl").total()
    assert (spend.requests, spend.unknown_outcome) == (2, 1)
    assert "1 started, outcome unknown" in spend.describe()


def test_no_request_starts_after_a_signal_at_concurrency_8(tmp_path):
    """Eight workers call in a loop against a 1 s server; SIGINT arrives half-way through a
    round, while every worker waits for its answer. Not one request may reach the server
    after the signal: each worker's next call (DSPy's retry, the next module call) is
    refused before it is sent."""
    workers, latency = 8, 1.0
    with StubServer(latency=latency) as stub:
        lms, journal = _journaled_lms(stub, tmp_path / "spend.jsonl")
        outcomes: list[BaseException | None] = []

        def work(index: int) -> None:
            try:
                for round_number in range(20):
                    lms.agent(f"worker {index}, round {round_number}: say hi")
            except BaseException as error:  # noqa: BLE001 - recorded for the assertions
                outcomes.append(error)
                return
            outcomes.append(None)

        with interrupt.stop_on_signals():
            threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while stub.stats()["in_flight"] < workers:  # the first round is at the server
                assert time.monotonic() < deadline, stub.stats()
                time.sleep(0.01)
            time.sleep(latency / 2)
            signalled_at = time.time()
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1.0)  # the handler raises in this (the main) thread
            for thread in threads:
                thread.join(timeout=10)
        stats = stub.stats()
    journal.close()
    assert interrupt.STOP.is_set()
    assert stats["last_chat_arrival"] < signalled_at, "a request reached the server after it"
    # At least the first round; more when a loaded machine's half-latency sleep outlasted it
    # (all of them before the signal, as asserted above).
    assert stats["chat_requests"] >= workers
    assert len(outcomes) == workers and all(isinstance(o, Interrupted) for o in outcomes)
    # The requests in flight at the signal finished and are on the books; none is unknown.
    total = journal.total()
    assert total.requests == stats["chat_requests"] and total.unknown_outcome == 0
