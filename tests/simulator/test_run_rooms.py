"""The runner's rooms: a unit of work runs against any `UnitFiles` (no I/O of its own), and
`run_evaluation` takes its optional parts as one `RunOptions` or as its fields."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, make_environment, simulator_responder

from evolve.llm.usage import Usage
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.simulator.evaluation.context import RunContext, RunOptions, UserRun
from evolve.simulator.evaluation.identity import assign_dir_names
from evolve.simulator.evaluation.unit import finish_unit
from evolve.simulator.records import PeriodResult, SessionTranscript
from memory_policies import NativePolicy

CONFIG = EpisodeConfig(rounds_initial=2, rounds_update=1, concurrency=1, seed=3)


class InMemoryUnitFiles:
    """A `UnitFiles` that keeps everything in dictionaries."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, int], PeriodResult] = {}
        self.transcripts: dict[tuple[str, int], tuple[list[SessionTranscript], Usage]] = {}
        self.checkpoints: dict[tuple[str, int], str] = {}

    def load_period_result(self, user_dir_name: str, period_index: int) -> PeriodResult | None:
        return self.results.get((user_dir_name, period_index))

    def save_period_result(self, user_dir_name: str, result: PeriodResult) -> None:
        self.results[(user_dir_name, result.period_index)] = result

    def load_transcript(self, user_dir_name, period_index):
        return self.transcripts.get((user_dir_name, period_index))

    def save_transcript(self, user_dir_name, period_index, sessions, usage) -> None:
        self.transcripts[(user_dir_name, period_index)] = (list(sessions), usage)

    def load_checkpoint(self, user_dir_name: str, period_index: int) -> str | None:
        return self.checkpoints.get((user_dir_name, period_index))

    def save_checkpoint(self, user_dir_name: str, period_index: int, state_json: str) -> None:
        self.checkpoints[(user_dir_name, period_index)] = state_json

    def checkpoint_file(self, user_dir_name: str, period_index: int) -> Path:
        return Path("memory") / user_dir_name / str(period_index)

    def period_dir(self, user_dir_name: str, period_index: int) -> Path:
        return Path("memory") / user_dir_name


def scripted_lms():
    return scripted_role_lms(
        simulator=ScriptedLM(simulator_responder, model="simulator-model"),
        agent=ScriptedLM(agent_responder, model="agent-model"),
    )


def comparable(results) -> list[dict]:
    return [r.model_dump(mode="json", exclude={"wall_time_s"}) for r in results]


def test_units_run_against_in_memory_unit_files_and_match_a_run_on_disk(tmp_path, monkeypatch):
    env = make_environment(users=2)
    monkeypatch.chdir(tmp_path)  # anything written relative to the working directory shows
    files = InMemoryUnitFiles()
    run = RunContext(NativePolicy(), scripted_lms(), files, CONFIG, RunOptions())
    users: list[UserRun] = assign_dir_names(env.items)
    for user in users:
        for period_index in range(len(user.item.periods)):
            finish_unit(run, user, period_index)
    assert os.listdir(tmp_path) == []  # no file of its own
    assert sorted(files.results) == [(u.dir_name, p) for u in users for p in range(3)]
    assert set(files.checkpoints) == set(files.results) == set(files.transcripts)

    on_disk = run_evaluation(env, NativePolicy(), scripted_lms(), tmp_path / "run", CONFIG)
    assert comparable(r for u in users for r in u.results) == comparable(
        p for u in on_disk.users for p in u.periods
    )


def test_run_options_whole_or_as_fields_give_the_same_run(tmp_path):
    env = make_environment(users=1)
    as_fields = run_evaluation(
        env, NativePolicy(), scripted_lms(), tmp_path / "a", CONFIG, off_policy_dir=None
    )
    whole = run_evaluation(
        env, NativePolicy(), scripted_lms(), tmp_path / "b", CONFIG, RunOptions()
    )
    assert as_fields.config_hash == whole.config_hash
    with pytest.raises(TypeError, match="not both"):
        run_evaluation(
            env, NativePolicy(), scripted_lms(), tmp_path / "c", CONFIG, RunOptions(), stop=None
        )
    with pytest.raises(TypeError):
        run_evaluation(env, NativePolicy(), scripted_lms(), tmp_path / "d", CONFIG, upper=None)


def test_every_protocol_names_strategies_the_simulator_has():
    from evolve.core.protocol import ALL_RULES
    from evolve.optimize.reflect import REFLECTOR_PROMPTS
    from evolve.optimize.report import HEADLINES
    from evolve.simulator.baselines import UPPER_BOUND_PROMPTS
    from evolve.simulator.evaluation import PROBE_STRATEGIES
    from evolve.simulator.user import PaperUserView, StateAwareUserView, user_view_for

    item = make_environment(users=1).items[0]
    period = item.periods[0]
    views = set()
    for rules in ALL_RULES:
        # Each string-valued field names the object that carries its behaviour.
        assert rules.probe_style in PROBE_STRATEGIES
        assert rules.upper_bound_layout in UPPER_BOUND_PROMPTS
        assert rules.reflector_prompt in REFLECTOR_PROMPTS
        assert rules.headline_memory_score in HEADLINES
        views.add(type(user_view_for(rules.user_view, item, period, period.sessions[0])))
    assert views == {PaperUserView, StateAwareUserView}  # each protocol its own view
