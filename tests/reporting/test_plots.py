"""`evolve.reporting.plots` on scripted records: files written in both formats, axes as documented
(accuracy 0-1, memory score with 0 and 1 in view and marked), labels and legends present."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer

from evolve.reporting.plots import (
    plot_evaluations,
    plot_evolution,
    plot_tuning,
    save_figure,
    score_limits,
)
from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    ExperimentResult,
    GenerationRecord,
    Mutation,
)
from evolve.simulator.metrics import MetricSummary
from evolve.stats import QuestionOutcomes, estimate
from evolve.tuning.records import TrialRecord, TuningResult


def _reference_lines(axis) -> set[float]:
    """y of the horizontal reference lines (axhline: both x ends at 0 and 1 in axes units)."""
    found = set()
    for line in axis.get_lines():
        ys = list(line.get_ydata())
        if len(ys) == 2 and ys[0] == ys[1] and list(line.get_xdata()) == [0, 1]:
            found.add(float(ys[0]))
    return found


def _tuning_result(objective: str, values: dict[tuple[int, int, int], float]) -> TuningResult:
    trials = []
    for number, ((update_every, short_term_len, top_k), value) in enumerate(values.items()):
        pruned = number == 1
        trials.append(
            TrialRecord(
                number=number,
                state="pruned" if pruned else "complete",
                parameters={
                    "update_every": update_every,
                    "short_term_len": short_term_len,
                    "top_k": top_k,
                },
                values=[value],
                objective_used=objective,
                periods={1: value / 2, 2: value} if not pruned else {1: value},
            )
        )
    return TuningResult(
        name="grid",
        study_name="grid",
        storage="sqlite:///x.db",
        config_hash="h",
        objectives=[objective],
        sampler="grid",
        pruner="median",
        requested_trials=len(trials),
        space={"update_every": [2, 4], "short_term_len": [0, 4], "top_k": [1, 3]},
        trials=trials,
        best=[0],
    )


def test_tuning_heatmap_has_a_panel_per_top_k_and_fixed_accuracy_axes(tmp_path):
    values = {
        (2, 0, 1): 0.5,
        (2, 4, 1): 0.25,
        (4, 0, 1): 0.75,
        (4, 4, 3): 1.0,
        (2, 0, 3): 0.0,
    }
    figure = plot_tuning(_tuning_result("accuracy", values))
    axes = figure.axes
    heatmaps = [a for a in axes if a.get_title().startswith("top_k = ")]
    assert [a.get_title() for a in heatmaps] == ["top_k = 1", "top_k = 3"]
    for axis in heatmaps:
        assert axis.get_ylabel() == "update_every" and axis.get_xlabel() == "short_term_len"
        image = axis.get_images()[0]
        assert image.get_clim() == (0.0, 1.0)  # one colour scale, the accuracy range
    # Cell (update_every=4 -> row 1, short_term_len=0 -> column 0) of top_k = 1 holds 0.75.
    cells = heatmaps[0].get_images()[0].get_array()
    assert cells[1, 0] == pytest.approx(0.75) and cells.mask[1, 1]  # (4, 4, 1) not run
    assert any(t.get_text().startswith("0.25\n(pruned)") for t in heatmaps[0].texts)
    curves = next(a for a in axes if a.get_title().startswith("per-period"))
    assert curves.get_ylim() == (0.0, 1.0) and curves.get_ylabel() == "accuracy"
    assert curves.get_xlabel() == "period"
    assert len(curves.get_legend().get_texts()) == len(values)
    written = save_figure(figure, tmp_path / "tune.png")
    assert [p.name for p in written] == ["tune.png", "tune.pdf"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_the_heatmap_frames_the_toolkits_chosen_cell():
    values = {(2, 0, 1): 0.5, (2, 4, 1): 0.25, (4, 0, 1): 0.75, (4, 4, 3): 1.0}
    result = _tuning_result("accuracy", values).model_copy(update={"best": [2]})
    figure = plot_tuning(result)
    top_k_1, top_k_3 = (a for a in figure.axes if a.get_title().startswith("top_k = "))
    # Trial 2 is (update_every=4 -> row 1, short_term_len=0 -> column 0, top_k=1).
    frames = [p for p in top_k_1.patches if not p.get_fill()]
    assert [(p.get_x(), p.get_y()) for p in frames] == [(-0.5, 0.5)]
    assert [t.get_text() for t in top_k_1.texts if "chosen" in t.get_text()] == ["0.75\nchosen"]
    assert not [p for p in top_k_3.patches if not p.get_fill()]  # not in the other panel


def test_memory_score_axes_keep_zero_and_one_in_view_and_marked(tmp_path):
    result = _tuning_result("memory_score", {(2, 0, 1): 1.4, (2, 4, 1): -0.3, (4, 0, 1): 0.5})
    figure = plot_tuning(result)
    curves = next(a for a in figure.axes if a.get_title().startswith("per-period"))
    low, high = curves.get_ylim()
    assert low <= -0.3 and high >= 1.4  # widened for values outside 0..1
    assert {0.0, 1.0} <= _reference_lines(curves)
    heatmap = next(a for a in figure.axes if a.get_title() == "top_k = 1")
    assert heatmap.get_images()[0].get_clim() == (-0.3, 1.4)
    assert score_limits("memory_score", [0.2, 0.4]) == (-0.1, 1.1)
    assert score_limits("accuracy", [0.2, 3.0]) == (0.0, 1.0)
    save_figure(figure, tmp_path / "memory")
    assert (tmp_path / "memory.pdf").stat().st_size > 1000


def _summary(accuracy: float, write: float, read: float) -> MetricSummary:
    return MetricSummary(
        accuracy=accuracy,
        memory_score=accuracy * 1.2 - 0.1,
        write_failure_rate=write,
        read_failure_rate=read,
        utilization_failure_rate=round(1.0 - accuracy - write - read, 6),
    )


def _outcomes(per_user: dict[str, float], questions: int = 20) -> QuestionOutcomes:
    """Per-question records on which each user's accuracy is `per_user[user]`."""
    keys, correct = [], []
    for user, accuracy in per_user.items():
        right = round(accuracy * questions)
        keys += [("", user, 0, index) for index in range(questions)]
        correct += [1.0] * right + [0.0] * (questions - right)
    return QuestionOutcomes(
        keys=tuple(keys),
        correct=np.array(correct),
        random_score=np.full(len(keys), 1 / 3),
        upper_bound=np.ones(len(keys)),
    )


def _scores(
    score: float, per_user: dict[str, float], summary: MetricSummary, with_estimate: bool = True
) -> EvaluationScores:
    return EvaluationScores(
        users=list(per_user),
        score=score,
        objective="accuracy",
        objective_used="accuracy",
        per_user=per_user,
        summary=summary,
        run_dir="r",
        estimate=estimate(_outcomes(per_user)) if with_estimate else None,
    )


def _candidate(
    cid: str, generation: int, train: float, heldout: float | None, parents: tuple[str, ...] = ()
) -> CandidateRecord:
    summary = _summary(train, write=0.1 * (3 - generation), read=0.1)
    return CandidateRecord(
        id=cid,
        generation=generation,
        parent_ids=parents,
        mutation=Mutation(kind="base" if not parents else "reflective", component="write"),
        seed=0,
        fingerprint=cid,
        kind="in_context",
        components={"write": cid},
        parameters={"update_every": 2},
        status=CandidateStatus.EVALUATED,
        # c1's train record predates estimates: no interval, so no bar.
        train=_scores(train, {"u1": train - 0.1, "u2": train + 0.1}, summary, cid != "c1"),
        heldout=(
            _scores(heldout, {"u3": heldout, "u4": heldout}, _summary(heldout, 0.1, 0.1))
            if heldout
            else None
        ),
    )


def _experiment() -> ExperimentResult:
    candidates = [
        _candidate("c0", 0, 0.3, 0.25),
        _candidate("c1", 1, 0.4, None, ("c0",)),
        _candidate("c2", 1, 0.5, 0.45, ("c0",)),
        _candidate("c3", 2, 0.6, 0.5, ("c2",)),
    ]
    generations = [
        GenerationRecord(generation=0, candidate_ids=["c0"], best_id="c0"),
        GenerationRecord(generation=1, candidate_ids=["c1", "c2"], best_id="c2"),
        GenerationRecord(generation=2, candidate_ids=["c3"], best_id="c3"),
    ]
    return ExperimentResult(
        name="quick",
        config_hash="h",
        schedule="population",
        candidates=candidates,
        generations=generations,
        best_id="c3",
    )


def _bars(axis) -> list[np.ndarray]:
    """The segment of every error bar drawn on `axis` (one per errorbar container)."""
    return [
        segment
        for container in axis.containers
        if isinstance(container, ErrorbarContainer)
        for collection in container.lines[2]
        for segment in collection.get_segments()
    ]


def _interval(per_user: dict[str, float], which: str = "accuracy") -> list[float]:
    interval = getattr(estimate(_outcomes(per_user)), which).interval
    return [interval.low, interval.high]


def test_evolution_figure_intervals_heldout_versus_train_and_breakdown(tmp_path):
    figure = plot_evolution(_experiment())
    scores_axis, versus_axis, breakdown_axis = figure.axes
    assert scores_axis.get_ylim() == (0.0, 1.0) and scores_axis.get_ylabel() == "accuracy"
    assert scores_axis.get_xlabel() == "generation"
    assert [t.get_text() for t in scores_axis.get_legend().get_texts()] == ["train", "held-out"]
    # Each score with its 95% interval, recomputed from the users' questions: a bar per
    # candidate and split with an estimate (3 train: c1 has none; 3 held-out).
    bars = {round(float(s[0][0]), 2): sorted(s[:, 1]) for s in _bars(scores_axis)}
    assert all(s[0][0] == s[1][0] for s in _bars(scores_axis))  # vertical
    expected = {
        -0.12: _interval({"u1": 0.2, "u2": 0.4}),  # c0 train
        0.12: _interval({"u3": 0.25, "u4": 0.25}),  # c0 held-out
        0.88: _interval({"u1": 0.4, "u2": 0.6}),  # c2 train (c1's has no estimate)
        1.12: _interval({"u3": 0.45, "u4": 0.45}),  # c2 held-out (c1 has none)
        1.88: _interval({"u1": 0.5, "u2": 0.7}),  # c3 train
        2.12: _interval({"u3": 0.5, "u4": 0.5}),  # c3 held-out
    }
    assert sorted(bars) == sorted(expected)
    for x, ends in expected.items():
        assert bars[x] == pytest.approx(ends), x
        assert ends[1] - ends[0] > 0.1  # a real interval, not the point repeated
    # Each user's score, as dots beside the bar.
    dots = [
        sorted(c.get_offsets()[:, 1])
        for c in scores_axis.collections
        if len(c.get_offsets()) == 2 and c.get_offsets()[0][0] == pytest.approx(-0.12)
    ]
    assert dots == [pytest.approx([0.2, 0.4])]
    assert versus_axis.get_xlim() == (0.0, 1.0) and versus_axis.get_ylim() == (0.0, 1.0)
    assert versus_axis.get_xlabel() == "train accuracy"
    assert versus_axis.get_ylabel() == "held-out accuracy"
    points = versus_axis.collections[0].get_offsets()
    assert len(points) == 3  # c1 has no held-out score
    # Held-out vs train: the held-out interval upright through the point, the train one across.
    versus = _bars(versus_axis)
    c3_train, c3_heldout = _interval({"u1": 0.5, "u2": 0.7}), _interval({"u3": 0.5, "u4": 0.5})
    upright = [sorted(s[:, 1]) for s in versus if s[0][0] == s[1][0] == pytest.approx(0.6)]
    across = [sorted(s[:, 0]) for s in versus if s[0][1] == s[1][1] == pytest.approx(0.5)]
    assert upright == [pytest.approx(c3_heldout)] and across == [pytest.approx(c3_train)]
    assert len(versus) == 6  # two bars for each of the three candidates
    assert breakdown_axis.get_ylim() == (0.0, 1.0)
    labels = [t.get_text() for t in breakdown_axis.get_legend().get_texts()]
    assert labels == ["correct", "write failure", "read failure", "utilization failure"]
    # Each generation's bars stack to 1 (correct + the three failure kinds).
    heights: dict[float, float] = {}
    for bar in breakdown_axis.patches:
        x = round(bar.get_x() + bar.get_width() / 2, 6)
        heights[x] = heights.get(x, 0.0) + bar.get_height()
    assert sorted(heights) == [0.0, 1.0, 2.0]
    assert all(h == pytest.approx(1.0) for h in heights.values())
    written = save_figure(figure, tmp_path / "evolution.png")
    assert all(p.stat().st_size > 1000 for p in written)


def test_unscored_proposals_are_drawn_and_a_kept_best_repeats_no_bar():
    result = _experiment()
    invalid = result.candidates[0].model_copy(
        update={
            "id": "c4",
            "generation": 3,
            "status": CandidateStatus.INVALID,
            "train": None,
            "heldout": None,
        }
    )
    result = result.model_copy(
        update={
            "candidates": [*result.candidates, invalid],
            "generations": [
                *result.generations,
                GenerationRecord(generation=3, candidate_ids=["c4"], best_id="c3"),
            ],
        }
    )
    scores_axis, _, breakdown_axis = plot_evolution(result).axes
    # The invalid proposal of generation 3: a cross at its generation, named in the legend.
    crosses = [c for c in scores_axis.collections if c.get_label().startswith("not scored")]
    assert len(crosses) == 1 and crosses[0].get_label() == "not scored (invalid)"
    assert list(crosses[0].get_offsets()[:, 0]) == [3]
    assert scores_axis.get_xlim() == (-0.5, 3.5)  # in view, not cut at the edge
    # Generation 3 kept c3: no second bar of c3's answers, a "same best" mark instead.
    centres = {round(bar.get_x() + bar.get_width() / 2, 6) for bar in breakdown_axis.patches}
    assert centres == {0.0, 1.0, 2.0}
    assert [t.get_text() for t in breakdown_axis.texts] == ["same\nbest"]
    assert list(breakdown_axis.get_xticks()) == [0, 1, 2, 3]


def test_evaluation_curves_one_line_per_policy(tmp_path):
    per_period = {
        "in_context": [_summary(0.4, 0.2, 0.2), _summary(0.6, 0.1, 0.1)],
        "no_memory": [
            MetricSummary(accuracy=0.2, memory_score=None),
            MetricSummary(accuracy=0.25, memory_score=None),
        ],
    }
    figure = plot_evaluations(per_period, "eval: 2 policies")
    memory_axis, accuracy_axis = figure.axes
    assert memory_axis.get_ylabel() == "memory score"
    assert {0.0, 1.0} <= _reference_lines(memory_axis)
    low, high = memory_axis.get_ylim()
    assert low <= 0.0 and high >= 1.0
    assert [t.get_text() for t in memory_axis.get_legend().get_texts()] == ["in_context"]
    assert any("undefined for: no_memory" in t.get_text() for t in memory_axis.texts)
    assert accuracy_axis.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in accuracy_axis.get_legend().get_texts()] == [
        "in_context",
        "no_memory",
    ]
    assert list(accuracy_axis.get_lines()[0].get_xdata()) == [0, 1]  # period indices
    assert list(accuracy_axis.get_xticks()) == [0, 1]  # whole periods only
    written = save_figure(figure, Path(tmp_path) / "sub" / "eval")
    assert [p.suffix for p in written] == [".png", ".pdf"]
    assert all(p.stat().st_size > 1000 for p in written)


@pytest.mark.parametrize("used", ["memory_score", "accuracy"])
def test_the_error_bar_is_the_interval_of_the_score_plotted(used):
    """A memory-score run plots the memory score, or accuracy where that is undefined
    (`objective_used`): the bar must be that score's interval, not the other one's."""
    per_user = {"u1": 0.5, "u2": 0.8}
    scores = estimate(_outcomes(per_user))
    plotted = scores.memory_score if used == "memory_score" else scores.accuracy
    record = _candidate("c0", 0, 0.3, None).model_copy(
        update={
            "train": _scores(0.3, per_user, _summary(0.65, 0.1, 0.1)).model_copy(
                update={"objective": "memory_score", "objective_used": used, "score": plotted.value}
            )
        }
    )
    generation = GenerationRecord(generation=0, candidate_ids=["c0"], best_id="c0")
    result = _experiment().model_copy(
        update={"candidates": [record], "generations": [generation], "best_id": "c0"}
    )
    scores_axis = plot_evolution(result).axes[0]
    (bar,) = _bars(scores_axis)
    assert sorted(bar[:, 1]) == pytest.approx([plotted.interval.low, plotted.interval.high])
    memory, accuracy = scores.memory_score.interval, scores.accuracy.interval
    assert abs(memory.low - accuracy.low) > 0.05  # the two intervals tell the cases apart
