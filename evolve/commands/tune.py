"""`evolve tune SPEC.toml`: an Optuna study over a policy's numeric parameters.

Validates the whole spec before any LLM call, opens the LMs of its `[llm]` table (command-line
LLM flags override it), runs trials until the study holds the requested number (pruning per
period), evaluates the best setting on the held-out users, prints the trial table and the
best parameters (the Pareto front with a cost objective), and tracks everything in MLflow.
Rerunning resumes the study; more workers on other machines can join it with `--worker`;
`--wait` makes the main invocation wait for them on any storage before the held-out check.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path

from tqdm import tqdm

from evolve.commands.flags import (
    add_no_progress,
    add_runs_dir,
    add_tracking_flags,
    add_upper_bound_flags,
)
from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.commands.progress import CommandBars, make_bar
from evolve.commands.protocol_start import check_embedder, print_protocol_start
from evolve.commands.ui import mlflow_ui_hint
from evolve.core.errors import ConfigError
from evolve.core.locking import run_lock
from evolve.llm import LLMConfig, open_role_lms, protocol_llm_config
from evolve.results.objective import format_score, scores_text
from evolve.simulator.evaluation import ProgressSink
from evolve.stores.tracking_uri import masked_uri
from evolve.tuning import (
    HeldoutRecord,
    TrialRecord,
    TuneProgress,
    format_result,
    load_study_spec,
    resolve_tuning,
    run_study,
    study_tracker_for,
)
from evolve.tuning.spec import ResolvedTuning, StudySpec, parameter_slug
from evolve.tuning.tracking import StudyTracker


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune",
        help="tune update_every / short_term_len / top_k with an Optuna study",
        description="Evaluate a policy on-policy on the train users for each trial's numeric "
        "parameters, prune weak trials after each period, check the best setting on the "
        "held-out users, and track every trial in MLflow. Rerunning resumes the study; "
        "several workers (processes or machines) can share one study storage.",
    )
    parser.add_argument("spec", type=Path, help="study spec, e.g. experiments/tune_quick.toml")
    add_runs_dir(parser)
    parser.add_argument("--trials", type=int, help="finished trials wanted (default: the spec's)")
    parser.add_argument(
        "--storage",
        help="Optuna storage URL (default: the spec's, else sqlite:///mlruns/optuna.db)",
    )
    parser.add_argument(
        "--create-storage-dir",
        action="store_true",
        help="create a missing directory of a sqlite:/// or journal: storage (default: refuse "
        "it, a missing directory is usually a typo; as [tuning] create_storage_dir = true)",
    )
    parser.add_argument("--study-name", help="study name (default: the spec's, else its name)")
    parser.add_argument(
        "--worker",
        action="store_true",
        help="an extra worker: run trials only (the main invocation does the held-out check)",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="main invocation: wait for trials still running in other workers, then check the "
        "best setting on the held-out users (on a database storage it always waits; on a "
        "journal or Redis storage it waits only with --wait)",
    )
    parser.add_argument(
        "--fail-running",
        action="store_true",
        help="first mark RUNNING trials failed (a killed worker on a journal storage); only "
        "when no other worker of the study is active",
    )
    add_upper_bound_flags(parser, cache_dir=True)
    add_tracking_flags(parser)
    add_no_progress(parser)
    add_llm_arguments(parser)
    parser.set_defaults(handler=run_tune)


def _trial_scores(record: TrialRecord) -> str:
    """A finished trial's train scores, each named (its metrics: the latest period's summary
    when pruned); without metrics (a failed trial), the objective value alone."""
    if record.metrics:
        return scores_text(record.metrics, record.objective_used)
    value = record.values[0] if record.values else None
    return f"{record.objective_used or 'objective'} {format_score(value)}"


def run_tune(args: argparse.Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say the same
    spec = load_study_spec(args.spec)
    # Everything checkable is checked before the embedded server starts or any LLM call.
    resolved = resolve_tuning(
        spec,
        trials=args.trials,
        storage=args.storage,
        study_name=args.study_name,
        create_storage_dir=args.create_storage_dir,
    )
    llm_config = protocol_llm_config(llm_config_from_args(args, base=spec.llm), spec.rules)
    tracker = study_tracker_for(spec, tracking_uri=args.tracking_uri, enabled=not args.no_tracking)
    # The main process owns the run directory; extra workers coordinate through the study
    # storage instead (each trial has its own directory).
    if args.worker and args.wait:
        raise ConfigError(
            "--wait is for the main invocation (it waits for the workers, then checks the "
            "held-out users); drop --wait or --worker"
        )
    lock = contextlib.nullcontext() if args.worker else run_lock(args.runs_dir / spec.name, "tune")
    with lock:
        return _tune_locked(args, spec, resolved, llm_config, tracker)


def _tune_locked(
    args: argparse.Namespace,
    spec: StudySpec,
    resolved: ResolvedTuning,
    llm_config: LLMConfig,
    tracker: StudyTracker,
) -> int:
    experiment = resolved.experiment
    tuning = spec.tuning
    print(
        f"study {resolved.study_name}: {experiment.environment_description}; "
        f"{len(experiment.train.items)} train / {len(experiment.heldout.items)} held-out users; "
        f"policy {experiment.base_policy.kind}; {resolved.trials} trials, sampler "
        f"{tuning.sampler}, pruner {tuning.pruner.kind}; objective "
        f"{' + '.join(tuning.objectives)}; space "
        + ", ".join(f"{name}={values}" for name, values in resolved.space.items()),
        file=sys.stderr,
    )
    if tracker.location is not None:
        print(tracker.location.describe(), file=sys.stderr)
    for note in resolved.notes:
        print(f"warning: {note}", file=sys.stderr)
    progress = _Bars(enabled=not args.no_progress)
    embeds = experiment.base_policy.uses_embedder
    check_embedder(spec.protocol, [embeds])
    with open_role_lms(llm_config) as lms:
        print_protocol_start(spec.protocol, lms, ("simulator", "agent"), embeds=embeds)
        try:
            result = run_study(
                resolved,
                lms,
                runs_dir=args.runs_dir,
                tracker=tracker,
                progress=progress,
                upper_bound_cache=args.upper_bound_cache,
                worker_only=args.worker,
                fail_running=args.fail_running,
                refresh_upper_bound=args.refresh_upper_bound,
                wait=args.wait,
            )
        finally:
            progress.close()
    print(format_result(result))
    print(f"\ntrial directories: {(args.runs_dir / spec.name).resolve()}")
    if tracker.location is not None:
        print(
            f"MLflow: experiment {spec.mlflow_experiment_name()!r} at "
            f"{masked_uri(tracker.location.uri)}"
        )
        print(mlflow_ui_hint(tracker.location.uri, tracker.experiment_id, args.spec))
    return 0


class _Bars(CommandBars, TuneProgress):
    """tqdm bars: trials of the study, then per evaluation the user-periods and LLM calls."""

    def __init__(self, enabled: bool = True) -> None:
        super().__init__(enabled)
        self.trials: tqdm | None = None
        self._finished: int | None = None  # the study's count last shown

    def study_opened(self, *, requested: int, finished: int, running: int) -> None:
        more = f", {running} running elsewhere" if running else ""
        self._write(f"... study holds {finished}/{requested} finished trials{more}")
        self._finished = finished
        self.trials = make_bar(
            self.enabled, total=requested, initial=min(finished, requested), desc="trials"
        )

    def trial_started(self, number: int, parameters: Mapping[str, int]) -> None:
        self._write(f"    trial {number}: {parameter_slug(dict(parameters))}")

    def trial_reported(self, number: int, period: int, value: float, objective: str) -> None:
        self.evaluation.set_postfix(f"period {period}: {objective} {value:.3f}")

    def trial_finished(self, record: TrialRecord) -> None:
        text = f"    trial {record.number} {record.state}: {_trial_scores(record)}"
        if record.state == "pruned" and record.last_period is not None:
            text += f" (after period {record.last_period})"
        if record.state == "failed" and record.note:
            text += f" ({record.note[:120]})"
        self._write(text)
        if record.metrics.get("unreliable"):
            self._write(
                f"WARNING: trial {record.number}: THESE NUMBERS ARE NOT MEANINGFUL: more than "
                "half of its answers or upper-bound answers are unparseable (metric unreliable)"
            )

    def study_progress(self, *, finished: int, requested: int) -> None:
        if finished == self._finished:
            return
        self._finished = finished
        if self.trials is not None and not self.trials.disable:
            self.trials.n = min(finished, requested)
            self.trials.refresh()
        else:  # no bar drawn (not a terminal, or --no-progress): a plain line says it
            self._write(f"    study: {finished}/{requested} trials finished (all workers)")

    def heldout_finished(self, record: HeldoutRecord) -> None:
        self._write(
            f"    held-out {parameter_slug(record.parameters)}: "
            f"{scores_text(record.metrics, record.objective_used)}"
        )

    def evaluation_started(self, label: str) -> ProgressSink | None:
        return self.evaluation.sink(label)

    def close(self) -> None:
        super().close()
        if self.trials is not None:
            self.trials.close()
