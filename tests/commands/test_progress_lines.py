"""Where no bar is drawn (output to a log or a pipe), an evaluation still says how far it
is: a plain line at least every heartbeat while calls go on, with an estimate."""

from __future__ import annotations

import io
import sys

from evolve.commands.progress import EvaluationBar


def test_a_log_gets_a_progress_line_per_heartbeat(monkeypatch):
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    bar = EvaluationBar(enabled=True, heartbeat_s=0.0)
    sink = bar.sink("g01-c0 train")
    sink.run_started(users=2, periods=3, finished_units=2)
    sink.unit_finished("u", 0, resumed=False)
    sink.llm_calls(17)
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("    ... g01-c0 train: 3/6 user-periods, 0 LLM calls so far")
    assert "min left in this evaluation" in lines[0]
    assert lines[1].startswith("    ... g01-c0 train: 3/6 user-periods, 17 LLM calls so far")
    bar.close()


def test_no_line_before_the_heartbeat_is_due(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    sink = EvaluationBar(enabled=True, heartbeat_s=3600.0).sink("base train")
    sink.run_started(users=1, periods=2, finished_units=0)
    for calls in range(1, 50):
        sink.llm_calls(calls)
    assert log.getvalue() == ""
