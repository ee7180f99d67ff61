"""A policy's "preset" is now its "variant": the old names still work and warn, the new ones
are silent, and what was stored under the old name (bundles, run hashes) loads unchanged."""

from __future__ import annotations

import json
import warnings

import pytest
from fresh_import import import_fresh

import memory_policies
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
from memory_policies.deprecation import RenamedWarning
from memory_policies.errors import PolicyError
from memory_policies.variants import VariantRules, variant_rules


@pytest.fixture
def silent():
    """Fail on any warning: the new names must say nothing."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def test_the_new_names_are_silent(silent, tmp_path) -> None:
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


def test_the_old_module_warns_and_holds_the_same_objects() -> None:
    old_to_new = r"memory_policies\.presets .*memory_policies\.variants"
    with pytest.warns(RenamedWarning, match=old_to_new):
        presets = import_fresh("memory_policies.presets")
    from memory_policies import variants

    assert presets.PresetRules is variants.VariantRules
    assert presets.PRESETS is variants.VARIANTS
    assert presets.DEFAULT_PRESET == variants.DEFAULT_VARIANT
    assert presets.preset_rules is variants.variant_rules
    assert presets.check_preset is variants.check_variant
    assert presets.is_preset is variants.is_variant
    assert presets.PAPER is variants.PAPER and presets.EVOLVE is variants.EVOLVE


@pytest.mark.parametrize(
    ("old", "new"),
    [("DEFAULT_PRESET", "DEFAULT_VARIANT"), ("PRESETS", "VARIANTS"), ("Preset", "Variant")],
)
def test_the_old_package_names_warn(old: str, new: str) -> None:
    with pytest.warns(RenamedWarning, match=f"memory_policies.{old} .*memory_policies.{new}"):
        value = getattr(memory_policies, old)
    assert value is getattr(memory_policies, new)
    with pytest.raises(AttributeError, match="no_such_name"):
        memory_policies.no_such_name  # noqa: B018


def test_the_old_spec_option_warns_and_sets_the_variant() -> None:
    with pytest.warns(RenamedWarning, match=r"'preset' in policy spec .*variant=paper"):
        assert parse_spec("in_context:preset=paper") == ("in_context", {"variant": "paper"})
    with pytest.warns(RenamedWarning, match="variant"):
        assert build_policy("in_context:preset=paper").variant == "paper"
    with pytest.warns(RenamedWarning), pytest.raises(PolicyError, match="given twice"):
        parse_spec("in_context:variant=paper,preset=paper")
    with pytest.warns(RenamedWarning), pytest.raises(PolicyError, match="must be one of"):
        parse_spec("in_context:preset=papr")


def test_the_old_python_names_warn() -> None:
    with pytest.warns(RenamedWarning, match="policy option 'preset'"):
        assert build_policy({"kind": "in_context", "preset": "paper"}).variant == "paper"
    with pytest.warns(RenamedWarning, match="policy option 'preset'"):
        assert InContextPolicy(preset="paper").variant == "paper"
    with pytest.warns(RenamedWarning, match=r"create_policy\(variant"):
        assert create_policy("in_context", preset="paper").variant == "paper"
    with pytest.warns(RenamedWarning, match="default_variant"):
        assert build_policy("in_context", default_preset="paper").variant == "paper"
    policy = build_policy("in_context:variant=paper")
    with pytest.warns(RenamedWarning, match=r"MemoryPolicy\.variant"):
        assert policy.preset == "paper"
    with pytest.warns(RenamedWarning), pytest.raises(PolicyError, match="give one"):
        InContextPolicy(variant="evolve", preset="paper")


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
