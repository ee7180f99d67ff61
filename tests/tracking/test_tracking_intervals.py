"""What the runs say about intervals and verdicts (`evolve.tracking.intervals`), on two
committed experiments: quickstart-s13, whose best is within noise of its base on the held-out
users, and quickstart-s14, whose best beats it. Every expected number is recomputed from the
per-question records under the experiment directory, never copied from an output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evolve.optimize.experiment_dir import ExperimentDir
from evolve.results.comparison import base_and_best
from evolve.results.records import ExperimentResult
from evolve.stats import Interval, Verdict, compare, estimate, load_outcomes, paired, verdict_of
from evolve.tracking.intervals import (
    comparison_metrics,
    comparison_tags,
    heldout_verdict_text,
    score_interval_metrics,
)
from evolve.tracking.tags import TAG_HELDOUT_METHOD, TAG_HELDOUT_SEED, TAG_HELDOUT_VERDICT

RECORDS = Path(__file__).resolve().parents[2] / "benchmarks" / "records"
SEEDS = RECORDS / "quickstart_seeds-addable-failures"
WITHIN_NOISE, BEATS = SEEDS / "quickstart-s13", SEEDS / "quickstart-s14"


@pytest.fixture(scope="module", params=[WITHIN_NOISE, BEATS], ids=["s13", "s14"])
def experiment(request) -> tuple[Path, ExperimentResult]:
    return request.param, ExperimentDir(request.param).load_result()


def heldout_outcomes(root: Path, result: ExperimentResult):
    """The best's and the base's per-question held-out records, paired question by question."""
    base, best = base_and_best(result)
    return paired(
        load_outcomes(root / best.heldout.run_dir, stratum=result.name),
        load_outcomes(root / base.heldout.run_dir, stratum=result.name),
    )


def test_the_committed_experiments_are_one_of_each_verdict():
    # The tests below mean something only if one of the two is within noise and one beats,
    # and their point scores both favour the best (a verdict from points would say "beats").
    verdicts = {}
    for root in (WITHIN_NOISE, BEATS):
        result = ExperimentDir(root).load_result()
        base, best = base_and_best(result)
        assert best.heldout.summary.accuracy > base.heldout.summary.accuracy
        verdicts[root] = result.heldout_comparison.verdict
    assert verdicts == {WITHIN_NOISE: Verdict.WITHIN_NOISE, BEATS: Verdict.BEATS}


def test_comparison_metrics_are_the_paired_difference_with_its_bounds(experiment):
    root, result = experiment
    comparison = result.heldout_comparison
    metrics = comparison_metrics(comparison)
    best, base = heldout_outcomes(root, result)
    # The point: the mean paired difference of the per-question records.
    assert metrics["heldout_difference"] == pytest.approx(
        float((best.correct - base.correct).mean())
    )
    # The bounds: the interval of the difference, a real interval around the point (a point
    # logged as its own bound would make low == value == high).
    low, high = metrics["heldout_difference_low"], metrics["heldout_difference_high"]
    recomputed = compare(best, base, seed=comparison.basis.seed).difference.interval
    assert (low, high) == pytest.approx((recomputed.low, recomputed.high))
    assert low < metrics["heldout_difference"] < high
    # McNemar's discordant counts, counted here question by question, and its p.
    best_only = int(np.sum((best.correct == 1) & (base.correct == 0)))
    base_only = int(np.sum((best.correct == 0) & (base.correct == 1)))
    assert metrics["heldout_best_only_correct"] == best_only
    assert metrics["heldout_base_only_correct"] == base_only
    assert metrics["heldout_mcnemar_p"] == pytest.approx(comparison.mcnemar_p)
    assert 0 < metrics["heldout_mcnemar_p"] <= 1
    memory = comparison.memory_score_difference
    assert metrics["heldout_memory_score_difference"] == pytest.approx(memory.value)
    assert metrics["heldout_memory_score_difference_low"] < memory.value
    assert metrics["heldout_memory_score_difference_high"] > memory.value
    users = len(best.clusters)
    assert (
        metrics["heldout_users_ahead"]
        + metrics["heldout_users_behind"]
        + metrics["heldout_users_tied"]
        == users
    )
    # Two users: too few for a user-level test, so no sign-flip p at all (never a stand-in).
    assert users < 6 and "heldout_sign_flip_p" not in metrics


def test_the_verdict_tag_is_read_from_the_logged_interval(experiment):
    _, result = experiment
    comparison = result.heldout_comparison
    metrics = comparison_metrics(comparison)
    tags = comparison_tags(comparison)
    logged = Interval(
        low=metrics["heldout_difference_low"], high=metrics["heldout_difference_high"]
    )
    assert tags[TAG_HELDOUT_VERDICT] == verdict_of(logged).value
    assert tags[TAG_HELDOUT_METHOD] == comparison.basis.method
    assert tags[TAG_HELDOUT_SEED] == str(comparison.basis.seed)


def test_the_verdict_text_carries_the_interval_counts_and_basis(experiment):
    root, result = experiment
    comparison = result.heldout_comparison
    text = heldout_verdict_text(result)
    base, best = base_and_best(result)
    best_outcomes, _ = heldout_outcomes(root, result)
    assert f"the best ({best.id}) against the base ({base.id})" in text
    assert f": {comparison.verdict.value}: " in text
    assert comparison.difference.interval.format(signed=True) in text
    assert f"McNemar {comparison.x_only_correct} vs {comparison.y_only_correct}" in text
    assert f"{len(best_outcomes.clusters)} users, {best_outcomes.questions} questions" in text


def test_score_interval_metrics_sit_beside_their_point(experiment):
    root, result = experiment
    _, best = base_and_best(result)
    outcomes = load_outcomes(root / best.heldout.run_dir, stratum=result.name)
    scores = estimate(outcomes)
    metrics = score_interval_metrics("heldout", scores)
    assert set(metrics) == {
        "heldout_accuracy_low",
        "heldout_accuracy_high",
        "heldout_memory_score_low",
        "heldout_memory_score_high",
    }
    accuracy = float(outcomes.correct.mean())
    assert metrics["heldout_accuracy_low"] < accuracy < metrics["heldout_accuracy_high"]
    interval = scores.accuracy.interval
    assert (metrics["heldout_accuracy_low"], metrics["heldout_accuracy_high"]) == (
        interval.low,
        interval.high,
    )
    memory = scores.memory_score.value
    assert metrics["heldout_memory_score_low"] < memory < metrics["heldout_memory_score_high"]
    assert score_interval_metrics("train", None) == {}  # a record from before intervals


def test_undefined_estimates_log_no_metric(experiment):
    _, result = experiment
    comparison = result.heldout_comparison
    undefined = comparison.memory_score_difference.model_copy(
        update={"value": None, "interval": None}
    )
    without = comparison.model_copy(update={"memory_score_difference": undefined})
    assert not [name for name in comparison_metrics(without) if "memory_score" in name]
    with_users = comparison.model_copy(update={"sign_flip_p": 0.03})
    assert comparison_metrics(with_users)["heldout_sign_flip_p"] == 0.03
