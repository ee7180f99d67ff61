"""The tuning worker: run trials of an Optuna study until it holds the requested number.

Why one long module: `_Worker` is Optuna's objective plus its callbacks (pruning,
heartbeats, surplus trials, held-out checks) around one study; they share its state and are
only correct together.

Each trial evaluates the base policy with the trial's numeric parameters on-policy on the
train users (`evolve.simulator.runner.run_evaluation`, one directory per trial, resumable).
After every period (a barrier across users) the running objective is reported to Optuna with
`step = period` and the pruner may stop the trial; its partial results stay on disk and its
state is PRUNED. The objective is the memory score, or accuracy where the memory score is
undefined (an upper bound no better than random, common with a 0.5B agent); whether it is
defined depends on the environment and the upper bound only, so the fallback is the same for
every trial at a given period (`objective_value`). Optional second objective: the train
evaluation's tokens, minimized (a multi-objective study; Optuna prunes none of its trials).

Several workers (processes, machines) may run `run_tuning` on one study; the loop is
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

The study therefore ends with exactly the requested number of finished trials. When it is
complete, the best parameters (or the Pareto front) are evaluated on the held-out users.

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

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, TrialState

from evolve.budget import Budget, BudgetExhausted, Spend
from evolve.config import BudgetSpec
from evolve.errors import ResumeMismatchError
from evolve.files import atomic_write_json
from evolve.llm import RoleLMs
from evolve.objective import load_period_results, objective_used, objective_value
from evolve.seeds import derive_seed
from evolve.simulator.environment import Environment
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.simulator.runner import EpisodeConfig, ProgressSink, run_evaluation
from evolve.simulator.storage import (
    config_differences,
    config_hash,
    read_json,
    safe_name,
)
from evolve.tuning.records import (
    ATTR_LLM_CALLS,
    ATTR_METRICS,
    ATTR_MLFLOW_RUN,
    ATTR_NOTE,
    ATTR_OBJECTIVE_USED,
    ATTR_PERIODS,
    ATTR_RUN_DIR,
    ATTR_SEED,
    ATTR_STOPPED,
    ATTR_SURPLUS,
    ATTR_TOKENS,
    ATTR_WALL_TIME,
    ATTR_WORKER,
    IN_MEMORY_STORAGE,
    HeldoutRecord,
    TrialRecord,
    TuningResult,
    best_trial_numbers,
    record_choice,
    trial_record,
    trial_records,
)
from evolve.tuning.samplers import (
    GRID_POINT_ATTR,
    build_pruner,
    build_sampler,
    distributions,
    enqueue_grid_points,
    point_key,
    trial_point_key,
)
from evolve.tuning.spec import (
    ResolvedTuning,
    TuneSpec,
    TuningSpec,
    parameter_slug,
    resolve_tuning,
)
from evolve.tuning.spend import SpendRecorder, StudyBudget, StudySpendJournals
from evolve.tuning.storage import (
    fail_running_trials,
    fail_stale_trials,
    heartbeat_interval_for,
    open_study,
    redact_storage_url,
    storage_errors,
    storage_has_heartbeat,
)
from evolve.tuning.tracking import NullStudyTracker, StudyContext, StudyTracker

STUDY_ATTR_HASH = "evolve.config_hash"
STUDY_ATTR_IDENTITY = "evolve.identity"
RESULT_FILE = "tuning.json"
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
_TAKEN = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
# Attributes of one evaluation: a retried trial must not show its failed predecessor's.
_PER_RUN_ATTRS = (
    ATTR_NOTE,
    ATTR_STOPPED,
    ATTR_PERIODS,
    ATTR_METRICS,
    ATTR_MLFLOW_RUN,
    ATTR_LLM_CALLS,
    ATTR_TOKENS,
    ATTR_WALL_TIME,
)


class _SurplusTrial(Exception):
    """A trial that is not needed (see `_Worker._claim`): failed before any evaluation."""


@contextlib.contextmanager
def _optuna_quiet() -> Iterator[None]:
    """Optuna logs every failed trial with a traceback; the worker reports trials itself."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(verbosity, optuna.logging.ERROR))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


class TuneProgress:
    """Progress events of a tuning worker; every hook is optional (the CLI draws bars)."""

    def stage(self, text: str) -> None:
        """A preparatory step started (e.g. computing the upper bound)."""

    def study_opened(self, *, requested: int, finished: int, running: int) -> None:
        """The study holds `finished` finished and `running` running trials already."""

    def trial_started(self, number: int, parameters: Mapping[str, int]) -> None:
        """This worker starts trial `number`."""

    def evaluation_started(self, label: str) -> ProgressSink | None:
        """An evaluation starts; the returned sink receives the runner's events."""
        return None

    def trial_reported(self, number: int, period: int, value: float, objective: str) -> None:
        """Trial `number` reported `value` (of `objective`) after `period`."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial of this worker is complete, pruned or failed."""

    def study_progress(self, *, finished: int, requested: int) -> None:
        """The study holds `finished` finished trials of `requested`, every worker's counted
        (reported after each trial of this worker and while waiting for the others)."""

    def heldout_finished(self, record: HeldoutRecord) -> None:
        """A parameter setting was evaluated on the held-out users."""


class TuningStore:
    """`runs/<name>/`: trial and held-out runner directories and the latest result.

    Layout::

        trials/<study>/<NNNN>-<params>/   runner directory of trial NNNN (train users)
        heldout/<params>/                 runner directory of a held-out check
        spend/<study>/*.jsonl             spend journals (`evolve.tuning.spend`): one line
                                          per completed LLM call, per trial and per process
        tuning.json                       TuningResult of the latest invocation (written when
                                          it starts and after every trial)
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def trial_dir(self, study_name: str, number: int, parameters: Mapping[str, int]) -> Path:
        # The parameters are in the name: the same number with other parameters (a study
        # recreated in a new storage) never resumes a directory evaluated with different ones.
        slug = parameter_slug(dict(parameters))
        return self.root / "trials" / safe_name(study_name) / f"{number:04d}-{slug}"

    def heldout_dir(self, parameters: Mapping[str, int]) -> Path:
        return self.root / "heldout" / parameter_slug(dict(parameters))

    @property
    def result_file(self) -> Path:
        return self.root / RESULT_FILE

    def save_result(self, result: TuningResult) -> None:
        atomic_write_json(self.result_file, result.model_dump(mode="json"))

    def load_result(self) -> TuningResult:
        return TuningResult.model_validate(read_json(self.result_file))

    def relative(self, path: Path) -> str:
        return str(Path(path).relative_to(self.root))


@dataclass(frozen=True)
class TuningJob:
    """Everything a worker needs: built from a spec (`job_from`), or directly by callers that
    already hold an environment and a policy (`tune_best_candidate`)."""

    name: str
    tuning: TuningSpec
    trials: int
    study_name: str
    storage_url: str | None  # None: an in-memory study (no resume, no sharing)
    seed: int
    concurrency: int
    budget: BudgetSpec
    train: Environment
    heldout: Environment | None
    episode: EpisodeConfig
    base_policy: Any
    environment_description: str
    base_identity: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    spec: TuneSpec | None = None

    @property
    def space(self) -> dict[str, list[int]]:
        return self.tuning.grid()

    @property
    def base_parameters(self) -> dict[str, int]:
        return dict(self.base_policy.parameters())

    def identity(self, model_names: dict[str, str]) -> dict[str, Any]:
        """What trial values depend on (see `ResolvedTuning.identity`)."""
        return {
            **self.base_identity,
            "protocol": self.episode.protocol,  # always, as in ExperimentSpec.identity
            "environment": self.train.content_hash(),
            "train_users": [item.id for item in self.train.items],
            "episode": self.episode.identity(),
            "base_policy": {
                "kind": self.base_policy.kind,
                "parameters": self.base_parameters,
                "components": self.base_policy.components(),
            },
            "models": {role: model_names.get(role) for role in ("simulator", "agent")},
            "seed": self.seed,
            "objectives": list(self.tuning.objectives),
            "space": self.space,
        }

    def config_hash(self, model_names: dict[str, str]) -> str:
        return config_hash(self.identity(model_names))


def job_from(resolved: ResolvedTuning) -> TuningJob:
    experiment = resolved.experiment
    spec = resolved.spec
    return TuningJob(
        name=spec.name,
        tuning=spec.tuning,
        trials=resolved.trials,
        study_name=resolved.study_name,
        storage_url=resolved.storage_url,
        seed=spec.seed,
        concurrency=spec.concurrency,
        budget=spec.budget,
        train=experiment.train,
        heldout=experiment.heldout,
        episode=experiment.episode,
        base_policy=experiment.base_policy,
        environment_description=experiment.environment_description,
        notes=list(resolved.notes),
        spec=spec,
    )


def run_tuning(
    tuning: TuneSpec | ResolvedTuning | TuningJob,
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
    if isinstance(tuning, TuneSpec):
        tuning = resolve_tuning(tuning)
    job = job_from(tuning) if isinstance(tuning, ResolvedTuning) else tuning
    worker = _Worker(
        job,
        lms,
        store=TuningStore(Path(runs_dir) / job.name),
        tracker=tracker or NullStudyTracker(),
        progress=progress or TuneProgress(),
        upper_bound_cache=Path(upper_bound_cache) if upper_bound_cache else None,
        upper_bound=upper_bound,
    )
    worker.refresh_upper_bound = refresh_upper_bound
    worker.wait = wait
    with storage_errors(job.storage_url):
        return worker.run(worker_only=worker_only, fail_running=fail_running)


class _Worker:
    def __init__(
        self,
        job: TuningJob,
        lms: RoleLMs,
        *,
        store: TuningStore,
        tracker: StudyTracker,
        progress: TuneProgress,
        upper_bound_cache: Path | None,
        upper_bound: Any = None,
    ) -> None:
        self.job = job
        self.tuning = job.tuning
        self.lms = lms
        self.store = store
        self.tracker = tracker
        self.progress = progress
        self.upper_bound_cache = upper_bound_cache
        self.distributions = distributions(self.tuning)
        self.upper_bound: Any = upper_bound
        self.refresh_upper_bound = False
        self.wait = False  # wait for other workers' trials on a storage without heartbeat
        self.heldout: list[HeldoutRecord] = []
        self.notes = list(job.notes)
        train = job.train.items
        self.last_period = max(len(item.periods) for item in train) - 1
        self.heartbeat = storage_has_heartbeat(job.storage_url)
        # Main invocation waiting for other workers' trials: look again about once a beat.
        self.poll_s = float(min(5, heartbeat_interval_for(self.tuning.heartbeat_grace_s)))
        self._current: int | None = None  # the trial this worker is evaluating
        self._returned: int | None = None  # the last trial whose evaluation returned values
        # Spend journals of a stored study; an in-memory one (inside `evolve run`) has none:
        # it cannot resume, and the experiment journals the calls itself.
        self.journals = (
            StudySpendJournals(store.root, job.study_name) if job.storage_url is not None else None
        )
        self.recorder: SpendRecorder | None = None

    # ----- top level ------------------------------------------------------------------------

    def run(self, *, worker_only: bool, fail_running: bool) -> TuningResult:
        model_names = self.lms.model_names()
        identity = self.job.identity(model_names)
        digest = self.job.config_hash(model_names)
        directions = ["maximize"] + (["minimize"] if self.tuning.multi_objective else [])
        self.study = open_study(
            self.job.storage_url,
            self.job.study_name,
            directions=directions,
            sampler=build_sampler(self.tuning, self.job.seed),
            pruner=build_pruner(self.tuning),
            load_if_exists=self.tuning.load_if_exists,
            heartbeat_grace_s=self.tuning.heartbeat_grace_s,
        )
        self._check_identity(identity, digest)
        if fail_running:
            failed = fail_running_trials(self.study)
            if failed:
                self.notes.append(f"marked running trials {failed} failed (--fail-running)")
        before = trial_records(self.study)
        self.progress.study_opened(
            requested=self.job.trials,
            finished=sum(r.finished for r in before),
            running=sum(r.state == "running" for r in before),
        )
        if self.journals is not None:
            self.recorder = SpendRecorder(self.journals, self.lms.usage, worker=worker_only)
            self.budget: Budget = StudyBudget(self.job.budget, self.lms, self.journals, before)
        else:
            self.budget = Budget(
                self.job.budget,
                self.lms,
                Spend(
                    llm_calls=sum(r.llm_calls for r in before),
                    tokens=sum(r.tokens for r in before),
                    wall_time_s=sum(r.wall_time_s or 0.0 for r in before),
                ),
            )
        try:
            return self._run_recorded(model_names, digest, worker_only=worker_only)
        finally:
            if self.recorder is not None:
                self.recorder.close()

    def _run_recorded(
        self, model_names: dict[str, str], digest: str, *, worker_only: bool
    ) -> TuningResult:
        # From the start: `evolve compare` reads the spend of an invocation killed before
        # its first trial ended.
        self.store.save_result(self._result(digest))
        self.tracker.start(
            StudyContext(
                name=self.job.name,
                study_name=self.job.study_name,
                storage=_storage_label(self.job.storage_url),
                config_hash=digest,
                spec=self.job.spec,
                run_dir=self.store.root.resolve(),
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
            self.budget.check()
            self._prepare_upper_bound()
            self._run_trials(worker_only=worker_only)
            if not worker_only:
                self._evaluate_heldout()
                self._record_choice()
        except BudgetExhausted as exhausted:
            stopped = exhausted.reason
        except BaseException:
            self.tracker.fail()
            raise
        result = self._result(digest, stopped)
        self.store.save_result(result)
        self.tracker.finish(result)
        return result

    def _check_identity(self, identity: dict[str, Any], digest: str) -> None:
        attrs = self.study.user_attrs
        stored = attrs.get(STUDY_ATTR_HASH)
        if stored is None:
            self.study.set_user_attr(STUDY_ATTR_HASH, digest)
            self.study.set_user_attr(STUDY_ATTR_IDENTITY, identity)
            return
        if stored != digest:
            differences = config_differences(attrs.get(STUDY_ATTR_IDENTITY) or {}, identity)
            shown = "; ".join(differences[:4]) or "(identity not recorded)"
            raise ResumeMismatchError(
                f"study {self.job.study_name!r} in "
                f"{_storage_label(self.job.storage_url)} was made with a different "
                f"configuration ({shown}); its trials are not comparable with this spec's. Set "
                "[tuning] study_name (or --study-name) to a new name, or delete the study "
                "(optuna delete-study --study-name ... --storage ...)"
            )

    def _prepare_upper_bound(self) -> None:
        from evolve.paths import cache_dir
        from evolve.simulator.baselines import compute_upper_bound

        if self.upper_bound is not None:
            return
        self.progress.stage("upper bound")
        items = list(self.job.train.items)
        if self.tuning.heldout != "none" and self.job.heldout is not None:
            items += list(self.job.heldout.items)
        # One table for train + held-out users (the runner accepts a superset), computed
        # once per environment and agent model and shared by every trial.
        self.upper_bound = compute_upper_bound(
            Environment(items=items),
            self.lms,
            self.upper_bound_cache or cache_dir() / "upper_bound",
            concurrency=self.job.concurrency,
            refresh=self.refresh_upper_bound,
            protocol=self.job.episode.protocol,
        )

    # ----- trials ---------------------------------------------------------------------------

    def _count(self, states: tuple[TrialState, ...]) -> int:
        return len(self.study.get_trials(deepcopy=False, states=states))

    def _run_trials(self, *, worker_only: bool) -> None:
        """Run trials until the study holds the requested number of finished ones.

        Each pass fails trials whose worker died (stale heartbeat; the storage queues them
        again), queues missing grid points, and lets `study.optimize` run queued and new
        trials until `MaxTrialsCallback` sees the requested number finished or running. The
        main invocation then waits for trials running elsewhere (they finish, or their
        heartbeat goes stale and they are retried here); an extra worker simply stops.
        """
        requested = self.job.trials
        grid = self.tuning.sampler == "grid"
        announced = False
        while True:
            fail_stale_trials(self.study)
            if grid:
                enqueue_grid_points(self.study, self.job.space, self.job.seed, requested)
            finished = self._count(_FINISHED)
            self.progress.study_progress(finished=finished, requested=requested)
            running = self._count((TrialState.RUNNING,))
            waiting = self._count((TrialState.WAITING,))
            # Queued trials always go through the loop: a duplicate (two workers queued the
            # grid at once) is discarded there before evaluation.
            if waiting or (finished + running < requested and not grid):
                self.budget.check()
                self._optimize()
                continue
            if finished >= requested:
                return
            if running and (self.heartbeat or self.wait) and not worker_only:
                if not announced:
                    announced = True
                    self.progress.stage(
                        f"waiting for {running} trial(s) running in other workers; "
                        + (
                            "a trial whose worker stopped is failed after heartbeat_grace_s = "
                            f"{self.tuning.heartbeat_grace_s} s without a heartbeat and "
                            "retried here"
                            if self.heartbeat
                            else "this storage has no heartbeat: if a worker was killed, stop "
                            "this wait (Ctrl-C) and rerun with --fail-running"
                        )
                    )
                time.sleep(self.poll_s)
                continue
            if running and not self.heartbeat and self.job.storage_url is not None:
                self.notes.append(
                    f"{running} trial(s) are RUNNING in a storage without heartbeat; rerun "
                    "evolve tune with --wait to wait for them and then check the held-out "
                    "users; if their worker was killed, rerun with --fail-running (when no "
                    "worker is active)"
                )
            elif not running:
                self.notes.append(
                    "every grid point is held by a trial, yet fewer than the requested number "
                    "finished; ask for fewer trials"
                )
            return

    def _optimize(self) -> None:
        callbacks = [
            self._after_trial,
            # Running trials count: a worker stops when the remaining trials are taken by
            # others, instead of starting one that would exceed the requested number.
            MaxTrialsCallback(
                self.job.trials,
                states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING),
            ),
        ]
        self._current = None
        try:
            with _optuna_quiet():
                self.study.optimize(self._objective, callbacks=callbacks, catch=(_SurplusTrial,))
        except ValueError:
            # Optuna refuses to tell a trial another worker already failed: this worker's
            # heartbeat lapsed for longer than the grace period (a stalled machine) and the
            # trial was retried elsewhere. Its evaluation is kept on disk; carry on.
            number = self._current
            if number is None or self._returned != number:
                raise  # the evaluation itself failed
            self._current = None
            self.notes.append(
                f"trial {number} was failed by another worker while it ran (no heartbeat for "
                f"{self.tuning.heartbeat_grace_s} s; raise [tuning] heartbeat_grace_s on a "
                "loaded machine) and retried"
            )
        except BaseException:
            # A trial ended by an error (interrupt, budget, LLM failure): Optuna marked it
            # failed and skipped the callbacks; record it, then let the error stop the worker.
            if self._current is not None:
                self._report(self._frozen(self._current))
            raise

    def _frozen(self, number: int) -> FrozenTrial:
        return next(t for t in self.study.get_trials(deepcopy=False) if t.number == number)

    def _after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get(ATTR_SURPLUS):
            study.stop()  # the requested trials are taken: nothing more for this worker
            return
        self._current = None
        self._report(trial)
        # Never complete here, even after the last trial: the held-out check follows, and
        # a kill before it must leave a result that a rerun completes.
        result = self._result(self.job.config_hash(self.lms.model_names()))
        self.store.save_result(result.model_copy(update={"complete": False}))
        self.budget.check()  # raised out of `optimize`: no new trial starts over the budget

    def _report(self, trial: FrozenTrial) -> None:
        record = trial_record(trial)
        self.tracker.trial_finished(record)
        self.progress.trial_finished(record)
        # The study's count, not this worker's: other workers finish trials too.
        self.progress.study_progress(finished=self._count(_FINISHED), requested=self.job.trials)

    def _claim(self, trial: optuna.Trial) -> bool:
        """Whether this trial may be evaluated: not beyond the requested number (counting
        older trials only, so that of two racing workers the later trial yields) and, for
        the grid, a queued point that no other trial holds."""
        others = [t for t in self.study.get_trials(deepcopy=False) if t.number != trial.number]
        older_live = sum(t.number < trial.number and t.state in _TAKEN for t in others)
        if older_live >= self.job.trials:
            return False
        if self.tuning.sampler != "grid":
            return True
        point = trial.user_attrs.get(GRID_POINT_ATTR)
        if point is None:  # made by the sampler: another worker took the last queued point
            return False
        key = point_key(point)
        for other in others:
            if trial_point_key(other) != key:
                continue
            if other.state in _FINISHED:
                return False
            if other.state in (TrialState.RUNNING, TrialState.WAITING) and (
                other.number < trial.number
            ):
                return False
        return True

    def _suggest(self, trial: optuna.Trial, name: str) -> int:
        distribution = self.distributions[name]
        if isinstance(distribution, IntDistribution):
            return trial.suggest_int(
                name, distribution.low, distribution.high, step=distribution.step
            )
        assert isinstance(distribution, CategoricalDistribution)
        return int(trial.suggest_categorical(name, list(distribution.choices)))

    def _objective(self, trial: optuna.Trial) -> float | list[float]:
        if not self._claim(trial):
            trial.set_user_attr(ATTR_SURPLUS, True)
            raise _SurplusTrial(f"trial {trial.number} is not needed")
        self._current = trial.number
        # A retried trial (its worker died) starts with the attributes of the failed one.
        for key in _PER_RUN_ATTRS:
            if trial.user_attrs.get(key) is not None:
                trial.set_user_attr(key, None)
        parameters = {name: self._suggest(trial, name) for name in self.job.space}
        values = self._evaluate(trial, parameters)
        self._returned = trial.number
        return values

    def _evaluate(self, trial: optuna.Trial, parameters: dict[str, int]) -> float | list[float]:
        number = trial.number
        policy = self.job.base_policy.with_parameters(**parameters)
        run_dir = self._failed_run_dir(parameters, number) or self.store.trial_dir(
            self.job.study_name, number, parameters
        )
        seed = derive_seed(self.job.seed, "trial", number)
        trial.set_user_attr(ATTR_RUN_DIR, self.store.relative(run_dir))
        trial.set_user_attr(ATTR_WORKER, f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr(ATTR_SEED, seed)
        run_id = self.tracker.trial_started(number, parameters, seed)
        if run_id:
            trial.set_user_attr(ATTR_MLFLOW_RUN, run_id)
        self.progress.trial_started(number, parameters)
        journaled = (
            self.recorder.trial(number) if self.recorder is not None else contextlib.nullcontext()
        )
        with journaled:
            return self._evaluate_journaled(trial, number, parameters, policy, run_dir)

    def _evaluate_journaled(
        self,
        trial: optuna.Trial,
        number: int,
        parameters: dict[str, int],
        policy: Any,
        run_dir: Path,
    ) -> float | list[float]:
        usage_before = self.lms.usage.snapshot()
        started = time.perf_counter()
        periods: dict[int, float] = {}
        latest: list[MetricSummary] = []
        objective = self.tuning.objective
        wilcoxon = self.tuning.pruner.kind == "wilcoxon"

        def on_period_end(period: int, summary: MetricSummary) -> None:
            latest[:] = [summary]
            scored = summary
            if wilcoxon:  # paired per-instance values: this period's own score
                scored = summarize_periods(
                    load_period_results(run_dir, periods=[period]), self.upper_bound
                )
            value = objective_value(scored, objective)
            used = _objective_used(scored, objective)
            periods[period] = value
            trial.set_user_attr(ATTR_PERIODS, {str(k): v for k, v in periods.items()})
            trial.set_user_attr(ATTR_OBJECTIVE_USED, used)
            self.tracker.trial_period(number, period, summary, value)
            self.progress.trial_reported(number, period, value, used)
            if not self.tuning.multi_objective:
                trial.report(value, period)
            if period < self.last_period:  # a finished evaluation is never thrown away
                self.budget.check()
                if not self.tuning.multi_objective and trial.should_prune():
                    raise optuna.TrialPruned(f"pruned after period {period} at {value:.3f}")

        try:
            report = run_evaluation(
                self.job.train,
                policy,
                self.lms,
                run_dir,
                self.job.episode,
                on_period_end=on_period_end,
                progress=self.tracker.evaluation_sink(
                    "train", self.progress.evaluation_started(f"trial {number}"), trial=number
                ),
                upper_bound=self.upper_bound,
            )
            summary = report.summary
            latest[:] = [summary]
            values = [objective_value(summary, objective)]
            trial.set_user_attr(ATTR_OBJECTIVE_USED, _objective_used(summary, objective))
            if self.tuning.multi_objective:
                values.append(float(summary.tokens))
                return values
            return values[0]
        except optuna.TrialPruned as pruned:
            trial.set_user_attr(ATTR_NOTE, str(pruned))
            raise
        except BudgetExhausted as exhausted:
            trial.set_user_attr(ATTR_STOPPED, f"stopped: {exhausted.reason}")
            raise
        except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised
            trial.set_user_attr(ATTR_NOTE, f"{type(exc).__name__}: {exc}"[:300])
            raise
        finally:
            spent = self.lms.usage.snapshot().minus(usage_before)
            trial.set_user_attr(ATTR_LLM_CALLS, spent.total_requests)
            trial.set_user_attr(ATTR_TOKENS, spent.total_tokens)
            trial.set_user_attr(ATTR_WALL_TIME, time.perf_counter() - started)
            if latest:
                trial.set_user_attr(ATTR_METRICS, latest[0].flat_metrics())

    def _failed_run_dir(self, parameters: Mapping[str, int], number: int) -> Path | None:
        """The directory of an earlier failed (e.g. interrupted) trial with the same parameters:
        the runner resumes its finished user-periods instead of recomputing them."""
        trials = self.study.get_trials(deepcopy=False)
        in_use = {
            t.user_attrs.get(ATTR_RUN_DIR)
            for t in trials
            if t.state == TrialState.RUNNING and t.number != number
        }
        for t in sorted(trials, key=lambda t: -t.number):
            run_dir = t.user_attrs.get(ATTR_RUN_DIR)
            if (
                t.state == TrialState.FAIL
                and not t.user_attrs.get(ATTR_SURPLUS)
                and run_dir
                and run_dir not in in_use
                and {k: int(v) for k, v in t.params.items()} == dict(parameters)
                and (self.store.root / run_dir).is_dir()
            ):
                return self.store.root / run_dir
        return None

    # ----- held-out users -------------------------------------------------------------------

    def _evaluate_heldout(self) -> None:
        if self.tuning.heldout == "none" or self.job.heldout is None:
            return
        if self._count(_FINISHED) < self.job.trials:
            self.notes.append(
                "held-out evaluation waits for the study to finish (trials of other workers "
                "are still running); rerun evolve tune with --wait: it waits for them, then "
                "checks the held-out users"
            )
            return
        numbers = best_trial_numbers(self.study)
        if not numbers:
            self.notes.append("no trial completed (all pruned or failed): nothing to check")
            return
        trials = {t.number: t for t in self.study.get_trials(deepcopy=False)}
        label = "best"
        if self.tuning.multi_objective:
            label = "pareto"
            numbers = sorted(numbers, key=lambda n: (-trials[n].values[0], trials[n].values[1]))
            numbers = numbers[: self.tuning.heldout_max_trials]
        settings: list[tuple[str, int | None, dict[str, int]]] = [
            (label, n, {k: int(v) for k, v in trials[n].params.items()}) for n in numbers
        ]
        if self.tuning.heldout == "best_and_base":
            base = self.job.base_parameters
            if all({**base, **params} != base for _, _, params in settings):
                settings.append(("base", None, base))
        for label, number, parameters in settings:
            self.budget.check()
            policy = self.job.base_policy.with_parameters(**parameters)
            run_dir = self.store.heldout_dir(policy.parameters())
            title = f"held-out {parameter_slug(parameters)}"
            report = run_evaluation(
                self.job.heldout,
                policy,
                self.lms,
                run_dir,
                self.job.episode,
                progress=self.tracker.evaluation_sink(
                    "heldout", self.progress.evaluation_started(title), label=title
                ),
                upper_bound=self.upper_bound,
            )
            summary = report.summary
            record = HeldoutRecord(
                label=label,
                trial=number,
                parameters=parameters,
                score=objective_value(summary, self.tuning.objective),
                objective_used=_objective_used(summary, self.tuning.objective),
                metrics=summary.flat_metrics(),
                run_dir=self.store.relative(run_dir),
            )
            self.heldout.append(record)
            self.progress.heldout_finished(record)

    def _record_choice(self) -> None:
        """The chosen trial(s) and their held-out results on the study, once it is complete."""
        numbers = best_trial_numbers(self.study)
        if numbers and self._count(_FINISHED) >= self.job.trials:
            record_choice(self.study, numbers, self.heldout)

    # ----- result ---------------------------------------------------------------------------

    def _result(self, digest: str, stopped: str | None = None) -> TuningResult:
        if self.journals is not None:
            records = trial_records(self.study, self.journals.trial_spend())
            spent = self.journals.total(records)
        else:
            records = trial_records(self.study)
            spent = self.budget.spent()
        notes = list(self.notes)
        objective = self.tuning.objective
        if objective == "memory_score" and any(
            r.objective_used == "accuracy" for r in records if r.finished
        ):
            notes.append(
                "the memory score is undefined here (the agent's upper bound is no better than "
                "random on these users, common with a small model): accuracy is the objective"
            )
        surplus = sum(r.state == "surplus" for r in records)
        if surplus:
            notes.append(
                f"{surplus} trial(s) created in a race between workers beyond the requested "
                "number were discarded before evaluation (state surplus)"
            )
        finished = sum(r.finished for r in records)
        return TuningResult(
            name=self.job.name,
            study_name=self.job.study_name,
            storage=_storage_label(self.job.storage_url),
            config_hash=digest,
            objectives=list(self.tuning.objectives),
            sampler=self.tuning.sampler,
            pruner=self.tuning.pruner.kind if not self.tuning.multi_objective else "none",
            requested_trials=self.job.trials,
            space=self.job.space,
            base_parameters=self.job.base_parameters,
            trials=records,
            best=best_trial_numbers(self.study),
            heldout=list(self.heldout),
            notes=notes,
            complete=finished >= self.job.trials and stopped is None,
            stopped=stopped,
            llm_calls=spent.llm_calls,
            tokens=spent.tokens,
        )


def _objective_used(summary: MetricSummary, objective: str) -> str:
    return objective_used(summary, objective)


def _storage_label(url: str | None) -> str:
    return redact_storage_url(url) if url is not None else IN_MEMORY_STORAGE
