"""Recall questions: the small-model world's direct one-variable questions.

AMemGym's questions ask for advice that depends on several state variables, and a 0.5B model
answers them at chance even when it is told the user's state. A recall question instead asks,
in the user's words, for one variable's current value ("What kind of diet am I following these
days?"), and its options are that variable's values. A small model that has the value in
memory picks it; one that does not is at chance. The world that these questions make
(`recall` synthesis preset) measures whether a memory policy kept each value up to date; it is
a smoke-test world for small models, not AMemGym's question design.

Two choices are specific to recall questions:

- Variables are drawn across domains (one per domain in turn), so that a memory policy needs a
  general types list, not one domain's.
- Option order is chosen, not shuffled: the gold option of every (question, period) pair is
  spread evenly over the positions of the user's questions, so that a model that always answers
  "1" (the 0.5B did on 22 of 30 one-variable items) scores chance, not more.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from evolve.simulator.synthesis.catalogs import Catalog, CatalogQuestion

# A permutation search is exhaustive up to this many options (5! = 120); above it, samples.
_EXHAUSTIVE_UP_TO = 5
_SAMPLED_ORDERS = 120


def recall_question(catalog: Catalog, variable: str) -> CatalogQuestion:
    """The catalog variable's recall question; its answer to a value is the value itself."""
    spec = catalog.variables[variable]
    if not spec.recall:
        raise ValueError(f"catalog variable {variable!r} has no 'recall' question")
    return CatalogQuestion(
        id=f"recall_{variable}",
        query=spec.recall,
        opening="",
        variables=[variable],
        advice={variable: {value: value for value in spec.values}},
    )


def recall_domains(catalog: Catalog) -> dict[str, list[str]]:
    """Domain -> the names of its variables that have a recall question."""
    by_domain: dict[str, list[str]] = {}
    for name, spec in catalog.variables.items():
        if spec.recall:
            by_domain.setdefault(spec.domain, []).append(name)
    return by_domain


def sample_recall_variables(
    rng: random.Random, catalog: Catalog, count: int, domains: Sequence[str] | None = None
) -> list[str]:
    """`count` variables with a recall question, one per domain in turn (domains shuffled),
    from `domains` only when given."""
    by_domain = recall_domains(catalog)
    if domains is not None:
        by_domain = {domain: by_domain.get(domain, []) for domain in domains}
    available = sum(len(names) for names in by_domain.values())
    if available < count:
        raise ValueError(
            f"the catalog has {available} variables with a recall question, {count} are needed"
        )
    domains = sorted(by_domain)
    rng.shuffle(domains)
    pools = {domain: rng.sample(by_domain[domain], len(by_domain[domain])) for domain in domains}
    picked: list[str] = []
    while len(picked) < count:
        for domain in domains:
            if pools[domain] and len(picked) < count:
                picked.append(pools[domain].pop())
    return picked


def balanced_order(
    rng: random.Random,
    variants: Sequence[tuple[str, ...]],
    gold_by_period: Sequence[tuple[str, ...]],
    position_counts: list[int],
) -> list[tuple[str, ...]]:
    """`variants` ordered so that this question's gold options land on the positions that
    have held the fewest gold options so far (`position_counts`, updated in place).

    Among the orders of least imbalance one is drawn with `rng`, so the order is seeded and
    no position is favoured when several are equally good.
    """
    size = len(variants)
    if len(position_counts) < size:
        position_counts.extend([0] * (size - len(position_counts)))
    if size <= _EXHAUSTIVE_UP_TO:
        orders = [list(order) for order in itertools.permutations(variants)]
    else:
        orders = [rng.sample(list(variants), size) for _ in range(_SAMPLED_ORDERS)]

    def imbalance(order: list[tuple[str, ...]]) -> int:
        counts = list(position_counts)
        for gold in gold_by_period:
            counts[order.index(gold)] += 1
        return sum(count * count for count in counts)

    scores = [imbalance(order) for order in orders]
    best = min(scores)
    chosen = rng.choice(
        [order for order, score in zip(orders, scores, strict=True) if score == best]
    )
    for gold in gold_by_period:
        position_counts[chosen.index(gold)] += 1
    return chosen
