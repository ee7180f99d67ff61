"""Tables of a tuning study: every trial, the best setting (or Pareto front), held-out checks.

Rendered from a `TuningResult` (`runs/<name>/tuning.json`); `evolve.tuning.readback` reads
one back, or rebuilds the trial table from MLflow, for `evolve compare`.
"""

from __future__ import annotations

from collections.abc import Sequence

from evolve.results.objective import format_score, scores_text
from evolve.tuning.records import (
    IN_MEMORY_STORAGE,
    TrialRecord,
    TuningResult,
)


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
    head += [
        f"{'objective':>9}",
        f"{'memory':>7}",
        f"{'acc':>6}",
        f"{'tokens':>8}",
        f"{'calls':>6}",
    ]
    header = " ".join(head)
    lines = [header, "-" * len(header)]
    for r in sorted(shown, key=lambda r: r.number):
        cells = [f"{r.number:>5}", f"{_state_text(r):<11}"]
        cells += [
            str(r.parameters.get(n, "-")).rjust(w) for n, w in zip(names, name_width, strict=True)
        ]
        value = r.values[0] if r.values else (r.periods.get(r.last_period) if r.periods else None)
        cells += [
            f"{format_score(value):>9}",
            f"{format_score(r.metrics.get('memory_score')):>7}",
            f"{format_score(r.metrics.get('accuracy')):>6}",
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
                f"{format_score(values[0])}  tokens {int(values[1] or 0)}"
            )
    else:
        record = result.trial(result.best[0])
        used = record.objective_used or objective
        lines.append(
            f"best: trial {record.number}: {_params(record.parameters, names)}  train {used} "
            f"{format_score(record.values[0] if record.values else None)}"
        )
    for heldout in result.heldout:
        which = f"trial {heldout.trial}" if heldout.trial is not None else "base policy"
        lines.append(
            f"held-out ({heldout.label}, {which}): {_params(heldout.parameters, names)}  "
            f"{scores_text(heldout.metrics, heldout.objective_used)}"
        )
        if heldout.estimate is not None:
            lines.append(
                f"  95% intervals: accuracy {heldout.estimate.accuracy.format()}, memory score "
                f"{heldout.estimate.memory_score.format()}"
            )
        if heldout.against_base is not None:
            lines.append(f"  vs the base parameters: {heldout.against_base.describe()}")
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
