"""`evolve env synthesize --llm` flags and handler, with a scripted simulator."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.synthesis.llm_helpers import PipelinePlayer, wrong_match

import evolve.commands.llm_flags
from evolve.cli import main
from evolve.commands.env_llm import add_llm_synthesize_arguments, run_llm_synthesize
from evolve.core.errors import EXIT_LLM_FAILURE, ConfigError, LLMOutputError
from evolve.simulator.environment import load_environment

CONFIG_TOML = """
preset = "tiny"
num_periods = 2
num_questions = 2
choices_per_state = [2, 3]
changes_per_period = [1, 2]
max_changes_per_state = 2
min_state_variants = 3
period_length = 1
num_users = 2
workers = 2
[retries]
stage_attempts = 2
answer_refinements = 1
query_refinements = 1
"""


def offline_like_parser() -> argparse.ArgumentParser:
    """Offline synthesis's flags, which the LLM flags must share, not redefine."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--catalog", action="append", default=[])
    add_llm_synthesize_arguments(parser)
    return parser


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch):
    players: list[PipelinePlayer] = []

    def use(player: PipelinePlayer) -> None:
        players.append(player)

    @contextlib.contextmanager
    def fake_open(args, base=None):
        yield scripted_role_lms(simulator=ScriptedLM(players[-1], model="scripted-simulator"))

    monkeypatch.setattr(evolve.commands.llm_flags, "open_role_lms_from_args", fake_open)
    return use


def test_flags_are_added_once_next_to_the_offline_ones(tmp_path: Path) -> None:
    parser = offline_like_parser()
    args = parser.parse_args(
        ["--llm", "--out", "x.json", "--lang", "de", "--workers", "3", "--model", "gpt-4.1"]
    )
    assert args.llm and args.lang == "de" and args.workers == 3 and args.model == "gpt-4.1"
    assert args.personas is None and args.work_dir is None and args.seed == 0
    bare = argparse.ArgumentParser()
    add_llm_synthesize_arguments(bare)
    assert bare.parse_args(["--seed", "4"]).seed == 4


def test_run_writes_environment_report_and_cost_tables(tmp_path: Path, scripted, capsys) -> None:
    config = tmp_path / "gen.toml"
    config.write_text(CONFIG_TOML)
    out = tmp_path / "env.json"
    args = offline_like_parser().parse_args(["--llm", "--config", str(config), "--out", str(out)])
    scripted(PipelinePlayer())
    assert run_llm_synthesize(args) == 0
    env = load_environment(out)
    assert len(env.items) == 2
    printed = capsys.readouterr().out
    assert "Tokens and estimated cost per stage" in printed and "answers" in printed
    assert "$0.40 per user" in printed
    report = json.loads((tmp_path / "env.report.json").read_text())
    assert [u["status"] for u in report["users"]] == ["included", "included"]
    assert (tmp_path / "env.work" / report["work_key"] / "report.json").is_file()

    # Rerunning resumes everything from the work dir: no LLM call at all.
    again = PipelinePlayer()
    scripted(again)
    assert run_llm_synthesize(args) == 0
    assert sum(again.counts.values()) == 0
    assert "resumed (no new calls)" in capsys.readouterr().out


def test_all_users_excluded_writes_nothing_and_fails(tmp_path: Path, scripted, capsys) -> None:
    config = tmp_path / "gen.toml"
    config.write_text(CONFIG_TOML)
    out = tmp_path / "env.json"
    args = offline_like_parser().parse_args(
        ["--llm", "--config", str(config), "--out", str(out), "--users", "1"]
    )
    scripted(PipelinePlayer({"match": wrong_match}))
    with pytest.raises(LLMOutputError) as raised:
        run_llm_synthesize(args)
    assert raised.value.exit_code == EXIT_LLM_FAILURE  # the model's failure, not a toolkit bug
    message = str(raised.value)
    assert "no user passed validation: all 1 of 1 user(s) were excluded" in message
    assert f"nothing written to {out}" in message and "env.report.json" in message
    assert not out.exists()
    printed = capsys.readouterr().out
    assert "1 user(s) excluded" in printed and "stage answers" in printed


def test_all_users_excluded_is_a_one_line_error_with_the_llm_exit_code(
    tmp_path: Path, scripted, capsys
) -> None:
    """Through the `evolve` command: one `evolve: error:` line and exit 3, never exit 1."""
    config = tmp_path / "gen.toml"
    config.write_text(CONFIG_TOML)
    out = tmp_path / "env.json"
    scripted(PipelinePlayer({"match": wrong_match}))
    argv = ["env", "synthesize", "--llm", "--config", str(config), "--out", str(out)]
    assert main([*argv, "--users", "1"]) == EXIT_LLM_FAILURE
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert err_lines[-1].startswith("evolve: error: no user passed validation")
    assert "bug" not in err_lines[-1] and "Traceback" not in "\n".join(err_lines)
    assert not out.exists()


def test_out_is_required(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_llm_synthesize_arguments(parser)
    with pytest.raises(ConfigError, match="--out is required"):
        run_llm_synthesize(parser.parse_args(["--llm"]))
