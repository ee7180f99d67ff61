"""Scores with their 95% intervals, and paired differences to a baseline, as the text tables
`evolve eval` and `evolve compare` print under their score tables.

A score shown without its interval invites reading noise as progress (DESIGN rule 18), so
every score here carries the interval of `evolve.stats.estimate` and every difference is
`evolve.stats.compare`: paired on the same questions, clustered by user, with McNemar's
counts and the verdict read from the interval. Everything is computed from the per-question
records of a run directory; an experiment's records written before estimates were stored
(`EvaluationScores.estimate` None) get theirs here, so old runs read like new ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evolve.results.comparison import COMPARISON_SEED, base_and_best
from evolve.results.records import CandidateRecord, EvaluationScores, ExperimentResult
from evolve.stats import (
    Estimate,
    PairedComparison,
    PairingError,
    QuestionOutcomes,
    ScoreEstimate,
    compare,
    estimate,
    load_outcomes,
)

SPLITS = ("train", "validation", "heldout")
SPLIT_WORDS = {"train": "train", "validation": "validation", "heldout": "held-out"}
# Splits on which a candidate is tested against the base. The train users shaped the
# candidates (reflection), so a test there would grade a policy on the answers it learnt from.
TESTED_SPLITS = ("validation", "heldout")
# "0.226 [-0.005, 0.424]" and "+0.167 [-0.004, +0.337]" at three decimals.
_SCORE_WIDTH = 21
_DIFFERENCE_WIDTH = 23
_SEPARATOR = "  "


@dataclass(frozen=True)
class IntervalRow:
    """One policy's scores with their intervals, and its paired difference to the baseline."""

    name: str
    estimate: ScoreEstimate | None
    comparison: PairedComparison | None = None
    missing: str | None = None  # why the estimate or the comparison could not be computed


def estimate_of(outcomes: QuestionOutcomes, seed: int = COMPARISON_SEED) -> ScoreEstimate | None:
    """The scores of `outcomes` with intervals, or None when no question was scored."""
    return estimate(outcomes, seed=seed) if outcomes.questions else None


def paired_rows(
    named: Sequence[tuple[str, QuestionOutcomes]], seed: int = COMPARISON_SEED
) -> list[IntervalRow]:
    """Each policy's scores; every one after the first also as a paired difference to the
    first (the baseline), or why it cannot be paired (different or missing questions)."""
    rows: list[IntervalRow] = []
    for index, (name, outcomes) in enumerate(named):
        comparison, missing = None, None
        if not outcomes.questions:
            missing = "no scored question"
        elif index > 0:
            comparison, missing = _compared(outcomes, named[0][1], seed)
        rows.append(IntervalRow(name, estimate_of(outcomes, seed), comparison, missing))
    return rows


def _compared(
    x: QuestionOutcomes, y: QuestionOutcomes, seed: int
) -> tuple[PairedComparison | None, str | None]:
    try:
        return compare(x, y, seed=seed), None
    except (PairingError, ValueError) as error:  # ValueError: the baseline scored nothing
        return None, f"not paired: {error}"


def interval_cell(value: Estimate | None, signed: bool = False) -> str:
    """'0.729 [0.601, 0.857]'; '-' where the score is undefined; '0.344 [-]' where the score
    is defined but its interval is not (too many resamples without a memory score)."""
    if value is None or value.value is None:
        return "-"
    if value.interval is None:
        return f"{value.format(signed=signed)} [-]"
    return value.format(signed=signed)


def _p(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 else f"{value:.0e}"


def format_interval_table(
    rows: Sequence[IntervalRow], baseline: str | None, label: str = "policy"
) -> list[str]:
    """One line per policy: users, questions, accuracy and memory score with their intervals;
    with a `baseline`, also the paired difference to it (accuracy and memory score with
    intervals, McNemar's discordant counts and exact p, users ahead, the verdict). Ends with
    the method and seed of the intervals and why any interval is missing."""
    width = max([9, len(label), *(len(row.name) for row in rows)])
    header = [
        f"{label:<{width}} {'users':>5} {'questions':>9}",
        f"{'accuracy':<{_SCORE_WIDTH}}",
        f"{'memory score':<{_SCORE_WIDTH}}",
    ]
    if baseline is not None:
        header += [
            f"{'accuracy diff':<{_DIFFERENCE_WIDTH}}",
            f"{'memory diff':<{_DIFFERENCE_WIDTH}}",
            f"{'McNemar':>9} {'p':>6} {'users ahead':>11}  verdict",
        ]
    lines = [_SEPARATOR.join(header).rstrip()]
    lines.append("-" * len(lines[0]))
    for row in rows:
        scores = row.estimate
        cells = [
            f"{row.name:<{width}} {scores.basis.users if scores else '-':>5} "
            f"{scores.basis.questions if scores else '-':>9}",
            f"{interval_cell(scores.accuracy if scores else None):<{_SCORE_WIDTH}}",
            f"{interval_cell(scores.memory_score if scores else None):<{_SCORE_WIDTH}}",
        ]
        if baseline is not None:
            cells += _difference_cells(row, baseline)
        lines.append(_SEPARATOR.join(cells).rstrip())
    return lines + _footnotes(rows)


def _difference_cells(row: IntervalRow, baseline: str) -> list[str]:
    comparison = row.comparison
    if row.name == baseline:
        return ["(baseline)"]
    if comparison is None:
        return [f"- ({row.missing})" if row.missing else "-"]
    users = comparison.users_ahead + comparison.users_behind + comparison.users_tied
    mcnemar = f"{comparison.x_only_correct} vs {comparison.y_only_correct}"
    return [
        f"{interval_cell(comparison.difference, signed=True):<{_DIFFERENCE_WIDTH}}",
        f"{interval_cell(comparison.memory_score_difference, signed=True):<{_DIFFERENCE_WIDTH}}",
        f"{mcnemar:>9} {_p(comparison.mcnemar_p):>6} "
        f"{f'{comparison.users_ahead} of {users}':>11}  {comparison.verdict.value}",
    ]


def _footnotes(rows: Sequence[IntervalRow]) -> list[str]:
    """The method, seed and resamples every interval above rests on; why any is missing."""
    bases = {
        (basis.method, basis.seed, basis.resamples)
        for row in rows
        for basis in (
            row.estimate.basis if row.estimate else None,
            row.comparison.basis if row.comparison else None,
        )
        if basis is not None
    }
    notes = [
        f"95% intervals: {method}; statistics seed {seed}, {resamples} resamples"
        for method, seed, resamples in sorted(bases)
    ]
    for row in rows:
        estimates = (
            [("accuracy", row.estimate.accuracy), ("memory score", row.estimate.memory_score)]
            if row.estimate
            else []
        )
        if row.comparison:
            estimates.append(("memory diff", row.comparison.memory_score_difference))
        for what, value in estimates:
            if value.value is not None and value.interval is None and value.undefined:
                notes.append(f"{row.name}: {what} has no interval: {value.undefined}")
        if row.estimate is None and row.missing:
            notes.append(f"{row.name}: no interval: {row.missing}")
    return notes


# ----- an experiment's candidates ---------------------------------------------------------------


def split_outcomes(root: Path, scores: EvaluationScores, stratum: str) -> QuestionOutcomes:
    """The per-question records one evaluation rests on: its runner directory, only the
    periods it scored (the per_period schedule scores a candidate on some of them)."""
    outcomes = load_outcomes(Path(root) / scores.run_dir, stratum=stratum)
    if scores.periods is None:
        return outcomes
    wanted = set(scores.periods)
    return outcomes.restricted([key for key in outcomes.keys if key[2] in wanted])


def with_estimates(root: Path, result: ExperimentResult) -> ExperimentResult:
    """`result` with every evaluation's `estimate` filled in from its per-question records
    where the stored record has none (left None where the records are gone)."""
    candidates = []
    for record in result.candidates:
        update = {}
        for split in SPLITS:
            scores: EvaluationScores | None = getattr(record, split)
            if scores is not None and scores.estimate is None:
                found = estimate_of(split_outcomes(root, scores, result.name))
                update[split] = scores.model_copy(update={"estimate": found})
        candidates.append(record.model_copy(update=update) if update else record)
    return result.model_copy(update={"candidates": candidates})


def base_candidate(result: ExperimentResult) -> CandidateRecord | None:
    """The base (the best's first ancestor; before a best exists, the candidate made as
    the base)."""
    pair = base_and_best(result)
    if pair is not None:
        return pair[0]
    return next((r for r in result.candidates if r.mutation.kind == "base"), None)


def format_experiment_intervals(root: Path, result: ExperimentResult) -> list[str]:
    """Per split, every candidate scored there with its intervals; on the validation and
    held-out users also its paired difference to the base on the same questions."""
    result = with_estimates(root, result)
    base = base_candidate(result)
    lines: list[str] = []
    for split in SPLITS:
        scored = [r for r in result.candidates if getattr(r, split) is not None]
        if not scored:
            continue
        tested = split in TESTED_SPLITS and base is not None and getattr(base, split) is not None
        baseline = base if tested else None
        rows = _split_rows(root, result, split, scored, baseline)
        users = sorted({user for r in scored for user in getattr(r, split).users})
        heading = f"{SPLIT_WORDS[split]} users ({', '.join(users)}): scores with 95% intervals"
        if baseline is not None:
            heading += f"; diff = candidate - base ({baseline.id}) on the same questions"
            if split == "validation":
                heading += " (the best was chosen on these: its verdict is optimistic)"
        baseline_id = baseline.id if baseline is not None else None
        lines += ["", heading, *format_interval_table(rows, baseline_id, label="candidate")]
    return lines


def _split_rows(
    root: Path,
    result: ExperimentResult,
    split: str,
    scored: Sequence[CandidateRecord],
    baseline: CandidateRecord | None,
) -> list[IntervalRow]:
    """Every candidate of `scored` on `split`, paired with `baseline` when there is one."""
    base_outcomes = (
        split_outcomes(root, getattr(baseline, split), result.name) if baseline else None
    )
    rows = []
    for record in scored:
        scores: EvaluationScores = getattr(record, split)
        comparison, missing = None, None
        if scores.estimate is None:
            missing = f"no per-question records under {scores.run_dir}"
        elif baseline is not None and base_outcomes is not None and record.id != baseline.id:
            outcomes = split_outcomes(root, scores, result.name)
            if not outcomes.questions:
                missing = f"no per-question records under {scores.run_dir}"
            elif not base_outcomes.questions:
                base_dir = getattr(baseline, split).run_dir
                missing = f"no per-question records of the base under {base_dir}"
            else:
                comparison, missing = _compared(outcomes, base_outcomes, COMPARISON_SEED)
        rows.append(IntervalRow(record.id, scores.estimate, comparison, missing))
    return rows
