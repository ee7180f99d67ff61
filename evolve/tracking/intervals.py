"""What the runs say about intervals and verdicts: the held-out test of the best against the
base as metrics and tags, and each evaluation's interval bounds as metrics (pure functions;
the trackers and the export log them).

A verdict is never logged from two point scores: the word is the comparison's own, read
from the interval of the paired difference (`evolve.stats.verdict_of`). Bounds sit beside
their point metric (`heldout_accuracy` -> `heldout_accuracy_low`, `heldout_accuracy_high`)
so that the runs table sorts and filters on them; an undefined bound has no metric at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from evolve.results.comparison import base_and_best
from evolve.tracking.tags import (
    TAG_HELDOUT_EVIDENCE,
    TAG_HELDOUT_METHOD,
    TAG_HELDOUT_RESAMPLES,
    TAG_HELDOUT_SEED,
    TAG_HELDOUT_VERDICT,
)

if TYPE_CHECKING:
    from evolve.results.records import ExperimentResult
    from evolve.stats import Estimate, PairedComparison, ScoreEstimate

HELDOUT_PREFIX = "heldout_"


def estimate_metrics(name: str, estimate: Estimate) -> dict[str, float]:
    """`<name>_low` and `<name>_high` where the interval is defined (none otherwise)."""
    if estimate.value is None or estimate.interval is None:
        return {}
    return {f"{name}_low": estimate.interval.low, f"{name}_high": estimate.interval.high}


def score_interval_metrics(split: str, estimate: ScoreEstimate | None) -> dict[str, float]:
    """A candidate's interval bounds on `split`: `<split>_accuracy_low`/`_high` and
    `<split>_memory_score_low`/`_high` (none for records written before intervals were)."""
    if estimate is None:
        return {}
    return {
        **estimate_metrics(f"{split}_accuracy", estimate.accuracy),
        **estimate_metrics(f"{split}_memory_score", estimate.memory_score),
    }


def comparison_metrics(
    comparison: PairedComparison, prefix: str = HELDOUT_PREFIX
) -> dict[str, float]:
    """The best minus the base as metrics: the accuracy difference and, where defined, the
    memory score's, each with its bounds; McNemar's discordant counts and p; the users ahead,
    behind and tied, and the user-level sign-flip p where there are users enough for one."""
    metrics: dict[str, float] = {}
    for name, estimate in (
        ("difference", comparison.difference),
        ("memory_score_difference", comparison.memory_score_difference),
    ):
        if estimate.value is not None:
            metrics[f"{prefix}{name}"] = estimate.value
            metrics.update(estimate_metrics(f"{prefix}{name}", estimate))
    metrics[f"{prefix}mcnemar_p"] = comparison.mcnemar_p
    metrics[f"{prefix}best_only_correct"] = float(comparison.x_only_correct)
    metrics[f"{prefix}base_only_correct"] = float(comparison.y_only_correct)
    metrics[f"{prefix}users_ahead"] = float(comparison.users_ahead)
    metrics[f"{prefix}users_behind"] = float(comparison.users_behind)
    metrics[f"{prefix}users_tied"] = float(comparison.users_tied)
    if comparison.sign_flip_p is not None:
        metrics[f"{prefix}sign_flip_p"] = comparison.sign_flip_p
    return metrics


def comparison_tags(comparison: PairedComparison) -> dict[str, str]:
    """The verdict word, its evidence in words (interval, McNemar counts, users and
    questions) and how it was computed (method, seed, resamples)."""
    basis = comparison.basis
    return {
        TAG_HELDOUT_VERDICT: comparison.verdict.value,
        TAG_HELDOUT_EVIDENCE: comparison.evidence()[:5000],
        TAG_HELDOUT_METHOD: basis.method,
        TAG_HELDOUT_SEED: str(basis.seed),
        TAG_HELDOUT_RESAMPLES: str(basis.resamples),
    }


def heldout_verdict_text(result: ExperimentResult) -> str | None:
    """`Held-out test of the best (g03-c0) against the base (g00-c0) on the same questions:
    beats: difference +0.292 [+0.134, +0.449], McNemar 14 vs 0 ...; 2 users, 48 questions.`
    (None without a paired comparison)."""
    comparison = result.heldout_comparison
    pair = base_and_best(result)
    if comparison is None or pair is None:
        return None
    base, best = pair
    return (
        f"Held-out test of the best ({best.id}) against the base ({base.id}) on the same "
        f"questions: {comparison.describe()}.{memory_difference_sentence(comparison)}"
    )


def memory_difference_sentence(comparison: PairedComparison) -> str:
    """` Memory score difference +0.452 [+0.256, +0.659].`, or nothing where undefined."""
    memory = comparison.memory_score_difference
    if memory.value is None:
        return ""
    return f" Memory score difference {memory.format(signed=True)}."
