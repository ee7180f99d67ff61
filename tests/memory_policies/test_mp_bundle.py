"""save -> load rebuilds the same policy; bundles hold no key, URL or pickle."""

from __future__ import annotations

import json
from pathlib import Path

import dspy
import pytest
from mp_helpers import CountingEmbedder, agent, agent_context, section

import memory_policies
from memory_policies import BUNDLE_FILE, PolicyError, build_policy

ALL_KINDS = ["native", "in_context", "in_context_quotes", "external", "raw_rag"]


def _ops(call):
    return [{"action": "add", "id": 0, "text": section(call.user, "messages").splitlines()[0]}]


def _updates(call):
    return [{"label": "last", "value": section(call.user, "messages").splitlines()[0]}]


def _mutated(kind: str):
    policy = build_policy(kind, embedder=CountingEmbedder())
    if kind != "native":
        policy = policy.with_parameters(update_every=1, short_term_len=1)
    updates = {"use": "Answer like a pirate who remembers everything."}
    if kind in ("in_context", "in_context_quotes"):
        updates["write.types_to_remember"] = "1. Only food preferences."
    return policy.with_components(updates)


def _run(policy) -> list:
    lm = agent(updates=_updates, operations=_ops, choice=1)
    state = policy.initial_state()
    replies = []
    with agent_context(lm):
        for text in ("[Current Time: 2024-05-01 08:00]\nI love ramen", "any tips?", "thanks"):
            reply, state = policy.respond(state, text)
            replies.append(reply)
        replies.append(policy.answer(state, "pick", ["x", "y"]).model_dump())
    return [replies, state.model_dump(), [(c.system, c.user) for c in lm.calls]]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_save_load_gives_identical_policy(tmp_path, kind: str) -> None:
    policy = _mutated(kind)
    path = policy.save(tmp_path / "bundle", provenance={"parent": "cand-1", "experiment": "e1"})
    assert path == tmp_path / "bundle" / BUNDLE_FILE

    embedder = CountingEmbedder()
    loaded = memory_policies.load(tmp_path / "bundle", embedder=embedder)
    assert type(loaded) is type(policy)
    assert loaded.components() == policy.components()
    assert loaded.parameters() == policy.parameters()
    assert loaded.dump_state() == policy.dump_state()
    # Same prompts, same replies, same memory under the same scripted LM.
    assert _run(loaded) == _run(policy)

    bundle = json.loads(path.read_text())
    assert bundle["kind"] == kind
    assert bundle["provenance"] == {"parent": "cand-1", "experiment": "e1"}
    embeds = kind in ("external", "raw_rag", "in_context_quotes")
    assert bundle["embedder"] == ("hashing-64" if embeds else None)
    # Loading by file path and through the registry gives the same policy.
    assert memory_policies.load(path).components() == policy.components()
    assert build_policy(str(tmp_path / "bundle")).components() == policy.components()


def test_bundle_holds_no_key_or_url(tmp_path) -> None:
    policy = build_policy("in_context")
    # Even an LM attached to a predictor (by a careless caller) is not written.
    fake_key = "-".join(["fake", "SECRET", "123"])  # built, so no key-like literal is committed
    policy.use.lm = dspy.LM(
        "openai/some-model", api_key=fake_key, api_base="https://example.invalid/v1"
    )
    path = policy.save(tmp_path)
    text = path.read_text()
    assert fake_key not in text
    assert "example.invalid" not in text
    assert "://" not in text
    assert json.loads(text)["dspy_state"]["use"]["lm"] is None
    assert [p.name for p in tmp_path.iterdir()] == [BUNDLE_FILE]  # no pickles beside it


@pytest.mark.parametrize(
    ("provenance", "match"),
    [
        ({"api_key": "abc"}, "credential or endpoint"),
        ({"notes": {"base_url": "x"}}, "credential or endpoint"),
        ({"experiment": "see https://tracker.example/run/1"}, "URL"),
        ({"parent": object()}, "JSON-serializable"),
    ],
)
def test_provenance_cannot_smuggle_secrets(tmp_path, provenance, match) -> None:
    with pytest.raises(PolicyError, match=match):
        build_policy("native").save(tmp_path, provenance=provenance)
    assert not (tmp_path / BUNDLE_FILE).exists()


def test_hand_edited_components_take_effect(tmp_path) -> None:
    path = build_policy("in_context").save(tmp_path)
    bundle = json.loads(path.read_text())
    bundle["components"]["write.types_to_remember"] = "1. Pets only."
    path.write_text(json.dumps(bundle))
    loaded = memory_policies.load(tmp_path)
    assert loaded.components()["write.types_to_remember"] == "1. Pets only."
    assert loaded.write.signature.instructions.endswith(
        "Types of Information to Remember:\n1. Pets only."
    )


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda b: b.update(format="other"), "not a memory-policy bundle"),
        (lambda b: b.update(format_version=99), "upgrade memory_policies"),
        (lambda b: b.update(kind="nope"), "unknown policy kind 'nope'"),
        (lambda b: b["parameters"].update(bogus=1), "unknown parameter"),
        (lambda b: b.pop("dspy_state"), "lacks field"),
    ],
)
def test_broken_bundles_are_refused(tmp_path, edit, match) -> None:
    path = build_policy("in_context").save(tmp_path)
    bundle = json.loads(path.read_text())
    edit(bundle)
    path.write_text(json.dumps(bundle))
    with pytest.raises(PolicyError, match=match):
        memory_policies.load(tmp_path)


def test_missing_bundle_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(PolicyError, match="no policy bundle"):
        memory_policies.load(tmp_path / "absent")


def test_readme_usage_example_runs(tmp_path) -> None:
    readme = (Path(memory_policies.__file__).parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    build_policy("in_context").save(tmp_path / "best")
    code = code.replace('"exported/best-policy"', repr(str(tmp_path / "best")))
    code = code.replace('dspy.LM("openai/gpt-4.1-mini")', "scripted")
    scope = {"scripted": agent()}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["reply"] == "re: Any idea for dinner?"
    assert len(scope["state"].short_term) == 4
