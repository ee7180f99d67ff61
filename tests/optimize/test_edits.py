"""Structured list edits, proposal checks and the tie rule (evolve.optimize.edits)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evolve.feedback import AnsweredQuestion, FactCheck, Feedback, reflective_record
from evolve.optimize.edits import (
    MAX_ADDED_ITEMS,
    ListEdit,
    apply_list_edit,
    copied_fraction,
    list_items,
    proposal_problem,
    says_less,
)
from evolve.optimize.gepa_engine import TieKeepsContent
from evolve.optimize.list_edit import ListEditOperator, addable_failure_lines, failure_lines
from evolve.optimize.reflect import Reflector
from evolve.simulator.records import Diagnosis
from memory_policies.in_context import DEFAULT_TYPES_TO_REMEMBER
from tests.scripted_lm import scripted_role_lms

TYPES = "types"  # shorthand used below
LIST = "write.types_to_remember"

# What a quickstart's diagnostic feedback quoted: a question, the options, the user's message.
FEEDBACK = (
    "1 of 3 answers were correct. Wrong: 2 write (the memory never held the right value), "
    "0 read (it was stored once, then lost), 0 use (memory right, answer wrong).\n"
    "Failures:\n"
    '1. Period 1, question: "What\'s the best way to track my spending?"\n'
    "   answered \"Here's a way to track spending. A relaxed monthly review is enough for "
    'you."; correct "Here\'s a way to track spending. Log every purchase the same day."\n'
    "   cause: write - budget_situation is tight budget; memory recalled nothing\n"
    '   the user had said: "Money is tight this month, so every coffee counts."\n'
    "   memory held: diet: vegetarian"
)

# Texts the bundled 0.5B reflector once produced (and GEPA accepted on ties).
DAMAGED_TYPES_G01 = "here's a way to track spending. A relaxed monthly review is enough for you."
DAMAGED_TYPES_G04 = "What's the best way to track my spending?"
DAMAGED_USE_G05 = "Here's a way to track spending. A relaxed monthly review is enough for you."


@pytest.mark.parametrize("text", [DAMAGED_TYPES_G01, DAMAGED_TYPES_G04])
def test_damaged_types_lists_are_refused(text):
    problem = proposal_problem(LIST, text, FEEDBACK)
    assert problem is not None
    assert "numbered item" in problem or "question" in problem or "copies" in problem


def test_a_use_text_copied_from_the_feedback_is_refused():
    problem = proposal_problem("use", DAMAGED_USE_G05, FEEDBACK)
    assert problem is not None and "copies the feedback" in problem
    assert copied_fraction(DAMAGED_USE_G05, FEEDBACK) > 0.9


def test_a_question_inside_a_numbered_list_is_refused():
    text = "1. Diet\n2. What's the best way to track my spending?"
    assert "is a question" in proposal_problem(LIST, text, "")


def test_valid_texts_pass():
    assert proposal_problem(LIST, DEFAULT_TYPES_TO_REMEMBER, FEEDBACK) is None
    assert proposal_problem(LIST, "1. Diet\n2. Pets\n3. Budget and money", FEEDBACK) is None
    use = "Answer from the memory; when it names the user's current value, pick that option."
    assert proposal_problem("use", use, FEEDBACK) is None
    assert copied_fraction(use, FEEDBACK) == 0.0


def test_apply_list_edit_adds_new_items_and_removes_by_number():
    text, applied = apply_list_edit(
        "1. Diet\n2. Work\n3. Pets", ListEdit(add=["pets", "sleep habits", " budget. "], remove=[2])
    )
    assert list_items(text) == ["Diet", "Pets", "sleep habits", "budget"]
    assert text.splitlines()[0] == "1. Diet" and text.splitlines()[-1] == "4. budget"
    assert applied == {"added": ["sleep habits", "budget"], "removed": ["Work"]}
    # Removing an item and adding it back leaves it as it was.
    same, applied = apply_list_edit("1. Diet\n2. Work", ListEdit(add=["work", "pets"], remove=[2]))
    assert list_items(same) == ["Diet", "Work", "pets"] and applied["removed"] == []
    # Unknown item numbers are ignored; nothing added twice.
    same, applied = apply_list_edit("1. Diet", ListEdit(add=["diet"], remove=[7]))
    assert list_items(same) == ["Diet"] and applied == {"added": [], "removed": []}


def test_the_edit_schema_bounds_count_and_length():
    with pytest.raises(ValueError):
        ListEdit(add=[f"type {n}" for n in range(MAX_ADDED_ITEMS + 1)])
    with pytest.raises(ValueError):
        ListEdit(add=["x" * 61])
    with pytest.raises(ValueError):
        ListEdit(remove=[1, 2, 3])


def test_says_less_on_dropped_items_and_shorter_texts():
    parent = {LIST: "1. Diet\n2. Work", "use": "Answer from memory.", "param.update_every": "2"}
    assert says_less(parent, {**parent, LIST: "1. Diet\n2. Work\n3. Pets"}) is None
    assert "drops" in says_less(parent, {**parent, LIST: "1. Diet\n2. Pets"})
    assert "shorter" in says_less(parent, {**parent, "use": "Answer."})
    assert says_less(parent, {**parent, "param.update_every": "1"}) is None


def _proposal(before, after, candidate):
    return SimpleNamespace(
        subsample_scores_before=before,
        subsample_scores_after=after,
        candidate=candidate,
        parent_program_ids=[0],
    )


def test_ties_accept_a_child_that_adds_but_not_one_that_drops():
    parent = {LIST: "1. Diet\n2. Work"}
    state = SimpleNamespace(program_candidates=[parent])
    rule = TieKeepsContent()
    assert rule.should_accept(_proposal([0.5], [0.5], {LIST: "1. Diet\n2. Work\n3. Pets"}), state)
    assert not rule.should_accept(_proposal([0.5], [0.5], {LIST: "1. Diet"}), state)
    # Scores decide when they differ, whatever the text.
    assert rule.should_accept(_proposal([0.5], [0.6], {LIST: "1. Diet"}), state)
    assert not rule.should_accept(_proposal([0.5], [0.4], {LIST: "1. A\n2. B\n3. C"}), state)


def _records(failures=None):
    """A list component's reflective record: `FEEDBACK`'s text with its failure as data."""
    if failures is None:
        failures = [
            _failure(
                1,
                "What's the best way to track my spending?",
                Diagnosis.WRITE,
                ("budget_situation", "tight budget", None, False),
            )
        ]
    feedback = Feedback(kind="diagnostic", text=FEEDBACK, failures=tuple(failures))
    return {LIST: [reflective_record(feedback)]}


def _operator(reply):
    lms = scripted_role_lms(reflector=lambda call: reply(call))
    return ListEditOperator(Reflector(lms, temperature=0.7, max_chars=2000)), lms


def test_list_edit_operator_applies_the_reflectors_edit():
    seen = []

    def reply(call):
        seen.append(call.user)
        return {"add": ["budget", "pets"]}

    operator, _ = _operator(reply)
    proposal = operator.propose({LIST: "1. Diet\n2. Work"}, [LIST], _records(), seed=3)
    assert proposal.invalid is None
    assert list_items(proposal.components[LIST]) == ["Diet", "Work", "budget", "pets"]
    assert proposal.detail[LIST]["added"] == ["budget", "pets"]
    # The reflector sees the failures' questions and which facts were not in memory: not the
    # quoted answers, nor the facts' values (the 1.5B added values as types).
    assert "What's the best way to track my spending?" in seen[0]
    assert "not in memory: budget_situation" in seen[0]
    assert "A relaxed monthly review" not in seen[0]
    assert "tight budget" not in seen[0]


def test_items_offered_past_the_limit_are_recorded_not_applied():
    offered = [f"type {n}" for n in range(MAX_ADDED_ITEMS + 2)]
    operator, _ = _operator(lambda call: {"add": offered})
    proposal = operator.propose({LIST: "1. Diet"}, [LIST], {}, seed=1)
    assert list_items(proposal.components[LIST]) == ["Diet", *offered[:MAX_ADDED_ITEMS]]
    assert proposal.detail[LIST]["beyond_limit"] == offered[MAX_ADDED_ITEMS:]
    within = _operator(lambda call: {"add": offered[:2]})[0].propose(
        {LIST: "1. Diet"}, [LIST], {}, seed=1
    )
    assert "beyond_limit" not in within.detail[LIST]


def _failure(period, question, diagnosis, *facts):
    """A failed question as the feedback gives it: facts are (name, gold, recalled, held)."""
    return AnsweredQuestion(
        user_id="u",
        period=period,
        question=question,
        options=["a", "b"],
        gold=1,
        chosen=2,
        correct=False,
        diagnosis=diagnosis,
        required_facts=[fact[0] for fact in facts],
        facts=[
            FactCheck(variable=name, gold=gold, recalled=recalled, in_memory=held)
            for name, gold, recalled, held in facts
        ],
        memory_held="diet: vegan",
        answered_from="diet: vegan",
    )


def test_failure_lines_name_the_missing_facts_without_their_values():
    failures = [
        _failure(
            1,
            "What pets do I have right now?",
            Diagnosis.WRITE,
            ("pets", "a cat", None, False),
            ("children", "teenagers", "no children", False),
        ),
        _failure(
            2,
            "How am I sleeping these days?",
            Diagnosis.READ,
            ("sleep_quality", "insomnia", "sleeps well", False),
        ),
        _failure(2, "What is my diet?", Diagnosis.UTILIZATION, ("diet", "vegan", "vegan", True)),
    ]
    assert failure_lines(failures).splitlines() == [
        '1. Period 1, question: "What pets do I have right now?"',
        "   cause: write - not in memory: pets, children",
        '2. Period 2, question: "How am I sleeping these days?"',
        "   cause: read - not in memory: sleep_quality",
        '3. Period 2, question: "What is my diet?"',
        "   cause: use - the facts were in memory, the answer was wrong",
    ]


ADDABLE_FAILURES = [
    _failure(
        1,
        "What is on my knitting needles?",
        Diagnosis.WRITE,
        ("knitting_project", "socks", "a sweater", False),
    ),
    _failure(
        2,
        "What kind of loom am I weaving on?",
        Diagnosis.WRITE,
        ("weaving_loom", "a rigid heddle loom", None, False),
    ),
    _failure(
        2,
        "Which calligraphy style am I practising?",
        Diagnosis.UTILIZATION,
        ("calligraphy_style", "italic", "italic", True),
    ),
]


def test_only_failures_an_added_type_can_fix_reach_the_reflector():
    listed = "1. Diet\n2. Knitting project\n3. calligraphy_style"
    lines = addable_failure_lines(ADDABLE_FAILURES, listed).splitlines()
    # Knitting is listed (its statement was misfiled), calligraphy a use failure: both left out.
    assert lines == [
        '2. Period 2, question: "What kind of loom am I weaving on?"',
        "   cause: write - not in memory: weaving_loom",
    ]
    # With nothing listed, every write failure stays.
    assert "knitting_project" in addable_failure_lines(ADDABLE_FAILURES, "1. Diet")


def test_list_edit_operator_asks_nothing_when_no_added_type_can_fix_a_failure():
    calls = []
    operator, _ = _operator(lambda call: calls.append(call) or {"add": ["x"]})
    listed = "1. knitting_project\n2. weaving_loom"
    records = _records(ADDABLE_FAILURES)
    proposal = operator.propose({LIST: listed}, [LIST], records, seed=1)
    assert proposal.components == {} and "no failure an added type can fix" in proposal.invalid
    assert calls == []
    operator.propose({LIST: "1. Diet"}, [LIST], records, seed=1)
    assert "weaving_loom" in calls[0].user and "knitting_project" in calls[0].user


def test_list_edit_operator_refuses_an_edit_that_changes_nothing_or_damages():
    operator, _ = _operator(lambda call: {"add": ["diet"]})
    proposal = operator.propose({LIST: "1. Diet"}, [LIST], {}, seed=1)
    assert proposal.components == {} and "changes nothing" in proposal.invalid

    copied = "What's the best way to track my spending?"
    operator, _ = _operator(lambda call: {"add": [copied[:40]]})
    proposal = operator.propose({LIST: "1. Diet"}, [LIST], _records(), seed=1)
    assert proposal.components == {} and "question" in proposal.invalid


def test_list_edit_operator_counts_an_unparseable_reply():
    operator, _ = _operator(lambda call: "not json at all")
    proposal = operator.propose({LIST: "1. Diet"}, [LIST], {}, seed=1)
    assert proposal.parse_failed and proposal.components == {}


def test_the_free_text_reflector_refuses_a_copied_text():
    lms = scripted_role_lms(reflector=lambda call: {"new_text": DAMAGED_USE_G05})
    proposal = Reflector(lms, temperature=0.7, max_chars=2000).propose(
        "use", "Answer from memory.", FEEDBACK, rollout_id=1, seed=1
    )
    assert proposal.text is None and "copies the feedback" in proposal.error
    unchecked = Reflector(lms, temperature=0.7, max_chars=2000, check_proposals=False)
    assert unchecked.propose("use", "x", FEEDBACK, rollout_id=1, seed=1).text == DAMAGED_USE_G05
