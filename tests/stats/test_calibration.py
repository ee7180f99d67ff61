"""The statistics on data with a known truth: 95% intervals cover it 93-97% of the time,
"beats" is rare when there is nothing to find (the verdict `compare` prints is
`verdict_of` this interval), and the power the toolkit reports matches the
rate at which it detects a real gain. Sizes: the quickstart's held-out set (2 users, 48
questions) and a study's (4 seeds x 6 users, 576 questions)."""

from __future__ import annotations

import numpy as np
import pytest
from stats.simulated import dataset, true_difference, true_memory_score

from evolve.stats import (
    QuestionOutcomes,
    Verdict,
    estimate,
    paired_difference,
    power_to_beat,
    verdict_of,
)

DATASETS = 500
RESAMPLES = 1000
QUESTIONS_PER_USER = 24
SIZES = {"quickstart": (1, 2), "study": (4, 6)}


def _run(size: str, gain: float, seed: int) -> dict[str, float]:
    strata, users = SIZES[size]
    rng = np.random.default_rng(seed)
    truth = true_difference(gain)
    covered = beats = 0
    errors = []
    for index in range(DATASETS):
        x, y = dataset(rng, strata, users, QUESTIONS_PER_USER, gain)
        difference, _ = paired_difference(x, y, seed=index, resamples=RESAMPLES)
        assert difference.interval is not None
        covered += difference.interval.contains(truth)
        beats += verdict_of(difference.interval) is Verdict.BEATS
        errors.append(difference.standard_error)
    return {
        "coverage": covered / DATASETS,
        "beats": beats / DATASETS,
        "power": power_to_beat(truth, float(np.mean(errors))),
    }


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("gain", [0.0, 0.10, 0.20])
def test_difference_intervals_cover_the_truth_and_power_matches_detection(
    size: str, gain: float
) -> None:
    found = _run(size, gain, seed=int(gain * 100) + len(size))
    assert 0.93 <= found["coverage"] <= 0.97, found
    if gain == 0.0:
        assert found["beats"] <= 0.05, found
    assert abs(found["power"] - found["beats"]) <= 0.05, found


def test_memory_score_interval_covers_the_truth() -> None:
    """The memory score divides by the upper bound's accuracy, itself measured on the same
    questions: its interval covers the truth only if the upper bound is resampled with them."""
    rng = np.random.default_rng(3)
    truth = true_memory_score()
    covered = 0
    for index in range(DATASETS):
        _, outcomes = dataset(rng, 4, 6, QUESTIONS_PER_USER, 0.0, upper_bound_accuracy=0.75)
        interval = estimate(outcomes, seed=index, resamples=RESAMPLES).memory_score.interval
        assert interval is not None
        covered += interval.contains(truth)
    assert 0.93 <= covered / DATASETS <= 0.97, covered / DATASETS


def test_memory_score_interval_covers_the_truth_when_only_the_upper_bound_varies() -> None:
    """A policy right on every question: all the memory score's noise is the upper bound's
    (measured on the same questions), so the interval is as good as its resampling of it."""
    rng = np.random.default_rng(4)
    upper_bound_accuracy = 0.8
    truth = (1 - 1 / 3) / (upper_bound_accuracy - 1 / 3)
    covered = 0
    for index in range(DATASETS):
        _, outcomes = dataset(
            rng, 1, 6, QUESTIONS_PER_USER, 0.0, upper_bound_accuracy=upper_bound_accuracy
        )
        always_right = QuestionOutcomes(
            outcomes.keys,
            np.ones(outcomes.questions),
            outcomes.random_score,
            outcomes.upper_bound,
        )
        interval = estimate(always_right, seed=index, resamples=RESAMPLES).memory_score.interval
        assert interval is not None
        covered += interval.contains(truth)
    assert 0.93 <= covered / DATASETS <= 0.97, covered / DATASETS
