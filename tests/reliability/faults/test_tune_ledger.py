"""The spend ledger of `evolve tune` survives `kill -9` mid-trial.

A standalone tuning study journals every LLM request under its run directory before it is
sent (`runs/<name>/spend/<study>/`, one file per trial and one per process), so:

- after `kill -9` mid-trial, the recorded spend (what `evolve compare` shows and the budget
  counts) holds every request the stub received, and at most the calls in flight more;
- a rerun that retries the killed trial completes the study, and the ledger still matches
  the server (the killed trial's calls were paid, so they stay counted, once);
- the budget of a rerun counts the calls of a trial whose process was killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from reliability.process_helpers import (
    ONE_TRAIN_USER,
    load_tune_study,
    run_in_process,
    running_trial,
    tune_process,
)
from stub_server import StubServer
from tuning.tune_helpers import GRID, TuneWorld, write_tune_spec

from evolve.core.files import safe_name
from evolve.tuning import load_study_spec, run_study

CONCURRENCY = 1  # write_tune_spec's `concurrency`: calls in flight at most
SPEND_LINE = re.compile(r"^spend: (\d+) LLM calls, (\d+) tokens", re.M)


def _compared_spend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> int:
    """The LLM calls `evolve compare` shows for the study (read from its run directory)."""
    capsys.readouterr()
    code = run_in_process(tmp_path, "compare", "tune", "--runs-dir", str(tmp_path / "runs"))
    out = capsys.readouterr().out
    assert code == 0, out
    match = SPEND_LINE.search(out)
    assert match, f"no spend line in evolve compare's output:\n{out}"
    return int(match.group(1))


def test_tune_ledger_after_kill_9_mid_trial_is_within_the_in_flight_calls(tmp_path, capsys):
    requested = 3
    spec = write_tune_spec(
        tmp_path,
        f'trials = {requested}\nheldout = "none"\nheartbeat_grace_s = 3\n{GRID}',
        environment=ONE_TRAIN_USER,
    )
    with StubServer(latency=0.2) as stub:
        first = tune_process(spec, tmp_path, stub)
        deadline = time.monotonic() + 180  # a loaded machine starts Python slowly
        killed_trial, started = None, 0
        while time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()
            if killed_trial is None:
                killed_trial = running_trial(tmp_path)
                started = stub.stats()["chat_requests"]
            elif stub.stats()["chat_requests"] >= started + 4:
                break  # mid-trial: some of its LLM calls are done, none of its attributes set
            time.sleep(0.05)
        assert killed_trial is not None, "no trial started within 180 s"
        os.kill(first.pid, signal.SIGKILL)
        first.communicate(timeout=10)
        time.sleep(0.5)  # the stub finishes answering the call that was in flight
        served = stub.stats()["chat_requests"]
        recorded = _compared_spend(tmp_path, capsys)
        # Each request was journaled before it was sent: none the server received is missing.
        assert served <= recorded <= served + CONCURRENCY, (served, recorded)

        rerun = tune_process(spec, tmp_path, stub)
        out, err = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, err[-3000:]
        time.sleep(0.2)
        served_after = stub.stats()["chat_requests"]
    assert f"{requested}/{requested} trials finished" in out, out
    # The killed trial was retried (its calls paid twice, both counted once each).
    assert load_tune_study(tmp_path).trials[killed_trial.number].state == TrialState.FAIL
    assert served_after > served
    recorded_after = _compared_spend(tmp_path, capsys)
    assert served_after <= recorded_after <= served_after + CONCURRENCY, (
        served_after,
        recorded_after,
    )
    # `evolve tune` itself prints the same total, and tuning.json records it.
    printed = SPEND_LINE.search(out)
    assert printed and int(printed.group(1)) == recorded_after, out
    result = json.loads((tmp_path / "runs" / "tune" / "tuning.json").read_text())
    assert result["llm_calls"] == recorded_after
    # The killed trial's record shows the calls it completed before the kill.
    killed = next(t for t in result["trials"] if t["number"] == killed_trial.number)
    assert killed["llm_calls"] >= 4 - CONCURRENCY


def test_the_budget_counts_the_calls_of_a_killed_trial(tmp_path):
    """A rerun starts from the journals: a study whose killed trial already spent the
    whole `max_llm_calls` starts no trial."""
    from evolve.tuning.spend import StudySpendJournals

    spec_path = write_tune_spec(
        tmp_path, f'trials = 2\nheldout = "none"\n{GRID}', body="[budget]\nmax_llm_calls = 5\n"
    )
    spec = load_study_spec(spec_path)
    # What a killed worker left behind: a trial failed by its stale heartbeat, and the
    # journal of the calls it made before the kill.
    study = optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="tune", direction="maximize"
    )
    study.tell(study.ask(), state=TrialState.FAIL)
    journals = StudySpendJournals(tmp_path / "runs" / "tune", "tune")
    killed = journals.trial_journal(0).open()
    for _call in range(5):
        killed.record_call(
            role="agent",
            prompt_tokens=10,
            completion_tokens=2,
            cache_hit=False,
            failed=False,
            wall_time_s=0.1,
        )
    killed.close()  # flushed line by line already: closing changes nothing on disk
    world = TuneWorld()
    result = run_study(
        spec, world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    assert result.stopped and "max_llm_calls = 5" in result.stopped
    assert result.finished_trials == 0
    assert not world.agent.calls and not world.simulator.calls
    assert (result.llm_calls, result.tokens) == (5, 60)
    assert result.trial(0).llm_calls == 5  # the failed trial's record shows what it paid


def test_every_call_is_journaled_once_by_the_process_or_trial_that_made_it(tmp_path):
    """A `--worker` and the main invocation each write their own files; trial calls go to the
    trial's file; the study's total is the sum over every file and matches the LMs' calls."""
    from evolve.tuning.spend import StudySpendJournals

    spec = load_study_spec(
        write_tune_spec(tmp_path, f'trials = 2\nheldout = "best"\n{GRID}'),
    )
    world = TuneWorld()
    run = {"runs_dir": tmp_path / "runs", "upper_bound_cache": tmp_path / "ub"}
    worker = run_study(spec, world.lms, **run, worker_only=True)  # trials + upper bound
    assert worker.finished_trials == 2
    main = run_study(spec, world.lms, **run)  # held-out check only
    made = len(world.agent.calls) + len(world.simulator.calls)
    journals = StudySpendJournals(tmp_path / "runs" / "tune", "tune")
    names = sorted(path.name for path in journals.files())
    worker_file = f"worker-{safe_name(socket.gethostname())}-{os.getpid()}.jsonl"
    assert names == ["main.jsonl", "trial-0000.jsonl", "trial-0001.jsonl", worker_file]
    assert journals.total().requests == made == main.llm_calls
    by_trial = journals.trial_spend()
    assert all(by_trial[n].requests == main.trial(n).llm_calls > 0 for n in (0, 1))
