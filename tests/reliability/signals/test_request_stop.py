"""`evolve eval` at concurrency 8 against a 1 s server: after SIGINT not one request reaches
the server, and the spend ledger holds every request the server received."""

from __future__ import annotations

import signal
import time

from reliability.process_helpers import llm_flags, start_cli, write_small_environment
from stub_server import StubServer

from evolve.core.errors import EXIT_INTERRUPTED
from evolve.optimize.experiment_dir import ExperimentDir

CONCURRENCY = 8
LATENCY_S = 1.0


def test_no_request_reaches_the_server_after_sigint_at_concurrency_8(tmp_path):
    env_file = write_small_environment(tmp_path / "env.json", users=CONCURRENCY)
    # Each reply is two calls in one call slot (a memory write, then the answer): the second
    # starts after the first returns, with no check of the stop in between but the client's.
    policy = "in_context:update_every=1,short_term_len=0"
    args = ["eval", "--env", str(env_file), "--policy", policy]
    args += ["--concurrency", str(CONCURRENCY), "--out", "out", "--no-upper-bound"]
    with StubServer(latency=LATENCY_S) as stub:
        process = start_cli(tmp_path, *args, *llm_flags(stub))
        # The precise moment: all 8 call slots hold a request the server is answering, so no
        # call can start, and half a latency remains before the first answer.
        deadline = time.monotonic() + 120
        while stub.stats()["in_flight"] < CONCURRENCY:
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, stub.stats()
            time.sleep(0.01)
        time.sleep(LATENCY_S / 2)
        signalled_at = time.time()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        time.sleep(0.5)  # anything still on its way arrives now
        stats = stub.stats()
    assert process.returncode == EXIT_INTERRUPTED, err[-3000:]
    late = stats["last_chat_arrival"] - signalled_at
    assert late < 0, f"a request arrived {late:.3f}s after SIGINT"
    ledger = ExperimentDir(tmp_path / "out").load_spend()
    # The requests in flight at the signal were received; their outcome may be unknown.
    assert stats["chat_requests"] <= ledger.requests <= stats["chat_requests"] + CONCURRENCY
