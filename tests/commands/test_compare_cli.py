"""`evolve compare` on a tuning study (read live from its storage, `--plot` heatmap) and on an
`evolve eval` output directory (per-period curves)."""

from __future__ import annotations

import json

import optuna
from tuning.tune_helpers import TuneWorld, write_tune_spec

from evolve.cli import main
from evolve.simulator.metrics import MetricSummary
from evolve.simulator.run_dir import RunLayout
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
