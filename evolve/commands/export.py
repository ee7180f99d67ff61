"""`evolve export EXPERIMENT|RUN_ID --out DIR`: the best policy as a bundle, and registered."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.commands.compare import note_if_running
from evolve.commands.flags import DEFAULT_RUNS_DIR
from evolve.commands.ui import registered_model_hint
from evolve.core.errors import ConfigError
from evolve.optimize.experiment_dir import experiment_dir_for


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write the best evolved policy as a bundle and register it in MLflow",
        description="Take the experiment's best candidate (chosen on its validation users, "
        "else its train users), write its bundle to --out (load it with "
        "memory_policies.load(DIR)), and register it in the MLflow model registry with the "
        "alias 'champion'. Says the held-out verdict against the base (beats / within noise / "
        "worse, from the interval of the paired difference) with what it rests on, and warns "
        "when the best does not beat the base. No LM, endpoint or key is saved or logged.",
    )
    parser.add_argument(
        "target",
        metavar="EXPERIMENT|RUN_ID",
        help="experiment spec (.toml), name under --runs-dir, directory, or MLflow run id",
    )
    parser.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    parser.add_argument("--runs-dir", type=Path, default=DEFAULT_RUNS_DIR)
    parser.add_argument(
        "--name", help="registered model name (default: the spec's or experiment's)"
    )
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: the spec's [tracking] tracking_uri as written, else "
        "MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db in the current directory)",
    )
    parser.add_argument(
        "--no-register", action="store_true", help="write the bundle only, skip the registry"
    )
    parser.set_defaults(handler=run_export)


def check_target(target: str, runs_dir: Path) -> None:
    """Refuse, in one line, the spec of an experiment that was never run."""
    directory = experiment_dir_for(target, runs_dir)
    if directory is not None and (directory / "experiment.json").is_file():
        note_if_running(directory)
        return
    if Path(target).suffix == ".toml" and directory is not None:
        raise ConfigError(
            f"experiment {directory.name!r} of {target} has not been run yet (no "
            f"{directory / 'experiment.json'}); run `evolve run {target}` first"
        )
    # Anything else is looked up as an MLflow run id by `export_policy`, which explains a miss.


def run_export(args: argparse.Namespace) -> int:
    from evolve.export.bundle import (
        check_registered_model_name,
        export_policy,
        export_tracking_location,
    )

    if args.name is not None and not args.no_register:
        check_registered_model_name(args.name)
    check_target(args.target, args.runs_dir)
    location = None
    if not args.no_register:
        location = export_tracking_location(
            args.target, runs_dir=args.runs_dir, tracking_uri=args.tracking_uri
        )
        print(location.describe(), file=sys.stderr)
    result = export_policy(
        args.target,
        args.out,
        runs_dir=args.runs_dir,
        register=not args.no_register,
        registered_name=args.name,
        tracking_uri=args.tracking_uri,
    )
    held_out = "-" if result.heldout_score is None else f"{result.heldout_score:.3f}"
    train = "-" if result.train_score is None else f"{result.train_score:.3f}"
    print(
        f"exported {result.candidate_id} of {result.experiment} (held-out {held_out}, "
        f"train {train}) to {result.path.resolve()}"
    )
    if result.registered_name is not None:
        print(
            f"registered {result.registered_name} version {result.registered_version} "
            f"as {result.model_uri}"
        )
    for component, uri in sorted(result.prompts.items()):
        print(f"prompt {component}: {uri}")
    # The crown's worth: the held-out test against the base, never two point scores.
    if result.heldout is not None and result.heldout.warning:
        print(result.heldout.warning, file=sys.stderr)
    elif result.heldout is not None:
        print(result.heldout.text)
    if location is not None and result.registered_name is not None:
        print(
            registered_model_hint(
                location.uri, result.registered_name, result.registered_version, args.target
            )
        )
    return 0
