"""`evolve arms SPEC.toml`: a controlled comparison, arms x environment seeds x replicates.

Runs each evolving arm (the experiment spec's evolution, the blind control) on every seed in
every replicate, then scores every arm (with the base and the capacity control) once on each
seed's test users, and prints the table: each arm's test accuracy and memory score with
95% intervals, its paired difference to the base and to each control with interval and
user-level p, and how many users and seeds it is ahead on. Rerunning resumes; with every unit
done it only prints. The table goes to `<runs>/<name>/arms.md` and to one MLflow run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from evolve.commands import interrupt
from evolve.commands.flags import add_runs_dir, add_tracking_flags
from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.core.files import atomic_write_json, atomic_write_text
from evolve.core.locking import run_lock
from evolve.llm import open_role_lms, protocol_llm_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "arms",
        help="compare designs: arms x environment seeds x replicates, scored on test users",
        description="Run an arms spec (see docs/comparisons.md): every evolving arm on every "
        "seed and replicate, then every arm once on each seed's test users; print the table with "
        "intervals and paired tests. Rerunning resumes.",
    )
    parser.add_argument("spec", type=Path, help="arms spec, e.g. experiments/crafts_arms.toml")
    add_runs_dir(parser)
    add_tracking_flags(parser)
    parser.add_argument(
        "--table-only", action="store_true",
        help="print the table of the finished units and make no LLM call",
    )  # fmt: skip
    add_llm_arguments(parser)
    parser.set_defaults(handler=arms_command)


def arms_command(args: argparse.Namespace) -> int:
    from evolve.arms.runner import finished, load_record, run_arms
    from evolve.arms.spec import load_arms_spec
    from evolve.arms.table import (
        arms_table,
        directory_loader,
        format_arms_table,
        format_costs,
        transfer_loader,
    )
    from evolve.spec.config import load_spec, resolve
    from evolve.tracking import tracker_for

    spec = load_arms_spec(args.spec)
    experiment = load_spec(spec.experiment_path())
    resolve(experiment)  # the experiment is checked before the first LLM call
    directory = args.runs_dir / spec.name

    def say(line: str) -> None:
        print(f"arms {spec.name}: {line}", file=sys.stderr, flush=True)

    record = load_record(directory)
    if not args.table_only and not finished(spec, record):
        llm_config = protocol_llm_config(
            llm_config_from_args(args, base=experiment.llm), experiment.rules
        )
        with run_lock(directory, "arms"), open_role_lms(llm_config) as lms:
            record = run_arms(
                spec, lms, args.runs_dir, say=say, stop=interrupt.STOP,
                tracker_for_experiment=lambda variant: tracker_for(
                    variant, tracking_uri=args.tracking_uri, enabled=not args.no_tracking
                ),
            )  # fmt: skip
    elif record is None:
        say(f"no units yet in {directory}: run `evolve arms {args.spec}` first")
        return 2
    rows = arms_table(
        record, directory_loader(directory), seed=spec.statistics_seed, resamples=spec.resamples
    )
    table = format_arms_table(rows)
    transfer_rows = []
    if spec.transfer:
        transfer_rows = arms_table(
            record, transfer_loader(directory, record), seed=spec.statistics_seed,
            resamples=spec.resamples,
        )  # fmt: skip
        table += (
            "\n\nTransfer: only the test questions about facts no train user of the seed was "
            "asked about\n\n" + (format_arms_table(transfer_rows) if transfer_rows else
                                 "(no such question: the train users were asked about them all)")
        )  # fmt: skip
    atomic_write_text(directory / "arms.md", table + "\n")
    # Every interval and test with its method and seed, for scripts and papers.
    atomic_write_json(
        directory / "summary.json",
        {
            "name": spec.name,
            "design_hash": record.design_hash,
            "seeds": spec.seeds,
            "replicates": spec.replicates,
            "rows": [row.model_dump(mode="json") for row in rows],
            "transfer_rows": [row.model_dump(mode="json") for row in transfer_rows],
        },
    )
    print(table)
    print("\nCost per arm:\n")
    print(format_costs(record))
    done = len({(u.arm, u.seed, u.replicate) for u in record.units if u.test_complete})
    print(f"\n{done} units scored on test users; records in {directory}")
    if not args.no_tracking and rows:
        from evolve.tracking.arms import log_arms_run
        from evolve.tracking.store import tracking_location

        location = tracking_location(args.tracking_uri, experiment)
        run_id = log_arms_run(
            location.uri, experiment.mlflow_experiment_name(), spec.name, record.design_hash,
            rows, table,
        )  # fmt: skip
        print(f"MLflow run {run_id} ({experiment.mlflow_experiment_name()})")
    return 0
