"""The chain tests' scripted world: two train users who tell the same story but sign their
messages differently (Alice, Bob); the scripted agent also remembers the signature, and as the
reflector (the agent's own model under the paper protocol) adds a token naming the signature
it sees in the feedback.

A module of its own (not a test file) because a child process of `test_chain` imports it.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from optimize.evolve_helpers import SCHEMA, make_item, output_fields, reflector_inputs, sections
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn

from evolve.optimize import evolve_policy
from evolve.simulator.environment import Environment, save_environment
from evolve.spec.config import load_spec

SIGNATURES = {"user-0": "Alice", "user-1": "Bob"}


def token(name: str) -> str:
    return f"SIGNED_{name.upper()}"


def write_world(directory: Path, feedback: str = "complete", concurrency: int = 2) -> Path:
    items = []
    for user_id, name in SIGNATURES.items():
        item = make_item(user_id)
        for period in item["periods"]:
            for session in period["sessions"]:
                session["query"] = f"{session['query']} -- {name}"
        items.append(item)
    save_environment(Environment.from_original(items), directory / "env.json")
    spec = directory / "chains.toml"
    spec.write_text(
        textwrap.dedent(
            f"""
            name = "chains"
            seed = 3
            concurrency = {concurrency}
            protocol = "paper"

            [environment]
            file = "env.json"
            train_users = 2
            heldout_users = 0

            [policy]
            kind = "in_context"
            # The scripted agent reads DSPy fields; the paper variant's chat messages are
            # pinned in tests/memory_policies/test_mp_paper.py. This file tests the chains.
            variant = "evolve"
            parameters = {{ update_every = 1, short_term_len = 0 }}

            [optimizer]
            schedule = "per_period"
            feedback = "{feedback}"
            mutate_components = ["write.types_to_remember"]
            objective = "accuracy"

            [tracking]
            enabled = false
            """
        ),
        encoding="utf-8",
    )
    return spec


def agent(call) -> dict[str, Any]:
    fields, inputs = output_fields(call.system), sections(call.user)
    reflection = reflector_inputs(call)
    if reflection is not None:  # the reflector: under the paper protocol, the agent's model
        inputs = reflection
        current = inputs.get("current_text", "").strip()
        added = [
            token(name)
            for name in SIGNATURES.values()
            if f"signature: {name}" in inputs.get("feedback", "") and token(name) not in current
        ]
        return {"new_text": "\n".join([current, *(f"- {t}" for t in added)])}
    if "choice" in fields:
        return {"choice": 1}
    if "updates" in fields:
        text = inputs.get("messages", "")
        updates = [
            {"label": variable, "value": value}
            for variable, values in SCHEMA.items()
            for value in values
            if value.lower() in text.lower()
        ]
        updates += [
            {"label": "signature", "value": name}
            for name in SIGNATURES.values()
            if f"-- {name}" in text
        ]
        return {"updates": updates}
    return {name: "Noted." for name in fields}


class World:
    def __init__(self, respond=agent) -> None:
        self.agent = ScriptedLM(respond, model="agent-model")
        self.reflector = ScriptedLM(lambda call: {"new_text": "unused"}, model="other-model")
        self.simulator = ScriptedLM(lambda call: user_turn("Tell me more."), model="sim")
        self.lms = scripted_role_lms(
            simulator=self.simulator, agent=self.agent, reflector=self.reflector
        )


def run(directory: Path, world: World, spec: Path):
    return evolve_policy(
        load_spec(spec),
        world.lms,
        runs_dir=directory / "runs",
        upper_bound_cache=directory / "ub",
    )
