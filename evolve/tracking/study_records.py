"""What the study tracker reads of tuning's records and spec, the tags of its runs, and the
names and final summary it writes from those records (`evolve.tracking.study` logs them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from evolve.results.objective import format_score

# What the study tracker reads of tuning's records and spec (`evolve.tuning.records`,
# `evolve.tuning.spec`), stated here as protocols: tracking sits below tuning, which hands
# these objects in, so it never imports tuning (not even for type checking).


class TrialRecord(Protocol):
    number: int
    state: str
    values: list[float] | None
    metrics: dict[str, float]
    llm_calls: int
    wall_time_s: float | None
    last_period: int | None
    objective_used: str | None
    note: str | None
    mlflow_run_id: str | None

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


class TuningResult(Protocol):
    trials: Sequence[TrialRecord]
    best: list[int]
    objectives: list[str]

    def trial(self, number: int) -> TrialRecord: ...
    def count(self, state: str) -> int: ...
    @property
    def finished_trials(self) -> int: ...
    @property
    def best_parameters(self) -> dict[str, int] | None: ...
    @property
    def multi_objective(self) -> bool: ...


class StudySpecView(Protocol):
    """What the tracker reads of a study spec (`evolve.tuning.spec.StudySpec`): some of the
    run spec's fields (`evolve.spec.experiment_spec.RunSpec`) and its `tuning` table."""

    name: str
    description: str
    protocol: str
    policy: Any
    tuning: Any
    tracking: Any

    def mlflow_experiment_name(self) -> str: ...


KIND_TUNING = "tuning"
KIND_TRIAL = "trial"
TAG_STUDY = "evolve.study"
TAG_STORAGE = "evolve.storage"
TAG_TRIAL = "evolve.trial"
TAG_TRIAL_STATE = "evolve.trial_state"
TAG_BEST_PREFIX = "evolve.best."
TAG_OBJECTIVES = "evolve.objectives"


def trial_run_name(record: TrialRecord) -> str:
    """`trial 3 memory 0.42` (its value, named: `acc` where the objective is accuracy, or the
    memory score is undefined), `trial 4 memory 0.30 pruned`, `trial 5 failed`: what the
    runs table's name column shows without configuring it."""
    parts = [f"trial {record.number}"]
    if record.values and math.isfinite(record.values[0]):
        parts.append(f"{_unit(record)} {format_score(record.values[0], 2)}")
    if record.state != "complete":
        parts.append(record.state)
    return " ".join(parts)


def _unit(record: TrialRecord) -> str:
    """The name a trial's value is shown under: the objective it used (`acc` where the
    objective is accuracy or the memory score was undefined)."""
    return {"memory_score": "memory", "accuracy": "acc"}.get(record.objective_used or "", "value")


def study_run_name(study_name: str, result: TuningResult) -> str:
    """`tune quick best memory 0.42 #3`: the parent run's name carries the chosen trial's
    value, named as its trial run names it, and number (the Pareto front's size for two
    objectives), as candidate runs carry theirs."""
    if not result.best:
        return f"tune {study_name}"
    if result.multi_objective:
        return f"tune {study_name} pareto {len(result.best)}"
    best = result.trial(result.best[0])
    value = (
        f"{_unit(best)} {format_score(best.values[0], 2)} "
        if best.values and math.isfinite(best.values[0])
        else ""
    )
    return f"tune {study_name} best {value}#{best.number}"


def study_summary(result: TuningResult) -> tuple[dict[str, float], list[Any]]:
    """The parent run's final metrics (trial counts, best value, the best's held-out
    scores) and tags (completion, objectives, best trial and its parameters)."""
    from mlflow.entities import RunTag

    from evolve.tracking.intervals import (
        comparison_metrics,
        comparison_tags,
        score_interval_metrics,
    )

    metrics: dict[str, float] = {
        "trials_finished": result.finished_trials,
        "trials_complete": result.count("complete"),
        "trials_pruned": result.count("pruned"),
        "trials_failed": result.count("failed"),
    }
    tags = [
        RunTag("evolve.complete", str(result.complete).lower()),
        RunTag(TAG_OBJECTIVES, ",".join(result.objectives)),
    ]
    if result.best:
        best = result.trial(result.best[0])
        if best.values:
            metrics["best_value"] = best.values[0]
        tags.append(RunTag("evolve.best_trial", ",".join(map(str, result.best))))
        for name, value in sorted(best.parameters.items()):
            tags.append(RunTag(f"{TAG_BEST_PREFIX}{name}", str(value)))
    for heldout in result.heldout:
        if heldout.label in ("best", "pareto") and heldout.trial == (
            result.best[0] if result.best else None
        ):
            metrics["heldout_score"] = heldout.score
            metrics.update({f"heldout_{k}": v for k, v in heldout.metrics.items()})
            metrics.update(score_interval_metrics("heldout", heldout.estimate))
            if heldout.against_base is not None:
                # The chosen setting against the base parameters: a test, with its interval.
                metrics.update(comparison_metrics(heldout.against_base))
                tags += [RunTag(k, v) for k, v in comparison_tags(heldout.against_base).items()]
        elif heldout.label == "base":
            metrics["heldout_base_score"] = heldout.score
    if result.stopped:
        tags.append(RunTag("evolve.stopped", result.stopped[:500]))
    return metrics, tags
