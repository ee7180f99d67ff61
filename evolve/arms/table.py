"""The arms table: each arm's test scores and its differences to the base and the controls,
paired on the same test questions, clustered by user, stratified by seed, with intervals.

An arm with replicates is a distribution: its answer to a question is the mean over its
replicates (each replicate's own optimizer and reflector seed), so the interval covers users,
questions and the arm's own randomness as far as its replicates sample it. The p of a
difference is the exact user-level sign-flip test (users as the unit); across units (seed x
replicate) a random-effects interval (Hartung-Knapp) and Cochran's Q say how much the
difference varies from unit to unit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evolve.arms.records import ArmsRecord, ArmUnit
from evolve.stats import (
    Estimate,
    PooledEstimate,
    QuestionOutcomes,
    ScoreEstimate,
    concatenate,
    estimate,
    load_outcomes,
    paired,
    paired_difference,
    random_effects,
    sign_flip_p,
    users_needed,
)

CONTROLS = ("blind", "capacity")
# The width the final comparison of evolution with its control is sized for (half-width).
TARGET_HALF_WIDTH = 0.07


class Difference(BaseModel):
    model_config = ConfigDict(frozen=True)

    to: str
    accuracy: Estimate
    memory_score: Estimate
    sign_flip_p: float | None
    users_ahead: int
    users_total: int
    seeds_ahead: int
    seeds_total: int
    across_units: PooledEstimate | None = Field(
        default=None, description="Random effects over (seed, replicate) units."
    )
    users_for_target: int | None = Field(
        default=None, description=f"Users for a 95% interval of +-{TARGET_HALF_WIDTH}."
    )


class ArmRow(BaseModel):
    model_config = ConfigDict(frozen=True)

    arm: str
    units: int
    seeds: int
    scores: ScoreEstimate
    differences: list[Difference]


Loader = Callable[[ArmUnit], QuestionOutcomes]


def directory_loader(directory: Path) -> Loader:
    """A unit's test outcomes from its evaluation under the arms directory."""
    return lambda unit: load_outcomes(directory / unit.test_dir, stratum=str(unit.seed))


def transfer_loader(directory: Path, record: ArmsRecord) -> Loader:
    """A unit's test outcomes on the questions about facts no train user of its seed was asked
    about (the transfer split)."""

    def load(unit: ArmUnit) -> QuestionOutcomes:
        seen = set(record.train_facts.get(str(unit.seed), []))
        return load_outcomes(
            directory / unit.test_dir,
            stratum=str(unit.seed),
            keep=lambda item: not seen.intersection(item.required_info),
        )

    return load


def arm_outcomes(units: Sequence[ArmUnit], load: Loader) -> QuestionOutcomes | None:
    """An arm's outcomes over its seeds, each question the mean over the seed's replicates."""
    per_seed = []
    for seed in sorted({unit.seed for unit in units}):
        replicas = [load(unit) for unit in units if unit.seed == seed and unit.test_complete]
        replicas = [r for r in replicas if r.questions]
        if not replicas:
            continue
        first = replicas[0]
        aligned = [paired(first, other)[1] for other in replicas]
        per_seed.append(
            QuestionOutcomes(
                first.keys,
                np.mean([r.correct for r in aligned], axis=0),
                first.random_score,
                first.upper_bound,
            )
        )
    return concatenate(per_seed) if per_seed else None


def _per_user(x: QuestionOutcomes, y: QuestionOutcomes) -> np.ndarray:
    cluster, _ = x.cluster_index()
    return np.bincount(cluster, weights=x.correct - y.correct) / np.bincount(cluster)


def _per_seed_ahead(x: QuestionOutcomes, y: QuestionOutcomes) -> tuple[int, int]:
    seeds = np.array([key[0] for key in x.keys])
    gaps = [float((x.correct - y.correct)[seeds == s].mean()) for s in np.unique(seeds)]
    return sum(gap > 0 for gap in gaps), len(gaps)


def difference(
    name: str,
    x: QuestionOutcomes,
    y: QuestionOutcomes,
    x_units: Sequence[tuple[QuestionOutcomes, str]],
    *,
    seed: int,
    resamples: int,
) -> Difference:
    x, y = paired(x, y)
    accuracy, memory = paired_difference(x, y, seed=seed, resamples=resamples)
    per_user = _per_user(x, y)
    seeds_ahead, seeds_total = _per_seed_ahead(x, y)
    unit_estimates, unit_errors = [], []
    for unit_outcomes, stratum in x_units:
        mine = [k for k in unit_outcomes.keys if k[0] == stratum]
        if not mine:
            continue
        unit_y = y.restricted(mine)
        unit_x = unit_outcomes.restricted(mine)
        found, _ = paired_difference(unit_x, unit_y, seed=seed, resamples=resamples // 4)
        if found.value is not None and found.standard_error is not None:
            unit_estimates.append(found.value)
            unit_errors.append(found.standard_error)
    pooled = random_effects(unit_estimates, unit_errors) if unit_estimates else None
    error = accuracy.standard_error
    users = len(per_user)
    return Difference(
        to=name,
        accuracy=accuracy,
        memory_score=memory,
        sign_flip_p=sign_flip_p(per_user, seed=seed),
        users_ahead=int((per_user > 1e-12).sum()),
        users_total=users,
        seeds_ahead=seeds_ahead,
        seeds_total=seeds_total,
        across_units=pooled,
        users_for_target=users_needed(error, users, TARGET_HALF_WIDTH) if error else None,
    )


def arms_table(
    record: ArmsRecord, load: Loader, *, seed: int = 0, resamples: int = 2000
) -> list[ArmRow]:
    """One row per arm with units scored on the test users, in the spec's order; each arm but
    the base with its differences to the base and (evolving arms) to each control."""
    by_arm: dict[str, list[ArmUnit]] = {}
    for unit in record.units:
        by_arm.setdefault(unit.arm, []).append(unit)
    loaded: dict[str, QuestionOutcomes] = {}

    def load_once(unit: ArmUnit) -> QuestionOutcomes:  # each unit's records read once
        if unit.label not in loaded:
            loaded[unit.label] = load(unit)
        return loaded[unit.label]

    outcomes = {arm: arm_outcomes(units, load_once) for arm, units in by_arm.items()}
    rows = []
    for arm in record.arms:
        mine = outcomes.get(arm)
        if mine is None:
            continue
        units = [u for u in by_arm[arm] if u.test_complete]
        unit_outcomes = [(load_once(u), str(u.seed)) for u in units]
        differences = []
        # The base is the reference; a control is compared with the base only.
        others = [] if arm == "base" else ["base"] if arm in CONTROLS else ["base", *CONTROLS]
        for other in others:
            if outcomes.get(other) is None:
                continue
            shared = set(mine.keys) & set(outcomes[other].keys)
            if not shared:
                continue
            keys = [k for k in mine.keys if k in shared]
            differences.append(
                difference(
                    other,
                    mine.restricted(keys),
                    outcomes[other].restricted(keys),
                    unit_outcomes,
                    seed=seed,
                    resamples=resamples,
                )
            )
        rows.append(
            ArmRow(
                arm=arm,
                units=len(units),
                seeds=len({u.seed for u in units}),
                scores=estimate(mine, seed=seed, resamples=resamples),
                differences=differences,
            )
        )
    return rows


def format_costs(record: ArmsRecord) -> str:
    """What each arm cost: LLM requests and wall time of its evolutions (as each experiment
    recorded them, resumed invocations included) and of its test evaluations (this
    invocation's calls; cached responses are free)."""
    lines = ["| arm | units | evolution requests | evolution wall | test calls | test wall |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for arm in record.arms:
        units = [u for u in record.units if u.arm == arm]
        if not units:
            continue
        lines.append(
            f"| {arm} | {len(units)} | {sum(u.evolution_calls for u in units)} | "
            f"{sum(u.evolution_wall_s for u in units) / 60:.0f} min | "
            f"{sum(u.test_calls for u in units)} | "
            f"{sum(u.test_wall_s for u in units) / 60:.0f} min |"
        )
    return "\n".join(lines)


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value >= 0.001 else f"{value:.0e}"


def format_arms_table(rows: Sequence[ArmRow]) -> str:
    """Markdown: the paper-ready table, then the differences across units."""
    lines = [
        "| arm | units | seeds | users | questions | test accuracy [95% CI] "
        "| memory score [95% CI] | difference [95% CI], p | users ahead | seeds ahead |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        basis = row.scores.basis
        head = (
            f"| {row.arm} | {row.units} | {row.seeds} | {basis.users} | {basis.questions} | "
            f"{row.scores.accuracy.format()} | {row.scores.memory_score.format()} |"
        )
        if not row.differences:
            lines.append(f"{head} (reference) | | |")
        for index, diff in enumerate(row.differences):
            prefix = head if index == 0 else "| | | | | | | |"
            lines.append(
                f"{prefix} vs {diff.to}: {diff.accuracy.format(signed=True)}, "
                f"p = {_p(diff.sign_flip_p)} | {diff.users_ahead} of {diff.users_total} | "
                f"{diff.seeds_ahead} of {diff.seeds_total} |"
            )
    lines += ["", "Across units (seed x replicate), random effects:", ""]
    for row in rows:
        for diff in row.differences:
            pooled = diff.across_units
            if pooled is None or pooled.interval is None:
                continue
            lines.append(
                f"- {row.arm} - {diff.to}: {pooled.value:+.3f} "
                f"{pooled.interval.format(signed=True)} over {pooled.units} units "
                f"(heterogeneity Q = {pooled.q_statistic:.2f}, "
                f"p = {_p(pooled.heterogeneity_p)}, tau^2 = {pooled.tau_squared:.4f})"
            )
    lines += ["", "Sizing (from these users' standard errors):", ""]
    for row in rows:
        for diff in row.differences:
            if diff.users_for_target is not None and diff.accuracy.interval is not None:
                lines.append(
                    f"- {row.arm} - {diff.to}: now +-{diff.accuracy.interval.half_width:.3f} on "
                    f"{diff.users_total} users; +-{TARGET_HALF_WIDTH} needs about "
                    f"{diff.users_for_target} users"
                )
    method = rows[0].scores.basis if rows else None
    if method is not None:
        lines += [
            "",
            f"Intervals: {method.method}; statistics seed {method.seed}, {method.resamples} "
            "resamples; p: exact user-level sign-flip test (Monte Carlo past 12 users).",
        ]
    return "\n".join(lines)
