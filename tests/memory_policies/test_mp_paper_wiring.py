"""The paper variant inside the toolkit: protocol defaults, the oracle in a real evaluation run,
and the configurable OpenAI-compatible embedder (recorded by name, never by URL or key)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from scripted_lm import ScriptedCall, ScriptedLM, scripted_role_lms
from simulator.eval_helpers import SCHEMA, make_environment, simulator_responder

from evolve.commands.eval import build_eval_policies
from evolve.core.errors import ConfigError
from evolve.core.protocol import EVOLVE, PAPER
from evolve.simulator.evaluation import (
    QUESTION_HINT,
    EpisodeConfig,
    resolved_config,
    run_evaluation,
)
from evolve.spec.config import resolve, spec_from_dict
from memory_policies import (
    LocalMiniLMEmbedder,
    OpenAIEmbedder,
    build_policy,
    default_embedder,
    embedder_from_config,
)
from memory_policies.embed import EMBEDDER_ENV, EMBEDDING_BASE_URL_ENV, EMBEDDING_KEY_ENV_ENV

# ----- protocol -> variant ----------------------------------------------------------------------


def test_eval_gives_specs_without_variant_the_paper_variant_under_the_paper_protocol(tmp_path):
    build_policy("in_context").save(tmp_path / "bundle")
    specs = ["in_context", "native:variant=evolve", "in_context_oracle", str(tmp_path / "bundle")]
    assert [p.variant for p in build_eval_policies(specs, PAPER)] == [
        "paper",
        "evolve",  # explicit wins
        "paper",
        "evolve",  # a bundle keeps the variant it recorded
    ]
    assert [p.variant for p in build_eval_policies(["in_context"], EVOLVE)] == ["evolve"]
    assert [p.variant for p in build_eval_policies(["raw_rag:variant=paper"], EVOLVE)] == ["paper"]


def _spec(protocol: str, **policy):
    return spec_from_dict(
        {
            "name": "x",
            "protocol": protocol,
            "environment": {"preset": "tiny", "users": 3, "train_users": 2, "heldout_users": 1},
            "policy": {"kind": "in_context", **policy},
        }
    )


@pytest.mark.parametrize(
    ("protocol", "policy", "expected"),
    [
        ("paper", {}, "paper"),
        ("paper", {"variant": "evolve"}, "evolve"),
        ("evolve", {}, "evolve"),
        ("evolve", {"variant": "paper"}, "paper"),
    ],
)
def test_spec_resolution_applies_the_protocol_variant_unless_the_spec_names_one(
    protocol, policy, expected
):
    resolved = resolve(_spec(protocol, **policy))
    assert resolved.base_policy.variant == expected
    assert resolved.identity({"agent": "m"})["base_policy"]["preset"] == expected


def test_a_bundle_path_takes_no_variant(tmp_path):
    with pytest.raises(ConfigError, match="records its own"):
        spec_from_dict(
            {
                "name": "x",
                "environment": {"preset": "tiny", "users": 2},
                "policy": {"path": str(tmp_path), "variant": "paper"},
            }
        )


# ----- the oracle in an evaluation run ----------------------------------------------------------

VALUES = {value: name for name, values in SCHEMA.items() for value in values}


def oracle_agent(call: ScriptedCall) -> str:
    """Paper-style agent: writes every schema value seen under the type it was told to track
    (if listed), replies in text, answers with the option naming a remembered value."""
    if len(call.messages) == 1 and "Output only a JSON object" in call.user:
        types = call.user.split("Types of Information to Remember:\n", 1)[1].split("\n\n")[0]
        told = re.findall(r"^\d+\. (\w+)$", types, re.M)
        conversation = call.user.rsplit("as a JSON list of messages:\n", 1)[1]
        found = {VALUES[v]: v for v in VALUES if v.lower() in conversation.lower()}
        return json.dumps({name: value for name, value in found.items() if name in told})
    if '"answer": <option number>' in call.user:
        memory = call.messages[0]["content"] if call.messages[0]["role"] == "system" else ""
        options = re.findall(r"^(\d+): (.*)$", call.user, re.M)
        for number, text in options:
            if any(f": {v}" in memory and v in text for v in VALUES):
                return json.dumps({"answer": int(number)})
        return json.dumps({"answer": 1})
    return "Happy to help with that."


def test_oracle_runs_in_an_evaluation_with_each_users_own_variables(tmp_path):
    agent = ScriptedLM(oracle_agent, model="agent-model")
    lms = scripted_role_lms(simulator=simulator_responder, agent=agent)
    env = make_environment(users=2)
    config = EpisodeConfig(rounds_initial=2, rounds_update=2, concurrency=1, protocol="paper")
    oracle = build_policy("in_context_oracle:variant=paper")
    report = run_evaluation(env, oracle, lms, tmp_path / "oracle", config)
    writes = [c for c in agent.calls if "Types of Information to Remember:" in c.user]
    assert writes, "the oracle never wrote"
    for call in writes:
        types = call.user.split("Types of Information to Remember:\n", 1)[1].split("\n\n")[0]
        assert types == "1. diet\n2. city\n3. pet"
    questions = [c for c in agent.calls if '"answer": <option number>' in c.user]
    assert questions and all(QUESTION_HINT not in c.user for c in questions)  # said once
    # The ceiling: told the variables, this agent remembers them; with the generic 7 types
    # (whose lines name none of the variables) the same agent writes nothing.
    plain_agent = ScriptedLM(oracle_agent, model="agent-model")
    plain_lms = scripted_role_lms(simulator=simulator_responder, agent=plain_agent)
    plain = build_policy("in_context:variant=paper")
    baseline = run_evaluation(env, plain, plain_lms, tmp_path / "plain", config)
    assert report.summary.accuracy > baseline.summary.accuracy
    resolved = resolved_config(oracle, "h", [], config, lms, None)
    assert resolved["policy"]["kind"] == "in_context_oracle"
    assert resolved["policy"]["preset"] == "paper"


# ----- embeddings -------------------------------------------------------------------------------


class _EmbeddingServer:
    """A minimal OpenAI-compatible /v1/embeddings endpoint that records its requests."""

    def __init__(self) -> None:
        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                requests.append((self.path, self.headers.get("Authorization"), body))
                data = [
                    {"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.5]}
                    for i, t in enumerate(body["input"])
                ]
                payload = json.dumps(
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_minilm_stays_the_default_embedder(monkeypatch):
    monkeypatch.delenv(EMBEDDER_ENV, raising=False)
    assert isinstance(default_embedder(), LocalMiniLMEmbedder)
    assert embedder_from_config("minilm") is default_embedder()


def test_an_openai_compatible_embedder_by_config_is_used_and_recorded_by_name(
    monkeypatch, tmp_path
):
    with _EmbeddingServer() as server:
        monkeypatch.setenv(EMBEDDER_ENV, "openai:text-embedding-3-small")
        monkeypatch.setenv(EMBEDDING_BASE_URL_ENV, server.base_url)
        monkeypatch.setenv(EMBEDDING_KEY_ENV_ENV, "TEST_EMBEDDING_KEY")
        monkeypatch.setenv("TEST_EMBEDDING_KEY", "sk-test-secret")
        embedder = default_embedder()
        assert isinstance(embedder, OpenAIEmbedder)
        policy = build_policy("raw_rag:variant=paper")
        state = policy.observe(
            policy.initial_state(),
            [{"role": "user", "content": f"message {i}"} for i in range(6)],
        )
        assert len(state.memories) == 2  # each message its own memory, embedded remotely
        assert state.embedder == "openai:text-embedding-3-small"
        path, auth, body = server.requests[0]
        assert path == "/v1/embeddings"
        assert body["model"] == "text-embedding-3-small"
        assert auth == "Bearer sk-test-secret"
        policy.save(tmp_path)
        saved = (tmp_path / "policy.json").read_text()
        assert json.loads(saved)["embedder"] == "openai:text-embedding-3-small"
        assert policy.identity()["embedder"] == "openai:text-embedding-3-small"
        assert "127.0.0.1" not in saved and "sk-test-secret" not in saved
        assert "127.0.0.1" not in json.dumps(policy.identity())
