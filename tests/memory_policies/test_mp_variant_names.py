"""A policy's "preset" is now its "variant": the old option name is a one-line error naming the
new one, and what was stored under the old name (bundles, run hashes) loads unchanged."""

from __future__ import annotations

import json

import dspy
import pytest
from strict_warnings import no_warnings

from memory_policies import (
    DEFAULT_VARIANT,
    VARIANTS,
    InContextPolicy,
    build_policy,
    create_policy,
    load,
    parse_spec,
    read_bundle,
)
from memory_policies.errors import PolicyError
from memory_policies.variants import VariantRules, variant_rules


@pytest.fixture
def silent():
    """Fail on any warning: reading stored data says nothing."""
    with no_warnings():
        yield


def test_the_variant_is_given_by_its_name(silent, tmp_path) -> None:
    assert VARIANTS == ("paper", "evolve") and DEFAULT_VARIANT == "evolve"
    assert isinstance(variant_rules("paper"), VariantRules)
    policy = build_policy("in_context:variant=paper")
    assert policy.variant == "paper" and policy.rules is variant_rules("paper")
    assert build_policy({"kind": "in_context", "variant": "paper"}).variant == "paper"
    assert create_policy("in_context", variant="paper").variant == "paper"
    assert build_policy("in_context", default_variant="paper").variant == "paper"
    assert InContextPolicy(variant="paper").variant == "paper"
    policy.save(tmp_path)
    assert load(tmp_path).variant == "paper"


def test_the_old_spec_option_is_an_error_naming_the_new_one() -> None:
    fix = r"now called 'variant': write 'in_context:variant=paper'"
    with pytest.raises(PolicyError, match=fix):
        parse_spec("in_context:preset=paper")
    with pytest.raises(PolicyError, match=fix):
        build_policy("in_context:preset=paper")


def test_the_old_option_in_a_mapping_or_a_call_is_an_error_naming_the_new_one() -> None:
    with pytest.raises(PolicyError, match="'variant'"):
        build_policy({"kind": "in_context", "preset": "paper"})
    with pytest.raises(PolicyError, match="'variant'"):
        InContextPolicy(preset="paper")
    with pytest.raises(PolicyError, match="'variant'"):
        create_policy("in_context", {"preset": "paper"})


def test_a_bundle_that_says_preset_loads_silently(silent, tmp_path) -> None:
    """Version 1 bundles record the variant as "preset"; nobody can fix an exported bundle,
    so it loads without a warning."""
    build_policy("in_context:variant=paper").save(tmp_path)
    path = tmp_path / "policy.json"
    bundle = json.loads(path.read_text())
    bundle["preset"] = bundle.pop("variant")
    bundle["format_version"] = 1
    path.write_text(json.dumps(bundle))
    assert read_bundle(tmp_path)["variant"] == "paper"
    assert "preset" not in read_bundle(tmp_path)
    assert load(tmp_path).variant == "paper"


def test_the_policy_identity_keeps_the_old_key_so_run_hashes_do_not_change(silent) -> None:
    # Run and experiment config hashes include `identity()`: a renamed key would make every
    # earlier run directory refuse to resume.
    from evolve.simulator.run_dir import config_hash

    identity = build_policy("in_context:variant=paper,update_every=3").identity()
    assert identity["preset"] == "paper" and "variant" not in identity
    # Computed before the rename, from `in_context:preset=paper,update_every=3`.
    assert config_hash(identity) == (
        "e8d9cfa5cf1bb124fa2a1befefb71eb9a4f42aa2a7e9d714e63df91a073fc827"
    )


def test_a_kind_follows_only_the_variants_it_declares() -> None:
    """A kind that declares no paper flow (no paper answer signature) is refused
    variant=paper when built, naming what it supports, rather than failing at its first
    question."""
    from memory_policies import MemoryPolicy
    from memory_policies.common import MemoryChoose, MemoryReply, PassThrough

    class EvolveOnly(MemoryPolicy):
        kind = "evolve_only"
        choose_signature = MemoryChoose

        def _build_modules(self) -> None:
            self.write, self.read = PassThrough(), PassThrough()
            self.use = dspy.Predict(MemoryReply)

    assert EvolveOnly().variant == "evolve"
    with pytest.raises(
        PolicyError,
        match=r"'evolve_only' has no paper variant \(it supports: evolve\); name one, e\.g\. "
        r"'evolve_only:variant=evolve'",
    ):
        EvolveOnly(variant="paper")
    assert InContextPolicy.variants == VARIANTS  # a built-in kind with both flows


def test_the_variant_chooses_the_dialogue_once() -> None:
    """`respond` and `answer` have one path each: the dialogue the variant chose when the
    policy was built asks `use` (raw chat turns under paper, DSPy fields under evolve)."""
    from memory_policies.dialogue import CHAT_TURNS_DIALOGUE, FIELDS_DIALOGUE

    assert build_policy("in_context:variant=paper").dialogue is CHAT_TURNS_DIALOGUE
    assert build_policy("in_context:variant=evolve").dialogue is FIELDS_DIALOGUE
    assert build_policy("native:variant=paper").with_components({}).dialogue is CHAT_TURNS_DIALOGUE
