"""`evolve eval --out DIR` keeps a spend journal per output directory.

Each completed LLM call is appended to `DIR/spend.jsonl` as it completes, so after a
`kill -9` the spend it records is short of the server's count only by the calls in flight,
and a rerun adds its own calls to the same journal.
"""

from __future__ import annotations

import signal

from reliability.process_helpers import (
    llm_flags,
    run_cli,
    start_cli,
    wait_for_requests,
    write_small_environment,
)
from stub_server import StubServer

from evolve.optimize.experiment_dir import ExperimentDir

CONCURRENCY = 2


def test_eval_journals_every_call_across_a_kill_and_its_rerun(tmp_path):
    env_file = write_small_environment(tmp_path / "env.json")
    args = ["eval", "--env", str(env_file), "--policy", "in_context"]
    args += ["--concurrency", str(CONCURRENCY), "--out", "out"]
    out = tmp_path / "out"
    with StubServer(latency=0.05) as stub:
        process = start_cli(tmp_path, *args, *llm_flags(stub))
        wait_for_requests(stub, at_least=8, timeout=90)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        served_at_kill = stub.stats()["chat_requests"]
        journaled_at_kill = ExperimentDir(out).load_spend().requests
        assert 0 <= served_at_kill - journaled_at_kill <= CONCURRENCY

        finished = run_cli(tmp_path, *args, *llm_flags(stub))
        assert finished.returncode == 0, finished.stderr[-3000:]
        served = stub.stats()["chat_requests"]
    spend = ExperimentDir(out).load_spend()
    assert 0 <= served - spend.requests <= CONCURRENCY
    assert spend.requests > journaled_at_kill and spend.tokens > 0
    # The summary tells the spend of every invocation into this directory.
    assert f"{spend.requests} LLM calls" in finished.stdout
