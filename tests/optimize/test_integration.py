"""The evolution loop on the real embedded model (one generation, one candidate)."""

from __future__ import annotations

import pytest

from evolve.optimize import CandidateStatus, evolve_policy, format_table
from evolve.spec.config import spec_from_dict


@pytest.mark.integration
def test_one_reflective_generation_on_the_embedded_model(tmp_path, episode_lms_embedded):
    spec = spec_from_dict(
        {
            "name": "integration",
            "concurrency": 1,
            "environment": {"preset": "tiny", "users": 2, "train_users": 1, "heldout_users": 1},
            "policy": {"kind": "in_context"},
            # Reflection reads the diagnosis of wrong answers only: probing the right ones
            # too (the default) adds calls to every episode and nothing to the feedback.
            "episode": {"probes": "wrong_only"},
            "optimizer": {
                "generations": 1,
                "mutate_components": ["write.types_to_remember"],
                "max_feedback_failures": 2,
                "max_feedback_chars": 900,
            },
            "tracking": {"enabled": False},
        }
    )
    result = evolve_policy(
        spec, episode_lms_embedded, runs_dir=tmp_path / "runs", upper_bound_cache=tmp_path / "ub"
    )
    print(format_table(result, spec.rules))
    assert result.complete
    base = result.candidate("g00-c0")
    assert base.train is not None and base.heldout is not None
    assert base.train.summary.n_items > 0
    child = result.candidate("g01-c0")
    assert child.mutation.kind == "reflective"
    assert child.mutation.component == "write.types_to_remember"
    if child.status == CandidateStatus.EVALUATED:
        assert (
            child.components["write.types_to_remember"]
            != base.components["write.types_to_remember"]
        )
        assert child.train is not None and child.heldout is not None
    elif child.status == CandidateStatus.REJECTED:  # GEPA's minibatch check: not better
        assert child.train is None  # never evaluated on all train users
        assert (
            child.components["write.types_to_remember"]
            != base.components["write.types_to_remember"]
        )
    else:  # the 0.5B reflector's output was unusable: counted, never replaced
        assert child.status in (CandidateStatus.INVALID, CandidateStatus.DUPLICATE)
        assert child.invalid_reason or child.duplicate_of
