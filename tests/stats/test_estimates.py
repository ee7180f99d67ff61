"""Point values, counts and exact tests of `evolve.stats`, recomputed by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from evolve.stats import (
    PairingError,
    QuestionOutcomes,
    Verdict,
    compare,
    concatenate,
    estimate,
    mcnemar_p,
    random_effects,
    sign_flip_p,
    verdict_of,
)
from evolve.stats.verdict import Interval


def _outcomes(correct: list[list[int]], stratum: str = "s", upper: float = 1.0) -> QuestionOutcomes:
    keys = tuple(
        (stratum, f"u{u}", 0, q) for u, answers in enumerate(correct) for q in range(len(answers))
    )
    flat = np.array([float(v) for answers in correct for v in answers])
    return QuestionOutcomes(keys, flat, np.full(len(flat), 1 / 3), np.full(len(flat), upper))


def test_mcnemar_is_the_exact_binomial_on_discordant_pairs() -> None:
    # 12 vs 4 discordant: two-sided exact p = 2 * P(X <= 4 | n = 16, 1/2).
    from math import comb

    expected = 2 * sum(comb(16, k) for k in range(5)) / 2**16
    assert mcnemar_p(12, 4) == pytest.approx(expected)
    assert mcnemar_p(0, 0) == 1.0


def test_sign_flip_is_exact_over_every_sign_pattern() -> None:
    per_user = np.array([0.3, 0.1, 0.25, -0.05, 0.2, 0.15])
    observed = abs(per_user.mean())
    patterns = list(itertools.product([-1, 1], repeat=len(per_user)))
    extreme = sum(
        abs((per_user * np.array(signs)).mean()) >= observed - 1e-12 for signs in patterns
    )
    assert sign_flip_p(per_user) == pytest.approx(extreme / len(patterns))
    assert sign_flip_p(per_user[:5]) is None  # too few users for any p below 0.05


def test_compare_counts_and_difference_come_from_the_paired_questions() -> None:
    x = _outcomes([[1, 1, 0, 1], [1, 0, 1, 1]])
    y = _outcomes([[0, 1, 0, 0], [1, 1, 0, 1]])
    result = compare(x, y, seed=1, resamples=500)
    assert result.x_only_correct == 3 and result.y_only_correct == 1
    assert result.difference.value == pytest.approx((6 - 4) / 8)
    assert (result.users_ahead, result.users_behind, result.users_tied) == (1, 0, 1)
    assert result.basis.users == 2 and result.basis.questions == 8 and result.basis.seed == 1
    # Same seed, same interval: every resampling is seeded.
    assert compare(x, y, seed=1, resamples=500).difference == result.difference


def test_compare_refuses_different_questions() -> None:
    x = _outcomes([[1, 1, 0, 1]])
    y = _outcomes([[1, 1, 0]])
    with pytest.raises(PairingError, match="different questions"):
        compare(x, y)


def test_a_policy_compared_with_itself_is_within_noise_with_a_zero_interval() -> None:
    x = _outcomes([[1, 0, 1, 1, 0, 1]] * 3)
    result = compare(x, x, resamples=300)
    assert result.verdict is Verdict.WITHIN_NOISE
    assert result.difference.interval == Interval(low=0.0, high=0.0)


def test_strata_are_resampled_separately() -> None:
    """Two seeds, one all right and one all wrong: every resample keeps each seed's users,
    so the pooled accuracy never moves from 1/2 (a pooled resample would)."""
    both = concatenate([_outcomes([[1, 1], [1, 1]], "a"), _outcomes([[0, 0], [0, 0]], "b")])
    found = estimate(both, resamples=400).accuracy
    assert found.value == 0.5
    assert found.interval == Interval(low=0.5, high=0.5)


def test_memory_score_undefined_where_the_upper_bound_is_not_above_random() -> None:
    near_chance = _outcomes([[1, 0, 0]] * 2, upper=1 / 3)
    assert estimate(near_chance, resamples=200).memory_score.value is None


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [(0.01, 0.2, Verdict.BEATS), (-0.01, 0.2, Verdict.WITHIN_NOISE), (-0.3, -0.1, Verdict.WORSE)],
)
def test_verdict_is_read_from_the_interval(low: float, high: float, verdict: Verdict) -> None:
    assert verdict_of(Interval(low=low, high=high)) is verdict


def test_random_effects_matches_a_hand_computation() -> None:
    values, errors = np.array([0.10, 0.25, 0.18, 0.05]), np.array([0.05, 0.06, 0.04, 0.07])
    weights = 1 / errors**2
    fixed = (weights * values).sum() / weights.sum()
    q = (weights * (values - fixed) ** 2).sum()
    tau2 = max(0.0, (q - 3) / (weights.sum() - (weights**2).sum() / weights.sum()))
    w = 1 / (errors**2 + tau2)
    pooled = (w * values).sum() / w.sum()
    spread = (w * (values - pooled) ** 2).sum() / (3 * w.sum())
    half = 3.182446305284263 * np.sqrt(spread)  # t(0.975, 3)
    found = random_effects(values, errors)
    assert found.value == pytest.approx(pooled)
    assert found.tau_squared == pytest.approx(tau2)
    assert found.interval is not None
    assert found.interval.low == pytest.approx(pooled - half)
    assert found.interval.high == pytest.approx(pooled + half)
    assert found.q_statistic == pytest.approx(q)
