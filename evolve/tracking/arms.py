"""MLflow for an arms run: one parent run per arms spec (tag `evolve.kind = arms`), holding
the table (`arms.md`, `arms.json`) and per arm its test scores and differences as metrics
(`<arm>.test_accuracy`, `<arm>.test_accuracy_low`, ..., `<arm>.vs_<other>.difference`,
`..._low`, `..._high`, `..._sign_flip_p`) so the runs table can sort on them. The arms'
own experiments are logged as ordinary experiment runs, named after the arms run
(`<arms>-<arm>-s<seed>-r<replicate>`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evolve.tracking.store import (
    filter_literal,
    get_or_create_experiment,
    metric_value,
    mlflow_client,
    run_context_tags,
)

TAG_KIND = "evolve.kind"
TAG_ARMS = "evolve.arms"
TAG_DESIGN = "evolve.arms_design"


def arms_metrics(rows: Sequence[Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for row in rows:
        for name, found in (
            ("test_accuracy", row.scores.accuracy),
            ("test_memory_score", row.scores.memory_score),
        ):
            _estimate(metrics, f"{row.arm}.{name}", found)
        for diff in row.differences:
            prefix = f"{row.arm}.vs_{diff.to}"
            _estimate(metrics, f"{prefix}.difference", diff.accuracy)
            _estimate(metrics, f"{prefix}.memory_score_difference", diff.memory_score)
            if diff.sign_flip_p is not None:
                metrics[f"{prefix}.sign_flip_p"] = diff.sign_flip_p
            metrics[f"{prefix}.users_ahead"] = float(diff.users_ahead)
    return metrics


def _estimate(metrics: dict[str, float], name: str, found: Any) -> None:
    if found.value is None:
        return
    metrics[name] = found.value
    if found.interval is not None:
        metrics[f"{name}_low"] = found.interval.low
        metrics[f"{name}_high"] = found.interval.high


def log_arms_run(
    tracking_uri: str,
    experiment_name: str,
    name: str,
    design: str,
    rows: Sequence[Any],
    table: str,
) -> str:
    """Create or update the arms run's parent run; returns its id."""
    client = mlflow_client(tracking_uri)
    experiment_id = get_or_create_experiment(client, experiment_name, tracking_uri)
    found = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{TAG_ARMS}` = {filter_literal(name)} and tags.`{TAG_KIND}` = 'arms'",
        max_results=1,
    )
    if found:
        run_id = found[0].info.run_id
    else:
        tags = {**run_context_tags(), TAG_KIND: "arms", TAG_ARMS: name, TAG_DESIGN: design}
        run_id = client.create_run(experiment_id, tags=tags, run_name=f"arms {name}").info.run_id
    for key, value in arms_metrics(rows).items():
        client.log_metric(run_id, key, metric_value(value))
    client.log_text(run_id, table, "arms.md")
    client.log_text(
        run_id, json.dumps([row.model_dump(mode="json") for row in rows], indent=2), "arms.json"
    )
    client.set_tag(run_id, "mlflow.note.content", table[:5000])
    client.set_terminated(run_id, "FINISHED")
    return run_id
