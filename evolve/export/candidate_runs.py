"""What an export reads of an experiment's candidate runs when it has only their MLflow runs
(a run id as the target, its local records gone): which run the experiment selected, and
enough of a candidate record from that run for the bundle's provenance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.results.records import (
    CandidateRecord,
    CandidateStatus,
    EvaluationScores,
    Mutation,
    candidate_record,
)
from evolve.simulator.metrics import MetricSummary
from evolve.tracking.tags import TAG_CANDIDATE


def selected_candidate_run(children: Sequence[Any], best_id: str | None) -> Any:
    """The candidate run the experiment selected (its parent run's `evolve.best_candidate`);
    for a run that never finished, the same rule as the local records (`select_best`): the
    best validation score, else the best train score; ties: train score, then older. Never
    the held-out score: the held-out users only report."""
    chosen = [run for run in children if run.data.tags.get(TAG_CANDIDATE) == best_id]
    if best_id is not None and chosen:
        return chosen[0]
    for split in ("validation", "train"):
        scored = [run for run in children if f"{split}_score" in run.data.metrics]
        if scored:
            return min(scored, key=lambda run: _run_rank(run, split))
    return min(children, key=lambda run: _run_rank(run, "train"))


def _run_rank(run: Any, split: str) -> tuple:
    metrics, tags = run.data.metrics, run.data.tags
    missing = float("-inf")
    return (
        -metrics.get(f"{split}_score", missing),
        -metrics.get("train_score", missing),
        int(tags.get("evolve.generation", 0)),
        tags.get(TAG_CANDIDATE, ""),
    )


def record_from_run(run: Any) -> CandidateRecord:
    """Enough of a candidate record for provenance, from a candidate run's tags/metrics."""
    tags, metrics = run.data.tags, run.data.metrics

    def scores(split: str) -> EvaluationScores | None:
        if f"{split}_score" not in metrics:
            return None
        return EvaluationScores(
            users=[],
            score=metrics[f"{split}_score"],
            objective="",
            per_user={},
            summary=MetricSummary(),
            run_dir="",
        )

    return candidate_record(
        tags.get(TAG_CANDIDATE, run.info.run_id),
        generation=int(tags.get("evolve.generation", 0)),
        parent_ids=tuple(p for p in tags.get("evolve.parent_ids", "").split(",") if p),
        mutation=Mutation(kind=tags.get("evolve.mutation", "base")),
        seed=int(run.data.params.get("seed.candidate", 0)),
        fingerprint=run.data.params.get("fingerprint", ""),
        kind=run.data.params.get("policy_kind", ""),
        components={},
        parameters={},
        status=CandidateStatus.EVALUATED,
        train=scores("train"),
        validation=scores("validation"),
        heldout=scores("heldout"),
    )
