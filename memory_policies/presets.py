"""Named presets: which information flow a policy follows.

- ``evolve`` (default): this toolkit's prompts (DSPy JSON fields, short replies, our top-k).
- ``paper``: what each role sees in the AMemGym reference code (raw chat turns, no reply cap,
  the multiple-choice prompt answered as a JSON number, the original's memory types, top-k 30,
  mem0-style two-step writes, one RAG memory per message). The wording is our own.

A leaf module: no other `memory_policies` import, so every module can use it.
"""

from __future__ import annotations

from typing import Literal, get_args

from memory_policies.errors import PolicyError

Preset = Literal["paper", "evolve"]
PRESETS: tuple[str, ...] = get_args(Preset)
DEFAULT_PRESET: Preset = "evolve"


def check_preset(kind: str, value: object) -> Preset:
    """`value` as a preset name, or a PolicyError naming the valid ones."""
    if value not in PRESETS:
        raise PolicyError(
            f"preset of policy '{kind}' must be one of {', '.join(PRESETS)}, got {value!r} "
            f"(e.g. '{kind}:preset=paper')"
        )
    return value  # type: ignore[return-value]
