"""A scripted simulator that plays every stage of the LLM synthesis pipeline correctly,
with knobs that make chosen stages misbehave (to drive retry, refinement and exclusion)."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from scripted_lm import ScriptedCall

from evolve.simulator.synthesis import LLMSynthesisConfig, synthesis_config_from_dict

# Stage of each signature, keyed by its (unique) first output field.
SIGNATURE_OF_OUTPUT = {
    "name": "profile",
    "questions": "questions",
    "variables": "group",
    "unified": "unify",
    "initial_state": "initial",
    "period_summary": "update",
    "events": "events",
    "answers": "answers",
    "option": "match",
    "refined_answer": "refine_answer",
    "queries": "queries",
    "inferred": "infer",
    "refined_query": "refine_query",
}

# Two questions whose info types overlap (work_mode / remote_work), so that the schema stage
# merges them into one variable and unifies its options.
QUESTIONS = [
    {
        "question": "How should I organise my workweek?",
        "required_info": [
            {"info_type": "work_mode", "info_choices": ["office", "hybrid", "remote"]},
            {"info_type": "budget_level", "info_choices": ["tight", "moderate", "generous"]},
        ],
    },
    {
        "question": "What exercise routine suits me?",
        "required_info": [
            {"info_type": "remote_work", "info_choices": ["onsite", "remote"]},
            {"info_type": "fitness_level", "info_choices": ["beginner", "active", "athlete"]},
        ],
    },
]
GROUPS = [
    {"name": "work_setup", "merges": ["work_mode", "remote_work"]},
    {"name": "budget", "merges": ["budget_level"]},
    {"name": "fitness", "merges": ["fitness_level"]},
]
UNIFIED = [{"name": "work_setup", "options": ["office", "hybrid", "remote"]}]


def small_config(**overrides: Any) -> LLMSynthesisConfig:
    data: dict[str, Any] = {
        "name": "test",
        "num_periods": 2,
        "num_questions": 2,
        "states_per_question": 2,
        "choices_per_state": [2, 3],
        "changes_per_period": [1, 2],
        "max_changes_per_state": 2,
        "min_state_variants": 3,
        "period_length": 1,
        "num_users": 1,
        "workers": 1,
        "retries": {"stage_attempts": 2, "answer_refinements": 1, "query_refinements": 1},
    }
    data.update(overrides)
    return synthesis_config_from_dict(data)


def output_fields(call: ScriptedCall) -> list[str]:
    section = call.system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    return re.findall(r"\d+\. `(\w+)`", section)


def input_fields(call: ScriptedCall) -> dict[str, str]:
    parts = re.split(r"\[\[ ## (\w+) ## \]\]\n", call.user)
    fields = {}
    for name, value in zip(parts[1::2], parts[2::2], strict=True):
        fields[name] = value.split("\n\nRespond with", 1)[0].strip()
    return fields


def stage_of(call: ScriptedCall) -> str:
    return SIGNATURE_OF_OUTPUT[output_fields(call)[0]]


def _option_lines(text: str) -> dict[str, list[str]]:
    options = {}
    for line in text.splitlines():
        match = re.match(r"- (\w+): (.*)", line)
        if match:
            options[match.group(1)] = [o.strip() for o in match.group(2).split("|")]
    return options


def _numbered(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^\d+\. (.*)$", text, re.MULTILINE)]


class PipelinePlayer:
    """Callable responder; `overrides[stage]` may return a reply (or raise) instead."""

    def __init__(self, overrides: dict[str, Callable[[ScriptedCall, int], Any]] | None = None):
        self.overrides = overrides or {}
        self.counts: Counter[str] = Counter()
        self.calls: list[tuple[str, ScriptedCall]] = []
        self.lock = threading.Lock()

    def __call__(self, call: ScriptedCall) -> dict[str, Any] | str:
        stage = stage_of(call)
        with self.lock:
            self.counts[stage] += 1
            seen = self.counts[stage]
            self.calls.append((stage, call))
        override = self.overrides.get(stage)
        if override is not None:
            reply = override(call, seen)
            if reply is not None:
                return reply
        return getattr(self, f"_{stage}")(input_fields(call))

    def prompts(self, stage: str) -> list[str]:
        return [call.user for name, call in self.calls if name == stage]

    # --- correct behaviour of every stage -----------------------------------------------

    def _profile(self, fields: dict[str, str]) -> dict[str, Any]:
        extra = fields["extra_info"]
        name = extra.split("persona: ", 1)[-1].split(". ", 1)[0].strip()
        return {"name": name, "summary": f"A short summary of {name}."}

    def _questions(self, fields: dict[str, str]) -> dict[str, Any]:
        return {"questions": QUESTIONS}

    def _group(self, fields: dict[str, str]) -> dict[str, Any]:
        return {"variables": GROUPS}

    def _unify(self, fields: dict[str, str]) -> dict[str, Any]:
        return {"unified": UNIFIED}

    def _initial(self, fields: dict[str, str]) -> dict[str, Any]:
        options = _option_lines(fields["variables"])
        return {"initial_state": {var: values[0] for var, values in options.items()}}

    def _update(self, fields: dict[str, str]) -> dict[str, Any]:
        """Change the least-changed variable to its next option."""
        rows = []
        for line in fields["variables"].splitlines():
            match = re.match(
                r"- (\w+): now (\w+); options (.*); changed (\d+) of at most (\d+)", line
            )
            if match:
                var, now, options, count, limit = match.groups()
                rows.append((int(count), var, now, [o.strip() for o in options.split("|")]))
        rows = [row for row in rows if row[0] < int(limit)]
        _, var, now, options = min(rows)
        new = options[(options.index(now) + 1) % len(options)]
        return {
            "period_summary": f"{var} moved on.",
            "changes": [{"variable": var, "new_value": new}],
        }

    def _events(self, fields: dict[str, str]) -> dict[str, Any]:
        changed = re.findall(r"^- (\w+): ", fields["changes"], re.MULTILINE)
        return {"events": [{"variables": [var], "event": f"Life moved on ({i})."}
                           for i, var in enumerate(changed)]}  # fmt: skip

    def _answers(self, fields: dict[str, str]) -> dict[str, Any]:
        return {"answers": [f"Advice for {line}" for line in _numbered(fields["variants"])]}

    def _match(self, fields: dict[str, str]) -> dict[str, Any]:
        situations = _numbered(fields["situations"])
        target = fields["answer"].removeprefix("Advice for ")
        return {"option": situations.index(target) + 1 if target in situations else 1}

    def _refine_answer(self, fields: dict[str, str]) -> dict[str, Any]:
        return {"refined_answer": f"Advice for {fields['target']}"}

    def _queries(self, fields: dict[str, str]) -> dict[str, Any]:
        queries = []
        for line in _numbered(fields["sessions"]):
            reveal = line.split("reveal: ", 1)[1]
            values = re.findall(r"\w+ = (\w+)", reveal)
            queries.append(f"Can you help? Things are {' and '.join(values)} for me now.")
        return {"queries": queries}

    def _infer(self, fields: dict[str, str]) -> dict[str, Any]:
        words = set(re.findall(r"\w+", fields["message"]))
        options = _option_lines(fields["variables"])
        return {
            "inferred": {
                var: next((value for value in values if value in words), values[0])
                for var, values in options.items()
            }
        }

    def _refine_query(self, fields: dict[str, str]) -> dict[str, Any]:
        intended = fields["reveal"].split("intended: ", 1)[1]
        values = re.findall(r"\w+ = (\w+)", intended)
        return {"refined_query": f"Could you advise me? I am {' and '.join(values)} these days."}


def wrong_match(call: ScriptedCall, seen: int) -> dict[str, Any]:
    """A classifier that always picks a situation other than the answer's own."""
    fields = input_fields(call)
    situations = _numbered(fields["situations"])
    target = fields["answer"].removeprefix("Advice for ")
    right = situations.index(target) + 1 if target in situations else 1
    return {"option": 1 if right != 1 else 2}
