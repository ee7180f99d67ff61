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
FEEDBACK = (
    HEADER
    + """
Failures:
1. Period 1, question: "What pets do I have right now?"
   answered "no pets"; correct "a cat"
   cause: write - pets is a cat, changed from no pets this period; memory recalled nothing
   the user had said: "We adopted a little tabby from the shelter and she already owns the sofa."
   memory held: diet: vegetarian | job: nurse
2. Period 1, question: "How am I sleeping these days?"
   answered "sleeps well"; correct "insomnia"
   cause: write - sleep_quality is insomnia; memory recalled nothing
   the user had said: "I've been lying awake until 3 a.m. most nights this month."
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
        added = " ".join(proposal.detail[COMPONENT]["added"]).casefold()
        if "pet" in added or "sleep" in added:
            return
    pytest.fail(f"no try added a missing type: {[p.model_dump() for p in outcomes]}")
