"""A memory score that cannot mislead: a set of questions whose upper bound is not clearly
above random has none ("-"), in the metrics, `evolve eval`'s tables (both rule sets) and
`evolve tune`'s lines; a defined one stays within [0, 1] while the accuracy lies between
random and the upper bound.

The recorded periods are the quickstart's, reported from a fresh run: the base's period 1
(1 of 8 three-option questions right, upper bound 3 of 8) read -5.00, and g02's (3 of 8,
upper bound 3 of 8) read 1.00. The stub server answers option 1 to every question, the
upper-bound questions included, so accuracy equals the upper bound at about chance: the
ratio read 1.000 for every policy and trial.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from reliability.process_helpers import run_in_process
from stub_server import StubServer
from tuning.tune_helpers import GRID, write_tune_spec

from evolve.simulator.baselines import random_score
from evolve.simulator.environment import save_environment
from evolve.simulator.metrics import memory_margin, summarize, summarize_by_period
from evolve.simulator.records import Diagnosis, ItemResult, PeriodResult, UserResult
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset


def item(qi: int, correct: bool, ub: bool, n_options: int = 3) -> ItemResult:
    states = [[f"s{i}"] for i in range(n_options)]
    return ItemResult(
        question_index=qi,
        question=f"q{qi}",
        required_info=["v"],
        options=[f"o{i}" for i in range(n_options)],
        option_states=states,
        gold=1,
        gold_state=states[0],
        chosen=1 if correct else 2,
        chosen_state=states[0 if correct else 1],
        correct=correct,
        parse_failed=False,
        random_score=random_score(states, states[0]),
        upper_bound_correct=ub,
        diagnosis=Diagnosis.CORRECT if correct else Diagnosis.WRITE,
    )


def recorded_period(correct: int, upper_bound: int, index: int = 1) -> PeriodResult:
    """8 three-option questions: `correct` answered right, `upper_bound` right when told."""
    items = [item(q, q < correct, q < upper_bound) for q in range(8)]
    return PeriodResult(user_id="u", period_index=index, state={}, items=items)


@pytest.mark.parametrize(
    ("correct", "upper_bound", "used_to_read"),
    [(1, 3, -5.0), (3, 3, 1.0)],
    ids=["base-period-1", "g02-period-1"],
)
def test_the_quickstarts_degenerate_periods_have_no_memory_score(
    correct, upper_bound, used_to_read
):
    period = recorded_period(correct, upper_bound)
    s_random = 1 / 3
    ratio = (correct / 8 - s_random) / (upper_bound / 8 - s_random)
    assert ratio == pytest.approx(used_to_read)  # the plain ratio, as it was shown
    summary = summarize([UserResult(user_id="u", periods=[period])])
    assert summary.memory_score is None
    assert summary.memory_score_period_mean is None
    assert summary.memory_score_original is None
    assert "not clearly above random" in summary.memory_score_undefined
    flat = summary.flat_metrics("train_")
    assert not [name for name in flat if "memory" in name]  # never logged to MLflow
    (per_period,) = summarize_by_period([UserResult(user_id="u", periods=[period])])[1:]
    assert per_period.memory_score is None  # nor as a per-period curve


def test_an_upper_bound_two_standard_errors_above_random_has_a_score():
    # 8 three-option questions: random 2.67 questions, its standard error 1.33: the upper
    # bound needs 2.67 more, so 6 of 8 has a score and 5 of 8 does not.
    assert memory_margin([1 / 3] * 8) * 8 == pytest.approx(8 / 3)
    assert summarize_one(recorded_period(4, 5)).memory_score is None
    assert summarize_one(recorded_period(4, 6)).memory_score == pytest.approx(
        (4 / 8 - 1 / 3) / (6 / 8 - 1 / 3)
    )
    # With many options the standard error is small: the 2-question floor decides.
    few = [item(q, q < 1, q < 2, n_options=10) for q in range(4)]
    assert memory_margin([0.1] * 4) * 4 == pytest.approx(2.0)
    assert (
        summarize_one(PeriodResult(user_id="u", period_index=0, state={}, items=few)).memory_score
        is None
    )


def summarize_one(period: PeriodResult):
    return summarize([UserResult(user_id="u", periods=[period])])


def within_bounds(period: PeriodResult) -> bool:
    """Whether the period's accuracy lies between its random and upper-bound scores."""
    n = len(period.items)
    chance = sum(i.random_score for i in period.items) / n
    bound = sum(i.upper_bound_correct for i in period.items) / n
    return chance <= period.accuracy <= bound


def test_no_defined_score_leaves_0_to_1_while_the_accuracy_is_between_random_and_the_bound():
    """Each of the three memory scores (the headline over all questions, the mean of the
    periods' ratios, and the paper's number: that mean with the reference's random fallback
    for unparsed answers) stays within [0, 1] whenever the accuracy it rests on lies between
    random and the upper bound: no 1.00 at chance, nothing below -1 or above 1."""
    rng = random.Random(7)
    checked = dict.fromkeys(("pooled", "period_mean", "original"), 0)
    for _ in range(400):
        periods = []
        for index in range(rng.randint(1, 4)):
            n = rng.randint(1, 12)
            options = rng.choice([2, 3, 4, 10])
            items = [item(q, rng.random() < 0.5, rng.random() < 0.7, options) for q in range(n)]
            periods.append(PeriodResult(user_id="u", period_index=index, state={}, items=items))
        s = summarize([UserResult(user_id="u", periods=periods)])
        if s.memory_score is not None and s.random_score <= s.accuracy <= s.upper_bound_score:
            assert 0.0 <= s.memory_score <= 1.0
            checked["pooled"] += 1
        # No answer here fails to parse, so the paper's number is the period mean's twin.
        for name in ("period_mean", "original"):
            score = s.memory_score_period_mean if name == "period_mean" else s.memory_score_original
            if score is None:
                continue
            if all(within_bounds(period) for period in periods):
                assert 0.0 <= score <= 1.0, (name, score)
                checked[name] += 1
        for score in (s.memory_score, s.memory_score_period_mean, s.memory_score_original):
            if score is not None:
                # Every defined score rests on an upper bound clearly above random.
                assert s.upper_bound_score - s.random_score > 0
        if s.memory_score is None and s.upper_bound_score is not None:
            randoms = [i.random_score for p in periods for i in p.items]
            assert s.upper_bound_score - s.random_score < memory_margin(randoms)
    # The property was exercised for each score, not vacuously true.
    assert min(checked.values()) > 20, checked


def test_chance_level_accuracy_reads_zero_not_float_noise():
    from evolve.results.objective import format_score

    # 24 three-option questions, 8 right (chance), the upper bound 16: (8/24 - mean of 24
    # thirds) used to come out as 3.3e-16, and 8.88e-16 in MLflow.
    items = [item(q, q < 8, q < 16) for q in range(24)]
    summary = summarize_one(PeriodResult(user_id="u", period_index=0, state={}, items=items))
    assert summary.memory_score == 0.0
    flat = summary.flat_metrics()
    assert flat["memory_score"] == 0.0 and flat["memory_score_period_mean"] == 0.0
    assert format_score(-1e-12) == "0.000" and format_score(None) == "-"


# ----- a stub that answers "1" to everything ------------------------------------------------


@pytest.fixture
def tiny_env(tmp_path) -> Path:
    path = tmp_path / "tiny.json"
    save_environment(synthesize_environment(get_preset("tiny"), 0), path)
    return path


def stub_args(stub: StubServer, tmp_path: Path) -> list[str]:
    return [
        "--no-progress",
        "--no-llm-cache",
        "--base-url",
        stub.base_url,
        "--model",
        "stub",
        "--upper-bound-cache",
        str(tmp_path / "ub"),
    ]


def cells(line: str) -> list[str]:
    return line.split()


def test_eval_against_a_stub_at_chance_shows_no_memory_score(tmp_path, tiny_env, capsys):
    with StubServer(latency=0.0) as stub:
        code = run_in_process(
            tmp_path,
            "eval", "--env", str(tiny_env), "--policy", "native", "--policy", "in_context",
            "--out", str(tmp_path / "out"), "--protocol", "evolve", *stub_args(stub, tmp_path),
        )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    ours = lines.index(
        next(line for line in lines if cells(line)[:3] == ["policy", "acc", "memory"])
    )
    header = cells(lines[ours])
    for row in map(cells, lines[ours + 2 : ours + 4]):
        values = dict(zip(header, row, strict=False))
        accuracy, chance, bound = (float(values[k]) for k in ("acc", "random", "UB"))
        assert accuracy == bound and abs(accuracy - chance) < 0.1  # the stub's "1": at chance
        assert values["memory"] == "-" and values["mem/period"] == "-"
    paper = lines.index(next(line for line in lines if cells(line)[:2] == ["policy", "acc+rf"]))
    assert cells(lines[paper])[2] == "paper-mem"
    for row in map(cells, lines[paper + 2 : paper + 4]):
        assert row[2] == "-"
    assert "memory score undefined: the upper bound" in "\n".join(lines)


def test_tune_against_a_stub_at_chance_prints_no_memory_score(tmp_path, tiny_env, capsys):
    spec = write_tune_spec(
        tmp_path,
        f'trials = 2\nheldout = "best"\n{GRID}',
        body='protocol = "evolve"',
        environment=f'file = "{tiny_env.name}"\ntrain_users = 3\nheldout_users = 1',
    )
    with StubServer(latency=0.0) as stub:
        code = run_in_process(
            tmp_path, "tune", str(spec), "--runs-dir", str(tmp_path / "runs"),
            *stub_args(stub, tmp_path),
        )  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    trial_lines = [line for line in captured.err.splitlines() if " complete: " in line]
    assert len(trial_lines) == 2
    heldout = [line for line in captured.err.splitlines() if line.strip().startswith("held-out")]
    assert len(heldout) == 1
    for line in trial_lines + heldout:
        assert "memory_score - (upper bound not clearly above random)" in line
        assert "(objective: accuracy)" in line
    assert "memory_score 1.000" not in captured.err + captured.out
