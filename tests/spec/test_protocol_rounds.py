"""Rounds per session for a data file follow the protocol (paper: 1 then 2, as the published
v1.base; evolve: 1 and 1) unless the spec or the command line sets them; a preset keeps its
own rounds."""

from __future__ import annotations

import contextlib
import itertools
import json

import pytest
from optimize.evolve_helpers import write_spec
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn
from simulator.eval_helpers import agent_responder, make_environment

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.simulator.environment import save_environment
from evolve.simulator.synthesis.presets import get_preset
from evolve.spec.config import load_spec, resolve


@pytest.mark.parametrize(
    ("protocol_line", "expected"),
    [('protocol = "paper"', (1, 2)), ('protocol = "evolve"', (1, 1)), ("", (1, 1))],
)
def test_spec_with_a_data_file_takes_the_protocols_rounds(tmp_path, protocol_line, expected):
    resolved = resolve(load_spec(write_spec(tmp_path, protocol_line)))
    episode = resolved.episode
    assert (episode.rounds_initial, episode.rounds_update) == expected
    assert episode.protocol == (protocol_line.split('"')[1] if protocol_line else "evolve")


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_spec_rounds_override_the_protocol_default(tmp_path, protocol):
    path = write_spec(
        tmp_path, f'protocol = "{protocol}"', episode="rounds_initial = 3\nrounds_update = 4"
    )
    episode = resolve(load_spec(path)).episode
    assert (episode.rounds_initial, episode.rounds_update) == (3, 4)
    only_update = write_spec(tmp_path, f'protocol = "{protocol}"', episode="rounds_update = 3")
    episode = resolve(load_spec(only_update)).episode
    assert (episode.rounds_initial, episode.rounds_update) == (1, 3)


def test_a_preset_keeps_its_own_rounds_under_either_protocol(tmp_path):
    preset = get_preset("tiny")
    environment = 'preset = "tiny"\nusers = 2\ntrain_users = 1\nheldout_users = 1'
    for protocol in ("paper", "evolve"):
        spec = load_spec(write_spec(tmp_path, f'protocol = "{protocol}"', environment=environment))
        episode = resolve(spec).episode
        assert (episode.rounds_initial, episode.rounds_update) == (
            preset.rounds_initial,
            preset.rounds_update,
        )


# Follow-ups that differ from one another (the same one twice is a self-repeat, which the
# evolve user asks again: the call count below would then count retries, not rounds).
FOLLOW_UPS = (
    "Which of these is quickest?",
    "Could I prepare it the night before?",
    "Does that work on a small budget?",
    "What would you change for winter?",
    "Is there a version without dairy?",
    "How long does it keep in the fridge?",
)


def distinct_follow_ups():
    turns = itertools.cycle(FOLLOW_UPS)
    return lambda call: user_turn(next(turns))


@pytest.fixture
def scripted_lms(monkeypatch):
    simulator = ScriptedLM(distinct_follow_ups(), model="simulator-model")
    agent = ScriptedLM(agent_responder, model="agent-model")

    @contextlib.contextmanager
    def fake_open(args, rules=None):
        yield scripted_role_lms(simulator=simulator, agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    return simulator


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], (1, 2)),  # no --protocol: paper
        (["--protocol", "paper"], (1, 2)),
        (["--protocol", "evolve"], (1, 1)),
        (["--protocol", "paper", "--rounds-update", "1"], (1, 1)),
        (["--protocol", "evolve", "--rounds-init", "2", "--rounds-update", "3"], (2, 3)),
    ],
)
def test_eval_with_a_data_file_takes_the_protocols_rounds(tmp_path, scripted_lms, extra, expected):
    env = make_environment(users=1)
    env_file = tmp_path / "env.json"
    save_environment(env, env_file)
    out = tmp_path / "out"
    argv = ["eval", "--env", str(env_file), "--policy", "native", "--out", str(out)]
    assert main([*argv, "--no-upper-bound", "--concurrency", "1", *extra]) == 0
    run_record = json.loads((out / "native" / "run.json").read_text())
    episode = run_record["config"]["episode"]
    assert (episode["rounds_initial"], episode["rounds_update"]) == expected
    # The simulated user talks only in sessions of 2 rounds or more.
    periods = env.items[0].periods
    follow_ups = sum(
        len(period.sessions) * ((expected[0] if index == 0 else expected[1]) - 1)
        for index, period in enumerate(periods)
    )
    assert len(scripted_lms.calls) == follow_ups
    report = json.loads((out / "native" / "report.json").read_text())
    assert report["protocol"] == ("evolve" if "evolve" in extra else "paper")
