"""Controls a user can run, and feedback that means what it says.

- `blind`: a reflective proposal with no feedback, through the same operator and acceptance
  as the other kinds, valid under both protocols and both schedules.
- `none`: no reflective proposal on any path (the reflector LM is never called): the
  population schedule, the per-period chain, and the engine's own API.
- The failure subset shown differs between proposals from one parent and is reproduced by
  the same seed; the feedback limits bound what one proposal shows, not each user's share.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from optimize.evolve_helpers import World, sections, write_spec
from optimize.noise_world import BASE_TYPES, TRAIN, NoiseWorld
from scripted_lm import ScriptedLM

from evolve.core.spec_base import IntRange
from evolve.feedback import BLIND_FEEDBACK
from evolve.optimize import evolve_policy
from evolve.optimize.gepa_adapter import AMemGymAdapter
from evolve.optimize.gepa_engine import GepaSettings, run_gepa
from evolve.optimize.operators import build_operator
from evolve.optimize.parameters import RandomStepProposer
from evolve.optimize.reflect import Reflector
from evolve.simulator.evaluation import EpisodeConfig
from evolve.spec.config import load_spec, resolve

COMPONENT = "write.types_to_remember"
PARENT = {COMPONENT: BASE_TYPES}
MINIBATCH = TRAIN[:3]
FAILURE = re.compile(r"^\d+\. Period", re.MULTILINE)


def adapter_for(
    world: NoiseWorld, work_dir: Path, *, feedback: str = "diagnostic", seed: int = 0, **limits
) -> AMemGymAdapter:
    reflective = build_operator(
        "reflective", reflector=Reflector(world.lms, temperature=1.0, max_chars=2000)
    )
    return AMemGymAdapter(
        base_policy=world.base,
        environment=world.environment,
        lms=world.lms,
        episode=EpisodeConfig(concurrency=1, seed=0, probes="wrong_only"),
        work_dir=work_dir,
        operators=[reflective],
        objective="accuracy",
        feedback=feedback,
        seed=seed,
        **{"max_feedback_failures": 2, "max_feedback_chars": 4000, **limits},
    )


def shown_to_reflector(adapter: AMemGymAdapter, world: NoiseWorld, iteration: int) -> str:
    """What the reflector is shown when GEPA's `iteration` proposes a child of PARENT."""
    adapter.lineage.current_iteration = iteration
    batch = adapter.evaluate(MINIBATCH, PARENT, capture_traces=True)
    dataset = adapter.make_reflective_dataset(PARENT, batch, [COMPONENT])
    before = len(world.reflector.calls)
    adapter.propose_new_texts(PARENT, dataset, [COMPONENT])
    assert len(world.reflector.calls) == before + 1
    return sections(world.reflector.calls[-1].user)["feedback"]


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory) -> Path:
    """One evaluation directory for the module: the parent is played once."""
    return tmp_path_factory.mktemp("evaluations")


def test_children_of_one_parent_see_different_failure_subsets(evaluations):
    world = NoiseWorld()
    adapter = adapter_for(world, evaluations, seed=5)
    batch = adapter.evaluate(MINIBATCH, PARENT, capture_traces=True)
    failures = sum(
        not item.correct for user in batch.trajectories for p in user.periods for item in p.items
    )
    assert failures > adapter.max_feedback_failures  # there is a subset to choose
    first, second = (shown_to_reflector(adapter, world, i) for i in (1, 2))
    assert len(FAILURE.findall(first)) == len(FAILURE.findall(second)) == 2
    assert first != second
    # The same run seed shows the same subsets again (a rerun, or a resumed run).
    again = NoiseWorld()
    rerun = adapter_for(again, evaluations, seed=5)
    assert [shown_to_reflector(rerun, again, i) for i in (1, 2)] == [first, second]


@pytest.mark.parametrize("feedback", ["diagnostic", "complete", "question_only"])
def test_limits_bound_what_one_proposal_shows_for_a_minibatch_of_three(evaluations, feedback):
    world = NoiseWorld()
    adapter = adapter_for(
        world, evaluations, feedback=feedback, max_feedback_failures=2, max_feedback_chars=500
    )
    batch = adapter.evaluate(MINIBATCH, PARENT, capture_traces=True)
    failing_users = [
        user.user_id
        for user in batch.trajectories
        if any(not item.correct for p in user.periods for item in p.items)
    ]
    assert len(failing_users) == 3  # each user alone could fill the limits
    text = shown_to_reflector(adapter, world, 1)
    assert len(text) <= 500
    if feedback == "diagnostic":
        assert len(FAILURE.findall(text)) <= 2
        # One header over the whole minibatch: 3 users x 2 periods x 3 questions.
        assert re.match(r"\d+ of 18 answers were correct", text), text
    # The proposal's record shows the same text once.
    proposal = adapter.lineage.proposals[-1]
    assert proposal["feedback"][COMPONENT] == text


def test_blind_proposes_through_the_same_operator_without_any_feedback(evaluations):
    world = NoiseWorld()
    adapter = adapter_for(world, evaluations, feedback="blind")
    text = shown_to_reflector(adapter, world, 1)
    assert text == BLIND_FEEDBACK
    assert "Quick check" not in text and "cause" not in text and "Period" not in text
    proposal = adapter.lineage.proposals[-1]
    assert proposal["operator"] == "reflective" and proposal["components"][COMPONENT]


def test_none_refuses_reflective_proposals_on_the_engine_api(evaluations, tmp_path):
    world = NoiseWorld()
    agent: ScriptedLM = world.lms.lm("agent")
    adapter = adapter_for(world, evaluations, feedback="none")
    settings = GepaSettings(max_metric_calls=30, max_generations=2, reflection_minibatch_size=3)
    with pytest.raises(ValueError, match=r'feedback = "none".*\[\'write\.types_to_remember\'\]'):
        run_gepa(
            adapter,
            train_users=TRAIN,
            heldout_users=[],
            seed_candidate=dict(PARENT),
            settings=settings,
            run_dir=tmp_path / "gepa",
            seed=0,
        )
    assert world.reflector.calls == [] and agent.calls == []  # refused before any call
    # Asked directly for a text proposal, the adapter makes none (GEPA then skips it).
    batch = adapter.evaluate(MINIBATCH, PARENT, capture_traces=True)
    dataset = adapter.make_reflective_dataset(PARENT, batch, [COMPONENT])
    assert adapter.propose_new_texts(PARENT, dataset, [COMPONENT]) == {}
    assert world.reflector.calls == [] and adapter.lineage.proposals == []


def test_an_unknown_feedback_kind_is_refused_before_any_call():
    """GEPA swallows errors raised while it builds the reflective dataset: an unknown kind
    must be refused when the adapter is made, not skip every proposal in silence."""
    world = NoiseWorld()
    with pytest.raises(ValueError, match=r"'blnd' is not a feedback kind; expected one of"):
        adapter_for(world, Path("unused"), feedback="blnd")


def test_none_with_numeric_parameters_never_calls_the_reflector(evaluations, tmp_path):
    world = NoiseWorld()
    adapter = adapter_for(world, evaluations, feedback="none")
    adapter.operators.insert(
        0,
        build_operator(
            "parameter",
            proposer_factory=RandomStepProposer,
            bounds={"update_every": IntRange(low=1, high=4)},
        ),
    )
    outcome = run_gepa(
        adapter,
        train_users=TRAIN,
        heldout_users=[],
        seed_candidate={"param.update_every": "1"},
        settings=GepaSettings(max_metric_calls=60, max_generations=2, reflection_minibatch_size=3),
        run_dir=tmp_path / "gepa",
        seed=0,
    )
    assert world.reflector.calls == []
    assert [p["operator"] for p in outcome.proposals] == ["parameter", "parameter"]


def run(tmp_path: Path, world: World, spec: Path):
    return evolve_policy(
        load_spec(spec), world.lms, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )


def test_population_none_never_calls_the_reflector_even_when_parameters_mutate(tmp_path):
    world = World()
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 2
            feedback = "none"
            mutate_components = ["write.types_to_remember", "use"]
            [optimizer.parameters]
            short_term_len = { low = 1, high = 6 }
        """,
    )
    result = run(tmp_path, world, spec)
    assert world.calls()["reflector"] == 0
    assert {r.mutation.kind for r in result.candidates} == {"base", "parameter"}
    assert len(result.candidates) == 3  # the base and one child per generation


def test_population_blind_shows_the_reflector_no_feedback(tmp_path):
    world = World()
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 2
            feedback = "blind"
            mutate_components = ["write.types_to_remember", "use"]
        """,
    )
    result = run(tmp_path, world, spec)
    shown = [sections(call.user)["feedback"] for call in world.reflector.calls]
    assert shown == [BLIND_FEEDBACK, BLIND_FEEDBACK]
    children = [r for r in result.candidates if r.mutation.kind == "reflective"]
    assert [r.mutation.feedback for r in children] == ["blind", "blind"]


@pytest.mark.parametrize("protocol", ["paper", "evolve"])
@pytest.mark.parametrize("schedule", ["population", "per_period"])
def test_blind_is_a_valid_spec_under_both_protocols_and_schedules(tmp_path, protocol, schedule):
    spec = write_spec(
        tmp_path,
        f'protocol = "{protocol}"',
        optimizer=f"""
            schedule = "{schedule}"
            feedback = "blind"
        """,
    )
    resolved = resolve(load_spec(spec))
    assert resolved.spec.optimizer.feedback == "blind"
    assert resolved.spec.optimizer.reflective_enabled()
