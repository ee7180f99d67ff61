"""The numeric parameters of a memory policy: their valid ranges and meanings, and the one
check every policy kind (and the specs that set them) applies.

`PARAMETER_RULES` holds the shared parameters; a policy kind with a parameter of its own
declares its rule on the class (`MemoryPolicy.parameter_rules`), merged over the shared ones
by `MemoryPolicy.parameter_table()`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memory_policies.errors import PolicyError


class ParameterRule(NamedTuple):
    """The valid range (inclusive), meaning and short name (for file names and plot labels,
    e.g. `ue4-stl0`) of one numeric policy parameter."""

    low: int
    high: int
    meaning: str
    short: str = ""

    def describe(self, name: str) -> str:
        return f"{name} ({self.low}..{self.high}: {self.meaning})"


# The upper bounds are documented maxima, not tuning advice: a policy runs outside any
# environment (an exported bundle in a user's app), so it cannot bound by an episode's length.
# 1000 messages is several times the longest AMemGym episode (158 messages for the longest
# user of a generated v1.base), so a larger value is a typo (update_every =
# 99999999999999999999 would silently never write memory), not a setting.
PARAMETER_MAX = 1000
PARAMETER_RULES: dict[str, ParameterRule] = {
    "update_every": ParameterRule(
        1, PARAMETER_MAX, "messages sent to `write` per memory update (paper: update_bsz)", "ue"
    ),
    "short_term_len": ParameterRule(
        0, PARAMETER_MAX, "recent messages kept verbatim in context (paper: local_length)", "stl"
    ),
    "top_k": ParameterRule(1, PARAMETER_MAX, "memories retrieved per read", "k"),
}


def short_name(name: str) -> str:
    """A parameter's short name (its rule's `short`); a parameter without one keeps its name."""
    rule = PARAMETER_RULES.get(name)
    return rule.short if rule is not None and rule.short else name


def parameter_problem(name: str, value: int, rule: ParameterRule | None = None) -> str | None:
    """Why `value` is not valid for the numeric parameter `name` (under `rule`, by default the
    shared one), or None when it is."""
    rule = PARAMETER_RULES[name] if rule is None else rule
    if rule.low <= value <= rule.high:
        return None
    side = f"at least {rule.low}" if value < rule.low else f"at most {rule.high}"
    return f"must be {side} ({rule.meaning}; valid {rule.low}..{rule.high}), got {value}"


def describe_parameters(rules: Mapping[str, ParameterRule]) -> str:
    """The parameters of a kind, for an error message: name (range: meaning), ..."""
    return ", ".join(rule.describe(name) for name, rule in rules.items()) or "none"


def merged_rules(
    kind: str, names: Sequence[str], own: Mapping[str, ParameterRule]
) -> dict[str, ParameterRule]:
    """The rule of each of `names`: the kind's `own` one, else the shared one; a parameter with
    neither is a PolicyError (raised when the class is defined, so a plugin learns at once)."""
    table = {**PARAMETER_RULES, **own}
    missing = [name for name in names if name not in table]
    if missing:
        raise PolicyError(
            f"policy kind '{kind}' declares parameter(s) {missing} with no rule; add e.g. "
            f"parameter_rules = {{{missing[0]!r}: ParameterRule(1, 100, 'what it means')}} "
            f"to the class (shared parameters: {', '.join(PARAMETER_RULES)})"
        )
    return {name: table[name] for name in names}


def validate_parameters(
    kind: str, rules: Mapping[str, ParameterRule], values: Mapping[str, Any]
) -> dict[str, int]:
    """Check names and ranges against the kind's `rules` (name -> rule, its parameters only);
    errors list the valid parameters of this kind."""
    unknown = sorted(set(values) - set(rules))
    if unknown:
        valid = describe_parameters(rules)
        raise PolicyError(
            f"unknown parameter(s) {unknown} for policy kind '{kind}'; valid parameters: {valid}"
        )
    checked: dict[str, int] = {}
    for name, rule in rules.items():
        value = values[name]
        # bool is an int subclass; `top_k=True` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(
                f"parameter '{name}' of policy '{kind}' must be an integer, got {value!r}"
            )
        problem = parameter_problem(name, value, rule)
        if problem is not None:
            raise PolicyError(f"parameter '{name}' of policy '{kind}' {problem}")
        checked[name] = value
    return checked
