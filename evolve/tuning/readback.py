"""A tuning study's tables read back for `evolve compare`: from its run directory
(`tuning.json` and the spend journals) or from MLflow (the parent run and its trial runs).
The rendering itself is `evolve.tuning.report`, which the worker and the tracker use too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evolve.results.objective import format_score
from evolve.tuning.layout import RESULT_FILE, TuningDir
from evolve.tuning.records import IN_MEMORY_STORAGE, TrialRecord, with_journaled_spend
from evolve.tuning.report import format_result, format_trials
from evolve.tuning.spec import is_study_spec, load_study_spec
from evolve.tuning.spend import StudySpendJournals


def tuning_dir_for(target: str, runs_dir: str | Path = "runs") -> Path | None:
    """The tuning directory named by a study spec, a name under `runs_dir`, or a path."""
    path = Path(target)
    if path.suffix == ".toml" and path.is_file():
        if not is_study_spec(path):
            return None
        candidate = Path(runs_dir) / load_study_spec(path).name
        return candidate if (candidate / RESULT_FILE).is_file() else None
    for candidate in (Path(runs_dir) / target, path):
        if (candidate / RESULT_FILE).is_file():
            return candidate
    return None


def render_tuning_dir(directory: str | Path) -> str:
    """The study table of `runs/<name>/tuning.json` (what `evolve tune` last saw), with the
    spend read now from the study's journals (they also hold the calls of a killed
    invocation and of workers still running)."""
    result = TuningDir(Path(directory)).load_result()
    if result.storage != IN_MEMORY_STORAGE:
        journals = StudySpendJournals(directory, result.study_name)
        trials = with_journaled_spend(result.trials, journals.trial_spend())
        spent = journals.total(trials)
        result = result.model_copy(
            update={"trials": trials, "llm_calls": spent.requests, "tokens": spent.tokens}
        )
    return format_result(result)


def render_tuning_experiment(tracking_uri: str, experiment_name: str) -> str:
    """The study tables of every tuning parent run (tag `evolve.kind = tuning`) of an MLflow
    experiment, rebuilt from its trial child runs."""
    from evolve.tracking import PARENT_RUN_TAG, TAG_KIND, mlflow_client
    from evolve.tuning.tracking import (
        KIND_TRIAL,
        KIND_TUNING,
        TAG_BEST_PREFIX,
        TAG_OBJECTIVES,
        TAG_STUDY,
        TAG_TRIAL,
        TAG_TRIAL_STATE,
    )

    client = mlflow_client(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return f"no MLflow experiment {experiment_name!r} at {tracking_uri}"
    parents = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{TAG_KIND}` = '{KIND_TUNING}'"
    )
    if not parents:
        return f"no tuning study in MLflow experiment {experiment_name!r}"
    blocks = []
    for parent in sorted(parents, key=lambda run: run.info.start_time):
        children = client.search_runs(
            [experiment.experiment_id],
            filter_string=(
                f"tags.`{PARENT_RUN_TAG}` = '{parent.info.run_id}' and "
                f"tags.`{TAG_KIND}` = '{KIND_TRIAL}'"
            ),
            max_results=10000,
        )
        records = [_record_from_run(child, TAG_TRIAL, TAG_TRIAL_STATE) for child in children]
        tags = parent.data.tags
        objectives = tags.get(TAG_OBJECTIVES, "memory_score").split(",")
        names = sorted({name for r in records for name in r.parameters})
        best = {
            k.removeprefix(TAG_BEST_PREFIX): v
            for k, v in tags.items()
            if k.startswith(TAG_BEST_PREFIX)
        }
        lines = [
            f"study {tags.get(TAG_STUDY, '?')} (MLflow run {parent.info.run_id}, "
            f"{parent.info.status}): {len(records)} trial runs",
            format_trials(records, names, objectives),
        ]
        if best:
            best_value = parent.data.metrics.get("best_value")
            lines.append(
                f"best: trial {tags.get('evolve.best_trial', '?')}: "
                + " ".join(f"{k}={v}" for k, v in sorted(best.items()))
                + (f"  train {format_score(best_value)}" if best_value is not None else "")
            )
        if "heldout_score" in parent.data.metrics:
            lines.append(
                f"held-out score of the best: {format_score(parent.data.metrics['heldout_score'])}"
            )
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _record_from_run(run: Any, trial_tag: str, state_tag: str) -> TrialRecord:
    data = run.data
    metrics = {
        k.removeprefix("train_"): v for k, v in data.metrics.items() if k.startswith("train_")
    }
    values = [data.metrics["value"]] if "value" in data.metrics else None
    if values is not None and "value_tokens" in data.metrics:
        values.append(data.metrics["value_tokens"])
    state = data.tags.get(state_tag, "running")
    return TrialRecord(
        number=int(data.tags.get(trial_tag, -1)),
        state=state if state in ("complete", "pruned", "failed", "running") else "running",
        parameters={
            k.removeprefix("param."): int(v)
            for k, v in data.params.items()
            if k.startswith("param.")
        },
        values=values,
        metrics=metrics,
        mlflow_run_id=run.info.run_id,
    )
