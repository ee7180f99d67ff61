"""The mem0 adapter: scripted unit tests, then runs against the stub server (CLI subprocess
killed with SIGKILL and resumed, off-policy replay, read-only evaluation)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dspy
import pytest
from scripted_lm import ScriptedLM
from simulator.eval_helpers import make_environment
from stub_server import StubServer

import memory_policies.mem0_system as mem0_system
from evolve.cli import main
from evolve.simulator.environment import save_environment
from evolve.simulator.run_dir import RunLayout
from memory_policies import HashingEmbedder, Mem0Policy, Message, PolicyError, build_policy

ROOT = Path(__file__).resolve().parents[2]

needs_mem0 = pytest.mark.skipif(
    mem0_system.mem0_missing() is not None,
    reason="mem0ai / qdrant-client are not installed (pip install 'amemgym-evolve[mem0]'; the "
    "test extra pulls them in)",
)


def _messages(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=role, content=content) for role, content in pairs]


def _is_mem0_extraction(call) -> bool:
    return "Memory Extractor" in call.system


def _extracting_agent(facts: list[str] | None, *, unusable: bool = False):
    """mem0's extraction gets `facts` (or an unusable reply); DSPy predictors get choice 1."""

    def respond(call) -> dict[str, Any] | str:
        if _is_mem0_extraction(call):
            if unusable:
                return "I could not find anything to remember."
            return {"memory": [{"text": fact} for fact in facts or []]}
        return {"choice": 1, "reply": "Noted."}

    return ScriptedLM(respond, model="agent")


def assert_same_memory(restored: dict, original: dict) -> None:
    """Equal snapshots, except that Qdrant renormalizes restored vectors (last float bits)."""
    assert {k: v for k, v in restored.items() if k != "memories"} == {
        k: v for k, v in original.items() if k != "memories"
    }
    assert [(p["id"], p["payload"]) for p in restored["memories"]] == [
        (p["id"], p["payload"]) for p in original["memories"]
    ]
    for mine, theirs in zip(restored["memories"], original["memories"], strict=True):
        assert mem0_system._decode_vector(mine["vector"]) == pytest.approx(
            mem0_system._decode_vector(theirs["vector"]), abs=1e-6
        )


# ----- without mem0 ---------------------------------------------------------------------------


def test_without_the_extra_a_one_line_error_says_what_to_install(monkeypatch, tmp_path, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "mem0" else real_find_spec(name, *args),
    )
    with pytest.raises(
        PolicyError, match=r"needs the 'mem0ai' package: pip install 'amemgym-evolve\[mem0\]'"
    ):
        build_policy("mem0")
    argv = ["eval", "--preset", "tiny", "--users", "1", "--policy", "mem0:infer=false"]
    assert main([*argv, "--out", str(tmp_path), "--no-upper-bound"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "amemgym-evolve[mem0]" in error


# ----- scripted ---------------------------------------------------------------------------------


@needs_mem0
def test_infer_false_stores_messages_verbatim_and_snapshots_round_trip():
    policy = build_policy(
        "mem0:infer=false,update_every=2,short_term_len=0", embedder=HashingEmbedder()
    )
    assert policy.parameters() == {
        "update_every": 2,
        "short_term_len": 0,
        "top_k": 8,
        "infer": False,
    }
    assert policy.components() == {}
    state = policy.observe(
        policy.initial_state(),
        _messages(
            ("user", "[Current Time: 2024-01-05]\nI eat vegan food here in Paris."),
            ("assistant", "Noted, vegan it is."),
        ),
    )
    memories = sorted(p["payload"]["data"] for p in state.snapshot["memories"])
    assert memories == [
        "Noted, vegan it is.",
        "[Current Time: 2024-01-05]\nI eat vegan food here in Paris.",
    ]
    assert all(p["payload"]["time"] == "2024-01-05" for p in state.snapshot["memories"])

    fresh = mem0_system.Mem0System(infer=False, embedder=HashingEmbedder(), dimensions=256)
    try:
        fresh.restore(state.snapshot)
        assert_same_memory(fresh.snapshot(), state.snapshot)
        found = fresh.search("what food do I eat", 5)
        assert "[Current Time: 2024-01-05]\nI eat vegan food here in Paris." in found
    finally:
        fresh.close()
    # Nothing that could reach an endpoint is persisted with the memory.
    text = json.dumps(state.model_dump(mode="json"))
    assert "http" not in text and "api_key" not in text
    assert mem0_system._UNUSED_CLIENT_KEY not in text


@needs_mem0
def test_infer_true_extracts_facts_with_the_ambient_lm_and_answers_from_them():
    policy = build_policy("mem0:update_every=2,short_term_len=0", embedder=HashingEmbedder())
    agent = _extracting_agent(["User follows a keto diet"])
    with dspy.context(lm=agent, adapter=dspy.JSONAdapter()):
        state = policy.observe(
            policy.initial_state(),
            _messages(
                ("user", "[Current Time: 2024-03-02]\nI switched to keto."), ("assistant", "Ok.")
            ),
        )
        answer = policy.answer(state, "Which diet do I follow?", options=["vegan", "keto"])
    assert [c for c in agent.calls if _is_mem0_extraction(c)], "mem0 made no call to the agent LM"
    assert [p["payload"]["data"] for p in state.snapshot["memories"]] == [
        "User follows a keto diet"
    ]
    assert answer.retrieved == ["[2024-03-02] User follows a keto diet"]
    choose = [c for c in agent.calls if not _is_mem0_extraction(c)][-1]
    assert "User follows a keto diet" in choose.user  # the memory reached the answering prompt
    assert state.parse_failures == {}


@needs_mem0
def test_an_unusable_extraction_reply_counts_as_a_write_parse_failure():
    policy = build_policy("mem0:update_every=2,short_term_len=0", embedder=HashingEmbedder())
    with dspy.context(lm=_extracting_agent(None, unusable=True), adapter=dspy.JSONAdapter()):
        state = policy.observe(
            policy.initial_state(), _messages(("user", "I moved to Oslo."), ("assistant", "Ok."))
        )
    assert state.parse_failures == {"write": 1}
    assert state.snapshot["memories"] == []


@needs_mem0
def test_infer_true_without_an_lm_is_a_clear_error():
    policy = build_policy("mem0:update_every=2,short_term_len=0", embedder=HashingEmbedder())
    with dspy.context(lm=None), pytest.raises(PolicyError, match="no DSPy LM is configured"):
        policy.observe(policy.initial_state(), _messages(("user", "hi"), ("assistant", "hello")))


@needs_mem0
def test_a_snapshot_from_another_embedder_is_refused():
    policy = build_policy(
        "mem0:infer=false,update_every=2,short_term_len=0", embedder=HashingEmbedder()
    )
    state = policy.observe(
        policy.initial_state(), _messages(("user", "hi"), ("assistant", "hello"))
    )
    other = Mem0Policy(infer=False, embedder=HashingEmbedder(dim=32))
    with pytest.raises(PolicyError, match="embedded with 'hashing-256'.*resume with the same"):
        other.answer(other.state_from_json(state.model_dump_json()), "hi?", options=["a"])


# ----- against the stub server --------------------------------------------------------------


@pytest.fixture(scope="module")
def stub():
    with StubServer(latency=0.01) as server:
        yield server


@pytest.fixture
def env_file(tmp_path) -> Path:
    path = tmp_path / "env.json"
    save_environment(make_environment(users=1, periods=3), path)
    return path


def _eval_argv(env_file: Path, stub: StubServer, out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--env", str(env_file), "--policy", "mem0:infer=false,short_term_len=2",
        "--out", str(out), "--model", "stub", "--base-url", stub.base_url,
        "--no-upper-bound", "--concurrency", "1", "--rounds-init", "2",
        "--protocol", "evolve",  # the stub server fills DSPy's JSON fields (evolve prompts)
        *extra,
    ]  # fmt: skip


def _unit_files(run_dir: Path) -> dict[str, tuple[int, str]]:
    """Each finished user-period's result file: (mtime, content)."""
    return {
        str(path.relative_to(run_dir)): (path.stat().st_mtime_ns, path.read_text())
        for path in sorted(run_dir.glob("users/*/period_*/result.json"))
    }


@needs_mem0
def test_a_killed_mem0_run_resumes_without_repeating_finished_periods(tmp_path, stub, env_file):
    out = tmp_path / "out"
    run_dir = out / "mem0-infer_false_short_term_len_2"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "EVOLVE_CACHE_DIR": str(tmp_path / "cache"),
        # Its own response cache: one inherited from the test process may already hold every
        # reply of this deterministic stub, and the rerun would then call nothing.
        "DSPY_CACHEDIR": str(tmp_path / "cache" / "dspy"),
    }
    command = [sys.executable, "-m", "evolve.cli", *_eval_argv(env_file, stub, out)]
    # Output to a file: an unread pipe fills up with progress bars and blocks the child.
    log = tmp_path / "first.log"
    with log.open("w") as sink:
        first = subprocess.Popen(command, env=environment, cwd=tmp_path, stdout=sink, stderr=sink)
    deadline = time.monotonic() + 300
    while not _unit_files(run_dir) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    finished = _unit_files(run_dir)
    assert first.returncode == -signal.SIGKILL, log.read_text()[-2000:]
    assert 1 <= len(finished) < 3, f"kill came too late to test resuming: {sorted(finished)}"

    requests_before = stub.stats()["chat_requests"]
    second = subprocess.run(
        command, env=environment, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-2000:]
    after = _unit_files(run_dir)
    assert len(after) == 3
    for name, (mtime, content) in finished.items():
        assert after[name] == (mtime, content), f"{name} was recomputed"
    assert stub.stats()["chat_requests"] > requests_before  # the rest was really computed

    # The last checkpoint still holds what period 0 stored: memory survived the kill.
    layout = RunLayout(run_dir)
    last = json.loads(layout.load_checkpoint("user-0", 2))
    stored = [p["payload"]["data"] for p in last["snapshot"]["memories"]]
    assert any("I eat vegan here in Paris" in text for text in stored)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["policy"] == {
        "kind": "mem0",
        "variant": "evolve",
        "parameters": {"update_every": 2, "short_term_len": 2, "top_k": 8, "infer": False},
    }


@needs_mem0
def test_mem0_replays_off_policy_transcripts_and_evaluation_is_read_only(tmp_path, stub, env_file):
    on, off = tmp_path / "on", tmp_path / "off"
    assert main(_eval_argv(env_file, stub, on)) == 0
    name = "mem0-infer_false_short_term_len_2"
    assert main(_eval_argv(env_file, stub, off, "--off-policy", str(on / name))) == 0

    on_layout, off_layout = RunLayout(on / name), RunLayout(off / name)
    for period in range(3):
        replayed = off_layout.load_period_result("user-0", period)
        assert replayed.off_policy and all(s.replayed for s in replayed.sessions)
        assert not replayed.evaluation_mutated_state
        # Replaying the recorded messages stores the same messages (infer=false: verbatim).
        on_state = json.loads(on_layout.load_checkpoint("user-0", period))
        off_state = json.loads(off_layout.load_checkpoint("user-0", period))
        assert sorted(p["payload"]["data"] for p in on_state["snapshot"]["memories"]) == sorted(
            p["payload"]["data"] for p in off_state["snapshot"]["memories"]
        )

    # Answering every question leaves mem0's store as it was: the live system that served
    # the answers is snapshotted again and compared with the checkpoint.
    policy = build_policy("mem0:infer=false,short_term_len=2")
    state = policy.state_from_json(on_layout.load_checkpoint("user-0", 2))
    checkpoint = json.dumps(state.snapshot, sort_keys=True)
    before = json.dumps(policy.live_snapshot(state), sort_keys=True)
    lm = dspy.LM("openai/stub", api_base=stub.base_url, api_key="unused", cache=False)
    env = make_environment(users=1, periods=3)
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        for qa in env.items[0].qas:
            answer = policy.answer(state, qa.query, options=[c.answer for c in qa.answer_choices])
            assert answer.retrieved
    assert json.dumps(policy.live_snapshot(state), sort_keys=True) == before
    assert json.dumps(state.snapshot, sort_keys=True) == checkpoint


@needs_mem0
def test_mem0_extraction_calls_go_to_the_agent_endpoint_and_are_counted(tmp_path, stub):
    env_file = tmp_path / "env.json"
    save_environment(make_environment(users=1, periods=2), env_file)

    def run(spec: str, out: Path) -> tuple[int, int]:
        before = stub.stats()["chat_requests"]
        argv = _eval_argv(env_file, stub, out)
        argv[argv.index("--policy") + 1] = spec
        assert main([*argv, "--no-llm-cache"]) == 0
        report = json.loads(next(out.glob("*/report.json")).read_text())
        counted = sum(role["calls"] for role in report["usage"]["roles"].values())
        return counted, stub.stats()["chat_requests"] - before

    counted_rag, served_rag = run("mem0:infer=false,short_term_len=2", tmp_path / "rag")
    counted_awe, served_awe = run("mem0:short_term_len=2", tmp_path / "awe")
    assert (counted_rag, counted_awe) == (served_rag, served_awe)  # nothing bypasses the ledger
    assert counted_awe > counted_rag  # infer=true adds mem0's extraction calls


@needs_mem0
def test_an_endpoint_failure_inside_mem0_surfaces_as_the_lm_error(stub):
    from dspy.utils.exceptions import LMError

    policy = build_policy("mem0:update_every=2,short_term_len=0", embedder=HashingEmbedder())
    lm = dspy.LM(
        "openai/stub", api_base=stub.base_url, api_key="unused", cache=False, num_retries=0
    )
    stub.set_fault("http500", count=1)
    try:
        with dspy.context(lm=lm), pytest.raises(LMError):
            policy.observe(
                policy.initial_state(), _messages(("user", "hi"), ("assistant", "hello"))
            )
    finally:
        stub.set_fault("none")


@needs_mem0
def test_importing_mem0_keeps_the_process_warning_filters(tmp_path):
    # A fresh interpreter: mem0 turns every DeprecationWarning on at its first import.
    script = (
        "import warnings\n"
        "from memory_policies.mem0_system import import_mem0\n"
        "before = list(warnings.filters)\n"
        "import_mem0()\n"
        "assert list(warnings.filters) == before, 'mem0 changed the warning filters'\n"
    )
    environ = os.environ | {"MEM0_DIR": str(tmp_path), "PYTHONPATH": str(Path.cwd())}
    result = subprocess.run(
        [sys.executable, "-c", script], env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
