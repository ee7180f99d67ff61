"""Fidelity against the reference AMemGym code's own outputs (no LLM, exact equality).

`tests/fixtures/reference_output/` holds OUTPUT files of the reference code (AGI-Eval-
Official/amemgym @ ffcd188) run on `environment.json` (written by `evolve env generate
--preset tiny --seed 0 --users 2`) against the embedded 0.5B model: native for both users
(overall + diagnosis), AWI for user 0 (overall + diagnosis), and `random_metrics.json`. The probe
prompt inside `diagnosis_results.json` (`query`) is redacted; nothing else is changed.
Regenerate whenever the protocol changes (docs/reference/reference-run.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, simulator_responder

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.simulator.environment import load_environment
from evolve.simulator.metrics import summarize
from evolve.simulator.original_format import (
    OriginalDiagnosisMetrics,
    diagnosis_metrics,
    overall_accuracy_matrix,
    parse_diagnosis_results,
    parse_overall_results,
    period_results_from_original,
)
from evolve.simulator.records import UserResult

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference_output"
RUNS = {
    "native-local": ["u000-samuel-adeyemi", "u001-amara-okafor"],
    "awi-local": ["u000-samuel-adeyemi"],
}
DIAGNOSED = [(agent, user) for agent, users in RUNS.items() for user in users]


def load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def cells(matrix) -> list[float]:
    return [value for row in matrix for value in row]


def mean(values) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize(("agent", "user"), [(a, u) for a, users in RUNS.items() for u in users])
def test_our_metric_code_reproduces_the_stored_overall_metrics(agent, user):
    user_dir = FIXTURE / agent / user
    overall = parse_overall_results(load(user_dir / "overall_results.json"))
    stored = load(user_dir / "overall_metrics.json")
    assert overall_accuracy_matrix(overall) == stored["accuracy"]
    env = load_environment(FIXTURE / "environment.json")
    item = next(i for i in env.items if i.id == user)
    periods = period_results_from_original(item, overall)
    summary = summarize([UserResult(user_id=user, periods=periods)])
    assert summary.accuracy == mean(cells(stored["accuracy"]))
    # The reference's random baseline for this user, from its random_metrics.json.
    random_matrix = load(FIXTURE / "random_metrics.json")["accuracy"][env.items.index(item)]
    assert summary.random_score == mean(cells(random_matrix))


@pytest.mark.parametrize(("agent", "user"), DIAGNOSED)
def test_the_stored_diagnosis_parses_and_our_code_reproduces_its_metrics(agent, user):
    user_dir = FIXTURE / agent / user
    results = parse_diagnosis_results(load(user_dir / "diagnosis_results.json"))
    stored = OriginalDiagnosisMetrics.model_validate(load(user_dir / "diagnosis_metrics.json"))
    assert diagnosis_metrics(results) == stored
    # The same numbers through the records and summary every evaluation reports.
    env = load_environment(FIXTURE / "environment.json")
    item = next(i for i in env.items if i.id == user)
    overall = parse_overall_results(load(user_dir / "overall_results.json"))
    periods = period_results_from_original(item, overall, results)
    summary = summarize([UserResult(user_id=user, periods=periods)])
    means = stored.means()
    assert summary.original_write_failures == means["write_failure"]
    assert summary.original_read_failures == means["read_failure"]
    assert summary.memory_success == means["memory_success"]


@pytest.fixture
def scripted(monkeypatch):
    agent = ScriptedLM(agent_responder, model="agent-model")

    @contextlib.contextmanager
    def fake_open(args):
        yield scripted_role_lms(simulator=ScriptedLM(simulator_responder), agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    return agent


def test_evolve_eval_off_policy_loads_and_scores_the_reference_interactions(
    tmp_path, scripted, capsys
):
    argv = ["eval", "--env", str(FIXTURE / "environment.json"), "--policy", "native"]
    argv += ["--off-policy", str(FIXTURE / "native-local"), "--no-upper-bound"]
    argv += ["--concurrency", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    report = load(tmp_path / "out" / "native" / "report.json")
    assert report["summary"]["n_items"] == 12 and report["complete"]
    for user in RUNS["native-local"]:
        for period in range(3):
            replayed = load(
                tmp_path
                / "out"
                / "native"
                / "users"
                / user
                / f"period_{period:02d}"
                / "result.json"
            )
            recorded = load(
                FIXTURE / "native-local" / user / "interactions" / f"period_{period:02d}.json"
            )
            assert [[m["content"] for m in s["messages"]] for s in replayed["sessions"]] == [
                [m["content"] for m in s] for s in recorded
            ]
            assert all(s["replayed"] for s in replayed["sessions"])


def test_cross_check_scores_the_reference_layout_with_our_metric_code(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "cross_check", FIXTURE.parents[2] / "benchmarks" / "cross_check.py"
    )
    cross_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cross_check)
    env = load_environment(FIXTURE / "environment.json")
    users, notes = cross_check.reference_results(FIXTURE, env, "native-local", "local")
    summary = summarize(list(users.values()))
    stored = [
        load(FIXTURE / "native-local" / u / "overall_metrics.json") for u in RUNS["native-local"]
    ]
    assert summary.accuracy == mean([v for m in stored for v in cells(m["accuracy"])])
    assert summary.memory_success == 0.0 and summary.original_write_failures == 2.0
    assert summary.parse_failures["probe"] == 2 * 3 * 2 and notes == {}
    # No upper bound in the fixture: no memory score on either rule.
    assert summary.memory_score_original is None and summary.memory_score is None
    # AWI user 1 never finished: reported, not scored; user 0 is scored alone.
    users, notes = cross_check.reference_results(FIXTURE, env, "awi-local", "local")
    assert list(users) == ["u000-samuel-adeyemi"] and "u001-amara-okafor" in notes
    # A run the reference stopped mid-way leaves null entries for the periods it never
    # reached: that user is left out with the period named, never parsed as zeros.
    partial = tmp_path / "native-local"
    shutil.copytree(FIXTURE / "native-local", partial)
    results_file = partial / "u001-amara-okafor" / "overall_results.json"
    results = load(results_file)
    results[1] = [None for _ in results[1]]
    results_file.write_text(json.dumps(results))
    users, notes = cross_check.reference_results(tmp_path, env, "native-local", "local")
    assert list(users) == ["u000-samuel-adeyemi"]
    assert notes == {"u001-amara-okafor": "the reference stopped in period 1"}
