"""Tables of a tuning study: every trial, the best setting (or Pareto front), held-out checks.

Rendered from a `TuningResult` (`runs/<name>/tuning.json`) or from MLflow (the study's
parent run and its trial child runs), so `evolve compare` can show either.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.tuning.records import (
    IN_MEMORY_STORAGE,
    TrialRecord,
    TuningResult,
    with_journaled_spend,
)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _state_text(record: TrialRecord) -> str:
    if record.state == "pruned" and record.last_period is not None:
        return f"pruned@{record.last_period}"
    return record.state


def format_trials(
    records: Sequence[TrialRecord], names: Sequence[str], objectives: Sequence[str]
) -> str:
    """One row per trial (surplus trials of worker races left out)."""
    shown = [r for r in records if r.state != "surplus"]
    name_width = [max(len(name), 3) for name in names]
    head = ["trial", "state      ", *(n.rjust(w) for n, w in zip(names, name_width, strict=True))]
    head += [f"{'value':>7}", f"{'memory':>7}", f"{'acc':>6}", f"{'tokens':>8}", f"{'calls':>6}"]
    header = " ".join(head)
    lines = [header, "-" * len(header)]
    for r in sorted(shown, key=lambda r: r.number):
        cells = [f"{r.number:>5}", f"{_state_text(r):<11}"]
        cells += [
            str(r.parameters.get(n, "-")).rjust(w) for n, w in zip(names, name_width, strict=True)
        ]
        value = r.values[0] if r.values else (r.periods.get(r.last_period) if r.periods else None)
        cells += [
            f"{_fmt(value):>7}",
            f"{_fmt(r.metrics.get('memory_score')):>7}",
            f"{_fmt(r.metrics.get('accuracy')):>6}",
            f"{int(r.metrics.get('tokens', 0)):>8}",
            f"{int(r.metrics.get('llm_calls', 0)):>6}",
        ]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def format_result(result: TuningResult) -> str:
    names = list(result.space)
    objective = result.objectives[0]
    lines = [
        f"study {result.study_name} ({result.storage}): {result.finished_trials}/"
        f"{result.requested_trials} trials finished ({result.count('complete')} complete, "
        f"{result.count('pruned')} pruned, {result.count('failed')} failed); sampler "
        f"{result.sampler}, pruner {result.pruner}; objective {' + '.join(result.objectives)}",
        "",
        format_trials(result.trials, names, result.objectives),
        "",
    ]
    if not result.best:
        lines.append("best: none yet (no complete trial)")
    elif result.multi_objective:
        lines.append(f"Pareto front ({objective} maximized, tokens minimized):")
        for number in result.best:
            record = result.trial(number)
            values = record.values or [None, None]
            lines.append(
                f"  trial {number}: {_params(record.parameters, names)}  {objective} "
                f"{_fmt(values[0])}  tokens {int(values[1] or 0)}"
            )
    else:
        record = result.trial(result.best[0])
        used = record.objective_used or objective
        lines.append(
            f"best: trial {record.number}: {_params(record.parameters, names)}  train {used} "
            f"{_fmt(record.values[0] if record.values else None)}"
        )
    for heldout in result.heldout:
        which = f"trial {heldout.trial}" if heldout.trial is not None else "base policy"
        lines.append(
            f"held-out ({heldout.label}, {which}): {_params(heldout.parameters, names)}  "
            f"{heldout.objective_used} {_fmt(heldout.score)}  accuracy "
            f"{_fmt(heldout.metrics.get('accuracy'))}"
        )
    scope = (
        "this invocation"
        if result.storage == IN_MEMORY_STORAGE
        else "every invocation and worker of the study, killed ones included"
    )
    lines.append(f"spend: {result.llm_calls} LLM calls, {result.tokens} tokens ({scope})")
    for note in result.notes:
        lines.append(f"note: {note}")
    if result.stopped:
        lines.append(f"stopped early: {result.stopped}; raise the budget and rerun to continue")
    return "\n".join(lines)


def _params(parameters: dict[str, int], names: Sequence[str] = ()) -> str:
    ordered = [n for n in names if n in parameters] + [n for n in parameters if n not in names]
    return " ".join(f"{name}={parameters[name]}" for name in ordered)


# ----- for `evolve compare` ----------------------------------------------------------------------


def tuning_dir_for(target: str, runs_dir: str | Path = "runs") -> Path | None:
    """The tuning directory named by a tuning spec, a name under `runs_dir`, or a path."""
    from evolve.tuning.spec import is_tuning_spec, load_tune_spec
    from evolve.tuning.study import RESULT_FILE

    path = Path(target)
    if path.suffix == ".toml" and path.is_file():
        if not is_tuning_spec(path):
            return None
        candidate = Path(runs_dir) / load_tune_spec(path).name
        return candidate if (candidate / RESULT_FILE).is_file() else None
    for candidate in (Path(runs_dir) / target, path):
        if (candidate / RESULT_FILE).is_file():
            return candidate
    return None


def render_tuning_dir(directory: str | Path) -> str:
    """The study table of `runs/<name>/tuning.json` (what `evolve tune` last saw), with the
    spend read now from the study's journals (they also hold the calls of a killed
    invocation and of workers still running)."""
    from evolve.tuning.spend import StudySpendJournals
    from evolve.tuning.study import TuningStore

    result = TuningStore(Path(directory)).load_result()
    if result.storage != IN_MEMORY_STORAGE:
        journals = StudySpendJournals(directory, result.study_name)
        trials = with_journaled_spend(result.trials, journals.trial_spend())
        spent = journals.total(trials)
        result = result.model_copy(
            update={"trials": trials, "llm_calls": spent.llm_calls, "tokens": spent.tokens}
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
                + (f"  train {_fmt(best_value)}" if best_value is not None else "")
            )
        if "heldout_score" in parent.data.metrics:
            lines.append(
                f"held-out score of the best: {_fmt(parent.data.metrics['heldout_score'])}"
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
