"""benchmarks/quickstart_heldout.py: the wider world keeps the run's users and split, and the
pooled figures are the toolkit's ratio over all pooled questions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from evolve import api
from evolve.simulator.metrics import memory_ratio
from evolve.spec.config import resolve

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "quickstart_heldout.py"


@pytest.fixture(scope="module")
def heldout_script():
    spec = importlib.util.spec_from_file_location("benchmark_quickstart_heldout", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_wider_world_keeps_the_runs_users_and_split(heldout_script):
    spec = api.load_spec(ROOT / "experiments" / "quickstart.toml")
    run = resolve(heldout_script.seeded(spec, 14, 0))
    wider = resolve(heldout_script.seeded(spec, 14, 3))
    assert [item.id for item in wider.train.items] == [item.id for item in run.train.items]
    assert wider.train.items == run.train.items
    run_heldout = run.heldout.items
    assert wider.heldout.items[: len(run_heldout)] == run_heldout
    assert len(wider.heldout.items) == len(run_heldout) + 3
    new = heldout_script.users_not_scored(wider, [item.id for item in run_heldout])
    assert new.items == wider.heldout.items[len(run_heldout) :]
    assert not {item.id for item in new.items} & {item.id for item in run.train.items + run_heldout}


def test_pooled_scores_weigh_every_question(heldout_script):
    scores = heldout_script.Scores
    pair = scores(questions=48, correct=27, upper_bound_correct=48, random_correct=16)
    new = scores(questions=96, correct=40, upper_bound_correct=90, random_correct=32)
    pooled = pair + new
    assert pooled.questions == 144
    assert pooled.accuracy == pytest.approx(67 / 144)
    assert pooled.memory_score == memory_ratio(67 / 144, [1 / 3] * 144, 138 / 144)
    assert pooled.memory_score == pytest.approx((67 / 144 - 1 / 3) / (138 / 144 - 1 / 3))


def test_a_pooled_upper_bound_near_random_has_no_memory_score(heldout_script):
    near_random = heldout_script.Scores(
        questions=24, correct=10, upper_bound_correct=9, random_correct=8
    )
    assert near_random.memory_score is None


@pytest.mark.parametrize("position", [0, -1], ids=["first value", "last value"])
def test_the_worlds_draw_favours_no_value(heldout_script, position):
    """The base's no-memory hits above a third come from the users a seed draws, not from
    the world: any one value per fact is the answer to about a third of the questions."""
    spec = api.load_spec(ROOT / "experiments" / "quickstart.toml")
    facts = {}
    for item in resolve(spec).train.items + resolve(spec).heldout.items:
        facts.update(item.state_schema)
    assert len(facts) == 10  # every craft fact of the world
    favourites = {fact: values[position] for fact, values in facts.items()}
    share = heldout_script.drawn_share(spec, favourites, users=4, seeds=range(60))
    assert share == pytest.approx(1 / 3, abs=0.03)
