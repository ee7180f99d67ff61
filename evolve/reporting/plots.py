"""Paper-readable figures of stored results: a tuning study, an evolution run, an evaluation.

Why one module: the shared axis conventions below are the point; one file keeps every
figure on them.

`evolve compare --plot FILE` draws one figure per result and saves it as PNG and PDF (the
suffix of FILE is replaced). Every figure follows the same conventions so that figures can
sit side by side in a paper:

- accuracy is drawn on 0-1;
- the memory score axis always shows 0 (random) and 1 (upper bound) as reference lines and
  widens only when a value falls outside them (a policy worse than random, or better than the
  agent model given the gold state);
- axes carry labels with the metric's name, legends name every series.

Hand-written with matplotlib rather than `optuna.visualization.matplotlib`: the paper's
tuning figure is a grid of cells over the discrete values of `update_every` x
`short_term_len`, while Optuna's `plot_contour` interpolates a contour between trials and
its `plot_intermediate_values` neither fixes the value axis nor marks 0 and 1; both would
also need the live study, whereas these figures are drawn from the stored records (a
snapshot or the live study, see `evolve.commands.compare`). The functions return the
matplotlib `Figure` (closed after saving) so tests can read the axes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.optimize.report import accuracy_references
from evolve.results.records import CandidateRecord, EvaluationScores, ExperimentResult
from evolve.simulator.metric_registry import METRICS
from evolve.simulator.metrics import MetricSummary
from evolve.stats import Interval
from evolve.tuning.records import TrialRecord, TuningResult
from memory_policies.parameters import short_name

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# Formats every figure is saved in.
FORMATS = ("png", "pdf")
_DPI = 150
_REFERENCE_STYLE = {"color": "0.45", "linewidth": 0.8, "linestyle": ":"}
# Stacked breakdown of a candidate's answers: correct + the three failure kinds = 1.
_BREAKDOWN = (
    ("accuracy", "correct", "#4c72b0"),
    ("write_failure_rate", "write failure", "#dd8452"),
    ("read_failure_rate", "read failure", "#c44e52"),
    ("utilization_failure_rate", "utilization failure", "#8172b3"),
)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def metric_label(metric: str) -> str:
    declaration = METRICS.get(metric)
    return declaration.label if declaration else metric.replace("_", " ")


def is_accuracy(metric: str | None) -> bool:
    return metric == "accuracy"


def score_limits(metric: str | None, values: Sequence[float | None]) -> tuple[float, float]:
    """The value axis of `metric`: its declared range when bounded (accuracy 0-1); else (a
    memory score) at least -0.1..1.1, wider when a value lies outside (so 0 and 1 are
    always in view)."""
    declaration = METRICS.get(metric or "")
    if declaration is not None and declaration.bounded:
        return (declaration.low, declaration.high)  # type: ignore[return-value]
    finite = [v for v in values if v is not None and math.isfinite(v)]
    low = min([-0.1, *(v - 0.05 for v in finite)])
    high = max([1.1, *(v + 0.05 for v in finite)])
    return (low, high)


def style_score_axis(axis: Axes, metric: str | None, values: Sequence[float | None]) -> None:
    """Limits, label and (memory score) the random / upper-bound reference lines."""
    axis.set_ylim(*score_limits(metric, values))
    axis.set_ylabel(metric_label(metric or "score"))
    if not is_accuracy(metric):
        axis.axhline(0.0, **_REFERENCE_STYLE)
        axis.axhline(1.0, **_REFERENCE_STYLE)
        axis.text(
            1.0, 0.0, " random", transform=axis.get_yaxis_transform(), va="bottom", fontsize=7
        )
        axis.text(
            1.0, 1.0, " upper bound", transform=axis.get_yaxis_transform(), va="bottom", fontsize=7
        )
    axis.grid(alpha=0.3)


def integer_ticks(axis: Axes, steps: set[int]) -> None:
    """Periods and generations are whole numbers: tick each one (a locator when many)."""
    from matplotlib.ticker import MaxNLocator

    if 0 < len(steps) <= 12:
        axis.set_xticks(sorted(steps))
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(figure: Figure, path: str | Path) -> list[Path]:
    """Save `figure` as PNG and PDF next to `path` (its suffix replaced); close it."""
    plt = _pyplot()
    base = Path(path)
    if base.suffix.lower().lstrip(".") in FORMATS:
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for extension in FORMATS:
            target = base.with_name(f"{base.name}.{extension}")
            # No creation date in the PDF: the same results give the same file.
            metadata = {"CreationDate": None} if extension == "pdf" else None
            figure.savefig(target, dpi=_DPI, bbox_inches="tight", metadata=metadata)
            written.append(target)
    finally:
        plt.close(figure)
    return written


# ----- tuning study -----------------------------------------------------------------------------


def _trial_value(record: TrialRecord) -> float | None:
    if record.values:
        return record.values[0]
    if record.periods:
        return record.periods[max(record.periods)]
    return None


def _tuning_metric(result: TuningResult) -> str:
    used = {r.objective_used for r in result.trials if r.objective_used}
    if len(used) == 1:
        return used.pop()
    return result.objectives[0]


@dataclass(frozen=True)
class HeatmapAxes:
    rows: str  # parameter on the vertical axis
    columns: str  # parameter on the horizontal axis
    slices: str | None  # a third parameter: one panel per value


def heatmap_axes(space: Mapping[str, Sequence[int]]) -> HeatmapAxes:
    """update_every down, short_term_len across, top_k (or any third parameter) in slices;
    a study over other parameters uses its first two (one: a single row)."""
    names = list(space)
    preferred = [n for n in ("update_every", "short_term_len") if n in names]
    others = [n for n in names if n not in preferred]
    ordered = preferred + others
    if len(ordered) == 1:
        return HeatmapAxes(rows=ordered[0], columns=ordered[0], slices=None)
    return HeatmapAxes(
        rows=ordered[0], columns=ordered[1], slices=ordered[2] if len(ordered) > 2 else None
    )


def plot_tuning(result: TuningResult) -> Figure:
    """Heatmaps of the objective over the grid (one per value of the slice parameter, e.g.
    top_k) and the per-period curves of every trial (the values the pruner saw)."""
    plt = _pyplot()
    metric = _tuning_metric(result)
    shown = [r for r in result.trials if r.state in ("complete", "pruned")]
    layout = heatmap_axes(result.space)
    slice_values: list[int | None] = list(result.space[layout.slices]) if layout.slices else [None]
    panels = len(slice_values) + 1
    figure, axes = plt.subplots(
        1, panels, figsize=(4.2 * panels, 3.8), squeeze=False, layout="constrained"
    )
    values = [v for v in (_trial_value(r) for r in shown) if v is not None]
    # The colour scale: 0..1, widened for a memory score outside it (one scale for all panels).
    low, high = min([0.0, *values]), max([1.0, *values])
    if is_accuracy(metric):
        low, high = 0.0, 1.0
    image = None
    for axis, slice_value in zip(axes[0][:-1], slice_values, strict=True):
        image = _heatmap(axis, result, shown, layout, slice_value, low, high)
    if image is not None:
        colorbar = figure.colorbar(image, ax=list(axes[0][:-1]), shrink=0.9)
        colorbar.set_label(metric_label(metric))
        colorbar.set_ticks(sorted({low, high, 0.0, 1.0} & _between(low, high)))
    _trial_curves(axes[0][-1], result, metric)
    figure.get_layout_engine().set(w_pad=0.2)  # the colour bar's label and the curves' axis
    figure.suptitle(
        f"{result.name}: study {result.study_name} ({result.finished_trials}/"
        f"{result.requested_trials} trials)"
    )
    return figure


def _between(low: float, high: float) -> set[float]:
    return {v for v in (low, high, 0.0, 0.5, 1.0) if low <= v <= high}


def _heatmap(
    axis: Axes,
    result: TuningResult,
    trials: Sequence[TrialRecord],
    layout: HeatmapAxes,
    slice_value: int | None,
    low: float,
    high: float,
) -> Any:
    import numpy as np
    from matplotlib.patches import Rectangle

    row_values = list(result.space[layout.rows])
    column_values = list(result.space[layout.columns]) if layout.columns != layout.rows else [0]
    cells = np.full((len(row_values), len(column_values)), np.nan)
    states: dict[tuple[int, int], str] = {}
    for record in trials:
        params = record.parameters
        if layout.slices is not None and params.get(layout.slices) != slice_value:
            continue
        value = _trial_value(record)
        if value is None or params.get(layout.rows) not in row_values:
            continue
        i = row_values.index(params[layout.rows])
        j = column_values.index(params[layout.columns]) if layout.columns != layout.rows else 0
        # A grid point evaluated twice (a resumed study with a new sampler): keep the best.
        if np.isnan(cells[i, j]) or value > cells[i, j]:
            cells[i, j] = value
            states[(i, j)] = record.state
    image = axis.imshow(
        np.ma.masked_invalid(cells), cmap="viridis", vmin=low, vmax=high, origin="lower"
    )
    chosen = _chosen_cells(result, layout, slice_value, row_values, column_values)
    for i, j in chosen:  # the toolkit's choice, framed (its value is what the cell shows)
        axis.add_patch(
            Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5)
        )
    for (i, j), state in states.items():
        text = f"{cells[i, j]:.2f}" + ("\n(pruned)" if state == "pruned" else "")
        text += "\nchosen" if (i, j) in chosen else ""
        shade = (cells[i, j] - low) / (high - low) if high > low else 0.0
        axis.text(
            j,
            i,
            text,
            ha="center",
            va="center",
            fontsize=8,
            color="black" if shade > 0.6 else "white",
        )
    axis.set_yticks(range(len(row_values)), [str(v) for v in row_values])
    axis.set_ylabel(layout.rows)
    if layout.columns != layout.rows:
        axis.set_xticks(range(len(column_values)), [str(v) for v in column_values])
        axis.set_xlabel(layout.columns)
    else:
        axis.set_xticks([])
    title = "objective per setting"
    if layout.slices is not None:
        title = f"{layout.slices} = {slice_value}"
    axis.set_title(title)
    return image


def _chosen_cells(
    result: TuningResult,
    layout: HeatmapAxes,
    slice_value: int | None,
    row_values: list[int],
    column_values: list[int],
) -> set[tuple[int, int]]:
    """The (row, column) cells of the toolkit's chosen trial(s) in this panel."""
    cells = set()
    for number in result.best:
        params = result.trial(number).parameters
        if layout.slices is not None and params.get(layout.slices) != slice_value:
            continue
        across = layout.columns != layout.rows
        if params.get(layout.rows) not in row_values or (
            across and params.get(layout.columns) not in column_values
        ):
            continue
        i = row_values.index(params[layout.rows])
        cells.add((i, column_values.index(params[layout.columns]) if across else 0))
    return cells


def _trial_curves(axis: Axes, result: TuningResult, metric: str) -> None:

    values: list[float] = []
    steps: set[int] = set()
    for record in sorted(result.trials, key=lambda r: r.number):
        if not record.periods or record.state not in ("complete", "pruned"):
            continue
        periods = sorted(record.periods)
        series = [record.periods[p] for p in periods]
        values += series
        steps.update(periods)
        style = "--" if record.state == "pruned" else "-"
        label = f"#{record.number} " + " ".join(
            f"{short_name(n)}={v}" for n, v in record.parameters.items()
        )
        axis.plot(periods, series, style, marker="o", markersize=3, label=label)
    style_score_axis(axis, metric, values)
    axis.set_xlabel("period")
    integer_ticks(axis, steps)
    axis.set_title("per-period value of each trial (dashed: pruned)")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=6, loc="best")


# ----- evolution run ----------------------------------------------------------------------------


def _evolution_metric(result: ExperimentResult) -> str:
    for record in result.candidates:
        for scores in (record.train, record.heldout):
            if scores is not None:
                used = scores.objective_used or scores.objective
                return "accuracy" if used == "accuracy" else "memory_score"
    return "memory_score"


def _scored(result: ExperimentResult) -> list[CandidateRecord]:
    return [r for r in result.candidates if r.train is not None]


def plot_evolution(result: ExperimentResult) -> Figure:
    """Three panels: every candidate's train and held-out score per generation with its 95%
    interval (bar; `EvaluationScores.estimate`, see `evolve.reporting.intervals.with_estimates`)
    and each user's score (dots); held-out vs train per candidate, with both intervals; the
    answer breakdown (correct / write / read / utilization failure) of each generation's best
    on the train users."""
    plt = _pyplot()
    metric = _evolution_metric(result)
    figure, (scores_axis, versus_axis, breakdown_axis) = plt.subplots(
        1, 3, figsize=(14.0, 4.0), layout="constrained"
    )
    step = "generation" if result.schedule == "population" else "period"
    _candidate_points(scores_axis, result, metric, step)
    _heldout_versus_train(versus_axis, result, metric)
    _breakdown(breakdown_axis, result, step)
    scored = len(_scored(result))
    figure.suptitle(f"{result.name}: {scored} candidate{'' if scored == 1 else 's'} evaluated")
    return figure


def _candidate_points(axis: Axes, result: ExperimentResult, metric: str, step: str) -> None:

    values: list[float] = []
    for split, offset, colour, marker in (
        ("train", -0.12, "#4c72b0", "o"),
        ("heldout", 0.12, "#dd8452", "^"),
    ):
        first = True
        for record in result.candidates:
            scores = getattr(record, split)
            if scores is None:
                continue
            x = record.generation + offset
            per_user = [v for v in scores.per_user.values() if v is not None]
            if per_user:
                axis.scatter([x] * len(per_user), per_user, s=6, color=colour, alpha=0.35)
            interval = score_interval(scores)
            if interval is not None:
                interval_bar(axis, (x, scores.score), interval, colour, vertical=True)
                values += [interval.low, interval.high]
            label = None
            if first:
                label = "train" if split == "train" else "held-out"
                first = False
            axis.scatter([x], [scores.score], marker=marker, s=30, color=colour, label=label)
            values += [scores.score, *per_user]
    values += _reference_lines(axis, result, metric)
    style_score_axis(axis, metric, values)
    _unscored_proposals(axis, result)
    axis.set_xlabel(step)
    generations = {record.generation for record in result.candidates}
    integer_ticks(axis, generations)
    if generations:  # every generation in view, one that only made unscored proposals too
        axis.set_xlim(min(generations) - 0.5, max(generations) + 0.5)
    axis.set_title("candidates (bar: 95% interval; dots: users)")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=8)


def score_interval(scores: EvaluationScores) -> Interval | None:
    """The 95% interval of what `scores.score` is (the memory score, or accuracy where that
    is undefined), or None without an estimate (see `evolve.reporting.intervals`)."""
    if scores.estimate is None:
        return None
    used = scores.objective_used or scores.objective
    chosen = scores.estimate.accuracy if used == "accuracy" else scores.estimate.memory_score
    return chosen.interval


def interval_bar(
    axis: Axes, point: tuple[float, float], interval: Interval, colour: str, vertical: bool
) -> None:
    """An error bar from `interval.low` to `interval.high` through `point`, as an errorbar
    container (tests read it from `axis.containers`). Drawn about the interval's middle: a
    percentile interval need not contain its point estimate, and errorbar refuses negative
    extents."""
    x, y = point
    middle = (interval.low + interval.high) / 2
    extent = {"yerr" if vertical else "xerr": interval.half_width}
    axis.errorbar(
        x if vertical else middle,
        middle if vertical else y,
        **extent,
        fmt="none",
        ecolor=colour,
        elinewidth=1.0,
        capsize=3,
        alpha=0.8,
    )


def reference_levels(result: ExperimentResult, metric: str) -> dict[str, float]:
    """Chance and the upper bound on `metric`'s scale: 0 and 1 for a memory score (its
    definition), else the run's mean random and upper-bound accuracy."""
    if metric != "accuracy":
        return {"chance": 0.0, "upper bound": 1.0}
    return accuracy_references(result)


def _reference_lines(axis: Axes, result: ExperimentResult, metric: str) -> list[float]:
    colours = {"chance": "0.45", "upper bound": "#55a868"}
    levels = reference_levels(result, metric)
    for name, level in levels.items():
        axis.axhline(level, color=colours[name], linewidth=0.9, linestyle="--", label=name)
    return list(levels.values())


def _heldout_versus_train(axis: Axes, result: ExperimentResult, metric: str) -> None:
    pairs = [
        (r.train, r.heldout, r.id)
        for r in result.candidates
        if r.train is not None and r.heldout is not None
    ]
    # Both axes on one scale (the diagonal means held-out = train), wide enough for the bars.
    values = [v for train, heldout, _ in pairs for v in (train.score, heldout.score)]
    values += [
        end
        for train, heldout, _ in pairs
        for interval in (score_interval(train), score_interval(heldout))
        if interval is not None
        for end in (interval.low, interval.high)
    ]
    low, high = score_limits(metric, values)
    axis.plot([low, high], [low, high], **_REFERENCE_STYLE, label="held-out = train")
    if pairs:
        axis.scatter(
            [train.score for train, _, _ in pairs],
            [heldout.score for _, heldout, _ in pairs],
            s=24,
            color="#55a868",
            label="candidate (bars: 95% intervals)",
        )
        for train, heldout, candidate in pairs:
            point = (train.score, heldout.score)
            for scores, vertical in ((heldout, True), (train, False)):
                interval = score_interval(scores)
                if interval is not None:
                    interval_bar(axis, point, interval, "#55a868", vertical)
            if candidate == result.best_id:
                axis.scatter(*point, s=90, facecolors="none", edgecolors="black")
                axis.annotate("best", point, textcoords="offset points", xytext=(6, 4))
    else:
        axis.text(0.5, 0.5, "no held-out scores", ha="center", transform=axis.transAxes)
    style_score_axis(axis, metric, values)
    axis.set_xlim(low, high)
    axis.set_xlabel(f"train {metric_label(metric)}")
    axis.set_ylabel(f"held-out {metric_label(metric)}")
    axis.set_title("held-out vs train")
    axis.legend(fontsize=8, loc="upper left")


def _unscored_proposals(axis: Axes, result: ExperimentResult) -> None:
    """Proposals never scored (invalid, duplicate) as grey crosses along the bottom of the
    score axis at their generation: a generation that proposed and failed is not empty."""
    unscored = [r for r in result.candidates if r.train is None and r.heldout is None]
    if not unscored:
        return
    axis.scatter(
        [r.generation for r in unscored],
        [0.04] * len(unscored),
        marker="x",
        s=30,
        color="#7f7f7f",
        transform=axis.get_xaxis_transform(),  # x: generation, y: the axis' own height
        label=f"not scored ({', '.join(sorted({str(r.status) for r in unscored}))})",
    )


def _breakdown(axis: Axes, result: ExperimentResult, step: str) -> None:
    """One bar per generation that changed the best: a generation that kept it would only
    repeat the bar before it, so it is marked `same best` instead."""
    generations: list[int] = []
    kept: list[int] = []
    parts: dict[str, list[float]] = {name: [] for name, _, _ in _BREAKDOWN}
    previous: str | None = None
    for generation in result.generations:
        if generation.best_id is None:
            continue
        record = result.candidate(generation.best_id)
        if record.train is None:
            continue
        if generation.best_id == previous and record.train.periods is None:
            kept.append(generation.generation)
            continue
        previous = generation.best_id
        summary = _generation_summary(record, generation.generation)
        generations.append(generation.generation)
        for name, _, _ in _BREAKDOWN:
            parts[name].append(float(getattr(summary, name) or 0.0))
    bottom = [0.0] * len(generations)
    for name, label, colour in _BREAKDOWN:
        axis.bar(generations, parts[name], bottom=bottom, color=colour, label=label, width=0.7)
        bottom = [b + v for b, v in zip(bottom, parts[name], strict=True)]
    for generation in kept:
        axis.text(generation, 0.02, "same\nbest", ha="center", va="bottom", fontsize=7)
    axis.set_ylim(0.0, 1.0)
    axis.set_ylabel("share of answers (best candidate, train)")
    axis.set_xlabel(step)
    shown = sorted(generations + kept)
    axis.set_xticks(shown)
    if shown:
        axis.set_xlim(shown[0] - 0.5, shown[-1] + 0.5)
    axis.set_title("correct + write / read / utilization failures")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _generation_summary(record: CandidateRecord, generation: int) -> MetricSummary:
    scores = record.train
    assert scores is not None
    if scores.periods is not None and generation in scores.periods:  # per_period: its period
        return scores.per_period[scores.periods.index(generation)]
    return scores.summary


# ----- evaluation of several policies -----------------------------------------------------------


def plot_evaluations(per_period: Mapping[str, Sequence[MetricSummary]], title: str) -> Figure:
    """Per-period memory score (left) and accuracy (right), one line per policy."""

    plt = _pyplot()
    figure, (memory_axis, accuracy_axis) = plt.subplots(
        1, 2, figsize=(10.0, 4.0), layout="constrained"
    )
    memory_values: list[float] = []
    undefined: list[str] = []
    for name, summaries in per_period.items():
        periods = list(range(len(summaries)))  # period indices, as the runner numbers them
        memory = [s.memory_score for s in summaries]
        if any(v is not None for v in memory):
            points = [(p, v) for p, v in zip(periods, memory, strict=True) if v is not None]
            memory_axis.plot(*zip(*points, strict=True), marker="o", label=name)
            memory_values += [v for _, v in points]
        else:
            undefined.append(name)
        accuracy = [(p, s.accuracy) for p, s in zip(periods, summaries, strict=True)]
        accuracy = [(p, v) for p, v in accuracy if v is not None]
        if accuracy:
            accuracy_axis.plot(*zip(*accuracy, strict=True), marker="o", label=name)
    style_score_axis(memory_axis, "memory_score", memory_values)
    style_score_axis(accuracy_axis, "accuracy", [])
    memory_axis.set_title("memory score per period")
    if undefined:
        memory_axis.text(
            0.5,
            0.5,
            "memory score undefined for: " + ", ".join(undefined),
            ha="center",
            fontsize=8,
            transform=memory_axis.transAxes,
        )
    accuracy_axis.set_title("accuracy per period")
    longest = max((len(summaries) for summaries in per_period.values()), default=0)
    for axis in (memory_axis, accuracy_axis):
        axis.set_xlabel("period")
        integer_ticks(axis, set(range(longest)))
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    figure.suptitle(title)
    return figure
