"""Probes and both diagnoses under each protocol, the probe scope, and the added scores
(scripted LMs, no server)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import (
    agent_responder,
    is_choice_call,
    make_environment,
    output_fields,
    question_of,
    sections,
    simulator_responder,
)
from simulator.result_helpers import item, period

from evolve.simulator.evaluation import EpisodeConfig, run_evaluation
from evolve.simulator.metrics import summarize
from evolve.simulator.original_format import (
    OriginalDiagnosisMetrics,
    diagnosis_metrics,
    parse_diagnosis_results,
)
from evolve.simulator.records import Diagnosis, UserResult
from memory_policies import NativePolicy

PAPER = EpisodeConfig(protocol="paper", rounds_initial=1, rounds_update=1, concurrency=1)
_SCHEMA_IN_PROBE = re.compile(r"\{\n.*?\n\}", re.S)


def is_structured_probe(call) -> bool:
    return "reply" in output_fields(call.system) and "JSON object" in sections(call.user).get(
        "user_message", ""
    )


def recalling_agent(call):
    """Multiple choice as the shared scripted agent; the structured probe recalls diet
    wrongly always, city as Paris always (wrong once the user moved), and pet as cat until
    Oslo is mentioned, then dog (so pet, right when written, is a read failure later)."""
    if not is_structured_probe(call):
        return agent_responder(call)
    inputs = sections(call.user)
    schema = json.loads(_SCHEMA_IN_PROBE.search(inputs["user_message"]).group(0))
    moved = "oslo" in inputs.get("conversation", "").lower()
    recalled = {"diet": "omnivore", "city": "Paris", "pet": "dog" if moved else "cat"}
    return {"reply": "```json\n" + json.dumps({v: recalled[v] for v in schema}) + "\n```"}


def run(tmp_path, config, agent=recalling_agent):
    lm = ScriptedLM(agent, model="agent-model")
    lms = scripted_role_lms(simulator=ScriptedLM(simulator_responder), agent=lm)
    env = make_environment(users=1)
    report = run_evaluation(env, NativePolicy(), lms, tmp_path / "run", config)
    return report, lm


def test_paper_probes_once_per_question_and_diagnoses_as_the_original(tmp_path):
    report, lm = run(tmp_path, PAPER)
    periods = report.users[0].periods
    # One structured probe per question and period, no per-variable probe (no double probing).
    assert sum(map(is_structured_probe, lm.calls)) == 2 * 3
    choice_questions = [question_of(c) for c in lm.calls if is_choice_call(c)]
    assert len(choice_questions) == 2 * 3
    assert not any(q.startswith("What is my") for q in choice_questions)
    assert all(p.probes == [] and len(p.question_probes) == 2 for p in periods)
    # Each probe shows only its question's variables, with every possible value.
    shown = [
        json.loads(_SCHEMA_IN_PROBE.search(sections(c.user)["user_message"]).group(0))
        for c in lm.calls
        if is_structured_probe(c)
    ]
    assert shown[:2] == [
        {"diet": ["vegan", "omnivore", "keto"]},
        {"city": ["Paris", "Oslo", "Rome"], "pet": ["cat", "dog", "parrot"]},
    ]
    root = tmp_path / "run" / "original" / "user-0"
    stored = OriginalDiagnosisMetrics.model_validate_json(
        (root / "diagnosis_metrics.json").read_text()
    )
    expected = OriginalDiagnosisMetrics(
        write_failure=[[1, 0], [1, 0], [1, 1]],
        read_failure=[[0, 0], [0, 0], [0, 1]],
        memory_success=[[0, 1], [0, 1], [0, 0]],
    )
    assert stored == expected
    results = parse_diagnosis_results(json.loads((root / "diagnosis_results.json").read_text()))
    assert diagnosis_metrics(results) == expected
    pet = results[2][1].results[1]
    assert (pet.info_type, pet.write_pos, pet.read_pos, pet.response_state) == ("pet", 0, 2, "dog")
    s = report.summary
    assert s.original_write_failures == pytest.approx(4 / 6)
    assert s.original_read_failures == pytest.approx(1 / 6)
    assert s.memory_success == pytest.approx(2 / 6)
    # Our partition is derived from the same probes, and kept under its own name.
    assert s.write_failure_rate + s.read_failure_rate + s.utilization_failure_rate == (
        pytest.approx(1 - s.accuracy)
    )
    assert (root / "failure_partition.json").exists()


def test_unparseable_structured_probe_is_a_json_error_for_every_variable(tmp_path):
    def garbled(call):
        return {"reply": "I am not sure."} if is_structured_probe(call) else agent_responder(call)

    report, _ = run(tmp_path, PAPER, agent=garbled)
    probe = report.users[0].periods[0].question_probes[1]
    assert probe.parse_failed and [r.missing for r in probe.recalls] == [True, True]
    assert report.summary.memory_success == 0.0
    assert report.summary.parse_failures["probe"] == 2 * 3


def test_wrong_only_probes_only_variables_of_wrong_items(tmp_path):
    def wrong_diet(call):
        answer = agent_responder(call)
        if is_choice_call(call) and question_of(call).startswith("Can you suggest"):
            return {"choice": 2}  # omnivore: always wrong
        return answer

    config = EpisodeConfig(rounds_initial=1, rounds_update=1, concurrency=1, probes="wrong_only")
    report, lm = run(tmp_path, config, agent=wrong_diet)
    probed = [question_of(c) for c in lm.calls if question_of(c).startswith("What is my")]
    # Only diet's question is wrong: diet is probed, city and pet never are.
    assert probed == ["What is my current diet?"] * 3
    assert all(p.probe_scope == "wrong_only" for p in report.users[0].periods)
    assert report.summary.memory_success is None
    root = tmp_path / "run" / "original" / "user-0"
    assert not (root / "diagnosis_metrics.json").exists()
    partition = json.loads((root / "failure_partition.json").read_text())
    diagnoses = [i["diagnosis"] for p in partition["periods"] for i in p["items"]]
    assert diagnoses.count("correct") == 3 and "correct" not in diagnoses[0::2]


def test_wrong_only_is_refused_under_paper():
    with pytest.raises(ValidationError, match="refused under protocol 'paper'"):
        EpisodeConfig(protocol="paper", probes="wrong_only")


def test_accuracy_with_random_fallback_credits_unparseable_answers_their_random_score():
    items = [
        item(0, True, Diagnosis.CORRECT),
        item(1, False, Diagnosis.WRITE, parse_failed=True),  # 4 options: 1/4 expected
        item(2, False, Diagnosis.WRITE),
    ]
    s = summarize([UserResult(user_id="u", periods=[period(0, items)])])
    assert s.accuracy == pytest.approx(1 / 3)
    assert s.accuracy_with_random_fallback == pytest.approx((1 + 0.25) / 3)


def test_the_papers_formula_gives_no_score_where_the_upper_bound_is_below_random():
    # Period 0: S 3/3, random 1/4, UB 3/3 -> 1. Period 1: S 0, UB 0 < random. The reference
    # divides by the negative room, (0 - 1/4) / (0 - 1/4) = 1, and its plain mean reads 1.00
    # at zero accuracy; under our rule period 1 has no score, and 1 of 2 periods without one
    # leaves the mean undefined.
    good = [item(q, True, Diagnosis.CORRECT) for q in range(3)]
    below = [item(q, False, Diagnosis.WRITE, ub=False) for q in range(3)]
    user = UserResult(user_id="u", periods=[period(0, good), period(1, below)])
    s = summarize([user])
    assert s.degenerate_periods == 1
    assert s.memory_score_original is None and s.memory_score_period_mean is None
    alone = summarize([UserResult(user_id="u", periods=[period(0, good)])])
    assert alone.memory_score_original == pytest.approx(1.0)


def test_original_memory_score_is_undefined_where_the_original_divides_by_zero():
    # UB = random exactly: 2 options with one gold, the UB right on one of two items.
    items = [
        item(0, True, Diagnosis.CORRECT, n_options=2),
        item(1, True, Diagnosis.CORRECT, n_options=2, ub=False),
    ]
    s = summarize([UserResult(user_id="u", periods=[period(0, items)])])
    assert s.upper_bound_score == pytest.approx(0.5) and s.memory_score_original is None


def test_a_spec_with_wrong_only_probes_is_refused_under_paper_and_resolved_under_evolve():
    import tomllib

    from evolve.core.errors import ConfigError
    from evolve.spec.config import resolve, spec_from_dict

    quickstart = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.toml"
    data = tomllib.loads(quickstart.read_text())
    data["episode"] = {**data.get("episode", {}), "probes": "wrong_only"}
    with pytest.raises(ConfigError, match="wrong_only.*refused under protocol 'paper'"):
        spec_from_dict({**data, "protocol": "paper"})
    spec = spec_from_dict({**data, "protocol": "evolve"}, source=quickstart)
    assert resolve(spec).episode.probes == "wrong_only"
