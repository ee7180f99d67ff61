"""The runner under each protocol: which simulated-user prompt it plays, and that the report
records the protocol that produced it."""

from __future__ import annotations

import json

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn
from simulator.eval_helpers import agent_responder, make_environment, sections

from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.simulator.run_dir import RunLayout
from memory_policies import NativePolicy


def run(tmp_path, protocol: str):
    simulator = ScriptedLM(lambda call: user_turn("Tell me more, please."), model="sim")
    agent = ScriptedLM(agent_responder, model="agent")
    lms = scripted_role_lms(simulator=simulator, agent=agent)
    config = EpisodeConfig(protocol=protocol, rounds_initial=1, rounds_update=2, concurrency=1)
    env = make_environment(users=1)
    report = run_evaluation(env, NativePolicy(), lms, tmp_path / protocol, config)
    return report, simulator, env


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_report_records_the_protocol(tmp_path, protocol):
    report, _, _ = run(tmp_path, protocol)
    assert report.protocol == protocol
    stored = json.loads(RunLayout(tmp_path / protocol).report_file.read_text())
    assert stored["protocol"] == protocol


def test_paper_run_plays_the_state_blind_user_in_later_periods_only(tmp_path):
    report, simulator, env = run(tmp_path, "paper")
    item = env.items[0]
    later_sessions = sum(len(period.sessions) for period in item.periods[1:])
    # Rounds 1 then 2: no follow-up in period 0, one per session afterwards.
    assert len(simulator.calls) == later_sessions
    first = sections(simulator.calls[0].user)
    assert "tracked_schema" in first and "facts_you_may_mention" not in first
    assert first["current_date"].strip() == item.periods[1].period_end
    assert first["profile_date"].strip() == str(item.start_time or "")


def test_evolve_run_plays_the_state_aware_user(tmp_path):
    _, simulator, _ = run(tmp_path, "evolve")
    assert simulator.calls and "facts_you_may_mention" in sections(simulator.calls[0].user)
