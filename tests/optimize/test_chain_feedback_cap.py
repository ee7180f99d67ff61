"""The per-period chain's feedback length cap: the reference caps no feedback, so under the
paper's reflector prompt only a `max_feedback_chars` the spec sets applies."""

from __future__ import annotations

import random

import pytest

from evolve.feedback import build_feedback
from evolve.optimize.chain_step import feedback_char_cap
from evolve.simulator.records import ItemResult, PeriodResult
from evolve.spec.config import spec_from_dict


def spec(protocol: str, **optimizer: int):
    return spec_from_dict(
        {
            "name": "cap",
            "protocol": protocol,
            "environment": {"preset": "tiny"},
            "policy": {"kind": "in_context"},
            "optimizer": {"schedule": "per_period", **optimizer},
        }
    )


@pytest.mark.parametrize(
    ("protocol", "optimizer", "cap"),
    [
        ("paper", {}, None),
        ("paper", {"max_feedback_chars": 900}, 900),
        ("evolve", {}, 1600),
        ("evolve", {"max_feedback_chars": 900}, 900),
    ],
)
def test_paper_feedback_is_uncapped_unless_the_spec_sets_a_cap(protocol, optimizer, cap):
    assert feedback_char_cap(spec(protocol, **optimizer)) == cap


def test_uncapped_question_only_feedback_keeps_every_question():
    questions = [f"Question about topic {n}: " + "which one fits me now? " * 8 for n in range(20)]
    items = [
        ItemResult(
            question_index=n,
            question=q,
            required_info=["x"],
            options=["a", "b", "c"],
            option_states=[["a"], ["b"], ["c"]],
            gold=1,
            gold_state=["a"],
            chosen=2,
            chosen_state=["b"],
            correct=False,
            parse_failed=False,
            random_score=1 / 3,
            diagnosis="write",
        )
        for n, q in enumerate(questions)
    ]
    result = PeriodResult(user_id="u", period_index=0, state={"x": "a"}, items=items)
    kwargs = {"component": "write.types_to_remember", "max_failures": 4, "rng": random.Random(0)}
    full = build_feedback([result], "question_only", max_chars=None, **kwargs).text
    assert len(full) > 1600 and all(" ".join(q.split()) in full for q in questions)
    capped = build_feedback([result], "question_only", max_chars=1600, **kwargs).text
    assert len(capped) == 1600
