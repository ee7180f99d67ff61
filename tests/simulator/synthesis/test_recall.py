"""The recall worlds (evolve.simulator.synthesis.recall and the recall presets): which catalog
domains their users' facts come from."""

from __future__ import annotations

from itertools import combinations

import pytest

from evolve.core.errors import ConfigError
from evolve.simulator.synthesis.catalogs import Catalog, load_catalog
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import (
    CRAFT_DOMAINS,
    EVERYDAY_DOMAINS,
    OfflineSynthesisConfig,
    get_preset,
)


def domains_of(env, catalog: Catalog) -> list[list[str]]:
    return [[catalog.variables[var].domain for var in item.state_schema] for item in env.items]


@pytest.mark.parametrize(
    ("preset", "domains"), [("recall", EVERYDAY_DOMAINS), ("recall_crafts", CRAFT_DOMAINS)]
)
def test_each_recall_world_draws_one_fact_per_domain_from_its_own_domains(preset, domains):
    catalog = load_catalog()
    env = synthesize_environment(get_preset(preset), seed=13, num_users=4, catalog=catalog)
    for user_domains in domains_of(env, catalog):
        assert len(user_domains) == 8 and len(set(user_domains)) == 8
        assert set(user_domains) <= set(domains)


def test_a_catalog_file_of_other_domains_changes_no_draw_of_the_recall_world():
    catalog = load_catalog()
    everyday_only = Catalog(
        variables={
            name: variable
            for name, variable in catalog.variables.items()
            if variable.domain in EVERYDAY_DOMAINS
        },
        questions=catalog.questions,
        personas=catalog.personas,
    )
    assert len(everyday_only.variables) < len(catalog.variables)  # the crafts are there
    for seed in (13, 14):
        with_crafts = synthesize_environment(get_preset("recall"), seed, 4, catalog=catalog)
        without = synthesize_environment(get_preset("recall"), seed, 4, catalog=everyday_only)
        assert with_crafts.content_hash() == without.content_hash()


def test_crafts_users_share_most_of_their_facts():
    """Ten crafts with one fact each, eight a user: any two users share at least six facts, so
    what train users' failures name is what held-out users reveal."""
    env = synthesize_environment(get_preset("recall_crafts"), seed=13, num_users=4)
    for first, second in combinations(env.items, 2):
        assert len(set(first.state_schema) & set(second.state_schema)) >= 6


def test_unknown_domains_are_refused_with_the_domains_that_exist():
    config = get_preset("recall").model_copy(update={"domains": ("diet", "gardening")})
    with pytest.raises(ConfigError, match=r"\['gardening'\].*diet.*pottery"):
        synthesize_environment(config, seed=0, num_users=1)


def test_too_few_recall_facts_in_the_domains_are_refused():
    config = get_preset("recall").model_copy(update={"domains": ("pottery", "knitting")})
    with pytest.raises(ConfigError, match="needs 8 variables with a recall question, its domains"):
        synthesize_environment(config, seed=0, num_users=1)


def test_domains_apply_to_recall_questions_only():
    shape = get_preset("tiny").model_dump()
    with pytest.raises(ValueError, match="domains only apply to recall questions"):
        OfflineSynthesisConfig.model_validate({**shape, "domains": ["diet"]})
