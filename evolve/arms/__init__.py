"""Arms runs: a design compared with its controls, on several environment seeds and
replicates, scored once on test users (`evolve arms SPEC.toml`)."""

from evolve.arms.records import ArmsRecord, ArmUnit
from evolve.arms.registry import ARMS, Arm, FixedArmInputs, register_arm
from evolve.arms.runner import run_arms
from evolve.arms.spec import ArmsSpec, load_arms_spec
from evolve.arms.table import ArmRow, arms_table, format_arms_table

__all__ = [
    "ARMS",
    "Arm",
    "ArmRow",
    "ArmUnit",
    "ArmsRecord",
    "ArmsSpec",
    "FixedArmInputs",
    "arms_table",
    "format_arms_table",
    "load_arms_spec",
    "register_arm",
    "run_arms",
]
