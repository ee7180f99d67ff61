"""Scripted world for optimizer tests: an environment whose messages name values verbatim,
an agent that answers well only when its `use` instruction holds a marker word, and a
reflector that introduces the marker.

- write: stores every schema value the messages mention (label = variable); when
  `write_needs_marker` is set it stores nothing unless the write instruction holds the marker.
- choice (questions and probes): with the marker in the instruction, the option whose words
  appear latest in memory + conversation (right whenever memory is up to date); without it,
  always option 1 (right only by chance).
- reflector: appends the marker sentence to `current_text` (unchanged if already there).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

from scripted_lm import ScriptedLM, scripted_role_lms, user_turn

from evolve.simulator.environment import Environment, save_environment

MARKER = "MARKERWORD"
MARKER_SENTENCE = f"{MARKER}: always answer from the most recent memory."

SCHEMA = {
    "diet": ["vegan", "omnivore", "keto"],
    "city": ["Paris", "Oslo", "Rome"],
    "pet": ["cat", "dog", "parrot"],
}

# Per period: state, updates (var -> (old, new)), sessions (time, exposed, query).
TRAJECTORY = [
    (
        {"diet": "omnivore", "city": "Paris", "pet": "cat"},
        {"diet": (None, "omnivore"), "city": (None, "Paris"), "pet": (None, "cat")},
        [
            ("2024-01-05", {"diet": "omnivore", "city": "Paris"}, "I eat omnivore food in Paris."),
            ("2024-01-20", {"pet": "cat"}, "My cat scratches the sofa."),
        ],
    ),
    (
        {"diet": "keto", "city": "Paris", "pet": "cat"},
        {"diet": ("omnivore", "keto")},
        [("2024-03-02", {"diet": "keto"}, "I switched to keto last week.")],
    ),
    (
        {"diet": "keto", "city": "Oslo", "pet": "dog"},
        {"city": ("Paris", "Oslo"), "pet": ("cat", "dog")},
        [("2024-05-11", {"city": "Oslo", "pet": "dog"}, "I moved to Oslo with my new dog.")],
    ),
]

QAS = [
    {
        "query": "Can you suggest a dinner recipe for me?",
        "required_info": ["diet"],
        "answer_choices": [
            {"state": ["vegan"], "answer": "A vegan lentil stew", "type": "random"},
            {"state": ["omnivore"], "answer": "An omnivore roast chicken", "type": "experience"},
            {"state": ["keto"], "answer": "A keto salmon plate", "type": "experience"},
        ],
    },
    {
        "query": "Plan a weekend activity with my pet near home.",
        "required_info": ["city", "pet"],
        "answer_choices": [
            {"state": ["Rome", "parrot"], "answer": "Rome parrot show", "type": "random"},
            {"state": ["Paris", "cat"], "answer": "Paris cat cafe visit", "type": "experience"},
            {"state": ["Oslo", "dog"], "answer": "Oslo dog park walk", "type": "experience"},
        ],
    },
]


def make_item(item_id: str) -> dict[str, Any]:
    periods = []
    for index, (state, updates, sessions) in enumerate(TRAJECTORY):
        periods.append(
            {
                "period_start": None if index == 0 else f"2024-0{2 * index}-01",
                "period_end": f"2024-0{2 * index + 1}-28",
                "period_summary": f"period {index}",
                "sessions": [
                    {"event": None, "exposed_states": exposed, "query": query, "session_time": t}
                    for t, exposed, query in sessions
                ],
                "state": dict(state),
                "updates": {var: {"old": old, "new": new} for var, (old, new) in updates.items()},
                "update_cnts": {var: 1 for var in updates},
            }
        )
    return {
        "id": item_id,
        "start_time": "2024-01-01",
        "user_profile": f"{item_id} is a nurse who likes hiking.",
        "state_schema": SCHEMA,
        "periods": periods,
        "qas": QAS,
    }


def write_environment(path: Path, users: int = 4) -> Path:
    env = Environment.from_original([make_item(f"user-{i}") for i in range(users)])
    assert env.problems() == []
    save_environment(env, path)
    return path


_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.S)


def sections(text: str) -> dict[str, str]:
    return dict(_SECTION.findall(text))


def output_fields(system: str) -> list[str]:
    part = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    return re.findall(r"\d+\. `(\w+)`", part)


def _latest_option(text: str, options_text: str) -> int:
    lowered = text.lower()
    options = [re.sub(r"^\d+[.:]\s*", "", line) for line in options_text.strip().splitlines()]
    best, best_position = 1, -2
    for index, option in enumerate(options, start=1):
        words = [w for w in re.findall(r"[a-z]+", option.lower()) if len(w) >= 3]
        position = max((lowered.rfind(w) for w in words), default=-1)
        if position > best_position:
            best, best_position = index, position
    return best


def make_agent(write_needs_marker: bool = False):
    def agent(call) -> dict[str, Any] | str:
        fields = output_fields(call.system)
        inputs = sections(call.user)
        # The upper bound: the state is given (`known_state`; `current_state` under paper).
        state = inputs.get("known_state", inputs.get("current_state"))
        if "choice" in fields and state is not None:
            return {"choice": _latest_option(state, inputs["options"])}
        if "choice" in fields:
            if MARKER in call.system:
                context = inputs.get("memory", "") + "\n" + inputs.get("conversation", "")
                return {"choice": _latest_option(context, inputs["options"])}
            return {"choice": 1}
        if "updates" in fields:
            if write_needs_marker and MARKER not in call.system:
                return {"updates": []}
            text = inputs.get("messages", "").lower()
            updates = []
            for variable, values in SCHEMA.items():
                found = [(text.rfind(v.lower()), v) for v in values if v.lower() in text]
                if found:
                    updates.append({"label": variable, "value": max(found)[1]})
            return {"updates": updates}
        return {name: "Noted." for name in fields}

    return agent


def reflector(call) -> dict[str, Any]:
    current = sections(call.user).get("current_text", "").strip()
    if MARKER in current:
        return {"new_text": current}
    return {"new_text": f"{current} {MARKER_SENTENCE}"}


class World:
    """Scripted LMs with their call logs."""

    def __init__(self, agent=None, reflect=reflector, simulator=None):
        self.agent = ScriptedLM(agent or make_agent(), model="agent-model")
        self.reflector = ScriptedLM(reflect, model="reflector-model")
        self.simulator = ScriptedLM(
            simulator or (lambda call: user_turn("Thanks, tell me more.")),
            model="simulator-model",
        )
        self.lms = scripted_role_lms(
            simulator=self.simulator, agent=self.agent, reflector=self.reflector
        )

    def calls(self) -> dict[str, int]:
        return {
            "agent": len(self.agent.calls),
            "reflector": len(self.reflector.calls),
            "simulator": len(self.simulator.calls),
        }


def write_spec(directory: Path, body: str = "", *, name: str = "exp", **tables: str) -> Path:
    """A spec file next to an environment file; `tables` replace the default tables."""
    env_file = write_environment(directory / "env.json")
    defaults = {
        "environment": f"""
            file = "{env_file.name}"
            train_users = 2
            heldout_users = 1
        """,
        "policy": """
            kind = "in_context"
            parameters = { update_every = 2, short_term_len = 2 }
        """,
        "optimizer": """
            generations = 2
            reflection_minibatch_size = 2
            mutate_components = ["write.types_to_remember", "use"]
        """,
        "tracking": "enabled = false",
    }
    defaults.update(tables)
    text = f'name = "{name}"\nseed = 7\nconcurrency = 1\n{textwrap.dedent(body)}\n'
    for table, content in defaults.items():
        text += f"\n[{table}]\n{textwrap.dedent(content).strip()}\n"
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


# The reference-style reflector request (protocol paper): an empty system message, then one
# user message holding the current text and the feedback (evolve.optimize.reflect).
_REFERENCE_REFLECTION = re.compile(
    r"^Here is [^\n]*:\n\n(?P<current_text>.*)\n\nFeedback from its recent use:\n"
    r"(?P<feedback>.*)\n\nRevise it using the feedback",
    re.S,
)


def reflector_inputs(call: Any) -> dict[str, str] | None:
    """`current_text` and `feedback` of a reflector call under either prompt (the hinted DSPy
    signature, or the reference-style request), or None for any other call."""
    if "new_text" in output_fields(call.system):
        fields = sections(call.user)
        return {"current_text": fields.get("current_text", ""), "feedback": fields["feedback"]}
    first = call.messages[0] if call.messages else {}
    if first.get("role") == "system" and first.get("content") == "":
        match = _REFERENCE_REFLECTION.match(call.user)
        if match:
            return match.groupdict()
    return None
