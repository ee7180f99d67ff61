"""Every reported metric, declared once: name, direction, range, description, where it shows.

`MetricSummary` takes its fields' descriptions from here and flattens the declared metrics
for MLflow; the per-period curves and table of `evolve.tracking`, the figures'
labels and axes (`evolve.reporting.plots`), the per-generation table of `evolve.optimize.report` and
`evolve eval`'s tables list the declarations instead of names kept by hand. A new metric is
one `declare_metric(...)` call: with `compute`, its value is derived from a `MetricSummary`,
so it appears in tracking and the tables without touching them (see docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["maximize", "minimize", "none"]
# Where a metric is shown besides MLflow's flat metrics (every declared metric is there):
# "eval" and "original": `evolve eval`'s table and the reference rules' table; "report":
# `evolve run`'s per-generation table (of the best candidate); "per_period": per-period
# curves in MLflow and the per-period CSV.
View = Literal["eval", "original", "report", "per_period"]


@dataclass(frozen=True)
class MetricDeclaration:
    name: str
    label: str  # figures' axes and legends
    column: str  # tables' header (short)
    direction: Direction  # "none": a reference level (chance, upper bound), not a goal
    low: float | None  # the range a value can take; None: unbounded on that side
    high: float | None
    description: str
    views: frozenset[View] = frozenset()
    # How to get the value from a MetricSummary; None: the summary's field of that name.
    compute: Callable[[Any], float | None] | None = field(default=None, compare=False)

    def value_of(self, summary: Any) -> float | None:
        value = self.compute(summary) if self.compute else getattr(summary, self.name, None)
        return None if value is None else float(value)

    @property
    def bounded(self) -> bool:
        return self.low is not None and self.high is not None


METRICS: dict[str, MetricDeclaration] = {}


def declare_metric(declaration: MetricDeclaration) -> MetricDeclaration:
    existing = METRICS.get(declaration.name)
    if existing is not None and existing != declaration:
        raise ValueError(f"metric {declaration.name!r} is already declared differently")
    METRICS[declaration.name] = declaration
    return declaration


def metrics_in(view: View) -> list[MetricDeclaration]:
    """The declared metrics shown in `view`, in declaration order."""
    return [declaration for declaration in METRICS.values() if view in declaration.views]


def metric_description(name: str) -> str:
    return METRICS[name].description


def _declare(
    name: str,
    label: str,
    column: str,
    direction: Direction,
    value_range: tuple[float | None, float | None],
    description: str,
    *views: View,
) -> None:
    low, high = value_range
    declare_metric(
        MetricDeclaration(name, label, column, direction, low, high, description, frozenset(views))
    )


UNIT = (0.0, 1.0)
UNBOUNDED = (None, None)
# The order is the tables' column order.
_declare(
    "accuracy", "accuracy", "acc", "maximize", UNIT,
    "Share of questions answered correctly; an unparseable answer counts as wrong.",
    "eval", "per_period",
)  # fmt: skip
_declare(
    "memory_score", "memory score", "memory", "maximize", UNBOUNDED,
    "The headline: (mean S - mean S_rand) / (mean S_UB - mean S_rand) over all items; None "
    "(shown as -) when the upper bound is not clearly above random (see "
    "memory_score_undefined). Within [0, 1] whenever the accuracy is between random and the "
    "upper bound.",
    "eval", "per_period",
)  # fmt: skip
_declare(
    "memory_score_period_mean", "memory score (mean of periods)", "mem/period", "maximize",
    UNBOUNDED,
    "Mean of the per-user-period memory scores over the user-periods that have one; None when "
    "none has, or more than a quarter have none (see period_mean_undefined).",
    "eval",
)  # fmt: skip
_declare(
    "random_score", "chance accuracy", "random", "none", UNIT,
    "Accuracy of a uniform random choice: the mean of 1 / #options.",
    "eval",
)  # fmt: skip
_declare(
    "upper_bound_score", "upper-bound accuracy", "UB", "none", UNIT,
    "Accuracy of the agent model answering with the gold state given.",
    "eval",
)  # fmt: skip
_declare(
    "write_failure_rate", "write failure rate", "write", "minimize", UNIT,
    "Share of items whose needed information never reached memory (partitioned diagnosis: "
    "write + read + utilization = 1 - accuracy).",
    "eval", "report", "per_period",
)  # fmt: skip
_declare(
    "read_failure_rate", "read failure rate", "read", "minimize", UNIT,
    "Share of items whose information was in memory but not retrieved for the answer.",
    "eval", "report", "per_period",
)  # fmt: skip
_declare(
    "utilization_failure_rate", "utilization failure rate", "util", "minimize", UNIT,
    "Share of items answered wrongly although the information was retrieved.",
    "eval", "report", "per_period",
)  # fmt: skip
_declare(
    "accuracy_with_random_fallback", "accuracy (random fallback)", "acc+rf", "maximize", UNIT,
    "The original's rule: an unparseable answer earns its random score.",
    "original",
)  # fmt: skip
_declare(
    "memory_score_original", "memory score (paper's formula)", "paper-mem", "maximize",
    UNBOUNDED,
    "The reference's mean over user-periods, with random fallback for unparseable answers; "
    "user-periods whose upper bound is not clearly above random have none, as for ours.",
    "original",
)  # fmt: skip
_declare(
    "original_write_failures", "write failures per item", "write/item", "minimize", (0.0, None),
    "Original diagnosis: mean write-failed variables per item.",
    "original",
)  # fmt: skip
_declare(
    "original_read_failures", "read failures per item", "read/item", "minimize", (0.0, None),
    "Original diagnosis: mean read-failed variables per item.",
    "original",
)  # fmt: skip
_declare(
    "memory_success", "memory success", "mem success", "maximize", UNIT,
    "Original diagnosis: share of items with no write or read failure; None when probes "
    "were wrong_only (correct items were not probed).",
    "original",
)  # fmt: skip
