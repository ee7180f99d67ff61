"""The upper-bound cache: keyed by everything an answer depends on, never
poisoned by failed answers, and recomputed on request.

Unit tests drive `compute_upper_bound` with scripted LMs; the end-to-end test runs
`evolve eval` against the stub server, first replying non-JSON, then healthy under the same
model name and address.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, _generic_responder, scripted_role_lms
from stub_server import StubServer

from evolve.cli import main
from evolve.llm import EndpointConfig, RoleLMs, build_lm
from evolve.simulator.baselines import UpperBoundCacheError, compute_upper_bound
from evolve.simulator.environment import Environment, save_environment
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset

NOT_JSON = "I would rather not answer in JSON today."


def tiny_env(users: int = 1) -> Environment:
    return synthesize_environment(get_preset("tiny"), 0, users)


def variant_count(env: Environment) -> int:
    return sum(len(qa.answer_choices) for item in env.items for qa in item.qas)


def cached_entries(cache_dir: Path) -> list[dict]:
    entries = []
    for path in cache_dir.glob("upper_bound-*.json"):
        entries.extend(json.loads(path.read_text(encoding="utf-8"))["entries"].values())
    return entries


def agent_lms(reply, model: str = "agent-x", **kwargs) -> tuple[RoleLMs, ScriptedLM]:
    agent = ScriptedLM(reply, model=model)
    agent.kwargs.update(kwargs)
    return scripted_role_lms(agent=agent), agent


# ----- never cache a failed answer ---------------------------------------------------------


def test_unparseable_upper_bound_answers_are_counted_but_never_cached(tmp_path):
    env = tiny_env()
    variants = variant_count(env)
    broken, broken_agent = agent_lms(lambda call: NOT_JSON)
    table = compute_upper_bound(env, broken, tmp_path)
    assert len(broken_agent.calls) >= variants
    assert table.parse_failures == variants  # the run that got them counts them
    assert all(not entry["parse_failed"] for entry in cached_entries(tmp_path))

    healthy, healthy_agent = agent_lms(_generic_responder)  # same model name, same settings
    again = compute_upper_bound(env, healthy, tmp_path)
    assert len(healthy_agent.calls) == variants, "every failed answer must be asked again"
    assert again.parse_failures == 0
    assert len(cached_entries(tmp_path)) == variants

    third, third_agent = agent_lms(_generic_responder)
    assert compute_upper_bound(env, third, tmp_path).entries == again.entries
    assert third_agent.calls == []  # parsed answers are reused


def test_only_the_failed_answers_are_asked_again(tmp_path):
    env = tiny_env()
    variants = variant_count(env)
    replies = iter([NOT_JSON, NOT_JSON])  # the first two questions fail, the rest parse

    def flaky(call):
        return next(replies, None) or _generic_responder(call)

    lms, agent = agent_lms(flaky)
    first = compute_upper_bound(env, lms, tmp_path)
    assert first.parse_failures >= 1
    assert len(cached_entries(tmp_path)) == variants - first.parse_failures
    lms, agent = agent_lms(_generic_responder)
    second = compute_upper_bound(env, lms, tmp_path)
    assert len(agent.calls) == first.parse_failures
    assert second.parse_failures == 0


# ----- the cache key ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "changed",
    [
        {"api_base": "http://127.0.0.1:9999/v1"},
        {"temperature": 0.7},
        {"max_tokens": 64},
    ],
)
def test_another_endpoint_temperature_or_max_tokens_is_another_cache_entry(tmp_path, changed):
    env = tiny_env()
    base = {"api_base": "http://127.0.0.1:8765/v1", "temperature": 0.0, "max_tokens": 256}
    lms, _ = agent_lms(_generic_responder, **base)
    compute_upper_bound(env, lms, tmp_path)
    lms, agent = agent_lms(_generic_responder, **{**base, **changed})
    compute_upper_bound(env, lms, tmp_path)
    assert len(agent.calls) == variant_count(env), f"{changed} must not reuse cached answers"


def test_another_structured_output_dialect_is_another_cache_entry(tmp_path):
    env = tiny_env()
    lms, agent = agent_lms(_generic_responder)
    agent.evolve_structured_output = "json_schema"
    compute_upper_bound(env, lms, tmp_path)
    lms, agent = agent_lms(_generic_responder)
    agent.evolve_structured_output = "json_object"
    compute_upper_bound(env, lms, tmp_path)
    assert len(agent.calls) == variant_count(env)


def test_identity_names_the_endpoint_without_credentials(tmp_path):
    lm = build_lm(
        EndpointConfig(
            model="m1",
            base_url="http://127.0.0.1:8765/v1",
            temperature=0.3,
            max_tokens=77,
            structured_output="json_object",
        )
    )
    lms = RoleLMs.from_lms(simulator=lm, agent=lm, reflector=lm)
    assert lms.identity("agent") == {
        "model": "openai/m1",
        "endpoint": "http://127.0.0.1:8765/v1",
        "structured_output": "json_object",
        "temperature": 0.3,
        "max_tokens": 77,
    }
    secret = "pa55word-not-in-cache"
    lm.kwargs["api_base"] = f"https://user:{secret}@llm.example.org:8443/v1/?token={secret}"
    identity = lms.identity("agent")
    assert identity["endpoint"] == "https://llm.example.org:8443/v1"
    assert secret not in json.dumps(identity)

    # ... nor in the cache file's name or content.
    agent = ScriptedLM(_generic_responder, model="m1")
    agent.kwargs["api_base"] = lm.kwargs["api_base"]
    compute_upper_bound(tiny_env(), scripted_role_lms(agent=agent), tmp_path)
    for path in tmp_path.iterdir():
        assert secret not in path.name
        assert secret not in path.read_text(encoding="utf-8")


def test_refresh_asks_every_question_again(tmp_path):
    env = tiny_env()
    lms, _ = agent_lms(_generic_responder)
    compute_upper_bound(env, lms, tmp_path)
    lms, agent = agent_lms(_generic_responder)
    compute_upper_bound(env, lms, tmp_path, refresh=True)
    assert len(agent.calls) == variant_count(env)


# ----- end to end: evolve eval against the stub server -----------------------------------


def _eval(stub: StubServer, env_file: Path, out: Path, ub_cache: Path, *extra: str) -> int:
    return main(
        [
            "eval",
            "--env",
            str(env_file),
            "--policy",
            "in_context",
            "--users",
            "1",
            "--concurrency",
            "2",
            "--out",
            str(out),
            "--upper-bound-cache",
            str(ub_cache),
            "--no-llm-cache",
            "--model",
            "stub",
            "--base-url",
            stub.base_url,
            *extra,
        ]
    )


def _report(out: Path) -> dict:
    return json.loads((out / "in_context" / "report.json").read_text(encoding="utf-8"))


def test_eval_after_a_non_json_server_reasks_the_upper_bound(tmp_path, capsys):
    env = tiny_env(1)
    env_file = tmp_path / "env.json"
    save_environment(env, env_file)
    variants = variant_count(env)
    ub_cache = tmp_path / "ub"
    with StubServer(latency=0.0, fault="non_json") as stub:
        assert _eval(stub, env_file, tmp_path / "broken", ub_cache) == 0
        broken = _report(tmp_path / "broken")["summary"]
        assert broken["parse_failures"]["upper_bound"] == broken["n_items"]

        # The same server (same model name and address) now answers properly.
        stub.set_fault("none")
        capsys.readouterr()
        before = stub.stats()["chat_requests"]
        assert _eval(stub, env_file, tmp_path / "healthy", ub_cache) == 0
        assert "upper bound: " in capsys.readouterr().out
        healthy = _report(tmp_path / "healthy")["summary"]
        assert healthy["parse_failures"]["upper_bound"] == 0
        assert healthy["upper_bound_score"] is not None and healthy["upper_bound_score"] > 0
        assert stub.stats()["chat_requests"] - before >= variants  # the upper bound re-asked

        # --refresh-upper-bound asks again even though every answer is cached; the run
        # itself resumes from disk and costs nothing.
        before = stub.stats()["chat_requests"]
        assert _eval(stub, env_file, tmp_path / "healthy", ub_cache, "--refresh-upper-bound") == 0
        assert stub.stats()["chat_requests"] - before == variants
        before = stub.stats()["chat_requests"]
        assert _eval(stub, env_file, tmp_path / "healthy", ub_cache) == 0
        assert stub.stats()["chat_requests"] == before


# ----- a file read back is checked against the environment ---------------------------------


def tamper(cache_dir: Path, change) -> str:
    """Apply `change(entry)` to the first cached entry; return its key."""
    (path,) = cache_dir.glob("upper_bound-*.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    key = next(iter(data["entries"]))
    change(data["entries"][key])
    path.write_text(json.dumps(data), encoding="utf-8")
    return key


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda entry: entry.update(correct=not entry["correct"]), "says correct="),
        (lambda entry: entry.update(chosen=99), "chosen=99"),
        (lambda entry: entry.update(variant_index=99), "another question's key"),
    ],
    ids=["flipped-correct", "chosen-out-of-range", "foreign-variant"],
)
def test_an_edited_upper_bound_cache_is_refused_in_one_line(tmp_path, change, said):
    env = tiny_env()
    lms, _ = agent_lms(_generic_responder)
    compute_upper_bound(env, lms, tmp_path)
    key = tamper(tmp_path, change)

    again, agent = agent_lms(_generic_responder)
    with pytest.raises(UpperBoundCacheError) as raised:
        compute_upper_bound(env, again, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and said in message and key in message
    assert "--refresh-upper-bound" in message
    assert agent.calls == []  # refused before asking anything

    # The documented way out recomputes the table.
    fresh = compute_upper_bound(env, again, tmp_path, refresh=True)
    assert fresh.parse_failures == 0 and len(fresh.entries) == variant_count(env)


def test_an_untouched_upper_bound_cache_passes_the_check(tmp_path):
    # The control: the check accepts what the toolkit itself wrote, right and wrong answers.
    env = tiny_env()
    lms, _ = agent_lms(_generic_responder)
    first = compute_upper_bound(env, lms, tmp_path)
    assert {entry.correct for entry in first.entries.values()} == {True, False}
    again, agent = agent_lms(_generic_responder)
    assert compute_upper_bound(env, again, tmp_path).entries == first.entries
    assert agent.calls == []
