"""`evolve eval` with scripted LMs in place of the embedded server."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, make_environment, simulator_responder

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.simulator.environment import save_environment


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
    # Two tables: ours, then the original's rules on the same answers.
    assert [row.split()[0] for row in rows] == policies * 2
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
