"""The evolution loop end to end with scripted LMs (population schedule on GEPA): it finds
the instruction that helps, scores held-out users, records rejected and invalid proposals,
honours the budget and resumes without recomputing."""

from __future__ import annotations

import json

import pytest
from optimize.evolve_helpers import MARKER, World, make_agent, reflector, write_spec

from evolve.core.errors import ResumeMismatchError
from evolve.optimize import CandidateStatus, ExperimentDir, evolve_policy
from evolve.optimize.parameters import ParameterProposer
from evolve.spec.config import load_spec


def run(tmp_path, world, spec_path, **kwargs):
    return evolve_policy(
        load_spec(spec_path),
        world.lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
        **kwargs,
    )


def test_population_finds_the_marker_and_scores_heldout(tmp_path):
    world = World()
    result = run(tmp_path, world, write_spec(tmp_path))
    assert result.complete and result.stopped is None
    base = result.candidate("g00-c0")
    assert base.mutation.kind == "base" and base.train.summary.accuracy < 0.5
    best = result.candidate(result.best_id)
    # The reflective mutation of `use` introduced the marker: every answer is now right.
    assert MARKER in best.components["use"]
    assert best.train.summary.accuracy == 1.0
    assert best.train.score > base.train.score
    # Held-out users are scored for the best of every generation, and they are not train users.
    assert best.heldout is not None and best.heldout.users == ["user-2"]
    assert best.train.users == ["user-0", "user-1"]
    assert result.candidate("g00-c0").heldout is not None
    for generation in result.generations:
        assert generation.best_id is not None
        assert result.candidate(generation.best_id).heldout is not None
    # Generation 0 (the base's evaluations at GEPA's start) carries their wall time.
    start = result.generations[0]
    assert start.llm_calls > 0
    assert start.wall_time_s == pytest.approx(base.train.wall_time_s + base.heldout.wall_time_s)
    # Lineage: frozen records name their parents and mutation.
    lineage = result.lineage(best.id)
    assert [r.id for r in lineage][-1] == "g00-c0"
    assert best.parent_ids == ("g00-c0",) and best.mutation.component == "use"
    assert best.mutation.rollout_id is not None and best.mutation.temperature == 0.7
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        best.generation = 5  # type: ignore[misc]


def test_reflector_sees_diagnostic_feedback_and_components_take_turns(tmp_path):
    world = World()
    run(tmp_path, world, write_spec(tmp_path))
    first = world.reflector.calls[0].user
    assert "cause:" in first and "memory held:" in first and "answered" in first
    # GEPA's round-robin module selector: generation 1 rewrites the first mutable component,
    # generation 2 the next one (of its parent).
    store = ExperimentDir(tmp_path / "runs" / "exp")
    one, two = store.load_candidate("g01-c0"), store.load_candidate("g02-c0")
    assert one.mutation.component == "write.types_to_remember"
    assert two.mutation.component == "use"
    assert one.fingerprint != two.fingerprint
    assert one.mutation.rollout_id != two.mutation.rollout_id
    # Each reflector call carries its own rollout id (a DSPy cache key) and a nonzero
    # temperature, so even identical prompts would give distinct, reproducible proposals.
    sent = [entry["kwargs"] for entry in world.reflector.history]
    assert all(kwargs["temperature"] == 0.7 for kwargs in sent)
    assert len({kwargs["rollout_id"] for kwargs in sent}) == len(sent)
    assert {one.mutation.rollout_id, two.mutation.rollout_id} <= {k["rollout_id"] for k in sent}
    assert "cause:" in store.load_feedback("g01-c0")


def test_a_child_no_better_than_its_parent_is_recorded_as_rejected(tmp_path):
    world = World()
    result = run(tmp_path, world, write_spec(tmp_path))
    # The write instruction alone does not change the scripted agent's answers: GEPA tries
    # the child on its minibatch and rejects it (strict improvement); it never joins the pool.
    rejected = result.candidate("g01-c0")
    assert rejected.status == CandidateStatus.REJECTED
    assert rejected.train is None and rejected.parent_ids == ("g00-c0",)
    assert result.generations[1].evaluated_ids == []
    assert result.generations[1].candidate_ids == ["g01-c0"]
    # The accepted child of generation 2 descends from the base, not from the rejected one.
    assert result.candidate("g02-c0").parent_ids == ("g00-c0",)
    # Each child's reflector call is attributed to it, rejected or not.
    for cid in ("g01-c0", "g02-c0"):
        assert result.candidate(cid).reflection_calls == 1
        assert result.candidate(cid).reflection_tokens > 0


def test_question_only_feedback_has_no_answers(tmp_path):
    world = World()
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 1
            feedback = "question_only"
            mutate_components = ["use"]
        """,
    )
    run(tmp_path, world, spec)
    feedback = world.reflector.calls[0].user
    assert "Can you suggest a dinner recipe for me?" in feedback
    assert "answered" not in feedback and "correct" not in feedback


def test_feedback_none_means_no_evolution(tmp_path):
    world = World()
    spec = write_spec(tmp_path, optimizer='feedback = "none"\ngenerations = 3')
    result = run(tmp_path, world, spec)
    assert world.calls()["reflector"] == 0
    assert [r.id for r in result.candidates] == ["g00-c0"]
    assert [g.generation for g in result.generations] == [0]


class CountingProposer(ParameterProposer):
    def __init__(self):
        self.observed: list[tuple[dict, float]] = []

    def propose(self, parent, bounds, rng):
        return {**parent, "short_term_len": 3 if parent["short_term_len"] != 3 else 4}

    def observe(self, parameters, score):
        self.observed.append((dict(parameters), score))


def test_parameter_mutation_through_a_pluggable_proposer(tmp_path):
    world = World()
    spec = write_spec(
        tmp_path,
        optimizer="""
            generations = 1
            feedback = "none"
            acceptance = "improvement_or_equal"
            [optimizer.parameters]
            short_term_len = { low = 1, high = 6 }
        """,
    )
    proposers: list[CountingProposer] = []

    def factory() -> CountingProposer:
        proposers.append(CountingProposer())
        return proposers[-1]

    result = run(tmp_path, world, spec, proposer_factory=factory)
    child = result.candidate("g01-c0")
    assert child.mutation.kind == "parameter"
    assert child.parameters["short_term_len"] == 3
    assert child.mutation.parameter_changes == {"short_term_len": (2, 3)}
    assert child.train is not None
    # A fresh proposer per proposal is told the history first: here, the base's score.
    assert len(proposers) == 1
    assert [p["short_term_len"] for p, _ in proposers[0].observed] == [2]
    assert proposers[0].observed[0][1] == result.candidate("g00-c0").train.score


def test_budget_stops_cleanly_and_a_larger_budget_continues(tmp_path):
    spec = write_spec(tmp_path, budget="max_llm_calls = 120")
    world = World()
    stopped = run(tmp_path, world, spec)
    assert not stopped.complete and "max_llm_calls = 120" in stopped.stopped
    assert stopped.llm_calls >= 120
    assert stopped.candidate("g00-c0").train is not None  # finished work is kept
    ledger = json.loads((tmp_path / "runs" / "exp" / "ledger.json").read_text())
    assert ledger["llm_calls"] == stopped.llm_calls
    # The budget is not part of the resume guard: raise it and rerun to continue.
    spec.write_text(spec.read_text().replace("max_llm_calls = 120", "max_llm_calls = 100000"))
    done = run(tmp_path, World(), spec)
    assert done.complete and done.best_id is not None
    assert done.llm_calls > stopped.llm_calls


class Killed(BaseException):
    """Stands for SIGKILL/Ctrl-C in the middle of a run."""


def test_killed_run_resumes_without_recomputing_finished_candidates(tmp_path):
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = World()
    expected = run(reference_dir, reference, write_spec(reference_dir))
    full = reference.calls()

    # Kill the run at the reflector's 2nd call: generation 1 is evaluated by then.
    def dying_reflector(call):
        if len(first.reflector.calls) == 1:
            raise Killed
        return reflector(call)

    first = World(reflect=dying_reflector)
    spec = write_spec(tmp_path)
    with pytest.raises(Killed):
        run(tmp_path, first, spec)
    before = first.calls()
    assert 0 < before["agent"] < full["agent"]

    second = World()
    resumed = run(tmp_path, second, spec)
    after = second.calls()
    # Nothing finished is recomputed: the two invocations together cost what one did.
    assert before["agent"] + after["agent"] == full["agent"]
    assert before["reflector"] + after["reflector"] == full["reflector"]
    assert [(r.id, r.status, r.train_score, r.heldout_score) for r in resumed.candidates] == [
        (r.id, r.status, r.train_score, r.heldout_score) for r in expected.candidates
    ]
    # A finished experiment rerun makes no call at all.
    third = World()
    run(tmp_path, third, spec)
    assert third.calls() == {"agent": 0, "reflector": 0, "simulator": 0}


def test_killed_mid_evaluation_resumes_from_the_runner_checkpoint(tmp_path):
    spec = write_spec(tmp_path)
    agent = make_agent()
    calls = {"n": 0}

    def dying_agent(call):
        calls["n"] += 1
        if calls["n"] == 90:  # inside generation 1's first evaluation
            raise Killed
        return agent(call)

    with pytest.raises(Killed):
        run(tmp_path, World(agent=dying_agent), spec)
    resumed = run(tmp_path, World(), spec)
    assert resumed.complete
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    expected = run(reference_dir, World(), write_spec(reference_dir))
    assert [(r.id, r.train_score) for r in resumed.candidates] == [
        (r.id, r.train_score) for r in expected.candidates
    ]


def test_resume_refuses_a_changed_spec(tmp_path):
    spec = write_spec(tmp_path, optimizer="generations = 0")
    run(tmp_path, World(), spec)
    spec.write_text(spec.read_text().replace("short_term_len = 2", "short_term_len = 3"))
    with pytest.raises(ResumeMismatchError, match="short_term_len"):
        run(tmp_path, World(), spec)


def test_more_generations_extend_a_finished_experiment(tmp_path):
    spec = write_spec(tmp_path, optimizer="generations = 1\nmutate_components = ['use']")
    first = run(tmp_path, World(), spec)
    assert [g.generation for g in first.generations] == [0, 1]
    spec.write_text(spec.read_text().replace("generations = 1", "generations = 2"))
    world = World()
    second = run(tmp_path, world, spec)
    assert [g.generation for g in second.generations] == [0, 1, 2]
    assert world.calls()["reflector"] > 0


def test_per_period_chain_mutates_after_each_period(tmp_path):
    world = World(agent=make_agent(write_needs_marker=True))
    spec = write_spec(
        tmp_path,
        optimizer="""
            schedule = "per_period"
            mutate_components = ["write.types_to_remember"]
            heldout = "final"
        """,
    )
    result = run(tmp_path, world, spec)
    assert result.schedule == "per_period" and result.complete
    # One chain per train user, three periods: the base is in effect in period 0; after
    # period 0 user-0's step introduces the marker and user-1's (same story, same text) is
    # its duplicate, so both chains continue on g01-c0; after period 1 the reflector keeps
    # the marker (duplicates), so g01-c0 stays in effect.
    ids = [r.id for r in result.candidates]
    assert ids == ["g00-c0", "g01-c0", "g01-c1", "g02-c0", "g02-c1"]
    step = result.candidate("g01-c0")
    assert MARKER in step.components["write.types_to_remember"]
    assert step.user_id == "user-0" and result.candidate("g01-c1").user_id == "user-1"
    assert result.candidate("g01-c1").duplicate_of == "g01-c0"
    assert step.parent_ids == ("g00-c0",) and step.train.periods == [1, 2]
    assert step.train.users == ["user-0", "user-1"]
    assert result.candidate("g02-c0").status == CandidateStatus.DUPLICATE
    assert result.candidate("g00-c0").train.periods == [0]
    assert [g.best_id for g in result.generations] == ["g00-c0", "g01-c0", "g01-c0"]
    assert world.calls()["reflector"] == 4  # 2 users x 2 barriers
    # The reflector saw period 0's feedback only, before period 1 started.
    assert "Period 0" in world.reflector.calls[0].user
    assert "Period 1" not in world.reflector.calls[0].user
    assert result.chain_summary is not None and result.chain_summary.n_user_periods == 6
    # Base and final policy are scored on the held-out user from scratch.
    assert result.candidate("g00-c0").heldout is not None
    assert result.candidate("g01-c0").heldout is not None
    # Resuming a finished chain makes no call.
    again = World(agent=make_agent(write_needs_marker=True))
    rerun = run(tmp_path, again, spec)
    assert again.calls() == {"agent": 0, "reflector": 0, "simulator": 0}
    assert [r.train_score for r in rerun.candidates] == [r.train_score for r in result.candidates]


def test_per_period_none_is_the_unevolved_baseline(tmp_path):
    world = World()
    spec = write_spec(tmp_path, optimizer='schedule = "per_period"\nfeedback = "none"')
    result = run(tmp_path, world, spec)
    assert world.calls()["reflector"] == 0
    assert [r.id for r in result.candidates] == ["g00-c0"]
    assert result.candidate("g00-c0").train.periods == [0, 1, 2]
    assert len(result.generations) == 3


def test_unparseable_reflector_output_is_counted_not_replaced(tmp_path):
    world = World(reflect=lambda call: "this is not json")
    spec = write_spec(tmp_path, optimizer="generations = 1")
    result = run(tmp_path, world, spec)
    record = result.candidate("g01-c0")
    assert record.status == CandidateStatus.INVALID
    assert "unparseable" in record.invalid_reason
    assert record.reflection_parse_failures == 1
    assert result.reflection_parse_failures == 1
    assert record.train is None
    # GEPA skips a generation without a usable proposal: nothing was evaluated for it.
    assert result.generations[1].evaluated_ids == []
