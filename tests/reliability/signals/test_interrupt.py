"""Ctrl-C and SIGTERM stop `eval`, `run` and `tune` within one call's latency
+ 2 s, exit 130 with one line, leave no LLM call behind, and a rerun completes the work with
the results of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from reliability.process_helpers import (
    TUNE_SPEC,
    llm_flags,
    run_in_process,
    start_cli,
    wait_for_requests,
    write_small_environment,
    write_tiny_spec,
)
from stub_server import StubServer

from evolve.core.errors import EXIT_INTERRUPTED

SLOW_CALL_S = 2.0


def stop_and_measure(process, stub: StubServer, signum: int) -> tuple[float, str]:
    """Send `signum` once the process is making LLM calls; seconds to exit and its stderr."""
    wait_for_requests(stub, at_least=3, timeout=90)
    sent = time.monotonic()
    process.send_signal(signum)
    _, err = process.communicate(timeout=30)
    took = time.monotonic() - sent
    # Nothing runs on after the exit: the server-side counter stops growing.
    after_exit = stub.stats()["chat_requests"]
    time.sleep(1.0)
    assert stub.stats()["chat_requests"] == after_exit
    return took, err


def assert_interrupted(process, took: float, err: str) -> None:
    assert process.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert took <= SLOW_CALL_S + 2.0, f"took {took:.1f}s to stop"
    lines = [line for line in err.splitlines() if line.startswith("evolve:")]
    assert lines == ["evolve: interrupted; rerun resumes (finished work is saved)"], err[-3000:]
    assert "Traceback" not in err


def scores_of_eval(out: Path) -> dict:
    report = json.loads((out / "in_context" / "report.json").read_text())
    summary = {k: v for k, v in report["summary"].items() if k not in ("tokens", "llm_calls")}
    return {"summary": summary, "complete": report["complete"]}


def test_eval_stops_on_sigint_and_a_rerun_completes_it(tmp_path):
    env_file = write_small_environment(tmp_path / "env.json")
    eval_args = ["eval", "--env", str(env_file), "--policy", "in_context", "--concurrency", "2"]
    with StubServer(latency=SLOW_CALL_S) as slow:
        process = start_cli(tmp_path, *eval_args, "--out", "out", *llm_flags(slow))
        took, err = stop_and_measure(process, slow, signal.SIGINT)
    assert_interrupted(process, took, err)

    with StubServer(latency=0.01) as fast:
        assert run_in_process(tmp_path, *eval_args, "--out", "out", *llm_flags(fast)) == 0
        reference = tmp_path / "ref"
        assert run_in_process(reference, *eval_args, "--out", "out", *llm_flags(fast)) == 0
    assert scores_of_eval(tmp_path / "out") == scores_of_eval(tmp_path / "ref" / "out")
    assert scores_of_eval(tmp_path / "out")["complete"] is True


def test_eval_stops_on_sigterm_while_every_call_hangs(tmp_path):
    """Calls in flight that never return are not waited for (no join of blocked threads)."""
    env_file = write_small_environment(tmp_path / "env.json")
    args = ["eval", "--env", str(env_file), "--policy", "in_context", "--concurrency", "2"]
    with StubServer(latency=0.01, fault="hang") as hanging:
        process = start_cli(tmp_path, *args, "--out", "out", *llm_flags(hanging))
        wait_for_requests(hanging, at_least=2, timeout=90)
        time.sleep(0.5)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
        took = time.monotonic() - sent
    assert_interrupted(process, took, err)


def candidate_scores(runs_dir: Path) -> dict:
    from evolve.optimize import ExperimentDir

    result = ExperimentDir(runs_dir / "tiny").load_result()
    return {
        c.id: (c.train.score if c.train else None, c.heldout.score if c.heldout else None)
        for c in result.candidates
    }


def test_run_stops_on_sigterm_and_a_rerun_completes_it(tmp_path):
    spec = write_tiny_spec(tmp_path)
    run_args = ["run", str(spec), "--no-progress"]
    with StubServer(latency=SLOW_CALL_S) as slow:
        process = start_cli(tmp_path, *run_args, "--runs-dir", "runs", *llm_flags(slow))
        took, err = stop_and_measure(process, slow, signal.SIGTERM)
    assert_interrupted(process, took, err)

    with StubServer(latency=0.01) as fast:
        assert run_in_process(tmp_path, *run_args, "--runs-dir", "runs", *llm_flags(fast)) == 0
        reference = tmp_path / "ref"
        assert run_in_process(reference, *run_args, "--runs-dir", "runs", *llm_flags(fast)) == 0
    assert candidate_scores(tmp_path / "runs") == candidate_scores(tmp_path / "ref" / "runs")


def completed_trials(home: Path) -> list:
    from evolve.tuning.study import TuningDir

    result = TuningDir(home / "runs" / "tiny-tune").load_result()
    return sorted(
        (sorted(t.parameters.items()), t.values) for t in result.trials if t.state == "complete"
    )


def test_tune_stops_on_sigint_and_a_rerun_completes_it(tmp_path):
    write_small_environment(tmp_path / "env.json")
    spec = tmp_path / "tune.toml"
    spec.write_text(TUNE_SPEC, encoding="utf-8")
    tune_args = ["tune", str(spec), "--runs-dir", "runs", "--no-progress"]
    with StubServer(latency=SLOW_CALL_S) as slow:
        process = start_cli(tmp_path, *tune_args, *llm_flags(slow))
        took, err = stop_and_measure(process, slow, signal.SIGINT)
    assert_interrupted(process, took, err)

    reference = tmp_path / "ref"
    write_small_environment(reference / "env.json")
    (reference / "tune.toml").write_text(TUNE_SPEC, encoding="utf-8")
    reference_args = ["tune", str(reference / "tune.toml"), *tune_args[2:]]
    with StubServer(latency=0.01) as fast:
        assert run_in_process(tmp_path, *tune_args, *llm_flags(fast)) == 0
        assert run_in_process(reference, *reference_args, *llm_flags(fast)) == 0
    trials = completed_trials(tmp_path)
    assert len(trials) == 2 and trials == completed_trials(reference)


# ----- stop time with fast calls and tracking on (what benchmarks/chaos.py measures) ---------

FAST_CALL_S = 0.05


def stop_fast_run_and_measure(home: Path, *args: str) -> None:
    """Ctrl-C a command making fast calls: it exits with 130 within one call's latency + 2 s
    (its loaded libraries, MLflow / SQLAlchemy / litellm, must not stretch the exit)."""
    with StubServer(latency=FAST_CALL_S) as stub:
        process = start_cli(home, *args, *llm_flags(stub))
        wait_for_requests(stub, at_least=10, timeout=90)
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        took = time.monotonic() - sent
    assert process.returncode == EXIT_INTERRUPTED, err[-3000:]
    assert took <= FAST_CALL_S + 2.0, f"took {took:.2f}s to stop"
    assert "Traceback" not in err


def test_eval_stops_fast_on_sigint(tmp_path):
    env_file = write_small_environment(tmp_path / "env.json", users=4)
    stop_fast_run_and_measure(
        tmp_path,
        *("eval", "--env", str(env_file), "--policy", "in_context", "--concurrency", "2"),
        *("--out", "out"),
    )


def test_run_with_tracking_stops_fast_on_sigint(tmp_path):
    spec = write_tiny_spec(tmp_path, tracking=True)
    stop_fast_run_and_measure(
        tmp_path,
        *("run", str(spec), "--no-progress", "--runs-dir", "runs"),
        *("--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"),
    )


def test_tune_with_tracking_stops_fast_on_sigint(tmp_path):
    write_small_environment(tmp_path / "env.json")
    spec = tmp_path / "tune.toml"
    spec.write_text(TUNE_SPEC.replace("enabled = false", "enabled = true"), encoding="utf-8")
    stop_fast_run_and_measure(
        tmp_path,
        *("tune", str(spec), "--runs-dir", "runs", "--no-progress"),
        *("--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"),
    )
