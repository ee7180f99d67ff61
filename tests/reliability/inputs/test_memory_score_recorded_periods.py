"""The quickstart's recorded periods, replayed: no memory score the toolkit logs or prints
exceeds what its accuracy allows.

`benchmarks/records/quickstart_seeds-read-every-entry` holds four recorded quickstart runs
(seeds 13 and 14, each shipped and blind, from when the quickstart's read showed every entry).
Each evaluation a run made is stored period by period:
`evaluations/<train|heldout>/<fingerprint>/<user>/users/<user>/period_NN/result.json` holds
every question's answer and random score, and the runner directory's `upper_bound.json`
whether the agent answered it right when told the state. This module loads every one of
those periods, recomputes each memory score from them through the production functions (the
per-period ratio, the headline over all questions, the mean of periods, the paper's number,
the optimizer's objective) and the forms they are shown in (MLflow's flat metrics and
per-period curves, the per-period CSV, `evolve eval`'s two tables, `evolve tune`'s line,
MLflow's run names, the chain headlines, `evolve run`'s per-generation table), and checks
them against figures counted here from the items:

- the margin rule: questions whose upper bound beats random by less than 2 questions and 2
  standard errors of the random score have no memory score (None, "-"), never the ratio;
- no memory score of 1.00 at or below chance accuracy;
- every defined score within [0, 1] (so within [-1, 1]) while its accuracy lies between
  random and the upper bound.

The records hold the cases the rule is for: seed 14's held-out user has a period with 2 of 8
three-option questions right against an upper bound of 5 of 8 (the plain ratio -0.29; no
score here), and the base policy answers 8 of that user's 24 questions right, chance exactly
(0.000, not 1.00). The typed counterparts, and a stub that answers "1" to everything, are in
test_memory_score_rule.py.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

from evolve.commands.eval import format_original_table, format_table
from evolve.core.protocol import rules_for
from evolve.optimize.report import HEADLINES, generation_rows
from evolve.optimize.report import format_table as format_generation_table
from evolve.results.objective import (
    format_score,
    load_period_results,
    objective_used,
    objective_value,
    scores_text,
)
from evolve.results.records import CandidateRecord, EvaluationScores, ExperimentResult
from evolve.simulator.evaluation.scheduler import EvaluationReport
from evolve.simulator.metrics import (
    DEGENERATE_SHARE_LIMIT,
    MARGIN_QUESTIONS,
    MARGIN_STANDARD_ERRORS,
    MetricSummary,
    memory_ratio,
    summarize,
    summarize_by_period,
    summarize_by_user,
    summarize_periods,
)
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.run_dir import RunLayout, read_json
from evolve.simulator.upper_bound_table import UpperBoundTable
from evolve.tracking.content import per_period_metrics, per_period_table, split_scores
from evolve.tracking.store import metric_value

RECORDS = Path(__file__).resolve().parents[3] / "benchmarks" / "records"
RECORDS /= "quickstart_seeds-read-every-entry"
RUNS = ("quickstart-s13", "quickstart-s13-blind", "quickstart-s14", "quickstart-s14-blind")
SPLITS = ("train", "heldout")
PERIOD_FILES = "evaluations/*/*/*/users/*/period_*/result.json"
# The three memory scores of a summary, and the accuracy each rests on.
SCORES = {
    "memory_score": "accuracy",
    "memory_score_period_mean": "accuracy",
    "memory_score_original": "accuracy_with_random_fallback",
}
TOL = 1e-9


# ----- the records, and what is counted here from their items ------------------------------


@dataclass(frozen=True)
class Counts:
    """A set of questions as counted here from the stored items (not by the toolkit)."""

    correct: int
    fallback: float  # correct answers, an unparseable one earning its random score
    upper_bound: int  # right when the agent was told the state
    randoms: tuple[float, ...]

    @classmethod
    def of(cls, periods: Sequence[PeriodResult], table: UpperBoundTable) -> Counts:
        items = [(p.user_id, item) for p in periods for item in p.items]
        told = [table.correct(user, item.question_index, item.gold - 1) for user, item in items]
        assert None not in told, "an item without an upper-bound answer"
        assert told == [item.upper_bound_correct for _, item in items]  # the two records agree
        return cls(
            correct=sum(item.correct for _, item in items),
            fallback=sum(
                item.random_score if item.parse_failed else float(item.correct) for _, item in items
            ),
            upper_bound=sum(bool(t) for t in told),
            randoms=tuple(item.random_score for _, item in items),
        )

    @property
    def n(self) -> int:
        return len(self.randoms)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def fallback_accuracy(self) -> float:
        return self.fallback / self.n

    @property
    def chance(self) -> float:
        return sum(self.randoms) / self.n

    @property
    def bound(self) -> float:
        return self.upper_bound / self.n

    @property
    def margin_met(self) -> bool:
        """The upper bound beats random by 2 questions and 2 binomial standard errors."""
        room = self.upper_bound - sum(self.randoms)
        standard_error = math.sqrt(sum(p * (1 - p) for p in self.randoms))
        return room >= max(MARGIN_QUESTIONS, MARGIN_STANDARD_ERRORS * standard_error) - TOL

    def ratio(self, right: float) -> float:
        """The plain `(S - S_random) / (S_UB - S_random)` with `right` questions right."""
        return (right - sum(self.randoms)) / (self.upper_bound - sum(self.randoms))

    def within(self, accuracy: float) -> bool:
        return self.chance - TOL <= accuracy <= self.bound + TOL

    def __str__(self) -> str:
        return (
            f"{self.correct} of {self.n} right, upper bound {self.upper_bound}, "
            f"random {sum(self.randoms):.2f}"
        )


@dataclass(frozen=True)
class Evaluation:
    """One recorded runner directory: one policy's periods of one user on one split."""

    run: str
    split: str
    directory: Path
    periods: tuple[PeriodResult, ...]
    upper_bound: UpperBoundTable

    @property
    def name(self) -> str:
        return str(self.directory.relative_to(RECORDS))

    @property
    def run_dir(self) -> str:
        """As a candidate record names it: relative to the run, without the user."""
        return str(self.directory.parent.relative_to(RECORDS / self.run))

    @property
    def users(self) -> list[UserResult]:
        return [UserResult(user_id=self.periods[0].user_id, periods=list(self.periods))]

    @cached_property
    def counts(self) -> Counts:
        return Counts.of(self.periods, self.upper_bound)

    def period_counts(self, period: PeriodResult) -> Counts:
        return Counts.of([period], self.upper_bound)

    @cached_property
    def summary(self) -> MetricSummary:
        return summarize_periods(self.periods, self.upper_bound)

    @cached_property
    def per_period(self) -> list[MetricSummary]:
        return [summarize_periods([period], self.upper_bound) for period in self.periods]

    def scores(self) -> EvaluationScores:
        """What the optimizer stores and logs for a candidate over these periods."""
        user = self.periods[0].user_id
        return EvaluationScores(
            users=[user],
            score=objective_value(self.summary, "memory_score"),
            objective="memory_score",
            objective_used=objective_used(self.summary, "memory_score"),
            per_user={user: objective_value(self.summary, "memory_score")},
            summary=self.summary,
            per_period=self.per_period,
            run_dir=self.run_dir,
        )

    def report(self) -> EvaluationReport:
        """What `evolve eval` prints its tables from."""
        return EvaluationReport(
            run_dir=self.directory,
            config_hash="recorded",
            users=self.users,
            summary=summarize(self.users, self.upper_bound),
            per_user=summarize_by_user(self.users, self.upper_bound),
            per_period=summarize_by_period(self.users, self.upper_bound),
            wall_time_s=0.0,
        )


def load_evaluations() -> list[Evaluation]:
    evaluations = []
    for run in RUNS:
        for split in SPLITS:
            for run_file in sorted((RECORDS / run / "evaluations" / split).glob("*/*/run.json")):
                layout = RunLayout(run_file.parent)
                table = UpperBoundTable.model_validate(read_json(layout.upper_bound_file))
                periods = tuple(load_period_results(layout.root))
                evaluations.append(Evaluation(run, split, layout.root, periods, table))
    return evaluations


def candidate_records() -> Iterator[tuple[str, CandidateRecord]]:
    for run in RUNS:
        for path in sorted((RECORDS / run / "candidates").glob("*/candidate.json")):
            yield run, CandidateRecord.model_validate(json.loads(path.read_text("utf-8")))


def evaluation_of(evaluations: list[Evaluation], run: str, scores: EvaluationScores) -> Evaluation:
    assert len(scores.users) == 1, "each recorded evaluation is of one user"
    (match,) = [e for e in evaluations if e.run == run and e.run_dir == scores.run_dir]
    return match


@pytest.fixture(scope="module")
def evaluations() -> list[Evaluation]:
    return load_evaluations()


# ----- the rule ------------------------------------------------------------------------------


def assert_allowed(
    score: float | None,
    *,
    accuracy: float,
    chance: float,
    within: bool,
    what: str,
    slack: float = TOL,
) -> None:
    """No 1.00 at or below chance; within [0, 1] (so within [-1, 1]) while `within` (the
    accuracy, or every period's accuracy for a mean of periods, lies between random and the
    upper bound). `slack`: what rounding for display may add."""
    if score is None:
        return
    if accuracy <= chance + TOL:
        assert round(score, 2) != 1.0, f"{what}: {score} at chance accuracy ({accuracy:.3f})"
    if within:  # outside random..upper bound the ratio may leave [-1, 1]: nothing to check
        assert -slack <= score <= 1.0 + slack, f"{what}: {score} with the accuracy in bounds"


def allowance(
    evaluation: Evaluation, summary: MetricSummary, name: str, periods: Sequence[PeriodResult]
) -> dict[str, object]:
    """`assert_allowed`'s keywords for score `name` of `summary` over `periods`."""
    counts = Counts.of(periods, evaluation.upper_bound)
    accuracy = counts.fallback_accuracy if name == "memory_score_original" else counts.accuracy
    assert getattr(summary, SCORES[name]) == pytest.approx(accuracy)
    if name == "memory_score":
        within = counts.within(accuracy)
    else:  # a mean of periods: each period's accuracy between its own bounds
        period_counts = [evaluation.period_counts(period) for period in periods]
        within = all(
            c.within(c.fallback_accuracy if name == "memory_score_original" else c.accuracy)
            for c in period_counts
        )
    return {"accuracy": accuracy, "chance": counts.chance, "within": within}


# ----- the replay is of the recorded periods, all of them -----------------------------------


def test_every_recorded_period_of_every_run_is_replayed(evaluations):
    on_disk = [path for run in RUNS for path in (RECORDS / run).glob(PERIOD_FILES)]
    replayed = [period for evaluation in evaluations for period in evaluation.periods]
    assert len(replayed) == len(on_disk) > 0
    assert {(e.run, e.split) for e in evaluations} == {(r, s) for r in RUNS for s in SPLITS}
    assert all(period.items for period in replayed)
    # Every evaluation a candidate record reports is one replayed here, period for period;
    # the others are the minibatch evaluations of proposals rejected on them.
    reported, rejected = set(), set()
    for run, record in candidate_records():
        if record.status == "rejected":
            rejected.add((run, record.fingerprint))
        for scores in (record.train, record.heldout):
            if scores is None:
                continue
            evaluation = evaluation_of(evaluations, run, scores)
            reported.add(evaluation.name)
            assert len(scores.per_period) == len(evaluation.periods)
            for logged, period in zip(scores.per_period, evaluation.periods, strict=True):
                counts = evaluation.period_counts(period)
                assert logged.n_items == counts.n
                assert logged.accuracy == pytest.approx(counts.accuracy)
                assert logged.random_score == pytest.approx(counts.chance)
                assert logged.upper_bound_score == pytest.approx(counts.bound)
    assert reported
    for evaluation in evaluations:
        if evaluation.name not in reported:
            assert (evaluation.run, evaluation.directory.parent.name) in rejected, evaluation.name


# ----- the scores, recomputed -----------------------------------------------------------------


def test_each_recorded_periods_score_follows_the_margin_rule_and_its_accuracy(evaluations):
    seen = {"defined": 0, "undefined": 0}
    for evaluation in evaluations:
        for period in evaluation.periods:
            counts = evaluation.period_counts(period)
            where = f"{evaluation.name} period {period.period_index} ({counts})"
            randoms = list(counts.randoms)
            ratios = {
                "accuracy": memory_ratio(counts.accuracy, randoms, counts.bound),
                "fallback": memory_ratio(counts.fallback_accuracy, randoms, counts.bound),
            }
            summary = summarize_periods([period], evaluation.upper_bound)
            if counts.margin_met:
                seen["defined"] += 1
                expected = {
                    "memory_score": counts.ratio(counts.correct),
                    "memory_score_period_mean": counts.ratio(counts.correct),
                    "memory_score_original": counts.ratio(counts.fallback),
                }
                assert ratios["accuracy"] == pytest.approx(expected["memory_score"]), where
                assert ratios["fallback"] == pytest.approx(expected["memory_score_original"])
                assert summary.degenerate_periods == 0, where
                for name, value in expected.items():
                    assert getattr(summary, name) == pytest.approx(value), (where, name)
            else:  # the ratio would divide by noise: no score, not 1.00 or -5.00
                seen["undefined"] += 1
                assert ratios == {"accuracy": None, "fallback": None}, where
                assert summary.degenerate_periods == 1, where
                assert [getattr(summary, name) for name in SCORES] == [None] * 3, where
                assert "not clearly above random" in summary.memory_score_undefined
            for name in SCORES:
                assert_allowed(
                    getattr(summary, name),
                    **allowance(evaluation, summary, name, [period]),
                    what=f"{where}: {name}",
                )
    # The records hold both kinds (seed 14's held-out period 1 has no score).
    assert seen["defined"] > 0 and seen["undefined"] > 0, seen


def test_each_evaluations_headline_mean_of_periods_and_papers_number(evaluations):
    at_chance = 0
    for evaluation in evaluations:
        counts = evaluation.counts
        where = f"{evaluation.name} ({counts})"
        summary = evaluation.summary
        assert summarize(evaluation.users, evaluation.upper_bound) == summary
        # The headline: one ratio over all the questions, the margin checked over all of them.
        if counts.margin_met:
            assert summary.memory_score == pytest.approx(counts.ratio(counts.correct)), where
            assert objective_used(summary, "memory_score") == "memory_score"
            assert objective_value(summary, "memory_score") == summary.memory_score
        else:
            assert summary.memory_score is None, where
            assert objective_value(summary, "memory_score") == summary.accuracy
        # The mean of periods and the paper's number: the periods that have a ratio, unless
        # more than a quarter have none.
        period_counts = [evaluation.period_counts(period) for period in evaluation.periods]
        scored = [c for c in period_counts if c.margin_met]
        degenerate = len(period_counts) - len(scored)
        assert summary.degenerate_periods == degenerate, where
        if not scored or degenerate > DEGENERATE_SHARE_LIMIT * len(period_counts):
            assert summary.memory_score_period_mean is None, where
            assert summary.memory_score_original is None, where
        else:
            mean = sum(c.ratio(c.correct) for c in scored) / len(scored)
            paper = sum(c.ratio(c.fallback) for c in scored) / len(scored)
            assert summary.memory_score_period_mean == pytest.approx(mean), where
            assert summary.memory_score_original == pytest.approx(paper), where
        # The per-period curve is the periods' own scores.
        by_period = summarize_by_period(evaluation.users, evaluation.upper_bound)
        assert [s.memory_score for s in by_period] == [
            s.memory_score for s in evaluation.per_period
        ]
        for name in SCORES:
            assert_allowed(
                getattr(summary, name),
                **allowance(evaluation, summary, name, evaluation.periods),
                what=f"{where}: {name}",
            )
        if summary.memory_score is not None and counts.accuracy <= counts.chance + TOL:
            at_chance += 1
            assert summary.memory_score <= TOL, where
    # The records hold a defined score at chance accuracy (seed 14's base, held out: 0.000).
    assert at_chance > 0


def test_the_logged_scores_are_the_replayed_ones(evaluations):
    """The candidate records' scores (what MLflow was sent) and mlflow.json's held-out
    scores equal today's recomputation from the periods, so the rule above holds for them."""
    checked = 0
    for run, record in candidate_records():
        for scores in (record.train, record.heldout):
            if scores is None:
                continue
            evaluation = evaluation_of(evaluations, run, scores)
            where = f"{run} {record.id} {evaluation.split}"
            for name in SCORES:
                logged, now = getattr(scores.summary, name), getattr(evaluation.summary, name)
                assert (logged is None) == (now is None), (where, name, logged, now)
                assert logged == pytest.approx(now), (where, name)
            for logged, now in zip(scores.per_period, evaluation.per_period, strict=True):
                for name in SCORES:
                    assert getattr(logged, name) == pytest.approx(getattr(now, name)), where
            assert scores.objective_used == objective_used(evaluation.summary, "memory_score")
            assert scores.score == pytest.approx(
                objective_value(evaluation.summary, scores.objective)
            )
            checked += 1
        tracked = json.loads((RECORDS / run / "mlflow.json").read_text("utf-8"))
        if record.id in tracked["heldout_scores"]:
            assert record.heldout is not None
            assert tracked["heldout_scores"][record.id] == pytest.approx(record.heldout.score)
    assert checked > 0


# ----- the scores, logged and printed ---------------------------------------------------------


def printed(cell: str) -> float | None:
    return None if cell == "-" else float(cell)


def assert_shown(
    cell: str, value: float | None, evaluation: Evaluation, name: str, what: str, digits: int = 3
) -> None:
    """A displayed score: "-" exactly where there is none, else the value, and allowed."""
    shown = printed(cell)
    assert (shown is None) == (value is None), (what, cell, value)
    if shown is None:
        return
    assert shown == pytest.approx(value, abs=0.6 * 10**-digits), (what, cell, value)
    summary = evaluation.summary
    assert_allowed(
        shown,
        **allowance(evaluation, summary, name, evaluation.periods),
        what=f"{what}: {name} shown as {cell}",
        slack=0.6 * 10**-digits,
    )


def test_mlflow_metrics_and_the_per_period_csv_hold_no_score_the_accuracy_forbids(evaluations):
    curve_points = 0
    for evaluation in evaluations:
        scores = evaluation.scores()
        split = evaluation.split
        flat = evaluation.summary.flat_metrics(f"{split}_")
        for name in SCORES:
            value = getattr(evaluation.summary, name)
            assert flat.get(f"{split}_{name}") == value, (evaluation.name, name)
        points = {
            (metric.key, metric.step): metric.value
            for metric in per_period_metrics(scores, split, timestamp=0)
        }
        csv_rows = list(csv.DictReader(io.StringIO(per_period_table(scores))))
        assert len(csv_rows) == len(evaluation.periods)
        for period, summary, row in zip(
            evaluation.periods, evaluation.per_period, csv_rows, strict=True
        ):
            where = f"{evaluation.name} period {period.period_index}"
            value = summary.memory_score
            point = points.get((f"{split}_period/memory_score", period.period_index))
            # No point at all where undefined; else the value as logged (7 significant digits).
            assert point == (None if value is None else metric_value(value)), where
            curve_points += point is not None
            cell = row["memory_score"]
            assert (cell == "") == (value is None), where
            if cell:
                assert float(cell) == pytest.approx(value, rel=1e-5), where
                counts = evaluation.period_counts(period)
                assert_allowed(
                    float(cell),
                    accuracy=counts.accuracy,
                    chance=counts.chance,
                    within=counts.within(counts.accuracy),
                    what=f"{where}: the per-period CSV",
                    slack=1e-5,
                )
    assert curve_points > 0


def test_printed_tables_lines_and_names_hold_no_score_the_accuracy_forbids(evaluations):
    shown = 0
    for evaluation in evaluations:
        where = evaluation.name
        summary = evaluation.summary
        report = evaluation.report()
        # `evolve eval`: our table and the original's rules.
        ours = format_table([("recorded", report)]).splitlines()
        row = dict(zip(ours[0].split(), ours[2].split(), strict=False))
        assert_shown(row["memory"], summary.memory_score, evaluation, "memory_score", where)
        assert_shown(
            row["mem/period"],
            summary.memory_score_period_mean,
            evaluation,
            "memory_score_period_mean",
            where,
        )
        original = format_original_table([("recorded", report)]).splitlines()
        row = dict(zip(original[0].split(), original[2].split(), strict=False))
        assert_shown(
            row["paper-mem"],
            summary.memory_score_original,
            evaluation,
            "memory_score_original",
            where,
        )
        # `evolve tune`'s trial line.
        (cell,) = re.findall(r"memory_score ([^\s,]+)", scores_text(summary.flat_metrics()))
        assert_shown(cell, summary.memory_score, evaluation, "memory_score", where)
        # The chain headlines: the paper's number and ours, then ours alone.
        for headline, names in zip(
            HEADLINES.values(),
            (("memory_score_original", "memory_score"), ("memory_score",)),
            strict=True,
        ):
            cells = re.findall(r"memory score (\S+?),", headline(summary))
            assert len(cells) == len(names), headline(summary)
            for cell, name in zip(cells, names, strict=True):
                assert_shown(cell, getattr(summary, name), evaluation, name, where)
        shown += 1
    assert shown == len(evaluations) > 0


def test_run_names_and_the_generation_table_hold_no_score_the_accuracy_forbids(evaluations):
    names = 0
    for run, record in candidate_records():
        if record.train is None:
            continue
        # MLflow's run name: `memory <train>/<held-out> acc ...`, two decimals.
        (train_cell, heldout_cell) = re.match(
            r"memory (\S+)/(\S+) acc", split_scores(record)
        ).groups()
        for cell, scores in ((train_cell, record.train), (heldout_cell, record.heldout)):
            if scores is None:
                assert cell == "-"
                continue
            evaluation = evaluation_of(evaluations, run, scores)
            assert_shown(cell, evaluation.summary.memory_score, evaluation, "memory_score", run, 2)
        names += 1
    assert names > 0
    rows = 0
    for run in RUNS:
        result = ExperimentResult.model_validate(
            json.loads((RECORDS / run / "result.json").read_text("utf-8"))
        )
        lines = format_generation_table(result, rules_for(result.protocol)).splitlines()
        for numbers, line in zip(generation_rows(result), lines[2:], strict=False):
            cells = line.split()  # gen, cands, best, best train, mean train, held-out, ...
            best = result.candidate(numbers["best_id"])
            for cell, scores in ((cells[3], best.train), (cells[5], best.heldout)):
                if scores is None:
                    assert cell == "-"
                    continue
                assert cell == format_score(scores.score)
                if scores.objective_used == "memory_score":
                    evaluation = evaluation_of(evaluations, run, scores)
                    assert_shown(cell, scores.score, evaluation, "memory_score", f"{run} {best.id}")
            rows += 1
    assert rows > 0
