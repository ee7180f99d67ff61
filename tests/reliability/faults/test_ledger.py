"""The spend ledger after `kill -9` is within the in-flight calls of the truth.

`evolve run` on a tiny spec against the stub is killed at random points; the spend the
next invocation starts from (what the ledger says) is compared with the stub's own count
of chat requests. No request the server received may be missing (each is journaled before
it is sent); only requests in flight when the process died may be counted without having
reached the server.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from reliability.process_helpers import started

from evolve.optimize.experiment_dir import ExperimentDir

REPO = Path(__file__).resolve().parents[3]
CONCURRENCY = 2


def _write_spec(tmp_path: Path, base_url: str) -> Path:
    spec = tmp_path / "ledger.toml"
    spec.write_text(
        f"""
name = "ledger"
seed = 0
concurrency = {CONCURRENCY}

[environment]
preset = "tiny"
seed = 0
users = 2
train_users = 1
heldout_users = 1

[policy]
kind = "in_context"
parameters = {{ update_every = 2, short_term_len = 4 }}

[optimizer]
schedule = "population"
generations = 4
reflection_minibatch_size = 1
objective = "accuracy"
mutate_components = ["use"]
heldout = "final"

[optimizer.parameters]
update_every = {{ low = 1, high = 4 }}

[llm.default]
model = "stub"
base_url = "{base_url}"
"""
    )
    return spec


def _start(spec: Path, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "EVOLVE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    env.pop("DSPY_CACHEDIR", None)
    argv = [sys.executable, "-m", "evolve.cli", "run", str(spec), "--no-tracking"]
    argv += ["--no-progress", "--runs-dir", str(tmp_path / "runs")]
    process = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return started(process)


def _ledger_calls(tmp_path: Path) -> int:
    return ExperimentDir(tmp_path / "runs" / "ledger").load_spend().requests


def test_ledger_after_kill_9_is_within_the_in_flight_calls(stub, tmp_path):
    spec = _write_spec(tmp_path, stub.base_url)
    rng = random.Random(int(os.environ.get("LEDGER_TEST_SEED", time.time_ns())))
    for kill in range(2):
        process = _start(spec, tmp_path)
        already = stub.stats()["chat_requests"]
        target = already + rng.randint(8, 40)
        deadline = time.monotonic() + 60
        while stub.stats()["chat_requests"] < target and process.poll() is None:
            assert time.monotonic() < deadline, "the run made no progress"
            time.sleep(0.005)
        assert process.poll() is None, f"the run ended before kill {kill}; make it longer"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        time.sleep(0.2)  # let the stub finish answering the calls that were in flight
        served, ledger = stub.stats()["chat_requests"], _ledger_calls(tmp_path)
        # Every request the server received is on the books (journaled before it was sent);
        # beyond them, at most those in flight at each kill (started, never received).
        assert served <= ledger <= served + CONCURRENCY * (kill + 1), (kill, served, ledger)
    process = _start(spec, tmp_path)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr.decode()[-2000:]
    served, ledger = stub.stats()["chat_requests"], _ledger_calls(tmp_path)
    assert served <= ledger <= served + CONCURRENCY * 2, (served, ledger)
    assert ledger > 40
    ledger_file = json.loads((tmp_path / "runs" / "ledger" / "ledger.json").read_text())
    assert ledger_file["llm_calls"] == ledger  # the summary agrees with what resumes read


def test_journal_carries_an_old_ledger_and_skips_a_torn_line(tmp_path):
    from evolve.llm.usage import Usage

    store = ExperimentDir(tmp_path)
    store.save_spend(Usage(requests=7, prompt_tokens=70, wall_time_s=5.0))  # a pre-journal ledger
    journal = store.open_journal()
    journal.record_call(
        role="agent",
        prompt_tokens=10,
        completion_tokens=2,
        cache_hit=False,
        failed=False,
        wall_time_s=6.0,
    )
    journal.record_call(
        role="agent",
        prompt_tokens=0,
        completion_tokens=0,
        cache_hit=True,
        failed=False,
        wall_time_s=6.5,
    )
    journal.close()
    with open(store.journal_file, "a", encoding="utf-8") as handle:
        handle.write('{"role": "agent", "prom')  # killed mid-write
    assert store.load_spend() == Usage(
        requests=8, prompt_tokens=80, completion_tokens=2, wall_time_s=6.5
    )
    reopened = store.open_journal()  # a resumed run appends on a fresh line
    reopened.record_call(
        role="simulator",
        prompt_tokens=1,
        completion_tokens=1,
        cache_hit=False,
        failed=True,
        wall_time_s=7.0,
    )
    reopened.close()
    assert store.load_spend() == Usage(
        requests=9, prompt_tokens=81, completion_tokens=3, wall_time_s=7.0
    )
