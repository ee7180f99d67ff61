"""The scripted world of the concurrency tests: the agent stores a variable only if the types
list of its write instruction names it, by its category token or as an item that is its
plain variable name; it answers from memory only. The scripted reflector adds the category
of every variable its feedback names. The base policy omits two of the three categories.
6 train and 4 held-out users telling the same story.
"""

from __future__ import annotations

import re
from pathlib import Path

from optimize.evolve_helpers import SCHEMA, make_item, output_fields, sections
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn

import memory_policies
from evolve.simulator.environment import Environment
from memory_policies.in_context import TYPES_HEADER

CATEGORY = {variable: f"TYPE_{variable.upper()}" for variable in SCHEMA}
BASE_TYPES = f"1. {CATEGORY['diet']}: what the user eats."
TRAIN = [f"user-{i}" for i in range(6)]
HELDOUT = [f"user-{i}" for i in range(6, 10)]


def remembered_categories(system: str) -> set[str]:
    """The variables the write instruction's types list names: by this world's category token
    (the base list and the reflector's additions) or, as the oracle lists them, as an item
    that is the variable's plain name ("2. city"). Only the list after the types header
    counts, so a variable named in passing elsewhere in the prompt stores nothing."""
    _, header, types = system.partition(TYPES_HEADER)
    if not header:
        return set()
    return {
        variable
        for variable, token in CATEGORY.items()
        if token in types or re.search(rf"^\s*\d+\.\s*{variable}\s*$", types, re.MULTILINE)
    }


def _latest(text: str, options_text: str) -> int:
    lowered = text.lower()
    options = [re.sub(r"^\d+\.\s*", "", line) for line in options_text.strip().splitlines()]
    best, best_position = 1, -2
    for index, option in enumerate(options, start=1):
        words = [w for w in re.findall(r"[a-z]+", option.lower()) if len(w) >= 3]
        position = max((lowered.rfind(w) for w in words), default=-1)
        if position > best_position:
            best, best_position = index, position
    return best


def agent(call):
    fields, inputs = output_fields(call.system), sections(call.user)
    if "choice" in fields and "known_state" in inputs:
        return {"choice": _latest(inputs["known_state"], inputs["options"])}
    if "choice" in fields:
        return {"choice": _latest(inputs.get("memory", ""), inputs["options"])}
    if "updates" in fields:
        text = inputs.get("messages", "").lower()
        remembered = remembered_categories(call.system)
        updates = []
        for variable, values in SCHEMA.items():
            if variable not in remembered:
                continue
            found = [(text.rfind(v.lower()), v) for v in values if v.lower() in text]
            if found:
                updates.append({"label": variable, "value": max(found)[1]})
        return {"updates": updates}
    return {name: "Noted." for name in fields}


def reflector(call):
    inputs = sections(call.user)
    current, feedback = inputs.get("current_text", "").strip(), inputs.get("feedback", "")
    added = [
        token
        for variable, token in CATEGORY.items()
        if re.search(rf"\b{variable}\b", feedback) and token not in current
    ]
    return {"new_text": "\n".join([current, *(f"- {token}" for token in added)])}


def world(tmp_path: Path):
    env = Environment.from_original([make_item(f"user-{i}") for i in range(10)])
    lms = scripted_role_lms(
        simulator=lambda call: user_turn("Thanks, tell me more."),
        agent=ScriptedLM(agent, model="agent-model"),
        reflector=ScriptedLM(reflector, model="reflector-model"),
    )
    base = memory_policies.create_policy("in_context", {"update_every": 1, "short_term_len": 0})
    return env, lms, base.with_components({"write.types_to_remember": BASE_TYPES})
