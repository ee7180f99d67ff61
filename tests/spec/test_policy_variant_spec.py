"""`[policy] variant` in experiment and tuning specs: the old key `preset` is a one-line error
naming the new one, and the config hash of an unchanged spec is the one it had before the
rename."""

from __future__ import annotations

import pytest
from strict_warnings import no_warnings

from evolve.core.errors import ConfigError
from evolve.simulator.run_dir import config_hash
from evolve.spec.config import spec_from_dict


def _spec(**policy: object):
    return spec_from_dict(
        {
            "name": "fixed",
            "protocol": "evolve",
            "environment": {"preset": "tiny", "users": 3, "train_users": 2, "heldout_users": 1},
            "policy": {"kind": "in_context", "parameters": {"update_every": 3}, **policy},
        }
    )


def test_the_new_key_is_silent_and_the_old_one_is_an_error_naming_it():
    with no_warnings():
        new = _spec(variant="paper")
    assert new.policy.variant == "paper"
    with pytest.raises(ConfigError, match=r"policy: the key 'preset' is now called 'variant'"):
        _spec(preset="paper")


def test_the_config_hash_of_an_unchanged_spec_is_unchanged():
    # Hashed under the old key name: experiment directories made before the rename resume.
    identity = _spec(variant="paper").identity()
    assert identity["policy"]["preset"] == "paper" and "variant" not in identity["policy"]
    # Computed before the rename, from the same spec with `preset = "paper"`.
    assert config_hash(identity) == (
        "097827bdbf42ae1b8321238b56676963ee48116cb75738dae7d9a66f878ca8cf"
    )
    # No variant: nothing is added to the hashed identity.
    assert "preset" not in _spec().identity()["policy"]


def test_the_protocol_names_the_variant():
    from evolve.core.protocol import rules_for

    assert rules_for("paper").policy_variant == "paper"
    assert rules_for("evolve").policy_variant is None
