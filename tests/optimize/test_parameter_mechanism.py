"""Parameter mechanism test: numeric parameters are GEPA components too.

The scripted agent's write stores the values it reads only when its batch holds exactly two
messages, so accuracy peaks at `update_every = 2` (1: nothing stored; >= 3: nothing stored).
The base policy starts at 5; the parameter operator (random steps, or Optuna TPE ask/tell)
must find 2 within 10 generations and a fixed metric-call budget. The reflector is never
called: the only mutable component is `param.update_every`.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from optimize.evolve_helpers import SCHEMA, make_item, output_fields, sections
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn

import memory_policies
from evolve.optimize.gepa_adapter import AMemGymAdapter, seed_candidate
from evolve.optimize.gepa_engine import GepaSettings, run_gepa
from evolve.optimize.operators import build_operator
from evolve.optimize.parameters import RandomStepProposer
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EpisodeConfig
from evolve.tuning import IntRange, OptunaParameterProposer

PEAK = 2
BOUNDS = {"update_every": IntRange(low=1, high=6)}


def agent(call):
    fields, inputs = output_fields(call.system), sections(call.user)
    if "choice" in fields:
        memory = inputs.get("memory", "").lower()
        options = [
            re.sub(r"^\d+\.\s*", "", line) for line in inputs["options"].strip().splitlines()
        ]
        positions = [
            max((memory.rfind(w) for w in re.findall(r"[a-z]{3,}", o.lower())), default=-1)
            for o in options
        ]
        return {"choice": 1 + max(range(len(options)), key=lambda i: (positions[i], -i))}
    if "updates" in fields:
        text = inputs.get("messages", "")
        if len(re.findall(r"^(?:User|Assistant):", text, re.M)) != PEAK:
            return {"updates": []}
        lowered = text.lower()
        updates = []
        for variable, values in SCHEMA.items():
            found = [(lowered.rfind(v.lower()), v) for v in values if v.lower() in lowered]
            if found:
                updates.append({"label": variable, "value": max(found)[1]})
        return {"updates": updates}
    return {name: "Noted." for name in fields}


def reflector(call):
    raise AssertionError("the reflector must never see a numeric component")


@pytest.mark.parametrize("proposer", ["random", "optuna"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_parameter_operator_finds_the_peak(tmp_path, proposer, seed):
    env = Environment.from_original([make_item(f"user-{i}") for i in range(4)])
    lms = scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=ScriptedLM(agent, model="agent-model"),
        reflector=ScriptedLM(reflector, model="reflector-model"),
    )
    base = memory_policies.create_policy("in_context", {"update_every": 5, "short_term_len": 0})
    chosen = (
        (lambda: RandomStepProposer(max_step=3))
        if proposer == "random"
        else (lambda: OptunaParameterProposer(BOUNDS, seed=seed, startup_trials=3))
    )
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=2, seed=seed),
        work_dir=tmp_path / "evals",
        operators=[build_operator("parameter", proposer_factory=chosen, bounds=BOUNDS)],
        objective="accuracy",
        seed=seed,
    )
    outcome = run_gepa(
        adapter,
        train_users=[f"user-{i}" for i in range(3)],
        heldout_users=["user-3"],
        seed_candidate=seed_candidate(base, [], ["update_every"]),
        settings=GepaSettings(max_metric_calls=80, max_generations=10, reflection_minibatch_size=2),
        run_dir=tmp_path / "gepa",
        seed=seed,
    )
    best = outcome.candidates[outcome.best_idx]
    print(proposer, seed, [c["param.update_every"] for c in outcome.candidates])
    assert best == {"param.update_every": str(PEAK)}
    assert outcome.train_scores[outcome.best_idx] > outcome.train_scores[0]
    assert all(p["operator"] == "parameter" for p in outcome.proposals)


def _run(tmp_path, run_dir, generations, world_agent, proposer="random"):
    env = Environment.from_original([make_item(f"user-{i}") for i in range(4)])
    lms = scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=world_agent,
        reflector=ScriptedLM(reflector, model="reflector-model"),
    )
    base = memory_policies.create_policy("in_context", {"update_every": 4, "short_term_len": 0})
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=2, seed=3),
        work_dir=run_dir / "evals",
        operators=[
            build_operator(
                "parameter",
                proposer_factory=(lambda: RandomStepProposer(max_step=2))
                if proposer == "random"
                else (lambda: OptunaParameterProposer(BOUNDS, seed=3, startup_trials=2)),
                bounds=BOUNDS,
            )
        ],
        objective="accuracy",
        seed=3,
    )
    return run_gepa(
        adapter,
        train_users=[f"user-{i}" for i in range(3)],
        heldout_users=["user-3"],
        seed_candidate=seed_candidate(base, [], ["update_every"]),
        settings=GepaSettings(
            max_metric_calls=200, max_generations=generations, reflection_minibatch_size=2
        ),
        run_dir=run_dir / "gepa",
        seed=3,
    )


@pytest.mark.parametrize("proposer", ["random", "optuna"])
def test_a_resumed_run_makes_the_same_choices_without_re_evaluating(
    tmp_path, monkeypatch, proposer
):
    # Evaluations asked of the adapter (a cached runner directory would hide repeats from
    # the LM call counts alone).
    asked: list[str] = []
    original = AMemGymAdapter.run_user

    def counting(self, candidate, user_id, split="train"):
        asked.append(f"{split}:{user_id}:{sorted(candidate.items())}")
        return original(self, candidate, user_id, split)

    monkeypatch.setattr(AMemGymAdapter, "run_user", counting)
    whole_agent = ScriptedLM(agent, model="agent-model")
    whole = _run(tmp_path, tmp_path / "whole", 6, whole_agent, proposer)
    whole_asked, asked[:] = list(asked), []

    # "Killed" after 3 generations (a new process: new adapter, operators, LMs), resumed to 6.
    first_agent, second_agent = ScriptedLM(agent), ScriptedLM(agent)
    _run(tmp_path, tmp_path / "resumed", 3, first_agent, proposer)
    first_asked, asked[:] = list(asked), []
    resumed = _run(tmp_path, tmp_path / "resumed", 6, second_agent, proposer)

    assert len(whole.candidates) > 1, "the test needs an accepted child before the split"
    assert resumed.candidates == whole.candidates
    assert resumed.parents == whole.parents
    assert resumed.proposals == whole.proposals
    assert resumed.heldout == whole.heldout
    # gepa 0.1.4 re-scores the seed on the valset when it resumes; those three users are
    # read back from their finished runner directories (no LLM call, see below).
    # (Threads order the list; compare as multisets.)
    # The held-out checks of earlier bests are read back the same way when the schedule
    # resumes (it keeps no held-out score of its own beside the runner directories).
    seed_users = Counter({a for a in whole_asked if a.startswith("train") and "'4')" in a})
    assert len(seed_users) == 3

    def played(entries: list[str]) -> Counter[str]:
        return Counter(a for a in entries if not a.startswith("heldout"))

    def heldout(entries: list[str]) -> set[str]:
        return {a for a in entries if a.startswith("heldout")}

    assert played(first_asked) + played(asked) - seed_users == played(whole_asked)
    assert heldout(first_asked) | heldout(asked) == heldout(whole_asked)
    # Nothing evaluated twice: both halves together made exactly the uninterrupted run's calls.
    assert len(first_agent.calls) + len(second_agent.calls) == len(whole_agent.calls)
    assert len(second_agent.calls) < len(whole_agent.calls)


def test_our_budget_stops_gepa_between_generations(tmp_path):
    from evolve.llm.usage import Usage
    from evolve.optimize.gepa_engine import budget_stop
    from evolve.results.budget import Budget
    from evolve.spec.config import BudgetSpec

    env = Environment.from_original([make_item(f"user-{i}") for i in range(3)])
    lms = scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=ScriptedLM(agent, model="agent-model"),
        reflector=ScriptedLM(reflector, model="reflector-model"),
    )
    base = memory_policies.create_policy("in_context", {"update_every": 5, "short_term_len": 0})
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=1, seed=0),
        work_dir=tmp_path / "evals",
        operators=[build_operator("parameter", proposer_factory=RandomStepProposer, bounds=BOUNDS)],
        objective="accuracy",
    )
    budget = Budget(BudgetSpec(max_llm_calls=150), lms, Usage())
    outcome = run_gepa(
        adapter,
        train_users=[f"user-{i}" for i in range(3)],
        heldout_users=[],
        seed_candidate=seed_candidate(base, [], ["update_every"]),
        settings=GepaSettings(max_metric_calls=500, max_generations=50),
        run_dir=tmp_path / "gepa",
        seed=0,
        stop_when=budget_stop(budget),
    )
    spent = budget.spent().requests
    assert spent >= 150  # stopped because of our limit, not GEPA's
    assert outcome.metric_calls is not None and outcome.metric_calls < 500
    assert len(outcome.proposals) < 50


def test_the_tuned_operator_runs_a_study_on_its_generations(tmp_path):
    env = Environment.from_original([make_item(f"user-{i}") for i in range(3)])
    lms = scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=ScriptedLM(agent, model="agent-model"),
        reflector=ScriptedLM(reflector, model="reflector-model"),
    )
    base = memory_policies.create_policy("in_context", {"update_every": 5, "short_term_len": 0})
    adapter = AMemGymAdapter(
        base_policy=base,
        environment=env,
        lms=lms,
        episode=EpisodeConfig(concurrency=1, seed=0),
        work_dir=tmp_path / "evals",
        operators=[],
        objective="accuracy",
    )
    # Generation 2 is the tuned one; generation 1 keeps the parent (no parameter operator).
    adapter.operators = [
        build_operator(
            "tuned",
            policy_of=adapter.policy,
            environment=env,
            lms=lms,
            episode=EpisodeConfig(concurrency=1, seed=0),
            work_dir=tmp_path / "tuning",
            bounds=BOUNDS,
            every=2,
            trials=6,
            sampler="grid",
            objective="accuracy",
        )
    ]
    outcome = run_gepa(
        adapter,
        train_users=[f"user-{i}" for i in range(3)],
        heldout_users=[],
        seed_candidate=seed_candidate(base, [], ["update_every"]),
        settings=GepaSettings(max_metric_calls=100, max_generations=2),
        run_dir=tmp_path / "gepa",
        seed=0,
    )
    assert [(p["iteration"], p["operator"]) for p in outcome.proposals] == [(2, "tuned")]
    assert outcome.candidates[outcome.best_idx] == {"param.update_every": str(PEAK)}
