"""Per-question outcomes of one policy, the unit every interval and test resamples.

An outcome is one multiple-choice question asked of one user at the end of one period: was it
answered right, what a uniform random choice scores on it, and whether the upper bound (the
agent told the gold state) answered it right. Questions are keyed by (stratum, user, period,
question) so that two policies scored on the same users pair up question by question; a
stratum is an environment seed (a world), so users of different seeds never mix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.core.errors import ToolkitError
from evolve.simulator.metrics import upper_bound_correct
from evolve.simulator.records import ItemResult, PeriodResult, UserResult
from evolve.simulator.run_dir import read_record
from evolve.simulator.upper_bound_table import UpperBoundTable

QuestionKey = tuple[str, str, int, int]  # stratum, user, period, question


class PairingError(ToolkitError):
    """Two policies compared on different questions: a paired test needs the same ones."""


@dataclass(frozen=True)
class QuestionOutcomes:
    """Parallel arrays, one entry per question (parse failures count as wrong)."""

    keys: tuple[QuestionKey, ...]
    correct: np.ndarray  # 0/1 floats
    random_score: np.ndarray  # expected accuracy of a uniform random choice
    upper_bound: np.ndarray  # 0/1 floats; NaN where no upper-bound answer is known

    def __post_init__(self) -> None:
        sizes = {len(self.keys), len(self.correct), len(self.random_score), len(self.upper_bound)}
        if len(sizes) != 1:
            raise ValueError(f"outcome arrays of different lengths: {sorted(sizes)}")

    @property
    def questions(self) -> int:
        return len(self.keys)

    @property
    def clusters(self) -> list[tuple[str, str]]:
        """(stratum, user) of every user, in first-seen order."""
        return list(dict.fromkeys((key[0], key[1]) for key in self.keys))

    @property
    def strata(self) -> list[str]:
        return list(dict.fromkeys(key[0] for key in self.keys))

    @property
    def upper_bound_known(self) -> bool:
        return bool(self.questions) and not np.isnan(self.upper_bound).any()

    def cluster_index(self) -> tuple[np.ndarray, list[tuple[str, str]]]:
        """Each question's user as an integer, and the users in that order."""
        clusters = self.clusters
        position = {cluster: index for index, cluster in enumerate(clusters)}
        return np.array([position[(k[0], k[1])] for k in self.keys], dtype=np.int64), clusters

    def restricted(self, keys: Sequence[QuestionKey]) -> QuestionOutcomes:
        """These outcomes on `keys`, in that order (every key must be present)."""
        position = {key: index for index, key in enumerate(self.keys)}
        missing = [key for key in keys if key not in position]
        if missing:
            raise PairingError(f"{len(missing)} question(s) missing, e.g. {missing[0]}")
        order = np.array([position[key] for key in keys], dtype=np.int64)
        return QuestionOutcomes(
            keys=tuple(keys),
            correct=self.correct[order],
            random_score=self.random_score[order],
            upper_bound=self.upper_bound[order],
        )


def outcomes_from_users(
    users: Iterable[UserResult],
    *,
    stratum: str = "",
    upper_bound: UpperBoundTable | None = None,
) -> QuestionOutcomes:
    """Every scored question of `users` (an evaluation's per-item records)."""
    return outcomes_from_periods(
        (period for user in users for period in user.periods),
        stratum=stratum,
        upper_bound=upper_bound,
    )


def outcomes_from_periods(
    periods: Iterable[PeriodResult],
    *,
    stratum: str = "",
    upper_bound: UpperBoundTable | None = None,
    keep: Callable[[ItemResult], bool] | None = None,
) -> QuestionOutcomes:
    keys: list[QuestionKey] = []
    correct: list[float] = []
    random_scores: list[float] = []
    upper: list[float] = []
    for period in periods:
        for item in period.items:
            if keep is not None and not keep(item):
                continue
            keys.append((stratum, period.user_id, period.period_index, item.question_index))
            correct.append(float(item.correct))
            random_scores.append(item.random_score)
            known = upper_bound_correct(item, period.user_id, upper_bound)
            upper.append(np.nan if known is None else float(known))
    return QuestionOutcomes(
        keys=tuple(keys),
        correct=np.asarray(correct, dtype=float),
        random_score=np.asarray(random_scores, dtype=float),
        upper_bound=np.asarray(upper, dtype=float),
    )


def load_outcomes(
    run_dir: Path, *, stratum: str = "", keep: Callable[[ItemResult], bool] | None = None
) -> QuestionOutcomes:
    """The outcomes stored under an evaluation's directory (every `period_*/result.json`
    below it, so a directory of per-user runs reads like one run), only the questions `keep`
    accepts when given. Upper-bound answers come from the run's `upper_bound.json`, or from
    the items where it has none."""
    run_dir = Path(run_dir)
    tables: dict[Path, UpperBoundTable | None] = {}
    outcomes: list[QuestionOutcomes] = []
    for path in sorted(run_dir.glob("**/period_*/result.json")):
        period = read_record(path, PeriodResult)
        run_root = path.parents[3]  # <run>/users/<user>/period_NN/result.json
        if run_root not in tables:
            table_file = run_root / "upper_bound.json"
            tables[run_root] = (
                read_record(table_file, UpperBoundTable) if table_file.is_file() else None
            )
        outcomes.append(
            outcomes_from_periods(
                [period], stratum=stratum, upper_bound=_usable(tables[run_root]), keep=keep
            )
        )
    return concatenate(outcomes)


def _usable(table: UpperBoundTable | None) -> UpperBoundTable | None:
    return table if table is not None and table.entries else None


def concatenate(parts: Sequence[QuestionOutcomes]) -> QuestionOutcomes:
    """Outcomes of several evaluations (seeds, user sets) as one set; keys must not repeat."""
    keys = tuple(key for part in parts for key in part.keys)
    if len(set(keys)) != len(keys):
        raise PairingError("the same question appears twice: give each part its own stratum")
    if not parts:
        empty = np.zeros(0)
        return QuestionOutcomes(keys=(), correct=empty, random_score=empty, upper_bound=empty)
    return QuestionOutcomes(
        keys=keys,
        correct=np.concatenate([part.correct for part in parts]),
        random_score=np.concatenate([part.random_score for part in parts]),
        upper_bound=np.concatenate([part.upper_bound for part in parts]),
    )


def paired(
    first: QuestionOutcomes, second: QuestionOutcomes
) -> tuple[QuestionOutcomes, QuestionOutcomes]:
    """Both policies on exactly the same questions, in one order; anything else is an error
    (a paired test on different questions would compare different things)."""
    if set(first.keys) != set(second.keys):
        only_first = len(set(first.keys) - set(second.keys))
        only_second = len(set(second.keys) - set(first.keys))
        raise PairingError(
            f"the two policies were scored on different questions ({only_first} only in the "
            f"first, {only_second} only in the second): compare evaluations of the same users "
            "and periods"
        )
    return first, second.restricted(first.keys)
