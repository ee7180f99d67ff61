"""The objective evolution and tuning optimize, and the stored results it is computed from.

A leaf module (only `evolve.simulator` below it): `evolve.optimize` and `evolve.tuning` both
score candidates here, so a change of objective is made once.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from evolve.simulator.metrics import MetricSummary
from evolve.simulator.records import PeriodResult
from evolve.simulator.run_dir import read_record

# What a spec may optimize (experiment `optimizer.objective`, tuning `objectives[0]`).
Objective = Literal["memory_score", "accuracy"]
OBJECTIVES: tuple[Objective, ...] = typing.get_args(Objective)


def objective_value(summary: MetricSummary, objective: str) -> float:
    """The score selection and pruning use: the memory score (the headline, see `metrics`),
    or accuracy where the memory score is undefined; `objective_used` names which.

    Whether the memory score is defined depends only on the questions and the upper bound,
    never on the candidate, so the fallback is the same for every candidate.
    """
    if objective_used(summary, objective) == "memory_score":
        return float(summary.memory_score)  # type: ignore[arg-type]
    return float(summary.accuracy or 0.0)


def objective_used(summary: MetricSummary, objective: str) -> str:
    """The name of what `objective_value` returned for this summary (recorded as
    `objective_used` wherever a score is stored, so a reader sees which one it is)."""
    if objective == "memory_score" and summary.memory_score is not None:
        return "memory_score"
    return "accuracy"


def load_period_results(run_dir: Path, periods: Iterable[int] | None = None) -> list[PeriodResult]:
    """Every stored user-period result of a runner directory, ordered by user then period."""
    wanted = set(periods) if periods is not None else None
    results = []
    for path in sorted(Path(run_dir).glob("users/*/period_*/result.json")):
        result = read_record(path, PeriodResult)
        if wanted is None or result.period_index in wanted:
            results.append(result)
    return results


def format_score(value: float | None, digits: int = 3) -> str:
    """A score for display: `digits` decimals, "-" when there is none, never "-0.000"."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0.0 else text


def scores_text(metrics: Mapping[str, float], objective_used: str | None = None) -> str:
    """`memory_score X, accuracy Y` from flat metrics, each named, for one-line reports.

    An undefined memory score is shown as "-" with a word on why, next to the accuracy, so a
    fallback objective never passes for a memory score."""
    memory = metrics.get("memory_score")
    text = f"memory_score {format_score(memory)}"
    if memory is None:
        text += " (upper bound not clearly above random)"
    text += f", accuracy {format_score(metrics.get('accuracy'))}"
    if objective_used == "accuracy" and memory is None:
        text += " (objective: accuracy)"
    return text
