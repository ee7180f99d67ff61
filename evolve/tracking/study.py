"""MLflow tracking of a tuning study: one parent run per study, one child run per trial.

What it reads of tuning's records, the tags it writes and the runs' names and summary are in
`evolve.tracking.study_records`.

- parent run (tags `evolve.kind = tuning`, `evolve.study`, `evolve.config_hash`): params
  (the spec's settings, models, users), metrics `best_value` / `trials_finished` as trials
  finish, and at the end the best parameters as tags `evolve.best.<name>` (tags, not
  params: a resumed study may find a better setting), the held-out metrics of the best
  (`heldout_*`), and the trial table as `tuning.txt` (+ `best_parameters.json`).
- child run per trial (tag `mlflow.parentRunId`, `evolve.kind = trial`, `evolve.trial`):
  params `param.<name>`, per-period metrics with `step = period` (`running_accuracy`,
  `running_memory_score`, `reported_value`), final train metrics (`train_*`, `value`,
  `value_tokens`), and the outcome as tag `evolve.trial_state` (complete / pruned /
  failed); pruned and complete runs end FINISHED, failed ones FAILED.

Several workers of one study share the parent run, and workers starting together may each
create one: `evolve.tracking.shared_parent` decides which run is the parent and moves a
worker's trial runs there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.stores.tracking_uri import TrackingLocation
from evolve.tracking.content import experiment_params
from evolve.tracking.hooks import TrackingContext
from evolve.tracking.runs_view import publish_runs_view
from evolve.tracking.shared_parent import SharedParentRun
from evolve.tracking.store import (
    describe_experiment,
    get_or_create_experiment,
    logged_metric,
    mlflow_client,
    normalize_tracking_uri,
    now_ms,
    run_context_tags,
    tracking_location,
)
from evolve.tracking.study_records import (
    KIND_TRIAL,
    TAG_OBJECTIVES,
    TAG_STORAGE,
    TAG_STUDY,
    TAG_TRIAL,
    TAG_TRIAL_STATE,
    StudySpecView,
    TrialRecord,
    TuningResult,
    study_run_name,
    study_summary,
    trial_run_name,
)
from evolve.tracking.tags import (
    NOTE_TAG,
    PARENT_RUN_TAG,
    TAG_EXPERIMENT,
    TAG_KIND,
    TAG_RUN_DIR,
)
from evolve.tracking.traces import TraceBook

if TYPE_CHECKING:
    from evolve.simulator.evaluation import ProgressSink
    from evolve.simulator.metrics import MetricSummary


@dataclass(frozen=True)
class StudyContext:
    name: str
    study_name: str
    storage: str
    config_hash: str
    spec: StudySpecView
    run_dir: Path
    model_names: dict[str, str]
    environment: str
    train_users: list[str] = field(default_factory=list)
    heldout_users: list[str] = field(default_factory=list)
    requested_trials: int = 0


class StudyTracker:
    """The worker's view of tracking; every hook is a no-op here (see `MLflowStudyTracker`)."""

    # Where runs are logged and why there (printed at start); None when tracking is off.
    location: TrackingLocation | None = None
    # The MLflow experiment's id once started (the UI's address names it).
    experiment_id: str | None = None

    def start(self, context: StudyContext) -> None:
        """The worker opened the study."""

    def trial_started(self, number: int, parameters: dict[str, int], seed: int) -> str | None:
        """A trial starts; returns the id of its run (stored on the Optuna trial), if any."""
        return None

    def trial_period(self, number: int, period: int, summary: MetricSummary, value: float) -> None:
        """A trial finished `period` (running `summary`, `value` reported to the pruner)."""

    def trial_finished(self, record: TrialRecord) -> None:
        """A trial is complete, pruned or failed."""

    def finish(self, result: TuningResult) -> None:
        """The worker is done (the study may still have other workers' trials running)."""

    def fail(self) -> None:
        """The worker was interrupted by an error or Ctrl-C."""

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        trial: int | None = None,
        label: str | None = None,
    ) -> ProgressSink | None:
        """The runner's progress sink for a trial's evaluation ("train") or a held-out check
        (`label`): `inner`, or a sink that forwards to it and records traces."""
        return inner


class NullStudyTracker(StudyTracker):
    """Tracking disabled."""


class MLflowStudyTracker(StudyTracker):
    def __init__(
        self,
        tracking_uri: str,
        experiment_name: str,
        location: TrackingLocation | None = None,
        *,
        format_report: Callable[[TuningResult], str] | None = None,
    ) -> None:
        self.tracking_uri = normalize_tracking_uri(tracking_uri)
        # The trial table as text (`tuning.txt`), formatted by tuning: tracking depends on
        # the records only, never on tuning's modules.
        self.format_report = format_report
        # What the command prints at start: the URI and where it came from.
        self.location = location or TrackingLocation(self.tracking_uri, "the caller")
        self.experiment_name = experiment_name
        self.client: Any = None
        self.experiment_id: str | None = None
        self.context: StudyContext | None = None
        self._trial_runs: dict[int, str] = {}
        self._parent: SharedParentRun | None = None  # known from `start` on
        self.traces = TraceBook(self.tracking_uri)

    @property
    def parent_run_id(self) -> str | None:
        """The study's parent run this worker writes to (it may change: see `SharedParentRun`)."""
        return self._parent.run_id if self._parent is not None else None

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        trial: int | None = None,
        label: str | None = None,
    ) -> ProgressSink | None:
        from evolve.tracking.tracing import traces_wanted

        assert self.context is not None
        if not traces_wanted(self.context.spec.tracking.traces, split):
            return inner
        tags = {
            TAG_EXPERIMENT: self.context.name,
            TAG_STUDY: self.context.study_name,
            "evolve.split": split,
        }
        if trial is not None:
            tags[TAG_TRIAL] = str(trial)
        if label is not None:
            tags["evolve.evaluation"] = label
        run_id = self._trial_runs.get(trial) if trial is not None else self.parent_run_id
        return self.traces.sink(
            inner, experiment_id=str(self.experiment_id), tags=tags, source_run_id=run_id
        )

    def start(self, context: StudyContext) -> None:
        self.context = context
        self.client = mlflow_client(self.tracking_uri)
        self.experiment_id = get_or_create_experiment(
            self.client, self.experiment_name, self.tracking_uri
        )
        describe_experiment(self.client, self.experiment_id, context.spec.description)
        self._parent = SharedParentRun(
            self.client,
            self.experiment_id,
            study_name=context.study_name,
            config_hash=context.config_hash,
            worker_tags={
                TAG_RUN_DIR: str(context.run_dir),
                "evolve.trials_requested": str(context.requested_trials),
            },
        )
        self._parent.join_or_create(
            run_name=f"tune {context.study_name}",
            description_tags=lambda: study_tags(context),
            params=lambda: study_params(context),
        )

    def trial_started(self, number: int, parameters: dict[str, int], seed: int) -> str | None:
        from mlflow.entities import Param

        assert self.context is not None and self._parent is not None
        context = self.context
        self._parent.adopt_earliest()
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"trial {number}",
            tags={
                **run_context_tags(),
                NOTE_TAG: trial_description(number, parameters, context),
                PARENT_RUN_TAG: self.parent_run_id,
                TAG_KIND: KIND_TRIAL,
                TAG_EXPERIMENT: context.name,
                TAG_STUDY: context.study_name,
                TAG_TRIAL: str(number),
                TAG_TRIAL_STATE: "running",
            },
        )
        params = {
            "trial": str(number),
            "policy_kind": str(context.spec.policy.kind or "bundle"),
            "seed.trial": str(seed),
            "seed.experiment": str(context.spec.seed),
            "protocol": context.spec.protocol,  # results differ by information flow
        }
        params.update({f"param.{name}": str(value) for name, value in sorted(parameters.items())})
        params.update(
            {f"model.{role}": model for role, model in sorted(context.model_names.items())}
        )
        self.client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in params.items()])
        self._trial_runs[number] = run.info.run_id
        self._parent.record_child(run.info.run_id)
        return run.info.run_id

    def trial_period(self, number: int, period: int, summary: MetricSummary, value: float) -> None:

        run_id = self._trial_runs.get(number)
        if run_id is None:
            return
        timestamp = now_ms()
        values = {"reported_value": value}
        for name in ("accuracy", "memory_score"):
            metric = getattr(summary, name)
            if metric is not None:
                values[f"running_{name}"] = float(metric)
        values["running_tokens"] = float(summary.tokens)
        metrics = [logged_metric(k, v, timestamp, period) for k, v in values.items()]
        self.client.log_batch(run_id, metrics=metrics)

    def trial_finished(self, record: TrialRecord) -> None:
        from mlflow.entities import RunTag

        run_id = self._trial_runs.pop(record.number, None) or record.mlflow_run_id
        if run_id is None:
            return
        step = record.last_period or 0
        timestamp = now_ms()
        values = {f"train_{k}": v for k, v in record.metrics.items()}
        if record.values:
            values["value"] = record.values[0]
            if len(record.values) > 1:
                values["value_tokens"] = record.values[1]
        values["llm_calls_spent"] = float(record.llm_calls)
        if record.wall_time_s is not None:
            values["wall_time_s"] = record.wall_time_s
        tags = [RunTag(TAG_TRIAL_STATE, record.state)]
        if record.objective_used:
            tags.append(RunTag("evolve.objective_used", record.objective_used))
        if record.note:
            tags.append(RunTag("evolve.note", record.note[:500]))
        self.client.log_batch(
            run_id,
            metrics=[logged_metric(k, v, timestamp, step) for k, v in values.items()],
            tags=tags,
        )
        status = "FINISHED" if record.state in ("complete", "pruned") else "FAILED"
        # The runs table shows names without configuring columns: the outcome goes there.
        self.client.update_run(run_id, name=trial_run_name(record))
        self.client.set_terminated(run_id, status)
        assert self._parent is not None
        self._parent.adopt_earliest()

    def finish(self, result: TuningResult) -> None:
        if self._parent is None or self._parent.run_id is None:
            return
        self.traces.write(self.client)
        self._close_failed_children(result)
        self._parent.write(lambda run_id: self._write_summary(run_id, result))

    def _write_summary(self, run_id: str, result: TuningResult) -> None:

        timestamp = now_ms()
        metrics, tags = study_summary(result)
        self.client.log_batch(
            run_id,
            metrics=[
                logged_metric(k, v, timestamp, result.finished_trials) for k, v in metrics.items()
            ],
            tags=tags,
        )
        if self.format_report is not None:
            self.client.log_text(run_id, self.format_report(result) + "\n", "tuning.txt")
        best_doc = {
            "best_trials": result.best,
            "parameters": result.best_parameters,
            "objectives": result.objectives,
            "pareto_front": (
                [result.trial(n).model_dump(mode="json") for n in result.best]
                if result.multi_objective
                else None
            ),
        }
        self.client.log_text(run_id, json.dumps(best_doc, indent=2) + "\n", "best_parameters.json")
        assert self.context is not None
        self.client.update_run(run_id, name=study_run_name(self.context.study_name, result))
        if self.experiment_id is not None:  # the address the command ends with shows scores
            publish_runs_view(self.client, str(self.experiment_id))
        active = any(r.state in ("running", "waiting") for r in result.trials)
        if not active:
            self.client.set_terminated(run_id, "FINISHED")

    def _close_failed_children(self, result: TuningResult) -> None:
        """Runs of trials failed elsewhere (a dead worker's, failed by heartbeat) still say
        RUNNING in MLflow; close them."""
        for record in result.trials:
            if record.state != "failed" or not record.mlflow_run_id:
                continue
            with contextlib.suppress(Exception):
                run = self.client.get_run(record.mlflow_run_id)
                if run.info.status == "RUNNING":
                    self.client.set_tag(record.mlflow_run_id, TAG_TRIAL_STATE, "failed")
                    self.client.set_terminated(record.mlflow_run_id, "FAILED")

    def fail(self) -> None:
        if self.client is None:
            return
        with contextlib.suppress(Exception):  # never hide the original error
            self.traces.write(self.client)
        with contextlib.suppress(Exception):
            for run_id in self._trial_runs.values():
                self.client.set_terminated(run_id, "KILLED")
            if self.parent_run_id is not None:
                self.client.set_terminated(self.parent_run_id, "KILLED")


def study_description(context: StudyContext) -> str:
    spec = context.spec
    names = ", ".join(spec.tuning.parameters) or "-"
    summary = (
        f"amemgym-evolve tuning study {context.study_name} of {context.name}: "
        f"{spec.policy.kind or 'bundle'} policy, parameters {names}, objectives "
        f"{', '.join(spec.tuning.objectives)}, protocol {spec.protocol}."
    )
    description = spec.description.strip()
    return f"{description}\n\n{summary}" if description else summary


def study_tags(context: StudyContext) -> dict[str, str]:
    """The parent run's tags besides those that identify it (`SharedParentRun.identity_tags`)."""
    return {
        **run_context_tags(),
        NOTE_TAG: study_description(context),
        TAG_EXPERIMENT: context.name,
        TAG_STORAGE: context.storage,
        TAG_OBJECTIVES: ",".join(context.spec.tuning.objectives),
    }


def trial_description(number: int, parameters: dict[str, int], context: StudyContext) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in sorted(parameters.items())) or "defaults"
    text = f"Trial {number} of study {context.study_name}: {settings}."
    description = context.spec.description.strip()
    return f"{text}\n\n{description}" if description else text


def study_params(context: StudyContext) -> dict[str, str]:
    """The parent run's params: the spec's settings (no endpoint, key or storage secret)."""
    params = experiment_params(
        TrackingContext(
            name=context.name,
            config_hash=context.config_hash,
            spec=context.spec,  # type: ignore[arg-type]  (same field names are used)
            run_dir=context.run_dir,
            model_names=context.model_names,
            environment=context.environment,
            train_users=context.train_users,
            heldout_users=context.heldout_users,
        )
    )
    params["tuning.storage"] = context.storage[:500]
    params["tuning.study_name"] = context.study_name
    return params


def study_tracker_for(
    spec: StudySpecView,
    *,
    tracking_uri: str | None = None,
    enabled: bool = True,
    format_report: Callable[[TuningResult], str] | None = None,
):
    """The tracker a command should use (a `NullStudyTracker` when disabled)."""
    if not enabled or not spec.tracking.enabled:
        return NullStudyTracker()
    location = tracking_location(tracking_uri, spec)
    return MLflowStudyTracker(
        location.uri, spec.mlflow_experiment_name(), location, format_report=format_report
    )
