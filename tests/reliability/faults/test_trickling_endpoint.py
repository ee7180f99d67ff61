"""A server that sends its response a byte a second is timed out like one that stalls.

No read ever waits long, so the HTTP libraries' own timeouts (connect, each read) never
fire; the request's deadline for the whole response does. With `--timeout 3 --retries 0`,
`evolve eval` ends in one error line (exit 3) within 5 s of the request, on both clients.
"""

from __future__ import annotations

import pytest
from reliability.process_helpers import run_timed, write_small_environment
from stub_server import StubServer

from evolve.core.errors import EXIT_LLM_FAILURE

TIMEOUT_S = 3


@pytest.mark.parametrize("client", ["openai", "litellm"])
def test_a_trickling_response_ends_at_the_request_timeout(tmp_path, client):
    env_file = write_small_environment(tmp_path / "env.json", users=1)
    args = ["eval", "--env", str(env_file), "--policy", "in_context", "--no-progress"]
    args += ["--concurrency", "1", "--out", "out", "--no-upper-bound"]
    with StubServer(latency=0.0, fault="trickle") as stub:
        llm = ["--base-url", stub.base_url, "--model", "stub", "--no-llm-cache"]
        llm += ["--client", client, "--timeout", str(TIMEOUT_S), "--retries", "0"]
        process, lines = run_timed(tmp_path, *args, *llm)
        stats = stub.stats()
    stderr = "\n".join(line for _, line in lines)
    assert process.returncode == EXIT_LLM_FAILURE, stderr[-3000:]
    errors = [(at, line) for at, line in lines if line.startswith("evolve: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert stats["chat_requests"] == 1, stats
    took = errors[0][0] - stats["last_chat_arrival"]
    assert took <= 5.0, f"the error came {took:.1f} s after the request"
