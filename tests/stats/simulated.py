"""Per-question results with a known truth, for calibrating the statistics.

Each user has a baseline ability (a user effect shared by both policies: within-user
correlation) and each question a difficulty shared by both policies (pairing); given those,
the two policies answer independently. The true difference is the expected difference over
the population of users and questions, computed once from a large draw of the same process.
"""

from __future__ import annotations

import numpy as np

from evolve.stats import QuestionOutcomes

USER_SD = 0.12  # between-user spread of the baseline accuracy
QUESTION_SD = 0.25  # spread of question difficulty (shared by both policies)
EFFECT_SD = 0.03  # between-user spread of the gain
BASE_ACCURACY = 0.5
RANDOM_SCORE = 1 / 3


def probabilities(
    rng: np.random.Generator, users: int, questions: int, gain: float
) -> tuple[np.ndarray, np.ndarray]:
    user = rng.normal(0, USER_SD, (users, 1))
    question = rng.normal(0, QUESTION_SD, (users, questions))
    user_gain = rng.normal(0, EFFECT_SD, (users, 1))
    base = np.clip(BASE_ACCURACY + user + question, 0.02, 0.98)
    evolved = np.clip(base + gain + user_gain, 0.02, 0.98)
    return evolved, base


def true_difference(gain: float, seed: int = 12345) -> float:
    evolved, base = probabilities(np.random.default_rng(seed), 200_000, 1, gain)
    return float((evolved - base).mean())


def true_memory_score(upper_bound_accuracy: float = 0.75, seed: int = 12345) -> float:
    """The base policy's memory score over the population: (E[acc] - r) / (E[ub] - r)."""
    _, base = probabilities(np.random.default_rng(seed), 200_000, 1, 0.0)
    return (float(base.mean()) - RANDOM_SCORE) / (upper_bound_accuracy - RANDOM_SCORE)


def dataset(
    rng: np.random.Generator,
    strata: int,
    users: int,
    questions: int,
    gain: float,
    upper_bound_accuracy: float = 1.0,
) -> tuple[QuestionOutcomes, QuestionOutcomes]:
    """Two policies' outcomes on the same questions: `strata` seeds x `users` x `questions`;
    the upper bound answers each question right with `upper_bound_accuracy`."""
    evolved, base = probabilities(rng, strata * users, questions, gain)
    evolved_correct = (rng.random(evolved.shape) < evolved).astype(float).ravel()
    base_correct = (rng.random(base.shape) < base).astype(float).ravel()
    keys = tuple(
        (str(u // users), f"u{u}", 0, q) for u in range(strata * users) for q in range(questions)
    )
    random = np.full(len(keys), RANDOM_SCORE)
    upper = (rng.random(len(keys)) < upper_bound_accuracy).astype(float)
    return (
        QuestionOutcomes(keys, evolved_correct, random, upper),
        QuestionOutcomes(keys, base_correct, random, upper),
    )
