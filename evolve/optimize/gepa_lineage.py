"""The lineage GEPA does not keep, held by the `AMemGymAdapter` and persisted with GEPA's
state, so that a resumed run neither repeats nor forgets it.

GEPA's pool knows each candidate's components and parents, not how it was made: which
operator proposed it, from what feedback and seed, at what cost, in which iteration; nor
the proposals that never joined the pool (rejected on their minibatch, or invalid), each
iteration's spend and minibatch verdict. The adapter notes every operator proposal here as
it makes it; GEPA's callbacks (`gepa_engine.GepaEvents`) note the rest as they observe it,
and only here; `gepa_records` turns it, with GEPA's pool, into our frozen records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evolve.results.records import candidate_id


@dataclass
class GepaLineage:
    """What a GEPA run made and how, beside GEPA's pool. The adapter's `get_adapter_state`
    puts `state()` into GEPA's checkpoint (`gepa_state.bin`); `set_adapter_state` rebuilds
    the lineage from it with `from_state`."""

    # Every operator proposal in order, including those that never joined GEPA's pool.
    proposals: list[dict[str, Any]] = field(default_factory=list)
    # GEPA's pool index -> the iteration (generation) that produced it; the seed's is 0.
    discovered: dict[int, int] = field(default_factory=dict)
    # One entry per finished iteration: its minibatch verdict and spend.
    iterations: list[dict[str, Any]] = field(default_factory=list)
    # The iteration in progress and its parent (GEPA's pool index); not persisted.
    current_iteration: int = 0
    current_parent: int | None = None

    def state(self) -> dict[str, Any]:
        """This lineage's part of the adapter state; its keys are stored in checkpoints."""
        return {
            "proposals": list(self.proposals),
            "discovered": dict(self.discovered),
            "iterations": list(self.iterations),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the lineage stored by `state` (an adapter state; absent keys: nothing yet),
        in place: GEPA's callbacks hold this object across resumed steps. (Checkpoints
        written before the schedule played held-out checks itself also hold `best_score`
        and `heldout`; the candidates' records keep those scores, so they are not read.)"""
        self.proposals = list(state.get("proposals", []))
        self.discovered = {int(k): int(v) for k, v in state.get("discovered", {}).items()}
        self.iterations = list(state.get("iterations", []))

    def generation_of(self, index: int) -> int:
        """The iteration that discovered GEPA's pool candidate `index` (the seed: 0)."""
        return self.discovered.get(index, 0)

    def record_id(self, index: int) -> str:
        """Our record id of GEPA's pool candidate `index` (named by its generation)."""
        return candidate_id(self.generation_of(index), 0)

    def proposals_in(self, generation: int) -> list[dict[str, Any]]:
        """The operator proposals made in iteration `generation`, in order."""
        return [p for p in self.proposals if p["iteration"] == generation]

    def iteration_entry(self, generation: int) -> Mapping[str, Any]:
        """The finished iteration `generation`'s entry; empty if it has none."""
        return next((e for e in self.iterations if e["iteration"] == generation), {})
