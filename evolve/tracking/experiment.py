"""MLflow tracking of an experiment: one parent run, one child run per proposal.

The tracker's hooks follow one experiment's runs from start to finish (the parent run,
generations, resume state); the child runs are `candidate_runs`, what the runs say is in
`content`.

Called by the optimizer loop and the commands only (never by the simulator or a policy).

- the experiment: the spec's `description` as its description (`mlflow.note.content`) and the
  kind "custom model development" (MLflow 3.17's UI ignores it: the command prints the
  address that opens the runs table).
- parent run: params (experiment, seeds, environment, optimizer, budget, models per role);
  metrics per generation (`step` = generation): best and mean train and held-out scores,
  calls and tokens spent, candidates evaluated so far (a running count: never re-logged at
  step 0); at the end the totals (at the last generation's step), the compare table and
  lineage as text, the `candidates` table (an MLflow table artifact, shown in the run's
  artifacts) and, in its name and description, the best candidate and every candidate's
  accuracy. The held-out test of the best against the base (paired on the same questions)
  is its verdict: metrics `heldout_difference` (with `_low` / `_high`), ... (see
  `evolve.tracking.intervals`), tags `evolve.heldout_verdict` (beats / within noise /
  worse, read from the interval), its evidence, method and seed, and a line of the
  description. The best is never called better than the base from two point scores.
- child run per proposal, evaluated or not: see `evolve.tracking.candidate_runs`.
- every run: a description and the source, user and git tags the fluent API sets.
- Prompt Registry: see `evolve.tracking.prompts`. Traces: see `evolve.tracking.traces`.

Nothing logged comes from an endpoint description: models are logged by name, never a URL,
and never a key. Logging is idempotent (state in `<run dir>/mlflow.json`), so a resumed
experiment continues the same parent run and never logs a candidate twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.core.files import atomic_write_json
from evolve.simulator.run_dir import read_object
from evolve.stores.tracking_uri import TrackingLocation, masked_uri
from evolve.tracking.candidate_runs import CandidateRuns
from evolve.tracking.content import (
    CANDIDATES_TABLE,
    best_candidate,
    candidates_markdown,
    candidates_table,
    experiment_description,
    experiment_params,
    experiment_run_name,
    final_metrics,
    generation_metrics,
)
from evolve.tracking.hooks import ExperimentTracker, NullTracker, TrackingContext
from evolve.tracking.intervals import comparison_tags, heldout_verdict_text
from evolve.tracking.prompts import PromptVersions
from evolve.tracking.runs_view import publish_runs_view
from evolve.tracking.store import (
    describe_experiment,
    get_or_create_experiment,
    logged_metric,
    mlflow_client,
    normalize_tracking_uri,
    now_ms,
    replace_table,
    run_context_tags,
    run_is_active,
    tracking_location,
)
from evolve.tracking.tags import (
    HELDOUT_VERDICT_TAGS,
    NOTE_TAG,
    STATE_FILE,
    TAG_BEST_CANDIDATE,
    TAG_CANDIDATE,
    TAG_CONFIG_HASH,
    TAG_EXPERIMENT,
    TAG_KIND,
    TAG_RUN_DIR,
)
from evolve.tracking.traces import FINGERPRINT_TAG, TraceBook

if TYPE_CHECKING:
    from evolve.llm.usage import Usage
    from evolve.results.records import CandidateRecord, ExperimentResult, GenerationRecord
    from evolve.simulator.evaluation import ProgressSink
    from evolve.spec.config import ExperimentSpec


class MLflowTracker(ExperimentTracker):
    def __init__(
        self, tracking_uri: str, experiment_name: str, location: TrackingLocation | None = None
    ) -> None:
        self.tracking_uri = normalize_tracking_uri(tracking_uri)
        # What the command prints at start: the URI and where it came from.
        self.location = location or TrackingLocation(self.tracking_uri, "the caller")
        self.experiment_name = experiment_name
        self.client: Any = None
        self.parent_run_id: str | None = None
        self.context: TrackingContext | None = None
        self.prompts: PromptVersions | None = None
        self.traces = TraceBook(self.tracking_uri)
        self.candidate_runs: CandidateRuns | None = None
        self._state: dict[str, Any] = {}
        self._state_file: Path | None = None

    # ----- lifecycle -----------------------------------------------------------------------

    def start(self, context: TrackingContext) -> None:
        from mlflow.entities import Param, RunTag

        self.context = context
        self.client = mlflow_client(self.tracking_uri)
        experiment_id = get_or_create_experiment(
            self.client, self.experiment_name, self.tracking_uri
        )
        describe_experiment(self.client, experiment_id, context.spec.description)
        self.experiment_id = experiment_id
        self._state_file = context.run_dir / STATE_FILE
        identity = {
            # Masked: the file stays on disk (and in archives); a token never does.
            "tracking_uri": masked_uri(self.tracking_uri),
            "experiment_id": experiment_id,
            "config_hash": context.config_hash,
        }
        state = resumed_state(self._state_file, identity, self.client)
        if state["parent_run_id"] is None:
            run = self.client.create_run(
                experiment_id,
                run_name=context.name,
                tags={
                    **run_context_tags(),
                    NOTE_TAG: experiment_description(context),
                    TAG_KIND: "experiment",
                    TAG_EXPERIMENT: context.name,
                    TAG_CONFIG_HASH: context.config_hash,
                    TAG_RUN_DIR: str(context.run_dir),
                },
            )
            state["parent_run_id"] = run.info.run_id
            params = [Param(k, v) for k, v in experiment_params(context).items()]
            self.client.log_batch(run.info.run_id, params=params)
        else:
            self.client.update_run(state["parent_run_id"], status="RUNNING")
            self.client.log_batch(
                state["parent_run_id"], tags=[RunTag(TAG_RUN_DIR, str(context.run_dir))]
            )
        self.parent_run_id = state["parent_run_id"]
        # For `evolve export <name>`: the registry name and the spec's store as written.
        state["registered_model"] = context.registered_model
        state["spec_tracking_uri"] = context.spec.tracking.tracking_uri
        self._state = state
        self.prompts = PromptVersions(
            self.client, context, state["prompt_versions"], self.tracking_uri, experiment_id
        )
        self.candidate_runs = CandidateRuns(
            self.client,
            context,
            state,
            parent_run_id=state["parent_run_id"],
            prompts=self.prompts,
            traces=self.traces,
            save_state=self._save_state,
        )
        if context.spec.tracking.traces == "all":
            self.traces.start_reflections()
        self._save_state()

    def _save_state(self) -> None:
        if self._state_file is not None:
            atomic_write_json(self._state_file, self._state)

    def finish(self, result: ExperimentResult, *, report: str = "") -> None:
        from mlflow.entities import RunTag

        run_id = self.parent_run_id
        assert run_id is not None and self.context is not None
        timestamp = now_ms()
        # Totals sit at the last generation's step: at step 0 they would draw every curve
        # back to the start (the per-generation `candidates_evaluated` is a running count).
        last_step = max((g.generation for g in result.generations), default=0)
        best = best_candidate(result)
        metrics = final_metrics(result, best)
        table = candidates_table(result.candidates, proposal_statuses(self._state))
        description = f"{experiment_description(self.context)}\n\n{candidates_markdown(table)}"
        verdict = heldout_verdict_text(result)
        if verdict is not None:
            description += f"\n\n{verdict}"
        tags = [
            RunTag("evolve.complete", str(result.complete).lower()),
            RunTag(NOTE_TAG, description),
        ]
        if best is not None:
            tags.append(RunTag(TAG_BEST_CANDIDATE, best.id))
        if result.heldout_comparison is not None:
            verdict_tags = comparison_tags(result.heldout_comparison)
            tags += [RunTag(key, value) for key, value in verdict_tags.items()]
        else:
            # A resumed run whose best changed (or lost its records) keeps no earlier verdict.
            self._forget_verdict(run_id)
        if result.stopped:
            tags.append(RunTag("evolve.stopped", result.stopped[:500]))
        # A resumed run logs only the totals that changed (no second point of the same one).
        before = self._state.get("final_metrics") or {}
        changed = {
            k: float(v) for k, v in metrics.items() if before.get(k) != [last_step, float(v)]
        }
        self.client.log_batch(
            run_id,
            metrics=[logged_metric(k, v, timestamp, last_step) for k, v in changed.items()],
            tags=tags,
        )
        self._state["final_metrics"] = {k: [last_step, float(v)] for k, v in metrics.items()}
        self._save_state()
        self.traces.write(self.client)
        if report:
            self.client.log_text(run_id, report, "compare.txt")
        replace_table(self.client, run_id, table, CANDIDATES_TABLE)
        self.client.update_run(run_id, name=experiment_run_name(self.context.name, best))
        # The address the command ends with opens the runs with these score columns.
        publish_runs_view(self.client, self.experiment_id)
        self.client.set_terminated(run_id, "FINISHED")

    def _forget_verdict(self, run_id: str) -> None:
        present = self.client.get_run(run_id).data.tags
        for key in HELDOUT_VERDICT_TAGS:
            if key in present:
                self.client.delete_tag(run_id, key)

    def fail(self) -> None:
        if self.client is not None and self.parent_run_id is not None:
            end_after_failure(self.client, self._state, self.parent_run_id, self.traces)

    # ----- traces -------------------------------------------------------------------------------

    def evaluation_sink(
        self,
        split: str,
        inner: ProgressSink | None,
        *,
        record: CandidateRecord | None = None,
        fingerprint: str | None = None,
    ) -> ProgressSink | None:
        from evolve.tracking.tracing import traces_wanted

        assert self.context is not None
        if not traces_wanted(self.context.spec.tracking.traces, split):
            return inner
        assert self.candidate_runs is not None
        tags = {TAG_EXPERIMENT: self.context.name, "evolve.split": split}
        source_run_id = None
        if record is not None:
            tags[TAG_CANDIDATE] = record.id
            # The candidate's run exists from its first traced evaluation on: the trace
            # links to it (and the run's duration covers the evaluation).
            source_run_id = self.candidate_runs.run_id(record)
        elif fingerprint is not None:
            tags[FINGERPRINT_TAG] = fingerprint
            # GEPA's held-out evaluations come after the train one was logged: link those.
            logged = self.candidate_runs.with_fingerprint(fingerprint)
            if logged is not None:
                tags[TAG_CANDIDATE], source_run_id = logged
        return self.traces.sink(
            inner,
            experiment_id=self._state["experiment_id"],
            tags=tags,
            source_run_id=source_run_id,
        )

    # ----- proposals, candidates and generations -----------------------------------------------

    def log_proposal(
        self,
        record: CandidateRecord,
        *,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
        reason: str | None = None,
        evaluation_dir: Path | None = None,
        scores: dict[str, float] | None = None,
    ) -> None:
        assert self.candidate_runs is not None
        self.candidate_runs.log_proposal(
            record,
            parent=parent,
            policy_dir=policy_dir,
            feedback=feedback,
            reason=reason,
            evaluation_dir=evaluation_dir,
            scores=scores,
        )

    def log_candidate(
        self,
        record: CandidateRecord,
        *,
        split: str,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        assert self.candidate_runs is not None
        self.candidate_runs.log_evaluation(
            record, split=split, parent=parent, policy_dir=policy_dir, feedback=feedback
        )

    def log_generation(self, record: GenerationRecord, *, spent: Usage) -> None:

        key = str(record.generation)
        digest = record.model_dump_json()
        if self._state["generations"].get(key) == digest:
            return
        evaluated = self._state["evaluated_per_generation"]
        evaluated[key] = len(record.evaluated_ids)
        values = generation_metrics(record, spent, evaluated, self._state["heldout_scores"])
        timestamp = now_ms()
        metrics = [logged_metric(k, v, timestamp, record.generation) for k, v in values.items()]
        self.client.log_batch(self.parent_run_id, metrics=metrics)
        self._state["generations"][key] = digest
        self._save_state()


def tracker_for(spec: ExperimentSpec, *, tracking_uri: str | None = None, enabled: bool = True):
    """The tracker a command should use for `spec` (a `NullTracker` when disabled)."""
    if not enabled or not spec.tracking.enabled:
        return NullTracker()
    location = tracking_location(tracking_uri, spec)
    return MLflowTracker(location.uri, spec.mlflow_experiment_name(), location)


def resumed_state(state_file: Path, identity: dict[str, str], client: Any) -> dict[str, Any]:
    """The tracker's state of an earlier invocation on the same store, experiment and
    configuration (its parent run still there), or a fresh one."""
    state = read_object(state_file) if state_file.exists() else {}
    same_store = all(state.get(k) == v for k, v in identity.items()) and run_is_active(
        client, state.get("parent_run_id")
    )
    if not same_store:
        state = {**identity, "parent_run_id": None, "candidates": {}, "generations": {}}
    # Added after the first release of this file: states written before lack them.
    for key in ("evaluated_per_generation", "heldout_scores", "prompt_versions"):
        state.setdefault(key, {})
    return state


def proposal_statuses(state: dict[str, Any]) -> dict[str, list[str]]:
    """candidate id -> [status, reason] of every proposal the tracker was told of."""
    return {
        cid: [entry["status"], entry.get("reason", "")]
        for cid, entry in state.get("candidates", {}).items()
        if entry.get("status")
    }


def end_after_failure(client: Any, state: dict[str, Any], parent_run_id: str, traces: Any) -> None:
    """The invocation failed: write the traces, and end as KILLED the parent run and the
    candidate runs opened for an evaluation that never finished. Never hides the original
    error behind a tracking failure."""
    import contextlib

    with contextlib.suppress(Exception):
        traces.write(client)
    with contextlib.suppress(Exception):
        for entry in state.get("candidates", {}).values():
            if entry.get("run_id") and not entry.get("logged") and not entry.get("closed"):
                client.set_terminated(entry["run_id"], "KILLED")
    with contextlib.suppress(Exception):
        client.set_terminated(parent_run_id, "KILLED")
