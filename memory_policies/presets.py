"""Named presets: which information flow a policy follows.

- ``evolve`` (default): this toolkit's prompts (DSPy JSON fields, short replies, our top-k).
- ``paper``: what each role sees in the AMemGym reference code (raw chat turns, no reply cap,
  the multiple-choice prompt answered as a JSON number, the original's memory types, top-k 30,
  mem0-style two-step writes, one RAG memory per message). The wording is our own.

Every choice that differs between the two is a field of `PresetRules`, read by the policies
through ``policy.rules`` (``preset_rules(policy.preset)``): no policy compares a preset name.
A new difference is a new field (at the end) with a value for each preset and a comment
saying why.

A leaf module: no other `memory_policies` import, so every module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from memory_policies.errors import PolicyError

Preset = Literal["paper", "evolve"]
PRESETS: tuple[str, ...] = get_args(Preset)
DEFAULT_PRESET: Preset = "evolve"


@dataclass(frozen=True)
class PresetRules:
    """What one preset decides on the policy side. One instance per preset; look it up with
    `preset_rules`."""

    name: Preset
    # The agent talks to its LM in raw chat turns (a system message with the instruction and
    # the memory, the recent messages as user/assistant turns, no reply cap) and is asked a
    # multiple-choice question as one user message answered with a JSON number, as the
    # reference agents are; otherwise DSPy fields (a rendered transcript) with the reply cap.
    # Kinds whose reference sends no system message (native) then have nothing to evolve.
    chat_turns: bool
    # Numeric defaults of the reference configs (each kind's `paper_parameters`, e.g. top_k
    # 30) replace the kind's own defaults.
    reference_defaults: bool
    # Memory writes follow the reference's procedures (in_context: a JSON label -> value
    # object with the original's 7 types; external: mem0's extraction then events; raw_rag:
    # one memory per message). A kind with no reference counterpart refuses the preset.
    reference_writes: bool
    # Retrieval searches with the message as sent (time header and, for a question, the
    # options included), as the reference does; ours strips the time header (noise for a
    # similarity search).
    search_with_message_as_sent: bool
    # Memory reaches the prompt as plain ``- text`` lines, empty when nothing was found (the
    # reference's); ours prefixes each line with its write time and says when nothing is there.
    plain_memory_lines: bool
    # The preset's own multiple-choice prompt already asks for the option fitting the user's
    # current situation, so an evaluator adds no hint of its own (it would be said twice).
    question_asks_for_current_situation: bool


PAPER = PresetRules(
    name="paper",
    chat_turns=True,
    reference_defaults=True,
    reference_writes=True,
    search_with_message_as_sent=True,
    plain_memory_lines=True,
    question_asks_for_current_situation=True,
)
EVOLVE = PresetRules(
    name="evolve",
    chat_turns=False,
    reference_defaults=False,
    reference_writes=False,
    search_with_message_as_sent=False,
    plain_memory_lines=False,
    question_asks_for_current_situation=False,
)
_RULES: dict[str, PresetRules] = {rules.name: rules for rules in (PAPER, EVOLVE)}


def is_preset(value: object) -> bool:
    """Whether `value` names a preset (validation; behaviour reads `PresetRules` fields)."""
    return value in PRESETS


def check_preset(kind: str, value: object) -> Preset:
    """`value` as a preset name, or a PolicyError naming the valid ones."""
    if not is_preset(value):
        raise PolicyError(
            f"preset of policy '{kind}' must be one of {', '.join(PRESETS)}, got {value!r} "
            f"(e.g. '{kind}:preset=paper')"
        )
    return value  # type: ignore[return-value]


def preset_rules(preset: str) -> PresetRules:
    """The rules of a preset by name; a PolicyError naming the valid ones otherwise."""
    try:
        return _RULES[preset]
    except KeyError:
        raise PolicyError(
            f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}"
        ) from None
