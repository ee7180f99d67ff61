"""Mechanism test of the GEPA engine: the feedback, not selection on noise, closes the gap.

The world (`noise_world`): questions never name their variable, held-out users hold
variables that never appear in training, and the scripted reflector makes random edits
whenever its feedback names no missing variable. GEPA keeps any random edit that happens to
score better on its minibatch, so evolution climbs even without information; the control is
therefore `feedback = "blind"` (the same reflective operator and acceptance, no feedback),
not a reflector that returns its input unchanged. Over 5 seeds, `diagnostic` must close at
least 0.3 more of the held-out gap (base -> a types list naming every domain) than `blind`.
The same comparison with the failure-cause lines cut out of the diagnostic feedback shows
that the test can fail: the difference shrinks to noise.

All runs share one evaluation directory: a candidate already played on a user (the base,
the oracle, a list two runs both found) is read back, not replayed.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from optimize.noise_world import BASE_TYPES, HELDOUT, ORACLE_TYPES, TRAIN, NoiseWorld

from evolve.feedback import Feedback
from evolve.optimize import gepa_adapter
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.optimize.gepa_engine import GepaSettings, run_gepa
from evolve.optimize.operators import build_operator
from evolve.optimize.reflect import Reflector
from evolve.simulator.evaluation import EpisodeConfig

SEEDS = (0, 1, 2, 3, 4)
GENERATIONS = 6
COMPONENT = "write.types_to_remember"
# The episode is the same for every run (only the evolution seed varies), so that
# evaluations are shared between runs.
EPISODE = EpisodeConfig(concurrency=1, seed=0, probes="wrong_only")


def adapter_for(world: NoiseWorld, work_dir: Path, feedback: str, seed: int) -> AMemGymAdapter:
    reflector = Reflector(world.lms, temperature=1.0, max_chars=2000)
    return AMemGymAdapter(
        base_policy=world.base,
        environment=world.environment,
        lms=world.lms,
        episode=EPISODE,
        work_dir=work_dir,
        operators=[build_operator("reflective", reflector=reflector)],
        objective="accuracy",
        feedback=feedback,
        max_feedback_failures=4,
        max_feedback_chars=1600,
        seed=seed,
    )


def heldout_accuracy(adapter: AMemGymAdapter, types: str) -> float:
    users = adapter.run_users({COMPONENT: types}, HELDOUT, split="heldout")
    return statistics.mean(adapter.user_scores(user)["accuracy"] for user in users)


def gap_closed(world: NoiseWorld, root: Path, feedback: str, seed: int, label: str) -> float:
    adapter = adapter_for(world, root / "evaluations", feedback, seed)
    outcome = run_gepa(
        adapter,
        train_users=TRAIN,
        heldout_users=HELDOUT,
        seed_candidate={COMPONENT: BASE_TYPES},
        settings=GepaSettings(
            max_metric_calls=200, max_generations=GENERATIONS, reflection_minibatch_size=3
        ),
        run_dir=root / f"gepa-{label}-{seed}",
        seed=seed,
    )
    best = outcome.candidates[outcome.best_idx][COMPONENT]
    base, oracle = heldout_accuracy(adapter, BASE_TYPES), heldout_accuracy(adapter, ORACLE_TYPES)
    found = heldout_accuracy(adapter, best)
    assert oracle > base, (base, oracle)
    # The engine's own held-out check of its last new best saw the same accuracy.
    assert outcome.heldout[-1].accuracy == pytest.approx(found)
    return (found - base) / (oracle - base)


def without_causes(*args, **kwargs) -> Feedback:
    """Diagnostic feedback with its failure-cause lines cut out (the variables' names)."""
    feedback = build_feedback(*args, **kwargs)
    lines = [line for line in feedback.text.splitlines() if not line.startswith("   cause:")]
    return feedback.model_copy(update={"text": "\n".join(lines)})


build_feedback = gepa_adapter.build_feedback


@pytest.fixture(scope="module")
def closed(tmp_path_factory) -> Iterator[dict[str, list[float]]]:
    """Held-out gap closed per seed: diagnostic, blind, and diagnostic without causes."""
    root = tmp_path_factory.mktemp("mechanism")
    world = NoiseWorld()
    runs: dict[str, list[float]] = {"diagnostic": [], "blind": [], "no_causes": []}
    for seed in SEEDS:
        runs["diagnostic"].append(gap_closed(world, root, "diagnostic", seed, "diagnostic"))
        runs["blind"].append(gap_closed(world, root, "blind", seed, "blind"))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gepa_adapter, "build_feedback", without_causes)
            runs["no_causes"].append(gap_closed(world, root, "diagnostic", seed, "no-causes"))
    for label, values in runs.items():
        print(f"{label}: gap closed per seed {[round(v, 2) for v in values]}")
    yield runs


def test_diagnostic_beats_the_blind_control(closed):
    diagnostic, blind = statistics.mean(closed["diagnostic"]), statistics.mean(closed["blind"])
    print(f"mean gap closed: diagnostic {diagnostic:.2f}, blind {blind:.2f}")
    assert diagnostic - blind >= 0.3
    # The control is not inert: its random edits were kept where they helped.
    assert max(closed["blind"]) > 0


def test_the_comparison_can_fail(closed):
    """Without the failure causes the reflector learns nothing and edits at random, like the
    blind control: the difference that the test above requires is not there."""
    blind, stripped = statistics.mean(closed["blind"]), statistics.mean(closed["no_causes"])
    full = statistics.mean(closed["diagnostic"]) - blind
    print(f"diagnostic - blind: {full:.2f}; without causes - blind: {stripped - blind:.2f}")
    assert stripped - blind < 0.3 <= full
