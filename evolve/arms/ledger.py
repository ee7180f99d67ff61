"""Which test users each design has been scored on: a test set used once is spent.

`<runs>/test_sets.json` lists, per (world, seed), the test users and every design (arms run
name and design hash) scored on them. A new design on a test set that another design used
gets a warning: its score there is no longer a clean test (the earlier result may have
shaped the new design).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.core.files import atomic_write_json
from evolve.simulator.run_dir import read_object

if TYPE_CHECKING:
    from evolve.arms.worlds import SeedWorld

LEDGER_FILE = "test_sets.json"


def record_test_sets(runs_dir: Path, name: str, design: str, world: SeedWorld) -> list[str]:
    """Note that design `design` is scored on `world`'s test users; warnings for each other
    design scored on any of them before."""
    path = runs_dir / LEDGER_FILE
    ledger: dict[str, Any] = read_object(path) if path.is_file() else {"test_sets": []}
    preset = world.experiment.environment.preset
    users = [item.id for item in world.test.items]
    warnings = []
    entry = None
    for existing in ledger["test_sets"]:
        if existing["preset"] != preset or existing["seed"] != world.seed:
            continue
        shared = sorted(set(existing["users"]) & set(users))
        others = [d for d in existing["designs"] if d["design"] != design]
        if shared and others:
            names = ", ".join(f"{d['name']} ({d['design']})" for d in others)
            warnings.append(
                f"warning: seed {world.seed}'s test users ({len(shared)} of {len(users)}) were "
                f"scored before by {names}: not a fresh test for this design"
            )
        if existing["users"] == users:
            entry = existing
    if entry is None:
        entry = {"preset": preset, "seed": world.seed, "users": users, "designs": []}
        ledger["test_sets"].append(entry)
    if all(d["design"] != design for d in entry["designs"]):
        entry["designs"].append({"name": name, "design": design})
        runs_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, ledger)
    return warnings
