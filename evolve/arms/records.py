"""What an arms run keeps on disk (`<runs>/<name>/arms.json`): one record per unit, a unit
being one arm's policy on one seed (and replicate) scored on that seed's test users."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ArmUnit(BaseModel):
    model_config = ConfigDict(frozen=True)

    arm: str
    seed: int = Field(description="Environment seed.")
    replicate: int | None = Field(default=None, description="None: one policy per seed.")
    experiment: str | None = Field(
        default=None, description="The evolving arm's experiment directory (under runs/)."
    )
    optimizer_seed: int | None = None
    best_id: str | None = None
    slots_added: int | None = Field(default=None, description="Capacity: neutral slots added.")
    policy_fingerprint: str
    test_dir: str = Field(description="The test evaluation, relative to the arms directory.")
    test_complete: bool = False
    evolution_calls: int = 0
    evolution_wall_s: float = 0.0
    test_calls: int = 0
    test_wall_s: float = 0.0

    @property
    def label(self) -> str:
        replicate = "" if self.replicate is None else f"-r{self.replicate}"
        return f"{self.arm}-s{self.seed}{replicate}"


class ArmsRecord(BaseModel):
    name: str
    design_hash: str
    seeds: list[int]
    arms: list[str]
    replicates: int
    units: list[ArmUnit] = Field(default_factory=list)
    train_facts: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Per seed, the facts its train users were asked about (the transfer split "
        "is the test questions about none of them).",
    )

    def unit(self, arm: str, seed: int, replicate: int | None) -> ArmUnit | None:
        for unit in self.units:
            if (unit.arm, unit.seed, unit.replicate) == (arm, seed, replicate):
                return unit
        return None

    def with_unit(self, unit: ArmUnit) -> ArmsRecord:
        kept = [
            u
            for u in self.units
            if (u.arm, u.seed, u.replicate) != (unit.arm, unit.seed, unit.replicate)
        ]
        return self.model_copy(update={"units": [*kept, unit]})
