"""Parameter mutation: propose new numeric policy parameters within configured bounds.

`ParameterProposer` is the plug-in point (ask/tell, like Optuna's): `propose` is asked for a
child's parameters given its parent's, and `observe` is told each evaluated candidate's
parameters and score — also for candidates loaded from disk when a run resumes, in the same
order, so a stateful proposer (an Optuna study) rebuilds the same state. The default
`RandomStepProposer` needs no history.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Protocol

from evolve.core.spec_base import on_grid


class Bounds(Protocol):
    low: int
    high: int
    step: int


class ParameterProposer:
    """Base class: one required method, one optional hook."""

    def propose(
        self, parent: Mapping[str, int], bounds: Mapping[str, Bounds], rng: random.Random
    ) -> dict[str, int]:
        """A full parameter mapping for the child (unchanged names keep the parent's value)."""
        raise NotImplementedError

    def observe(self, parameters: Mapping[str, int], score: float) -> None:
        """An evaluated candidate's parameters and train score (optional)."""


class RandomStepProposer(ParameterProposer):
    """Changes one parameter: a step of +-1..`max_step` from the parent, clamped to bounds.

    A parent value outside the bounds (e.g. the base policy's default) is first clamped in.
    Always returns a change when the bounds allow one.
    """

    def __init__(self, max_step: int = 2) -> None:
        if max_step < 1:
            raise ValueError(f"max_step must be >= 1, got {max_step}")
        self.max_step = max_step

    def propose(
        self, parent: Mapping[str, int], bounds: Mapping[str, Bounds], rng: random.Random
    ) -> dict[str, int]:
        child = dict(parent)
        names = [name for name in sorted(bounds) if bounds[name].low < bounds[name].high]
        if not names:
            return child
        name = rng.choice(names)
        low, high, step = bounds[name].low, bounds[name].high, bounds[name].step
        current = min(max(parent[name], low), high)
        options = [
            value
            for value in range(current - self.max_step * step, current + self.max_step * step + 1)
            if on_grid(value, low, high, step) and value != parent[name]
        ]
        child[name] = rng.choice(options) if options else current
        return child
