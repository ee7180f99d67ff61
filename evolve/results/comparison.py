"""The held-out verdict of an experiment: its best against its base, as a paired test.

Both were scored on the same held-out users, so their per-question records pair up; the
comparison is read from those records (under the experiment directory), never from the two
summary scores.
"""

from __future__ import annotations

from pathlib import Path

from evolve.results.records import CandidateRecord, ExperimentResult
from evolve.stats import PairedComparison, PairingError, compare, load_outcomes

# The statistics' own seed (recorded in every comparison's basis): fixed, so that the same
# records always give the same interval.
COMPARISON_SEED = 0


def base_and_best(result: ExperimentResult) -> tuple[CandidateRecord, CandidateRecord] | None:
    if result.best_id is None:
        return None
    best = result.candidate(result.best_id)
    return result.lineage(best.id)[-1], best


def heldout_comparison(root: Path, result: ExperimentResult) -> PairedComparison | None:
    """Best - base on the held-out users, or None when either was not scored there (or its
    records are gone, or the two were scored on different questions)."""
    pair = base_and_best(result)
    if pair is None:
        return None
    base, best = pair
    if base.heldout is None or best.heldout is None or base.id == best.id:
        return None
    stratum = result.name
    try:
        best_outcomes = load_outcomes(Path(root) / best.heldout.run_dir, stratum=stratum)
        base_outcomes = load_outcomes(Path(root) / base.heldout.run_dir, stratum=stratum)
        if best_outcomes.questions == 0:
            return None
        return compare(best_outcomes, base_outcomes, seed=COMPARISON_SEED)
    except (PairingError, FileNotFoundError):
        return None
