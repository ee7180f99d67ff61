"""A small hand-made environment and scripted LMs whose answers follow the conversation.

The scripted agent answers a multiple-choice call by picking the option whose words were
mentioned LAST in the prompt's conversation, so a full-history policy recalls the latest
value of each variable: results are meaningful, not constant.
"""

from __future__ import annotations

import re
from typing import Any

from scripted_lm import user_turn

from evolve.simulator.environment import Environment

SCHEMA = {
    "diet": ["vegan", "omnivore", "keto"],
    "city": ["Paris", "Oslo", "Rome"],
    "pet": ["cat", "dog", "parrot"],
}

# Per period: full state, updates (var -> old/new), sessions (time, exposed, query).
_TRAJECTORY = [
    (
        {"diet": "vegan", "city": "Paris", "pet": "cat"},
        {"diet": (None, "vegan"), "city": (None, "Paris"), "pet": (None, "cat")},
        [
            (
                "2024-01-05",
                {"diet": "vegan", "city": "Paris"},
                "I eat vegan here in Paris. Dinner ideas?",
            ),
            ("2024-01-20", {"pet": "cat"}, "My cat scratches the sofa. What should I do?"),
        ],
    ),
    (
        {"diet": "keto", "city": "Paris", "pet": "cat"},
        {"diet": ("vegan", "keto")},
        [("2024-03-02", {"diet": "keto"}, "I switched to keto last week. Breakfast ideas?")],
    ),
    (
        {"diet": "keto", "city": "Oslo", "pet": "cat"},
        {"city": ("Paris", "Oslo")},
        [("2024-05-11", {"city": "Oslo"}, "I just moved to Oslo. Where can I go running?")],
    ),
]

_QAS = [
    {
        "query": "Can you suggest a dinner recipe for me?",
        "required_info": ["diet"],
        "answer_choices": [
            {"state": ["vegan"], "answer": "A vegan lentil stew", "type": "experience"},
            {"state": ["omnivore"], "answer": "A omnivore roast chicken", "type": "random"},
            {"state": ["keto"], "answer": "A keto salmon plate", "type": "experience"},
        ],
    },
    {
        "query": "Plan a weekend activity with my pet near home.",
        "required_info": ["city", "pet"],
        "answer_choices": [
            {"state": ["Paris", "cat"], "answer": "Paris cat cafe visit", "type": "experience"},
            {"state": ["Oslo", "cat"], "answer": "Oslo cat museum", "type": "experience"},
            {"state": ["Rome", "dog"], "answer": "Rome dog park", "type": "random"},
        ],
    },
]


def make_item(item_id: str, periods: int = 3) -> dict[str, Any]:
    out_periods = []
    for index, (state, updates, sessions) in enumerate(_TRAJECTORY[:periods]):
        out_periods.append(
            {
                "period_start": None if index == 0 else f"2024-0{2 * index}-01",
                "period_end": f"2024-0{2 * index + 1}-28",
                "period_summary": f"period {index}",
                "sessions": [
                    {
                        "event": None,
                        "exposed_states": exposed,
                        "query": f"{query} ({item_id})",
                        "session_time": time,
                    }
                    for time, exposed, query in sessions
                ],
                "state": dict(state),
                "updates": {var: {"old": old, "new": new} for var, (old, new) in updates.items()},
                "update_cnts": {var: 1 for var in updates},
            }
        )
    return {
        "id": item_id,
        "start_time": "2024-01-01",
        "user_profile": {"formatted_str": f"{item_id} is a 34-year-old nurse who likes hiking."},
        "state_schema": SCHEMA,
        "periods": out_periods,
        "qas": _QAS,
    }


def make_environment(users: int = 2, periods: int = 3) -> Environment:
    env = Environment.from_original([make_item(f"user-{i}", periods) for i in range(users)])
    assert env.problems() == [], env.problems()
    return env


# ----- scripted responders ------------------------------------------------------------------

_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.S)


def sections(text: str) -> dict[str, str]:
    return {name: body for name, body in _SECTION.findall(text)}


def output_fields(system: str) -> list[str]:
    part = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    return re.findall(r"\d+\. `(\w+)`", part)


def latest_mention_choice(conversation: str, options_text: str) -> int:
    """1-based option whose words appear latest in the conversation (ties: lowest index)."""
    lowered = conversation.lower()
    options = [re.sub(r"^\d+\.\s*", "", line) for line in options_text.strip().splitlines()]
    best, best_position = 1, -2
    for index, option in enumerate(options, start=1):
        words = [w for w in re.findall(r"[a-z]+", option.lower()) if len(w) >= 3]
        position = max((lowered.rfind(w) for w in words), default=-1)
        if position > best_position:
            best, best_position = index, position
    return best


def agent_responder(call) -> dict[str, Any] | str:
    fields = output_fields(call.system)
    inputs = sections(call.user)
    if "choice" in fields:
        return {"choice": latest_mention_choice(inputs.get("conversation", ""), inputs["options"])}
    # Memory-writing policies get "no update" (a valid, empty list) for their list outputs.
    return {name: [] if name in ("updates", "operations") else "Noted, thanks." for name in fields}


def simulator_responder(call) -> dict[str, Any]:
    topic = sections(call.user).get("your_request", "")
    return user_turn(f"Thanks. Any other tips about {topic.split('.')[0][:40].lower()}?")


def is_choice_call(call) -> bool:
    return "choice" in output_fields(call.system)


def question_of(call) -> str:
    return sections(call.user).get("question", "")
