"""`evolve compare TARGET`: an experiment's generations and lineage, a tuning study's trials, or
an evaluation's policies side by side; `--plot FILE` also draws the paper-style figure (PNG
and PDF, `evolve.reporting.plots`).

Reads the records under `runs/<name>/` (no LLM, no MLflow needed); works on a finished,
stopped or still-running run. Each view ends with the spend ledger's total, naming the
requests of unknown outcome (started when a process was killed; counted as spent). A tuning
study is read live from its Optuna storage (other workers' trials included);
`runs/<name>/tuning.json` is only its last local snapshot.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.commands.flags import DEFAULT_RUNS_DIR
from evolve.core.errors import ConfigError, StorageError
from evolve.core.locking import lock_holder
from evolve.core.protocol import rules_for
from evolve.llm.usage import Usage
from evolve.optimize import ExperimentDir, format_lineage, format_table
from evolve.optimize.experiment_dir import experiment_dir_for
from evolve.optimize.report import format_outcome
from evolve.reporting.intervals import (
    IntervalRow,
    estimate_of,
    format_experiment_intervals,
    format_interval_table,
    with_estimates,
)
from evolve.simulator.metrics import MetricSummary
from evolve.stats import load_outcomes
from evolve.tuning.readback import render_tuning_dir, tuning_dir_for
from evolve.tuning.records import TuningResult
from evolve.tuning.report import format_result
from evolve.tuning.spec import StudySpec
from evolve.tuning.spend import SPEND_DIR, recorded_spend


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="show an experiment's generations and best lineage, a tuning study's trials "
        "or an evaluation's policies; --plot draws the figure",
        description="Evolution experiment: one row per generation (best and mean train score, "
        "held-out score of the best, write/read/utilization failure rates, tokens), every "
        "candidate's scores with 95% intervals per user split and, on the validation and "
        "held-out users, its paired difference to the base (interval, McNemar, verdict), and "
        "the lineage of the best policy. Tuning study: every trial, read live from the "
        "study's storage. `evolve eval` output directory: one row per policy, with intervals.",
    )
    parser.add_argument(
        "experiment",
        help="experiment or study spec (.toml), name under --runs-dir, a run directory, or "
        "an `evolve eval --out` directory",
    )
    parser.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR)
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="also draw the figure, saved as FILE.png and FILE.pdf: a tuning study's heatmap "
        "over the grid and per-period trial curves; an experiment's candidates and held-out vs "
        "train (with 95%% interval bars) and failure breakdown; an evaluation's per-period "
        "curves",
    )
    parser.add_argument(
        "--storage",
        help="tuning study: read it from this Optuna storage URL (default: the spec's, else "
        "the one recorded in runs/<name>/tuning.json)",
    )
    parser.add_argument("--study-name", help="tuning study: its name (default: the spec's)")
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="tuning study: show runs/<name>/tuning.json as saved instead of the live study",
    )
    parser.set_defaults(handler=run_compare)


def note_if_running(directory: Path) -> None:
    """Reading is safe while a run holds the directory; the reader is told it is not final."""
    holder = lock_holder(directory)
    if holder is not None:
        print(
            f"note: {directory} is still running ({holder.describe()}); these are its results "
            "so far",
            file=sys.stderr,
        )


def run_compare(args: argparse.Namespace) -> int:
    # A tuning study (`evolve tune`) first: its spec has a [tuning] table that the
    # evolution spec loader rejects.
    if _is_tuning_target(args):
        return _compare_tuning(args)
    evaluation = _evaluation_dir(args.experiment)
    if evaluation is not None:
        return _compare_evaluations(evaluation, args.plot)
    directory = experiment_dir_for(args.experiment, args.runs_dir)
    if directory is None or not (directory / "experiment.json").is_file():
        known = sorted(
            p.parent.name
            for pattern in ("*/experiment.json", "*/tuning.json")
            for p in Path(args.runs_dir).glob(pattern)
        )
        raise ConfigError(
            f"no experiment {args.experiment!r} under {args.runs_dir}/ (known: "
            f"{', '.join(known) or 'none'}); pass a spec file, an experiment name or directory, "
            "or an `evolve eval --out` directory"
        )
    note_if_running(directory)
    result = ExperimentDir(directory).load_result()
    print(format_table(result, rules_for(result.protocol)))  # the stored run's protocol
    # Records written before estimates were stored get theirs from the per-question records.
    result = with_estimates(directory, result)
    for line in format_experiment_intervals(directory, result):
        print(line)
    print()
    print(format_lineage(result))
    print()
    print(format_outcome(result))  # what `evolve run` ends with: what changed, the verdict
    _print_ledger(ExperimentDir(directory).load_spend())
    if args.plot is not None:
        from evolve.reporting.plots import plot_evolution, save_figure

        _print_written(save_figure(plot_evolution(result), args.plot))
    return 0


def _print_ledger(spend: Usage) -> None:
    """The spend ledger's total: every request started, those of unknown outcome (in flight
    when a process was killed: the server may have received and billed them) named."""
    print(f"\nledger: {spend.describe()}")


def _print_written(paths: list[Path]) -> None:
    print(f"\nplot: {', '.join(str(p) for p in paths)}")


# ----- tuning study -----------------------------------------------------------------------------


def _study_spec(target: str) -> StudySpec | None:
    from evolve.tuning.spec import is_study_spec, load_study_spec

    path = Path(target)
    if path.suffix == ".toml" and path.is_file() and is_study_spec(path):
        return load_study_spec(path)
    return None


def _is_tuning_target(args: argparse.Namespace) -> bool:
    return (
        _study_spec(args.experiment) is not None
        or tuning_dir_for(args.experiment, args.runs_dir) is not None
    )


def _compare_tuning(args: argparse.Namespace) -> int:
    from evolve.tuning.layout import TuningDir
    from evolve.tuning.live import live_storage_url, load_live_result

    spec = _study_spec(args.experiment)
    directory = tuning_dir_for(args.experiment, args.runs_dir)
    if directory is None and spec is not None:
        directory = Path(args.runs_dir) / spec.name
    snapshot = None
    if directory is not None and TuningDir(directory).result_file.is_file():
        note_if_running(directory)
        snapshot = TuningDir(directory).load_result()
    url = (
        None
        if args.snapshot
        else live_storage_url(override=args.storage, spec=spec, snapshot=snapshot)
    )
    study_name = args.study_name or (
        spec.study_name() if spec is not None else snapshot.study_name if snapshot else None
    )
    result: TuningResult | None = None
    if url is not None and study_name is not None:
        try:
            result = load_live_result(
                url, study_name, snapshot=snapshot, spec=spec, directory=directory
            )
            print(f"live study {study_name!r} read from its storage", file=sys.stderr)
        except StorageError as error:
            if snapshot is None:
                raise
            print(
                f"warning: could not read the live study ({error}); showing the local "
                f"snapshot {TuningDir(directory).result_file}",
                file=sys.stderr,
            )
    if result is None:
        if snapshot is None:
            raise ConfigError(
                f"no tuning study to show for {args.experiment!r}: no snapshot under "
                f"{args.runs_dir}/ and no storage to read; run `evolve tune` first or pass "
                "--storage"
            )
        print(render_tuning_dir(directory))
        result = snapshot
    else:
        print(format_result(result))
    if directory is not None and (directory / SPEND_DIR).is_dir():
        _print_ledger(recorded_spend(directory, result.study_name))
    if args.plot is not None:
        from evolve.reporting.plots import plot_tuning, save_figure

        _print_written(save_figure(plot_tuning(result), args.plot))
    return 0


# ----- evaluation of several policies (`evolve eval --out DIR`) --------------------------------


def _evaluation_dir(target: str) -> Path | None:
    """An `evolve eval` output directory: one sub-directory with a report.json per policy."""
    path = Path(target)
    runs_of_other_commands = ("tuning.json", "experiment.json")
    if any((path / name).exists() for name in runs_of_other_commands):
        return None
    return path if path.is_dir() and any(path.glob("*/report.json")) else None


def _evaluated_on(run_dir: Path) -> tuple[str, tuple[str, ...]] | None:
    """The environment hash and user ids a policy's run used (from its run header), or None
    when the header is missing or unreadable (e.g. a run from before headers existed)."""
    from evolve.simulator.run_dir import RunLayout, read_object

    run_file = RunLayout(run_dir).run_file
    if not run_file.exists():
        return None
    try:
        config = read_object(run_file)["config"]
        return str(config["environment"]), tuple(str(user) for user in config["users"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def warn_if_mixed_environments(directory: Path) -> None:
    """Scores of policies evaluated on different environments (or user sets) are not
    comparable, yet one `--out` directory can hold both: say so before they are drawn side
    by side."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for report_file in sorted(directory.glob("*/report.json")):
        evaluated_on = _evaluated_on(report_file.parent)
        if evaluated_on is not None:
            groups.setdefault(evaluated_on, []).append(report_file.parent.name)
    if len(groups) < 2:
        return
    described = "; ".join(
        f"{', '.join(names)} on environment {environment[:12]} ({len(users)} users)"
        for (environment, users), names in groups.items()
    )
    print(
        f"warning: {directory} holds policies evaluated on {len(groups)} different "
        f"environments or user sets ({described}); their scores are not comparable. Evaluate "
        "each environment into its own --out directory and compare those one at a time",
        file=sys.stderr,
    )


def _compare_evaluations(directory: Path, plot: Path | None) -> int:
    from evolve.simulator.evaluation import load_report

    warn_if_mixed_environments(directory)
    per_period: dict[str, list[MetricSummary]] = {}
    rows: list[IntervalRow] = []
    print(f"{'policy':<24} {'accuracy':>8} {'memory':>7} {'periods':>7}")
    for report_file in sorted(directory.glob("*/report.json")):
        report = load_report(report_file.parent)
        name = report_file.parent.name
        summary = MetricSummary.model_validate(report["summary"])
        per_period[name] = [MetricSummary.model_validate(p) for p in report["per_period"]]
        memory = "-" if summary.memory_score is None else f"{summary.memory_score:.3f}"
        accuracy = "-" if summary.accuracy is None else f"{summary.accuracy:.3f}"
        print(f"{name:<24} {accuracy:>8} {memory:>7} {len(per_period[name]):>7}")
        outcomes = load_outcomes(report_file.parent)
        missing = None if outcomes.questions else "no per-question records"
        rows.append(IntervalRow(name, estimate_of(outcomes), missing=missing))
    if any(row.estimate is not None for row in rows):
        # No baseline: the directory does not record which policy `evolve eval` ran first.
        print("\nscores with 95% intervals (each on its own users' questions):")
        for line in format_interval_table(rows, baseline=None):
            print(line)
    experiment_dir = ExperimentDir(directory)
    if experiment_dir.journal_file.is_file():
        _print_ledger(experiment_dir.load_spend())
    if plot is not None:
        from evolve.reporting.plots import plot_evaluations, save_figure

        figure = plot_evaluations(per_period, f"{directory.name}: {len(per_period)} policies")
        _print_written(save_figure(figure, plot))
    return 0
