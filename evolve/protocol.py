"""Which information flow an evaluation or evolution follows (a leaf module: no imports).

- ``"paper"`` reproduces the reference AMemGym code's information flow (what each role is
  shown, rounds, agent I/O, probes, feedback), so numbers sit next to the paper's. It does
  not reproduce the reference code's bugs (see the table of docs/protocols.md).
- ``"evolve"`` is this toolkit's own flow (state-aware simulated user, per-variable probes,
  failure-diagnostic feedback, held-out users).

The protocol is part of every run's identity, even when left at its default.

Every choice that differs between the two flows is a field of `ProtocolRules`, read where it
is used (``rules_for(spec.protocol).probe_scope_forced``, ...): code never compares a protocol
name. A new difference is a new field with a value for each protocol, documented here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Protocol = Literal["paper", "evolve"]
PROTOCOLS: tuple[Protocol, ...] = ("paper", "evolve")


@dataclass(frozen=True)
class ProtocolRules:
    """What one protocol decides. One instance per protocol; look it up with `rules_for`."""

    name: Protocol
    # Rounds per session (period 0, later periods) when a data file does not say: the paper's
    # v1.base uses 1 then 2; ours keeps 1/1 unless the spec sets them.
    data_file_rounds: tuple[int, int]


PAPER = ProtocolRules(name="paper", data_file_rounds=(1, 2))
EVOLVE = ProtocolRules(name="evolve", data_file_rounds=(1, 1))
_RULES: dict[str, ProtocolRules] = {rules.name: rules for rules in (PAPER, EVOLVE)}


def rules_for(protocol: str) -> ProtocolRules:
    """The rules of a protocol by name; a ValueError naming the valid ones otherwise."""
    try:
        return _RULES[protocol]
    except KeyError:
        raise ValueError(
            f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}"
        ) from None


# Kept for existing callers; new code reads `rules_for(name).data_file_rounds`.
DATA_FILE_ROUNDS: dict[str, tuple[int, int]] = {
    name: rules.data_file_rounds for name, rules in _RULES.items()
}
