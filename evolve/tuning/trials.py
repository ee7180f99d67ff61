"""The trial loop of a tuning worker: Optuna's objective and its callbacks (pruning after each
period, surplus trials, stale heartbeats, the wait for other workers' trials).

The loop is Optuna's own (`study.optimize`, public APIs only); `evolve.tuning.study`
describes how several workers share one study.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution
from optuna.study import MaxTrialsCallback
from optuna.trial import FrozenTrial, TrialState

from evolve.core.seeds import derive_seed
from evolve.results.budget import BudgetExhausted
from evolve.results.objective import load_period_results, objective_used, objective_value
from evolve.simulator.evaluation import run_evaluation
from evolve.simulator.metrics import MetricSummary, summarize_periods
from evolve.tuning.job import FINISHED, StudyRun
from evolve.tuning.layout import TuningDir
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
    trial_record,
)
from evolve.tuning.samplers import (
    GRID_POINT_ATTR,
    distributions,
    enqueue_grid_points,
    point_key,
    trial_point_key,
)
from evolve.tuning.storage import fail_stale_trials, heartbeat_interval_for, storage_has_heartbeat

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
    """A trial that is not needed (see `may_evaluate`): failed before any evaluation."""


@contextlib.contextmanager
def _optuna_quiet() -> Iterator[None]:
    """Optuna logs every failed trial with a traceback; the worker reports trials itself."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(max(verbosity, optuna.logging.ERROR))
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


class TrialLoop:
    """Runs trials of `run.study` until it holds the requested number of finished ones."""

    def __init__(self, run: StudyRun, *, wait: bool) -> None:
        self.run = run
        self.job = run.job
        self.tuning = run.tuning
        self.wait = wait  # wait for other workers' trials on a storage without heartbeat
        self.distributions = distributions(self.tuning)
        self.last_period = max(len(item.periods) for item in self.job.train.items) - 1
        self.heartbeat = storage_has_heartbeat(self.job.storage_url)
        # Main invocation waiting for other workers' trials: look again about once a beat.
        self.poll_s = float(min(5, heartbeat_interval_for(self.tuning.heartbeat_grace_s)))
        self._current: int | None = None  # the trial this worker is evaluating
        self._returned: int | None = None  # the last trial whose evaluation returned values
        # RUNNING trials seen without a heartbeat: number -> when first seen (monotonic).
        self._beatless: dict[int, float] = {}

    def run_trials(self, *, worker_only: bool) -> None:
        """Run trials until the study holds the requested number of finished ones.

        Each pass fails trials whose worker died (stale heartbeat; the storage queues them
        again), queues missing grid points, and lets `study.optimize` run queued and new
        trials until `MaxTrialsCallback` sees the requested number finished or running. The
        main invocation then waits for trials running elsewhere (they finish, or their
        heartbeat goes stale and they are retried here); an extra worker simply stops.
        """
        run = self.run
        requested = self.job.trials
        grid = self.tuning.sampler == "grid"
        announced = False
        while True:
            fail_stale_trials(
                run.study, self.job.storage_url, self.tuning.heartbeat_grace_s, self._beatless
            )
            if grid:
                enqueue_grid_points(run.study, self.job.space, self.job.seed, requested)
            finished = run.finished()
            run.progress.study_progress(finished=finished, requested=requested)
            running = run.count((TrialState.RUNNING,))
            waiting = run.count((TrialState.WAITING,))
            # Queued trials always go through the loop: a duplicate (two workers queued the
            # grid at once) is discarded there before evaluation.
            if waiting or (finished + running < requested and not grid):
                run.budget.check()
                self._optimize()
                continue
            if finished >= requested:
                return
            if running and (self.heartbeat or self.wait) and not worker_only:
                if not announced:
                    announced = True
                    run.progress.stage(
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
                run.notes.append(
                    f"{running} trial(s) are RUNNING in a storage without heartbeat; rerun "
                    "evolve tune with --wait to wait for them and then check the held-out "
                    "users; if their worker was killed, rerun with --fail-running (when no "
                    "worker is active)"
                )
            elif not running:
                run.notes.append(
                    "every grid point is held by a trial, yet fewer than the requested number "
                    "finished; ask for fewer trials"
                )
            return

    def _optimize(self) -> None:
        callbacks = [
            self._after_trial,
            # Running trials count: a worker stops when the remaining trials are taken by
            # others, instead of starting one that would exceed the requested number.
            MaxTrialsCallback(self.job.trials, states=_TAKEN),
        ]
        self._current = None
        try:
            with _optuna_quiet():
                self.run.study.optimize(
                    self._objective, callbacks=callbacks, catch=(_SurplusTrial,)
                )
        except ValueError:
            # Optuna refuses to tell a trial another worker already failed: this worker's
            # heartbeat lapsed for longer than the grace period (a stalled machine) and the
            # trial was retried elsewhere. Its evaluation is kept on disk; carry on.
            number = self._current
            if number is None or self._returned != number:
                raise  # the evaluation itself failed
            self._current = None
            self.run.notes.append(
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
        return next(t for t in self.run.study.get_trials(deepcopy=False) if t.number == number)

    def _after_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.user_attrs.get(ATTR_SURPLUS):
            study.stop()  # the requested trials are taken: nothing more for this worker
            return
        self._current = None
        self._report(trial)
        # Never complete here, even after the last trial: the held-out check follows, and
        # a kill before it must leave a result that a rerun completes.
        result = self.run.result()
        self.run.study_dir.save_result(result.model_copy(update={"complete": False}))
        self.run.budget.check()  # raised out of `optimize`: no new trial starts over the budget

    def _report(self, trial: FrozenTrial) -> None:
        record = trial_record(trial)
        self.run.tracker.trial_finished(record)
        self.run.progress.trial_finished(record)
        # The study's count, not this worker's: other workers finish trials too.
        self.run.progress.study_progress(finished=self.run.finished(), requested=self.job.trials)

    def _objective(self, trial: optuna.Trial) -> float | list[float]:
        if not may_evaluate(self.run.study, trial, self.job.trials, self.tuning.sampler == "grid"):
            trial.set_user_attr(ATTR_SURPLUS, True)
            raise _SurplusTrial(f"trial {trial.number} is not needed")
        self._current = trial.number
        # A retried trial (its worker died) starts with the attributes of the failed one.
        for key in _PER_RUN_ATTRS:
            if trial.user_attrs.get(key) is not None:
                trial.set_user_attr(key, None)
        parameters = {
            name: suggest(trial, name, self.distributions[name]) for name in self.job.space
        }
        values = self._evaluate(trial, parameters)
        self._returned = trial.number
        return values

    def _evaluate(self, trial: optuna.Trial, parameters: dict[str, int]) -> float | list[float]:
        run = self.run
        number = trial.number
        policy = self.job.base_policy.with_parameters(**parameters)
        run_dir = failed_run_dir(
            run.study, run.study_dir, parameters, number
        ) or run.study_dir.trial_dir(self.job.study_name, number, parameters)
        seed = derive_seed(self.job.seed, "trial", number)
        trial.set_user_attr(ATTR_RUN_DIR, run.study_dir.relative(run_dir))
        trial.set_user_attr(ATTR_WORKER, f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr(ATTR_SEED, seed)
        run_id = run.tracker.trial_started(number, parameters, seed)
        if run_id:
            trial.set_user_attr(ATTR_MLFLOW_RUN, run_id)
        run.progress.trial_started(number, parameters)
        journaled = (
            run.journals.trial(run.spend_listener, number)
            if run.journals is not None and run.spend_listener is not None
            else contextlib.nullcontext()
        )
        with journaled:
            return self._evaluate_journaled(trial, number, policy, run_dir)

    def _evaluate_journaled(
        self, trial: optuna.Trial, number: int, policy: Any, run_dir: Path
    ) -> float | list[float]:
        run = self.run
        usage_before = run.lms.usage.snapshot()
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
                    load_period_results(run_dir, periods=[period]), run.upper_bound
                )
            value = objective_value(scored, objective)
            used = objective_used(scored, objective)
            periods[period] = value
            trial.set_user_attr(ATTR_PERIODS, {str(k): v for k, v in periods.items()})
            trial.set_user_attr(ATTR_OBJECTIVE_USED, used)
            run.tracker.trial_period(number, period, summary, value)
            run.progress.trial_reported(number, period, value, used)
            if not self.tuning.multi_objective:
                trial.report(value, period)
            if period < self.last_period:  # a finished evaluation is never thrown away
                run.budget.check()
                if not self.tuning.multi_objective and trial.should_prune():
                    raise optuna.TrialPruned(f"pruned after period {period} at {value:.3f}")

        try:
            report = run_evaluation(
                self.job.train,
                policy,
                run.lms,
                run_dir,
                self.job.episode,
                on_period_end=on_period_end,
                progress=run.tracker.evaluation_sink(
                    "train", run.progress.evaluation_started(f"trial {number}"), trial=number
                ),
                upper_bound=run.upper_bound,
            )
            summary = report.summary
            latest[:] = [summary]
            values = [objective_value(summary, objective)]
            trial.set_user_attr(ATTR_OBJECTIVE_USED, objective_used(summary, objective))
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
            spent = run.lms.usage.snapshot().minus(usage_before)
            trial.set_user_attr(ATTR_LLM_CALLS, spent.total_requests)
            trial.set_user_attr(ATTR_TOKENS, spent.total_tokens)
            trial.set_user_attr(ATTR_WALL_TIME, time.perf_counter() - started)
            if latest:
                trial.set_user_attr(ATTR_METRICS, latest[0].flat_metrics())


def may_evaluate(study: optuna.Study, trial: optuna.Trial, requested: int, grid: bool) -> bool:
    """Whether this trial may be evaluated: not beyond the requested number (counting older
    trials only, so that of two racing workers the later trial yields) and, for the grid, a
    queued point that no other trial holds."""
    others = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
    older_live = sum(t.number < trial.number and t.state in _TAKEN for t in others)
    if older_live >= requested:
        return False
    if not grid:
        return True
    point = trial.user_attrs.get(GRID_POINT_ATTR)
    if point is None:  # made by the sampler: another worker took the last queued point
        return False
    key = point_key(point)
    for other in others:
        if trial_point_key(other) != key:
            continue
        if other.state in FINISHED:
            return False
        if other.state in (TrialState.RUNNING, TrialState.WAITING) and (
            other.number < trial.number
        ):
            return False
    return True


def suggest(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> int:
    """The trial's value of parameter `name` (an integer range or a list of integers)."""
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step)
    assert isinstance(distribution, CategoricalDistribution)
    return int(trial.suggest_categorical(name, list(distribution.choices)))


def failed_run_dir(
    study: optuna.Study, study_dir: TuningDir, parameters: Mapping[str, int], number: int
) -> Path | None:
    """The directory of an earlier failed (e.g. interrupted) trial with the same parameters:
    the runner resumes its finished user-periods instead of recomputing them."""
    trials = study.get_trials(deepcopy=False)
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
            and (study_dir.root / run_dir).is_dir()
        ):
            return study_dir.root / run_dir
    return None
