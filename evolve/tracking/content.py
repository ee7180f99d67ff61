"""What the runs say: params, descriptions, run names, per-period curves, diffs, tables and
the candidate table, built from the records (pure functions; the trackers log them).

MLflow's runs table has no server-side default columns: a new user sees run names, creation
time, duration, source and models, with the parent run collapsed. So the scores a researcher
looks for first are carried there too: each candidate run's name holds its train and
held-out accuracy (`g03-c0 0.42/0.38`; the name column shows about 17 characters, so no
labels), the parent run's name the best one, and the parent run's description and its
`candidates` table artifact list every candidate.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.results.objective import format_score
from evolve.simulator.metric_registry import metrics_in
from evolve.tracking.intervals import comparison_metrics
from evolve.tracking.store import logged_metric
from evolve.tracking.tags import (
    NOTE_TAG,
    PARENT_RUN_TAG,
    TAG_CANDIDATE,
    TAG_CANDIDATE_REASON,
    TAG_CANDIDATE_STATUS,
    TAG_EXPERIMENT,
    TAG_GENERATION,
    TAG_KIND,
    TAG_MUTATION,
    TAG_PARENTS,
)

if TYPE_CHECKING:
    from evolve.llm.usage import Usage
    from evolve.results.records import (
        CandidateRecord,
        EvaluationScores,
        ExperimentResult,
        GenerationRecord,
    )
    from evolve.tracking.hooks import TrackingContext

# What became of a proposal (tag `evolve.candidate_status`), by the record's status.
ACCEPTED = "accepted"  # joined the population (GEPA) or the chain: evaluated
REJECTED = "rejected"  # not better than its parent on GEPA's minibatch
INVALID = "invalid"  # the proposal could not be used (e.g. the reflector's text refused)
DUPLICATE = "duplicate"  # identical to an earlier candidate: never evaluated
BASE = "base"  # the starting policy
# Extra per-period curves: what the memory score is measured against, so a reader sees why
# a period scores what it does (e.g. 1.00 where the policy matches the upper bound).
PER_PERIOD_REFERENCES = ("random_score", "upper_bound_score")
CANDIDATES_TABLE = "candidates.json"


def experiment_params(context: TrackingContext) -> dict[str, str]:
    """The parent run's params: the spec's settings (never endpoints or keys) and models."""
    spec = context.spec
    data = spec.model_dump(mode="json", exclude={"llm", "tracking", "description"})
    params: dict[str, str] = {}

    def flatten(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                flatten(inner, f"{prefix}{key}.")
        else:
            text = json.dumps(value) if not isinstance(value, str) else value
            params[prefix.rstrip(".")] = text[:500]

    flatten(data, "")
    for role, model in sorted(context.model_names.items()):
        params[f"model.{role}"] = str(model)
    params["environment"] = context.environment[:500]
    params["train_users"] = ",".join(context.train_users)[:500]
    params["heldout_users"] = ",".join(context.heldout_users)[:500]
    params["config_hash"] = context.config_hash
    params["protocol"] = spec.protocol  # always present, even when left at its default
    return params


def experiment_description(context: TrackingContext) -> str:
    spec = context.spec
    description = spec.description.strip()
    summary = (
        f"amemgym-evolve experiment {context.name}: {spec.policy.kind or 'bundle'} policy, "
        f"{spec.optimizer.schedule} schedule, protocol {spec.protocol}, environment "
        f"{context.environment}."
    )
    return f"{description}\n\n{summary}" if description else summary


def candidate_description(
    record: CandidateRecord, context: TrackingContext, reason: str | None = None
) -> str:
    parents = ", ".join(record.parent_ids) or "none"
    text = (
        f"Candidate {record.id} of {context.name}: generation {record.generation}, "
        f"{record.mutation.describe()}; parents {parents}."
    )
    if reason:
        text += f" {proposal_status(record)[0].capitalize()}: {reason}."
    description = context.spec.description.strip()
    return f"{text}\n\n{description}" if description else text


def candidate_params(record: CandidateRecord, context: TrackingContext) -> dict[str, str]:
    """A candidate run's params: what made it (never an endpoint or a key)."""
    spec = context.spec
    params = {
        "policy_kind": record.kind,
        "candidate_id": record.id,
        "generation": str(record.generation),
        "parent_ids": ",".join(record.parent_ids) or "-",
        "mutation": record.mutation.describe()[:250],
        "seed.candidate": str(record.seed),
        "seed.experiment": str(spec.seed),
        "seed.environment": str(spec.environment.seed),
        "seed.episode": str(spec.seed if spec.episode.seed is None else spec.episode.seed),
        "fingerprint": record.fingerprint,
        "protocol": spec.protocol,  # results differ by information flow
    }
    for name, value in sorted(record.parameters.items()):
        params[f"param.{name}"] = str(value)
    for role, model in sorted(context.model_names.items()):
        params[f"model.{role}"] = str(model)
    if record.mutation.feedback is not None:  # proposed by the reflector
        params["feedback"] = str(record.mutation.feedback)
        params["reflector_temperature"] = str(record.mutation.temperature)
        params["rollout_id"] = str(record.mutation.rollout_id)
    return params


def generation_metrics(
    record: GenerationRecord,
    spent: Usage,
    evaluated: dict[str, int],
    heldout_scores: dict[str, float],
) -> dict[str, float]:
    """The parent run's metrics at a generation's step; `evaluated` counts the candidates
    evaluated per generation so far, `heldout_scores` the held-out scores reported so far."""
    values: dict[str, float] = {
        "generation_llm_calls": record.llm_calls,
        "generation_tokens": record.tokens,
        "population_size": len(record.population),
        "generation_candidates_evaluated": len(record.evaluated_ids),
        # A running count: it only grows with the step, so its chart never zig-zags.
        "candidates_evaluated": sum(
            count for g, count in evaluated.items() if int(g) <= record.generation
        ),
        "spent_llm_calls": spent.requests,
        "spent_tokens": spent.tokens,
        "spent_wall_time_s": spent.wall_time_s,
    }
    for name in ("best_train_score", "mean_train_score", "best_heldout_score"):
        value = getattr(record, name)
        if value is not None:
            values[name] = value
    # Held-out evaluations are reported to the tracker as they finish (the loop scores
    # only promising candidates there): the mean over the kept population's scored ones.
    # With one scored, the mean would only repeat `best_heldout_score` under another name.
    scored = [heldout_scores[c] for c in record.population if c in heldout_scores]
    values["heldout_candidates_scored"] = len(scored)
    if len(scored) > 1:
        values["mean_heldout_score"] = sum(scored) / len(scored)
    return values


def per_period_metrics(scores: EvaluationScores, split: str, timestamp: int) -> list[Any]:
    """`<split>_period/<name>` with step = period: the curves a researcher compares."""
    periods = scores.periods if scores.periods is not None else range(len(scores.per_period))
    metrics = []
    for period, summary in zip(periods, scores.per_period, strict=False):
        values = {d.name: d.value_of(summary) for d in metrics_in("per_period")}
        values.update({name: getattr(summary, name) for name in PER_PERIOD_REFERENCES})
        for name, value in values.items():
            # Undefined (e.g. the memory score of a degenerate period): no point at all.
            if value is not None and math.isfinite(value):
                metrics.append(logged_metric(f"{split}_period/{name}", value, timestamp, period))
        failures = float(summary.parse_failures_total)
        metrics.append(logged_metric(f"{split}_period/parse_failures", failures, timestamp, period))
    return metrics


def instruction_diff_html(old: str, new: str, name: str, old_id: str, new_id: str) -> str:
    """A side-by-side diff as a standalone page: the MLflow UI previews `.html` artifacts."""
    return difflib.HtmlDiff().make_file(
        old.splitlines(),
        new.splitlines(),
        fromdesc=f"{old_id}/{name}",
        todesc=f"{new_id}/{name}",
    )


def instruction_diff(old: str, new: str, name: str, old_id: str, new_id: str) -> str:
    # Both texts end in a newline before the comparison: otherwise a last line that only
    # gained one (an appended line) shows as removed and added again though it is the same.
    lines = difflib.unified_diff(
        _with_final_newline(old).splitlines(keepends=True),
        _with_final_newline(new).splitlines(keepends=True),
        fromfile=f"{old_id}/{name}",
        tofile=f"{new_id}/{name}",
    )
    return "".join(lines) or f"(no change in {name})\n"


def _with_final_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def per_period_table(scores: EvaluationScores) -> str:
    declared = metrics_in("per_period")
    counts = ("n_items", "llm_calls", "tokens")
    columns = [declaration.name for declaration in declared] + list(counts)
    periods = scores.periods if scores.periods is not None else range(len(scores.per_period))
    lines = ["period," + ",".join(columns) + ",parse_failures"]
    for period, summary in zip(periods, scores.per_period, strict=False):
        values = [declaration.value_of(summary) for declaration in declared]
        values += [getattr(summary, count) for count in counts]
        cells = ["" if value is None else f"{value:g}" for value in values]
        lines.append(f"{period}," + ",".join(cells) + f",{summary.parse_failures_total}")
    return "\n".join(lines) + "\n"


def proposal_status(record: CandidateRecord, reason: str | None = None) -> tuple[str, str]:
    """(status, reason) of a proposal: base, accepted, rejected, invalid or duplicate."""
    status = str(record.status)
    if record.generation == 0 and not record.parent_ids:
        return BASE, reason or "the starting policy"
    if status == INVALID:
        return INVALID, reason or record.invalid_reason or "the proposal could not be used"
    if status == DUPLICATE:
        return DUPLICATE, reason or f"identical to {record.duplicate_of}"
    if status == REJECTED:
        return REJECTED, reason or "not better than its parent on the minibatch"
    return ACCEPTED, reason or "evaluated on every train user"


def _score_text(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else format_score(value, 2)


def split_scores(record: CandidateRecord) -> str:
    """`memory 0.12/0.05 acc 0.42/0.38`: the memory score and the accuracy, train/held-out,
    each named; `-` for a split not evaluated or a memory score that is undefined."""

    def pair(value_of: Callable[[EvaluationScores], float | None]) -> str:
        return "/".join(
            _score_text(value_of(scores) if scores is not None else None)
            for scores in (record.train, record.heldout)
        )

    memory = pair(lambda scores: scores.summary.memory_score)
    return f"memory {memory} acc {pair(lambda scores: scores.summary.accuracy)}"


def candidate_run_name(record: CandidateRecord, status: str | None = None) -> str:
    """What the runs table shows for a candidate without configuring columns: its id and
    train/held-out scores (`g03-c0 memory 0.12/0.05 acc 0.42/0.38`), or what became of a
    proposal that was never evaluated (`g02-c0 rejected`)."""
    if record.train is None and status not in (None, ACCEPTED, BASE):
        return f"{record.id} {status}"
    return f"{record.id} {split_scores(record)}"


def experiment_run_name(name: str, best: CandidateRecord | None) -> str:
    """The parent run's name: the experiment's until a best candidate is known, then that
    candidate's train/held-out scores first (`best memory 0.12/0.05 acc 0.42/0.38 g03-c0`),
    where the collapsed table's name column shows it."""
    if best is None:
        return name
    return f"best {split_scores(best)} {best.id}"


def evaluation_window(directory: Path) -> tuple[int, int] | None:
    """(start, end) in ms of the evaluation stored under `directory`: each unit's result
    file is written when the unit ends and holds its wall time, so the window runs from the
    earliest unit start to the latest unit end (units resumed from disk included)."""
    starts, ends = [], []
    for result_file in Path(directory).rglob("result.json"):
        if not result_file.parent.name.startswith("period_"):
            continue
        try:
            end = result_file.stat().st_mtime
            wall_time = float(json.loads(result_file.read_text("utf-8")).get("wall_time_s", 0.0))
        except (OSError, ValueError, AttributeError):
            continue
        starts.append(end - max(wall_time, 0.0))
        ends.append(end)
    if not ends:
        return None
    return int(min(starts) * 1000), int(max(ends) * 1000)


def candidates_table(
    records: Sequence[CandidateRecord], statuses: dict[str, list[str]]
) -> dict[str, list[Any]]:
    """One row per candidate (the parent run's `candidates` table artifact): id, status,
    generation, parents, mutation, train and held-out memory score, accuracy and objective
    score (`score`: what selection used, see `evolve.objective_used`). Undefined
    numbers are None (null in the table), never a stand-in value."""
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "candidate",
            "status",
            "generation",
            "parents",
            "mutation",
            "train_memory_score",
            "heldout_memory_score",
            "train_accuracy",
            "heldout_accuracy",
            "train_score",
            "heldout_score",
            "reason",
        )
    }
    for record in sorted(records, key=lambda r: (r.generation, r.id)):
        status, reason = statuses.get(record.id) or proposal_status(record)
        columns["candidate"].append(record.id)
        columns["status"].append(status)
        columns["generation"].append(record.generation)
        columns["parents"].append(",".join(record.parent_ids))
        columns["mutation"].append(record.mutation.describe())
        for split in ("train", "heldout"):
            scores = getattr(record, split)
            summary = scores.summary if scores is not None else None
            columns[f"{split}_memory_score"].append(summary.memory_score if summary else None)
            columns[f"{split}_accuracy"].append(summary.accuracy if summary else None)
            columns[f"{split}_score"].append(scores.score if scores is not None else None)
        columns["reason"].append(reason)
    return columns


def candidates_markdown(table: dict[str, list[Any]]) -> str:
    """The candidate table as Markdown, for the parent run's description (the run page
    renders it): id, status, train and held-out memory score and accuracy ("-": undefined)."""
    lines = [
        "| candidate | status | mutation | train memory | heldout memory | train acc | "
        "heldout acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, candidate in enumerate(table["candidate"]):
        lines.append(
            f"| {candidate} | {table['status'][index]} | {table['mutation'][index]} | "
            f"{_score_text(table['train_memory_score'][index])} | "
            f"{_score_text(table['heldout_memory_score'][index])} | "
            f"{_score_text(table['train_accuracy'][index])} | "
            f"{_score_text(table['heldout_accuracy'][index])} |"
        )
    return "\n".join(lines)


def best_candidate(result: ExperimentResult) -> CandidateRecord | None:
    return result.candidate(result.best_id) if result.best_id is not None else None


def candidate_tags(
    record: CandidateRecord,
    context: TrackingContext,
    parent_run_id: str | None,
    status: str,
    reason: str,
) -> dict[str, str]:
    """A candidate run's tags: lineage, what became of the proposal, and where it runs."""
    from evolve.tracking.store import run_context_tags

    tags = {
        **run_context_tags(),
        NOTE_TAG: candidate_description(record, context, reason),
        PARENT_RUN_TAG: parent_run_id or "",
        TAG_KIND: "candidate",
        TAG_EXPERIMENT: context.name,
        TAG_CANDIDATE: record.id,
        TAG_GENERATION: str(record.generation),
        TAG_PARENTS: ",".join(record.parent_ids),
        TAG_MUTATION: record.mutation.kind,
        TAG_CANDIDATE_STATUS: status,
        TAG_CANDIDATE_REASON: reason[:500],
    }
    if record.mutation.component:
        tags["evolve.component"] = record.mutation.component
    return tags


def best_scores(best: CandidateRecord | None) -> dict[str, float]:
    """The best candidate's scores under its own run's names (`heldout_accuracy`, ...), so
    that the parent's row shows them in the same runs-table columns as its candidates'; the
    tag `evolve.best_candidate` and the run name say which candidate they are."""
    values: dict[str, float] = {}
    for split in ("train", "validation", "heldout"):
        scores = getattr(best, split, None) if best is not None else None
        if scores is None:
            continue
        values[f"{split}_score"] = scores.score
        for name in ("accuracy", "memory_score"):
            value = getattr(scores.summary, name)
            if value is not None and math.isfinite(value):
                values[f"{split}_{name}"] = value
    return values


def final_metrics(result: ExperimentResult, best: CandidateRecord | None) -> dict[str, float]:
    """The parent run's totals at the end of an invocation, and the held-out test of the best
    against the base (`heldout_difference` with its bounds, McNemar's p, ...)."""
    metrics: dict[str, float] = {
        "total_llm_calls": result.llm_calls,
        "total_tokens": result.tokens,
        "total_wall_time_s": result.wall_time_s,
        "total_prompt_eval_s": result.prompt_eval_s,
        "total_decode_s": result.decode_s,
        "reflection_parse_failures": result.reflection_parse_failures,
        "total_candidates_evaluated": sum(r.train is not None for r in result.candidates),
    }
    if result.toolkit_share is not None:
        metrics["toolkit_share"] = result.toolkit_share
    if best is not None and best.train is not None:
        metrics["final_best_train_score"] = best.train.score
    if best is not None and best.heldout is not None:
        metrics["final_best_heldout_score"] = best.heldout.score
    metrics.update(best_scores(best))
    if result.chain_summary is not None:
        metrics.update(result.chain_summary.flat_metrics("chain_"))
    if result.heldout_comparison is not None:  # the best minus the base, as a test
        metrics.update(comparison_metrics(result.heldout_comparison))
    return metrics
