"""Mechanism test of the paper's per-period chain (`schedule = "per_period"`, protocol paper):
the feedback, not the reflector's own edits, closes the held-out gap.

The world is `noise_world`'s: questions never name their variable ("Quick check 2: which one
is true for me right now?"), held-out users hold variables that never appear in training, and
the agent stores a variable only if its types list names the variable's domain. Under the
paper protocol the reflector is the agent's own model, asked with the reference's request;
here it is scripted:

- shown a question whose chosen option does not appear in the memory it was answered from
  (the agent had nothing stored and fell back to option 1), it reads the domain off that
  question's options (a capable model knows that "beagle, tabby, parakeet" are pets) and
  adds it: the world makes the chosen option informative;
- shown nothing it can act on (the blind control; `question_only`, which shows questions
  without options; `complete` with its options cut out), it makes a random edit seeded by
  the proposal's seed, as `noise_world`'s reflector does.

Every train user evolves its own chain (one step after period 0, in effect in period 1); the
base and each user's final policy are scored on the held-out users. Gap closed = (mean final
held-out accuracy - base) / (oracle - base), the oracle naming every domain. One user's chain
can only learn the domains that user holds (food plus two of the six others), so even a
perfect reflector closes about a third of this gap; `complete` must close at least
`MARGIN` = 0.2 more than `blind` (measured: 0.33 against 0.08); `complete` without its options
(the same text minus the option lines) must not, which shows that the comparison can fail.
"""

from __future__ import annotations

import json
import re
import statistics
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from optimize import noise_world
from optimize.evolve_helpers import reflector_inputs
from optimize.noise_world import BASE_TYPES, DOMAIN_OF, HELDOUT, ORACLE_TYPES, TRAIN, VALUES
from scripted_lm import ScriptedCall, ScriptedLM, scripted_role_lms, user_turn

import memory_policies
from evolve.feedback import Feedback
from evolve.optimize import chain_step, evolve_policy
from evolve.simulator.environment import Environment, save_environment
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.spec.config import load_spec

SEEDS = (0, 1, 2)
KINDS = ("complete", "question_only", "blind")
COMPONENT = "write.types_to_remember"
MARGIN = 0.2
DOMAIN_OF_VALUE = {value: DOMAIN_OF[var] for var, values in VALUES.items() for value in values}
_OPTION = re.compile(r"^\s+\(([A-Z])\) (.+)$")
_CHOSEN = re.compile(r"^\s+The assistant chose: \(([A-Z])\)")


def missing_domains(feedback: str) -> list[str]:
    """Domains of the questions whose chosen option is absent from the memory shown."""
    memory = ""
    options: dict[str, str] = {}
    found: list[str] = []
    for line in feedback.splitlines():
        if line.startswith("Memory the assistant had:"):
            memory = line.lower()
        elif line.startswith("Question "):
            options = {}
        elif match := _OPTION.match(line):
            options[match.group(1)] = match.group(2).strip().lower()
        elif (match := _CHOSEN.match(line)) and options.get(match.group(1), memory) not in memory:
            domain = DOMAIN_OF_VALUE.get(options[match.group(1)])
            if domain is not None and domain not in found:
                found.append(domain)
    return found


def reflect(current: str, feedback: str, seed: int | None) -> dict[str, Any]:
    missing = [d for d in missing_domains(feedback) if d not in current.lower()]
    if missing:
        return {"new_text": "\n".join([current, *(f"- {domain}" for domain in missing)])}
    return noise_world.reflector(
        ScriptedCall(
            messages=[],
            system="",
            user=f"[[ ## current_text ## ]]\n{current}\n\n[[ ## feedback ## ]]\n{feedback}",
            settings={"seed": seed},
        )
    )


def agent(call: ScriptedCall) -> dict[str, Any]:
    """The agent's model: the policy's calls as in `noise_world`, and the paper reflector."""
    reflection = reflector_inputs(call)
    if reflection is not None:
        return reflect(
            reflection["current_text"].strip(), reflection["feedback"], call.settings.get("seed")
        )
    return noise_world.agent(call)


def write_world(directory: Path, feedback: str, seed: int) -> Path:
    env = noise_world.environment()
    save_environment(env, directory / "env.json")
    spec = directory / "chain.toml"
    train = json.dumps(TRAIN)
    heldout = json.dumps(HELDOUT)
    spec.write_text(
        textwrap.dedent(
            f"""
            name = "chain-{feedback}-{seed}"
            seed = {seed}
            concurrency = 1
            protocol = "paper"

            [environment]
            file = "env.json"
            train_users = {train}
            heldout_users = {heldout}

            [episode]
            seed = 0                    # the same episodes for every evolution seed

            [policy]
            kind = "in_context"
            variant = "evolve"          # the scripted agent reads DSPy fields
            parameters = {{ update_every = 1, short_term_len = 0 }}
            components = {{ "write.types_to_remember" = {json.dumps(BASE_TYPES)} }}

            [optimizer]
            schedule = "per_period"
            feedback = "{feedback}"
            mutate_components = ["{COMPONENT}"]
            objective = "accuracy"
            heldout = "final"

            [tracking]
            enabled = false
            """
        ),
        encoding="utf-8",
    )
    return spec


def world_lms(seen_reflections: list[str]):
    def recording_agent(call: ScriptedCall) -> dict[str, Any]:
        reflection = reflector_inputs(call)
        if reflection is not None:
            seen_reflections.append(reflection["feedback"])
        return agent(call)

    return scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=ScriptedLM(recording_agent, model="agent-model"),
        reflector=ScriptedLM(lambda call: {"new_text": "unused"}, model="other-model"),
    )


def heldout_accuracy(record) -> float:
    return record.heldout.summary.accuracy


def gap_closed(
    root: Path, feedback: str, seed: int, oracle: float, label: str = ""
) -> tuple[float, list[str]]:
    directory = root / f"{label or feedback}-{seed}"
    directory.mkdir()
    seen: list[str] = []
    result = evolve_policy(
        load_spec(write_world(directory, feedback, seed)),
        world_lms(seen),
        runs_dir=directory / "runs",
        upper_bound_cache=root / "ub",
    )
    assert result.complete
    base = heldout_accuracy(result.candidate("g00-c0"))
    index = json.loads(
        (
            directory / "runs" / f"chain-{feedback}-{seed}" / "chain" / "final_policies.json"
        ).read_text(encoding="utf-8")
    )
    assert sorted(index) == sorted(TRAIN)  # every train user has its own chain
    finals = [heldout_accuracy(result.candidate(entry["candidate"])) for entry in index.values()]
    assert oracle > base, (base, oracle)
    return (statistics.mean(finals) - base) / (oracle - base), seen


def oracle_accuracy(root: Path) -> float:
    env = noise_world.environment()
    users = Environment(items=[item for item in env.items if item.id in HELDOUT])
    policy = memory_policies.create_policy(
        "in_context", {"update_every": 1, "short_term_len": 0}, variant="evolve"
    ).with_components({COMPONENT: ORACLE_TYPES})
    report = run_evaluation(
        users,
        policy,
        world_lms([]),
        root / "oracle",
        EpisodeConfig(concurrency=1, seed=0, protocol="paper"),
    )
    return report.summary.accuracy


def without_options(*args, **kwargs) -> Feedback:
    """`complete` feedback with its option lines cut out: the chosen letter names nothing."""
    feedback = build_feedback(*args, **kwargs)
    lines = [line for line in feedback.text.splitlines() if not _OPTION.match(line)]
    return feedback.model_copy(update={"text": "\n".join(lines)})


build_feedback = chain_step.build_feedback


@pytest.fixture(scope="module")
def closed(tmp_path_factory) -> Iterator[dict[str, list[float]]]:
    """Held-out gap closed per seed for each feedback kind, and `complete` without options."""
    root = tmp_path_factory.mktemp("chain-mechanism")
    oracle = oracle_accuracy(root)
    runs: dict[str, list[float]] = {kind: [] for kind in (*KINDS, "no_options")}
    shown: dict[str, list[str]] = {kind: [] for kind in runs}
    for seed in SEEDS:
        for kind in KINDS:
            value, seen = gap_closed(root, kind, seed, oracle)
            runs[kind].append(value)
            shown[kind].extend(seen)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(chain_step, "build_feedback", without_options)
            value, seen = gap_closed(root, "complete", seed, oracle, label="no-options")
            runs["no_options"].append(value)
            shown["no_options"].extend(seen)
    for label, values in runs.items():
        print(f"{label}: gap closed per seed {[round(v, 2) for v in values]}")
    # Each chain made one step per train user (after period 0), shown its own feedback.
    for kind, texts in shown.items():
        assert len(texts) == len(SEEDS) * len(TRAIN), kind

    def has_options(text: str) -> bool:
        return any(_OPTION.match(line) for line in text.splitlines())

    assert all(has_options(text) for text in shown["complete"])
    assert not any(has_options(text) for text in shown["question_only"] + shown["no_options"])
    yield runs


def test_complete_feedback_beats_the_blind_control(closed):
    means = {kind: statistics.mean(values) for kind, values in closed.items()}
    print("mean gap closed: " + ", ".join(f"{kind} {value:.2f}" for kind, value in means.items()))
    assert means["complete"] - means["blind"] >= MARGIN
    # question_only shows no option: it cannot tell which domain is missing.
    assert means["complete"] - means["question_only"] >= MARGIN
    # The control is not inert: its random edits moved the held-out accuracy.
    assert any(value != 0 for value in closed["blind"])


def test_the_comparison_can_fail(closed):
    """With the options cut out of `complete`, the chosen letter names nothing: the reflector
    edits at random, like the blind control, and the difference required above is gone."""
    blind = statistics.mean(closed["blind"])
    stripped = statistics.mean(closed["no_options"]) - blind
    full = statistics.mean(closed["complete"]) - blind
    print(f"complete - blind: {full:.2f}; without options - blind: {stripped:.2f}")
    assert stripped < MARGIN <= full
