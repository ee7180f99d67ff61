"""`evolve run SPEC.toml`: run (or resume) a self-evolution experiment.

Validates the whole spec before any LLM call, opens the LMs of its `[llm]` table (command-line
LLM flags override it), runs the optimizer loop with progress bars, tracks it in MLflow,
prints the per-generation table and the best policy's lineage, and writes the best policy's
bundle to `runs/<name>/best_policy/`. An interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from evolve.commands import interrupt
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
from evolve.core.locking import run_lock
from evolve.llm import LLMConfig, open_role_lms, protocol_llm_config
from evolve.optimize import LoopProgress, evolve_policy, format_lineage, format_table
from evolve.optimize.loop import reflector_setup
from evolve.optimize.operators import check_operators
from evolve.optimize.report import format_outcome
from evolve.results.objective import scores_text
from evolve.results.records import CandidateRecord
from evolve.simulator.evaluation import ProgressSink
from evolve.spec.config import ExperimentSpec, ResolvedExperiment, load_spec, resolve, spec_label
from evolve.tracking import ExperimentTracker, tracker_for

BEST_POLICY_DIR = "best_policy"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run or resume a self-evolution experiment from a TOML spec",
        description="Evolve a memory policy: evaluate candidates on-policy on the train users, "
        "mutate them with GEPA (reflective and parameter operators), check the best "
        "on held-out users, and track everything in MLflow. Rerunning resumes.",
    )
    parser.add_argument("spec", type=Path, help="experiment spec, e.g. experiments/quickstart.toml")
    add_runs_dir(parser)
    add_tracking_flags(parser)
    add_no_progress(parser)
    add_upper_bound_flags(parser, cache_dir=False)
    add_llm_arguments(parser)
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    resolved = resolve(spec)  # everything checkable is checked before the first LLM call
    # Resolving imported the plugin modules, so every named operator can check the spec.
    check_operators(resolved.spec.optimizer, resolved.rules, label=spec_label(spec))
    llm_config = protocol_llm_config(llm_config_from_args(args, base=spec.llm), spec.rules)
    tracker = tracker_for(spec, tracking_uri=args.tracking_uri, enabled=not args.no_tracking)
    # One process per run directory: a second one would spend the budget again.
    with run_lock(args.runs_dir / spec.name, "run"):
        return _run_locked(args, spec, resolved, llm_config, tracker)


def _run_locked(
    args: argparse.Namespace,
    spec: ExperimentSpec,
    resolved: ResolvedExperiment,
    llm_config: LLMConfig,
    tracker: ExperimentTracker,
) -> int:
    print(
        f"experiment {spec.name}: {resolved.environment_description}; "
        f"{len(resolved.train.items)} train / "
        + (f"{len(resolved.validation.items)} validation / " if resolved.validation.items else "")
        + f"{len(resolved.heldout.items)} held-out users; "
        f"base policy {resolved.base_policy.kind}; schedule {spec.optimizer.schedule}",
        file=sys.stderr,
    )
    if tracker.location is not None:
        print(tracker.location.describe(), file=sys.stderr)
    kept = _kept_unreliable_evaluations(args.runs_dir / spec.name)
    if kept:
        # A rerun keeps an earlier invocation's scores as they are, broken ones included.
        print(
            f"evolve: kept {kept} candidate evaluation(s) of an earlier invocation in "
            f"{args.runs_dir / spec.name} whose answers were mostly unparseable (a broken "
            f"endpoint or a weak model); they are not asked again: delete "
            f"{args.runs_dir / spec.name} (or rename the experiment) to redo them",
            file=sys.stderr,
        )
    optimizer = spec.optimizer
    if optimizer.parameter_proposer == "optuna" or optimizer.tune_every is not None:
        import optuna

        # Optuna's per-trial INFO lines would break the progress bars; ours report the same.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
    progress = _Bars(enabled=not args.no_progress)
    # The line above said it for the run; no unit-level repeat of it.
    progress.evaluation.kept_units_said = bool(kept)
    embeds = resolved.base_policy.uses_embedder
    check_embedder(spec.protocol, [embeds])
    with open_role_lms(llm_config) as lms:
        reflector_role, _ = reflector_setup(spec)
        roles = ("simulator", "agent", reflector_role)
        print_protocol_start(spec.protocol, lms, roles, embeds=embeds)
        started = time.monotonic()
        try:
            result = evolve_policy(
                resolved,
                lms,
                runs_dir=args.runs_dir,
                tracker=tracker,
                progress=progress,
                refresh_upper_bound=args.refresh_upper_bound,
                stop=interrupt.STOP,
            )
            if result.complete:
                progress.all_generations_done()
        finally:
            progress.close()
        usage = lms.usage.snapshot()
    print(format_table(result, spec.rules))
    print()
    print(format_lineage(result))
    print()
    print(format_outcome(result))
    print(f"\nLLM usage of this invocation (cached responses cost nothing):\n{usage.table()}")
    print(usage.bill())
    print(f"wall time of this invocation: {time.monotonic() - started:.0f} s")
    questions = sum(
        scores.summary.n_items
        for record in result.candidates
        for scores in (record.train, record.heldout)
        if scores is not None
    )
    # Only when this invocation made every call of the run: a resumed run's earlier calls are
    # not in this invocation's usage, and its questions would dilute the figures.
    per_question = usage.per_question(questions) if usage.total_calls == result.llm_calls else None
    if per_question:
        print(per_question)
    if result.best_id is not None:
        from evolve.export.bundle import write_bundle
        from evolve.optimize.experiment_dir import ExperimentDir

        experiment_dir = ExperimentDir(args.runs_dir / spec.name)
        best = result.candidate(result.best_id)
        path = write_bundle(
            experiment_dir.policy_dir(best.id),
            experiment_dir.root / BEST_POLICY_DIR,
            spec.name,
            best,
        )
        print(f"\nbest policy ({best.id}): {path.resolve()}")
        print(
            f"register it: evolve export {args.spec} --out DIR   "
            f"load it: memory_policies.load({str(path)!r})"
        )
    if result.stopped:
        print(f"stopped early: {result.stopped}; raise the budget and rerun to continue")
    if tracker.location is not None:
        print(mlflow_ui_hint(tracker.location.uri, tracker.experiment_id, args.spec))
    return 0


def _kept_unreliable_evaluations(root: Path) -> int:
    """Train and held-out scores already on disk whose summary is `unreliable`."""
    from evolve.optimize.experiment_dir import ExperimentDir

    return sum(
        scores is not None and scores.summary.unreliable is not None
        for record in ExperimentDir(root).load_candidates()
        for scores in (record.train, record.heldout)
    )


class _Bars(CommandBars, LoopProgress):
    """tqdm bars: generations, then per evaluation the user-periods and LLM calls."""

    def __init__(self, enabled: bool = True) -> None:
        super().__init__(enabled)
        self.generations: tqdm | None = None

    def generation_started(self, generation: int, total: int) -> None:
        if self.generations is None:
            self.generations = make_bar(
                self.enabled, total=total + 1, desc="generations", position=0
            )
        self.generations.n = generation
        self.generations.refresh()

    def all_generations_done(self) -> None:
        if self.generations is not None:
            self.generations.n = self.generations.total
            self.generations.refresh()

    def candidate_proposed(self, record: CandidateRecord) -> None:
        if record.generation > 0:
            status = "" if record.status == "proposed" else f" [{record.status}]"
            self._write(f"    {record.id}: {record.mutation.describe()}{status}")

    def evaluation_started(self, record: CandidateRecord, split: str) -> ProgressSink | None:
        return self.evaluation.sink(f"{record.id} {split}")

    def unrecorded_evaluation_started(self, label: str) -> ProgressSink | None:
        return self.evaluation.sink(label)

    def evaluation_finished(self, record: CandidateRecord, split: str) -> None:
        scores = getattr(record, split)
        if scores is None:
            return
        metrics = scores.summary.flat_metrics()
        self._write(f"    {record.id} {split}: {scores_text(metrics, scores.objective_used)}")
        warning = scores.summary.conversation.warning()
        if warning:
            self._write(f"WARNING: {record.id} {split}: {warning}")
        if scores.summary.unreliable:
            self._write(
                f"WARNING: {record.id} {split}: THESE NUMBERS ARE NOT MEANINGFUL: "
                f"{scores.summary.unreliable}"
            )

    def close(self) -> None:
        super().close()
        if self.generations is not None:
            self.generations.close()
