"""`evolve compare EXPERIMENT`: per-generation table, the best policy's lineage, a plot.

Reads the experiment's records under `runs/<name>/` (no LLM, no MLflow needed); works on a
finished, stopped or still-running experiment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.errors import ConfigError
from evolve.locking import lock_holder
from evolve.optimize import ExperimentStore, format_lineage, format_table, plot_scores
from evolve.optimize.store import experiment_dir_for
from evolve.tuning.report import render_tuning_dir, tuning_dir_for


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="show an experiment's generations, the best lineage, and plot its scores "
        "(or a tuning study's trials)",
        description="Print one row per generation (best and mean train score, held-out score "
        "of the best, write/read/utilization failure rates, tokens) and the lineage of the "
        "best policy (by held-out score).",
    )
    parser.add_argument(
        "experiment", help="experiment spec (.toml), name under --runs-dir, or directory"
    )
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="also draw score per generation"
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
    tuning_directory = tuning_dir_for(args.experiment, args.runs_dir)
    if tuning_directory is not None:
        if args.plot is not None:
            raise ConfigError("--plot draws evolution experiments; a tuning study has no plot")
        note_if_running(tuning_directory)
        print(render_tuning_dir(tuning_directory))
        return 0
    directory = experiment_dir_for(args.experiment, args.runs_dir)
    if directory is None or not (directory / "experiment.json").is_file():
        known = sorted(
            p.parent.name
            for pattern in ("*/experiment.json", "*/tuning.json")
            for p in Path(args.runs_dir).glob(pattern)
        )
        raise ConfigError(
            f"no experiment {args.experiment!r} under {args.runs_dir}/ (known: "
            f"{', '.join(known) or 'none'}); pass a spec file, an experiment name or directory"
        )
    note_if_running(directory)
    result = ExperimentStore(directory).load_result()
    print(format_table(result))
    print()
    print(format_lineage(result))
    if args.plot is not None:
        path = plot_scores(result, args.plot)
        print(f"\nplot: {path}")
    return 0
