"""The arms table from per-question outcomes with a known answer, recomputed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.arms.records import ArmsRecord, ArmUnit
from evolve.arms.registry import NEUTRAL_SLOT_NAMES, with_neutral_slots
from evolve.arms.table import arms_table, format_arms_table
from evolve.stats import QuestionOutcomes

USERS, QUESTIONS = 6, 8


def _outcomes(seed: int, correct: np.ndarray) -> QuestionOutcomes:
    keys = tuple((str(seed), f"u{u}", 0, q) for u in range(USERS) for q in range(QUESTIONS))
    size = USERS * QUESTIONS
    return QuestionOutcomes(keys, correct.astype(float), np.full(size, 1 / 3), np.ones(size))


def _unit(arm: str, seed: int, replicate: int | None) -> ArmUnit:
    return ArmUnit(
        arm=arm, seed=seed, replicate=replicate, policy_fingerprint=f"{arm}{replicate}",
        test_dir=f"seed-{seed}/test/{arm}{replicate}", test_complete=True,
    )  # fmt: skip


def _world() -> tuple[ArmsRecord, dict[str, QuestionOutcomes]]:
    rng = np.random.default_rng(5)
    answers: dict[str, QuestionOutcomes] = {}
    units = []
    for seed in (1, 2):
        size = USERS * QUESTIONS
        base = rng.random(size) < 0.4
        answers[f"baseNone-{seed}"] = _outcomes(seed, base)
        units.append(_unit("base", seed, None))
        for replicate in (0, 1):
            # Evolved: right wherever the base is, and on a further 40% of the rest.
            evolved = base | (rng.random(size) < 0.4)
            blind = base | (rng.random(size) < 0.15)
            for arm, correct in (("evolved", evolved), ("blind", blind)):
                answers[f"{arm}{replicate}-{seed}"] = _outcomes(seed, correct)
                units.append(_unit(arm, seed, replicate))
    record = ArmsRecord(
        name="t", design_hash="h", seeds=[1, 2], arms=["evolved", "blind", "base"],
        replicates=2, units=units,
    )  # fmt: skip
    return record, answers


def test_table_averages_replicates_and_pairs_with_the_base() -> None:
    record, answers = _world()
    rows = arms_table(
        record, lambda unit: answers[f"{unit.test_dir.split('/')[-1]}-{unit.seed}"], resamples=400
    )
    by_arm = {row.arm: row for row in rows}
    assert [row.arm for row in rows] == ["evolved", "blind", "base"]
    assert by_arm["base"].differences == []  # the reference
    evolved_mean = np.mean(
        [np.mean([answers[f"evolved{r}-{s}"].correct for r in (0, 1)], axis=0) for s in (1, 2)]
    )
    base_mean = np.mean([answers[f"baseNone-{s}"].correct for s in (1, 2)])
    to_base = {diff.to: diff for diff in by_arm["evolved"].differences}["base"]
    assert by_arm["evolved"].scores.accuracy.value == pytest.approx(evolved_mean)
    assert to_base.accuracy.value == pytest.approx(evolved_mean - base_mean)
    assert to_base.users_total == 2 * USERS and to_base.seeds_total == 2
    assert to_base.accuracy.interval is not None and to_base.accuracy.interval.low > 0
    assert to_base.across_units is not None and to_base.across_units.units == 4
    assert {diff.to for diff in by_arm["evolved"].differences} == {"base", "blind"}
    assert {diff.to for diff in by_arm["blind"].differences} == {"base"}
    table = format_arms_table(rows)
    assert "| evolved | 4 | 2 | 12 | 96 |" in table and "vs blind:" in table


def test_neutral_slots_continue_the_numbering() -> None:
    listed = with_neutral_slots("1. Diet and eating habits\n2. Work and career", 3)
    assert listed.splitlines()[2:] == [f"{3 + i}. {NEUTRAL_SLOT_NAMES[i]}" for i in range(3)]
    assert with_neutral_slots("1. A", 0) == "1. A"
