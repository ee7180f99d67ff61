"""The structured list edit on the real bundled model: shown a recall-world failure whose
cause is a type the memory never held, the reflector adds that type and the list stays valid."""

from __future__ import annotations

import random

import pytest

from evolve.feedback import AnsweredQuestion, FactCheck, feedback_kind, reflective_record
from evolve.optimize.edits import list_items, proposal_problem
from evolve.optimize.list_edit import ListEditOperator
from evolve.optimize.reflect import Reflector
from evolve.simulator.records import Diagnosis

COMPONENT = "write.types_to_remember"
TYPES = "1. Diet and eating habits\n2. Work and career"
# Neither failed fact is named in the list-edit instruction: with the instruction's former
# examples ('pets', 'sleep') as the failed facts, the 0.5B passed by copying the examples.
FAILURES = [
    AnsweredQuestion(
        user_id="u",
        period=1,
        question="How tight is my budget these days?",
        options=["comfortable", "tight"],
        gold=2,
        chosen=1,
        correct=False,
        diagnosis=Diagnosis.WRITE,
        required_facts=["budget_situation"],
        facts=[
            FactCheck(
                variable="budget_situation",
                gold="tight",
                recalled=None,
                in_memory=False,
                changed_from="comfortable",
            )
        ],
        memory_held="diet: vegetarian | job: nurse",
        answered_from="diet: vegetarian | job: nurse",
        user_said="Every coffee counts this month, so I skip the café.",
    ),
    AnsweredQuestion(
        user_id="u",
        period=1,
        question="How do I get around on trips?",
        options=["planes", "trains"],
        gold=2,
        chosen=1,
        correct=False,
        diagnosis=Diagnosis.WRITE,
        required_facts=["travel_mode"],
        facts=[FactCheck(variable="travel_mode", gold="trains", recalled=None, in_memory=False)],
        memory_held="diet: vegetarian | job: nurse",
        answered_from="diet: vegetarian | job: nurse",
        user_said="I book overnight sleeper carriages across the continent instead of planes.",
    ),
]
FEEDBACK = feedback_kind("diagnostic").render(
    FAILURES, component=COMPONENT, max_failures=8, max_chars=6000, rng=random.Random(0)
)


@pytest.mark.integration
def test_the_bundled_model_adds_a_missing_type(role_lms_embedded):
    reflector = Reflector(role_lms_embedded, temperature=0.0, max_chars=1200)
    operator = ListEditOperator(reflector)
    records = {COMPONENT: [reflective_record(FEEDBACK)]}
    outcomes = []
    for attempt in range(3):
        proposal = operator.propose({COMPONENT: TYPES}, [COMPONENT], records, seed=attempt)
        print(f"try {attempt}: {proposal.model_dump()}")
        outcomes.append(proposal)
        text = proposal.components.get(COMPONENT)
        if text is None:
            continue
        assert proposal_problem(COMPONENT, text, FEEDBACK.text) is None, text
        assert list_items(text)[:2] == list_items(TYPES)  # nothing dropped
        added = [item.casefold() for item in proposal.detail[COMPONENT]["added"]]
        # A type named for a failed fact, not a copied cause line ("write - not in memory: ...").
        if any(
            ("budget" in item or "travel" in item) and "memory" not in item and "write" not in item
            for item in added
        ):
            return
    pytest.fail(f"no try added a missing type: {[p.model_dump() for p in outcomes]}")
