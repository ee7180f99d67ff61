"""Metrics are declared once (`metric_registry`); summaries, tracking, figures and tables
read the declarations, so a declared metric appears everywhere without further edits."""

from __future__ import annotations

import pytest

from evolve.commands.eval import format_original_table, format_table
from evolve.reporting.plots import metric_label, score_limits
from evolve.simulator.evaluation import EvaluationReport
from evolve.simulator.metric_registry import (
    METRICS,
    MetricDeclaration,
    declare_metric,
    metrics_in,
)
from evolve.simulator.metrics import MetricSummary
from evolve.tracking import per_period_table


def test_every_score_of_a_summary_is_declared_with_its_description():
    scores = {
        name
        for name, field in MetricSummary.model_fields.items()
        if field.annotation == float | None
    }
    assert scores == set(METRICS)
    for name in scores:
        assert MetricSummary.model_fields[name].description == METRICS[name].description
    for declaration in METRICS.values():
        assert declaration.direction in ("maximize", "minimize", "none")
        assert declaration.description and declaration.label and declaration.column


def test_the_tables_list_the_declared_columns_in_order():
    report = _report(MetricSummary(accuracy=0.5, memory_score=0.25, memory_success=0.75))
    header, _, row = format_table([("native", report)]).splitlines()
    assert header.split()[1:9] == [d.column for d in metrics_in("eval")]
    assert header.split()[1:9] == [
        "acc",
        "memory",
        "mem/period",
        "random",
        "UB",
        "write",
        "read",
        "util",
    ]
    assert row.split()[1:3] == ["0.500", "0.250"]
    original = format_original_table([("native", report)]).splitlines()
    assert original[0].split()[1:3] == ["acc+rf", "paper-mem"]
    assert original[2].split()[-1] == "0.750"


@pytest.fixture
def headroom():
    """A metric derived from a summary, declared as a user would, removed afterwards."""
    declaration = declare_metric(
        MetricDeclaration(
            name="headroom",
            label="headroom to the upper bound",
            column="headroom",
            direction="minimize",
            low=-1.0,
            high=1.0,
            description="Upper-bound accuracy minus accuracy.",
            views=frozenset({"eval", "per_period"}),
            compute=lambda s: (
                None
                if s.upper_bound_score is None or s.accuracy is None
                else s.upper_bound_score - s.accuracy
            ),
        )
    )
    yield declaration
    METRICS.pop("headroom")


def test_a_declared_metric_reaches_summaries_tracking_figures_and_tables(headroom):
    summary = MetricSummary(accuracy=0.5, upper_bound_score=0.75)
    assert summary.flat_metrics("heldout_")["heldout_headroom"] == 0.25
    assert "headroom" not in MetricSummary(accuracy=0.5).flat_metrics()  # undefined: absent
    header, _, row = format_table([("native", _report(summary))]).splitlines()
    assert header.split()[9] == "headroom" and row.split()[9] == "0.250"
    assert metric_label("headroom") == "headroom to the upper bound"
    assert score_limits("headroom", [0.1]) == (-1.0, 1.0)

    class Scores:
        periods = [0, 1]
        per_period = [summary, MetricSummary(accuracy=1.0, upper_bound_score=1.0)]

    csv = per_period_table(Scores()).splitlines()
    assert "headroom" in csv[0].split(",")
    column = csv[0].split(",").index("headroom")
    assert [line.split(",")[column] for line in csv[1:]] == ["0.25", "0"]


def test_a_metric_declared_twice_differently_is_refused():
    with pytest.raises(ValueError, match="already declared"):
        declare_metric(MetricDeclaration("accuracy", "acc", "acc", "minimize", 0.0, 1.0, "other"))


def _report(summary: MetricSummary) -> EvaluationReport:
    return EvaluationReport.model_construct(summary=summary, wall_time_s=1.0)
