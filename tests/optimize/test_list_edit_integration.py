"""The structured list edit on the real bundled model: shown a recall-world failure whose
cause is a type the memory never held, the reflector adds that type and the list stays valid."""

from __future__ import annotations

import pytest

from evolve.optimize.edits import list_items, proposal_problem
from evolve.optimize.list_edit import ListEditOperator
from evolve.optimize.reflect import Reflector

COMPONENT = "write.types_to_remember"
TYPES = "1. Diet and eating habits\n2. Work and career"
# The diagnostic feedback's layout (evolve.optimize.feedback) for two write failures.
HEADER = (
    "0 of 2 answers were correct. Wrong: 2 write (the memory never held the right value), "
    "0 read (it was stored once, then lost), 0 use (memory right, answer wrong)."
)
# Neither failed fact is named in the list-edit instruction: with the instruction's former
# examples ('pets', 'sleep') as the failed facts, the 0.5B passed by copying the examples.
FEEDBACK = (
    HEADER
    + """
Failures:
1. Period 1, question: "How tight is my budget these days?"
   answered "comfortable"; correct "tight"
   cause: write - budget_situation is tight, changed from comfortable; memory recalled nothing
   the user had said: "Every coffee counts this month, so I skip the café."
   memory held: diet: vegetarian | job: nurse
2. Period 1, question: "How do I get around on trips?"
   answered "planes"; correct "trains"
   cause: write - travel_mode is trains; memory recalled nothing
   the user had said: "I book overnight sleeper carriages across the continent instead of planes."
   memory held: diet: vegetarian | job: nurse"""
)


@pytest.mark.integration
def test_the_bundled_model_adds_a_missing_type(role_lms_embedded):
    reflector = Reflector(role_lms_embedded, temperature=0.0, max_chars=1200)
    operator = ListEditOperator(reflector)
    records = {COMPONENT: [{"Feedback": FEEDBACK}]}
    outcomes = []
    for attempt in range(3):
        proposal = operator.propose({COMPONENT: TYPES}, [COMPONENT], records, seed=attempt)
        print(f"try {attempt}: {proposal.model_dump()}")
        outcomes.append(proposal)
        text = proposal.components.get(COMPONENT)
        if text is None:
            continue
        assert proposal_problem(COMPONENT, text, FEEDBACK) is None, text
        assert list_items(text)[:2] == list_items(TYPES)  # nothing dropped
        added = [item.casefold() for item in proposal.detail[COMPONENT]["added"]]
        # A type named for a failed fact, not a copied cause line ("write - not in memory: ...").
        if any(
            ("budget" in item or "travel" in item) and "memory" not in item and "write" not in item
            for item in added
        ):
            return
    pytest.fail(f"no try added a missing type: {[p.model_dump() for p in outcomes]}")
