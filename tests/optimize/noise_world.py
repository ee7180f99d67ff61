"""A scripted world in which selection on noise can climb, for the blind-control comparison.

Built so that only real failure information can close the held-out gap quickly:

- Users hold variables from domains ("food and diet", "pets", ...). The agent stores a
  variable only if the write instruction's types list names the variable's domain; it
  answers from memory only (option 1 when memory has nothing, so no-memory is chance).
- Questions never name their variable ("Quick check 2: which one is true for me right
  now?"), and the user's messages give values, never variable names.
- Held-out users hold other variables of the same domains: no held-out variable ever
  appears in training, so a types list helps them only if it names domains.
- The reflector maps a variable NAMED in its feedback to that variable's domain and adds
  the domain (as a capable model generalises "pet_species is beagle" to "pets"). When its
  feedback names no variable whose domain is missing (the blind control, or diagnostic
  feedback without its cause lines), it makes a random edit seeded by the proposal's seed:
  add, remove or replace one line, drawn from a vocabulary of useful and useless domains.
  Random edits that happen to help are kept by GEPA's acceptance: selection on noise climbs.
"""

from __future__ import annotations

import random
import re
from typing import Any

from optimize.evolve_helpers import output_fields, sections
from scripted_lm import ScriptedCall, ScriptedLM, scripted_role_lms, user_turn

import memory_policies
from evolve.simulator.environment import Environment
from memory_policies.in_context import TYPES_HEADER

# domain -> (train variable, its values), (held-out variable, its values)
DOMAINS: dict[str, tuple[tuple[str, list[str]], tuple[str, list[str]]]] = {
    "food and diet": (
        ("diet_style", ["vegan", "ketogenic", "pescatarian"]),
        ("cuisine_pref", ["thai", "mexican", "ethiopian"]),
    ),
    "home and housing": (
        ("home_city", ["lisbon", "denver", "osaka"]),
        ("housing_type", ["loft", "bungalow", "houseboat"]),
    ),
    "pets": (
        ("pet_species", ["beagle", "tabby", "parakeet"]),
        ("pet_food", ["kibble", "freezedried", "canned"]),
    ),
    "work and career": (
        ("job_title", ["nurse", "plumber", "architect"]),
        ("employer_size", ["startup", "multinational", "nonprofit"]),
    ),
    "health and fitness": (
        ("exercise_kind", ["swimming", "cycling", "climbing"]),
        ("sleep_pattern", ["earlybird", "nightowl", "napper"]),
    ),
    "travel": (
        ("travel_plan", ["iceland", "peru", "vietnam"]),
        ("airline_pref", ["lufthansa", "emirates", "qantas"]),
    ),
    "money and finance": (
        ("bank_name", ["monzo", "chase", "revolut"]),
        ("savings_goal", ["mortgage", "wedding", "sabbatical"]),
    ),
    "family and relationships": (
        ("partner_name", ["alice", "bruno", "chen"]),
        ("kids_school", ["montessori", "publicschool", "boarding"]),
    ),
}
# Plausible types that no user's variables belong to: random edits may pick them.
DECOYS = ["weather", "sports teams", "music taste", "favorite colors", "tv shows", "phone model"]
VOCABULARY = [*DOMAINS, *DECOYS]
DOMAIN_OF = {var: domain for domain, pairs in DOMAINS.items() for var, _ in pairs}
VALUES = {var: values for pairs in DOMAINS.values() for var, values in pairs}
NAMES = list(DOMAINS)

BASE_TYPES = "1. food and diet: what the user eats."
ORACLE_TYPES = "\n".join(f"{i}. {domain}" for i, domain in enumerate(NAMES, start=1))
# Every user has food; the others: train users cover domains 1-6 between them, held-out users
# need pairs of them (domain 7, family, is a useful-looking type nobody needs).
TRAIN_DOMAINS = [(1 + i % 6, 1 + (i + 3) % 6) for i in range(6)]
HELDOUT_DOMAINS = [(1, 2), (3, 4), (5, 6), (1, 6)]
TRAIN = [f"train-{i}" for i in range(len(TRAIN_DOMAINS))]
HELDOUT = [f"heldout-{i}" for i in range(len(HELDOUT_DOMAINS))]


def make_user(user_id: str, variables: list[str]) -> dict[str, Any]:
    """Two periods: every variable revealed in period 0, two of them changed in period 1."""
    rng = random.Random(user_id)
    first = {var: rng.choice(VALUES[var]) for var in variables}
    changed = variables[1:]
    second = dict(first)
    for var in changed:
        second[var] = rng.choice([v for v in VALUES[var] if v != first[var]])
    said = ", ".join(first[var] for var in variables)
    news = " and ".join(second[var] for var in changed)
    periods = [
        {
            "period_start": None,
            "period_end": "2024-01-28",
            "period_summary": "period 0",
            "sessions": [
                {
                    "event": None,
                    "exposed_states": first,
                    "query": f"Some news about me: {said}.",
                    "session_time": "2024-01-05",
                }
            ],
            "state": first,
            "updates": {var: {"old": None, "new": first[var]} for var in variables},
            "update_cnts": dict.fromkeys(variables, 1),
        },
        {
            "period_start": "2024-02-01",
            "period_end": "2024-03-28",
            "period_summary": "period 1",
            "sessions": [
                {
                    "event": None,
                    "exposed_states": {var: second[var] for var in changed},
                    "query": f"Things changed: now it is {news}.",
                    "session_time": "2024-02-05",
                }
            ],
            "state": second,
            "updates": {var: {"old": first[var], "new": second[var]} for var in changed},
            "update_cnts": dict.fromkeys(changed, 1),
        },
    ]
    seen = {first[var] for var in variables} | {second[var] for var in variables}
    qas = []
    for number, var in enumerate(variables, start=1):
        # Options in a per-user order, so that the right answer is not always "1".
        options = list(VALUES[var])
        rng.shuffle(options)
        qas.append(
            {
                "query": f"Quick check {number}: which one is true for me right now?",
                "required_info": [var],
                "answer_choices": [
                    {
                        "state": [value],
                        "answer": value,
                        "type": "experience" if value in seen else "random",
                    }
                    for value in options
                ],
            }
        )
    return {
        "id": user_id,
        "start_time": "2024-01-01",
        "user_profile": f"{user_id} likes long walks.",
        "state_schema": {var: VALUES[var] for var in variables},
        "periods": periods,
        "qas": qas,
    }


def environment() -> Environment:
    users = [
        make_user(user_id, [DOMAINS[NAMES[0]][0][0], *(DOMAINS[NAMES[d]][0][0] for d in pair)])
        for user_id, pair in zip(TRAIN, TRAIN_DOMAINS, strict=True)
    ] + [
        make_user(user_id, [DOMAINS[NAMES[0]][1][0], *(DOMAINS[NAMES[d]][1][0] for d in pair)])
        for user_id, pair in zip(HELDOUT, HELDOUT_DOMAINS, strict=True)
    ]
    env = Environment.from_original(users)
    assert env.problems() == []
    return env


def _types(system: str) -> str:
    _, header, types = system.partition(TYPES_HEADER)
    return types.lower() if header else ""


def _latest(text: str, options_text: str) -> int:
    """The option whose value appears last in `text`; 1 when none appears."""
    lowered = text.lower()
    options = [re.sub(r"^\d+[.:]\s*", "", line).strip() for line in options_text.splitlines()]
    positions = [lowered.rfind(option.lower()) if option else -1 for option in options]
    best = max(range(len(options)), key=lambda i: positions[i], default=0)
    return best + 1 if positions and positions[best] >= 0 else 1


def agent(call: ScriptedCall) -> dict[str, Any]:
    fields, inputs = output_fields(call.system), sections(call.user)
    if "choice" in fields:
        known = inputs.get("known_state", inputs.get("current_state"))
        source = known if known is not None else inputs.get("memory", "")
        return {"choice": _latest(source, inputs.get("options", ""))}
    if "updates" in fields:
        types, text = _types(call.system), inputs.get("messages", "").lower()
        updates = []
        for var, values in VALUES.items():
            if DOMAIN_OF[var] not in types:
                continue
            found = [(text.rfind(value), value) for value in values if value in text]
            if found:
                updates.append({"label": var, "value": max(found)[1]})
        return {"updates": updates}
    return {name: "Noted." for name in fields}


def reflector(call: ScriptedCall) -> dict[str, Any]:
    inputs = sections(call.user)
    current = inputs.get("current_text", "").strip()
    feedback = inputs.get("feedback", "")
    named = dict.fromkeys(DOMAIN_OF[var] for var in VALUES if re.search(rf"\b{var}\b", feedback))
    missing = [domain for domain in named if domain not in current.lower()]
    if missing:
        return {"new_text": "\n".join([current, *(f"- {domain}" for domain in missing)])}
    # Nothing to learn from: a random edit, reproducible from the proposal's seed.
    rng = random.Random(call.settings.get("seed"))
    lines = current.splitlines() or [""]
    unused = [d for d in VOCABULARY if d not in current.lower()] or VOCABULARY
    draw = rng.random()
    if draw < 0.5 or len(lines) == 1:
        lines.append(f"- {rng.choice(unused)}")
    elif draw < 0.75:
        lines.pop(rng.randrange(len(lines)))
    else:
        lines[rng.randrange(len(lines))] = f"- {rng.choice(unused)}"
    return {"new_text": "\n".join(lines)}


class NoiseWorld:
    """The environment, scripted LMs (with call logs) and the base policy."""

    def __init__(self) -> None:
        self.environment = environment()
        self.reflector = ScriptedLM(reflector, model="reflector-model")
        self.lms = scripted_role_lms(
            simulator=lambda call: user_turn("Thanks, tell me more."),
            agent=ScriptedLM(agent, model="agent-model"),
            reflector=self.reflector,
        )
        policy = memory_policies.create_policy(
            "in_context", {"update_every": 1, "short_term_len": 0}
        )
        self.base = policy.with_components({"write.types_to_remember": BASE_TYPES})
