"""GEPA's rejection text becomes the reason a reader sees: rounded scores, in words."""

from __future__ import annotations

from evolve.optimize.gepa_engine import rejection_in_words


def test_gepas_raw_sums_become_rounded_words():
    raw = "Candidate rejected by acceptance criterion (old_sum=-0.33333333333333187, new_sum=-1.0)"
    reason = rejection_in_words(-1.0, -0.33333333333333187, raw)
    assert reason == (
        "below its parent on the minibatch: -1.000 vs its parent's -0.333 (the score summed "
        "over the minibatch users)"
    )


def test_an_equal_score_is_no_better_and_float_noise_is_zero():
    reason = rejection_in_words(8.881784197001252e-16, 0.0, "New subsample score ... not better")
    assert reason.startswith("no better than its parent on the minibatch: 0.000 vs")
    assert "e-16" not in reason and "-0.000" not in reason


def test_a_proposal_passed_over_by_selection_says_so():
    raw = "Passed acceptance (score 0.1 -> 0.5) but was not selected by the selection strategy"
    reason = rejection_in_words(0.5, 0.1, raw)
    assert reason.startswith("passed the minibatch check (0.500 vs its parent's 0.100")
    assert "another proposal" in reason
