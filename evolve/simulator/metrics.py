"""Scores and failure diagnosis: pure functions over stored results, never an LLM call.

Why one module: every score definition (ours and the reference's) sits side by side, so a
reader can check each against the paper in one place.

Definitions (AMemGym, arXiv 2603.01966):

- accuracy: share of items whose chosen option carries the period's gold state tuple.
  An unparseable answer counts as wrong (and is counted in `parse_failures["answer"]`).
- random score: expected accuracy of a uniform random choice among an item's options.
- upper bound: the agent LLM answering with the gold state stated explicitly.
- memory score, and when it is undefined: `(S - S_random) / (S_UB - S_random)` means something
  only when the upper bound is clearly above random: by at least `MARGIN_QUESTIONS` (2)
  questions AND by `MARGIN_STANDARD_ERRORS` (2) binomial standard errors of the random score
  over the same questions (`sqrt(sum p (1 - p))` questions, p = 1 / #options of each item).
  Below that margin an upper bound could be a guesser's luck, and the ratio divides by noise
  (1/8 correct against an upper bound of 3/8 on 3-option questions gave -5.00). A set of
  questions without that margin has no memory score: None, shown as "-", never logged,
  averaged or optimized. See `memory_ratio`.
- memory score (the headline, `memory_score`): the ratio over all items of the set,
  `(mean S - mean S_random) / (mean S_UB - mean S_random)`, the margin checked over those
  items. It weighs every item equally, stays within [0, 1] whenever the accuracy lies between
  random and the upper bound, and is what selection and pruning optimize.
  `memory_score_undefined` says why it is None.
- memory score, mean of periods (`memory_score_period_mean`): the ratio per user-period (the
  margin checked over that period's items), averaged over the user-periods that have one.
  User-periods without one are counted in `degenerate_periods`; when every one is degenerate,
  or more than a quarter are (the mean would speak for a minority), it is None.
- not meaningful: when answers, or upper-bound answers, fail to parse on more than half of the
  scored items, the numbers measure the output format, not memory; `unreliable` says so.
- diagnosis of a wrong item: a required variable that is recalled wrongly now and was also
  recalled wrongly at the end of the period it was last written is a write failure; recalled
  correctly then, a read failure; every required variable recalled correctly, a utilization
  failure. An item with both a write-failed and a read-failed variable is a write failure
  (the earlier stage in the pipeline is blamed), so write + read + utilization = 1 - accuracy.
  This partition is ours; it is exported as `failure_partition.json`.
- the original's diagnosis (reference code, `eval/diagnosis.py`; see `original_format`):
  per item and required variable, recalled wrongly now and also at the last period whose
  updates set it: a write failure; recalled then: a read failure; `memory_success` when
  neither, whether or not the answer was right. Reported as the mean write / read failure
  count per item and the share of memory successes (the original has no aggregate).
- accuracy_with_random_fallback: the original's rule for an unparseable answer (a random
  option, scored like a real answer), in expectation: such an item earns its random score.
- original memory score: the reference's mean over user-periods of
  `(S - S_rand) / (S_UB - S_rand)` with S the accuracy with random fallback, under the same
  rule as ours: user-periods whose upper bound is not clearly above random have none and are
  left out, and more than a quarter of those leaves it None (the reference averages every
  user-period, negative denominators included, which can read 1.00 at chance accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, Field

from evolve.simulator.conversation_health import ConversationHealth, conversation_health
from evolve.simulator.metric_registry import METRICS, metric_description
from evolve.simulator.records import (
    Diagnosis,
    ItemResult,
    PeriodResult,
    UserResult,
    VariableCheck,
)

if TYPE_CHECKING:
    from evolve.simulator.upper_bound_table import UpperBoundTable

PARSE_FAILURE_KINDS = ("answer", "probe", "simulator", "policy", "upper_bound")
# The upper bound must beat random by this many questions AND this many binomial standard
# errors of the random score before a memory score is defined (see `memory_ratio`). Two
# standard errors: a guessing upper-bound model clears it about once in forty sets; two
# questions: on a few questions, or many options, one lucky question must not suffice.
MARGIN_QUESTIONS = 2.0
MARGIN_STANDARD_ERRORS = 2.0
# Float noise when comparing shares of questions (sums of 1/3 are not exact).
_FLOAT_TOLERANCE = 1e-9
# Decimals kept of a memory score, recorded and logged: enough for any comparison, and no
# 8.88e-16 where the exact value is 0.
ROUND_DIGITS = 9
# More degenerate user-periods than this share leaves the per-period mean to a minority.
DEGENERATE_SHARE_LIMIT = 0.25
# More unparseable answers (or upper-bound answers) than this share of the scored items makes
# the scores measure the output format rather than memory.
PARSE_FAILURE_SHARE_LIMIT = 0.5


def random_score(option_states: Sequence[Sequence[str]], gold_state: Sequence[str]) -> float:
    """Expected accuracy of a uniform random pick (the original random.py, accuracy metric)."""
    if not option_states:
        return 0.0
    gold = list(gold_state)
    return sum(list(state) == gold for state in option_states) / len(option_states)


class MetricSummary(BaseModel):
    """Scores over a set of user-periods (a whole run, one user, or one period).

    Each score's meaning, direction and range are declared in `metric_registry`."""

    accuracy: float | None = Field(default=None, description=metric_description("accuracy"))
    memory_score: float | None = Field(default=None, description=metric_description("memory_score"))
    memory_score_undefined: str | None = Field(
        default=None, description="Why memory_score is None (None when it is defined)."
    )
    memory_score_period_mean: float | None = Field(
        default=None, description=metric_description("memory_score_period_mean")
    )
    period_mean_undefined: str | None = Field(
        default=None, description="Why memory_score_period_mean is None (None when defined)."
    )
    accuracy_with_random_fallback: float | None = Field(
        default=None, description=metric_description("accuracy_with_random_fallback")
    )
    memory_score_original: float | None = Field(
        default=None, description=metric_description("memory_score_original")
    )
    random_score: float | None = Field(default=None, description=metric_description("random_score"))
    upper_bound_score: float | None = Field(
        default=None, description=metric_description("upper_bound_score")
    )
    write_failure_rate: float | None = Field(
        default=None, description=metric_description("write_failure_rate")
    )
    read_failure_rate: float | None = Field(
        default=None, description=metric_description("read_failure_rate")
    )
    utilization_failure_rate: float | None = Field(
        default=None, description=metric_description("utilization_failure_rate")
    )
    original_write_failures: float | None = Field(
        default=None, description=metric_description("original_write_failures")
    )
    original_read_failures: float | None = Field(
        default=None, description=metric_description("original_read_failures")
    )
    memory_success: float | None = Field(
        default=None, description=metric_description("memory_success")
    )
    n_items: int = 0
    n_user_periods: int = 0
    parse_failures: dict[str, int] = Field(
        default_factory=lambda: dict.fromkeys(PARSE_FAILURE_KINDS, 0)
    )
    degenerate_periods: int = Field(
        default=0,
        description="User-periods without a memory score: upper bound not clearly above random.",
    )
    unreliable: str | None = Field(
        default=None,
        description="Why the numbers are not meaningful (more than half of the scored items "
        "have unparseable answers or upper-bound answers); None when they are.",
    )
    llm_calls: int = 0
    tokens: int = 0
    conversation: ConversationHealth = Field(
        default_factory=ConversationHealth,
        description="Echoes, refusals and empty replies in the on-policy sessions scored here.",
    )

    @property
    def parse_failures_total(self) -> int:
        return sum(self.parse_failures.values())

    def flat_metrics(self, prefix: str = "") -> dict[str, float]:
        """Defined numbers only, flat, for MLflow and tables."""
        values: dict[str, float] = {}
        for declaration in METRICS.values():  # declared metrics, derived ones included
            value = declaration.value_of(self)
            if value is not None:
                values[f"{prefix}{declaration.name}"] = value
        values[f"{prefix}n_items"] = float(self.n_items)
        values[f"{prefix}degenerate_periods"] = float(self.degenerate_periods)
        values[f"{prefix}parse_failures"] = float(self.parse_failures_total)
        values[f"{prefix}unreliable"] = float(self.unreliable is not None)
        values[f"{prefix}llm_calls"] = float(self.llm_calls)
        values[f"{prefix}tokens"] = float(self.tokens)
        values.update(self.conversation.metrics(prefix))
        return values


class Recall(Protocol):
    """What a diagnosis needs of a probed variable (a ProbeResult or a VariableRecall)."""

    @property
    def value(self) -> object: ...

    @property
    def correct(self) -> bool: ...


def check_variables(
    required_info: Sequence[str],
    gold_state: Mapping[str, str],
    last_write_periods: Mapping[str, int],
    probes_by_period: Sequence[Mapping[str, Recall]],
    last_update_periods: Mapping[str, int] | None = None,
) -> list[VariableCheck]:
    """Compare each required variable's probed value now, at its last write period (ours:
    updates or exposure) and at its last update period (the original's write_pos).

    `probes_by_period[p]` holds what period p's probe recalled for this item's variables,
    the current period last. A probe missing at the earlier period counts as not recalled
    then (a write failure): the memory cannot be shown to have held the value.
    """
    current = probes_by_period[-1]

    def correct_at(period: int, variable: str) -> bool:
        if not 0 <= period < len(probes_by_period):
            return False
        probe = probes_by_period[period].get(variable)
        return bool(probe and probe.correct)

    checks = []
    for variable in required_info:
        probe_now = current.get(variable)
        recalled = None if probe_now is None else probe_now.value
        last_write = last_write_periods[variable]
        last_update = (last_update_periods or {}).get(variable)
        checks.append(
            VariableCheck(
                variable=variable,
                gold=gold_state[variable],
                probed=None if recalled is None else str(recalled),
                correct_now=bool(probe_now and probe_now.correct),
                last_write_period=last_write,
                correct_at_last_write=correct_at(last_write, variable),
                last_update_period=last_update,
                correct_at_last_update=(
                    None if last_update is None else correct_at(last_update, variable)
                ),
            )
        )
    return checks


def original_failures(variables: Sequence[VariableCheck]) -> tuple[int, int] | None:
    """The original's (write failures, read failures) of one item; None when it was not
    diagnosed (no checks: every question requires a variable) or a check lacks the last
    update period (records made before it was kept)."""
    if not variables:
        return None
    writes = reads = 0
    for check in variables:
        if check.correct_at_last_update is None:
            return None
        if check.correct_now:
            continue
        if check.correct_at_last_update:
            reads += 1
        else:
            writes += 1
    return writes, reads


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


def upper_bound_correct(
    item: ItemResult, user_id: str, upper_bound: UpperBoundTable | None
) -> bool | None:
    if upper_bound is not None:
        return upper_bound.correct(user_id, item.question_index, item.gold - 1)
    return item.upper_bound_correct


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def memory_margin(random_scores: Sequence[float]) -> float:
    """The least share of the questions by which the upper bound must beat random for a
    memory score to be defined: `MARGIN_QUESTIONS` questions, or `MARGIN_STANDARD_ERRORS`
    binomial standard errors of the random score over these questions, whichever is larger."""
    if not random_scores:
        return math.inf
    standard_error = math.sqrt(sum(p * (1.0 - p) for p in random_scores))  # in questions
    return max(MARGIN_QUESTIONS, MARGIN_STANDARD_ERRORS * standard_error) / len(random_scores)


def memory_ratio(score: float, random_scores: Sequence[float], upper_bound: float) -> float | None:
    """`(score - random) / (upper_bound - random)` over one set of questions (`score` and
    `upper_bound` are shares of them, `random_scores` one per question), or None when the
    upper bound is not clearly above random (`memory_margin`): then the ratio divides by noise.
    """
    if not random_scores:
        return None
    random_mean = sum(random_scores) / len(random_scores)
    room = upper_bound - random_mean
    if room < memory_margin(random_scores) - _FLOAT_TOLERANCE:
        return None
    # Rounded: a sum of thirds is inexact, and chance-level accuracy must read 0, not 3e-16.
    return _rounded((score - random_mean) / room)


def _rounded(value: float) -> float:
    """`value` without float noise (9 decimals; -0.0 made 0.0)."""
    return round(value, ROUND_DIGITS) + 0.0


def _no_margin_reason(random_scores: Sequence[float], upper_bound: float) -> str:
    n = len(random_scores)
    random_mean = sum(random_scores) / n
    needed = memory_margin(random_scores) * n
    return (
        f"the upper bound ({upper_bound * n:.0f} of {n} questions) is not clearly above random "
        f"({random_mean * n:.1f} of {n}): a memory score needs it higher by at least "
        f"{needed:.1f} questions (2 questions and 2 standard errors of the random score)"
    )


def summarize_periods(
    periods: Iterable[PeriodResult], upper_bound: UpperBoundTable | None = None
) -> MetricSummary:
    """Scores over any collection of user-periods."""
    periods = list(periods)
    conversation = conversation_health(periods)
    items_total = 0
    correct = 0
    random_values: list[float] = []
    upper_bound_values: list[float] = []
    upper_bound_known = True
    counts = dict.fromkeys(Diagnosis, 0)
    parse_failures = dict.fromkeys(PARSE_FAILURE_KINDS, 0)
    normalized: list[float] = []
    degenerate = 0
    fallback_total = 0.0
    # The reference's per-period ratio with S = accuracy with random fallback.
    original_normalized: list[float] = []
    original_counts: list[tuple[int, int]] | None = []
    user_periods = 0
    llm_calls = 0
    tokens = 0
    for period in periods:
        user_periods += 1
        llm_calls += period.usage.calls
        tokens += period.usage.tokens
        parse_failures["simulator"] += sum(s.simulator_parse_failures for s in period.sessions)
        parse_failures["policy"] += sum(period.policy_parse_failures.values())
        parse_failures["probe"] += sum(probe.parse_failed for probe in period.probes)
        parse_failures["probe"] += sum(probe.parse_failed for probe in period.question_probes)
        if period.probe_scope != "all":
            original_counts = None
        if not period.items:
            continue
        period_ub: list[float] = []
        for item in period.items:
            items_total += 1
            correct += item.correct
            random_values.append(item.random_score)
            fallback_total += item.random_score if item.parse_failed else float(item.correct)
            counts[item.diagnosis] += 1
            failures = original_failures(item.variables)
            if failures is None:
                original_counts = None
            elif original_counts is not None:
                original_counts.append(failures)
            parse_failures["answer"] += item.parse_failed
            ub = upper_bound_correct(item, period.user_id, upper_bound)
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
            randoms = [item.random_score for item in period.items]
            s_ub = sum(period_ub) / len(period_ub)
            ratio = memory_ratio(period.accuracy, randoms, s_ub)
            if ratio is None:
                degenerate += 1
                continue
            normalized.append(ratio)
            s_fallback = sum(
                item.random_score if item.parse_failed else float(item.correct)
                for item in period.items
            ) / len(period.items)
            # Defined exactly when ours is: the margin depends on the questions only.
            original = memory_ratio(s_fallback, randoms, s_ub)
            if original is not None:
                original_normalized.append(original)
    if items_total == 0:
        return MetricSummary(
            n_user_periods=user_periods,
            parse_failures=parse_failures,
            llm_calls=llm_calls,
            tokens=tokens,
            conversation=conversation,
        )
    accuracy = correct / items_total
    random_mean = sum(random_values) / items_total
    upper_bound_mean = _mean(upper_bound_values) if upper_bound_known else None
    memory_score, undefined = _memory_score(accuracy, random_values, upper_bound_mean)
    period_mean, period_mean_undefined = _period_mean(normalized, degenerate, upper_bound_known)
    original_memory, _ = _period_mean(original_normalized, degenerate, upper_bound_known)
    original_diagnosis = _original_diagnosis_means(original_counts)
    return MetricSummary(
        accuracy=accuracy,
        accuracy_with_random_fallback=fallback_total / items_total,
        memory_score=memory_score,
        memory_score_undefined=undefined,
        memory_score_period_mean=period_mean,
        period_mean_undefined=period_mean_undefined,
        memory_score_original=original_memory,
        random_score=random_mean,
        upper_bound_score=upper_bound_mean,
        write_failure_rate=counts[Diagnosis.WRITE] / items_total,
        read_failure_rate=counts[Diagnosis.READ] / items_total,
        utilization_failure_rate=counts[Diagnosis.UTILIZATION] / items_total,
        **original_diagnosis,
        n_items=items_total,
        n_user_periods=user_periods,
        parse_failures=parse_failures,
        degenerate_periods=degenerate if upper_bound_known else 0,
        unreliable=unreliable_reason(parse_failures, items_total),
        llm_calls=llm_calls,
        tokens=tokens,
        conversation=conversation,
    )


def _original_diagnosis_means(
    counts: Sequence[tuple[int, int]] | None,
) -> dict[str, float | None]:
    """Means per item of the original's write / read failure counts and memory success."""
    if not counts:
        return {}
    return {
        "original_write_failures": sum(w for w, _ in counts) / len(counts),
        "original_read_failures": sum(r for _, r in counts) / len(counts),
        "memory_success": sum(w == 0 and r == 0 for w, r in counts) / len(counts),
    }


def _memory_score(
    accuracy: float, random_values: Sequence[float], upper_bound_mean: float | None
) -> tuple[float | None, str | None]:
    """The headline memory score over all items, or None and why it is undefined."""
    if upper_bound_mean is None:
        return None, "no upper bound is known for every item"
    score = memory_ratio(accuracy, random_values, upper_bound_mean)
    if score is None:
        return None, _no_margin_reason(random_values, upper_bound_mean)
    return score, None


def _period_mean(
    normalized: Sequence[float], degenerate: int, upper_bound_known: bool
) -> tuple[float | None, str | None]:
    """The mean over user-periods that have a memory score, or None and why it has none."""
    scored_periods = degenerate + len(normalized)
    if not upper_bound_known:
        return None, "no upper bound is known for every item"
    if scored_periods == 0:
        return None, "no user-period has questions"
    if not normalized:
        return None, (
            f"none of the {degenerate} user-period(s) has an upper bound clearly above random"
        )
    if degenerate > DEGENERATE_SHARE_LIMIT * scored_periods:
        return None, (
            f"{degenerate} of {scored_periods} user-periods have no upper bound clearly above "
            f"random, more than a quarter: their mean would come from the {len(normalized)} "
            "others"
        )
    return sum(normalized) / len(normalized), None


def unreliable_reason(parse_failures: Mapping[str, int], scored_items: int) -> str | None:
    """Why the scores are not meaningful: most answers or upper-bound answers unparseable."""
    if scored_items <= 0:
        return None
    reasons = [
        f"{parse_failures.get(kind, 0)} of {scored_items} {label} are unparseable"
        for kind, label in (("answer", "answers"), ("upper_bound", "upper-bound answers"))
        if parse_failures.get(kind, 0) > PARSE_FAILURE_SHARE_LIMIT * scored_items
    ]
    if not reasons:
        return None
    return "; ".join(reasons) + " (more than half of the scored items)"


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
