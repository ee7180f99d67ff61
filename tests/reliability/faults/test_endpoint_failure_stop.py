"""The first LLM call that fails for good stops every worker, as SIGINT does.

At concurrency 4 against the stub server, failing every request (HTTP 500) or stalling every
request (no answer; the client times out): `evolve eval`, `run` and `tune` (and eval on the
litellm client) print one error line
and exit 3; no request reaches the server after that line; the spend ledger holds every
request the server received and at most the requests in flight more; the process is gone
within one request timeout plus 2 s of the error line.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dspy.utils.exceptions import LMServerError
from reliability.process_helpers import (
    TUNE_SPEC,
    run_timed,
    write_small_environment,
    write_tiny_spec,
)
from stub_server import StubServer

from evolve.core.errors import EXIT_LLM_FAILURE
from evolve.core.stopping import STOP, endpoint_failure, stop_for_endpoint_failure
from evolve.llm import EndpointConfig, LLMConfig, open_role_lms
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.tuning import recorded_spend

CONCURRENCY = 4
TIMEOUT_S = 1.0
RETRIES = 1
# A stalled server fails after (retries + 1) timeouts plus the client's backoff (< 2 s here).
STALL_FAILS_WITHIN_S = (RETRIES + 1) * TIMEOUT_S + 2.0


def short_flags(stub: StubServer, client: str) -> list[str]:
    return [
        *("--base-url", stub.base_url, "--model", "stub", "--no-llm-cache", "--client", client),
        *("--timeout", str(TIMEOUT_S), "--retries", str(RETRIES)),
    ]


def command(kind: str, home: Path) -> tuple[list[str], Path]:
    """The command line and the directory whose ledger it writes."""
    if kind == "eval":
        env_file = write_small_environment(home / "env.json", users=CONCURRENCY * 2)
        args = ["eval", "--env", str(env_file), "--policy", "in_context", "--no-progress"]
        args += ["--concurrency", str(CONCURRENCY), "--out", "out"]
        return args, home / "out"
    if kind == "tune":
        write_small_environment(home / "env.json", users=CONCURRENCY)
        text = TUNE_SPEC.replace("concurrency = 2", f"concurrency = {CONCURRENCY}")
        text = text.replace("train_users = 1", f"train_users = {CONCURRENCY - 1}")
        spec = home / "tune.toml"
        spec.write_text(text, encoding="utf-8")
        args = ["tune", str(spec), "--no-progress", "--no-tracking", "--runs-dir", "runs"]
        return args, home / "runs" / "tiny-tune"
    spec = write_tiny_spec(home, "stop")
    text = spec.read_text(encoding="utf-8")
    spec.write_text(text.replace("concurrency = 2", f"concurrency = {CONCURRENCY}"), "utf-8")
    args = ["run", str(spec), "--no-progress", "--runs-dir", str(home / "runs")]
    return args, home / "runs" / "stop"


@pytest.mark.parametrize(
    ("kind", "client"),
    [("eval", "openai"), ("run", "openai"), ("tune", "openai"), ("eval", "litellm")],
)
@pytest.mark.parametrize("fault", ["http500", "hang"])
def test_the_first_failed_call_stops_every_worker(tmp_path, kind, fault, client):
    args, ledger_dir = command(kind, tmp_path)
    with StubServer(latency=0.05, fault=fault) as stub:
        started = time.time()
        process, lines = run_timed(tmp_path, *args, *short_flags(stub, client))
        exited = time.time()
        time.sleep(0.5)  # anything still on its way arrives now
        stats = stub.stats()
    stderr = "\n".join(line for _, line in lines)
    assert process.returncode == EXIT_LLM_FAILURE, stderr[-3000:]
    errors = [(at, line) for at, line in lines if line.startswith("evolve: error:")]
    assert len(errors) == 1, stderr[-3000:]
    error_at, error_line = errors[0]
    assert "failed after its retries" in error_line and "Traceback" not in stderr
    # Not one request reached the server after the error line.
    assert stats["chat_requests"] > 0
    late = stats["last_chat_arrival"] - error_at
    assert late < 0, f"a request arrived {late:.3f}s after the error line"
    # Gone within one request timeout (+2 s) of the error.
    assert exited - error_at <= TIMEOUT_S + 2.0, f"exited {exited - error_at:.1f}s after the error"
    if fault == "hang":
        # The stall is reported within the documented time: (retries + 1) x timeout + backoff,
        # plus the command's start-up.
        assert error_at - started <= STALL_FAILS_WITHIN_S + 15
    if kind == "tune":
        ledger = recorded_spend(ledger_dir)
    else:
        ledger = ExperimentDir(ledger_dir).load_spend()
    served = stats["chat_requests"]
    assert served <= ledger.requests <= served + CONCURRENCY, (served, ledger)


def test_new_lms_forget_an_earlier_endpoint_failure_but_not_a_signal(stub):
    # A library user's next `open_role_lms` is a new session of calls; a signal still stops it.
    config = LLMConfig(default=EndpointConfig(model="stub", base_url=stub.base_url, cache=False))
    stop_for_endpoint_failure(LMServerError("HTTP 500", model="stub"))
    assert STOP.is_set() and endpoint_failure() is not None
    with open_role_lms(config):
        assert not STOP.is_set() and endpoint_failure() is None
    STOP.set()  # as the signal handler does
    with open_role_lms(config):
        assert STOP.is_set()
