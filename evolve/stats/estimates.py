"""Scores with intervals, and paired comparisons as tests.

One policy: accuracy and memory score, each with a two-stage bootstrap interval (users, then
questions within users; strata = environment seeds, resampled separately). Two policies on the
same questions (X - Y): the paired difference with its interval, the memory score's difference
with the upper bound resampled along with its questions, McNemar's discordant counts with the
exact binomial p (`scipy.stats.binomtest`), and with six users or more the exact user-level
sign-flip p (`scipy.stats.permutation_test`). Every result records its method, seed and number
of resamples. The verdict reads the accuracy difference's interval: accuracy is defined on any
set of questions, the memory score only where the upper bound is clearly above random.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats as scipy_stats

from evolve.simulator.metrics import memory_margin, memory_ratio
from evolve.stats.bootstrap import Resamples, two_stage_resamples
from evolve.stats.outcomes import QuestionOutcomes, paired
from evolve.stats.verdict import CONFIDENCE, Interval, Verdict, verdict_of

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
METHOD = "two-stage bootstrap (users, then questions within users; per stratum), percentile"
# A sign-flip test needs enough users for its smallest p to fall below 0.05 (2 / 2**6).
MIN_USERS_FOR_SIGN_FLIP = 6
# Past this many users the exact sign-flip enumerates too much: a seeded Monte Carlo instead.
EXACT_SIGN_FLIP_USERS = 12
# The share of resamples whose memory score may be undefined before its interval is.
UNDEFINED_SHARE_LIMIT = 0.025


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Estimate(_Frozen):
    value: float | None
    interval: Interval | None = None
    standard_error: float | None = Field(default=None, description="SD of the resamples.")
    undefined: str | None = Field(default=None, description="Why value or interval is None.")

    def format(self, digits: int = 3, signed: bool = False) -> str:
        if self.value is None:
            return "-"
        form = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
        text = form.format(self.value)
        return text + (" " + self.interval.format(digits, signed) if self.interval else "")


class Basis(_Frozen):
    """What an interval rests on, and how it was computed."""

    users: int
    questions: int
    strata: int = Field(description="Environment seeds (resampled separately).")
    method: str = METHOD
    seed: int
    resamples: int

    def describe(self) -> str:
        seeds = f", {self.strata} seeds" if self.strata > 1 else ""
        users = f"{self.users} user{'s' if self.users != 1 else ''}"
        return f"{users}, {self.questions} questions{seeds}"


class ScoreEstimate(_Frozen):
    """One policy's scores with intervals."""

    accuracy: Estimate
    memory_score: Estimate
    basis: Basis


class PairedComparison(_Frozen):
    """X - Y on the same questions, as a test."""

    difference: Estimate = Field(description="Accuracy of X minus accuracy of Y.")
    memory_score_difference: Estimate
    verdict: Verdict = Field(description="Read from the accuracy difference's interval.")
    x_only_correct: int = Field(description="McNemar: questions only X answered right.")
    y_only_correct: int = Field(description="McNemar: questions only Y answered right.")
    mcnemar_p: float = Field(description="Exact two-sided binomial p on the discordant pairs.")
    users_ahead: int = Field(description="Users on whom X's accuracy is higher.")
    users_behind: int
    users_tied: int
    sign_flip_p: float | None = Field(
        default=None, description="Exact user-level sign-flip p (None: fewer than 6 users)."
    )
    basis: Basis

    def counts(self) -> str:
        users = self.users_ahead + self.users_behind + self.users_tied
        text = (
            f"McNemar {self.x_only_correct} vs {self.y_only_correct} (p = {_p(self.mcnemar_p)}), "
            f"{self.users_ahead} of {users} users ahead"
        )
        if self.sign_flip_p is None:
            text += " (too few users for a user-level test)"
        else:
            text += f" (sign-flip p = {_p(self.sign_flip_p)})"
        return text

    def evidence(self) -> str:
        """'difference +0.167 [-0.004, +0.337], McNemar 12 vs 4 (p = 0.077), ...; 2 users,
        48 questions': what the verdict rests on."""
        return (
            f"difference {self.difference.format(signed=True)}, {self.counts()}; "
            f"{self.basis.describe()}"
        )

    def describe(self) -> str:
        """The verdict and its evidence: 'within noise: difference +0.167 [...], ...'."""
        return f"{self.verdict.value}: {self.evidence()}"


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else f"{value:.0e}"


def _indices(outcomes: QuestionOutcomes) -> tuple[np.ndarray, np.ndarray, int, int]:
    cluster, clusters = outcomes.cluster_index()
    strata = {name: index for index, name in enumerate(outcomes.strata)}
    cluster_stratum = np.array([strata[stratum] for stratum, _ in clusters], dtype=np.int64)
    return cluster, cluster_stratum, len(clusters), len(strata)


def _resampled(
    outcomes: QuestionOutcomes, columns: list[np.ndarray], *, seed: int, resamples: int
) -> Resamples:
    """The two-stage resamples of `columns` (per question of `outcomes`); the first column
    sets the first stage's shrinkage."""
    cluster, cluster_stratum, _, _ = _indices(outcomes)
    return two_stage_resamples(
        np.column_stack(columns),
        cluster,
        cluster_stratum,
        primary=0,
        resamples=resamples,
        rng=np.random.default_rng(seed),
    )


def _interval(values: np.ndarray) -> Interval:
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return Interval(low=float(low), high=float(high))


def _from_resamples(
    point: float | None, values: np.ndarray, what: str, bounds: tuple[float, float] | None = None
) -> Estimate:
    if point is None:
        return Estimate(value=None, undefined=f"{what} is undefined on these questions")
    finite = values[np.isfinite(values)]
    undefined = len(values) - len(finite)
    if undefined > UNDEFINED_SHARE_LIMIT * len(values):
        return Estimate(
            value=point,
            undefined=f"{what} is undefined in {undefined} of {len(values)} resamples "
            "(the upper bound not clearly above random)",
        )
    interval = _interval(finite)
    if bounds is not None:
        # Residuals scaled up by sqrt(m / (m - 1)) can take a resampled share past its range.
        low, high = bounds
        interval = Interval(low=max(low, interval.low), high=min(high, interval.high))
    return Estimate(value=point, interval=interval, standard_error=float(finite.std()))


def _memory_resamples(
    resamples: Resamples, correct: int, random: int, upper: int, margin_share: float
) -> np.ndarray:
    room = resamples.sums[:, upper] - resamples.sums[:, random]
    defined = room >= margin_share * resamples.counts - 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (resamples.sums[:, correct] - resamples.sums[:, random]) / room
    return np.where(defined, ratio, np.nan)


def _memory_point(outcomes: QuestionOutcomes, correct: np.ndarray) -> float | None:
    if not outcomes.upper_bound_known:
        return None
    return memory_ratio(
        float(correct.mean()), outcomes.random_score.tolist(), float(outcomes.upper_bound.mean())
    )


def estimate(
    outcomes: QuestionOutcomes,
    *,
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
) -> ScoreEstimate:
    """Accuracy and memory score of one policy, each with its interval."""
    if outcomes.questions == 0:
        raise ValueError("no scored question to estimate from")
    _, _, users, strata = _indices(outcomes)
    columns = [outcomes.correct, outcomes.random_score, np.nan_to_num(outcomes.upper_bound)]
    drawn = _resampled(outcomes, columns, seed=seed, resamples=resamples)
    accuracy = float(outcomes.correct.mean())
    margin = memory_margin(outcomes.random_score.tolist())
    return ScoreEstimate(
        accuracy=_from_resamples(accuracy, drawn.means(0), "accuracy", bounds=(0.0, 1.0)),
        memory_score=_from_resamples(
            _memory_point(outcomes, outcomes.correct),
            _memory_resamples(drawn, 0, 1, 2, margin),
            "the memory score",
        ),
        basis=Basis(
            users=users,
            questions=outcomes.questions,
            strata=strata,
            seed=seed,
            resamples=resamples,
        ),
    )


def compare(
    x: QuestionOutcomes,
    y: QuestionOutcomes,
    *,
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
) -> PairedComparison:
    """X - Y on the same questions (an error if they were scored on different ones)."""
    x, y = paired(x, y)
    accuracy_difference, memory_difference = paired_difference(x, y, seed=seed, resamples=resamples)
    cluster, _, users, strata = _indices(x)
    difference = x.correct - y.correct
    x_only = int(((x.correct == 1) & (y.correct == 0)).sum())
    y_only = int(((x.correct == 0) & (y.correct == 1)).sum())
    per_user = np.bincount(cluster, weights=difference) / np.bincount(cluster)
    return PairedComparison(
        difference=accuracy_difference,
        memory_score_difference=memory_difference,
        verdict=verdict_of(accuracy_difference.interval),
        x_only_correct=x_only,
        y_only_correct=y_only,
        mcnemar_p=mcnemar_p(x_only, y_only),
        users_ahead=int((per_user > 1e-12).sum()),
        users_behind=int((per_user < -1e-12).sum()),
        users_tied=int((np.abs(per_user) <= 1e-12).sum()),
        sign_flip_p=sign_flip_p(per_user, seed=seed),
        basis=Basis(
            users=users, questions=x.questions, strata=strata, seed=seed, resamples=resamples
        ),
    )


def paired_difference(
    x: QuestionOutcomes,
    y: QuestionOutcomes,
    *,
    seed: int = DEFAULT_SEED,
    resamples: int = DEFAULT_RESAMPLES,
) -> tuple[Estimate, Estimate]:
    """X - Y in accuracy and in memory score, each with its interval: both policies' answers
    to a question, and the upper bound's, are drawn together (paired, and the memory score's
    denominator resampled with its questions)."""
    x, y = paired(x, y)
    if x.questions == 0:
        raise ValueError("no scored question to compare on")
    difference = x.correct - y.correct
    upper = np.nan_to_num(x.upper_bound)
    columns = [difference, x.correct, y.correct, x.random_score, upper]
    drawn = _resampled(x, columns, seed=seed, resamples=resamples)
    margin = memory_margin(x.random_score.tolist())
    memory_x = _memory_resamples(drawn, 1, 3, 4, margin)
    memory_y = _memory_resamples(drawn, 2, 3, 4, margin)
    point_x, point_y = _memory_point(x, x.correct), _memory_point(x, y.correct)
    memory_point = None if point_x is None or point_y is None else point_x - point_y
    return (
        _from_resamples(float(difference.mean()), drawn.means(0), "accuracy", bounds=(-1.0, 1.0)),
        _from_resamples(memory_point, memory_x - memory_y, "the memory score difference"),
    )


def mcnemar_p(x_only: int, y_only: int) -> float:
    """Exact McNemar: a two-sided binomial test of the discordant pairs against 1/2."""
    discordant = x_only + y_only
    if discordant == 0:
        return 1.0
    return float(scipy_stats.binomtest(x_only, discordant, 0.5).pvalue)


def _mean_along(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(values, axis=axis)


def sign_flip_p(per_user: np.ndarray, *, seed: int = DEFAULT_SEED) -> float | None:
    """Two-sided p of the mean per-user difference under random sign flips (users as the
    unit): exact up to `EXACT_SIGN_FLIP_USERS` users, seeded Monte Carlo beyond. None with
    fewer than `MIN_USERS_FOR_SIGN_FLIP` users: then no user-level test can reach p < 0.05."""
    per_user = np.asarray(per_user, dtype=float)
    if len(per_user) < MIN_USERS_FOR_SIGN_FLIP:
        return None
    if not np.any(per_user):
        return 1.0
    exact = len(per_user) <= EXACT_SIGN_FLIP_USERS
    result = scipy_stats.permutation_test(
        (per_user,),
        _mean_along,
        permutation_type="samples",
        vectorized=True,
        n_resamples=math.inf if exact else 9999,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(min(1.0, result.pvalue))
