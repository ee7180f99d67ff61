"""The objective evolution and tuning optimize, and the stored results it is computed from.

A leaf module (only `evolve.simulator` below it): `evolve.optimize` and `evolve.tuning` both
score candidates here, so a change of objective (e.g. a pooled memory score) is made once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from evolve.simulator.metrics import MetricSummary
from evolve.simulator.records import PeriodResult
from evolve.simulator.storage import read_json


def objective_value(summary: MetricSummary, objective: str) -> float:
    """The score selection uses: the memory score, or accuracy where it is undefined.

    Whether a user-period's memory score is defined depends only on the environment and the
    upper bound, never on the candidate, so the fallback is the same for every candidate.
    """
    if objective == "memory_score" and summary.memory_score is not None:
        return float(summary.memory_score)
    return float(summary.accuracy or 0.0)


def load_period_results(run_dir: Path, periods: Iterable[int] | None = None) -> list[PeriodResult]:
    """Every stored user-period result of a runner directory, ordered by user then period."""
    wanted = set(periods) if periods is not None else None
    results = []
    for path in sorted(Path(run_dir).glob("users/*/period_*/result.json")):
        result = PeriodResult.model_validate(read_json(path))
        if wanted is None or result.period_index in wanted:
            results.append(result)
    return results
