"""The upper bound under each protocol: what the agent is shown, the cache key, and the
state-tuple collision of the reference code that neither protocol reproduces."""

from __future__ import annotations

import copy
import json
import re

from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import make_item, sections

from evolve.core.protocol import EVOLVE, PAPER
from evolve.simulator.baselines import compute_upper_bound, upper_bound_cache_key
from evolve.simulator.environment import Environment

DINNER = "Can you suggest a dinner recipe for me?"
SNACK = "What snack should I pack for my hike?"


def environment_with_a_shared_state_tuple() -> Environment:
    """Two questions over `diet` whose options carry the same state tuples."""
    item = copy.deepcopy(make_item("user-0"))  # make_item shares the module's QA list
    snack = copy.deepcopy(item["qas"][0])
    snack["query"] = SNACK
    for choice, text in zip(snack["answer_choices"], ("Nuts", "Jerky", "Cheese"), strict=True):
        choice["answer"] = text
    item["qas"].append(snack)
    return Environment.from_original([item])


def picking_agent(calls_seen: list):
    """Picks the option matching the given diet for the dinner question, always option 1 for
    the snack question (so the two questions' upper bounds differ for the same state)."""

    def respond(call):
        calls_seen.append(call)
        inputs = sections(call.user)
        question = inputs["question"].strip()
        state = json.loads(inputs.get("current_state") or inputs["known_state"])
        if question == SNACK or "diet" not in state:
            return {"choice": 1}
        options = inputs["options"].strip().splitlines()
        wanted = state["diet"]
        return {"choice": next(i for i, o in enumerate(options, 1) if wanted in o.lower())}

    return respond


def test_paper_layout_follows_the_reference_prompt(tmp_path):
    seen: list = []
    env = environment_with_a_shared_state_tuple()
    lms = scripted_role_lms(agent=ScriptedLM(picking_agent(seen), model="agent-x"))
    table = compute_upper_bound(env, lms, tmp_path, rules=PAPER)
    assert table.protocol == "paper"
    first = seen[0]
    inputs = sections(first.user)
    # The question, the state of the variant (indented JSON), the options as "<n>: <text>".
    assert list(inputs) == ["question", "current_state", "options"]
    assert inputs["question"].strip() == DINNER
    assert inputs["current_state"].strip() == json.dumps({"diet": "vegan"}, indent=2)
    assert re.match(r"1: A vegan lentil stew\n2: A omnivore", inputs["options"].strip())
    evolve_seen: list = []
    evolve_lms = scripted_role_lms(agent=ScriptedLM(picking_agent(evolve_seen), model="agent-x"))
    compute_upper_bound(env, evolve_lms, tmp_path / "evolve")
    evolve_inputs = sections(evolve_seen[0].user)
    assert list(evolve_inputs) == ["known_state", "question", "options"]
    assert evolve_inputs["known_state"].strip() == '{"diet": "vegan"}'
    assert evolve_inputs["options"].strip().startswith("1. A vegan lentil stew")


def test_each_protocol_has_its_own_cache_entries(tmp_path):
    env = environment_with_a_shared_state_tuple()
    seen: list = []
    lms = scripted_role_lms(agent=ScriptedLM(picking_agent(seen), model="agent-x"))
    identity = {"model": "agent-x"}
    assert upper_bound_cache_key("env", identity, "paper") != upper_bound_cache_key(
        "env", identity, "evolve"
    )
    compute_upper_bound(env, lms, tmp_path, rules=EVOLVE)
    variants = len(seen)
    compute_upper_bound(env, lms, tmp_path, rules=PAPER)
    assert len(seen) == 2 * variants  # the evolve answers were not reused under paper
    compute_upper_bound(env, lms, tmp_path, rules=PAPER)
    compute_upper_bound(env, lms, tmp_path, rules=EVOLVE)
    assert len(seen) == 2 * variants  # each protocol's answers are cached under its own key


def test_questions_sharing_a_state_tuple_keep_their_own_upper_bound(tmp_path):
    env = environment_with_a_shared_state_tuple()
    lms = scripted_role_lms(agent=ScriptedLM(picking_agent([]), model="agent-x"))
    for rules in (PAPER, EVOLVE):
        table = compute_upper_bound(env, lms, tmp_path / rules.name, rules=rules)
        dinner, snack = 0, len(env.items[0].qas) - 1
        # Variant 2 (keto) of both questions has the state tuple ("keto",). The reference maps
        # state tuples to scores over all questions, so the snack question's wrong answer
        # would overwrite the dinner question's right one; ours keys by question.
        assert table.correct("user-0", dinner, 2) is True
        assert table.correct("user-0", snack, 2) is False
