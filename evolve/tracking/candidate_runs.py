"""The child runs of an experiment: one per proposal, evaluated or not, under the parent run.

- tags: generation, candidate id, parent ids, mutation kind, `evolve.candidate_status` = base
  / accepted / rejected / invalid / duplicate and `evolve.candidate_reason`; tag
  `mlflow.parentRunId`. Named with its train and held-out accuracy.
- its start and end are those of its first evaluation (read from the unit result files: each
  holds its wall time and is written when the unit ends), not of the logging.
- params (policy kind, numeric parameters, models, seeds, mutation), summary metrics with
  `step` = generation for the train and held-out evaluations (with the bounds of their
  intervals where the record has them: `heldout_accuracy_low`, `heldout_accuracy_high`,
  `heldout_memory_score_low`, ...), per-period curves with `step` =
  period (`train_period/memory_score`, ..., with `random_score` and `upper_bound_score` beside
  them; an undefined score has no point).
- artifacts: each component's instruction, the diff against the parent (`.diff` and a
  side-by-side `.html`), the policy bundle, the per-period tables, the reflector's feedback.
  A rejected proposal carries its minibatch scores (`minibatch_score`,
  `minibatch_parent_score`).
- the candidate's traces (its evaluations' episodes, its reflection) are linked to it.

What each run says is built in `content`; the tracker's resume state (`<run dir>/mlflow.json`)
remembers each candidate's run and what it logged, so a resumed experiment never logs a
candidate twice.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.tracking.content import (
    ACCEPTED,
    BASE,
    INVALID,
    candidate_params,
    candidate_run_name,
    candidate_tags,
    evaluation_window,
    instruction_diff,
    instruction_diff_html,
    per_period_metrics,
    per_period_table,
    proposal_status,
)
from evolve.tracking.intervals import score_interval_metrics
from evolve.tracking.store import logged_metric, now_ms, run_is_active
from evolve.tracking.tags import TAG_CANDIDATE_STATUS, TAG_EXPERIMENT

if TYPE_CHECKING:
    from evolve.results.records import CandidateRecord, EvaluationScores
    from evolve.tracking.hooks import TrackingContext
    from evolve.tracking.prompts import PromptVersions
    from evolve.tracking.traces import TraceBook


class CandidateRuns:
    """The candidate runs of one invocation, kept in the tracker's resume `state` (its
    `candidates` entries: run id, splits logged, status, ...), which `save_state` writes."""

    def __init__(
        self,
        client: Any,
        context: TrackingContext,
        state: dict[str, Any],
        *,
        parent_run_id: str,
        prompts: PromptVersions,
        traces: TraceBook,
        save_state: Callable[[], None],
    ) -> None:
        self.client = client
        self.context = context
        self.parent_run_id = parent_run_id
        self.prompts = prompts
        self.traces = traces
        self._state = state
        self._save_state = save_state

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
        """The proposal's status; a proposal that will not be evaluated gets its whole run
        here (see `ExperimentTracker.log_proposal`)."""

        status, reason = proposal_status(record, reason)
        entry = self._entry(record)
        entry.update(status=status, reason=reason)
        if self.context.spec.tracking.traces == "all":  # "heldout": held-out evaluations only
            tags = {TAG_EXPERIMENT: self.context.name, "evolve.split": "reflection"}
            self.traces.reflection(record.id, experiment_id=self._state["experiment_id"], tags=tags)
        if status in (ACCEPTED, BASE) or entry.get("closed"):
            # Its run starts with its evaluation (`log_evaluation`): a real start time.
            self._save_state()
            return
        window = evaluation_window(evaluation_dir) if evaluation_dir is not None else None
        run_id = self.run_id(record, start_ms=window[0] if window else None)
        self.traces.link(record.id, run_id)
        log_candidate_artifacts(self.client, run_id, record, parent, policy_dir, feedback)
        if scores:
            timestamp = now_ms()
            metrics = [logged_metric(k, v, timestamp, record.generation) for k, v in scores.items()]
            self.client.log_batch(run_id, metrics=metrics)
        run_status = "FAILED" if status == INVALID else "FINISHED"
        self.client.set_terminated(run_id, run_status, end_time=window[1] if window else None)
        entry["closed"] = True
        self._save_state()

    def log_evaluation(
        self,
        record: CandidateRecord,
        *,
        split: str,
        parent: CandidateRecord | None,
        policy_dir: Path,
        feedback: str | None,
    ) -> None:
        """`record`'s evaluation on `split` ("train" or "heldout"), once: its scores and
        per-period curves, and on the first one its artifacts and prompt versions."""

        scores: EvaluationScores | None = getattr(record, split)
        if scores is None:
            return
        entry = self._entry(record)
        if split in entry["logged"]:
            return
        window = evaluation_window(self.context.run_dir / scores.run_dir)
        run_id = self.run_id(record, start_ms=window[0] if window else None)
        # State written before the "artifacts" flag existed: a logged split had them.
        if not entry.get("artifacts", bool(entry["logged"])):
            log_candidate_artifacts(self.client, run_id, record, parent, policy_dir, feedback)
            self.prompts.register(run_id, record, entry)
            entry["artifacts"] = True
            self._save_state()
        timestamp = now_ms()
        values = scores.summary.flat_metrics(f"{split}_")
        values[f"{split}_score"] = scores.score
        # Beside each point its interval's bounds: the runs table sorts and filters on them.
        values.update(score_interval_metrics(split, scores.estimate))
        # GEPA's evaluations report no wall time of their own: the units' window is it.
        wall_time = scores.wall_time_s or ((window[1] - window[0]) / 1000 if window else 0.0)
        values[f"{split}_wall_time_s"] = wall_time
        if split == "train":
            values["reflection_llm_calls"] = record.reflection_calls
            values["reflection_tokens"] = record.reflection_tokens
            values["reflection_parse_failures"] = record.reflection_parse_failures
        metrics = [logged_metric(k, v, timestamp, record.generation) for k, v in values.items()]
        metrics += per_period_metrics(scores, split, timestamp)
        self.client.log_batch(run_id, metrics=metrics)
        if split == "heldout":
            self._state["heldout_scores"][record.id] = scores.score
        self.traces.close(record.id)
        self.traces.adopt(record.id, record.fingerprint, run_id)
        self.traces.link(record.id, run_id)
        self.prompts.tag_scores(entry, split, scores.score)
        self.client.log_text(run_id, per_period_table(scores), f"scores/{split}_per_period.csv")
        if entry.get("status"):  # the one status tag: base, accepted, rejected, ...
            self.client.set_tag(run_id, TAG_CANDIDATE_STATUS, entry["status"])
        if scores.objective_used:  # memory_score or accuracy: what `score` is
            self.client.set_tag(run_id, f"evolve.{split}_objective_used", scores.objective_used)
        self.client.update_run(run_id, name=candidate_run_name(record))
        # Ends with its first evaluation: the base's held-out one, at the experiment's end,
        # would span every generation (`<split>_wall_time_s` is each evaluation's time).
        entry["ended_ms"] = entry.get("ended_ms") or (window[1] if window else now_ms())
        self.client.set_terminated(run_id, "FINISHED", end_time=entry["ended_ms"])
        entry["logged"].append(split)
        self._save_state()

    def run_id(self, record: CandidateRecord, start_ms: int | None = None) -> str:
        """The id of `record`'s run, created (with its params) on first use, starting at
        `start_ms` (its evaluation's start) when given."""
        from mlflow.entities import Param

        entry = self._entry(record)
        if entry["run_id"] is None or not run_is_active(self.client, entry["run_id"]):
            run_id = self._create_run(record, entry, start_ms)
            entry.update(run_id=run_id, logged=[], artifacts=False)
            entry["fingerprint"] = record.fingerprint  # GEPA evaluates by fingerprint
            params = candidate_params(record, self.context)
            self.client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
            self._save_state()
        return entry["run_id"]

    def with_fingerprint(self, fingerprint: str) -> tuple[str, str] | None:
        """(candidate id, run id) of the first logged candidate whose policy has
        `fingerprint`, or None: GEPA evaluates policies by fingerprint only."""
        for candidate_id, entry in self._state["candidates"].items():
            if entry.get("fingerprint") == fingerprint and entry.get("run_id"):
                return candidate_id, entry["run_id"]
        return None

    def _entry(self, record: CandidateRecord) -> dict[str, Any]:
        return self._state["candidates"].setdefault(record.id, {"run_id": None, "logged": []})

    def _create_run(
        self, record: CandidateRecord, entry: dict[str, Any], start_ms: int | None
    ) -> str:
        status, reason = proposal_status(record)
        status, reason = entry.get("status", status), entry.get("reason", reason)
        tags = candidate_tags(record, self.context, self.parent_run_id, status, reason)
        run = self.client.create_run(
            self._state["experiment_id"],
            run_name=candidate_run_name(record, status),
            start_time=start_ms,
            tags=tags,
        )
        return run.info.run_id


def log_candidate_artifacts(
    client: Any,
    run_id: str,
    record: CandidateRecord,
    parent: CandidateRecord | None,
    policy_dir: Path,
    feedback: str | None,
) -> None:
    """Instructions, diffs against the parent, the bundle and the reflector's feedback."""
    for name, text in sorted(record.components.items()):
        client.log_text(run_id, text + "\n", f"components/{name}.txt")
        if parent is not None and parent.components.get(name) != text:
            old = parent.components.get(name, "")
            diff = instruction_diff(old, text, name, parent.id, record.id)
            client.log_text(run_id, diff, f"diffs/{name}.diff")
            page = instruction_diff_html(old, text, name, parent.id, record.id)
            client.log_text(run_id, page, f"diffs/{name}.html")
    if Path(policy_dir).is_dir():
        client.log_artifacts(run_id, str(policy_dir), "policy")
    if feedback:
        client.log_text(run_id, feedback + "\n", "feedback.txt")
