"""The objective evolution and tuning optimize, and the stored results it is computed from.

A leaf module (only `evolve.simulator` below it): `evolve.optimize` and `evolve.tuning` both
score candidates here, so a change of objective (e.g. a pooled memory score) is made once.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from evolve.simulator.metrics import OBJECTIVE_MEMORY_SCORE_KIND, MetricSummary
from evolve.simulator.records import PeriodResult
from evolve.simulator.run_dir import read_json

# What a spec may optimize (experiment `optimizer.objective`, tuning `objectives[0]`).
Objective = Literal["memory_score", "accuracy"]
OBJECTIVES: tuple[Objective, ...] = typing.get_args(Objective)

# Recorded as `objective_used` wherever a score is stored, so a reader sees which one it is.
POOLED_OBJECTIVE = f"{OBJECTIVE_MEMORY_SCORE_KIND}_memory_score"


def objective_value(summary: MetricSummary, objective: str) -> float:
    """The score selection and pruning use: for the memory score its pooled form (ratio of
    means over all items, see `metrics`), or accuracy where that is undefined.

    Whether the pooled score is defined depends only on the environment and the upper bound,
    never on the candidate, so the fallback is the same for every candidate.
    """
    if objective_used(summary, objective) == POOLED_OBJECTIVE:
        return float(summary.pooled_memory_score)  # type: ignore[arg-type]
    return float(summary.accuracy or 0.0)


def objective_used(summary: MetricSummary, objective: str) -> str:
    """The name of what `objective_value` returned for this summary."""
    if objective == "memory_score" and summary.pooled_memory_score is not None:
        return POOLED_OBJECTIVE
    return "accuracy"


def load_period_results(run_dir: Path, periods: Iterable[int] | None = None) -> list[PeriodResult]:
    """Every stored user-period result of a runner directory, ordered by user then period."""
    wanted = set(periods) if periods is not None else None
    results = []
    for path in sorted(Path(run_dir).glob("users/*/period_*/result.json")):
        result = PeriodResult.model_validate(read_json(path))
        if wanted is None or result.period_index in wanted:
            results.append(result)
    return results
