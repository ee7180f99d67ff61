"""Metrics and diagnosis on hand-computed records (no LLM)."""

from __future__ import annotations

import pytest
from simulator.result_helpers import item, period

from evolve.llm.usage import Usage
from evolve.simulator.baselines import random_score
from evolve.simulator.metrics import (
    check_variables,
    diagnose,
    original_failures,
    summarize,
    summarize_by_period,
)
from evolve.simulator.records import (
    Diagnosis,
    ProbeResult,
    SessionTranscript,
    UserResult,
    VariableCheck,
)
from evolve.simulator.upper_bound_table import UpperBoundEntry, UpperBoundTable


def check(var: str, now: bool, then: bool, last_write: int = 0) -> VariableCheck:
    return VariableCheck(
        variable=var,
        gold="x",
        probed="x" if now else "y",
        correct_now=now,
        last_write_period=last_write,
        correct_at_last_write=then,
    )


def probe(var: str, correct: bool, parse_failed: bool = False) -> ProbeResult:
    return ProbeResult(
        variable=var,
        question=f"What is my current {var}?",
        options=["x", "y"],
        chosen=None if parse_failed else (1 if correct else 2),
        value=None if parse_failed else ("x" if correct else "y"),
        gold="x",
        correct=correct,
        parse_failed=parse_failed,
    )


# ----- diagnosis ----------------------------------------------------------------------------


def test_correct_answer_is_correct_even_with_wrong_probes():
    assert diagnose(True, [check("a", now=False, then=False)]) is Diagnosis.CORRECT


def test_wrong_now_and_wrong_at_last_write_is_write_failure():
    assert diagnose(False, [check("a", now=False, then=False)]) is Diagnosis.WRITE


def test_wrong_now_but_right_at_last_write_is_read_failure():
    assert diagnose(False, [check("a", now=False, then=True)]) is Diagnosis.READ


def test_all_variables_right_but_answer_wrong_is_utilization_failure():
    checks = [check("a", now=True, then=True), check("b", now=True, then=False)]
    assert diagnose(False, checks) is Diagnosis.UTILIZATION


def test_tie_break_write_beats_read():
    """One variable read-failed and another write-failed: the item is a write failure."""
    checks = [check("a", now=False, then=True), check("b", now=False, then=False)]
    assert diagnose(False, checks) is Diagnosis.WRITE
    assert diagnose(False, list(reversed(checks))) is Diagnosis.WRITE


def test_check_variables_reads_the_probe_of_the_last_write_period():
    probes_by_period = [
        {"a": probe("a", True), "b": probe("b", False)},  # period 0
        {"a": probe("a", False), "b": probe("b", True)},  # period 1
        {"a": probe("a", False), "b": probe("b", False)},  # period 2 (now)
    ]
    checks = check_variables(["a", "b"], {"a": "x", "b": "x"}, {"a": 0, "b": 1}, probes_by_period)
    assert [(c.variable, c.correct_now, c.correct_at_last_write) for c in checks] == [
        ("a", False, True),  # stored right in period 0, lost since: read failure
        ("b", False, True),
    ]
    checks = check_variables(["b"], {"b": "x"}, {"b": 2}, probes_by_period)
    assert checks[0].correct_at_last_write is False  # written this period and already wrong


def test_unparseable_probe_counts_as_not_recalled():
    checks = check_variables(["a"], {"a": "x"}, {"a": 0}, [{"a": probe("a", False, True)}])
    assert checks[0].correct_now is False and checks[0].probed is None


# ----- summaries ----------------------------------------------------------------------------


def test_summary_on_a_hand_computed_case():
    # Period 0: 4 items, 2 correct, random 1/4, UB 3/4 -> (0.5-0.25)/(0.75-0.25) = 0.5
    p0 = period(
        0,
        [
            item(0, True, Diagnosis.CORRECT),
            item(1, True, Diagnosis.CORRECT),
            item(2, False, Diagnosis.WRITE),
            item(3, False, Diagnosis.READ, ub=False),
        ],
        usage=Usage(calls=3, prompt_tokens=10, completion_tokens=5),
    )
    # Period 1: 2 items (2 options each), 1 correct, random 1/2, UB 1 -> (0.5-0.5)/0.5 = 0
    p1 = period(
        1,
        [
            item(0, True, Diagnosis.CORRECT, n_options=2),
            item(1, False, Diagnosis.UTILIZATION, n_options=2, parse_failed=True),
        ],
        probes=[probe("v", False, parse_failed=True)],
        sessions=[
            SessionTranscript(
                session_index=0,
                session_time="t",
                query="q",
                rounds_planned=3,
                rounds_completed=1,
                simulator_parse_failures=1,
            )
        ],
        policy_parse_failures={"write": 2},
    )
    summary = summarize([UserResult(user_id="u", periods=[p0, p1])])
    assert summary.n_items == 6
    assert summary.accuracy == pytest.approx(3 / 6)
    assert summary.random_score == pytest.approx((4 * 0.25 + 2 * 0.5) / 6)
    assert summary.upper_bound_score == pytest.approx(5 / 6)
    # The memory score over all 6 items: (1/2 - 1/3) / (5/6 - 1/3); the upper bound beats
    # random by 3 questions, above the margin of 2 standard errors (2.24 questions).
    assert summary.memory_score == pytest.approx((1 / 2 - 1 / 3) / (5 / 6 - 1 / 3))
    # Period 1's upper bound beats random by 1 of 2 questions, under the 2-question margin:
    # no score there, and 1 period of 2 without one leaves the mean of periods undefined.
    assert summary.memory_score_period_mean is None
    assert "1 of 2 user-periods" in summary.period_mean_undefined
    assert summary.write_failure_rate == pytest.approx(1 / 6)
    assert summary.read_failure_rate == pytest.approx(1 / 6)
    assert summary.utilization_failure_rate == pytest.approx(1 / 6)
    total_failures = (
        summary.write_failure_rate + summary.read_failure_rate + summary.utilization_failure_rate
    )
    assert total_failures == pytest.approx(1 - summary.accuracy)
    assert summary.parse_failures == {
        "answer": 1,
        "probe": 1,
        "simulator": 1,
        "policy": 2,
        "upper_bound": 0,
    }
    assert summary.degenerate_periods == 1
    assert (summary.llm_calls, summary.tokens) == (3, 15)
    # No item was probed: the original-style diagnosis is unknown, not all memory successes.
    assert (summary.original_write_failures, summary.memory_success) == (None, None)
    per_period = summarize_by_period([UserResult(user_id="u", periods=[p0, p1])])
    # Period 0: UB 3/4 beats random 1/4 by 2 of 4 questions (the margin exactly): 0.5.
    assert [s.memory_score for s in per_period] == [pytest.approx(0.5), None]


def test_degenerate_user_period_is_excluded_and_counted():
    # Period 0: UB 1/4 == random 1/4 -> degenerate.
    p0 = period(
        0,
        [
            item(0, True, Diagnosis.CORRECT, ub=True),
            item(1, False, Diagnosis.WRITE, ub=False),
            item(2, False, Diagnosis.WRITE, ub=False),
            item(3, False, Diagnosis.WRITE, ub=False),
        ],
    )
    # Periods 1-3: 3 items, acc 1, random 1/4, UB 1 (2.25 questions above random, over the
    # 2-question margin) -> 1.0. One degenerate period in four is at most a quarter, so the
    # mean over the other three stands (more would leave it undefined).
    later = [
        period(index, [item(q, True, Diagnosis.CORRECT) for q in range(3)]) for index in (1, 2, 3)
    ]
    summary = summarize([UserResult(user_id="u", periods=[p0, *later])])
    assert summary.degenerate_periods == 1
    assert summary.memory_score_period_mean == pytest.approx(1.0)
    # Over all 13 items: accuracy 10/13 equals the upper bound 10/13.
    assert summary.memory_score == pytest.approx(1.0)


def test_upper_bound_below_random_is_degenerate_and_all_degenerate_gives_none():
    p0 = period(
        0, [item(0, True, Diagnosis.CORRECT, ub=False), item(1, True, Diagnosis.CORRECT, ub=False)]
    )
    summary = summarize([UserResult(user_id="u", periods=[p0])])
    assert summary.degenerate_periods == 1
    assert summary.memory_score is None
    assert summary.accuracy == 1.0


def test_unknown_upper_bound_gives_no_memory_score():
    p0 = period(0, [item(0, True, Diagnosis.CORRECT, ub=None)])
    summary = summarize([UserResult(user_id="u", periods=[p0])])
    assert summary.memory_score is None and summary.upper_bound_score is None
    assert summary.accuracy == 1.0


def test_upper_bound_table_overrides_stored_values():
    p0 = period(
        0, [item(0, True, Diagnosis.CORRECT, ub=None), item(1, False, Diagnosis.WRITE, ub=None)]
    )
    table = UpperBoundTable(environment_hash="h", agent_model="m")
    for qi in range(2):
        table.entries[table.key("u", qi, 0)] = UpperBoundEntry(
            item_id="u",
            question_index=qi,
            variant_index=0,
            chosen=None if qi else 1,
            correct=not qi,
            parse_failed=bool(qi),
        )
    summary = summarize([UserResult(user_id="u", periods=[p0])], table)
    # The table's answers, not the stored None: UB 1 of 2. Half a question above random is
    # no margin: the memory score is undefined and says why.
    assert summary.upper_bound_score == pytest.approx(0.5)
    assert summary.memory_score is None
    assert "1 of 2 questions" in summary.memory_score_undefined
    assert summary.parse_failures["upper_bound"] == 1


def test_empty_results_have_undefined_scores():
    summary = summarize([])
    assert summary.accuracy is None and summary.n_items == 0 and summary.memory_score is None


def test_random_score_counts_options_matching_gold():
    assert random_score([["a"], ["b"], ["c"]], ["b"]) == pytest.approx(1 / 3)
    assert random_score([["a", "x"], ["b", "x"]], ["c", "x"]) == 0.0


def test_the_original_diagnosis_reads_the_probe_of_the_last_update_not_the_last_mention():
    """The reference's write position is the last period whose updates set the variable; a
    later period that only mentions it does not move it. Recalled right when it was last
    updated (period 0) and wrong when last mentioned (period 1): a read failure now."""
    check = VariableCheck(
        variable="diet",
        gold="vegan",
        probed="omnivore",
        correct_now=False,
        last_write_period=1,
        correct_at_last_write=False,
        last_update_period=0,
        correct_at_last_update=True,
    )
    assert original_failures([check]) == (0, 1)
    assert original_failures([check.model_copy(update={"correct_at_last_update": False})]) == (
        1,
        0,
    )
    assert original_failures([check.model_copy(update={"correct_now": True})]) == (0, 0)
