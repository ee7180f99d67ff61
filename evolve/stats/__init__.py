"""Intervals and tests for comparing memory policies: paired on the same questions,
clustered by user, stratified by environment seed, pooled across seeds and replicates.

Pure functions over per-question records; numbers come back as frozen records carrying the
method, seed and counts they rest on. A verdict (beats / within noise / worse) is read from
the interval of a difference, never from two point scores.
"""

from evolve.stats.estimates import (
    DEFAULT_RESAMPLES,
    Basis,
    Estimate,
    PairedComparison,
    ScoreEstimate,
    compare,
    estimate,
    mcnemar_p,
    paired_difference,
    sign_flip_p,
)
from evolve.stats.outcomes import (
    PairingError,
    QuestionOutcomes,
    concatenate,
    load_outcomes,
    outcomes_from_periods,
    outcomes_from_users,
    paired,
)
from evolve.stats.pooling import PooledEstimate, random_effects
from evolve.stats.power import (
    minimum_detectable,
    power_to_beat,
    scaled_standard_error,
    users_needed,
    users_to_detect,
)
from evolve.stats.verdict import CONFIDENCE, Interval, Verdict, verdict_of

__all__ = [
    "CONFIDENCE",
    "DEFAULT_RESAMPLES",
    "Basis",
    "Estimate",
    "Interval",
    "PairedComparison",
    "PairingError",
    "PooledEstimate",
    "QuestionOutcomes",
    "ScoreEstimate",
    "Verdict",
    "compare",
    "concatenate",
    "estimate",
    "load_outcomes",
    "mcnemar_p",
    "minimum_detectable",
    "outcomes_from_periods",
    "outcomes_from_users",
    "paired",
    "paired_difference",
    "power_to_beat",
    "random_effects",
    "scaled_standard_error",
    "sign_flip_p",
    "users_needed",
    "users_to_detect",
    "verdict_of",
]
