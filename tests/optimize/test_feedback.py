"""Feedback for the reflector: content per kind, caps, ranking per component, diversity."""

from __future__ import annotations

import random

import pytest
from optimize.evolve_helpers import World, write_environment

from evolve.optimize.feedback import build_feedback, load_period_results
from evolve.simulator.environment import load_environment
from evolve.simulator.records import Diagnosis
from evolve.simulator.runner import EpisodeConfig, run_evaluation
from memory_policies import build_policy


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    directory = tmp_path_factory.mktemp("feedback")
    env = load_environment(write_environment(directory / "env.json", users=2))
    policy = build_policy("in_context:update_every=2,short_term_len=2")
    run_evaluation(env, policy, World().lms, directory / "run", EpisodeConfig(concurrency=1))
    return load_period_results(directory / "run")


def make(results, kind="complete", component="write.types_to_remember", seed=0, **kwargs):
    options = {"max_failures": 4, "max_chars": 4000, **kwargs}
    return build_feedback(results, kind, component=component, rng=random.Random(seed), **options)


def test_loads_every_user_period(results):
    assert len(results) == 6
    assert {(r.user_id, r.period_index) for r in results} == {
        (u, p) for u in ("user-0", "user-1") for p in range(3)
    }


def test_complete_feedback_names_answers_diagnosis_and_memory(results):
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


def test_question_only_and_none(results):
    questions = make(results, kind="question_only")
    assert "Can you suggest a dinner recipe for me?" in questions.text
    assert "Plan a weekend activity with my pet near home." in questions.text
    assert questions.text.count("dinner recipe") == 1  # each question once
    assert "answered" not in questions.text and "memory" not in questions.text
    assert make(results, kind="none").text == ""


def test_restricting_to_one_period(results):
    feedback = make(results, periods=[0])
    assert "Period 0" in feedback.text
    assert "Period 1" not in feedback.text and "Period 2" not in feedback.text
    assert feedback.items_total == 4
