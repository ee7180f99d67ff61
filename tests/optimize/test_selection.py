"""Selection (Pareto front over per-user scores, best-k) and the parameter proposer."""

from __future__ import annotations

import random
from collections import Counter

from evolve.config import ParameterRange
from evolve.optimize.parameters import RandomStepProposer
from evolve.optimize.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    Mutation,
    fingerprint,
)
from evolve.optimize.selection import (
    best_of,
    pareto_front,
    pareto_wins,
    sample_parent,
    select_population,
)
from evolve.simulator.metrics import MetricSummary


def record(cid: str, per_user: dict[str, float], heldout: float | None = None) -> CandidateRecord:
    def scores(values: dict[str, float]) -> EvaluationScores:
        return EvaluationScores(
            users=list(values),
            score=sum(values.values()) / len(values),
            objective="accuracy",
            per_user=values,
            summary=MetricSummary(),
            run_dir="x",
        )

    return CandidateRecord(
        id=cid,
        generation=int(cid[1:3]),
        mutation=Mutation(kind="base"),
        seed=0,
        fingerprint=cid,
        kind="in_context",
        components={},
        parameters={},
        status=CandidateStatus.EVALUATED,
        train=scores(per_user),
        heldout=scores({"h": heldout}) if heldout is not None else None,
    )


A = record("g00-c0", {"u1": 0.9, "u2": 0.1})  # best on u1
B = record("g01-c0", {"u1": 0.2, "u2": 0.8})  # best on u2
C = record("g01-c1", {"u1": 0.6, "u2": 0.6})  # best mean, best on no user
D = record("g02-c0", {"u1": 0.1, "u2": 0.1})  # dominated by everyone


def test_pareto_front_keeps_per_user_winners_not_the_best_mean():
    assert pareto_wins([A, B, C, D]) == {"g00-c0": 1, "g01-c0": 1, "g01-c1": 0, "g02-c0": 0}
    assert [r.id for r in pareto_front([A, B, C, D])] == ["g00-c0", "g01-c0"]


def test_dominated_ties_leave_the_front():
    twin = record("g03-c0", {"u1": 0.9, "u2": 0.05})  # ties A on u1, worse on u2
    assert [r.id for r in pareto_front([A, twin])] == ["g00-c0"]


def test_population_fills_from_the_best_means_after_the_front():
    assert [r.id for r in select_population([A, B, C, D], 3, "pareto")] == [
        "g00-c0",
        "g01-c0",
        "g01-c1",
    ]
    assert [r.id for r in select_population([A, B, C, D], 1, "pareto")] == ["g00-c0"]
    assert [r.id for r in select_population([A, B, C, D], 2, "best_k")] == ["g01-c1", "g00-c0"]


def test_parents_are_drawn_by_pareto_wins_and_reproducibly():
    rng = random.Random(1)
    counts = Counter(sample_parent([A, B, C], "pareto", rng).id for _ in range(300))
    assert set(counts) == {"g00-c0", "g01-c0"}  # C wins on no user: never a parent
    first = [sample_parent([A, B, C], "pareto", random.Random(5)).id for _ in range(3)]
    assert len(set(first)) == 1


def test_best_of_prefers_heldout_then_train():
    a = record("g00-c0", {"u": 0.4}, heldout=0.7)
    b = record("g01-c0", {"u": 0.9}, heldout=0.7)
    c = record("g01-c1", {"u": 1.0})
    assert best_of([a, b, c], "heldout").id == "g01-c0"  # tie on held-out: better train
    assert best_of([a, b, c], "train").id == "g01-c1"
    assert best_of([c], "heldout") is None


def test_random_step_proposer_changes_one_parameter_within_bounds():
    proposer = RandomStepProposer(max_step=2)
    bounds = {
        "update_every": ParameterRange(low=1, high=4),
        "short_term_len": ParameterRange(low=0, high=6),
    }
    parent = {"update_every": 2, "short_term_len": 4, "top_k": 5}
    seen = set()
    for seed in range(50):
        child = proposer.propose(parent, bounds, random.Random(seed))
        changed = {k for k in parent if child[k] != parent[k]}
        assert len(changed) == 1 and "top_k" not in changed
        name = changed.pop()
        assert bounds[name].low <= child[name] <= bounds[name].high
        assert abs(child[name] - parent[name]) <= 2
        seen.add((name, child[name]))
    assert len(seen) > 4
    # A parent outside the bounds is brought inside.
    child = proposer.propose(
        {"update_every": 9}, {"update_every": bounds["update_every"]}, random.Random(0)
    )
    assert 1 <= child["update_every"] <= 4


def test_fingerprint_ignores_surrounding_whitespace_only():
    one = fingerprint("in_context", {"use": "Be brief."}, {"update_every": 2})
    assert one == fingerprint("in_context", {"use": " Be brief.\n"}, {"update_every": 2})
    assert one != fingerprint("in_context", {"use": "Be brief!"}, {"update_every": 2})
    assert one != fingerprint("in_context", {"use": "Be brief."}, {"update_every": 3})
