"""The episode runner end to end with scripted LMs: results, resume, off-policy replay,
concurrency, read-only evaluation, barriers, upper bound and the original-layout export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import (
    agent_responder,
    is_choice_call,
    make_environment,
    question_of,
    simulator_responder,
)

from evolve.core.errors import EnvironmentDataError, ResumeMismatchError
from evolve.simulator.baselines import compute_upper_bound
from evolve.simulator.evaluation import EpisodeConfig, ProgressSink, run_evaluation
from evolve.simulator.original_format import (
    OriginalDiagnosisMetrics,
    diagnosis_metrics,
    parse_diagnosis_results,
)
from evolve.simulator.records import Diagnosis
from evolve.simulator.run_dir import RunLayout
from memory_policies import NativePolicy


class Harness:
    """Scripted LMs for one run, with their call logs."""

    def __init__(self, agent=agent_responder, simulator=simulator_responder):
        self.agent = ScriptedLM(agent, model="agent-model")
        self.simulator = ScriptedLM(simulator, model="simulator-model")
        self.lms = scripted_role_lms(simulator=self.simulator, agent=self.agent)

    @property
    def calls(self) -> int:
        return len(self.agent.calls) + len(self.simulator.calls)


CONFIG = EpisodeConfig(rounds_initial=2, rounds_update=1, concurrency=1, seed=3)


def evaluate(tmp_path: Path, harness: Harness | None = None, policy=None, **kwargs):
    harness = harness or Harness()
    env = kwargs.pop("env", None) or make_environment(users=2)
    config = kwargs.pop("config", CONFIG)
    run_dir = kwargs.pop("run_dir", tmp_path / "run")
    report = run_evaluation(env, policy or NativePolicy(), harness.lms, run_dir, config, **kwargs)
    return report, harness


def comparable(report) -> list[dict]:
    """Results without timings (which legitimately differ between runs)."""
    return [
        p.model_dump(mode="json", exclude={"wall_time_s"}) for u in report.users for p in u.periods
    ]


def test_episode_results_calls_and_diagnosis(tmp_path):
    report, harness = evaluate(tmp_path)
    assert [u.user_id for u in report.users] == ["user-0", "user-1"]
    assert all(len(u.periods) == 3 for u in report.users)
    # Period 0 has 2 sessions x 2 rounds (1 follow-up each); later periods 1 round, no follow-up.
    assert len(harness.simulator.calls) == 2 * 2
    period0 = report.users[0].periods[0]
    assert [s.rounds_completed for s in period0.sessions] == [2, 2]
    assert period0.sessions[0].messages[0].content.startswith("[Current Time: 2024-01-05]\n")
    # Each distinct required variable is probed once per period (diet, city, pet), not per
    # question: 2 questions + 3 probes per user-period.
    choice_calls = [c for c in harness.agent.calls if is_choice_call(c)]
    assert len(choice_calls) == 2 * 3 * (2 + 3)
    probes = [question_of(c) for c in choice_calls if question_of(c).startswith("What is my")]
    assert sorted(set(probes)) == [
        "What is my current city?",
        "What is my current diet?",
        "What is my current pet?",
    ]
    assert len(probes) == 2 * 3 * 3
    # The latest-mention agent over the full history recalls everything: all correct.
    assert report.summary.accuracy == 1.0
    assert report.summary.n_items == 2 * 3 * 2
    assert all(p.correct for u in report.users for period in u.periods for p in period.probes)
    final = report.users[0].periods[2]
    assert final.items[0].chosen_state == ["keto"]
    assert final.items[1].chosen_state == ["Oslo", "cat"]
    assert final.state_updates == {"city": {"old": "Paris", "new": "Oslo"}}
    assert final.exposed_states == {"city": "Oslo"}
    assert "messages" in final.memory_description
    assert report.summary.memory_score is None  # no upper bound given
    assert report.summary.llm_calls == harness.calls
    assert report.usage["roles"]["agent"]["calls"] == len(harness.agent.calls)


def first_option_agent(call):
    """Always answers 1 (wrong whenever the gold option is not the first)."""
    return {"choice": 1} if is_choice_call(call) else agent_responder(call)


def test_wrong_answers_are_diagnosed(tmp_path):
    report, _ = evaluate(tmp_path, Harness(agent=first_option_agent))
    final = report.users[0].periods[2]
    diet_item, city_item = final.items
    # Gold diet is keto (option 3): the diet probe answers "vegan" (option 1) now and
    # also in period 1, when diet was last written: a write failure.
    assert diet_item.correct is False and diet_item.diagnosis is Diagnosis.WRITE
    # Gold (Oslo, cat) is option 2; city probe says Paris now and at its last write (period 2).
    assert city_item.diagnosis is Diagnosis.WRITE
    # Period 0: everything is option 1 and correct.
    assert all(i.correct for i in report.users[0].periods[0].items)
    s = report.summary
    total = s.write_failure_rate + s.read_failure_rate + s.utilization_failure_rate
    assert total == pytest.approx(1 - s.accuracy)


def test_unparseable_answers_are_wrong_and_flagged_without_fallback(tmp_path):
    def agent(call):
        return "garbage" if is_choice_call(call) else agent_responder(call)

    report, _ = evaluate(tmp_path, Harness(agent=agent))
    assert report.summary.accuracy == 0.0
    assert report.summary.parse_failures["answer"] == report.summary.n_items
    assert report.summary.parse_failures["probe"] == 2 * 3 * 3
    item = report.users[0].periods[0].items[0]
    assert item.parse_failed and item.chosen is None and item.parse_error


def test_resume_of_a_finished_run_makes_no_llm_call(tmp_path):
    first, harness = evaluate(tmp_path)
    assert harness.calls > 0
    second, again = evaluate(tmp_path)
    assert again.calls == 0
    assert comparable(second) == comparable(first)
    assert second.summary == first.summary.model_copy(update={"llm_calls": first.summary.llm_calls})


def test_resume_after_interruption_redoes_only_unfinished_work(tmp_path):
    first, _ = evaluate(tmp_path)
    layout = RunLayout(tmp_path / "run")
    # Interrupted after the sessions of user-1's last period, before its questions.
    layout.result_file("user-1", 2).unlink()
    second, harness = evaluate(tmp_path)
    assert harness.simulator.calls == []
    assert len(harness.agent.calls) == 2 + 3  # that unit's questions and probes only
    assert comparable(second) == comparable(first)
    # Interrupted before the checkpoint: the sessions are replayed live.
    layout.result_file("user-1", 2).unlink()
    layout.checkpoint_file("user-1", 2).unlink()
    third, harness = evaluate(tmp_path)
    assert len(harness.agent.calls) == 1 + 2 + 3  # 1 session x 1 round, then questions
    assert comparable(third) == comparable(first)


def test_resume_with_a_changed_config_is_refused(tmp_path):
    evaluate(tmp_path)
    with pytest.raises(ResumeMismatchError, match=r"episode\.rounds_update: 1 -> 2"):
        evaluate(tmp_path, config=CONFIG.model_copy(update={"rounds_update": 2}))
    changed = NativePolicy().with_components({"use": "Answer tersely."})
    with pytest.raises(ResumeMismatchError, match=r"policy\.components\.use"):
        evaluate(tmp_path, policy=changed)
    harness = Harness()
    harness.agent.model = "another-agent"
    with pytest.raises(ResumeMismatchError, match=r"models\.agent"):
        evaluate(tmp_path, harness)
    # Concurrency is an execution setting only: resuming with another value is fine.
    _, again = evaluate(tmp_path, config=CONFIG.model_copy(update={"concurrency": 3}))
    assert again.calls == 0


def test_concurrent_users_give_the_same_results_as_sequential(tmp_path):
    env = make_environment(users=5)
    sequential, _ = evaluate(tmp_path, env=env, run_dir=tmp_path / "seq")
    concurrent, _ = evaluate(
        tmp_path,
        env=env,
        run_dir=tmp_path / "par",
        config=CONFIG.model_copy(update={"concurrency": 4}),
    )
    assert comparable(concurrent) == comparable(sequential)
    assert concurrent.summary == sequential.summary


class MutatingPolicy(NativePolicy):
    """Breaks the read-only contract: answering appends to the memory it was given."""

    def answer(self, state, question, options=None):
        from memory_policies import Message

        state.short_term.append(Message(role="user", content="INJECTED BY ANSWER"))
        return super().answer(state, question, options)


def test_evaluation_never_mutates_the_memory_carried_forward(tmp_path):
    report, _ = evaluate(tmp_path)
    layout = RunLayout(tmp_path / "run")
    assert not any(p.evaluation_mutated_state for u in report.users for p in u.periods)
    # The checkpoint (before the questions) is the memory the next period starts from.
    checkpoint = json.loads(layout.checkpoint_file("user-0", 0).read_text())
    assert len(checkpoint["short_term"]) == 2 * 2 * 2

    bad, _ = evaluate(tmp_path, policy=MutatingPolicy(), run_dir=tmp_path / "bad")
    assert all(p.evaluation_mutated_state for u in bad.users for p in u.periods)
    for period in range(3):
        text = RunLayout(tmp_path / "bad").checkpoint_file("user-0", period).read_text()
        assert "INJECTED BY ANSWER" not in text


def test_off_policy_replay_from_a_previous_run_and_from_the_original_layout(tmp_path):
    on_policy, _ = evaluate(tmp_path)
    replayed, harness = evaluate(
        tmp_path, run_dir=tmp_path / "off", off_policy_dir=tmp_path / "run"
    )
    assert harness.simulator.calls == []
    # Native `observe` makes no LM call: only questions and probes reach the agent.
    assert all(is_choice_call(c) for c in harness.agent.calls)
    for on_user, off_user in zip(on_policy.users, replayed.users, strict=True):
        for on_period, off_period in zip(on_user.periods, off_user.periods, strict=True):
            assert off_period.off_policy and all(s.replayed for s in off_period.sessions)
            assert [s.messages for s in off_period.sessions] == [
                s.messages for s in on_period.sessions
            ]
            # Same messages in the same memory: the same answers.
            assert [i.chosen for i in off_period.items] == [i.chosen for i in on_period.items]

    original, _ = evaluate(
        tmp_path, run_dir=tmp_path / "off2", off_policy_dir=tmp_path / "run" / "original"
    )
    assert comparable(original) == comparable(replayed)


def test_off_policy_replay_rejects_transcripts_of_another_environment(tmp_path):
    evaluate(tmp_path)
    path = tmp_path / "run" / "original" / "user-0" / "interactions" / "period_01.json"
    sessions = json.loads(path.read_text())
    sessions[0][0]["content"] = "[Current Time: 1999]\nsomething else"
    path.write_text(json.dumps(sessions))
    with pytest.raises(EnvironmentDataError, match="different environment"):
        evaluate(tmp_path, run_dir=tmp_path / "off", off_policy_dir=tmp_path / "run" / "original")
    with pytest.raises(EnvironmentDataError, match="recorded transcripts"):
        evaluate(tmp_path, run_dir=tmp_path / "off3", off_policy_dir=tmp_path / "nowhere")


class Pruned(Exception):
    pass


def test_period_barrier_callback_can_stop_the_run_and_partial_results_resume(tmp_path):
    seen = []

    def on_period_end(period_index, summary):
        seen.append((period_index, summary.n_items))
        if period_index == 1:
            raise Pruned

    with pytest.raises(Pruned):
        evaluate(tmp_path, on_period_end=on_period_end)
    # Called after each period for all users, with the running summary.
    assert seen == [(0, 4), (1, 8)]
    layout = RunLayout(tmp_path / "run")
    assert layout.result_file("user-1", 1).exists()
    assert not layout.result_file("user-0", 2).exists()
    assert json.loads(layout.report_file.read_text())["complete"] is False
    report, harness = evaluate(tmp_path)
    assert len(harness.agent.calls) == 2 * (1 + 2 + 3)  # period 2 only
    assert report.complete and report.summary.n_items == 12


def test_a_resumed_run_reports_each_barrier_as_an_uninterrupted_run_does(tmp_path):
    """A retried tuning trial resumes a killed one's directory: its period-0 value (what a
    pruner compares) must cover period 0 only, not the later periods already on disk."""

    def recorder(seen):
        def on_period_end(period_index, summary):
            seen.append((period_index, summary.n_items, summary.accuracy))
            if period_index == 1 and len(seen) == 2 and seen is interrupted:
                raise Pruned

        return on_period_end

    uninterrupted, interrupted, resumed = [], [], []
    evaluate(tmp_path, run_dir=tmp_path / "reference", on_period_end=recorder(uninterrupted))
    with pytest.raises(Pruned):
        evaluate(tmp_path, on_period_end=recorder(interrupted))
    evaluate(tmp_path, on_period_end=recorder(resumed))
    assert resumed == uninterrupted


def test_concurrent_run_with_a_callback_waits_for_every_user_at_each_period(tmp_path):
    layout = RunLayout(tmp_path / "run")
    env = make_environment(users=4)
    users = [item.id for item in env.items]
    seen = []

    def on_period_end(period_index, summary):
        done_now = [layout.result_file(u, period_index).exists() for u in users]
        started_next = [layout.transcript_file(u, period_index + 1).exists() for u in users]
        seen.append((period_index, all(done_now), any(started_next), summary.n_items))

    config = CONFIG.model_copy(update={"concurrency": 4})
    evaluate(tmp_path, env=env, config=config, on_period_end=on_period_end)
    assert seen == [(0, True, False, 8), (1, True, False, 16), (2, True, False, 24)]


class RecordingProgress(ProgressSink):
    def __init__(self):
        self.events = []
        self.max_calls = 0

    def run_started(self, *, users, periods, finished_units):
        self.events.append(("start", users, periods, finished_units))

    def unit_finished(self, user_id, period_index, *, resumed):
        self.events.append(("unit", user_id, period_index, resumed))

    def llm_calls(self, total):
        self.max_calls = max(self.max_calls, total)

    def period_finished(self, period_index, summary):
        self.events.append(("period", period_index))


def test_progress_events(tmp_path):
    progress = RecordingProgress()
    _, harness = evaluate(tmp_path, progress=progress)
    assert progress.events[0] == ("start", 2, 3, 0)
    assert [e for e in progress.events if e[0] == "period"] == [("period", i) for i in range(3)]
    assert len([e for e in progress.events if e[0] == "unit"]) == 6
    assert progress.max_calls == harness.calls
    resumed = RecordingProgress()
    evaluate(tmp_path, progress=resumed)
    assert resumed.events[0] == ("start", 2, 3, 6)
    assert all(e[3] for e in resumed.events if e[0] == "unit")
    # Concurrent users with no callback run without barriers; periods still end in order.
    pipelined = RecordingProgress()
    config = CONFIG.model_copy(update={"concurrency": 3})
    _, harness = evaluate(tmp_path, run_dir=tmp_path / "par", config=config, progress=pipelined)
    assert [e for e in pipelined.events if e[0] == "period"] == [("period", i) for i in range(3)]
    assert len([e for e in pipelined.events if e[0] == "unit"]) == 6
    assert pipelined.max_calls == harness.calls


def upper_bound_agent(call):
    """Given the state explicitly, picks the option naming it (except for Rome/dog)."""
    from simulator.eval_helpers import latest_mention_choice, output_fields, sections

    if "choice" in output_fields(call.system) and "known_state" in sections(call.user):
        inputs = sections(call.user)
        return {"choice": latest_mention_choice(inputs["known_state"], inputs["options"])}
    return agent_responder(call)


def test_upper_bound_is_cached_and_gives_a_memory_score(tmp_path):
    env = make_environment(users=2)
    harness = Harness(agent=upper_bound_agent)
    table = compute_upper_bound(env, harness.lms, tmp_path / "cache")
    # One call per question x variant: (3 + 3) per user.
    assert len(harness.agent.calls) == 2 * 6
    assert len(table.entries) == 12 and table.parse_failures == 0
    again = Harness(agent=upper_bound_agent)
    assert compute_upper_bound(env, again.lms, tmp_path / "cache") == table
    assert again.calls == 0
    report, _ = evaluate(tmp_path, Harness(agent=upper_bound_agent), env=env, upper_bound=table)
    s = report.summary
    # Told {"city": "Oslo", "pet": "cat"}, the scripted agent ties "cat" between the Paris and
    # Oslo options and picks Paris: in period 2 the upper bound misses question 1 (UB 1/2).
    assert s.upper_bound_score == pytest.approx(10 / 12)
    assert s.random_score == pytest.approx(1 / 3) and s.accuracy == 1.0
    # Per period (both users, 4 questions) (acc - 1/3) / (UB - 1/3): periods 0, 1 -> 1;
    # period 2's UB 2/4 is 0.67 questions above random, under the 2-question margin: none
    # (the ratio would read 4.0).
    assert [p.memory_score for p in report.per_period] == [
        pytest.approx(1.0),
        pytest.approx(1.0),
        None,
    ]
    # Over all 12 items: (1 - 1/3) / (10/12 - 1/3); above 1 only because the accuracy is above
    # the upper bound.
    assert s.memory_score == pytest.approx((1 - 1 / 3) / (10 / 12 - 1 / 3))
    assert (tmp_path / "run" / "upper_bound.json").exists()
    assert all(
        i.upper_bound_correct is not None for u in report.users for p in u.periods for i in p.items
    )


def test_original_layout_export_has_the_expected_shapes(tmp_path):
    report, _ = evaluate(tmp_path)
    root = tmp_path / "run" / "original" / "user-0"
    overall = json.loads((root / "overall_results.json").read_text())
    assert len(overall) == 3 and all(len(row) == 2 for row in overall)
    entry = overall[2][1]
    assert entry["answer"] == 1 and entry["response"] == 2  # original: 0-based / 1-based
    assert entry["answer_state"] == ["Oslo", "cat"] and entry["json_error"] is False
    metrics = json.loads((root / "overall_metrics.json").read_text())
    assert metrics["accuracy"] == [[1.0, 1.0]] * 3
    # The original's diagnosis under the original's names and schema ...
    diagnosis = OriginalDiagnosisMetrics.model_validate_json(
        (root / "diagnosis_metrics.json").read_text()
    )
    assert diagnosis.memory_success == [[1, 1]] * 3
    assert diagnosis.write_failure == diagnosis.read_failure == [[0, 0]] * 3
    diagnosis_results = parse_diagnosis_results(
        json.loads((root / "diagnosis_results.json").read_text())
    )
    assert len(diagnosis_results) == 3 and all(len(row) == 2 for row in diagnosis_results)
    assert diagnosis_metrics(diagnosis_results) == diagnosis
    # ... ours under its own name.
    partition = json.loads((root / "failure_partition.json").read_text())
    assert len(partition["periods"]) == 3 and len(partition["periods"][0]["probes"]) == 3
    assert {i["diagnosis"] for p in partition["periods"] for i in p["items"]} == {"correct"}
    interactions = json.loads((root / "interactions" / "period_00.json").read_text())
    assert len(interactions) == 2 and len(interactions[0]) == 4
    assert set(interactions[0][0]) == {"role", "content"}
    random_metrics = json.loads((tmp_path / "run" / "original" / "random_metrics.json").read_text())
    assert len(random_metrics["accuracy"]) == 2  # [user][period][question]
    assert len(random_metrics["accuracy"][0]) == 3 and len(random_metrics["accuracy"][0][0]) == 2
    stored = json.loads((tmp_path / "run" / "report.json").read_text())
    assert stored["summary"]["accuracy"] == report.summary.accuracy and "users" not in stored


@pytest.mark.integration
def test_tiny_environment_end_to_end_with_the_embedded_model(tmp_path, episode_lms_embedded):
    from evolve.simulator.synthesis.offline import synthesize_environment
    from evolve.simulator.synthesis.presets import PRESETS

    preset = PRESETS["tiny"]
    env = synthesize_environment(preset, seed=0, num_users=1)
    lms = episode_lms_embedded
    table = compute_upper_bound(env, lms, tmp_path / "cache")
    config = EpisodeConfig(
        rounds_initial=preset.rounds_initial, rounds_update=2, concurrency=1, seed=0
    )
    report = run_evaluation(env, NativePolicy(), lms, tmp_path / "run", config, upper_bound=table)
    item = env.items[0]
    (user,) = report.users
    assert len(user.periods) == len(item.periods)
    for period, env_period in zip(user.periods, item.periods, strict=True):
        assert len(period.sessions) == len(env_period.sessions)
        for session in period.sessions:
            assert session.messages[0].content.startswith("[Current Time: ")
            # Real replies and (in later periods) real follow-ups, or a counted failure.
            assert all(m.content.strip() for m in session.messages if m.role == "assistant")
            assert session.rounds_completed == session.rounds_planned or session.ended_early
        assert len(period.items) == len(item.qas)
        for result in period.items:
            assert (result.chosen is not None) != result.parse_failed
            assert result.diagnosis in Diagnosis
    s = report.summary
    assert s.n_items == len(item.periods) * len(item.qas)
    assert s.accuracy is not None and 0.0 <= s.accuracy <= 1.0
    assert s.upper_bound_score is not None and s.random_score is not None
    total = s.write_failure_rate + s.read_failure_rate + s.utilization_failure_rate
    assert total == pytest.approx(1 - s.accuracy)
    usage = lms.usage.snapshot()
    assert usage.total_calls > 0
    if usage.cache_hits < usage.total_calls:  # a warm response cache bills nothing
        assert s.llm_calls > 0 and s.tokens > 0
    # Resuming the finished run makes no call to the real model.
    before = lms.usage.snapshot().total_calls
    again = run_evaluation(env, NativePolicy(), lms, tmp_path / "run", config, upper_bound=table)
    assert lms.usage.snapshot().total_calls == before
    assert again.summary == report.summary


def test_resume_of_a_finished_run_leaves_its_report_as_written(tmp_path):
    evaluate(tmp_path)
    layout = RunLayout(tmp_path / "run")
    written = layout.report_file.read_text(encoding="utf-8")
    assert json.loads(written)["usage"]["roles"]["agent"]["calls"] > 0
    second, harness = evaluate(tmp_path)
    assert harness.calls == 0 and second.complete
    assert layout.report_file.read_text(encoding="utf-8") == written  # its usage kept


def test_a_finished_run_whose_report_says_incomplete_writes_it_again(tmp_path):
    evaluate(tmp_path)
    layout = RunLayout(tmp_path / "run")
    stored = json.loads(layout.report_file.read_text(encoding="utf-8"))
    layout.report_file.write_text(json.dumps({**stored, "complete": False}), encoding="utf-8")
    evaluate(tmp_path)
    assert json.loads(layout.report_file.read_text(encoding="utf-8"))["complete"] is True


def test_a_resumed_unfinished_run_writes_its_report_again(tmp_path):
    evaluate(tmp_path)
    layout = RunLayout(tmp_path / "run")
    written = layout.report_file.read_text(encoding="utf-8")
    layout.result_file("user-1", 2).unlink()  # interrupted before its last questions
    _, harness = evaluate(tmp_path)
    assert harness.calls > 0
    assert layout.report_file.read_text(encoding="utf-8") != written


def test_a_finished_run_given_a_new_upper_bound_writes_its_report_again(tmp_path):
    env = make_environment(users=2)
    table = compute_upper_bound(env, Harness(agent=upper_bound_agent).lms, tmp_path / "cache")
    evaluate(tmp_path, env=env, upper_bound=table)
    layout = RunLayout(tmp_path / "run")
    stored = json.loads(layout.upper_bound_file.read_text(encoding="utf-8"))
    changed = {**stored, "entries": dict(list(stored["entries"].items())[1:])}
    layout.upper_bound_file.write_text(json.dumps(changed), encoding="utf-8")
    report = json.loads(layout.report_file.read_text(encoding="utf-8"))
    report["summary"]["upper_bound_score"] = None  # what a stale report would keep
    layout.report_file.write_text(json.dumps(report), encoding="utf-8")
    evaluate(tmp_path, env=env, upper_bound=table)
    rewritten = json.loads(layout.report_file.read_text(encoding="utf-8"))
    assert rewritten["summary"]["upper_bound_score"] is not None
    assert json.loads(layout.upper_bound_file.read_text(encoding="utf-8")) == stored
