"""The numeric parameters of a memory policy: their valid ranges and meanings, and the one
check every policy kind (and the specs that set them) applies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from memory_policies.errors import PolicyError


class ParameterRule(NamedTuple):
    """The valid range (inclusive) and meaning of one numeric policy parameter."""

    low: int
    high: int
    meaning: str

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
        1, PARAMETER_MAX, "messages sent to `write` per memory update (paper: update_bsz)"
    ),
    "short_term_len": ParameterRule(
        0, PARAMETER_MAX, "recent messages kept verbatim in context (paper: local_length)"
    ),
    "top_k": ParameterRule(1, PARAMETER_MAX, "memories retrieved per read"),
}


def parameter_problem(name: str, value: int) -> str | None:
    """Why `value` is not valid for the numeric parameter `name`, or None when it is."""
    rule = PARAMETER_RULES[name]
    if rule.low <= value <= rule.high:
        return None
    side = f"at least {rule.low}" if value < rule.low else f"at most {rule.high}"
    return f"must be {side} ({rule.meaning}; valid {rule.low}..{rule.high}), got {value}"


def validate_parameters(
    kind: str, names: Sequence[str], values: Mapping[str, Any]
) -> dict[str, int]:
    """Check names and ranges; errors list the valid parameters of this kind."""
    unknown = sorted(set(values) - set(names))
    if unknown:
        valid = ", ".join(PARAMETER_RULES[n].describe(n) for n in names)
        raise PolicyError(
            f"unknown parameter(s) {unknown} for policy kind '{kind}'; "
            f"valid parameters: {valid or 'none'}"
        )
    checked: dict[str, int] = {}
    for name in names:
        value = values[name]
        # bool is an int subclass; `top_k=True` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(
                f"parameter '{name}' of policy '{kind}' must be an integer, got {value!r}"
            )
        problem = parameter_problem(name, value)
        if problem is not None:
            raise PolicyError(f"parameter '{name}' of policy '{kind}' {problem}")
        checked[name] = value
    return checked
