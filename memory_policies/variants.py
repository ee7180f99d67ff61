"""Policy variants: which information flow a policy follows.

- ``evolve`` (default): this toolkit's prompts (DSPy JSON fields, short replies, our top-k).
- ``paper``: what each role sees in the AMemGym reference code (raw chat turns, no reply cap,
  the multiple-choice prompt answered as a JSON number, the original's memory types, top-k 30,
  mem0-style two-step writes, one RAG memory per message). The wording is our own.

Every choice that differs between the two is a field of `VariantRules`, read by the policies
through ``policy.rules`` (``variant_rules(policy.variant)``): no policy compares a variant
name. A new difference is a new field (at the end) with a value for each variant and a
comment saying why.

A run's protocol picks the variant of a policy spec that names none (`variant=paper` under
protocol paper); the word "preset" is the environment's (`--preset tiny`).

A leaf module: no `memory_policies` import but the errors, so every module can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from memory_policies.errors import PolicyError

Variant = Literal["paper", "evolve"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)
# The write procedures a kind may offer, one per variant (see `memory_policies.writes`).
WriteProcedure = Literal["reference", "own"]
DEFAULT_VARIANT: Variant = "evolve"


@dataclass(frozen=True)
class VariantRules:
    """What one variant decides on the policy side. One instance per variant; look it up with
    `variant_rules`."""

    name: Variant
    # The agent talks to its LM in raw chat turns (a system message with the instruction and
    # the memory, the recent messages as user/assistant turns, no reply cap) and is asked a
    # multiple-choice question as one user message answered with a JSON number, as the
    # reference agents are; otherwise DSPy fields (a rendered transcript) with the reply cap.
    # Kinds whose reference sends no system message (native) then have nothing to evolve.
    chat_turns: bool
    # Numeric defaults of the reference configs (each kind's `paper_parameters`, e.g. top_k
    # 30) replace the kind's own defaults.
    reference_defaults: bool
    # Which write strategy of a kind runs (`memory_policies.writes`): "reference", the
    # reference's procedures (in_context: a JSON label -> value object with the original's 7
    # types; external: mem0's extraction then events; raw_rag: one memory per message), or
    # "own". A kind with no reference counterpart refuses the variant.
    writes: WriteProcedure
    # Retrieval searches with the message as sent (time header and, for a question, the
    # options included), as the reference does; ours strips the time header (noise for a
    # similarity search).
    search_with_message_as_sent: bool
    # Memory reaches the prompt as plain ``- text`` lines, empty when nothing was found (the
    # reference's); ours prefixes each line with its write time and says when nothing is there.
    plain_memory_lines: bool
    # The variant's own multiple-choice prompt already asks for the option fitting the user's
    # current situation, so an evaluator adds no hint of its own (it would be said twice).
    question_asks_for_current_situation: bool


PAPER = VariantRules(
    name="paper",
    chat_turns=True,
    reference_defaults=True,
    writes="reference",
    search_with_message_as_sent=True,
    plain_memory_lines=True,
    question_asks_for_current_situation=True,
)
EVOLVE = VariantRules(
    name="evolve",
    chat_turns=False,
    reference_defaults=False,
    writes="own",
    search_with_message_as_sent=False,
    plain_memory_lines=False,
    question_asks_for_current_situation=False,
)
_RULES: dict[str, VariantRules] = {rules.name: rules for rules in (PAPER, EVOLVE)}


def is_variant(value: object) -> bool:
    """Whether `value` names a variant (validation; behaviour reads `VariantRules` fields)."""
    return value in VARIANTS


def check_variant(kind: str, value: object) -> Variant:
    """`value` as a variant name, or a PolicyError naming the valid ones."""
    if not is_variant(value):
        raise PolicyError(
            f"variant of policy '{kind}' must be one of {', '.join(VARIANTS)}, got {value!r} "
            f"(e.g. '{kind}:variant=paper')"
        )
    return value  # type: ignore[return-value]


def check_supported(kind: str, variant: Variant, supported: tuple[Variant, ...]) -> Variant:
    """`variant` when a policy of `kind` supports it, else a PolicyError naming the ones it
    does (raised when the policy is built, before any LLM call)."""
    if variant not in supported:
        raise PolicyError(
            f"policy kind '{kind}' has no {variant} variant (it supports: "
            f"{', '.join(supported)}); name one, e.g. '{kind}:variant={supported[0]}'"
        )
    return variant


def variant_rules(variant: str) -> VariantRules:
    """The rules of a variant by name; a PolicyError naming the valid ones otherwise."""
    try:
        return _RULES[variant]
    except KeyError:
        raise PolicyError(
            f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}"
        ) from None


def renamed_option_error(kind: str, value: object) -> PolicyError:
    """The error for the option 'preset', the name 'variant' had before the first release."""
    return PolicyError(
        f"policy '{kind}' is given the option 'preset' ({value!r}); it is now called "
        f"'variant': write '{kind}:variant={value}'"
    )


def pop_variant(kind: str, options: dict[str, Any], variant: str | None = None) -> str | None:
    """The variant a policy of `kind` is given, taken out of its `options`: `variant` (an
    argument) or ``options["variant"]``; None when neither is set. Two different values are a
    PolicyError, and so is the old option name ``preset``."""
    if "preset" in options:
        raise renamed_option_error(kind, options["preset"])
    given = {value for value in (variant, options.pop("variant", None)) if value is not None}
    if len(given) > 1:
        raise PolicyError(
            f"policy '{kind}' is given variants {', '.join(map(repr, sorted(given)))}; give "
            "one (e.g. variant=paper)"
        )
    return given.pop() if given else None
