"""The memory-system protocol, run through the BM25 example adapter of docs/extending.md."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn
from simulator.eval_helpers import latest_mention_choice, make_environment, output_fields, sections

import memory_policies.registry as registry
from evolve.core.errors import ConfigError
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from memory_policies import (
    MemorySystem,
    MemorySystemPolicy,
    Message,
    PolicyError,
    build_policy,
    load,
    parse_spec,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bm25_memory.py"

pytest.importorskip("rank_bm25", reason="the BM25 example needs rank-bm25 (in the test extra)")


def _documented_blocks() -> list[str]:
    """The Python blocks of docs/extending.md."""
    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", page, re.S)


@pytest.fixture(scope="module")
def bm25_module():
    spec = importlib.util.spec_from_file_location("bm25_memory", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bm25_memory"] = module
    spec.loader.exec_module(module)
    yield module
    registry.POLICY_KINDS.pop("bm25", None)
    sys.modules.pop("bm25_memory", None)


def test_readme_shows_exactly_the_tested_example():
    assert EXAMPLE.read_text(encoding="utf-8") in _documented_blocks()


def memory_aware_agent(call) -> dict[str, Any]:
    """Answers from what the policy shows it: the retrieved memory, then the conversation."""
    fields = output_fields(call.system)
    inputs = sections(call.user)
    if "choice" in fields:
        seen = inputs.get("memory", "") + "\n" + inputs.get("conversation", "")
        return {"choice": latest_mention_choice(seen, inputs["options"])}
    return {name: "Noted, thanks." for name in fields}


def simulator(call) -> dict[str, Any]:
    return user_turn("Thanks, that helps.")


def test_bm25_example_is_evaluated_like_any_policy_on_and_off_policy(tmp_path, bm25_module):
    policy = build_policy("bm25:top_k=8,update_every=2,short_term_len=0")
    assert isinstance(policy, MemorySystemPolicy)
    assert policy.components() == {}  # a baseline: nothing for an optimizer to rewrite
    agent = ScriptedLM(memory_aware_agent, model="agent")
    lms = scripted_role_lms(simulator=simulator, agent=agent)
    env = make_environment(users=2)
    config = EpisodeConfig(rounds_initial=2, rounds_update=1, concurrency=2)

    report = run_evaluation(env, policy, lms, tmp_path / "on", config)
    periods = [p for user in report.users for p in user.periods]
    assert len(periods) == 6
    assert not any(p.evaluation_mutated_state for p in periods)
    # Memory flows through the checkpoints: later periods retrieve what earlier ones stored.
    last = [p for p in periods if p.period_index == 2]
    assert all(item.retrieved for p in last for item in p.items)
    assert all("keto" in p.memory_description for p in last)
    checkpoint = json.loads(_checkpoint_text(tmp_path / "on", "user-0", 2))
    assert checkpoint["kind"] == "bm25"
    assert len(checkpoint["snapshot"]["documents"]) >= 3
    # The stored memory alone answers: with every document retrieved, in time order, the
    # latest diet mentioned (keto, period 1) wins in period 2.
    diet = [i for p in last for i in p.items if i.required_info == ["diet"]]
    assert diet and all(i.correct for i in diet)

    calls = len(agent.calls)
    resumed = run_evaluation(env, policy, lms, tmp_path / "on", config)
    assert len(agent.calls) == calls  # every finished period is loaded, none replayed
    assert resumed.summary.accuracy == report.summary.accuracy

    replay = run_evaluation(
        env, policy, lms, tmp_path / "off", config, off_policy_dir=tmp_path / "on"
    )
    replayed = [p for user in replay.users for p in user.periods]
    assert all(p.off_policy for p in replayed)
    assert [p.memory_description for p in replayed] == [p.memory_description for p in periods]


def _checkpoint_text(run_dir: Path, user: str, period: int) -> str:
    from evolve.simulator.run_dir import RunLayout

    text = RunLayout(run_dir).load_checkpoint(user, period)
    assert text is not None
    return text


def test_bm25_bundle_round_trip_and_switch_free_parameters(tmp_path, bm25_module):
    policy = build_policy({"kind": "bm25", "top_k": 3})
    assert policy.parameters() == {"update_every": 2, "short_term_len": 4, "top_k": 3}
    policy.save(tmp_path / "bundle")
    again = load(tmp_path / "bundle")
    assert type(again) is type(policy) and again.parameters() == policy.parameters()
    assert policy.with_parameters(top_k=1).parameters()["top_k"] == 1
    with pytest.raises(PolicyError, match="unknown parameter"):
        build_policy("bm25:infer=false")


class _Counter(MemorySystem):
    """A system whose search writes: the pool must catch it, not let the memory drift."""

    def __init__(self, search_writes: bool = False) -> None:
        self.items: list[str] = []
        self.search_writes = search_writes

    def add(self, messages: list[Message], at: str | None) -> None:
        self.items.extend(m.content for m in messages)

    def search(self, query: str, k: int) -> list[str]:
        if self.search_writes:
            self.items.append(f"searched {query}")
        return self.items[-k:]

    def snapshot(self) -> dict:
        return {"items": list(self.items)}

    def restore(self, snapshot: dict) -> None:
        self.items = list(snapshot["items"])


class _SwitchPolicy(MemorySystemPolicy):
    kind = "counter_test"
    option_defaults = {"search_writes": False}

    def open_system(self) -> MemorySystem:
        return _Counter(search_writes=bool(self.options["search_writes"]))


def _scripted_answer(policy: MemorySystemPolicy, state) -> Any:
    import dspy

    lm = ScriptedLM(lambda call: {"choice": 1}, model="agent")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return policy.answer(state, "Which one?", options=["a", "b"])


def test_a_search_that_changes_memory_is_an_error():
    policy = _SwitchPolicy(update_every=1, short_term_len=0)
    state = policy.observe(policy.initial_state(), [Message(role="user", content="hello")])
    assert state.snapshot == {"items": ["hello"]}
    answer = _scripted_answer(policy, state)
    assert answer.choice == 1 and answer.retrieved == ["hello"]
    assert policy.live_snapshot(state) == state.snapshot

    writing = policy.with_parameters(search_writes=True)
    assert writing.parameters()["search_writes"] is True
    with pytest.raises(PolicyError, match="search\\(\\) must be read-only"):
        _scripted_answer(writing, state)


def test_switches_are_typed_and_recorded_in_parameters():
    policy = _SwitchPolicy()
    assert policy.parameters() == {
        "update_every": 2,
        "short_term_len": 4,
        "top_k": 5,
        "search_writes": False,
    }
    with pytest.raises(PolicyError, match="must be a bool .*search_writes=false"):
        _SwitchPolicy(search_writes=1)
    with pytest.raises(PolicyError, match="unknown parameter.*switches: search_writes"):
        _SwitchPolicy(infer=True)


def test_spec_switches_parse_as_booleans():
    assert parse_spec("mem0:top_k=30,infer=true") == ("mem0", {"top_k": 30, "infer": True})
    assert parse_spec("mem0:infer=False") == ("mem0", {"infer": False})
    for value in ("yes", "maybe"):
        with pytest.raises(
            PolicyError, match=f"switch 'infer' .* takes true or false, got '{value}'"
        ):
            parse_spec(f"mem0:infer={value}")
    # A numeric parameter given a word is still "an integer" problem.
    with pytest.raises(PolicyError, match="'top_k' .* must be an integer, got 'maybe'"):
        parse_spec("mem0:top_k=maybe")
    # A switch value where a number is expected is still refused by the policy.
    with pytest.raises(PolicyError, match="must be an integer"):
        build_policy("in_context:update_every=true")


# Builds one policy in a fresh process: plugins are imported once per process.
PLUGIN_CHILD = """
import sys
from memory_policies import PolicyError, build_policy
try:
    print(build_policy(sys.argv[1]).kind)
except PolicyError as error:
    print(f"PolicyError: {error}")
"""


def build_in_a_fresh_process(kind: str, plugins: str, directory: Path) -> str:
    """What `build_policy(kind)` gives in a new process whose environment names `plugins`."""
    env = {
        **os.environ,
        registry.PLUGINS_ENV: plugins,
        "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHILD, kind],
        env=env,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_plugin_modules_named_in_the_environment_are_imported(tmp_path):
    (tmp_path / "plugin_bm25_copy.py").write_text(
        EXAMPLE.read_text(encoding="utf-8").replace('kind = "bm25"', 'kind = "bm25_plugin"')
    )
    assert build_in_a_fresh_process("bm25_plugin", "plugin_bm25_copy", tmp_path) == "bm25_plugin"
    # Without the plugin the kind is unknown; a plugin that cannot be imported is named.
    unknown = build_in_a_fresh_process("bm25_plugin", "", tmp_path)
    assert unknown.startswith("PolicyError: unknown policy kind 'bm25_plugin'")
    missing = build_in_a_fresh_process("native", "no_such_plugin_module", tmp_path)
    assert "cannot import policy plugin module 'no_such_plugin" in missing


def test_evolve_run_refuses_a_memory_system(tmp_path, bm25_module):
    from evolve.spec.config import load_spec, resolve

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(
        'name = "x"\n[environment]\npreset = "tiny"\nusers = 2\ntrain_users = 1\n'
        'heldout_users = 1\n[policy]\nkind = "bm25"\n'
    )
    with pytest.raises(ConfigError, match="'bm25' is a memory system") as caught:
        resolve(load_spec(spec_file))
    assert "\n" not in str(caught.value)


class _NoisyCounter(_Counter):
    """Rewrites its representation on every read (as a vector store renormalizing floats
    may) without changing what it remembers: its fingerprint says so."""

    def search(self, query: str, k: int) -> list[str]:
        self.reads = getattr(self, "reads", 0) + 1
        return super().search(query, k)

    def snapshot(self) -> dict:
        return {"items": list(self.items), "reads": getattr(self, "reads", 0)}

    def fingerprint(self) -> str:
        return "|".join(self.items)


class _NoisyPolicy(MemorySystemPolicy):
    kind = "noisy_test"

    def open_system(self) -> MemorySystem:
        return _NoisyCounter()


def test_representation_noise_on_reads_is_not_a_memory_change():
    policy = _NoisyPolicy(update_every=1, short_term_len=0)
    state = policy.observe(policy.initial_state(), [Message(role="user", content="hello")])
    for _ in range(3):  # the same pooled system serves every read
        assert _scripted_answer(policy, state).retrieved == ["hello"]
