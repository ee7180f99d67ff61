"""Outcomes of a tuning study as data: one record per trial, held-out checks, the result.

Records are rebuilt from the Optuna storage (trial states, parameters, values and the user
attributes the worker sets), so every worker of a shared study reports the same study.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, Field

from evolve.stats import PairedComparison, ScoreEstimate

# User attributes a worker sets on each trial (JSON values in the Optuna storage).
ATTR_METRICS = "evolve.metrics"
ATTR_OBJECTIVE_USED = "evolve.objective_used"
ATTR_PERIODS = "evolve.periods"
ATTR_RUN_DIR = "evolve.run_dir"
ATTR_MLFLOW_RUN = "evolve.mlflow_run_id"
ATTR_WALL_TIME = "evolve.wall_time_s"
ATTR_LLM_CALLS = "evolve.llm_calls"
ATTR_TOKENS = "evolve.tokens"
ATTR_NOTE = "evolve.note"
ATTR_SURPLUS = "evolve.surplus"
ATTR_STOPPED = "evolve.stopped"
ATTR_WORKER = "evolve.worker"
ATTR_SEED = "evolve.seed"
# A queued grid trial's point ({name: value}); Optuna's retry of a trial whose worker died
# copies it with the other user attributes.
GRID_POINT_ATTR = "evolve.grid_point"

# Study attributes: the toolkit's chosen trial(s) and why (see `record_choice`), so that
# Optuna's own tools and optuna-dashboard show the setting the toolkit picked.
STUDY_ATTR_CHOSEN_TRIALS = "evolve.chosen_trials"
STUDY_ATTR_CHOSEN = "evolve.chosen"
STUDY_ATTR_CHOSEN_RULE = "evolve.chosen_rule"
STUDY_ATTR_OPTUNA_BEST = "evolve.optuna_best_trial"
# One sentence naming the choice, for whoever opens the study (optuna-dashboard, the CLI):
# their headline is Optuna's `best_trial`, which can be another trial of the same value.
STUDY_ATTR_CHOICE = "evolve.choice"
CHOICE_RULE = (
    "best objective value; among equal values the smallest parameters (sorted by name) win, "
    "not the lowest trial number (a trial retried after a killed worker gets a new number, "
    "and the choice must not change), so study.best_trial may name another trial with the "
    "same value; two objectives: the Pareto front (study.best_trials)"
)

# TuningResult.storage of a study kept in memory only (no resume, no spend journal).
IN_MEMORY_STORAGE = "in-memory"

TrialOutcome = Literal["complete", "pruned", "failed", "running", "waiting", "surplus"]


class TrialRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    number: int
    state: TrialOutcome
    parameters: dict[str, int]
    values: list[float] | None = Field(
        default=None, description="Objective values; a pruned trial has its last reported one."
    )
    objective_used: str | None = Field(
        default=None, description="memory_score, or accuracy where the memory score is undefined."
    )
    periods: dict[int, float] = Field(
        default_factory=dict, description="Value reported after each period (pruning input)."
    )
    metrics: dict[str, float] = Field(
        default_factory=dict, description="Train metrics (MetricSummary.flat_metrics)."
    )
    run_dir: str | None = None
    mlflow_run_id: str | None = None
    wall_time_s: float | None = None
    llm_calls: int = 0
    tokens: int = 0
    note: str | None = None
    seed: int | None = None

    @property
    def last_period(self) -> int | None:
        return max(self.periods) if self.periods else None

    @property
    def finished(self) -> bool:
        return self.state in ("complete", "pruned")


class HeldoutRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str = Field(description="best, pareto or base")
    trial: int | None = None
    parameters: dict[str, int]
    score: float
    objective_used: str
    metrics: dict[str, float]
    run_dir: str
    estimate: ScoreEstimate | None = Field(
        default=None, description="Accuracy and memory score with 95% intervals."
    )
    against_base: PairedComparison | None = Field(
        default=None,
        description="This setting minus the base parameters on the same held-out questions "
        "(None for the base itself, or when the base was not evaluated).",
    )


class TuningResult(BaseModel):
    name: str
    study_name: str
    storage: str = Field(description="Storage URL without credentials.")
    config_hash: str
    objectives: list[str]
    sampler: str
    pruner: str
    requested_trials: int
    space: dict[str, list[int]]
    base_parameters: dict[str, int] = Field(default_factory=dict)
    trials: list[TrialRecord]
    best: list[int] = Field(
        default_factory=list,
        description="Best trial (single objective) or the Pareto front (two objectives).",
    )
    heldout: list[HeldoutRecord] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    complete: bool = False
    stopped: str | None = None
    llm_calls: int = Field(
        default=0,
        description="LLM calls the study spent: every invocation and worker, killed ones "
        "included (its spend journals; this invocation's only for an in-memory study).",
    )
    tokens: int = Field(default=0, description="Tokens the study spent, counted like llm_calls.")

    def trial(self, number: int) -> TrialRecord:
        for record in self.trials:
            if record.number == number:
                return record
        raise KeyError(number)

    def count(self, state: str) -> int:
        return sum(record.state == state for record in self.trials)

    @property
    def finished_trials(self) -> int:
        return sum(record.finished for record in self.trials)

    @property
    def best_parameters(self) -> dict[str, int] | None:
        return self.trial(self.best[0]).parameters if self.best else None

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


_STATES: dict[TrialState, TrialOutcome] = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting",
}


def trial_record(trial: FrozenTrial) -> TrialRecord:
    attrs: dict[str, Any] = trial.user_attrs
    state = _STATES[trial.state]
    if state == "failed" and attrs.get(ATTR_SURPLUS):
        state = "surplus"
    periods = {int(k): float(v) for k, v in (attrs.get(ATTR_PERIODS) or {}).items()}
    values = list(trial.values) if trial.values is not None else None
    return TrialRecord(
        number=trial.number,
        state=state,
        # A queued trial has no parameters yet: show the grid point it will evaluate.
        parameters={
            name: int(value)
            for name, value in (trial.params or attrs.get(GRID_POINT_ATTR) or {}).items()
        },
        values=values,
        objective_used=attrs.get(ATTR_OBJECTIVE_USED),
        periods=periods,
        metrics={k: float(v) for k, v in (attrs.get(ATTR_METRICS) or {}).items()},
        run_dir=attrs.get(ATTR_RUN_DIR),
        mlflow_run_id=attrs.get(ATTR_MLFLOW_RUN),
        wall_time_s=attrs.get(ATTR_WALL_TIME),
        llm_calls=int(attrs.get(ATTR_LLM_CALLS) or 0),
        tokens=int(attrs.get(ATTR_TOKENS) or 0),
        note=attrs.get(ATTR_NOTE) or attrs.get(ATTR_STOPPED),
        seed=attrs.get(ATTR_SEED),
    )


def trial_records(
    study: optuna.Study, journaled: Mapping[int, Any] | None = None
) -> list[TrialRecord]:
    """The study's trials (see `with_journaled_spend` for `journaled`)."""
    records = [trial_record(t) for t in study.get_trials(deepcopy=False)]
    return with_journaled_spend(records, journaled or {})


def with_journaled_spend(
    records: list[TrialRecord], journaled: Mapping[int, Any]
) -> list[TrialRecord]:
    """`records` whose calls and tokens are replaced by their spend journal's (trial number ->
    a `Usage`): it also knows the calls of a trial whose process was killed."""
    return [
        r.model_copy(
            update={
                "llm_calls": journaled[r.number].requests,
                "tokens": journaled[r.number].tokens,
            }
        )
        if r.number in journaled
        else r
        for r in records
    ]


def best_trial_numbers(study: optuna.Study) -> list[int]:
    """The best complete trial, or the Pareto front of complete trials (two objectives).

    Among trials with the best value, the one with the smallest parameters (sorted by name)
    wins, not Optuna's lowest trial number: a trial retried after a killed worker gets a new
    number, and the chosen setting (and its held-out check) must not depend on that.
    """
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return []
    if len(study.directions) > 1:
        return sorted(t.number for t in study.best_trials)
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    best = max(t.value * sign for t in complete if t.value is not None)
    tied = [t for t in complete if t.value is not None and t.value * sign == best]
    return [min(tied, key=_parameter_order).number]


def _parameter_order(trial: FrozenTrial) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(trial.params.items()))


def record_choice(
    study: optuna.Study, numbers: list[int], heldout: list[HeldoutRecord]
) -> dict[str, Any]:
    """Store the toolkit's chosen trial(s) on the study as user attributes; returns them.

    `evolve.chosen_trials` (numbers), `evolve.chosen` (per trial: number, parameters, train
    values and the held-out result, None when not checked), `evolve.chosen_rule` (the
    tie-break, in words) and `evolve.optuna_best_trial` (Optuna's own pick, single
    objective; it can differ on ties).
    """
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    chosen = []
    for number in numbers:
        trial = trials[number]
        check = next((h for h in heldout if h.trial == number), None)
        chosen.append(
            {
                "trial": number,
                "params": {k: int(v) for k, v in trial.params.items()},
                "values": list(trial.values or []),
                "heldout": None
                if check is None
                else {
                    "score": check.score,
                    "objective_used": check.objective_used,
                    "accuracy": check.metrics.get("accuracy"),
                },
            }
        )
    attrs: dict[str, Any] = {
        STUDY_ATTR_CHOSEN_TRIALS: list(numbers),
        STUDY_ATTR_CHOSEN: chosen,
        STUDY_ATTR_CHOSEN_RULE: CHOICE_RULE,
    }
    optuna_best = study.best_trial.number if len(study.directions) == 1 else None
    if optuna_best is not None:
        attrs[STUDY_ATTR_OPTUNA_BEST] = optuna_best
    attrs[STUDY_ATTR_CHOICE] = choice_sentence(chosen, optuna_best)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return attrs


def choice_sentence(chosen: list[dict[str, Any]], optuna_best: int | None) -> str:
    """`the toolkit's choice: trial 3 (short_term_len=4, update_every=2), value 0.42; held-out
    0.40 (Optuna's best_trial 1 has the same value; ties go to the smallest parameters)`."""
    parts = []
    for entry in chosen:
        params = ", ".join(f"{k}={v}" for k, v in sorted(entry["params"].items()))
        values = "/".join(f"{v:.3g}" for v in entry["values"]) or "-"
        held_out = entry["heldout"]
        checked = "" if held_out is None else f"; held-out {held_out['score']:.3g}"
        parts.append(f"trial {entry['trial']} ({params}), value {values}{checked}")
    sentence = "the toolkit's choice: " + "; ".join(parts)
    if len(chosen) == 1 and optuna_best is not None and optuna_best != chosen[0]["trial"]:
        sentence += (
            f" (Optuna's best_trial {optuna_best} has the same value; ties go to the smallest "
            "parameters)"
        )
    return sentence
