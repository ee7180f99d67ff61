"""Feedback for the reflector: content per kind, caps, ranking per component, diversity.

`complete` and `question_only` are the paper's (no ground truth: changing the gold option,
the correctness and the diagnosis of every item leaves their text unchanged); `diagnostic`
is ours (failures with the truth)."""

from __future__ import annotations

import random

import pytest
from optimize.evolve_helpers import World, write_environment

from evolve.feedback import BLIND_FEEDBACK, build_feedback
from evolve.optimize.list_edit import failure_lines
from evolve.results.objective import load_period_results
from evolve.simulator.environment import load_environment
from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.simulator.records import Diagnosis
from memory_policies import build_policy


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("feedback")
    env = load_environment(write_environment(directory / "env.json", users=2))
    policy = build_policy("in_context:update_every=2,short_term_len=2")
    run_evaluation(env, policy, World().lms, directory / "run", EpisodeConfig(concurrency=1))
    return load_period_results(directory / "run")


def make(results, kind="diagnostic", component="write.types_to_remember", seed=0, **kwargs):
    options = {"max_failures": 4, "max_chars": 4000, **kwargs}
    return build_feedback(results, kind, component=component, rng=random.Random(seed), **options)


def test_loads_every_user_period(results):
    assert len(results) == 6
    assert {(r.user_id, r.period_index) for r in results} == {
        (u, p) for u in ("user-0", "user-1") for p in range(3)
    }


def test_diagnostic_feedback_names_answers_diagnosis_and_memory(results):
    feedback = make(results)
    text = feedback.text
    wrong = sum(not item.correct for r in results for item in r.items)
    assert feedback.failures_total == wrong > 0
    assert feedback.items_total == 12
    assert text.startswith(f"{12 - wrong} of 12 answers were correct.")
    assert "answered" in text and "correct" in text and "cause:" in text
    assert "memory held:" in text
    assert feedback.failures_shown == min(4, wrong)
    # A write failure names the variable, its true value and the value recalled.
    assert "diet is keto, changed from omnivore this period; memory recalled" in text or (
        "diet is omnivore; memory recalled" in text
    )


def test_list_edits_see_each_cause_by_the_failed_facts_names_without_their_values(results):
    # failure_lines reads the failures the feedback showed, as data.
    feedback = make(results, max_failures=12, max_chars=20000)
    causes = [
        line.strip() for line in failure_lines(feedback.failures).splitlines() if "cause:" in line
    ]
    assert len(causes) == feedback.text.count("cause:") == feedback.failures_shown
    variables = {c.variable for r in results for item in r.items for c in item.variables}
    values = {c.gold for r in results for item in r.items for c in item.variables}
    named = [line.split("not in memory: ", 1)[1] for line in causes if "not in memory: " in line]
    assert named, causes
    for names in named:
        assert set(names.split(", ")) <= variables and not set(names.split(", ")) & values
    others = [line for line in causes if "not in memory: " not in line]
    assert all(
        line == "cause: use - the facts were in memory, the answer was wrong" for line in others
    )
    assert not any(value in line for value in values for line in causes)


def test_write_components_see_write_failures_first_use_sees_utilization_first(results):
    diagnoses = {item.diagnosis for r in results for item in r.items if not item.correct}
    assert Diagnosis.WRITE in diagnoses and Diagnosis.UTILIZATION in diagnoses
    write_side = make(results, component="write.types_to_remember", max_failures=1).text
    use_side = make(results, component="use", max_failures=1).text
    assert "cause: write" in write_side
    assert "cause: use" in use_side


def test_caps_on_failures_and_characters(results):
    assert make(results, max_failures=1).failures_shown == 1
    short = make(results, max_failures=10, max_chars=400)
    assert len(short.text) <= 400
    assert short.failures_shown >= 1


def test_different_rngs_show_different_subsets(results):
    texts = {make(results, seed=seed, max_failures=1).text for seed in range(12)}
    assert len(texts) > 1
    assert make(results, seed=3).text == make(results, seed=3).text  # reproducible


def _without_truth(results):
    """The same results with every piece of ground truth changed."""
    changed = []
    for result in results:
        items = [
            item.model_copy(
                update={
                    "gold": len(item.options) + 1 - item.gold,
                    "gold_state": ["?"],
                    "correct": not item.correct,
                    "diagnosis": Diagnosis.UTILIZATION,
                    "variables": [],
                }
            )
            for item in result.items
        ]
        changed.append(result.model_copy(update={"items": items, "state": {}}))
    return changed


def one_user_period(results, user="user-0", period=1):
    return [r for r in results if r.user_id == user and r.period_index == period]


def test_complete_is_the_papers_vanilla_feedback(results):
    scored = one_user_period(results)
    feedback = make(scored, kind="complete", periods=[1])
    text = feedback.text
    result = scored[0]
    assert feedback.items_total == len(result.items) == 2
    # Every question of the period with its lettered options and the option chosen.
    for item in result.items:
        assert item.question in text
        for letter, option in zip("ABC", item.options, strict=False):
            assert f"({letter}) {option}" in text
    chosen = [item.chosen for item in result.items]
    expected = [f"The assistant chose: ({'ABC'[c - 1]})" for c in chosen if c is not None]
    assert [line.strip() for line in text.splitlines() if "chose" in line] == expected
    # The memory it answered from (what the policy retrieved: all of it, for in_context).
    memory = " | ".join(result.items[0].retrieved)
    assert memory and f"Memory the assistant had: {memory}" in text
    # No gold option, correctness or diagnosis: the text ignores all of them.
    assert make(_without_truth(scored), kind="complete", periods=[1]).text == text
    for word in ("correct", "cause", "gold", "wrong", "diagnos"):
        assert word not in text.lower()


def test_question_only_is_questions_plus_memory(results):
    scored = one_user_period(results)
    feedback = make(scored, kind="question_only", periods=[1])
    text = feedback.text
    assert "Can you suggest a dinner recipe for me?" in text
    assert "Plan a weekend activity with my pet near home." in text
    memory = " | ".join(scored[0].items[0].retrieved)
    assert memory and f"Memory the assistant had: {memory}" in text
    assert "(A)" not in text and "chose" not in text
    for option in scored[0].items[0].options:
        assert option not in text
    assert make(_without_truth(scored), kind="question_only", periods=[1]).text == text


def test_none_is_empty_and_unknown_kinds_are_refused(results):
    assert make(results, kind="none").text == ""
    with pytest.raises(ValueError, match="diagnostic"):
        make(results, kind="vanilla")


def test_blind_asks_for_an_improvement_and_shows_nothing_of_the_results(results):
    feedback = make(results, kind="blind")
    assert feedback.text == BLIND_FEEDBACK and feedback.failures_shown == 0
    # Nothing of what happened: the same text whatever the results were.
    assert make(_without_truth(results), kind="blind").text == feedback.text
    assert make(results[:1], kind="blind").text == feedback.text


def test_one_proposal_over_several_users_tells_their_periods_apart(results):
    text = make(results, kind="question_only").text
    assert "User user-0, period 0:" in text and "User user-1, period 2:" in text
    # One user (the paper's per-user chain): the text it always had.
    single = make(one_user_period(results), kind="question_only", periods=[1]).text
    assert single.startswith("Period 1:")


def test_paper_feedback_is_capped(results):
    short = make(results, kind="complete", max_chars=300)
    assert len(short.text) <= 300 and short.text.endswith("...")


def test_restricting_to_one_period(results):
    feedback = make(results, periods=[0])
    assert "Period 0" in feedback.text
    assert "Period 1" not in feedback.text and "Period 2" not in feedback.text
    assert feedback.items_total == 4


def test_complete_feedback_shows_an_unparseable_answer_as_no_option_not_a_random_letter(results):
    # A kept paper deviation (unparseable_answer_letter): the reference shows the letter of
    # the random option it drew for an unparseable answer; ours says that none was usable.
    (result,) = one_user_period(results)
    first, *rest = result.items
    unparsed = first.model_copy(update={"chosen": None, "parse_failed": True})
    scored = [result.model_copy(update={"items": [unparsed, *rest]})]
    lines = [line.strip() for line in make(scored, kind="complete", periods=[1]).text.splitlines()]
    chose = [line for line in lines if line.startswith("The assistant chose:")]
    assert chose[0] == "The assistant chose: no valid option (unparseable answer)"
    assert len(chose) == len(result.items)
