"""The paper's per-user chains (schedule = "per_period", protocol = "paper") with scripted LMs.

Two train users who tell the same story but sign their messages differently (Alice, Bob).
The scripted agent also remembers the signature, so each user's memory, and hence the
paper's `complete` feedback, differs; the scripted reflector adds a token naming the
signature it sees in the memory. This shows that each user's chain evolves from that user's
feedback only, that the runner plays each user-period with that user's policy, that the
reflector is the agent's own model (temperature 0), and that a run killed with SIGKILL
resumes without replaying anything finished.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from optimize.chain_world import SIGNATURES, World, run, token, write_world
from optimize.evolve_helpers import output_fields, reflector_inputs, sections

import memory_policies
from evolve.feedback import BLIND_FEEDBACK
from evolve.optimize import CandidateStatus
from evolve.spec.config import load_spec

TESTS_DIR = Path(__file__).resolve().parents[1]


def reflections(world: World) -> list[Any]:
    return [c for c in world.agent.calls if reflector_inputs(c) is not None]


def test_each_user_evolves_its_own_chain(tmp_path):
    spec = write_world(tmp_path)
    world = World()
    result = run(tmp_path, world, spec)
    assert result.complete and result.schedule == "per_period"

    # The reflector is the agent's own model, at temperature 0, recorded in the run.
    assert world.reflector.calls == []
    assert len(reflections(world)) == 4  # 2 users x 2 period barriers
    header = json.loads((tmp_path / "runs" / "chains" / "experiment.json").read_text())
    assert header["identity"]["reflector"] == {
        "role": "agent",
        "model": "agent-model",
        "temperature": 0.0,
    }

    # Each reflection saw one user's period only: the paper's complete feedback.
    for call in reflections(world):
        feedback = reflector_inputs(call)["feedback"]
        signed = [name for name in SIGNATURES.values() if f"signature: {name}" in feedback]
        assert len(signed) == 1, feedback
        assert "The assistant chose: (A)" in feedback and "correct" not in feedback
        assert len(re.findall(r"^Period \d+:", feedback, re.M)) == 1

    ids = [r.id for r in result.candidates]
    assert ids == ["g00-c0", "g01-c0", "g01-c1", "g02-c0", "g02-c1"]
    alice, bob = result.candidate("g01-c0"), result.candidate("g01-c1")
    assert alice.user_id == "user-0" and bob.user_id == "user-1"
    assert token("Alice") in alice.components["write.types_to_remember"]
    assert token("Bob") not in alice.components["write.types_to_remember"]
    assert token("Bob") in bob.components["write.types_to_remember"]
    assert alice.mutation.temperature == 0.0 and alice.mutation.feedback == "complete"
    # After period 1 nothing new is added: duplicates, each chain keeps its step.
    assert result.candidate("g02-c0").duplicate_of == "g01-c0"
    assert result.candidate("g02-c1").duplicate_of == "g01-c1"
    assert alice.train.users == ["user-0"] and alice.train.periods == [1, 2]
    assert bob.train.users == ["user-1"] and bob.train.periods == [1, 2]
    assert result.candidate("g00-c0").train.periods == [0]

    # The runner played each user-period with that user's policy in effect.
    writes = [c for c in world.agent.calls if "updates" in output_fields(c.system)]
    for call in writes:
        messages = sections(call.user).get("messages", "")
        period_zero = "2024-01-" in messages
        for name, other in (("Alice", "Bob"), ("Bob", "Alice")):
            if f"-- {name}" in messages:
                assert token(other) not in call.system
                assert (token(name) in call.system) != period_zero, (name, messages)

    # Table 3: the memory score (here the accuracy objective) of the evolving run over all
    # users and periods; no held-out users.
    assert result.chain_summary.n_user_periods == 6
    assert all(r.heldout is None for r in result.candidates)
    # Each user's final prompt as a bundle.
    root = tmp_path / "runs" / "chains" / "chain"
    index = json.loads((root / "final_policies.json").read_text())
    assert {user: entry["candidate"] for user, entry in index.items()} == {
        "user-0": "g01-c0",
        "user-1": "g01-c1",
    }
    for user, name in SIGNATURES.items():
        final = memory_policies.load(root / "final" / user)
        assert token(name) in final.components()["write.types_to_remember"]


def test_a_named_reflector_model_is_used_instead(tmp_path):
    spec = write_world(tmp_path)
    spec.write_text(
        spec.read_text() + '\n[llm.reflector]\nmodel = "other-model"\nbase_url = "http://x/v1"\n'
    )
    from evolve.optimize.loop import reflector_setup

    assert reflector_setup(load_spec(spec)) == ("reflector", 0.0)
    evolve_spec = spec.read_text().replace('protocol = "paper"', 'protocol = "evolve"')
    spec.write_text(evolve_spec.replace('feedback = "complete"', 'feedback = "diagnostic"'))
    assert reflector_setup(load_spec(spec)) == ("reflector", 0.7)


CHILD = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = [{tests!r}]
from optimize import chain_world

directory, log, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

def dying(call):
    with open(log, "a") as handle:
        handle.write("call\\n")
    if sum(1 for _ in open(log)) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return chain_world.agent(call)

chain_world.run(directory, chain_world.World(dying), directory / "chains.toml")
"""


# Killed in period 0 (no step yet), and in period 1 (after both users' first step).
@pytest.mark.parametrize(("kill_at", "steps_before_kill"), [(30, 0), (46, 2)])
def test_killed_chain_resumes_without_replaying(tmp_path, kill_at, steps_before_kill):
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = World()
    # One call at a time: the kill lands at the same point of the run every time.
    expected = run(reference_dir, reference, write_world(reference_dir, concurrency=1))
    full = len(reference.agent.calls) + len(reference.simulator.calls)
    assert kill_at < len(reference.agent.calls)

    work = tmp_path / "killed"
    work.mkdir()
    spec = write_world(work, concurrency=1)
    log = work / "calls.log"
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD.format(tests=str(TESTS_DIR)),
            str(work),
            str(log),
            str(kill_at),
        ],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR.parent), str(TESTS_DIR)])},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    persisted = persisted_calls(work / "runs" / "chains")
    steps = len(list((work / "runs" / "chains" / "candidates").glob("g0[12]-*")))
    assert steps == steps_before_kill
    upper_bound = [
        c
        for c in reference.agent.calls
        if sections(c.user).keys() & {"known_state", "current_state"}
    ]
    if any((work / "ub").rglob("*.json")):
        persisted += len(upper_bound)  # the upper-bound table was cached before the kill
    assert persisted > 0

    resumed_world = World()
    resumed = run(work, resumed_world, spec)
    # Nothing stored is replayed: the resumed run makes exactly the calls that were not
    # persisted (a unit killed while its questions were asked asks them again).
    resumed_calls = len(resumed_world.agent.calls) + len(resumed_world.simulator.calls)
    assert resumed_calls == full - persisted
    assert [(r.id, r.status, r.train_score) for r in resumed.candidates] == [
        (r.id, r.status, r.train_score) for r in expected.candidates
    ]
    assert resumed.chain_summary.accuracy == expected.chain_summary.accuracy
    # A finished run makes no call at all.
    again = World()
    run(work, again, spec)
    assert again.agent.calls == [] and again.simulator.calls == []


def persisted_calls(experiment: Path) -> int:
    """LM calls (agent and simulated user) whose results were on disk: finished
    user-periods, played sessions whose questions were cut off, and proposed steps."""
    calls = 0
    for period_dir in (experiment / "chain" / "train" / "users").glob("*/period_*"):
        if (period_dir / "result.json").exists():
            calls += json.loads((period_dir / "result.json").read_text())["usage"]["calls"]
        elif (period_dir / "transcript.json").exists() and (
            period_dir / "checkpoint.json"
        ).exists():
            calls += json.loads((period_dir / "transcript.json").read_text())["usage"]["calls"]
    for path in (experiment / "candidates").glob("*/candidate.json"):
        calls += json.loads(path.read_text()).get("reflection_calls", 0)
    return calls


def test_steps_are_candidates_with_statuses(tmp_path):
    spec = write_world(tmp_path, feedback="none")
    world = World()
    result = run(tmp_path, world, spec)
    assert reflections(world) == []
    assert [r.id for r in result.candidates] == ["g00-c0"]
    assert result.candidate("g00-c0").status == CandidateStatus.EVALUATED
    assert result.candidate("g00-c0").train.users == ["user-0", "user-1"]


@pytest.mark.parametrize("feedback", ["complete", "question_only", "diagnostic"])
def test_what_the_reflector_is_shown_per_kind(tmp_path, feedback):
    spec = write_world(tmp_path, feedback=feedback)
    world = World()
    run(tmp_path, world, spec)
    shown = [reflector_inputs(c)["feedback"] for c in reflections(world)]
    assert len(shown) == 4
    for text in shown:
        assert "Can you suggest a dinner recipe for me?" in text
        if feedback == "diagnostic":  # ours: failures with the truth
            assert "correct" in text and "cause:" in text and "memory held:" in text
            continue
        # The paper's: the memory, and no ground truth at all.
        assert "Memory the assistant had:" in text and "signature:" in text
        assert "correct" not in text and "cause" not in text
        if feedback == "complete":
            assert "(C) A keto salmon plate" in text and "The assistant chose: (A)" in text
        else:
            assert "keto salmon" not in text and "chose" not in text


def test_blind_chains_propose_without_feedback(tmp_path):
    """The blind control in the paper's chains: the same reflector step, shown nothing."""
    spec = write_world(tmp_path, feedback="blind")
    world = World()
    result = run(tmp_path, world, spec)
    shown = [reflector_inputs(c)["feedback"] for c in reflections(world)]
    assert shown == [BLIND_FEEDBACK] * 4  # 2 users x 2 period barriers
    steps = [r for r in result.candidates if r.mutation.kind == "reflective"]
    assert len(steps) == 4 and {r.mutation.feedback for r in steps} == {"blind"}


def test_the_runner_guards_the_declared_schedule(tmp_path):
    from evolve.core.errors import ResumeMismatchError
    from evolve.simulator.environment import load_environment
    from evolve.simulator.evaluation import EpisodeConfig, run_evaluation

    write_world(tmp_path)
    env = load_environment(tmp_path / "env.json")
    base = memory_policies.create_policy("in_context", {"update_every": 1, "short_term_len": 0})
    other = base.with_components({"write.types_to_remember": "1. SIGNED_BOB"})

    class Schedule:
        def __init__(self, name: str) -> None:
            self.name = name

        def policy_for(self, user_id: str, period_index: int):
            return other if user_id == "user-1" and period_index > 0 else base

        def identity(self) -> dict[str, Any]:
            return {"schedule": self.name}

    world = World()
    config = EpisodeConfig(concurrency=2)
    run_evaluation(env, base, world.lms, tmp_path / "run", config, policy_schedule=Schedule("a"))
    writes = [c for c in world.agent.calls if "updates" in output_fields(c.system)]
    scheduled = [c for c in writes if "SIGNED_BOB" in c.system]
    assert scheduled
    for call in writes:
        messages = sections(call.user)["messages"]
        if "-- Alice" in messages or "2024-01-" in messages:  # user-0, or period 0
            assert "SIGNED_BOB" not in call.system
        elif "-- Bob" in messages:
            assert "SIGNED_BOB" in call.system
    with pytest.raises(ResumeMismatchError, match="policy_schedule"):
        run_evaluation(
            env, base, world.lms, tmp_path / "run", config, policy_schedule=Schedule("b")
        )
