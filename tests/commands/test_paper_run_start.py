"""What a paper run says at its start (the completion limits and the kept rows of the
deviation table, before any LLM call) and records; and the per-period chain's headline: the
paper's number is the reference's formula under paper, our memory score under evolve."""

from __future__ import annotations

import contextlib
import json

import pytest
from optimize import chain_world
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, make_environment, simulator_responder

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.core.protocol import EVOLVE, PAPER
from evolve.optimize.report import chain_headline
from evolve.simulator.environment import save_environment
from evolve.simulator.metrics import MetricSummary
from evolve.spec.paper_deviations import START_HEADING, kept_deviations, load_deviations
from memory_policies.embed import HashingEmbedder


def kept_lines(stderr: str) -> list[str]:
    """The indented lines right after the heading."""
    lines = stderr.splitlines()
    block = []
    for line in lines[lines.index(START_HEADING) + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def assert_deviations_printed(stderr: str) -> None:
    assert START_HEADING in stderr
    printed = [line.split(":", 1)[0].strip() for line in kept_lines(stderr)]
    assert printed == [d.id for d in kept_deviations()]
    closed = [d.id for d in load_deviations() if d.status == "closed"]
    assert not any(f"  {name}:" in stderr for name in closed)


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_eval_prints_the_kept_deviations_under_paper_only(tmp_path, monkeypatch, capsys, protocol):
    agent = ScriptedLM(agent_responder, model="agent-model")
    simulator = ScriptedLM(simulator_responder, model="simulator-model")
    calls_at_start: list[int] = []

    @contextlib.contextmanager
    def fake_open(args, rules=None):
        yield scripted_role_lms(simulator=simulator, agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    real_print = eval_command.print_protocol_start

    def noting_print(*args, **kwargs):
        calls_at_start.append(len(agent.calls) + len(simulator.calls))
        real_print(*args, **kwargs)

    monkeypatch.setattr(eval_command, "print_protocol_start", noting_print)
    env_file = tmp_path / "env.json"
    save_environment(make_environment(users=1), env_file)
    argv = ["eval", "--env", str(env_file), "--policy", "native:variant=evolve"]
    argv += ["--out", str(tmp_path / "out"), "--no-upper-bound", "--no-progress"]
    assert main([*argv, "--protocol", protocol]) == 0
    stderr = capsys.readouterr().err
    assert calls_at_start == [0]  # before the first LLM call
    # Which model serves which role, first (the eval calls the simulator and the agent); under
    # paper a weaker simulated user shows here.
    assert stderr.startswith(
        f"protocol {protocol}: models simulator simulator-model (endpoint); agent agent-model "
        "(endpoint)\n"
    )
    if protocol == "paper":
        assert_deviations_printed(stderr)
        assert "protocol paper: max_tokens simulator 1000, agent 1000" in stderr
    else:
        assert START_HEADING not in stderr and "max_tokens" not in stderr
    # The limits used are recorded with the results.
    (report_file,) = (tmp_path / "out").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert report["max_tokens"] == {"simulator": 1000, "agent": 1000}


def test_run_on_a_paper_spec_prints_them_and_the_references_number(tmp_path, monkeypatch, capsys):
    spec = chain_world.write_world(tmp_path)
    opened = []

    @contextlib.contextmanager
    def fake_open(config):
        opened.append(config)
        yield chain_world.World().lms

    monkeypatch.setattr("evolve.commands.run.open_role_lms", fake_open)
    argv = ["run", str(spec), "--runs-dir", str(tmp_path / "runs"), "--no-tracking"]
    assert main([*argv, "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert_deviations_printed(captured.err)
    # The spec names no endpoint: the embedded server gets the reference's limit, at most a
    # slot's context.
    assert opened[0].embedded.max_tokens == min(8192, opened[0].embedded.ctx_per_slot)
    result = json.loads((tmp_path / "runs" / "chains" / "result.json").read_text())
    assert result["protocol"] == "paper"
    assert result["max_tokens"] == {"simulator": 1000, "agent": 1000, "reflector": 1000}
    original = result["chain_summary"]["memory_score_original"]
    shown = "-" if original is None else f"{original:.3f}"
    assert f"the paper's number, the reference's formula): memory score {shown}" in captured.out


def test_the_chain_headline_is_the_protocols_memory_score():
    summary = MetricSummary(
        accuracy=0.5,
        accuracy_with_random_fallback=0.6,
        memory_score=0.125,
        memory_score_original=0.75,
    )
    paper = chain_headline(summary, PAPER)
    assert paper.startswith(
        "evolving train run (the paper's number, the reference's formula): memory score 0.750"
    )
    assert "accuracy with random fallback 0.600" in paper and "memory score 0.125" in paper
    evolve = chain_headline(summary, EVOLVE)
    assert evolve.startswith("evolving train run: memory score 0.125")
    assert "paper" not in evolve and "0.750" not in evolve


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
def test_tune_on_a_paper_spec_prints_them(tmp_path, monkeypatch, capsys, protocol):
    from optimize.evolve_helpers import World
    from tuning.tune_helpers import PAPER_GRID, write_tune_spec

    @contextlib.contextmanager
    def scripted(config):
        yield World().lms

    monkeypatch.setattr("evolve.commands.tune.open_role_lms", scripted)
    spec = write_tune_spec(
        tmp_path,
        f'trials = 1\nsampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}',
        body=f'protocol = "{protocol}"',
        policy='kind = "in_context"\nvariant = "evolve"',
    )
    argv = ["tune", str(spec), "--runs-dir", str(tmp_path / "runs"), "--no-tracking"]
    assert main([*argv, "--no-progress"]) == 0
    stderr = capsys.readouterr().err
    if protocol == "paper":
        assert_deviations_printed(stderr)
    else:
        assert START_HEADING not in stderr


@pytest.mark.parametrize(
    ("protocol", "embedder", "refused"),
    [("paper", None, True), ("paper", "minilm", False), ("evolve", None, False)],
)
def test_a_paper_run_of_an_embedding_policy_must_name_its_embedder(
    tmp_path, monkeypatch, capsys, protocol, embedder, refused
):
    agent = ScriptedLM(agent_responder, model="agent-model")
    simulator = ScriptedLM(simulator_responder, model="simulator-model")

    @contextlib.contextmanager
    def fake_open(args, rules=None):
        yield scripted_role_lms(simulator=simulator, agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    monkeypatch.delenv("MEMORY_POLICIES_EMBEDDER", raising=False)
    if embedder is not None:
        monkeypatch.setenv("MEMORY_POLICIES_EMBEDDER", embedder)
    # A hashing embedder stands in for the model behind the name (no model files needed).
    monkeypatch.setattr("memory_policies.embed.default_embedder", lambda: HashingEmbedder())
    env_file = tmp_path / "env.json"
    save_environment(make_environment(users=1), env_file)
    argv = ["eval", "--env", str(env_file), "--policy", "raw_rag", "--protocol", protocol]
    argv += ["--out", str(tmp_path / "out"), "--no-upper-bound", "--no-progress"]
    code = main(argv)
    stderr = capsys.readouterr().err
    if refused:
        assert code != 0 and not agent.calls and not simulator.calls
        assert "MEMORY_POLICIES_EMBEDDER is unset" in stderr
    else:
        assert code == 0
        if protocol == "paper":
            assert "; embedder all-MiniLM-L6-v2" in stderr
