"""`evolve compare` on a tuning study (read live from its storage, `--plot` heatmap), on an
`evolve eval` output directory (per-period curves, intervals) and on an experiment (scores
with intervals, paired differences to the base, error bars), checked against the per-question
records."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import optuna
import pytest
from matplotlib.container import ErrorbarContainer
from scipy.stats import binomtest
from tuning.tune_helpers import TuneWorld, write_tune_spec

from evolve.cli import main
from evolve.reporting import plots
from evolve.simulator.metrics import MetricSummary
from evolve.simulator.run_dir import RunLayout
from evolve.stats import QuestionOutcomes, compare, estimate
from evolve.tuning import load_study_spec, run_study

GRID = 'sampler = "grid"\n[tuning.parameters]\nupdate_every = [2, 4]\nshort_term_len = [0, 4]'


def test_compare_reads_the_live_study_and_plots_its_heatmap(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec_path = write_tune_spec(tmp_path / "spec", f'trials = 2\nheldout = "none"\n{GRID}')
    spec = load_study_spec(spec_path)
    run_study(spec, TuneWorld().lms, runs_dir="runs", upper_bound_cache=tmp_path / "ub")
    # Another worker adds a trial the local snapshot (tuning.json) never saw.
    study = optuna.load_study(study_name="tune", storage=spec.storage_url())
    study.enqueue_trial({"update_every": 4, "short_term_len": 4})
    trial = study.ask()
    study.tell(trial, 0.123)

    assert main(["compare", str(spec_path), "--plot", "figs/tune.png"]) == 0
    captured = capsys.readouterr()
    assert "live study 'tune'" in captured.err
    assert f"{trial.number:>5} complete" in captured.out and "0.123" in captured.out
    assert (tmp_path / "figs" / "tune.png").stat().st_size > 1000
    assert (tmp_path / "figs" / "tune.pdf").stat().st_size > 1000

    # By name: the storage recorded in the snapshot; --snapshot: the file as saved.
    assert main(["compare", "tune"]) == 0
    assert "0.123" in capsys.readouterr().out
    assert main(["compare", "tune", "--snapshot"]) == 0
    assert "0.123" not in capsys.readouterr().out
    # A storage that is gone: the snapshot, with a warning (and no empty database created).
    missing = tmp_path / "moved.db"
    assert main(["compare", "tune", "--storage", f"sqlite:///{missing}"]) == 0
    captured = capsys.readouterr()
    assert "does not exist" in captured.err and "best: trial" in captured.out
    assert not missing.exists()


def test_compare_names_the_missing_study(tmp_path, capsys):
    spec_path = write_tune_spec(tmp_path, f"trials = 1\n{GRID}")
    # No storage yet: nothing is created, the error says so (exit 5).
    assert main(["compare", str(spec_path)]) == 5
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "optuna.db").exists()
    # A storage holding another study: the error names the studies there (exit 2).
    optuna.create_study(study_name="other", storage=load_study_spec(spec_path).storage_url())
    assert main(["compare", str(spec_path), "--study-name", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no study 'nope'" in err and "studies there: other" in err


def _report(accuracies: list[float], memory: list[float | None]) -> dict:
    per_period = [
        MetricSummary(accuracy=a, memory_score=m).model_dump(mode="json")
        for a, m in zip(accuracies, memory, strict=True)
    ]
    summary = MetricSummary(accuracy=sum(accuracies) / len(accuracies))
    return {"summary": summary.model_dump(mode="json"), "per_period": per_period}


def test_compare_an_eval_directory_plots_per_period_curves(tmp_path, capsys):
    out = tmp_path / "eval"
    for name, report in {
        "in_context": _report([0.5, 0.7, 0.6], [0.2, 0.6, 0.4]),
        "no_memory": _report([0.3, 0.2, 0.25], [None, None, None]),
    }.items():
        (out / name).mkdir(parents=True)
        (out / name / "report.json").write_text(json.dumps(report))
    assert main(["compare", str(out), "--plot", str(tmp_path / "eval-plot")]) == 0
    printed = capsys.readouterr().out
    assert "in_context" in printed and "no_memory" in printed
    assert (tmp_path / "eval-plot.png").stat().st_size > 1000
    assert (tmp_path / "eval-plot.pdf").stat().st_size > 1000


def test_compare_names_the_requests_a_kill_left_of_unknown_outcome(tmp_path, capsys):
    from evolve.llm.usage import RequestEvent, RequestState
    from evolve.results.budget import SpendJournal

    out = tmp_path / "eval"
    (out / "in_context").mkdir(parents=True)
    (out / "in_context" / "report.json").write_text(json.dumps(_report([0.5], [0.2])))
    journal = SpendJournal(out / "spend.jsonl").open()
    for request_id in ("a-1", "a-2", "a-3"):
        journal.record(RequestEvent("agent", request_id, RequestState.STARTED), wall_time_s=1.0)
    journal.record(RequestEvent("agent", "a-1", RequestState.FINISHED, 200), wall_time_s=2.0)
    journal.record(RequestEvent("agent", "a-2", RequestState.FAILED, 500), wall_time_s=2.0)
    journal.close()  # a-3 was in flight when the process was killed
    assert main(["compare", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ledger: 3 LLM calls (1 started, outcome unknown" in printed


def _evaluated_policy(out, name: str, environment: str, users: list[str]) -> None:
    """A policy's run directory as `evolve eval` leaves it: the run header the runner writes
    (environment hash and users in its config) and a report."""
    RunLayout(out / name).open_run({"environment": environment, "users": users, "policy": name})
    (out / name / "report.json").write_text(json.dumps(_report([0.5, 0.6], [0.1, 0.2])))


def test_compare_warns_when_an_eval_directory_mixes_environments(tmp_path, capsys):
    out = tmp_path / "eval"
    _evaluated_policy(out, "native", "a" * 64, ["u0", "u1"])
    _evaluated_policy(out, "in_context", "a" * 64, ["u0", "u1"])
    assert main(["compare", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err  # one environment: nothing to say

    _evaluated_policy(out, "raw_rag", "b" * 64, ["u0", "u1"])
    assert main(["compare", str(out)]) == 0
    err = capsys.readouterr().err
    assert "2 different environments" in err
    assert "in_context, native on environment aaaaaaaaaaaa" in err
    assert "raw_rag on environment bbbbbbbbbbbb" in err
    assert "its own --out directory" in err


def test_compare_warns_when_an_eval_directory_mixes_user_sets(tmp_path, capsys):
    out = tmp_path / "eval"
    _evaluated_policy(out, "native", "a" * 64, ["u0", "u1"])
    _evaluated_policy(out, "in_context", "a" * 64, ["u0"])
    assert main(["compare", str(out)]) == 0
    assert "2 different environments or user sets" in capsys.readouterr().err


# ----- an experiment: scores with intervals, paired differences, error bars -------------------

QUICKSTART = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/records/quickstart_seeds-addable-failures/quickstart-s13"
)
SCORE = r"(-?\d\.\d{3}) \[(-?\d\.\d{3}), (-?\d\.\d{3})\]"
DIFFERENCE = r"([+-]\d\.\d{3}) \[([+-]\d\.\d{3}), ([+-]\d\.\d{3})\]"


def _raw_outcomes(run_dir: Path) -> QuestionOutcomes:
    """A run directory's per-question records read straight from its JSON files (in the
    order the statistics read them, so that the seeded resamples are the same)."""
    keys, correct, random_scores, upper = [], [], [], []
    for path in sorted(run_dir.glob("**/period_*/result.json")):
        period = json.loads(path.read_text())
        for item in period["items"]:
            keys.append(("", period["user_id"], period["period_index"], item["question_index"]))
            correct.append(float(item["correct"]))
            random_scores.append(item["random_score"])
            upper.append(float(item["upper_bound_correct"]))
    return QuestionOutcomes(
        keys=tuple(keys),
        correct=np.array(correct),
        random_score=np.array(random_scores),
        upper_bound=np.array(upper),
    )


def _memory(outcomes: QuestionOutcomes, correct: np.ndarray) -> float:
    random_score = outcomes.random_score.mean()
    return (correct.mean() - random_score) / (outcomes.upper_bound.mean() - random_score)


def _table(printed: str, heading: str) -> dict[str, str]:
    """The rows (by candidate) of the interval table under the line starting with `heading`."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows = {}
    for line in lines[start + 3 :]:  # heading, column names, rule
        if not line.strip() or line.startswith("95% intervals"):
            break
        rows[line.split()[0]] = line
    return rows


def _bars(axis) -> list[np.ndarray]:
    """The segments of every error bar drawn on `axis` (one per errorbar container)."""
    return [
        segment
        for container in axis.containers
        if isinstance(container, ErrorbarContainer)
        for collection in container.lines[2]
        for segment in collection.get_segments()
    ]


def test_compare_an_experiment_shows_intervals_paired_differences_and_error_bars(
    tmp_path, capsys, monkeypatch
):
    experiment = tmp_path / "quickstart-s13"
    shutil.copytree(QUICKSTART, experiment)
    # Scored on validation users too: the base's and the best's held-out records stand in.
    for candidate in ("g00-c0", "g02-c0"):
        path = experiment / "candidates" / candidate / "candidate.json"
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "validation": record["heldout"]}))
    figures = []
    real_save = plots.save_figure
    monkeypatch.setattr(
        plots, "save_figure", lambda figure, path: figures.append(figure) or real_save(figure, path)
    )

    assert main(["compare", str(experiment), "--plot", str(tmp_path / "evolution")]) == 0
    printed = capsys.readouterr().out

    raw = {
        (candidate, split): _raw_outcomes(experiment / "evaluations" / split / fingerprint)
        for candidate, split, fingerprint in (
            ("g00-c0", "train", "e7c63460a2325bb0"),
            ("g01-c0", "train", "f8d170f4fc117910"),
            ("g02-c0", "train", "86075350a0991e27"),
            ("g00-c0", "heldout", "e7c63460a2325bb0"),
            ("g02-c0", "heldout", "86075350a0991e27"),
        )
    }
    tables = {
        "train": _table(printed, "train users (u000-aisha-rahman, u001-tom-oconnell)"),
        "heldout": _table(printed, "held-out users (u002-nadia-kowalski, u003-pieter-devries)"),
        "validation": _table(printed, "validation users (u002-nadia-kowalski, u003-pieter-"),
    }
    assert sorted(tables["train"]) == ["g00-c0", "g01-c0", "g02-c0"]
    for split in ("heldout", "validation"):
        assert sorted(tables[split]) == ["g00-c0", "g02-c0"]
    assert "(the best was chosen on these: its verdict is optimistic)" in printed
    for (candidate, split), outcomes in raw.items():
        for table in [tables[split]] + ([tables["validation"]] if split == "heldout" else []):
            row = table[candidate]
            assert row.split()[1:3] == ["2", str(outcomes.questions)], row
            (accuracy, memory) = re.findall(SCORE, row)[:2]
            expected = estimate(outcomes, seed=0)
            assert float(accuracy[0]) == pytest.approx(outcomes.correct.mean(), abs=5e-4)
            assert float(memory[0]) == pytest.approx(_memory(outcomes, outcomes.correct), abs=5e-4)
            for shown, scores in ((accuracy, expected.accuracy), (memory, expected.memory_score)):
                low, high = float(shown[1]), float(shown[2])
                assert (low, high) == pytest.approx(
                    (scores.interval.low, scores.interval.high), abs=5e-4
                ), row
                assert high - low > 0.1, row  # a real interval, not the point repeated

    base, best = raw["g00-c0", "heldout"], raw["g02-c0", "heldout"]
    best_only = int(((best.correct == 1) & (base.correct == 0)).sum())
    base_only = int(((best.correct == 0) & (base.correct == 1)).sum())
    paired = compare(best, base, seed=0)
    for split in ("heldout", "validation"):
        assert "(baseline)" in tables[split]["g00-c0"]
        row = tables[split]["g02-c0"]
        (accuracy_diff, memory_diff) = re.findall(DIFFERENCE, row)
        assert float(accuracy_diff[0]) == pytest.approx(
            best.correct.mean() - base.correct.mean(), abs=5e-4
        )
        assert float(memory_diff[0]) == pytest.approx(
            _memory(best, best.correct) - _memory(best, base.correct), abs=5e-4
        )
        interval = paired.difference.interval
        low, high = float(accuracy_diff[1]), float(accuracy_diff[2])
        assert (low, high) == pytest.approx((interval.low, interval.high), abs=5e-4)
        assert f"{best_only} vs {base_only}" in row
        p_value = binomtest(best_only, best_only + base_only, 0.5).pvalue
        assert f" {p_value:.3f} " in row
        verdict = "beats" if low > 0 else "worse" if high < 0 else "within noise"
        assert row.endswith(f"2 of 2  {verdict}"), row

    # The figure: each plotted score (the memory score) with its interval as an error bar.
    figure = figures[0]
    scores_axis, versus_axis, _ = figure.axes
    expected_bars = {
        (generation + offset, *_interval(raw[candidate, split]))
        for candidate, generation in (("g00-c0", 0), ("g01-c0", 1), ("g02-c0", 2))
        for split, offset in (("train", -0.12), ("heldout", 0.12))
        if (candidate, split) in raw
    }
    drawn = {(s[0][0], *sorted(s[:, 1])) for s in _bars(scores_axis)}
    assert _same_bars(drawn, expected_bars), (drawn, expected_bars)
    # Held-out vs train: a vertical bar (held-out interval) and a horizontal one (train).
    versus = _bars(versus_axis)
    for candidate in ("g00-c0", "g02-c0"):
        train, heldout = raw[candidate, "train"], raw[candidate, "heldout"]
        point = (_memory(train, train.correct), _memory(heldout, heldout.correct))
        vertical = [s for s in versus if s[0][0] == s[1][0] == pytest.approx(point[0])]
        horizontal = [s for s in versus if s[0][1] == s[1][1] == pytest.approx(point[1])]
        assert [sorted(s[:, 1]) for s in vertical] == [pytest.approx(_interval(heldout))]
        assert [sorted(s[:, 0]) for s in horizontal] == [pytest.approx(_interval(train))]


def _interval(outcomes: QuestionOutcomes) -> tuple[float, float]:
    interval = estimate(outcomes, seed=0).memory_score.interval
    return (interval.low, interval.high)


def _same_bars(drawn: set, expected: set) -> bool:
    matched = [any(np.allclose(d, e) for d in drawn) for e in expected]
    return len(drawn) == len(expected) and all(matched)


def test_compare_ends_as_the_run_did_with_what_changed_and_the_verdict(tmp_path, capsys):
    from evolve.optimize import ExperimentDir
    from evolve.optimize.report import format_outcome

    runs = tmp_path / "runs"
    shutil.copytree(QUICKSTART, runs / QUICKSTART.name)
    assert main(["compare", QUICKSTART.name, "--runs-dir", str(runs)]) == 0
    printed = capsys.readouterr().out
    outcome = format_outcome(ExperimentDir(runs / QUICKSTART.name).load_result())
    assert outcome.startswith("what changed: ") and "held-out" in outcome
    assert outcome in printed
