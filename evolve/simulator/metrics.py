"""Scores and failure diagnosis: pure functions over stored results, never an LLM call.

Definitions (AMemGym, arXiv 2603.01966):

- accuracy: share of items whose chosen option carries the period's gold state tuple.
  An unparseable answer counts as wrong (and is counted in `parse_failures["answer"]`).
- random score: expected accuracy of a uniform random choice among an item's options.
- upper bound: the agent LLM answering with the gold state stated explicitly.
- memory score: per user-period `(S_overall - S_random) / (S_UB - S_random)`, averaged over
  user-periods. A user-period with `S_UB <= S_random` has no room for memory to matter: it is
  left out of the average and counted in `degenerate_periods`; if every user-period is
  degenerate (or no upper bound is known) the memory score is None.
- diagnosis of a wrong item: a required variable that is recalled wrongly now and was also
  recalled wrongly at the end of the period it was last written is a write failure; recalled
  correctly then, a read failure; every required variable recalled correctly, a utilization
  failure. An item with both a write-failed and a read-failed variable is a write failure
  (the earlier stage in the pipeline is blamed), so write + read + utilization = 1 - accuracy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from evolve.simulator.records import (
    Diagnosis,
    ItemResult,
    PeriodResult,
    ProbeResult,
    UserResult,
    VariableCheck,
)

if TYPE_CHECKING:
    from evolve.simulator.baselines import UpperBoundTable

PARSE_FAILURE_KINDS = ("answer", "probe", "simulator", "policy", "upper_bound")
# Below this margin S_UB and S_random are treated as equal (floating-point noise).
_DEGENERATE_MARGIN = 1e-9


class MetricSummary(BaseModel):
    """Scores over a set of user-periods (a whole run, one user, or one period)."""

    accuracy: float | None = None
    memory_score: float | None = Field(
        default=None, description="None: no upper bound, or every user-period degenerate."
    )
    random_score: float | None = None
    upper_bound_score: float | None = None
    write_failure_rate: float | None = None
    read_failure_rate: float | None = None
    utilization_failure_rate: float | None = None
    n_items: int = 0
    n_user_periods: int = 0
    parse_failures: dict[str, int] = Field(
        default_factory=lambda: dict.fromkeys(PARSE_FAILURE_KINDS, 0)
    )
    degenerate_periods: int = Field(default=0, description="User-periods with S_UB <= S_random.")
    llm_calls: int = 0
    tokens: int = 0

    @property
    def parse_failures_total(self) -> int:
        return sum(self.parse_failures.values())

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """Defined numbers only, flat, for MLflow and tables."""
        values: dict[str, float] = {}
        for name in (
            "accuracy",
            "memory_score",
            "random_score",
            "upper_bound_score",
            "write_failure_rate",
            "read_failure_rate",
            "utilization_failure_rate",
        ):
            value = getattr(self, name)
            if value is not None:
                values[f"{prefix}{name}"] = float(value)
        values[f"{prefix}n_items"] = float(self.n_items)
        values[f"{prefix}degenerate_periods"] = float(self.degenerate_periods)
        values[f"{prefix}parse_failures"] = float(self.parse_failures_total)
        values[f"{prefix}llm_calls"] = float(self.llm_calls)
        values[f"{prefix}tokens"] = float(self.tokens)
        return values


def check_variables(
    required_info: Sequence[str],
    gold_state: Mapping[str, str],
    last_write_periods: Mapping[str, int],
    probes_by_period: Sequence[Mapping[str, ProbeResult]],
) -> list[VariableCheck]:
    """Compare each required variable's probed value now and at its last write period.

    `probes_by_period[p]` holds the probes of period p for this user, the current period last.
    A probe missing at the last write period counts as not recalled then (a write failure):
    the memory cannot be shown to have held the value.
    """
    current = probes_by_period[-1]
    checks = []
    for variable in required_info:
        probe_now = current.get(variable)
        last_write = last_write_periods[variable]
        probe_then = (
            probes_by_period[last_write].get(variable)
            if 0 <= last_write < len(probes_by_period)
            else None
        )
        checks.append(
            VariableCheck(
                variable=variable,
                gold=gold_state[variable],
                probed=probe_now.value if probe_now else None,
                correct_now=bool(probe_now and probe_now.correct),
                last_write_period=last_write,
                correct_at_last_write=bool(probe_then and probe_then.correct),
            )
        )
    return checks


def diagnose(correct: bool, variables: Sequence[VariableCheck]) -> Diagnosis:
    """Attribute a wrong answer to write, read or utilization (see the module docstring)."""
    if correct:
        return Diagnosis.CORRECT
    wrong_now = [check for check in variables if not check.correct_now]
    if not wrong_now:
        return Diagnosis.UTILIZATION
    if any(not check.correct_at_last_write for check in wrong_now):
        return Diagnosis.WRITE
    return Diagnosis.READ


def _upper_bound_correct(
    item: ItemResult, user_id: str, upper_bound: UpperBoundTable | None
) -> bool | None:
    if upper_bound is not None:
        return upper_bound.correct(user_id, item.question_index, item.gold - 1)
    return item.upper_bound_correct


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_periods(
    periods: Iterable[PeriodResult], upper_bound: UpperBoundTable | None = None
) -> MetricSummary:
    """Scores over any collection of user-periods."""
    items_total = 0
    correct = 0
    random_total = 0.0
    upper_bound_values: list[float] = []
    upper_bound_known = True
    counts = dict.fromkeys(Diagnosis, 0)
    parse_failures = dict.fromkeys(PARSE_FAILURE_KINDS, 0)
    normalized: list[float] = []
    degenerate = 0
    user_periods = 0
    llm_calls = 0
    tokens = 0
    for period in periods:
        user_periods += 1
        llm_calls += period.usage.llm_calls
        tokens += period.usage.tokens
        parse_failures["simulator"] += sum(s.simulator_parse_failures for s in period.sessions)
        parse_failures["policy"] += sum(period.policy_parse_failures.values())
        parse_failures["probe"] += sum(probe.parse_failed for probe in period.probes)
        if not period.items:
            continue
        period_ub: list[float] = []
        for item in period.items:
            items_total += 1
            correct += item.correct
            random_total += item.random_score
            counts[item.diagnosis] += 1
            parse_failures["answer"] += item.parse_failed
            ub = _upper_bound_correct(item, period.user_id, upper_bound)
            if ub is None:
                upper_bound_known = False
            else:
                period_ub.append(float(ub))
        if upper_bound is not None:
            parse_failures["upper_bound"] += sum(
                upper_bound.parse_failed(period.user_id, item.question_index, item.gold - 1)
                for item in period.items
            )
        upper_bound_values.extend(period_ub)
        if len(period_ub) == len(period.items):
            s_overall = period.accuracy
            s_random = sum(item.random_score for item in period.items) / len(period.items)
            s_ub = sum(period_ub) / len(period_ub)
            if s_ub - s_random <= _DEGENERATE_MARGIN:
                degenerate += 1
            else:
                normalized.append((s_overall - s_random) / (s_ub - s_random))
    if items_total == 0:
        return MetricSummary(
            n_user_periods=user_periods,
            parse_failures=parse_failures,
            llm_calls=llm_calls,
            tokens=tokens,
        )
    return MetricSummary(
        accuracy=correct / items_total,
        memory_score=_mean(normalized) if upper_bound_known else None,
        random_score=random_total / items_total,
        upper_bound_score=_mean(upper_bound_values) if upper_bound_known else None,
        write_failure_rate=counts[Diagnosis.WRITE] / items_total,
        read_failure_rate=counts[Diagnosis.READ] / items_total,
        utilization_failure_rate=counts[Diagnosis.UTILIZATION] / items_total,
        n_items=items_total,
        n_user_periods=user_periods,
        parse_failures=parse_failures,
        degenerate_periods=degenerate if upper_bound_known else 0,
        llm_calls=llm_calls,
        tokens=tokens,
    )


def summarize(
    users: Sequence[UserResult], upper_bound: UpperBoundTable | None = None
) -> MetricSummary:
    """Scores over every stored user-period of `users` (pure: reads records only).

    With `upper_bound` the upper-bound answers are looked up in the table; without it the
    `upper_bound_correct` stored on each item is used, and if any is unknown the upper-bound
    and memory scores are None.
    """
    return summarize_periods((p for user in users for p in user.periods), upper_bound)


def summarize_by_period(
    users: Sequence[UserResult], upper_bound: UpperBoundTable | None = None
) -> list[MetricSummary]:
    """One summary per period index, over the users that reached it."""
    count = 1 + max((p.period_index for user in users for p in user.periods), default=-1)
    return [
        summarize_periods(
            (p for user in users for p in user.periods if p.period_index == index), upper_bound
        )
        for index in range(count)
    ]


def summarize_by_user(
    users: Sequence[UserResult], upper_bound: UpperBoundTable | None = None
) -> dict[str, MetricSummary]:
    return {user.user_id: summarize([user], upper_bound) for user in users}
