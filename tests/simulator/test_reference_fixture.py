"""Fidelity against the reference AMemGym code's own outputs (no LLM, exact equality).

`tests/fixtures/reference_output/` holds OUTPUT files of one run of the reference code
(AGI-Eval-Official/amemgym @ ffcd188, unchanged) on `environment.json` (the fidelity preset,
seed 0: 3 users, 4 periods, 8 questions of 2 to 4 options, 3-round later sessions) against
the scripted stub (`benchmarks/stub_openai_server.py --scripted`): native, AWI, AWE and RAG
(overall + diagnosis), the upper bound, the random baseline and the per-user AWI evolution
chains with question-only and complete feedback. See the fixture's README and
docs/reference/reference-run.md.

Every figure is recomputed here from per-item records: the answer (parsed from the raw reply
with the reference's rule) against the gold state of the environment, the probe's values
against the period's state. The reference's own score fields are never read; its metric
files are compared exactly with the recomputation and with this toolkit's metric code.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from scripted_lm import ScriptedLM, scripted_role_lms
from simulator.eval_helpers import agent_responder, simulator_responder

import evolve.commands.eval as eval_command
from evolve.cli import main
from evolve.simulator import metrics
from evolve.simulator.environment import EnvironmentItem, load_environment
from evolve.simulator.evaluation import last_update_period
from evolve.simulator.metrics import MetricSummary, summarize
from evolve.simulator.original_format import (
    OriginalDiagnosisMetrics,
    diagnosis_metrics,
    parse_diagnosis_results,
    parse_overall_results,
    period_results_from_original,
)
from evolve.simulator.records import UserResult
from memory_policies.paper import load_reference_json

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "reference_output"
AGENTS = ["native", "awi", "awe", "rag"]
CHAIN = "evolution-question_only"
ENV = load_environment(FIXTURE / "environment.json")
USERS = [item.id for item in ENV.items]
RUNS = [(agent, user) for agent in AGENTS for user in USERS]


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def item_of(user: str) -> EnvironmentItem:
    return next(item for item in ENV.items if item.id == user)


def gold_state(item: EnvironmentItem, period: int, question: int) -> list[str]:
    state = item.periods[period].state
    return [str(state[variable]) for variable in item.qas[question].required_info]


def option_state(item: EnvironmentItem, question: int, number: int) -> list[str]:
    return [str(v) for v in item.qas[question].answer_choices[number - 1].state]


def load_cross_check():
    """`benchmarks/cross_check.py` as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "cross_check", FIXTURE.parents[2] / "benchmarks" / "cross_check.py"
    )
    cross_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cross_check)
    return cross_check


def reference_answer(raw: str) -> int | None:
    """The option number as the reference reads it (`parse_json(raw)["answer"]`), or None."""
    try:
        return int(load_reference_json(raw)["answer"])
    except (ValueError, KeyError, TypeError):
        return None


def reference_probe(raw: str) -> dict[str, Any]:
    """The probe's values as the reference reads them ({} when unparseable)."""
    try:
        values = load_reference_json(raw)
    except ValueError:
        return {}
    return values if isinstance(values, dict) else {}


def recomputed_accuracy(item: EnvironmentItem, results: list[list[dict]]) -> list[list[float]]:
    """Per period and question: 1.0 when the option the reference scored (its parse, or its
    random draw after a parse failure) holds the gold state; the record must agree with the
    raw reply about which it was."""
    matrix = []
    for period, row in enumerate(results):
        cells = []
        for question, entry in enumerate(row):
            parsed = reference_answer(entry["raw_response"])
            assert entry["json_error"] == (parsed is None), entry["raw_response"]
            if parsed is not None:
                assert entry["response"] == parsed
            chosen = option_state(item, question, entry["response"])
            cells.append(float(chosen == gold_state(item, period, question)))
        matrix.append(cells)
    return matrix


@pytest.mark.parametrize(("agent", "user"), RUNS)
def test_overall_accuracy_recomputed_from_answers_and_gold_equals_the_reference(agent, user):
    user_dir = FIXTURE / agent / user
    item = item_of(user)
    raw = load(user_dir / "overall_results.json")
    assert recomputed_accuracy(item, raw) == load(user_dir / "overall_metrics.json")["accuracy"]
    # Our metric code on the same records scores each answer as the reference did (a parse
    # failure is recorded as one, with the reference's random draw scored as drawn).
    periods = period_results_from_original(item, parse_overall_results(raw))
    summary = summarize([UserResult(user_id=user, periods=periods)])
    assert summary.accuracy == mean(v for row in recomputed_accuracy(item, raw) for v in row)
    assert summary.parse_failures.get("answer", 0) == sum(e["json_error"] for r in raw for e in r)
    # The reference's random baseline: the mean over options of holding the gold state.
    index = USERS.index(user)
    random_matrix = load(FIXTURE / "random_metrics.json")["accuracy"][index]
    assert random_matrix == [
        [
            mean(
                option_state(item, q, n) == gold_state(item, p, q)
                for n in range(1, len(item.qas[q].answer_choices) + 1)
            )
            for q in range(len(item.qas))
        ]
        for p in range(len(item.periods))
    ]
    assert summary.random_score == mean(v for row in random_matrix for v in row)


def test_the_fixture_exercises_the_random_fallback():
    errors = [
        entry["json_error"]
        for agent, user in RUNS
        for row in load(FIXTURE / agent / user / "overall_results.json")
        for entry in row
    ]
    assert any(errors) and not all(errors)


def recomputed_diagnosis(item: EnvironmentItem, results: list[list[dict]]) -> dict[str, list]:
    """The original's write / read failures and memory success from the probes' values
    against the period's state (the write score: the same question's probe at the period
    that last updated the variable)."""
    scores: list[list[list[bool]]] = []
    for period, row in enumerate(results):
        scores.append([])
        for question, entry in enumerate(row):
            values = reference_probe(entry["raw_response"])
            state = item.periods[period].state
            cells = []
            for position, variable in enumerate(item.qas[question].required_info):
                recall = entry["results"][position]
                assert recall["info_type"] == variable
                assert recall["json_error"] == (variable not in values)
                assert recall["answer_state"] == state[variable]
                assert recall["write_pos"] == last_update_period(item, variable, period)
                cells.append(values.get(variable) == state[variable])
            scores[period].append(cells)
    metrics: dict[str, list] = {"write_failure": [], "read_failure": [], "memory_success": []}
    for period, row in enumerate(scores):
        writes_row, reads_row, success_row = [], [], []
        for question, cells in enumerate(row):
            writes = reads = 0
            for position, correct in enumerate(cells):
                if correct:
                    continue
                variable = item.qas[question].required_info[position]
                written = last_update_period(item, variable, period)
                if scores[written][question][position]:
                    reads += 1
                else:
                    writes += 1
            writes_row.append(writes)
            reads_row.append(reads)
            success_row.append(int(writes == 0 and reads == 0))
        metrics["write_failure"].append(writes_row)
        metrics["read_failure"].append(reads_row)
        metrics["memory_success"].append(success_row)
    return metrics


@pytest.mark.parametrize(("agent", "user"), RUNS)
def test_diagnosis_recomputed_from_probes_and_state_equals_the_reference(agent, user):
    user_dir = FIXTURE / agent / user
    item = item_of(user)
    raw = load(user_dir / "diagnosis_results.json")
    stored = load(user_dir / "diagnosis_metrics.json")
    assert recomputed_diagnosis(item, raw) == stored
    # Our metric code reproduces it, and so do the records every evaluation reports.
    stored_metrics = OriginalDiagnosisMetrics.model_validate(stored)
    assert diagnosis_metrics(parse_diagnosis_results(raw)) == stored_metrics
    overall = parse_overall_results(load(user_dir / "overall_results.json"))
    periods = period_results_from_original(item, overall, parse_diagnosis_results(raw))
    summary = summarize([UserResult(user_id=user, periods=periods)])
    means = stored_metrics.means()
    assert summary.original_write_failures == means["write_failure"]
    assert summary.original_read_failures == means["read_failure"]
    assert summary.memory_success == means["memory_success"]


def test_the_fixture_has_write_failures_read_failures_and_successes():
    totals = {"write_failure": 0, "read_failure": 0, "memory_success": 0}
    for agent, user in RUNS:
        for key, matrix in load(FIXTURE / agent / user / "diagnosis_metrics.json").items():
            totals[key] += sum(v for row in matrix for v in row)
    assert all(totals.values()), totals


def recomputed_upper_bound(results: list) -> list:
    """Per user, period and question: the upper-bound answer for the gold variant (its state
    given) holds that state."""
    matrix = []
    for index, item in enumerate(ENV.items):
        scores = {}
        for question, variants in enumerate(results[index]):
            for variant, entry in enumerate(variants):
                parsed = reference_answer(entry["raw_response"])
                assert entry["json_error"] == (parsed is None)
                if parsed is not None:
                    assert entry["response"] == parsed
                given = option_state(item, question, variant + 1)
                scores[question, variant] = float(
                    option_state(item, question, entry["response"]) == given
                )
        user_rows = []
        for period in range(len(item.periods)):
            row = []
            for question, qa in enumerate(item.qas):
                gold = gold_state(item, period, question)
                variant = next(
                    v
                    for v, choice in enumerate(qa.answer_choices)
                    if [str(s) for s in choice.state] == gold
                )
                row.append(scores[question, variant])
            user_rows.append(row)
        matrix.append(user_rows)
    return matrix


def test_upper_bound_recomputed_from_answers_equals_the_reference():
    (model_dir,) = (FIXTURE / "upperbound").iterdir()
    results = load(model_dir / "utilization_results.json")
    stored = load(model_dir / "utilization_metrics.json")["accuracy"]
    assert recomputed_upper_bound(results) == stored


@pytest.fixture
def formula_only(monkeypatch):
    """The paper's formula without our margin rule (a user-period whose upper bound is not
    clearly above random has no memory score: kept row memory_score_margin), so that the
    formula itself is compared with the reference's on the fixture's small periods."""
    monkeypatch.setattr(metrics, "MARGIN_QUESTIONS", 0.0)
    monkeypatch.setattr(metrics, "MARGIN_STANDARD_ERRORS", 0.0)


@pytest.mark.parametrize("agent", AGENTS)
def test_cross_check_scores_the_reference_layout_with_our_metric_code(agent, formula_only):
    cross_check = load_cross_check()
    (model_dir,) = (FIXTURE / "upperbound").iterdir()
    users, notes = cross_check.reference_results(FIXTURE, ENV, agent, model_dir.name)
    assert list(users) == USERS and notes == {}
    summary = summarize(list(users.values()))
    ub = recomputed_upper_bound(load(model_dir / "utilization_results.json"))
    assert summary.upper_bound_score == mean(v for user in ub for row in user for v in row)
    # The paper's number against the reference's own: utils/plot_figure.py averages, per
    # user-period, (S - S_random) / (S_UB - S_random) from the metric files, S scoring an
    # unparseable answer as its random draw (eval/overall.py). Ours gives it its expected
    # score (1 / #options; kept row paper_number_expected_value), so the two differ by
    # exactly the draws' luck: per failure, (1 / #options - draw) / (#questions * (S_UB -
    # S_random)) in its user-period, averaged over user-periods; nothing else.
    reference_number = reference_memory_score(agent, model_dir)
    luck = []
    for index, user in enumerate(USERS):
        item = item_of(user)
        results = load(FIXTURE / agent / user / "overall_results.json")
        drawn = recomputed_accuracy(item, results)
        random_row = load(FIXTURE / "random_metrics.json")["accuracy"][index]
        for period, row in enumerate(drawn):
            denominator = mean(ub[index][period]) - mean(random_row[period])
            luck.append(
                sum(
                    (1 / len(item.qas[q].answer_choices) - score) / (len(row) * denominator)
                    for q, score in enumerate(row)
                    if results[period][q]["json_error"]
                )
            )
    assert summary.memory_score_original == pytest.approx(reference_number + mean(luck), abs=1e-9)
    assert any(luck), "the fixture must hold draws that moved the reference's number"


def reference_memory_score(agent: str, model_dir: Path) -> float:
    """The reference's realised number (utils/plot_figure.py) from its metric files only."""
    per_period = []
    random_matrix = load(FIXTURE / "random_metrics.json")["accuracy"]
    ub_matrix = load(model_dir / "utilization_metrics.json")["accuracy"]
    for index, user in enumerate(USERS):
        accuracy = load(FIXTURE / agent / user / "overall_metrics.json")["accuracy"]
        for period, row in enumerate(accuracy):
            s_random = mean(random_matrix[index][period])
            s_ub = mean(ub_matrix[index][period])
            per_period.append((mean(row) - s_random) / (s_ub - s_random))
    return mean(per_period)


def test_the_papers_number_equals_the_references_where_no_answer_failed_to_parse(formula_only):
    """Every user-period without an unparseable answer contributes the same term to our
    paper's number as to the reference's: shown on the fixture's records with the draws'
    scores replaced by their expected value on the reference's side."""
    cross_check = load_cross_check()
    (model_dir,) = (FIXTURE / "upperbound").iterdir()
    for agent in AGENTS:
        users, _ = cross_check.reference_results(FIXTURE, ENV, agent, model_dir.name)
        clean = [
            (index, period.period_index)
            for index, user in enumerate(USERS)
            for period in users[user].periods
            if not any(i.parse_failed for i in period.items)
        ]
        assert clean, agent
        random_matrix = load(FIXTURE / "random_metrics.json")["accuracy"]
        ub_matrix = load(model_dir / "utilization_metrics.json")["accuracy"]
        for index, period in clean:
            user = USERS[index]
            single = UserResult(user_id=user, periods=[users[user].periods[period]])
            ours = summarize([single]).memory_score_original
            row = load(FIXTURE / agent / user / "overall_metrics.json")["accuracy"][period]
            s_random = mean(random_matrix[index][period])
            theirs = (mean(row) - s_random) / (mean(ub_matrix[index][period]) - s_random)
            assert ours == pytest.approx(theirs, abs=1e-9), (agent, user, period)


def test_the_papers_number_differs_from_the_references_only_by_its_random_draws(formula_only):
    """Where answers failed to parse, the reference scores its random draw (0 or 1) and ours
    the draw's expected value, 1 / #options (kept row paper_number_expected_value): per
    user-period, the reference's term minus ours is exactly the draws' surplus over their
    expected values, over the questions, divided by the period's upper bound minus random."""
    cross_check = load_cross_check()
    (model_dir,) = (FIXTURE / "upperbound").iterdir()
    random_matrix = load(FIXTURE / "random_metrics.json")["accuracy"]
    ub_matrix = load(model_dir / "utilization_metrics.json")["accuracy"]
    compared = 0
    for agent in AGENTS:
        users, _ = cross_check.reference_results(FIXTURE, ENV, agent, model_dir.name)
        for index, user in enumerate(USERS):
            results = load(FIXTURE / agent / user / "overall_results.json")
            accuracy = load(FIXTURE / agent / user / "overall_metrics.json")["accuracy"]
            for period, row in enumerate(results):
                draws = [
                    accuracy[period][q] - random_matrix[index][period][q]
                    for q, entry in enumerate(row)
                    if entry["json_error"]
                ]
                if not draws:
                    continue
                single = UserResult(user_id=user, periods=[users[user].periods[period]])
                ours = summarize([single]).memory_score_original
                s_random = mean(random_matrix[index][period])
                span = mean(ub_matrix[index][period]) - s_random
                theirs = (mean(accuracy[period]) - s_random) / span
                assert theirs - ours == pytest.approx(sum(draws) / len(row) / span, abs=1e-9)
                compared += 1
    assert compared  # the fixture has user-periods with random draws


def test_the_question_only_evolution_chain_shows_questions_and_memories_only():
    for user in USERS:
        item = item_of(user)
        user_dir = FIXTURE / CHAIN / user
        results = load(user_dir / "overall_results.json")
        accuracy = load(user_dir / "overall_metrics.json")["accuracy"]
        assert recomputed_accuracy(item, results) == accuracy
        history = load(user_dir / "evolution_history.json")
        assert [step["step_id"] for step in history] == list(range(len(item.periods)))
        for period, step in enumerate(history):
            assert len(step["feedback"]) == len(item.qas)
            for question, entry in enumerate(step["feedback"]):
                qa = item.qas[question]
                assert set(entry) == {"question", "retrieved_memories"}
                assert entry["question"] == f"Question: {qa.query};"
                assert entry["retrieved_memories"] == results[period][question]["relevant_memories"]
                assert not any(choice.answer in entry["question"] for choice in qa.answer_choices)
            assert step["changes"]["memory_update_prompt"]  # the reflector's list of changes
    # The memories the reflector saw are the chain's own (non-empty after the first writes).
    assert any(
        entry["retrieved_memories"]
        for user in USERS
        for step in load(FIXTURE / CHAIN / user / "evolution_history.json")
        for entry in step["feedback"]
    )


@pytest.fixture
def scripted(monkeypatch):
    agent = ScriptedLM(agent_responder, model="agent-model")

    @contextlib.contextmanager
    def fake_open(args, rules=None):
        yield scripted_role_lms(simulator=ScriptedLM(simulator_responder), agent=agent)

    monkeypatch.setattr(eval_command, "open_role_lms_from_args", fake_open)
    return agent


def test_evolve_eval_off_policy_loads_and_scores_the_reference_interactions(
    tmp_path, scripted, capsys
):
    argv = ["eval", "--env", str(FIXTURE / "environment.json"), "--policy", "native"]
    argv += ["--off-policy", str(FIXTURE / "native"), "--no-upper-bound"]
    argv += ["--concurrency", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    report = load(tmp_path / "out" / "native" / "report.json")
    n_items = sum(len(item.qas) * len(item.periods) for item in ENV.items)
    assert report["summary"]["n_items"] == n_items and report["complete"]
    for item in ENV.items:
        user = item.id
        for period in range(len(item.periods)):
            name = f"period_{period:02d}"
            replayed = load(tmp_path / "out" / "native" / "users" / user / name / "result.json")
            recorded = load(FIXTURE / "native" / user / "interactions" / f"{name}.json")
            assert [[m["content"] for m in s["messages"]] for s in replayed["sessions"]] == [
                [m["content"] for m in s] for s in recorded
            ]
            assert all(s["replayed"] for s in replayed["sessions"])


def test_cross_check_leaves_out_a_user_the_reference_did_not_finish(tmp_path):
    """A run the reference stopped mid-way leaves null entries for the periods it never
    reached: that user is left out with the period named, never parsed as zeros."""
    cross_check = load_cross_check()
    partial = tmp_path / "native"
    shutil.copytree(FIXTURE / "native", partial)
    results_file = partial / USERS[1] / "overall_results.json"
    results = load(results_file)
    results[1] = [None for _ in results[1]]
    results_file.write_text(json.dumps(results))
    users, notes = cross_check.reference_results(tmp_path, ENV, "native", "stub")
    assert list(users) == [USERS[0], USERS[2]]
    assert notes == {USERS[1]: "the reference stopped in period 1"}


def test_cross_check_whole_runs_give_the_gap_and_leave_the_verdict_to_the_paired_test():
    cross_check = load_cross_check()
    half = MetricSummary(accuracy=0.5, n_items=18)
    near = MetricSummary(accuracy=0.5 + 5 / 18, n_items=18)
    partial = MetricSummary(accuracy=0.5, n_items=6)  # a reference that stopped early
    text = cross_check.format_differences(
        [("native", half, near), ("awe", half, None), ("rag", partial, near)]
    )
    native, awe, rag = text.splitlines()[1:]
    assert "+0.278" in native and "18 vs 18 items" in native and "noise" not in native
    assert "no results" in awe
    assert "6 vs 18 items" in rag


def test_cross_check_table_only_prints_the_outputs_on_disk_without_an_endpoint(
    tmp_path, monkeypatch, capsys
):
    """--table-only reads what earlier invocations left in --out (agents run one at a time)
    and starts nothing: no endpoint, no reference step, no `evolve eval`."""
    cross_check = load_cross_check()

    def no_calls(*_args, **_kwargs):
        raise AssertionError("--table-only must not start an endpoint or run a side")

    monkeypatch.setattr(cross_check, "endpoint", no_calls)
    monkeypatch.setattr(cross_check, "run_both_sides", no_calls)
    shutil.copytree(FIXTURE / "native", tmp_path / "reference" / "native")
    shutil.copy(FIXTURE / "environment.json", tmp_path / "environment.json")
    (model_dir,) = (FIXTURE / "upperbound").iterdir()
    argv = ["--reference", str(tmp_path), "--reference-python", "python", "--table-only"]
    argv += ["--agents", "native", "--model", model_dir.name, "--out", str(tmp_path)]
    assert cross_check.main(argv) == 0
    table = capsys.readouterr().out
    users, _ = cross_check.reference_results(tmp_path / "reference", ENV, "native", "stub")
    accuracy = summarize(list(users.values())).accuracy
    (reference_row,) = [line for line in table.splitlines() if line.startswith("reference native")]
    assert reference_row.split()[2] == f"{accuracy:.3f}"
    (ours_row,) = [line for line in table.splitlines() if line.startswith("ours native")]
    assert "no report" in ours_row
    assert "native  (one side has no results)" in table


def test_cross_check_compares_only_the_user_periods_both_sides_finished(tmp_path):
    """The reference stopped in user 1's period 1 and our run lacks user 2's period 2: the
    like-for-like line scores exactly the other user-periods, on both sides."""
    cross_check = load_cross_check()
    shutil.copytree(FIXTURE / "native", tmp_path / "reference" / "native")
    results_file = tmp_path / "reference" / "native" / USERS[1] / "overall_results.json"
    results = load(results_file)
    results[1] = [None for _ in results[1]]
    results_file.write_text(json.dumps(results))
    kept = []
    for item in ENV.items:  # ours: the reference's own answers, written as our period files
        raw = load(FIXTURE / "native" / item.id / "overall_results.json")
        for period in period_results_from_original(item, parse_overall_results(raw), None):
            if (item.id, period.period_index) == (USERS[2], 2):
                continue
            directory = tmp_path / "ours" / "native" / "users" / item.id
            directory /= f"period_{period.period_index:02d}"
            directory.mkdir(parents=True)
            (directory / "result.json").write_text(period.model_dump_json())
            if item.id != USERS[1] or period.period_index == 0:
                kept.append(UserResult(user_id=item.id, periods=[period]))
    reference, ours = cross_check.common_periods(tmp_path, ENV, "native", "native")
    expected = summarize(kept)
    assert summarize(ours).n_items == summarize(reference).n_items == expected.n_items
    assert summarize(ours).accuracy == summarize(reference).accuracy == expected.accuracy
    line = cross_check.format_common_periods([("native", (reference, ours))]).splitlines()[1]
    # The same answers on both sides: a zero difference, paired on every common question.
    assert "within noise: difference +0.000 [+0.000, +0.000], McNemar 0 vs 0" in line
    assert f"{expected.n_items} questions" in line


def test_the_fixture_is_what_its_rebuild_wrote():
    """SHA256SUMS, written by benchmarks/reference_fixture.py, lists every data file with its
    digest: a file edited by hand, added or lost shows here; `--check` compares a rebuild."""
    spec = importlib.util.spec_from_file_location(
        "reference_fixture", FIXTURE.parents[2] / "benchmarks" / "reference_fixture.py"
    )
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.checksums(FIXTURE) == builder.read_checksums(FIXTURE)


def test_the_rebuild_check_names_every_file_that_differs(tmp_path, monkeypatch):
    """`reference_fixture.py --check` rebuilds into a scratch directory and names each file
    whose digest differs from SHA256SUMS: changed, lost or added. The rebuild is replaced by
    a copy of a doctored fixture (a real one needs the reference run)."""
    spec = importlib.util.spec_from_file_location(
        "reference_fixture_check", FIXTURE.parents[2] / "benchmarks" / "reference_fixture.py"
    )
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    recorded = tmp_path / "fixture"
    (recorded / "agent" / "u0").mkdir(parents=True)
    for name in ("environment.json", "random_metrics.json", "agent/u0/result.json"):
        (recorded / name).write_text(f'{{"file": "{name}"}}', encoding="utf-8")
    builder.write_checksums(recorded)

    def rebuild_as(change):
        def build(_run, target):
            shutil.copytree(recorded, target)
            change(target)

        monkeypatch.setattr(builder, "build", build)
        return builder.check(tmp_path / "run", recorded)

    assert rebuild_as(lambda target: None) == []
    assert rebuild_as(
        lambda target: (target / "agent" / "u0" / "result.json").write_text("{}", "utf-8")
    ) == ["agent/u0/result.json"]
    assert rebuild_as(lambda target: (target / "random_metrics.json").unlink()) == [
        "random_metrics.json"
    ]
    assert rebuild_as(lambda target: (target / "extra.json").write_text("{}", "utf-8")) == [
        "extra.json"
    ]


def test_the_fixture_reaches_what_the_evidence_must_see():
    """Questions of 2, 3 and 4 options (the random baseline on mixed counts), sessions of 3
    rounds, AWE and RAG stores larger than the paper's top_k of 30 (which memories are shown
    is tested, not only how many), and fact extractions that find nothing (mem0 then makes no
    update call)."""
    assert {len(qa.answer_choices) for item in ENV.items for qa in item.qas} == {2, 3, 4}
    longest = max(
        len(session)
        for user in USERS
        for path in (FIXTURE / "native" / user / "interactions").glob("period_*.json")
        for session in load(path)
    )
    assert longest >= 6  # 3 rounds: 3 user and 3 assistant messages
    requests = load(FIXTURE / "reference_requests.json")
    shown = {
        (r["role"], r["memories"] if r["role"] == "awe" else r["turn_labels"])
        for r in requests
        if r["call"] == "answer" and r["role"] in ("awe", "rag")
    }
    assert {("awe", 30), ("rag", 30)} <= shown
    for user in USERS:
        calls = [
            r["call"] for r in requests if r["role"] == "awe" and r["user_period"].startswith(user)
        ]
        # Each update adds at least 4 memories: the store outgrows 30 for every user.
        assert 4 * calls.count("update") > 30
        assert calls.count("extract") > calls.count("update")
