"""The protocol in the shipped specs and in study specs, and the quickstart's on-policy
simulation."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, simulator_responder
from tuning.tune_helpers import PAPER_GRID, write_tune_spec

from evolve.simulator.evaluation import run_evaluation
from evolve.spec.config import load_spec, resolve
from evolve.tuning import load_study_spec, resolve_tuning
from evolve.tuning.study import job_from

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
GRID = f'sampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}'


@pytest.mark.parametrize(
    ("file", "protocol"),
    [
        ("quickstart.toml", "evolve"),
        ("tune_quick.toml", "evolve"),
        ("tune_paper_grid.toml", "paper"),
    ],
)
def test_shipped_specs_say_their_protocol_explicitly(file, protocol):
    text = (EXPERIMENTS / file).read_text(encoding="utf-8")
    assert f'\nprotocol = "{protocol}"' in text  # written out, not left to the default
    load = load_study_spec if file.startswith("tune_") else load_spec
    assert load(EXPERIMENTS / file).protocol == protocol


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_tuning_spec_carries_the_protocol_into_the_episodes_and_the_identity(tmp_path, protocol):
    path = write_tune_spec(tmp_path, GRID, body=f'protocol = "{protocol}"')
    spec = load_study_spec(path)
    assert spec.as_experiment().protocol == protocol
    job = job_from(resolve_tuning(spec))
    assert job.episode.protocol == protocol
    assert job.identity({})["protocol"] == protocol


def test_tuning_identity_differs_by_protocol(tmp_path):
    hashes = set()
    for protocol in ("paper", "evolve"):
        directory = tmp_path / protocol
        directory.mkdir()
        path = write_tune_spec(directory, GRID, body=f'protocol = "{protocol}"')
        hashes.add(job_from(resolve_tuning(load_study_spec(path))).config_hash({}))
    assert len(hashes) == 2


def test_quickstart_episodes_make_the_simulated_user_talk(tmp_path):
    resolved = resolve(load_spec(EXPERIMENTS / "quickstart.toml"))
    assert resolved.episode.rounds_update >= 2  # item 8: later periods are on-policy
    assert resolved.spec.optimizer.heldout == "final"  # pays for the extra calls
    simulator = ScriptedLM(simulator_responder, model="simulator-model")
    lms = scripted_role_lms(
        simulator=simulator, agent=ScriptedLM(agent_responder, model="agent-model")
    )
    report = run_evaluation(
        resolved.train, resolved.base_policy, lms, tmp_path / "run", resolved.episode
    )
    later_sessions = sum(
        len(period.sessions) for item in resolved.train.items for period in item.periods[1:]
    )
    assert later_sessions >= 1
    assert len(simulator.calls) == later_sessions * (resolved.episode.rounds_update - 1)
    later = [period for user in report.users for period in user.periods[1:]]
    assert all(
        session.rounds_completed == resolved.episode.rounds_update
        for period in later
        for session in period.sessions
    )


def test_a_spec_carries_its_protocols_rules_but_rules_is_no_key_of_the_file():
    from evolve.core.errors import ConfigError
    from evolve.core.protocol import PAPER
    from evolve.spec.config import spec_from_dict

    data = {
        "name": "rules",
        "protocol": "paper",
        "environment": {"preset": "tiny", "users": 3, "train_users": 2, "heldout_users": 1},
        "policy": {"kind": "in_context"},
    }
    spec = spec_from_dict(data)
    assert spec.rules is PAPER and resolve(spec).rules is PAPER
    assert "rules" not in spec.model_dump() and "rules" not in spec.identity()
    with pytest.raises(ConfigError, match="unknown key 'rules'"):
        spec_from_dict({**data, "rules": "evolve"})
    with pytest.raises(ConfigError) as refused:
        spec_from_dict({**data, "colour": "red"})
    assert "valid keys:" in str(refused.value) and "rules" not in str(refused.value)
