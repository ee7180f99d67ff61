"""The arms an arms run can compare: registered by name, built-ins through the same path as a
plugin's (`register_arm`).

An evolving arm turns the experiment spec into the spec it runs (the blind control shows its
reflector no feedback); a fixed arm builds a policy from what the run already has (the base;
the capacity control from the evolved arm's best of the same seed and replicate).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evolve.results.records import ExperimentResult
from evolve.spec.config import ExperimentSpec

# Slot names with no meaning in any world of the toolkit (no craft, no everyday area): as many
# of them as the evolved list added give the base the evolved list's room without its names.
# Embedded by MiniLM they spread a crafts user's 8 statements over 4.6 slots on average, the
# blind control's everyday areas over 4.0 and the base's two over 1.4
# (benchmarks/capacity_slots.py).
NEUTRAL_SLOT_NAMES = (
    "Harbor", "Comet", "Glacier", "Lantern", "Saturn", "Canyon", "Meteor", "Lagoon",
    "Prism", "Tundra", "Nebula", "Fjord", "Geyser", "Monsoon", "Quasar", "Dune",
    "Aurora", "Basalt", "Cirrus", "Delta",
)  # fmt: skip
_LIST_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s*\S")


@dataclass(frozen=True)
class FixedArmInputs:
    """What a fixed arm builds its policy from, for one seed (and replicate)."""

    base_policy: Any
    spec: ExperimentSpec
    evolved: ExperimentResult | None  # the evolved arm's run of the same replicate


class Arm:
    """One arm: `evolves` arms run an experiment; the others build a fixed policy."""

    name: str
    description: str
    evolves: bool = False
    per_replicate: bool = False  # a fixed arm with one policy per evolved replicate

    def experiment(self, spec: ExperimentSpec) -> ExperimentSpec:
        raise NotImplementedError(f"arm {self.name} does not evolve")

    def policy(self, inputs: FixedArmInputs) -> Any:
        raise NotImplementedError(f"arm {self.name} evolves: its policy is its run's best")

    def unit_fields(self, inputs: FixedArmInputs) -> dict[str, Any]:
        """What a fixed arm records about how it built its policy (`ArmUnit` fields)."""
        return {}


class EvolvedArm(Arm):
    name = "evolved"
    description = "the experiment spec as written (its feedback, operators and acceptance)"
    evolves = True

    def experiment(self, spec: ExperimentSpec) -> ExperimentSpec:
        return spec


class BlindArm(Arm):
    name = "blind"
    description = "the blind control: the same evolution, the reflector shown no feedback"
    evolves = True

    def experiment(self, spec: ExperimentSpec) -> ExperimentSpec:
        optimizer = spec.optimizer.model_copy(update={"feedback": "blind"})
        return spec.model_copy(update={"optimizer": optimizer})


class BaseArm(Arm):
    name = "base"
    description = "the experiment's base policy, unevolved"

    def policy(self, inputs: FixedArmInputs) -> Any:
        return inputs.base_policy


class CapacityArm(Arm):
    name = "capacity"
    description = (
        "the capacity control: the base's list with as many neutral slots as the evolved "
        "best added (names with no meaning in the world)"
    )
    per_replicate = True

    def policy(self, inputs: FixedArmInputs) -> Any:
        component = list_component(inputs.spec, inputs.base_policy)
        evolved = inputs.evolved
        if evolved is None or evolved.best_id is None:
            raise ValueError("the capacity control needs the evolved arm's finished run")
        added = slots_added(evolved, component)
        base_text = inputs.base_policy.components()[component]
        return inputs.base_policy.with_components({component: with_neutral_slots(base_text, added)})

    def unit_fields(self, inputs: FixedArmInputs) -> dict[str, Any]:
        if inputs.evolved is None:
            return {}
        component = list_component(inputs.spec, inputs.base_policy)
        return {"slots_added": slots_added(inputs.evolved, component)}


def list_component(spec: ExperimentSpec, base_policy: Any) -> str:
    """The mutated component that is a list (one item a line): where slots are added."""
    components = base_policy.components()
    for name in spec.optimizer.mutate_components:
        lines = [line for line in components.get(name, "").splitlines() if line.strip()]
        if lines and all(_LIST_ITEM.match(line) for line in lines):
            return name
    raise ValueError(
        "the capacity control adds list items: none of the spec's mutate_components "
        f"({spec.optimizer.mutate_components}) is a numbered or bulleted list in the base policy"
    )


def slots_added(result: ExperimentResult, component: str) -> int:
    """Items the best's lineage added to `component`, net of those it removed."""
    best = result.candidate(result.best_id) if result.best_id else None
    if best is None:
        return 0
    total = 0
    for record in result.lineage(best.id):
        edits = record.mutation.edits.get(component, {})
        total += len(edits.get("added", [])) - len(edits.get("removed", []))
    return max(0, total)


def with_neutral_slots(list_text: str, count: int) -> str:
    """`list_text` with `count` neutral items appended, numbered after its last."""
    if count > len(NEUTRAL_SLOT_NAMES):
        raise ValueError(f"at most {len(NEUTRAL_SLOT_NAMES)} neutral slots, asked for {count}")
    lines = [line for line in list_text.splitlines() if line.strip()]
    start = len(lines) + 1
    extra = [f"{start + index}. {name}" for index, name in enumerate(NEUTRAL_SLOT_NAMES[:count])]
    return "\n".join([*lines, *extra])


ARMS: dict[str, Arm] = {}


def register_arm(arm: Arm | Callable[[], Arm]) -> Arm:
    built = arm() if callable(arm) and not isinstance(arm, Arm) else arm
    ARMS[built.name] = built
    return built


for _arm in (EvolvedArm(), BlindArm(), CapacityArm(), BaseArm()):
    register_arm(_arm)
