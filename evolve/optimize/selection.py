"""Selection: which evaluated candidates stay in the population, and which become parents.

`pareto` (default, as GEPA): per train user, the candidates with the best score on that user
form the front; dominated ones are dropped; parents are drawn with probability proportional
to the number of users a candidate is best on. With few train users and noisy on-policy
episodes, a candidate that is best for only one kind of user (e.g. one that finally stores
the user's diet) keeps its lineage alive instead of being crowded out by a slightly better
mean; best-k would collapse onto a single lineage after a generation or two.

`best_k`: the `size` best mean train scores; parents are drawn uniformly among them.

Ties are broken by id (the older candidate wins) so selection is deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evolve.optimize.records import CandidateRecord


def _mean(record: CandidateRecord) -> float:
    assert record.train is not None
    return record.train.score


def _per_user(record: CandidateRecord) -> dict[str, float]:
    assert record.train is not None
    return record.train.per_user


def _dominates(a: CandidateRecord, b: CandidateRecord, users: Sequence[str]) -> bool:
    sa, sb = _per_user(a), _per_user(b)
    at_least = all(sa.get(u, float("-inf")) >= sb.get(u, float("-inf")) for u in users)
    better = any(sa.get(u, float("-inf")) > sb.get(u, float("-inf")) for u in users)
    return at_least and better


def pareto_wins(candidates: Sequence[CandidateRecord]) -> dict[str, int]:
    """Number of users on which each candidate reaches the best score (ties all count)."""
    users = sorted({u for record in candidates for u in _per_user(record)})
    wins = {record.id: 0 for record in candidates}
    for user in users:
        best = max(_per_user(record).get(user, float("-inf")) for record in candidates)
        for record in candidates:
            if _per_user(record).get(user, float("-inf")) == best:
                wins[record.id] += 1
    return wins


def pareto_front(candidates: Sequence[CandidateRecord]) -> list[CandidateRecord]:
    """Candidates best on at least one user and dominated by no other candidate."""
    users = sorted({u for record in candidates for u in _per_user(record)})
    wins = pareto_wins(candidates)
    front = [record for record in candidates if wins[record.id] > 0]
    return [r for r in front if not any(_dominates(o, r, users) for o in front if o is not r)]


def _rank_key(record: CandidateRecord, wins: dict[str, int]) -> tuple:
    return (-wins.get(record.id, 0), -_mean(record), record.generation, record.id)


def select_population(
    candidates: Sequence[CandidateRecord], size: int, method: str
) -> list[CandidateRecord]:
    """The next population (evaluated candidates only), best first."""
    pool = [record for record in candidates if record.train is not None]
    if method == "best_k":
        return sorted(pool, key=lambda r: (-_mean(r), r.generation, r.id))[:size]
    if method != "pareto":
        raise ValueError(f"unknown selection {method!r}; expected pareto or best_k")
    wins = pareto_wins(pool)
    front = sorted(pareto_front(pool), key=lambda r: _rank_key(r, wins))
    if len(front) >= size:
        return front[:size]
    chosen = {record.id for record in front}
    rest = sorted(
        (record for record in pool if record.id not in chosen),
        key=lambda r: (-_mean(r), r.generation, r.id),
    )
    return front + rest[: size - len(front)]


def sample_parent(
    population: Sequence[CandidateRecord], method: str, rng: random.Random
) -> CandidateRecord:
    if not population:
        raise ValueError("cannot sample a parent from an empty population")
    if method == "pareto":
        wins = pareto_wins(population)
        weights = [wins[record.id] for record in population]
        if sum(weights) > 0:
            return rng.choices(list(population), weights=weights, k=1)[0]
    return rng.choice(list(population))


def best_of(candidates: Sequence[CandidateRecord], split: str = "train") -> CandidateRecord | None:
    """Highest score on `split` ("train" or "heldout"); ties: train score, then older id."""

    def key(record: CandidateRecord) -> tuple:
        scores = getattr(record, split)
        train = record.train.score if record.train is not None else float("-inf")
        return (-scores.score, -train, record.generation, record.id)

    scored = [record for record in candidates if getattr(record, split) is not None]
    return min(scored, key=key) if scored else None
