"""Which information flow an evaluation or evolution follows (a leaf module: no imports).

- ``"paper"`` reproduces the reference AMemGym code's information flow (what each role is
  shown, rounds, agent I/O, probes, feedback), so numbers sit next to the paper's. It does
  not reproduce the reference code's bugs (see the table of docs/protocols.md).
- ``"evolve"`` is this toolkit's own flow (state-aware simulated user, per-variable probes,
  failure-diagnostic feedback, held-out users).

The protocol is part of every run's identity, even when left at its default.
"""

from __future__ import annotations

from typing import Literal

Protocol = Literal["paper", "evolve"]
PROTOCOLS: tuple[Protocol, ...] = ("paper", "evolve")

# Rounds per session (period 0, later periods) when a data file does not say: the paper's
# v1.base uses 1 then 2; ours keeps 1/1 unless the spec sets them.
DATA_FILE_ROUNDS: dict[str, tuple[int, int]] = {"paper": (1, 2), "evolve": (1, 1)}
