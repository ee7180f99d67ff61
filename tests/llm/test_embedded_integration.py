"""The embedded llama-server on the bundled model: both structured-output dialects constrain
decoding, `max_tokens` is honoured, and the server decodes several requests at once."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest

from evolve.llm.adapter import response_format_for
from evolve.llm.usage import server_seconds

pytestmark = pytest.mark.integration


class Pick(dspy.Signature):
    """Pick the option that answers the question."""

    question: str = dspy.InputField()
    choice: int = dspy.OutputField(desc="1-based option number")
    reason: str = dspy.OutputField()


def chat(server, content: str, **extra) -> dict:
    payload = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0.0,
        **extra,
    }
    request = urllib.request.Request(
        f"{server.base_url}/chat/completions",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


@pytest.mark.parametrize("dialect", ["json_schema", "llama_cpp"])
def test_schema_constrains_decoding_in_both_dialects(embedded_server, dialect):
    answer = chat(
        embedded_server,
        "Which is a fruit: 1) carrot 2) apple 3) potato? Reply in prose.",
        response_format=response_format_for(Pick, dialect),
        max_tokens=128,
    )
    fields = json.loads(answer["choices"][0]["message"]["content"])
    assert set(fields) == {"choice", "reason"}
    assert isinstance(fields["choice"], int) and isinstance(fields["reason"], str)


def test_max_tokens_is_honoured(embedded_server):
    answer = chat(embedded_server, "Count from 1 to 100, separated by commas.", max_tokens=7)
    assert answer["usage"]["completion_tokens"] <= 7
    assert answer["choices"][0]["finish_reason"] == "length"


def test_the_server_reports_its_prompt_and_decoding_seconds(embedded_server):
    """The run's bill reads these timings: the embedded server must keep sending them."""
    answer = chat(embedded_server, "Name three colours.", max_tokens=12)
    prompt_s, decode_s = server_seconds(answer)
    assert prompt_s > 0 and decode_s > 0


def test_requests_are_decoded_together(embedded_server):
    """With slots > 1, four requests overlap: the server reports them processing at once."""
    assert embedded_server.config.slots >= 2
    seen_busy = 0

    def watch() -> None:
        nonlocal seen_busy
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and seen_busy < 2:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{embedded_server.port}/slots", timeout=10
            ) as response:
                busy = sum(1 for slot in json.load(response) if slot.get("is_processing"))
            seen_busy = max(seen_busy, busy)
            time.sleep(0.05)

    with ThreadPoolExecutor(max_workers=5) as pool:
        watcher = pool.submit(watch)
        answers = list(
            pool.map(
                lambda n: chat(
                    embedded_server, f"Write {n} short lines about rivers.", max_tokens=48
                ),
                range(2, 6),
            )
        )
        watcher.result()
    assert all(answer["usage"]["completion_tokens"] > 0 for answer in answers)
    assert seen_busy >= 2
