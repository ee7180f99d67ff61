"""`evolve eval` with scripted LMs in place of the embedded server."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, make_environment, simulator_responder

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.simulator.environment import save_environment
from evolve.stats import QuestionOutcomes, compare, estimate


@pytest.fixture
def scripted(monkeypatch):
    """Replace the LLM context the command opens; returns the agent LM to count calls."""
    agent = ScriptedLM(agent_responder, model="agent-model")
    simulator = ScriptedLM(simulator_responder, model="simulator-model")
    opened = []

    @contextlib.contextmanager
    def fake_open(args, rules=None):
        opened.append(args)
        yield scripted_role_lms(simulator=simulator, agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    return agent, opened


def test_eval_two_policies_side_by_side_then_resume(tmp_path, scripted, capsys):
    agent, opened = scripted
    env_file = tmp_path / "env.json"
    save_environment(make_environment(users=2), env_file)
    argv = [
        "eval",
        "--env",
        str(env_file),
        "--policy",
        "native",
        "--policy",
        "in_context:update_every=2,short_term_len=2",
        "--out",
        str(tmp_path / "out"),
        "--rounds-init",
        "2",
        "--concurrency",
        "2",
        "--upper-bound-cache",
        str(tmp_path / "ub"),
        # The scripted agent reads DSPy's JSON fields: the evolve variants' prompts.
        "--protocol",
        "evolve",
    ]
    assert main(argv) == 0
    output = capsys.readouterr().out
    table = output[output.index("\npolicy ") + 1 :].splitlines()
    assert table[0].split()[:5] == ["policy", "acc", "memory", "mem/period", "random"]
    rows = [line.split() for line in table[2:4]]
    assert [row[0] for row in rows] == ["native", "in_context-update_every_2_short_term_len_2"]
    assert rows[0][1] == "1.000"  # the latest-mention agent recalls everything with full history
    assert rows[0][2:4] == ["-", "-"]  # no memory score: never the accuracy in its place
    assert "parse! = unparseable outputs" in output
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["policy", "acc+rf"])
    original = lines[start:]
    assert original[0].split() == ["policy", "acc+rf", "paper-mem", "write/item", "read/item"] + [
        "mem",
        "success",
    ]
    assert [line.split()[0] for line in original[2:4]] == [row[0] for row in rows]
    raw = _check_intervals(output, tmp_path / "out", [row[0] for row in rows])
    # `evolve compare` on the directory: the same intervals, with no baseline (the directory
    # does not record which policy came first).
    assert main(["compare", str(tmp_path / "out")]) == 0
    compared = _interval_rows(capsys.readouterr().out, sorted(raw))
    _check_scores(compared, raw)
    assert all(len(row.split()) == 7 for row in compared.values())
    for name in ("native", "in_context-update_every_2_short_term_len_2"):
        report = json.loads((tmp_path / "out" / name / "report.json").read_text())
        assert report["summary"]["n_items"] == 2 * 3 * 2
        summary = report["summary"]
        # Periods of 2 questions never clear the 2-question margin: no user-period has a
        # memory score, so neither has their mean.
        assert summary["degenerate_periods"] == 6
        assert summary["memory_score_period_mean"] is None
        assert "none of the 6 user-period(s)" in summary["period_mean_undefined"]
        # The scripted upper bound is right on 6 of 12 (random: 4 of 12), under the margin of
        # 3.3 questions: no memory score over all items either, and the table shows "-".
        assert summary["memory_score"] is None
        assert "not clearly above random" in summary["memory_score_undefined"]
        assert (tmp_path / "out" / name / "original" / "user-0" / "overall_results.json").exists()
    calls = len(agent.calls)
    assert main(argv) == 0  # a rerun resumes everything: no new LLM call
    assert len(agent.calls) == calls
    assert len(opened) == 2


SCORE = r"(-?\d\.\d{3}) \[(-?\d\.\d{3}), (-?\d\.\d{3})\]"
DIFFERENCE = r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]"


def _raw_outcomes(run_dir: Path) -> QuestionOutcomes:
    """A policy's per-question records read straight from its run directory's JSON files (in
    the runner's user and period order, so that the seeded resamples are the same)."""
    keys, correct, random_scores, upper = [], [], [], []
    for path in sorted(run_dir.glob("users/*/period_*/result.json")):
        period = json.loads(path.read_text())
        for item in period["items"]:
            keys.append(("", period["user_id"], period["period_index"], item["question_index"]))
            correct.append(float(item["correct"]))
            random_scores.append(item["random_score"])
            known = item["upper_bound_correct"]
            upper.append(np.nan if known is None else float(known))
    return QuestionOutcomes(
        keys=tuple(keys),
        correct=np.array(correct),
        random_score=np.array(random_scores),
        upper_bound=np.array(upper),
    )


def _interval_rows(output: str, names: list[str]) -> dict[str, str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("scores with 95% int"))
    assert lines[start + 1].split()[:5] == ["policy", "users", "questions", "accuracy", "memory"]
    rows = {line.split()[0]: line for line in lines[start + 3 : start + 3 + len(names)]}
    assert list(rows) == names
    assert lines[start + 3 + len(names)].startswith("95% intervals: two-stage bootstrap")
    assert "statistics seed 0, 2000 resamples" in lines[start + 3 + len(names)]
    return rows


def _check_scores(rows: dict[str, str], raw: dict[str, QuestionOutcomes]) -> None:
    """Each row's accuracy and its interval, recomputed from the policy's own records."""
    for name, outcomes in raw.items():
        row = rows[name]
        assert row.split()[1:3] == ["2", str(outcomes.questions)]
        (accuracy,) = re.findall(SCORE, row)[:1]
        assert float(accuracy[0]) == pytest.approx(outcomes.correct.mean(), abs=5e-4)
        interval = estimate(outcomes, seed=0).accuracy.interval
        shown = (float(accuracy[1]), float(accuracy[2]))
        assert shown == pytest.approx((interval.low, interval.high), abs=5e-4), row
        assert row.split()[6] == "-"  # no memory score, so no interval either


def _check_intervals(output: str, out: Path, names: list[str]) -> dict[str, QuestionOutcomes]:
    """Each policy's accuracy with the interval of its own per-question records, and the
    second one's paired difference to the first, recomputed from those records (returned)."""
    assert f"diff = policy - {names[0]} (the first --policy) on the same questions" in output
    rows = _interval_rows(output, names)
    raw = {name: _raw_outcomes(out / name) for name in names}
    _check_scores(rows, raw)
    assert rows[names[0]].endswith("(baseline)")
    # The in_context policy misses questions the full history answers: a real interval.
    first, second = raw[names[0]], raw[names[1]]
    row = rows[names[1]]
    assert 0 < second.correct.mean() < 1
    (difference,) = re.findall(DIFFERENCE, row)
    assert float(difference[0]) == pytest.approx(
        second.correct.mean() - first.correct.mean(), abs=5e-4
    )
    interval = compare(second, first, seed=0).difference.interval
    low, high = float(difference[1]), float(difference[2])
    assert (low, high) == pytest.approx((interval.low, interval.high), abs=5e-4)
    assert high - low > 0.1
    ahead = int(((second.correct == 1) & (first.correct == 0)).sum())
    behind = int(((second.correct == 0) & (first.correct == 1)).sum())
    assert f"{ahead} vs {behind}" in row
    assert f" {binomtest(ahead, ahead + behind, 0.5).pvalue:.3f} " in row
    verdict = "beats" if low > 0 else "worse" if high < 0 else "within noise"
    assert row.endswith(verdict)
    return raw


def test_eval_with_a_preset_and_limited_users(tmp_path, scripted, capsys):
    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "native"]
    argv += ["--out", str(tmp_path / "out"), "--no-upper-bound"]
    assert main(argv) == 0
    report = json.loads((tmp_path / "out" / "native" / "report.json").read_text())
    assert len(report["per_user"]) == 1
    assert report["summary"]["memory_score"] is None


@pytest.mark.parametrize("quiet", [False, True])
def test_no_progress_silences_the_bars_only(tmp_path, scripted, capsys, monkeypatch, quiet):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # bars are drawn on terminals only
    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "native", "--no-upper-bound"]
    argv += ["--out", str(tmp_path / "out")] + (["--no-progress"] if quiet else [])
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert ("native user-periods" in captured.err) is not quiet
    assert "native" in captured.out  # the table is printed either way


def test_no_bars_and_no_escape_codes_when_stderr_is_not_a_terminal(tmp_path, scripted, capsys):
    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "native"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0  # progress wanted
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b[" not in err and "user-periods" not in err, repr(err[:300])


def test_eval_bad_policy_spec_fails_before_opening_the_llm(tmp_path, scripted, capsys):
    _, opened = scripted
    code = main(["eval", "--preset", "tiny", "--policy", "nonsense", "--out", str(tmp_path)])
    assert code == 2
    assert "unknown policy kind" in capsys.readouterr().err
    assert opened == []


def test_eval_refuses_wrong_only_probes_under_paper_in_one_line(tmp_path, scripted, capsys):
    _, opened = scripted
    argv = ["eval", "--preset", "tiny", "--policy", "native", "--out", str(tmp_path)]
    assert main([*argv, "--probes", "wrong_only"]) == 2  # --protocol defaults to paper
    error = capsys.readouterr().err.strip()
    assert "--probes 'wrong_only' is refused under protocol 'paper'" in error
    assert len(error.splitlines()) == 1 and opened == []


def test_run_dir_names_are_distinct_and_safe():
    assert eval_command.run_dir_names(["native", "native", "a/b/bundle/"]) == [
        "native",
        "native_2",
        "bundle",
    ]


@pytest.mark.integration
def test_two_policies_side_by_side_on_the_embedded_model(
    tmp_path, embedded_server, capsys, monkeypatch
):
    """`evolve eval` compares policies on the real model: episodes, questions, diagnosis
    probes, both tables and the reports. The two cheapest kinds on a cold cache (full history,
    raw turns retrieved); every kind converses, remembers and answers on the real model in
    tests/memory_policies/test_mp_integration.py, and in_context is evaluated on it by the
    tuning and evolution integration tests. (On one core, cold: external 314 s, raw_rag 241 s;
    native needs no extraction calls: its runner test takes about 150 s with follow-ups.)"""
    policies = ["native", "raw_rag"]
    monkeypatch.setenv("MEMORY_POLICIES_EMBEDDER", "minilm")  # paper: the embedder is named
    argv = ["eval", "--preset", "tiny", "--users", "1", "--out", str(tmp_path / "runs")]
    for policy in policies:
        argv += ["--policy", policy]
    argv += [
        "--base-url", embedded_server.base_url, "--model", embedded_server.model_name,
        "--structured-output", "llama_cpp",
        "--upper-bound-cache", str(tmp_path / "upper_bound"),
        # The paper protocol has no reply cap: at the endpoint's 512 the 0.5B model's looping
        # replies (and the native history that repeats them) took most of this test's 14 min.
        "--max-tokens", "128",
    ]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.split()[:1] and line.split()[0] in policies]
    # Three tables: ours; each score with its 95% interval (and raw_rag's paired difference
    # to native, with its verdict); the original's rules on the same answers.
    assert [row.split()[0] for row in rows] == policies * 3
    intervals = rows[2:4]
    assert all("[" in row for row in intervals)
    assert any(word in intervals[1] for word in ("beats", "within noise", "worse"))
    for policy in policies:
        report = json.loads((tmp_path / "runs" / policy / "report.json").read_text())
        summary = report["summary"]
        assert summary["n_items"] > 0 and summary["accuracy"] is not None
        # Real answers: most questions parse (constrained decoding), failures are counted.
        assert summary["parse_failures"]["answer"] < summary["n_items"]
        total = (
            summary["write_failure_rate"]
            + summary["read_failure_rate"]
            + summary["utilization_failure_rate"]
        )
        assert abs(total - (1 - summary["accuracy"])) < 1e-9
