"""Silent surprises: what used to be silently replaced, silently accepted,
checked too late, or reported as a trustworthy number is now refused, announced or flagged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stub_server import StubServer

from evolve.cli import main
from evolve.commands.eval import format_table
from evolve.core.errors import ConfigError
from evolve.optimize import objective_value
from evolve.simulator.baselines import random_score
from evolve.simulator.environment import save_environment
from evolve.simulator.evaluation import EvaluationReport
from evolve.simulator.metrics import summarize
from evolve.simulator.records import Diagnosis, ItemResult, PeriodResult, UserResult
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset
from evolve.spec.config import resolve, spec_from_dict


@pytest.fixture
def env_file(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    save_environment(synthesize_environment(get_preset("tiny"), 0), path)  # 4 users
    return path


def stub_args(stub: StubServer, model: str = "stub") -> list[str]:
    return ["--model", model, "--base-url", stub.base_url, "--no-llm-cache"]


def eval_args(env: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--env", str(env), "--policy", "native", "--out", str(out), *extra]


def chat_requests(stub: StubServer) -> int:
    return stub.stats()["chat_requests"]


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("evolve: error:"), stderr
    return lines[0]


# ----- refused before any LLM call ---------------------------------------------------------


@pytest.mark.parametrize("flag", ["--rounds-init", "--rounds-update"])
def test_zero_rounds_are_refused(stub, env_file, tmp_path, capsys, flag):
    args = eval_args(env_file, tmp_path / "out", flag, "0", *stub_args(stub))
    assert main(args) == 2
    assert flag in one_line_error(capsys.readouterr().err)
    assert chat_requests(stub) == 0


def test_empty_environment_is_refused_by_validate_and_eval(stub, tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text("[]\n", encoding="utf-8")
    assert main(["env", "validate", str(empty)]) == 2
    output = capsys.readouterr().out
    assert "no users" in output and "INVALID" in output and "OK" not in output
    assert main(eval_args(empty, tmp_path / "out", *stub_args(stub))) == 2
    assert "no users" in one_line_error(capsys.readouterr().err)
    assert chat_requests(stub) == 0


def test_base_parameter_outside_the_spec_bounds_is_refused_at_spec_load():
    data = {
        "name": "bounds",
        "environment": {"preset": "tiny", "train_users": 1, "heldout_users": 1},
        "policy": {"kind": "in_context", "parameters": {"update_every": 8}},
        "optimizer": {"parameters": {"update_every": {"low": 1, "high": 4}}},
    }
    with pytest.raises(ConfigError, match=r"update_every = 8 is outside .*\[1, 4\]"):
        resolve(spec_from_dict(data))
    data["policy"]["parameters"]["update_every"] = 4  # at the bound: accepted
    assert resolve(spec_from_dict(data)).base_policy.parameters()["update_every"] == 4


def test_changed_env_or_model_on_rerun_is_refused_before_any_llm_call(
    stub, env_file, tmp_path, capsys
):
    out = tmp_path / "out"
    ub_cache = ["--upper-bound-cache", str(tmp_path / "ub")]
    first = eval_args(env_file, out, "--users", "1", *ub_cache)
    assert main([*first, *stub_args(stub)]) == 0
    capsys.readouterr()
    spent = chat_requests(stub)

    # Another model: its upper bound is not cached, so a late check would pay for it first.
    assert main([*first, *stub_args(stub, model="stub-other")]) == 2
    error = one_line_error(capsys.readouterr().err)
    assert "different configuration" in error and "stub-other" in error
    assert chat_requests(stub) == spent

    other_env = tmp_path / "other.json"
    save_environment(synthesize_environment(get_preset("tiny"), 1), other_env)
    assert main([*eval_args(other_env, out, "--users", "1", *ub_cache), *stub_args(stub)]) == 2
    assert "environment" in one_line_error(capsys.readouterr().err)
    assert chat_requests(stub) == spent


# ----- announced -----------------------------------------------------------------------------


def test_more_users_than_the_environment_has_is_announced(stub, env_file, tmp_path, capsys):
    args = eval_args(env_file, tmp_path / "out", "--users", "999", "--no-upper-bound")
    assert main([*args, "--rounds-init", "1", "--rounds-update", "1", *stub_args(stub)]) == 0
    assert "--users 999 but" in capsys.readouterr().err
    report = json.loads((tmp_path / "out" / "native" / "report.json").read_text())
    assert len(report["per_user"]) == 4


# ----- flagged: numbers that are not meaningful --------------------------------------------


def test_a_non_json_server_gives_a_loud_warning_and_a_recorded_flag(env_file, tmp_path, capsys):
    with StubServer(latency=0.0, fault="non_json") as stub:
        args = eval_args(env_file, tmp_path / "out", "--users", "1")
        args += ["--upper-bound-cache", str(tmp_path / "ub"), *stub_args(stub)]
        assert main(args) == 0
    output = capsys.readouterr().out
    assert "WARNING: native: THESE NUMBERS ARE NOT MEANINGFUL" in output
    summary = json.loads((tmp_path / "out" / "native" / "report.json").read_text())["summary"]
    assert summary["unreliable"] and "unparseable" in summary["unreliable"]


def item(qi: int, correct: bool, ub: bool, n_options: int = 3, parse_failed: bool = False):
    states = [[f"s{i}"] for i in range(n_options)]
    chosen = None if parse_failed else (1 if correct else 2)
    return ItemResult(
        question_index=qi,
        question=f"q{qi}",
        required_info=["v"],
        options=[f"o{i}" for i in range(n_options)],
        option_states=states,
        gold=1,
        gold_state=states[0],
        chosen=chosen,
        chosen_state=None if chosen is None else states[chosen - 1],
        correct=correct,
        parse_failed=parse_failed,
        random_score=random_score(states, states[0]),
        upper_bound_correct=ub,
        diagnosis=Diagnosis.CORRECT if correct else Diagnosis.WRITE,
    )


def users_of(periods: list[list[ItemResult]]) -> list[UserResult]:
    return [
        UserResult(
            user_id=f"u{index}",
            periods=[PeriodResult(user_id=f"u{index}", period_index=0, state={}, items=items)],
        )
        for index, items in enumerate(periods)
    ]


def test_parse_failures_on_more_than_half_of_the_items_flag_the_summary():
    half = users_of([[item(0, False, True, parse_failed=True), item(1, True, True)]])
    assert summarize(half).unreliable is None  # exactly half: not more than half
    most = users_of([[item(q, False, True, parse_failed=q < 2) for q in range(3)]])
    summary = summarize(most)
    assert summary.unreliable and "2 of 3 answers" in summary.unreliable
    assert summary.flat_metrics()["unreliable"] == 1.0  # logged to MLflow with the metrics
    assert summarize(half).flat_metrics()["unreliable"] == 0.0


# ----- the memory score of a minority of periods -------------------------------------------


def period_of(correct: int, ub: int, n: int = 4) -> list[ItemResult]:
    """n three-option questions: the first `correct` answered right, the first `ub` right
    under the upper bound."""
    return [item(q, correct=q < correct, ub=q < ub) for q in range(n)]


def three_option_example() -> list[UserResult]:
    """6 user-periods of 4 three-option questions (random 4/3 questions): in 4 the upper
    bound is right on 2 (not clearly above random) and the policy on none; in 2 both are
    right on all 4. The mean of periods used to report 1.0 from those 2 alone."""
    return users_of([period_of(0, 2) for _ in range(4)] + [period_of(4, 4) for _ in range(2)])


def test_more_than_a_quarter_periods_without_a_score_leave_the_mean_of_periods_undefined():
    summary = summarize(three_option_example())
    assert summary.degenerate_periods == 4
    assert summary.memory_score_period_mean is None
    assert "4 of 6 user-periods" in summary.period_mean_undefined
    # Over all 24 items: UB 16/24 against random 8/24, clearly above: defined.
    assert summary.memory_score == pytest.approx((8 / 24 - 1 / 3) / (16 / 24 - 1 / 3))


def test_the_memory_score_is_the_ratio_of_means_over_all_items():
    # Period A: UB 4/4, policy 3/4. Period B: UB 3/4, policy 1/4. Period C: UB 1/4 (no
    # margin), policy 2/4.
    users = users_of([period_of(3, 4), period_of(1, 3), period_of(2, 1)])
    summary = summarize(users)
    accuracy, random_mean, ub_mean = 6 / 12, 1 / 3, 8 / 12
    assert summary.memory_score == pytest.approx((accuracy - random_mean) / (ub_mean - random_mean))
    # 2 of 3 periods lack a score (B's UB is 1.67 questions above random, under 2): more than
    # a quarter, so the mean of periods is undefined while the memory score is not.
    assert summary.degenerate_periods == 2 and summary.memory_score_period_mean is None


def test_one_period_in_four_without_a_score_keeps_the_mean_of_periods():
    users = users_of([period_of(4, 4) for _ in range(3)] + [period_of(4, 1)])
    summary = summarize(users)
    assert summary.degenerate_periods == 1
    assert summary.memory_score_period_mean == pytest.approx(1.0)
    assert summary.period_mean_undefined is None


def test_eval_table_prints_a_dash_the_accuracy_and_why():
    users = users_of([period_of(1, 2) for _ in range(3)])
    summary = summarize(users)
    assert summary.memory_score is None
    report = EvaluationReport(
        run_dir=Path("r"),
        config_hash="h",
        users=users,
        summary=summary,
        per_user={},
        per_period=[],
        wall_time_s=0.0,
    )
    table = format_table([("native", report)])
    header, row = table.splitlines()[0].split(), table.splitlines()[2].split()
    assert header[1:4] == ["acc", "memory", "mem/period"]
    assert row[1:4] == ["0.250", "-", "-"]  # the accuracy in its own column, never in memory's
    from evolve.commands.eval import format_notes

    notes = format_notes([("native", report)])
    assert any("memory score undefined" in n and "not clearly above random" in n for n in notes)


def test_selection_and_pruning_use_the_memory_score_and_say_so():
    from evolve.results.objective import objective_used

    users = users_of([period_of(3, 4), period_of(1, 3), period_of(2, 1)])
    summary = summarize(users)
    assert objective_value(summary, "memory_score") == pytest.approx(summary.memory_score)
    assert objective_used(summary, "memory_score") == "memory_score"
    assert objective_value(summary, "accuracy") == pytest.approx(summary.accuracy)
    assert objective_used(summary, "accuracy") == "accuracy"
    no_room = summarize(users_of([period_of(1, 1)]))
    assert objective_used(no_room, "memory_score") == "accuracy"
    assert objective_value(no_room, "memory_score") == pytest.approx(no_room.accuracy)
