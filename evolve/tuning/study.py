"""The tuning worker: run trials of an Optuna study until it holds the requested number.

Each trial evaluates the base policy with the trial's numeric parameters on-policy on the
train users (`evolve.simulator.evaluation.run_evaluation`, one directory per trial, resumable).
After every period (a barrier across users) the running objective is reported to Optuna with
`step = period` and the pruner may stop the trial; its partial results stay on disk and its
state is PRUNED. The objective is the memory score, or accuracy where the memory score is
undefined (an upper bound no better than random, common with a 0.5B agent); whether it is
defined depends on the environment and the upper bound only, so the fallback is the same for
every trial at a given period (`objective_value`). Optional second objective: the train
evaluation's tokens, minimized (a multi-objective study; Optuna prunes none of its trials).

Several workers (processes, machines) may run `run_study` on one study; the loop is
Optuna's own (`study.optimize`, public APIs only):

- grid points are queued once (`study.enqueue_trial`, in a seeded order) and popped by the
  workers; a point queued twice by two workers starting together runs once, the copy is
  discarded before evaluation (failed, tagged surplus);
- `MaxTrialsCallback` stops a worker when the requested number of trials are finished or
  running; a trial created in a race beyond that number is discarded the same way;
- on a database storage every trial has Optuna's heartbeat: a trial whose worker died is
  failed once its heartbeat is older than `[tuning] heartbeat_grace_s` and queued again
  with the same parameters (`RetryHeartbeatStaleTrialCallback`); the main invocation waits
  for trials running elsewhere, so a rerun after a killed worker completes the study.

The study therefore ends with exactly the requested number of finished trials (the loop:
`evolve.tuning.trials`). When it is complete, the best parameters (or the Pareto front) are
evaluated on the held-out users (`evolve.tuning.heldout`).

The upper-bound table is computed once per environment and agent model (cached on disk) and
shared by every trial and the held-out checks.

Spend is journaled as calls complete, not only recorded when a trial ends: every completed
LLM call of a worker appends a flushed line to `runs/<name>/spend/<study>/trial-NNNN.jsonl`
while trial NNNN runs, else to `main.jsonl` (or `worker-<host>-<pid>.jsonl` for `--worker`);
the study's spend is the sum over these files (`evolve.tuning.spend`, which documents the
format), so after `kill -9` it is short only by the calls in flight. The budget checks
re-read it (other workers spend too), `tuning.json` records it, `evolve compare` shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evolve.core.errors import ResumeMismatchError
from evolve.llm import RoleLMs
from evolve.llm.usage import Usage
from evolve.results.budget import Budget, BudgetExhausted, SpendListener
from evolve.simulator.environment import Environment
from evolve.simulator.run_dir import config_differences
from evolve.tuning.heldout import evaluate_heldout, record_heldout_choice
from evolve.tuning.job import StudyRun, TuneProgress, TuningJob, job_from
from evolve.tuning.layout import STUDY_ATTR_HASH, STUDY_ATTR_IDENTITY, TuningDir, storage_label
from evolve.tuning.records import TuningResult, trial_records
from evolve.tuning.samplers import build_pruner, build_sampler
from evolve.tuning.spec import ResolvedTuning, StudySpec, resolve_tuning
from evolve.tuning.spend import StudyBudget, StudySpendJournals
from evolve.tuning.storage import (
    fail_running_trials,
    name_objectives,
    open_study,
    storage_errors,
)
from evolve.tuning.tracking import NullStudyTracker, StudyContext, StudyTracker
from evolve.tuning.trials import TrialLoop

# Re-exported: callers build jobs and progress hooks from here, next to `run_study`.
__all__ = ["TuneProgress", "TuningJob", "TuningDir", "job_from", "run_study"]


def run_study(
    tuning: StudySpec | ResolvedTuning | TuningJob,
    lms: RoleLMs,
    *,
    runs_dir: str | Path = "runs",
    tracker: StudyTracker | None = None,
    progress: TuneProgress | None = None,
    upper_bound_cache: str | Path | None = None,
    upper_bound: Any = None,
    worker_only: bool = False,
    fail_running: bool = False,
    refresh_upper_bound: bool = False,
    wait: bool = False,
) -> TuningResult:
    """Run trials of the spec's study until it holds the requested number, then (unless
    `worker_only`) evaluate the best parameters on the held-out users. Resumes by default.

    The worker with the LMs already open; `evolve.api.run_tuning` (what `evolve tune` runs)
    opens them from the spec, locks the run directory and calls this.

    `upper_bound`: a table computed by the caller (e.g. the evolution loop) for a superset of
    the users; otherwise it is computed (or loaded from `upper_bound_cache`) once here.
    `refresh_upper_bound` asks every upper-bound question again instead of using the cache.
    `fail_running` first marks RUNNING trials failed (after a worker was killed on a storage
    without heartbeat); only use it when no other worker of the study is active.
    `wait`: the main invocation waits for trials running in other workers on every storage
    (it always does on a database storage, whose heartbeat retries a dead worker's trial;
    on a journal or Redis storage a killed worker's trial stays RUNNING until
    `fail_running`), then checks the held-out users.
    """
    if isinstance(tuning, StudySpec):
        tuning = resolve_tuning(tuning)
    job = job_from(tuning) if isinstance(tuning, ResolvedTuning) else tuning
    worker = _Worker(
        job,
        lms,
        study_dir=TuningDir(Path(runs_dir) / job.name),
        tracker=tracker or NullStudyTracker(),
        progress=progress or TuneProgress(),
        upper_bound_cache=Path(upper_bound_cache) if upper_bound_cache else None,
        upper_bound=upper_bound,
        refresh_upper_bound=refresh_upper_bound,
        wait=wait,
    )
    with storage_errors(job.storage_url):
        return worker.run(worker_only=worker_only, fail_running=fail_running)


class _Worker:
    """Opens the study, checks it was made with this configuration, then runs the trial loop
    and the held-out check on one `StudyRun`."""

    def __init__(
        self,
        job: TuningJob,
        lms: RoleLMs,
        *,
        study_dir: TuningDir,
        tracker: StudyTracker,
        progress: TuneProgress,
        upper_bound_cache: Path | None,
        upper_bound: Any,
        refresh_upper_bound: bool,
        wait: bool,
    ) -> None:
        self.job = job
        self.tuning = job.tuning
        self.lms = lms
        self.study_dir = study_dir
        self.tracker = tracker
        self.progress = progress
        self.upper_bound_cache = upper_bound_cache
        self.upper_bound: Any = upper_bound
        self.refresh_upper_bound = refresh_upper_bound
        self.wait = wait  # wait for other workers' trials on a storage without heartbeat

    def run(self, *, worker_only: bool, fail_running: bool) -> TuningResult:
        model_names = self.lms.model_names()
        identity = self.job.identity(model_names)
        digest = self.job.config_hash(model_names)
        directions = ["maximize"] + (["minimize"] if self.tuning.multi_objective else [])
        study = open_study(
            self.job.storage_url,
            self.job.study_name,
            directions=directions,
            sampler=build_sampler(self.tuning, self.job.seed),
            pruner=build_pruner(self.tuning),
            load_if_exists=self.tuning.load_if_exists,
            heartbeat_grace_s=self.tuning.heartbeat_grace_s,
        )
        self._check_identity(study, identity, digest)
        name_objectives(study, self.tuning.objectives)
        notes = list(self.job.notes)
        if fail_running:
            failed = fail_running_trials(study)
            if failed:
                notes.append(f"marked running trials {failed} failed (--fail-running)")
        before = trial_records(study)
        self.progress.study_opened(
            requested=self.job.trials,
            finished=sum(r.finished for r in before),
            running=sum(r.state == "running" for r in before),
        )
        # Spend journals of a stored study; an in-memory one (inside `evolve run`) has none:
        # it cannot resume, and the experiment journals the calls itself.
        journals = (
            StudySpendJournals(self.study_dir.root, self.job.study_name)
            if self.job.storage_url is not None
            else None
        )
        spend_listener: SpendListener | None = None
        if journals is not None:
            spend_listener = journals.listener(self.lms.usage, worker=worker_only)
            budget: Budget = StudyBudget(self.job.budget, self.lms, journals, before)
        else:
            budget = Budget(
                self.job.budget,
                self.lms,
                Usage(
                    requests=sum(r.llm_calls for r in before),
                    # Optuna holds the total only: counted as prompt tokens (see `Usage`).
                    prompt_tokens=sum(r.tokens for r in before),
                    wall_time_s=sum(r.wall_time_s or 0.0 for r in before),
                ),
            )
        run = StudyRun(
            job=self.job,
            lms=self.lms,
            study_dir=self.study_dir,
            tracker=self.tracker,
            progress=self.progress,
            study=study,
            digest=digest,
            budget=budget,
            journals=journals,
            spend_listener=spend_listener,
            upper_bound=self.upper_bound,
            notes=notes,
        )
        try:
            return self._run_recorded(run, model_names, worker_only=worker_only)
        finally:
            if spend_listener is not None:
                spend_listener.close()

    def _run_recorded(
        self, run: StudyRun, model_names: dict[str, str], *, worker_only: bool
    ) -> TuningResult:
        # From the start: `evolve compare` reads the spend of an invocation killed before
        # its first trial ended.
        self.study_dir.save_result(run.result())
        self.tracker.start(
            StudyContext(
                name=self.job.name,
                study_name=self.job.study_name,
                storage=storage_label(self.job.storage_url),
                config_hash=run.digest,
                spec=self.job.spec,
                run_dir=self.study_dir.root.resolve(),
                model_names=model_names,
                environment=self.job.environment_description,
                train_users=[item.id for item in self.job.train.items],
                heldout_users=[
                    item.id for item in (self.job.heldout.items if self.job.heldout else [])
                ],
                requested_trials=self.job.trials,
            )
        )
        stopped: str | None = None
        try:
            run.budget.check()
            self._prepare_upper_bound(run)
            TrialLoop(run, wait=self.wait).run_trials(worker_only=worker_only)
            if not worker_only:
                evaluate_heldout(run)
                record_heldout_choice(run)
        except BudgetExhausted as exhausted:
            stopped = exhausted.reason
        except BaseException:
            self.tracker.fail()
            raise
        result = run.result(stopped)
        self.study_dir.save_result(result)
        self.tracker.finish(result)
        return result

    def _check_identity(self, study: Any, identity: dict[str, Any], digest: str) -> None:
        attrs = study.user_attrs
        stored = attrs.get(STUDY_ATTR_HASH)
        if stored is None:
            study.set_user_attr(STUDY_ATTR_HASH, digest)
            study.set_user_attr(STUDY_ATTR_IDENTITY, identity)
            return
        if stored != digest:
            differences = config_differences(attrs.get(STUDY_ATTR_IDENTITY) or {}, identity)
            shown = "; ".join(differences[:4]) or "(identity not recorded)"
            raise ResumeMismatchError(
                f"study {self.job.study_name!r} in "
                f"{storage_label(self.job.storage_url)} was made with a different "
                f"configuration ({shown}); its trials are not comparable with this spec's. Set "
                "[tuning] study_name (or --study-name) to a new name, or delete the study "
                "(optuna delete-study --study-name ... --storage ...)"
            )

    def _prepare_upper_bound(self, run: StudyRun) -> None:
        from evolve.core.paths import cache_dir
        from evolve.simulator.baselines import compute_upper_bound

        if run.upper_bound is not None:
            return
        self.progress.stage("upper bound")
        items = list(self.job.train.items)
        if self.tuning.heldout != "none" and self.job.heldout is not None:
            items += list(self.job.heldout.items)
        # One table for train + held-out users (the runner accepts a superset), computed
        # once per environment and agent model and shared by every trial.
        run.upper_bound = compute_upper_bound(
            Environment(items=items),
            self.lms,
            self.upper_bound_cache or cache_dir() / "upper_bound",
            concurrency=self.job.concurrency,
            refresh=self.refresh_upper_bound,
            rules=self.job.episode.rules,
        )
