"""Flags that several commands share, defined once so that their name, default and help read
the same in each command (the LLM endpoint flags are in `llm_flags`).

Each function adds its flags where it is called: a command keeps the order of its `--help`
by calling them among its own flags.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from evolve.core.errors import shown_value

# Where `run` and `tune` keep runs/<name>/ (and where `compare` and `export` look for them).
DEFAULT_RUNS_DIR = Path("runs")


def seed_value(text: str) -> int:
    """An integer seed; argparse's own `int` would echo a 5,000-digit value whole."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer seed, got {shown_value(text, limit=40)}"
        ) from None


def add_runs_dir(parser: argparse.ArgumentParser) -> None:
    """--runs-dir: the directory holding runs/<name>/ of an experiment or a study."""
    parser.add_argument(
        "--runs-dir", type=Path, default=DEFAULT_RUNS_DIR, help="where runs/<name>/ lives (runs)"
    )


def add_tracking_flags(parser: argparse.ArgumentParser) -> None:
    """--tracking-uri and --no-tracking: where a command logs to MLflow, or that it does not."""
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: the spec's, else MLFLOW_TRACKING_URI, else "
        "sqlite:///mlruns/mlflow.db)",
    )
    parser.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def add_no_progress(parser: argparse.ArgumentParser) -> None:
    """--no-progress: no bars (a command's plain lines are still written)."""
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (e.g. in CI logs)"
    )


def add_upper_bound_flags(parser: argparse.ArgumentParser, *, cache_dir: bool) -> None:
    """--refresh-upper-bound, after --upper-bound-cache when the command lets the user choose
    the cache directory (`cache_dir`)."""
    if cache_dir:
        parser.add_argument(
            "--upper-bound-cache",
            type=Path,
            help="directory caching upper-bound answers (default <cache dir>/upper_bound)",
        )
    parser.add_argument(
        "--refresh-upper-bound",
        action="store_true",
        help="ask every upper-bound question again instead of reusing cached answers",
    )
